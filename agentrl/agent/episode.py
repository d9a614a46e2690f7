"""The token-in-token-out episode loop: one rollout of one task.

The loop owns the token stream. Policy tokens are exactly what the engine sampled (with the
engine's logprob for each); everything the environment injects (tool results, the next user turn,
announcements of restored tools) is tokenized on its own and appended with ``response_mask = 0``.
Earlier text is never re-tokenized, so the learner trains on the very tokens that were sampled.

The loop knows nothing about Ray or vLLM: it takes a ``Policy`` (anything that turns a prompt of
token ids into a sampled continuation) and an ``EnvSession`` (anything that executes calls and
checks a turn). The rollout worker plugs in vLLM and a remote simulator session; the SFT warm
start and ``--policy gold`` plug in a scripted policy and a local session.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Protocol

from agentrl.agent.chat import ChatFormatter
from agentrl.agent.parser import ParsedMessage
from agentrl.api import ENV_ERROR, EnvError, Episode, Generation
from agentrl.tasks.schema import Task, ToolCall

# Token segment labels (docs/design.md §2): 0 = injected by the environment, 1 = an assistant message
# that attempts a tool call, 2 = an assistant message without calls (a summary / answer / ask).
SEG_ENV, SEG_TOOL, SEG_SUMMARY = 0, 1, 2


class Policy(Protocol):
    async def generate(self, prompt_ids: list[int], max_tokens: int) -> Generation: ...


class EnvSession(Protocol):
    async def execute(self, calls: list[ToolCall]) -> list[Any]: ...

    async def end_turn(self, turn_index: int, results: list[tuple[ToolCall, Any]]) -> bool: ...


@dataclass
class EpisodeLimits:
    max_new_tokens: int = 96  # per assistant message
    max_assistant_messages_per_turn: int = 4
    max_episode_tokens: int = 1024


def tool_announcement(new_tools: list) -> str:
    """Text that tells the agent a previously withheld tool is now available (miss_func).

    The tool list lives in the system prompt, which token-in-token-out cannot rewrite, so restored
    tools are announced in the user message, one signature per line.
    """
    sigs = [f"{t.function.name}({', '.join(t.function.parameters.get('properties', {}))})" for t in new_tools]
    return "New tools: " + "; ".join(sigs) + ".\n"


def observation_text(observation: Any) -> str:
    return json.dumps(observation, ensure_ascii=False, sort_keys=True)


class _Stream:
    """Append-only token stream with its parallel per-token arrays."""

    def __init__(self, prompt: list[int]):
        self.ids = list(prompt)
        self.mask = [0] * len(prompt)
        self.logprobs = [0.0] * len(prompt)
        self.segments = [SEG_ENV] * len(prompt)
        self._env_hash = hashlib.blake2b(digest_size=8)
        self._env_hash.update(repr(list(prompt)).encode())

    def state_key(self) -> str:
        """Hash of the observation history (all environment-injected tokens so far)."""
        return self._env_hash.hexdigest()

    def add_env(self, ids: list[int]) -> None:
        self._env_hash.update(repr(list(ids)).encode())
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.segments += [SEG_ENV] * len(ids)

    def add_policy(self, ids: list[int], logprobs: list[float], segment: int) -> None:
        self.ids += ids
        self.mask += [1] * len(ids)
        self.logprobs += list(logprobs)
        self.segments += [segment] * len(ids)


async def run_episode(
    task: Task,
    policy: Policy,
    env: EnvSession,
    formatter: ChatFormatter,
    limits: EpisodeLimits,
    system_prompt: str | None = None,
) -> Episode:
    """Roll out ``task`` turn by turn; never raises on anything the model writes. An ``EnvError``
    from ``env`` (its tool actor or simulator died) ends the episode with ``ENV_ERROR``.

    ``formatter`` decides the text conventions: its tool format parses the calls, and its
    ``system_prompt`` is used when ``system_prompt`` is None (``ChatFormatter.prompt_ids``)."""
    stream = _Stream(formatter.prompt_ids(system_prompt, task.visible_tools(0), task.turns[0].user))
    prompt_len = len(stream.ids)
    passed: list[bool] = []
    calls_log: list[list[dict]] = []
    answers: list[str | None] = []
    spans: list[list[int]] = []
    step_turns: list[int] = []
    step_states: list[str] = []
    n_blocks = n_valid = 0
    termination = "done"
    gen_s = env_s = 0.0

    for u, turn in enumerate(task.turns):
        if u > 0:
            newly_visible = [t for t in task.visible_tools(u) if t.name in set(task.turns[u - 1].withheld_tools)]
            text = (tool_announcement(newly_visible) if newly_visible else "") + turn.user
            stream.add_env(formatter.delta_ids([{"role": "user", "content": text}]))
        known = {t.name for t in task.visible_tools(u)}
        results: list[tuple[ToolCall, Any]] = []
        turn_log: list[dict] = []
        finished_turn = False
        answer: str | None = None
        for step in range(limits.max_assistant_messages_per_turn):
            budget = min(limits.max_new_tokens, limits.max_episode_tokens - len(stream.ids))
            if budget <= 0:
                termination = "max_tokens"
                break
            t0 = time.perf_counter()
            gen = await policy.generate(stream.ids, budget)
            gen_s += time.perf_counter() - t0
            ended = gen.finish_reason == "stop" and gen.token_ids and gen.token_ids[-1] in formatter.eos_token_ids
            body = gen.token_ids[:-1] if ended else gen.token_ids
            # in the formatter's tool format (agent.tool_format; hermes: parser.parse_assistant)
            parsed: ParsedMessage = formatter.parse(formatter.tokenizer.decode(body), known_tools=known)
            # Summary = a message that closes the turn without a call. A message cut off by the
            # token budget closes nothing, so it is tool segment even before any call tag.
            segment = SEG_SUMMARY if ended and not parsed.has_call_attempt else SEG_TOOL
            step_states.append(stream.state_key())
            spans.append([len(stream.ids), len(stream.ids) + len(gen.token_ids)])
            step_turns.append(u)
            stream.add_policy(gen.token_ids, gen.logprobs, segment)
            n_blocks += parsed.n_blocks
            n_valid += parsed.n_valid
            if not ended:
                # Cut off mid-message: the conversation cannot continue from a half message.
                termination = "length"
                break
            if not parsed.has_call_attempt:
                finished_turn = True
                answer = parsed.content
                break
            t0 = time.perf_counter()
            try:
                observations = await env.execute(parsed.calls) if parsed.calls else []
            except EnvError:
                termination = ENV_ERROR
                break
            env_s += time.perf_counter() - t0
            for call, obs in zip(parsed.calls, observations):
                results.append((call, obs))
                turn_log.append({"name": call.name, "arguments": call.arguments, "observation": obs, "step": step})
            # Malformed blocks still get an answer, so the model sees its mistake.
            observations = list(observations) + [{"error": e} for e in parsed.errors]
            stream.add_env(formatter.delta_ids([{"role": "tool", "content": observation_text(o)} for o in observations]))
        else:
            termination = "max_messages"
        calls_log.append(turn_log)
        answers.append(answer)
        if not finished_turn:
            break
        t0 = time.perf_counter()
        try:
            passed.append(bool(await env.end_turn(u, results)))
        except EnvError:
            termination = ENV_ERROR
            break
        env_s += time.perf_counter() - t0

    return Episode(
        task_id=task.id,
        token_ids=stream.ids,
        response_mask=stream.mask,
        logprobs=stream.logprobs,
        segments=stream.segments,
        prompt_len=prompt_len,
        turn_passed=passed,
        n_turns=len(task.turns),
        calls=calls_log,
        n_call_blocks=n_blocks,
        n_valid_calls=n_valid,
        termination=termination,
        gen_seconds=gen_s,
        env_seconds=env_s,
        step_spans=spans,
        step_turns=step_turns,
        step_states=step_states,
        answers=answers,
    )
