"""Skill signature of a task (docs/design.md §5): what a synthesized variant must keep.

Two tasks with the same signature exercise the same skills: the same backend classes, the same
number of turns and calls per turn, the same data-flow graph between gold calls, the same
category. Values (ids, amounts, names, wording) are free, which is what the synthesizers vary.

The dependency graph is the builtin generator's ``dependency_edges``: calls are numbered in plan
order across turns, and there is an edge i -> j when an argument value of call j equals a scalar
returned by an earlier step's call i (found by replaying the gold plan on a fresh backend) and the
user never stated that value. Its depth is the longest chain (0 = no call copies a result).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.envs.builtin import TOOL_OWNERS
from agentrl.envs.builtin.generator import dependency_edges
from agentrl.tasks.schema import Task


@dataclass(frozen=True)
class SkillSignature:
    """Hashable skill signature; equal signatures = same skills, possibly different values."""

    backend: str
    # Backend classes the task's tools belong to, sorted.
    classes: tuple[str, ...]
    n_turns: int
    # Number of gold calls in each turn (0 for an ask/refuse turn).
    calls_per_turn: tuple[int, ...]
    # Data-flow edges (i, j) between gold calls, numbered in plan order; sorted.
    edges: tuple[tuple[int, int], ...]
    # Longest data-flow chain (0 = no call copies a result).
    depth: int
    category: str


def tool_classes(task: Task) -> tuple[str, ...]:
    """Sorted backend classes of a task: BFCL's ``initial_state["involved_classes"]``; for builtin
    tasks the class owning each tool (``TOOL_OWNERS``); otherwise the task's domain."""
    involved = task.initial_state.get("involved_classes")
    if involved:
        return tuple(sorted(set(involved)))
    if task.backend == "builtin":
        owners = {TOOL_OWNERS[t.name] for t in task.tools if t.name in TOOL_OWNERS}
        if owners:
            return tuple(sorted(owners))
    return (task.domain,)


def skill_signature(task: Task) -> SkillSignature:
    """The task's skill signature. Replays the gold plan once (a failing gold call raises)."""
    edges, depths = dependency_edges(task)
    return SkillSignature(
        backend=task.backend,
        classes=tool_classes(task),
        n_turns=len(task.turns),
        calls_per_turn=tuple(len(task.gold_calls(u)) for u in range(len(task.turns))),
        edges=tuple(sorted(set(edges))),
        depth=max(depths, default=0),
        category=task.category,
    )
