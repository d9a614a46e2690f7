"""SGLS: tools that exist only as a JSON schema, answered by an LLM playing the API server.

Two layers, so the expensive part can live in one place for the whole cluster:

* ``ToolSimulator`` turns (task id, the episode's earlier exchanges, a call, the tool's spec,
  the task's initial state) into an observation: cache lookup, prompt, JSON-constrained decoding,
  output validation, retries, and a clear error when all attempts fail. It owns the
  ``SimulationCache`` and talks to an ``llm``: an ``agentrl.llm.adapters.JsonLLM`` (an
  OpenAI-compatible endpoint, or the in-cluster vLLM engine of ``agentrl.rollout.sgls_server``).
* ``SGLSBackend`` is one episode's ``ToolBackend``: it validates calls against the task's schemas
  (invalid calls never reach a simulator), keeps the episode's history and asks a *simulator* —
  any object with ``ToolSimulator.simulate``'s signature — for each valid call. In-process that is
  a ``ToolSimulator``; on a cluster it is ``RemoteSimulator``, a ``ray.get`` adapter over the one
  ``SGLSServer`` actor, so episodes of a group share one cache whichever tool-pool actor hosts them.

Concurrent identical misses are computed once (the first caller decodes, the others wait for its
answer): the G episodes of a group start together and usually open with the same call, so without
this the cache would miss exactly where sharing matters most. Waiters receive the first caller's
answer even when it is an error observation (which is still not cached).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from agentrl.api import EnvError
from agentrl.envs.checker import TurnCheck
from agentrl.envs.sgls.cache import SimulationCache, cache_key, canonical_json, history_entry
from agentrl.envs.tool_schema import GENERIC_OUTPUT_SCHEMA, validate_call, validate_output
from agentrl.llm.adapters import JsonLLM
from agentrl.tasks.schema import Task, ToolCall, ToolSpec

# A simulated server may refuse a request the way a real one would (unknown record, ...). The
# message is bounded so a noisy model cannot spend max_tokens inside one string.
ERROR_RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"error": {"type": "string", "maxLength": 200}},
    "required": ["error"],
    "additionalProperties": False,
}

SYSTEM_PROMPT = """\
You are the API server behind the tool `{name}`. Answer each request with the exact JSON body \
the real API would return, and nothing else.
Tool description: {description}
Request parameters (JSON Schema): {parameters}
{returns}{state}Be consistent with the server state and with your earlier responses in this \
session. If the request cannot succeed (for example, a record does not exist), answer \
{{"error": "<short reason>"}}."""



def output_schema(returns: dict[str, Any] | None) -> dict[str, Any]:
    """What decoding is constrained to: the ``returns`` schema or an error object; any JSON
    object when the tool declares no ``returns``."""
    if returns is None:
        return GENERIC_OUTPUT_SCHEMA
    return {"anyOf": [returns, ERROR_RESPONSE_SCHEMA]}


def build_messages(spec: ToolSpec, initial_state: Mapping[str, Any] | None, history: list[dict[str, Any]],
                   call: Mapping[str, Any], max_state_chars: int = 8000) -> list[dict[str, str]]:
    """The chat the simulator LLM completes: a system prompt describing the tool (and the task's
    initial state, compact and truncated to ``max_state_chars``), then each earlier exchange as
    a user request / assistant response pair, then the current request."""
    fn = spec.function
    returns = f"Response (JSON Schema): {canonical_json(fn.returns)}\n" if fn.returns is not None else ""
    state = ""
    if initial_state:
        text = canonical_json(initial_state)
        if len(text) > max_state_chars:
            text = text[:max_state_chars] + " ...(truncated)"
        state = f"Server state at the start of the session: {text}\n"
    system = SYSTEM_PROMPT.format(name=fn.name, description=fn.description or "(none)",
                                  parameters=canonical_json(fn.parameters), returns=returns, state=state)
    messages = [{"role": "system", "content": system}]
    for h in history:
        messages.append({"role": "user", "content": canonical_json(h["call"])})
        messages.append({"role": "assistant", "content": canonical_json(h["response"])})
    messages.append({"role": "user", "content": canonical_json(history_entry(call, None)["call"])})
    return messages


class ToolSimulator:
    """Cache + prompt + constrained decoding + validation + retries around one ``llm``.

    ``simulate`` never raises: LLM/client failures and outputs still invalid after
    ``max_retries`` retries become ``{"error": ...}`` observations, which are not cached (the next
    episode to make the call tries again). Retry k uses seed ``seed + k`` so a seeded sampler does
    not repeat the failure; at temperature 0 retries only help against nondeterministic servers.
    """

    def __init__(self, llm: JsonLLM, cache: SimulationCache | None = None, max_retries: int = 2, max_state_chars: int = 8000):
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.llm = llm
        self.cache = cache if cache is not None else SimulationCache()
        self.max_retries = max_retries
        self.max_state_chars = max_state_chars
        self._lock = threading.Lock()
        self._inflight: dict[str, Future] = {}
        self.counts = {"calls": 0, "llm_calls": 0, "retries": 0, "invalid": 0, "llm_errors": 0, "failed": 0, "shared": 0}

    def _count(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1

    def simulate(self, task_id: str, history: list[dict[str, Any]], call: ToolCall | Mapping[str, Any],
                 tool_spec: ToolSpec | Mapping[str, Any], initial_state: Mapping[str, Any] | None = None,
                 seed: int | None = None) -> Any:
        """The simulated response to ``call`` after ``history`` (``history_entry`` dicts). The
        call is assumed valid (``SGLSBackend`` checks it first)."""
        call_d = history_entry(call, None)["call"]
        key = cache_key(task_id, history, call_d)
        with self._lock:
            self.counts["calls"] += 1
            pending = self._inflight.get(key)
            if pending is None:
                hit, value = self.cache.lookup(key)
                if hit:
                    return value
                mine: Future = Future()
                self._inflight[key] = mine
        if pending is not None:  # an identical call is being decoded right now: share its answer
            answer = pending.result()
            self._count("shared")  # not a cache lookup: hit counters stay true cache hits
            return copy.deepcopy(answer)
        try:
            try:
                spec = tool_spec if isinstance(tool_spec, ToolSpec) else ToolSpec.model_validate(tool_spec)
                answer, ok = self._decode(spec, initial_state, history, call_d, seed)
            except Exception as exc:  # noqa: BLE001 - e.g. a malformed spec: still an observation
                answer, ok = {"error": f"simulator failed for {call_d['name']}: {type(exc).__name__}: {exc}"}, False
            if ok:
                self.cache.put(key, answer)
            else:
                self._count("failed")
        finally:
            with self._lock:
                self._inflight.pop(key, None)
            mine.set_result(answer)
        return copy.deepcopy(answer)

    def _decode(self, spec: ToolSpec, initial_state, history, call_d, seed) -> tuple[Any, bool]:
        name = spec.function.name
        messages = build_messages(spec, initial_state, history, call_d, self.max_state_chars)
        schema = output_schema(spec.function.returns)
        reason = ""
        attempts = 1 + self.max_retries
        for attempt in range(attempts):
            if attempt:
                self._count("retries")
            self._count("llm_calls")
            try:
                text = self.llm.simulate(messages, schema, None if seed is None else seed + attempt)
            except Exception as exc:  # noqa: BLE001 - the contract is "never raises into the episode"
                self._count("llm_errors")
                return {"error": f"simulator unavailable for {name}: {type(exc).__name__}: {exc}"}, False
            value, reason = validate_output(text, schema)
            if reason is None:
                return value, True
            self._count("invalid")
        return {"error": f"simulator returned invalid output for {name} after {attempts} attempts: {reason}"}, False

    def stats(self) -> dict[str, float]:
        """Counters since start: ``calls`` reaching the simulator, ``cache_hits``/``cache_misses``
        (the cache's own ``hit_rate`` is reported as ``cache_hit_rate``), ``shared`` (waits on an
        identical call being decoded), ``hit_rate`` = (cache hits + shared) / calls — the share of
        calls answered without decoding, i.e. reused within the group — ``retries``, ``invalid``
        outputs, ``llm_calls``, ``llm_errors`` and ``failed`` (error observations produced)."""
        with self._lock:
            out: dict[str, float] = dict(self.counts)
        cache = self.cache.stats()
        out.update(cache)
        out["cache_hit_rate"] = cache.get("hit_rate", 0.0)
        out["hit_rate"] = (out.get("cache_hits", 0) + out["shared"]) / out["calls"] if out["calls"] else 0.0
        return out


class SGLSBackend:
    """One episode against schema-only tools (the ``ToolBackend`` protocol).

    Calls failing ``validate_call`` get its deterministic error and are left out of the history:
    a rejected request changes nothing on a server, and leaving it out lets episodes that differ
    only by a rejected call keep sharing cached answers. Everything that reached the simulator —
    including its error observations, which the agent saw — is history. ``state()`` is that
    history as ``[{"call": {...}, "response": ...}, ...]``.
    """

    def __init__(self, task: Task, simulator: Any, *, seed: int | None = None):
        self.task = task
        self.simulator = simulator
        self.seed = seed
        self._specs = {t.name: t.model_dump() for t in task.tools}
        self._history: list[dict[str, Any]] = []

    def execute(self, call: ToolCall) -> Any:
        error = validate_call(self.task.tools, call)
        if error is not None:
            return error
        try:
            response = self.simulator.simulate(self.task.id, copy.deepcopy(self._history), call,
                                               self._specs[call.name], self.task.initial_state, self.seed)
        except EnvError:
            raise  # the simulator itself is gone: the episode ends (ENV_ERROR), never trained on
        except Exception as exc:  # noqa: BLE001 - anything else: an error observation, never a raise
            response = {"error": f"simulator unavailable for {call.name}: {type(exc).__name__}: {exc}"}
        self._history.append(history_entry(call, copy.deepcopy(response)))
        return response

    def state(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self._history)

    def check_turn(self, turn_index: int, turn_results: list, all_results: list) -> TurnCheck:
        """Action match (an LLM's answers cannot be replayed into a reference state): the turn
        passes when every gold call of the turn was made in it with the same name and the same
        arguments (canonical JSON; calls were schema-validated, so types are already right) and
        was not rejected by validation. Extra calls are allowed. A turn with empty gold is not
        checked (passes), as in BFCL: with schema-only tools there is no way to tell a harmless
        lookup from a write.

        τ²-bench tasks (domain ``tau2-*``) are checked by τ²'s own criterion instead: replaying the
        agent's calls and the gold actions on the real domain code ends in the same database."""
        if self.task.domain.startswith("tau2-"):
            # deferred: the optional tau2 packages, and envs.tau2 imports this package
            from agentrl.envs.tau2.outcome import outcome_report

            report = outcome_report(self.task, [c for c, _ in all_results])
            return TurnCheck(passed=report.passed, state_match=report.passed, results_match=True,
                             reason=report.reason)
        made = [canonical_json({"name": c.name, "arguments": c.arguments}) for c, _ in turn_results
                if validate_call(self.task.tools, c) is None]
        missing = []
        for gold in self.task.gold_calls(turn_index):
            key = canonical_json({"name": gold.name, "arguments": gold.arguments})
            if key in made:
                made.remove(key)
            else:
                missing.append(gold)
        reason = f"{len(missing)} gold call(s) not made, e.g. {missing[0].name}({missing[0].arguments})" if missing else ""
        return TurnCheck(passed=not missing, state_match=True, results_match=not missing, reason=reason)
