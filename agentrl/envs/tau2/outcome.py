"""τ²'s outcome criteria for the airline / retail tasks, without an LLM.

DB (``check_outcome``). τ²'s ``EnvironmentEvaluator``: replay the gold actions on a fresh
environment, replay the trajectory's tool calls on another, and pass when the two DB hashes are
equal. Both domain packages ship τ²'s tool code as plain functions over the DB dict, so this is
done exactly, by that code, on the full shipped DB (not on the task's ``initial_state`` excerpt):

* gold: the task's gold calls (every turn, in order); one that fails raises (a broken task);
* agent: the agent's calls in order, each run as τ² would run it — a call whose tool does not exist
  or whose arguments break the task's tool schema is skipped (SGLS answers it with a validation
  error and no server sees it), a call that raises counts as made (a τ² tool may fail after a
  partial change; the package's code does what τ²'s does), read-only tools are skipped (they never
  change the DB; checked in tests on every gold read);
* the end states must be equal record by record. Numbers compare by value (``1 == 1.0``: τ²'s
  pydantic models coerce ``int``/``float``, the dicts here do not) and floats to 6 decimals (two
  orders of the same gift-card deductions may differ in the last bit).

What the agent *saw* does not enter: the tools are simulated by SGLS, and the replay asks what the
real system would have done with the same calls. When the simulator's answer to a write disagrees
with the real code (it refuses a valid write or accepts an invalid one), the verdict follows the
real code. Tasks whose gold makes no successful write pass exactly when the agent changed nothing.

COMMUNICATE (``check_communicate``): τ²'s English rule — every ``communicate_info`` string (the
task's ``answer_facts``), lower-cased, occurs in some assistant message, lower-cased with commas
removed.

NL_ASSERTION needs an LLM judge and is not implemented: ``tau2_reward`` returns ``None`` for the
tasks whose ``reward_basis`` needs it (retail tasks with ``nl_assertions``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl.envs.base import is_error
from agentrl.envs.tau2.tasks import domain_of, evaluation_criteria
from agentrl.envs.tau2.tools import WRITE_TOOLS, base_db, cow_db, db_changes, execute
from agentrl.envs.tool_schema import validate_call
from agentrl.tasks.schema import Task, ToolCall

FLOAT_DIGITS = 6


@dataclass(frozen=True)
class OutcomeCheck:
    """The DB verdict and how it came about."""

    passed: bool
    reason: str = ""
    # (index into the agent's calls, tool name, message) of calls skipped as SGLS would reject them
    rejected: list[tuple[int, str, str]] = field(default_factory=list)
    # (index, tool name, error) of write calls the real tools refused (they still count as made)
    errors: list[tuple[int, str, str]] = field(default_factory=list)
    # "table/key" of every record whose end state differs from the gold end state
    differing: list[str] = field(default_factory=list)


def _as_call(call: ToolCall | Mapping[str, Any]) -> ToolCall:
    if isinstance(call, ToolCall):
        return call
    return ToolCall(name=call["name"], arguments=dict(call.get("arguments") or {}))


def _norm(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, FLOAT_DIGITS)
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_norm(v) for v in value]
    return value


def replay(task: Task, calls: Iterable[ToolCall | Mapping[str, Any]]) -> tuple[dict[str, Any], OutcomeCheck]:
    """Run the write calls of ``calls`` (skipping those SGLS would reject) on a fresh DB; returns
    the DB and an ``OutcomeCheck`` carrying only ``rejected`` / ``errors``."""
    domain = domain_of(task)
    writes = WRITE_TOOLS[domain]
    db = cow_db(domain)
    rejected, errors = [], []
    for i, raw in enumerate(calls):
        call = _as_call(raw)
        invalid = validate_call(task.tools, call)
        if invalid is not None:
            rejected.append((i, call.name, invalid["error"]))
            continue
        if call.name not in writes:
            continue
        obs = execute(domain, db, call)
        if is_error(obs):
            errors.append((i, call.name, obs["error"]))
    return db, OutcomeCheck(passed=False, rejected=rejected, errors=errors)


@functools.lru_cache(maxsize=4096)
def _gold_changes(domain: str, gold_json: str) -> dict[tuple[str, str], Any]:
    db = cow_db(domain)
    for name, arguments in json.loads(gold_json):
        obs = execute(domain, db, {"name": name, "arguments": arguments})
        if is_error(obs):
            raise ValueError(f"τ² {domain}: gold call {name}({json.dumps(arguments)[:200]}) failed: {obs['error']}")
    return db_changes(domain, db)


def expected_changes(task: Task) -> dict[tuple[str, str], Any]:
    """``{(table, key): record}``: the records the gold calls change, as they end up (cached per
    distinct gold plan; treat as read-only)."""
    gold = [[c.name, c.arguments] for u in range(len(task.turns)) for c in task.gold_calls(u)]
    return _gold_changes(domain_of(task), json.dumps(gold, sort_keys=True))


def expected_db_writes(task: Task) -> list[ToolCall]:
    """The gold calls that write (in order): the DB changes the task expects, as calls."""
    writes = WRITE_TOOLS[domain_of(task)]
    return [c for u in range(len(task.turns)) for c in task.gold_calls(u) if c.name in writes]


def outcome_report(task: Task, calls: Iterable[ToolCall | Mapping[str, Any]]) -> OutcomeCheck:
    """τ²'s DB criterion for the agent's ``calls`` (every tool call of the episode, in order)."""
    domain = domain_of(task)
    gold = expected_changes(task)
    db, partial = replay(task, calls)
    mine = db_changes(domain, db)
    base = base_db(domain)
    differing = []
    for table, key in sorted(set(gold) | set(mine)):
        ref = base[table].get(key)
        if _norm(mine.get((table, key), ref)) != _norm(gold.get((table, key), ref)):
            differing.append(f"{table}/{key}")
    if differing:
        reason = f"{len(differing)} record(s) differ from the gold end state: {', '.join(differing[:5])}"
        if partial.errors:
            _, name, error = partial.errors[0]
            reason += f"; {len(partial.errors)} write call(s) failed, first: {name}: {error}"
    else:
        reason = ""
    return OutcomeCheck(passed=not differing, reason=reason, rejected=partial.rejected, errors=partial.errors,
                        differing=differing)


def check_outcome(task: Task, calls: Iterable[ToolCall | Mapping[str, Any]]) -> bool:
    """Does replaying the agent's calls end in the gold DB state? (τ²'s DB reward, as a bool.)"""
    return outcome_report(task, calls).passed


def check_communicate(task: Task, assistant_texts: Iterable[str]) -> bool:
    """τ²'s COMMUNICATE criterion: every ``answer_facts`` string in some assistant message."""
    texts = [t.lower().replace(",", "") for t in assistant_texts if t]
    return all(any(info.lower() in t for t in texts) for u in task.turns for info in u.answer_facts)


def tau2_reward(task: Task, calls: Iterable[ToolCall | Mapping[str, Any]],
                assistant_texts: Iterable[str]) -> float | None:
    """τ²'s task reward (the product over ``reward_basis``), or ``None`` when the basis includes
    ``NL_ASSERTION`` and the task has ``nl_assertions`` (an LLM judge is needed; not here)."""
    criteria = evaluation_criteria(task)
    basis = set(criteria.get("reward_basis") or [])
    unknown = basis - {"DB", "COMMUNICATE", "NL_ASSERTION"}
    if unknown:
        raise ValueError(f"task {task.id!r}: reward_basis {sorted(unknown)} is not supported")
    if "NL_ASSERTION" in basis and criteria.get("nl_assertions"):
        return None
    reward = 1.0
    if "DB" in basis:
        reward *= float(check_outcome(task, calls))
    if "COMMUNICATE" in basis:
        reward *= float(check_communicate(task, assistant_texts))
    return reward
