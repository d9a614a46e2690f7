"""The tool pool: where an episode's tool-backend session lives (``tools.placement``).

``in_process`` (default): executable backends (builtin, BFCL) run in the rollout worker's own
process, a ``LocalEnvSession`` per episode. A Ray actor call costs ~0.7-1 ms on the 2-core test
machine against ~30 us for a builtin tool call, so a remote hop per call caps the pool far below
what the backends can do (docs/benchmarks.md, "Tool pool").

``pool``: every session lives on one of M Ray actors (chosen by hashing the session id, so every
call of an episode lands on the actor that holds its state); this isolates heavy or unsafe
backends from the engine process. Actors are threaded (``max_concurrency``): Ray queues calls
beyond that limit at the actor, which is the back-pressure — no unbounded queue in ours. A reward
that reads the live session (``register_reward(..., live_session=True)``) runs there too, before
the session closes: the episode is sent to the actor, its score comes back.

Tasks with backend "sgls" always go to the actors, whatever the placement: only they reach the
run's one SGLS server, whose cache must be shared by every episode of the cluster.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

import ray

from agentrl.api import EnvError
from agentrl.common.plugins import load_plugins
from agentrl.envs.registry import register_backend
from agentrl.envs.session import LocalEnvSession
from agentrl.rewards.registry import reward_name, run_reward
from agentrl.tasks.schema import Task, ToolCall


@ray.remote
class ToolBackendActor:
    def __init__(self, sgls_server=None, sgls_seed: int | None = None, sgls_timeout_s: float = 300.0,
                 plugins: tuple[str, ...] = ()) -> None:
        load_plugins(plugins)  # the run's (Config.plugins): the backends this actor opens sessions of
        self.sessions: dict[str, LocalEnvSession] = {}
        self.calls = self.opened = 0
        if sgls_server is not None:
            # Tasks with backend "sgls" get a session answered by the cluster's SGLS server (one
            # per run, so every episode of a group shares its cache wherever it runs).
            from agentrl.envs.sgls import SGLSBackend
            from agentrl.rollout.sgls_server import RemoteSimulator

            register_backend("sgls", lambda task: SGLSBackend(task, RemoteSimulator(sgls_server, sgls_timeout_s), seed=sgls_seed))

    def open(self, session_id: str, task: Task) -> None:
        self.sessions[session_id] = LocalEnvSession(task)
        self.opened += 1

    def _session(self, session_id: str) -> LocalEnvSession:
        session = self.sessions.get(session_id)
        if session is None:  # opened on this actor before Ray restarted it: its state is gone
            raise EnvError(f"session {session_id} lost: the tool actor was restarted")
        return session

    def execute(self, session_id: str, calls: list[ToolCall]) -> list[Any]:
        self.calls += len(calls)
        return self._session(session_id).execute_sync(calls)

    def end_turn(self, session_id: str, turn_index: int, results: list[tuple[ToolCall, Any]]) -> bool:
        return self._session(session_id).end_turn_sync(turn_index, results)

    def tool_errors(self, session_id: str) -> list[dict]:
        return self._session(session_id).tool_errors_sync()

    def score(self, session_id: str, episode) -> tuple[float, float]:
        """The episode scored by a reward that reads its live session, which is here (the
        reward's module is a plugin this actor imported); in one of the actor's threads."""
        return score_on_session(self._session(session_id), episode)

    def close(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            session.close_sync()

    def stats(self) -> dict[str, int]:
        return {"open_sessions": len(self.sessions), "opened": self.opened, "calls": self.calls}


async def _remote(ref, actor=None, what: str = "call", timeout_s: float | None = None):
    """Await a tool-actor call; the actor's death, or no answer within ``timeout_s``
    (``runtime.tool_call_timeout_s``), is the environment's failure (``EnvError``, naming the actor)."""

    async def answer():
        return await ref

    try:
        return await asyncio.wait_for(answer(), timeout_s)
    except ray.exceptions.RayActorError as err:
        raise EnvError(f"tool actor {_name(actor)} died: {type(err).__name__}: {err}") from err
    except asyncio.TimeoutError as err:
        # the call keeps running in one of the actor's threads: enough of them would leave it serving
        # nothing, so it is restarted clean (its other sessions are lost: their groups are rolled out again)
        if actor is not None:
            ray.kill(actor, no_restart=False)
        raise EnvError(f"tool actor {_name(actor)} did not answer {what} within runtime.tool_call_timeout_s="
                       f"{timeout_s:g}s; the actor is restarted") from err


def _name(actor) -> str:
    """The actor's class and id, as the Ray dashboard lists it."""
    try:
        return f"{actor._ray_actor_creation_function_descriptor.class_name}({actor._actor_id.hex()[:12]})"
    except AttributeError:
        return repr(actor)


class RemoteEnvSession:
    """``agentrl.agent.episode.EnvSession`` backed by a tool-pool actor. When the actor dies (or
    Ray restarted it, losing the session) or a call takes longer than ``timeout_s``, calls raise
    ``EnvError``."""

    def __init__(self, actor, session_id: str, timeout_s: float | None = None):
        self.actor = actor
        self.session_id = session_id
        self.timeout_s = timeout_s

    async def execute(self, calls: list[ToolCall]) -> list[Any]:
        what = f"{', '.join(c.name for c in calls)} (session {self.session_id})"
        return await _remote(self.actor.execute.remote(self.session_id, calls), self.actor, what, self.timeout_s)

    async def end_turn(self, turn_index: int, results: list[tuple[ToolCall, Any]]) -> bool:
        return await _remote(self.actor.end_turn.remote(self.session_id, turn_index, results), self.actor,
                             f"the end-of-turn check (session {self.session_id})", self.timeout_s)

    async def tool_errors(self) -> list[dict]:
        """The session's tool exceptions (``LocalEnvSession.tool_errors``)."""
        return await _remote(self.actor.tool_errors.remote(self.session_id), self.actor,
                             f"tool_errors (session {self.session_id})", self.timeout_s)

    async def score(self, episode) -> tuple[float, float]:
        """``score_on_session`` on the actor that holds the session: the episode travels there, the
        (outcome, process) pair comes back."""
        return await _remote(self.actor.score.remote(self.session_id, episode), self.actor,
                             f"the reward (session {self.session_id})", self.timeout_s)

    async def close(self) -> None:
        try:
            await _remote(self.actor.close.remote(self.session_id), self.actor, "close", self.timeout_s)
        except EnvError:
            pass  # the actor died: nothing left to free


def score_on_session(session: LocalEnvSession, episode) -> tuple[float, float]:
    """(outcome, process) of the finished ``episode`` by its task's reward function, given
    ``session``'s backend (a reward registered with ``live_session=True``, agentrl/rewards/
    registry.py). The session is still open: its owner closes it afterwards."""
    return run_reward(reward_name(session.task), episode, session.task, session=session.backend)


async def score_live(session: "LocalEnvSession | RemoteEnvSession", episode) -> tuple[float, float]:
    """``score_on_session`` where the session lives: on its tool actor (``RemoteEnvSession``), or
    in a thread of this process: a reward that queries a real service may block, and the rollout
    worker's event loop serves every other episode meanwhile. The backend is then used from
    another thread than its calls were (as on the threaded actors)."""
    if isinstance(session, RemoteEnvSession):
        return await session.score(episode)
    return await asyncio.to_thread(score_on_session, session, episode)


PLACEMENTS = ("in_process", "pool")
# backends whose sessions only the pool actors can host (they alone register "sgls")
REMOTE_BACKENDS = frozenset({"sgls"})


class ToolPool:
    """Opens sessions in process or on the actors; a plain object, so it travels to the
    rollout workers inside their constructor arguments."""

    def __init__(self, actors: list, placement: str = "in_process", call_timeout_s: float | None = None):
        if placement not in PLACEMENTS:
            raise ValueError(f"tools.placement must be one of {PLACEMENTS}, got {placement!r}")
        if placement == "pool" and not actors:
            raise ValueError("the tool pool needs at least one actor")
        self.actors, self.placement = actors, placement
        # runtime.tool_call_timeout_s, for the actors' sessions (an in-process tool that hangs holds
        # its rollout worker: runtime.rollout_timeout_s catches that)
        self.call_timeout_s = call_timeout_s

    @classmethod
    def create(cls, num_actors: int, num_cpus: float, max_concurrency: int, sgls_server=None, sgls_cfg=None,
               placement: str = "in_process", max_restarts: int = 0, call_timeout_s: float | None = None,
               plugins: tuple[str, ...] = ()) -> "ToolPool":
        """Start the actors only when something will run on them (placement ``pool``, or an SGLS
        server to reach): idle actors would still cost a process each. ``max_restarts``: Ray
        restarts a dead actor (its sessions are lost: their episodes end with ``ENV_ERROR`` and
        their groups are rolled out again)."""
        if placement == "in_process" and sgls_server is None:
            return cls([], placement, call_timeout_s)
        seed = sgls_cfg.seed if sgls_cfg is not None else None
        timeout = sgls_cfg.request_timeout_s if sgls_cfg is not None else 300.0
        actor = ToolBackendActor.options(num_cpus=num_cpus, max_concurrency=max_concurrency, max_restarts=max_restarts)
        return cls([actor.remote(sgls_server, seed, timeout, tuple(plugins)) for _ in range(num_actors)], placement,
                   call_timeout_s)

    def in_process(self, task: Task) -> bool:
        return self.placement == "in_process" and task.backend not in REMOTE_BACKENDS

    async def open(self, session_id: str, task: Task) -> LocalEnvSession | RemoteEnvSession:
        if self.in_process(task):
            return LocalEnvSession(task)
        if not self.actors:  # in_process without tools.sgls: no actor was started
            raise ValueError(f"task {task.id!r}: backend {task.backend!r} needs tools.sgls, which is not configured")
        actor = self.actors[zlib.crc32(session_id.encode()) % len(self.actors)]
        await _remote(actor.open.remote(session_id, task), actor, f"open (session {session_id})", self.call_timeout_s)
        return RemoteEnvSession(actor, session_id, self.call_timeout_s)


def start_sgls_server(cfg, dtype: str = "float32", max_restarts: int = 0):
    """The run's SGLS server actor from ``tools.sgls`` (None when not configured). ``max_restarts``:
    Ray restarts a dead server (its engine is rebuilt, its cache starts empty)."""
    sc = cfg.tools.sgls
    if sc is None:
        return None
    from agentrl.llm import LLMEndpoint
    from agentrl.rollout.sgls_server import SGLSServer

    common = dict(temperature=sc.temperature, max_tokens=sc.max_tokens, cache_size=sc.cache_size, max_retries=sc.max_retries,
                  max_state_chars=sc.max_state_chars)
    actor = SGLSServer.options(num_cpus=sc.num_cpus, num_gpus=sc.num_gpus, max_restarts=max_restarts)
    if sc.model_path is not None:
        return actor.remote(model_path=sc.model_path, engine_cfg=sc.engine, dtype=dtype, engine_seed=sc.engine.seed, **common)
    return actor.remote(endpoint=LLMEndpoint.from_config(sc.endpoint), **common)
