"""Per-turn check for executable backends (docs/design.md §3, BFCL style).

The gold plan is not compared call-by-call with what the model did: many call sequences reach the
same place (extra lookups, different order of independent calls). Instead the check asks two
questions a user would care about after each turn — is the world in the right state, and did the
model see every answer the gold plan produced — by replaying the gold calls of turns <= u on a
fresh backend from the task's initial state.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from agentrl.envs.base import is_error
from agentrl.envs.registry import make_backend
from agentrl.tasks.schema import Task, ToolCall


@dataclass(frozen=True)
class TurnCheck:
    passed: bool
    state_match: bool
    results_match: bool
    reason: str = ""


@dataclass(frozen=True)
class GoldTurn:
    """The backend state after a turn's gold calls, and those calls' results (flattened)."""

    state: Any
    results: list[Any]


def canonical(value: Any) -> str:
    """JSON text that is equal for equal JSON values (key order ignored, list order kept)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def gold_replay(task: Task, upto: int | None = None) -> list[GoldTurn]:
    """Replay the gold plan turn by turn on one fresh backend.

    Computing every turn in one pass lets an episode check all its turns without replaying the
    prefix again for each one (pass the result to ``check_turn(gold=...)``). A gold call that
    errors is a broken task, not a model failure, so it raises.
    """
    last = len(task.turns) - 1 if upto is None else upto
    backend = make_backend(task)
    out: list[GoldTurn] = []
    for u in range(last + 1):
        results = []
        for call in task.gold_calls(u):
            result = backend.execute(call)
            if is_error(result):
                raise ValueError(f"task {task.id!r}: gold call {call.name} in turn {u} failed: {result['error']}")
            results.append(result)
        out.append(GoldTurn(state=backend.state(), results=results))
    return out


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    """Where two JSON values first differ, as ``path: model != gold`` (for readable reasons)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{k}" if path else str(k)
            if k not in a:
                return f"{sub}: missing in model state"
            if k not in b:
                return f"{sub}: not in gold state"
            if canonical(a[k]) != canonical(b[k]):
                return _first_difference(a[k], b[k], sub)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if canonical(x) != canonical(y):
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path or '<root>'}: {canonical(a)[:80]} != {canonical(b)[:80]}"


def check_turn(
    task: Task,
    turn_index: int,
    model_state: Any,
    model_results: list[tuple[ToolCall, Any]],
    gold: list[GoldTurn] | None = None,
) -> TurnCheck:
    """Did the model's turn ``turn_index`` end where the gold plan does?

    Passes when ``model_state`` equals the gold state after this turn and the results of this
    turn's gold calls form an unordered sub-multiset of ``model_results`` (the model's calls of
    this turn and their observations; extra calls are fine). A turn with empty gold (ask or
    refuse) therefore passes exactly when the model changed no state.
    """
    if not 0 <= turn_index < len(task.turns):
        raise IndexError(f"task {task.id!r} has {len(task.turns)} turns; no turn {turn_index}")
    gold_turn = (gold if gold is not None else gold_replay(task, turn_index))[turn_index]

    state_match = canonical(model_state) == canonical(gold_turn.state)
    available = Counter(canonical(r) for _, r in model_results)
    missing: list[Any] = []
    for r in gold_turn.results:
        key = canonical(r)
        if available[key] > 0:
            available[key] -= 1
        else:
            missing.append(r)
    results_match = not missing

    reasons = []
    if not state_match:
        reasons.append("state differs: " + _first_difference(model_state, gold_turn.state))
    if missing:
        reasons.append(f"{len(missing)} gold result(s) not observed, e.g. {canonical(missing[0])[:120]}")
    return TurnCheck(state_match and results_match, state_match, results_match, "; ".join(reasons))
