"""RolloutWorker: a Ray actor that owns one vLLM engine and runs many episodes concurrently.

Every episode is an asyncio task; their generation requests meet in vLLM's continuous batcher
and their tool calls go to the tool pool. Each finished group is a return object of its own
(``RolloutCall`` asks for one per task): it stays in the object store, owned by the driver, and
only the small summaries are fetched there; the replay buffer and the learner pass the refs along.
Why not ``ray.put`` here: an object is owned by the process that puts it, so a worker that died
after returning, before the learner fetched its groups, took them along (``OwnerDiedError``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence

import ray

from agentrl.agent.chat import formatter_for
from agentrl.agent.episode import EpisodeLimits, run_episode
from agentrl.agent.gold import GoldPolicy
from agentrl.api import ENV_ERROR, POLICY, EngineNotStarted, EnvError, Episode, EpisodeGroup, Generation, GroupSummary
from agentrl.common.log import get_logger
from agentrl.common.plugins import PluginError, load_plugins
from agentrl.config.process_env import set_default_env
from agentrl.envs.behaviours import episode_behaviours
from agentrl.rewards.hierr import HierRWeights
from agentrl.rewards.registry import reads_live_session, reward_name
from agentrl.rewards.scoring import apply_summary, score_episode, seen_context
from agentrl.rewards.summary import episode_summary_reward
from agentrl.rollout.tool_pool import ToolPool, score_live
from agentrl.tasks.schema import Task

log = get_logger(__name__)


class _EnginePolicy:
    """Binds an engine and sampling settings to the episode loop's ``Policy`` protocol."""

    def __init__(self, engine, sampling, stop_ids: list[int]):
        self.engine, self.sampling, self.stop_ids = engine, sampling, stop_ids

    async def generate(self, prompt_ids: list[int], max_tokens: int) -> Generation:
        return await self.engine.generate(prompt_ids, max_tokens, self.sampling, self.stop_ids)


def redundant_calls(calls_log: list[list[dict]]) -> int:
    """Calls that repeat an identical call (same name and arguments) made earlier in the turn."""
    n = 0
    for turn in calls_log:
        seen = set()
        for c in turn:
            key = (c["name"], json.dumps(c["arguments"], sort_keys=True, default=str))
            n += key in seen
            seen.add(key)
    return n


def keep_trainable(eps: list[Episode | None]) -> list[Episode]:
    """The episodes whose environment answered: those that ended with ``ENV_ERROR`` (or, None,
    could not open a session) are dropped; never trained on as if the tool had answered."""
    return [e for e in eps if e is not None and e.termination != ENV_ERROR]


def dropped_summary(task_id: str, version: int, n: int, policy: str, env_reruns: int = 0) -> GroupSummary:
    """The summary of a group whose every episode was dropped (no group is stored)."""
    return GroupSummary(task_id, version, [], [], {}, 0, 0, 0, 0, 0.0, 0.0, 0.0, policy=policy, env_failures=n,
                        env_reruns=env_reruns)


def group_summary(group: EpisodeGroup, env_failures: int = 0, env_reruns: int = 0) -> GroupSummary:
    eps = group.episodes
    return GroupSummary(
        task_id=group.task_id,
        version=group.version,
        outcome=[e.rewards["outcome"] for e in eps],
        progress=[e.rewards["progress"] for e in eps],
        # every other reward (HierR components, summary, omission), averaged over the group
        rewards={k: sum(e.rewards[k] for e in eps) / len(eps) for k in eps[0].rewards if k not in ("outcome", "progress")},
        policy_tokens=sum(e.n_policy_tokens for e in eps),
        calls=sum(e.n_call_blocks for e in eps),
        valid_calls=sum(e.n_valid_calls for e in eps),
        redundant_calls=sum(redundant_calls(e.calls) for e in eps),
        gen_seconds=sum(e.gen_seconds for e in eps),
        env_seconds=sum(e.env_seconds for e in eps),
        wall_seconds=group.wall_seconds,
        policy=group.policy,
        env_failures=env_failures,
        env_reruns=env_reruns,
        tool_errors=sum(len(e.tool_errors) for e in eps),
    )


def tool_error_line(task_id: str, error: dict) -> str:
    """One tool exception as a line: the task, the turn, the call, what it raised and where."""
    args = json.dumps(error.get("arguments"), ensure_ascii=False, sort_keys=True, default=str)
    where = f" at {error['where']}" if error.get("where") else ""
    return (f"task {task_id!r} turn {int(error.get('turn', 0)) + 1}: {error.get('tool')}({args}) raised "
            f"{error.get('type')}: {error.get('message')}{where}")


def eval_row(ep: Episode, task: Task, sample: int) -> dict:
    """One evaluation episode's result (``agentrl eval``'s JSONL line, the held-out metrics' input).

    Keys that only mean something for some tasks are there only for them (docs/own_tools.md):
    ``category`` is None for a reward-scored task that names none, ``summary_score`` for a task
    without ``answer_facts``, ``omission`` for a reward-scored task (no gold plan says a call was
    needed), and ``behaviours`` holds only the behaviours that apply to the task."""
    scored_by_function = reward_name(task) is not None
    has_facts = any(t.answer_facts for t in task.turns)
    return {
        "task_id": ep.task_id, "sample": sample,
        "category": None if scored_by_function and "category" not in task.model_fields_set else task.category,
        "outcome": ep.rewards["outcome"], "progress": ep.rewards["progress"],
        "turn_passed": ep.turn_passed, "n_turns": ep.n_turns, "calls": ep.n_call_blocks, "valid_calls": ep.n_valid_calls,
        "redundant_calls": redundant_calls(ep.calls), "termination": ep.termination, "policy_tokens": ep.n_policy_tokens,
        # the answer side of the episode: an answer without a needed call, the rule score of the answers
        "omission": None if scored_by_function else ep.rewards.get("omission", 0.0),
        "summary_score": ep.rewards.get("summary_score") if has_facts else None,
        "behaviours": episode_behaviours(task, ep),
        "tool_errors": list(ep.tool_errors),
    }


def exit_if_engine_dead(err: BaseException, worker_index: int) -> None:
    """vLLM's engine process died (``EngineDeadError``: a crash, the OOM killer): this actor
    cannot serve again, so it exits, and Ray restarts it (``runtime.max_actor_restarts``); the
    scheduler rebuilds its engine and re-issues the call's groups, as for any dead worker."""
    if "vllm" not in sys.modules:  # no engine ever ran here (the gold replay): the error is another one
        return
    from vllm.v1.engine.exceptions import EngineDeadError

    if isinstance(err, EngineDeadError):
        log.error(f"recovery: rollout worker {worker_index}: its vLLM engine died ({err}); the worker exits to be "
                  "restarted")
        os._exit(1)


@ray.remote
class RolloutWorker:
    def __init__(self, model_path: str, rollout_cfg, dtype: str, tool_actors: list, worker_index: int = 0,
                 weight_sync: str = "object_store", rewards_cfg=None, role: str = POLICY, agent_cfg=None,
                 plugins: Sequence[str] = ()):
        """``role``: POLICY (serves the policy being trained) or a method's rollout role (e.g. an
        exploration policy); its episodes and groups are tagged so. ``agent_cfg``: the ``agent:`` section (tool-call
        format, chat template, system prompt); None = its defaults. ``plugins``: the run's
        (``Config.plugins``): the backends and rewards of its tasks."""
        set_default_env()
        load_plugins(plugins)
        self.model_path, self.cfg, self.dtype = model_path, rollout_cfg, dtype
        self.tool_actors = tool_actors
        self.worker_index = worker_index
        self.role = role
        self.weight_sync = weight_sync  # "nccl" builds the engine with vLLM's weight-transfer engine
        self.engine = None
        self.version = 0
        self.rewards_cfg = rewards_cfg
        self.agent_cfg = agent_cfg
        self.judge = None  # ChatClient, built in start() when rewards.summary = judge
        self.hierr = HierRWeights(**rewards_cfg.hierr.model_dump()) if rewards_cfg is not None else HierRWeights()
        self.eval_tally = [0, 0.0]  # in the evaluate call under way (or the last): episodes finished, summed outcome

    async def start(self, engine: bool = True) -> float:
        """Build the engine inside the actor's event loop (vLLM's async engine needs one).

        ``engine=False`` (``agentrl eval --policy gold``) skips vLLM: only the tokenizer of
        ``model_path`` is needed, to build the token stream the gold replay goes through. A worker
        already started is left as it is (a second engine would hold its memory twice): the
        scheduler may revive one worker once per call it had pending."""
        from transformers import AutoTokenizer

        if self.ready():
            return 0.0
        t0 = time.perf_counter()
        if engine:
            from agentrl.engines.vllm_engine import VLLMEngine

            self.engine = VLLMEngine(self.model_path, self.cfg.engine, dtype=self.dtype,
                                     seed=self.cfg.engine.seed + self.worker_index, weight_sync=self.weight_sync)
        # agent.*: the tool format the loop parses and the gold replay writes, the system prompt and
        # chat template of every episode (the engine itself sees token ids only)
        self.formatter = formatter_for(AutoTokenizer.from_pretrained(self.model_path), self.agent_cfg)
        # a ToolPool (it carries tools.placement) or a bare actor list (tests, benchmarks): in_process
        self.pool = self.tool_actors if isinstance(self.tool_actors, ToolPool) else ToolPool(self.tool_actors)
        self.limits = EpisodeLimits(
            max_new_tokens=self.cfg.max_new_tokens,
            max_assistant_messages_per_turn=self.cfg.max_assistant_messages_per_turn,
            max_episode_tokens=self.cfg.max_episode_tokens,
        )
        rc = self.rewards_cfg
        if rc is not None and rc.summary == "judge":
            from agentrl.llm import ChatClient, LLMEndpoint

            self.judge = ChatClient(LLMEndpoint.from_config(rc.judge))
        return time.perf_counter() - t0

    def _score(self, ep: Episode, task: Task, function_score: tuple[float, float] | None) -> None:
        """Every reward of ``ep``. A reward function that replays (``final_backend``) runs here, on
        the event loop (known: a slow replay holds every episode of this worker meanwhile);
        ``function_score`` is what a live-session reward gave (``_score_live``)."""
        rc = self.rewards_cfg
        if rc is None:  # standalone use (tests): the default rewards
            score_episode(ep, task, function_score=function_score)
            return
        score_episode(ep, task, summary="none" if rc.summary == "judge" else rc.summary,
                      summary_max_chars=rc.summary_max_chars, weights=self.hierr, function_score=function_score)

    async def _score_live(self, session, ep: Episode, task: Task) -> tuple[float, float] | None:
        """(outcome, process) by the task's reward when it reads the live session
        (``register_reward(..., live_session=True)``): taken before the session closes, where the
        session is, off this event loop (a thread here under ``in_process``, the tool-pool actor
        under ``pool``). None when the task's reward replays, or there is none: ``_score`` then."""
        name = reward_name(task)
        if name is None or not reads_live_session(name, task.id):
            return None
        if ep.termination != ENV_ERROR:
            try:
                return await score_live(session, ep)
            except EnvError as err:  # its tool actor died or timed out while scoring: the environment failed
                log.warning(f"scoring failed: {err}")
                ep.termination = ENV_ERROR
        return 0.0, 0.0  # no session left to read; the episode is dropped from training, failed in evaluation

    async def _judge(self, ep: Episode, task: Task) -> None:
        """R_sum from the LLM judge: mean rating of the turn answers (unanswered turns score 0).
        When the endpoint fails or answers off-scale, the episode falls back to the rule scorer
        and ``rewards["judge_failed"]`` = 1 shows it (logged as ``reward/judge_failed``)."""
        from agentrl.llm import LLMEndpointError
        from agentrl.rewards.judge import judge_summary

        context = seen_context(task, ep.calls)
        ep.rewards["judge_failed"] = 0.0
        try:
            scores = [0.0 if a is None else await judge_summary(self.judge, task.turns[u].user, context, a)
                      for u, a in enumerate(ep.answers)]
            score = sum(scores) / ep.n_turns
        except (LLMEndpointError, ValueError):
            ep.rewards["judge_failed"] = 1.0
            facts = [list(t.answer_facts) for t in task.turns]
            score = episode_summary_reward(ep.answers, facts, context, ep.n_turns, self.rewards_cfg.summary_max_chars)
        apply_summary(ep, score)

    async def _episode(self, task: Task, sampling, group_id: str, judge: bool = True, gold: bool = False) -> Episode | None:
        """One episode through the tool pool: sampled by the engine, or (``gold``) the
        task's scripted gold conversation replayed through the same loop and checks. None when
        no session could be opened (its tool actor is dead); ``termination == ENV_ERROR`` when
        the environment failed mid-episode."""
        session_id = f"{group_id}/{uuid.uuid4().hex[:8]}"
        try:
            session = await self.pool.open(session_id, task)
        except EnvError as err:
            log.warning(f"episode {session_id} dropped: {err}")
            return None
        policy = GoldPolicy(task, self.formatter) if gold else _EnginePolicy(self.engine, sampling, self.formatter.eos_token_ids)
        try:
            ep = await run_episode(task, policy, session, self.formatter, self.limits)
            if ep.termination != ENV_ERROR:  # a failed environment has no records left to read
                try:
                    ep.tool_errors = await session.tool_errors()
                except EnvError:  # the tool actor died after the episode: its records went with it
                    pass
            if ep.tool_errors and getattr(self.cfg, "on_tool_error", "record") == "fail":
                raise PluginError(f"{tool_error_line(task.id, ep.tool_errors[0])} (backend {task.backend!r}; "
                                  "rollout.on_tool_error=fail stops here; record lets the model read it as an error)")
            live_score = await self._score_live(session, ep, task)
        finally:
            await session.close()
        if ep.termination == ENV_ERROR:
            log.warning(f"episode {session_id} dropped: its environment failed mid-episode")
        self._score(ep, task, live_score)
        if self.judge is not None and judge and ep.termination != ENV_ERROR:
            await self._judge(ep, task)
        ep.policy_version = self.version
        ep.group_id = group_id
        ep.policy = self.role
        return ep

    async def rollout(self, tasks: list[Task], group_size: int, temperature: float, top_p: float,
                      tag: int, mix_keys: list[str] | None = None, env_retries: int = 0) -> tuple:
        """G episodes per task, all concurrent. Returns ``(summaries, group_1, ..., group_n)``, one
        ``EpisodeGroup`` (or None) per task, meant to be called with ``num_returns=len(tasks) + 1``
        (``cluster.RolloutCall``) so that each group is an object of its own, owned by the caller.
        ``mix_keys`` (one per task): groups of other workers with the same key are parts of the
        same group (a method's rollout role). A group whose environment failed (its tool actor died, its
        simulator timed out) is rolled out again, up to ``env_retries`` times
        (``runtime.max_actor_restarts``),
        then its failed episodes are dropped and counted in its summary (``env_failures``); a group
        left empty is None (its summary, with no episodes, still carries the count)."""
        from agentrl.engines.vllm_engine import SamplingConfig

        if self.engine is None:  # restarted by Ray while idle: the scheduler revives it and re-issues
            raise EngineNotStarted(f"rollout worker {self.worker_index}: no engine (the actor was restarted)")
        t0 = time.perf_counter()

        async def group(task: Task, mix_key: str) -> tuple[GroupSummary, EpisodeGroup | None]:
            gid = f"{task.id}@v{self.version}#{tag}" + ("" if self.role == POLICY else f"/{self.role}")
            version = self.version  # weights never change while a rollout call runs (RolloutScheduler)
            for attempt in range(env_retries + 1):
                episodes = await asyncio.gather(
                    *[self._episode(task, SamplingConfig(temperature, top_p), gid) for _ in range(group_size)])
                eps = keep_trainable(episodes)
                if len(eps) == group_size or attempt == env_retries:
                    break
                # the whole group again, not only the failed episodes: its advantages compare
                # episodes of one draw (a restarted tool actor serves the new sessions)
                log.warning(f"recovery: group {gid}: {group_size - len(eps)} episode(s) lost their environment; "
                            f"rolling the group out again ({attempt + 1}/{env_retries})")
            reruns = attempt
            if not eps:
                return dropped_summary(task.id, version, group_size, self.role, reruns), None
            # wall_seconds: from the call's start to this group's end (the slowest group = the call's
            # generation time, which the driver cannot see when it overlaps learning)
            g = EpisodeGroup(task.id, gid, version, eps, wall_seconds=time.perf_counter() - t0, policy=self.role,
                             mix_key=mix_key)
            return group_summary(g, group_size - len(eps), reruns), g

        keys = mix_keys if mix_keys is not None else [""] * len(tasks)
        try:
            groups = await asyncio.gather(*[group(t, k) for t, k in zip(tasks, keys, strict=True)])
        except Exception as err:
            exit_if_engine_dead(err, self.worker_index)
            raise
        return ([s for s, _ in groups], *[g for _, g in groups])

    async def evaluate(self, tasks: list[Task], gold: bool = False, temperature: float = 0.0,
                       samples: list[int] | None = None) -> list[dict]:
        """One episode per entry of ``tasks``, greedy by default (or the gold replay); returns
        per-episode results (``eval_row``, plus the ``Episode`` under ``"episode"``), sampled over the
        full distribution (top_p 1.0, as training samples: the config refuses a nucleus). ``samples``:
        each entry's sample index when a task runs several times (``agentrl eval --samples N``:
        ``tasks`` repeats it, once per index); its episode is tagged
        ``eval/ID/K`` and its row carries ``"sample": K``. None: one episode per task, tagged
        ``eval/ID``, sample 0. The sampling seed does not come from the tag: requests carry no seed
        of their own (``SamplingConfig.seed``), so the samples of a task draw different noise from
        the engine's generator."""
        from agentrl.engines.vllm_engine import SamplingConfig

        ks = samples if samples is not None else [0] * len(tasks)
        tags = [f"eval/{t.id}" if samples is None else f"eval/{t.id}/{k}" for t, k in zip(tasks, ks, strict=True)]
        self.eval_tally = [0, 0.0]  # this call's; read by eval_progress while it runs

        async def counted(task: Task, tag: str):
            episode = await self._episode(task, SamplingConfig(temperature), tag, judge=False, gold=gold)
            self.eval_tally[0] += 1
            self.eval_tally[1] += episode.rewards["outcome"] if episode is not None else 0.0
            return episode

        try:
            eps = await asyncio.gather(*[counted(t, tag) for t, tag in zip(tasks, tags)])
        except Exception as err:
            exit_if_engine_dead(err, self.worker_index)
            raise
        # an episode that could not open its session is left out (scored episodes that ended
        # with ENV_ERROR stay: a failed evaluation episode, visible in its termination)
        kept = [(e, t, k) for e, t, k in zip(eps, tasks, ks) if e is not None]
        # "episode": the episode itself, for `agentrl eval`'s transcripts (driver/evaluate.py takes it out)
        return [{**eval_row(e, t, k), "episode": e} for e, t, k in kept]

    def eval_progress(self) -> tuple[int, float]:
        """(episodes finished, their summed outcome) in the ``evaluate`` call under way, or in the
        last one: the actor is async, so this is answered while ``evaluate`` runs."""
        return tuple(self.eval_tally)

    def ready(self) -> bool:
        """Whether the engine is built (False after Ray restarted this actor, until ``start``)."""
        return self.engine is not None or getattr(self, "formatter", None) is not None

    async def load_weights(self, blob: bytes, version: int) -> int:
        if self.engine is None:
            raise EngineNotStarted(f"rollout worker {self.worker_index}: no engine to load weights into (the actor "
                                   "was restarted and not started again)")
        try:
            await self.engine.load_weights(blob)
        except Exception as err:
            exit_if_engine_dead(err, self.worker_index)
            raise
        self.version = version
        return version

    # ---- runtime.weight_sync=nccl (see agentrl.weight_sync.nccl)
    async def nccl_world_size(self) -> int:
        return self.engine.transfer_world_size()

    async def nccl_init(self, init_info: dict) -> None:
        await self.engine.init_weight_transfer(init_info)

    async def nccl_receive(self, update_info: dict, version: int) -> int:
        """Receive one broadcast from the learner (issued concurrently with its nccl_broadcast)."""
        if self.engine is None:
            raise EngineNotStarted(f"rollout worker {self.worker_index}: no engine (the actor was restarted)")
        try:
            await self.engine.receive_weights(update_info, str(version))
        except Exception as err:
            exit_if_engine_dead(err, self.worker_index)
            raise
        self.version = version
        return version

    async def sample_one(self, task: Task, tag: int, temperature: float = 1.0) -> Episode:
        """One sampled episode — used to verify weight sync (and tempered logprobs) against the learner."""
        from agentrl.engines.vllm_engine import SamplingConfig

        return await self._episode(task, SamplingConfig(temperature, 1.0), f"probe{tag}")

    async def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
