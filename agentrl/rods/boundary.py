"""RODS boundary detector and seed selection (docs/design.md §5), as pure functions.

The detector costs nothing: it reads the G rewards of each task's group from the training
rollouts. For a group with mean progress reward r̄ in [0, 1]:

    φ = 4 · r̄ · (1 − r̄)

is the Bhatia–Davis bound on the variance of a [0, 1] reward with that mean (max 1/4 at
r̄ = 1/2), scaled to [0, 1]; it is largest where the task is neither solved nor hopeless. The
empirical (population, ``/ n``) variance of the rewards is kept beside it as a tie-breaker.

Regions (RODS paper defaults): ``too_hard`` when r̄ < low (0.20), ``mastered`` when r̄ > high
(0.85), else ``boundary`` (both edges inclusive).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Region = Literal["too_hard", "boundary", "mastered"]
REGIONS: tuple[Region, ...] = ("too_hard", "boundary", "mastered")
LOW, HIGH = 0.20, 0.85


def phi(mean: float) -> float:
    """φ = 4·r̄·(1 − r̄), clipped to [0, 1] (a mean a hair outside [0, 1] from rounding gives 0)."""
    return min(1.0, max(0.0, 4.0 * mean * (1.0 - mean)))


def region(mean: float, low: float = LOW, high: float = HIGH) -> Region:
    """``too_hard`` if r̄ < low, ``mastered`` if r̄ > high, else ``boundary``."""
    if low > high:
        raise ValueError(f"low={low} must be <= high={high}")
    if mean < low:
        return "too_hard"
    if mean > high:
        return "mastered"
    return "boundary"


@dataclass(frozen=True)
class GroupStat:
    """Boundary statistics of one task's group of episodes."""

    task_id: str
    category: str
    # r̄: mean reward over the group.
    mean: float
    # φ = 4·r̄·(1 − r̄).
    phi: float
    # Empirical (population) variance of the group's rewards: mean((r_i − r̄)²).
    variance: float
    # Group size G.
    n: int
    region: Region


def group_stat(task_id: str, category: str, rewards: Sequence[float], low: float = LOW,
               high: float = HIGH) -> GroupStat:
    """Statistics of one group: r̄ = mean(r), φ = 4·r̄·(1 − r̄), var = mean((r − r̄)²), region.

    Rewards must be finite and in [0, 1] (progress rewards are); an empty group is an error.
    """
    values = [float(r) for r in rewards]
    if not values:
        raise ValueError(f"task {task_id!r}: empty reward group")
    for r in values:
        if not math.isfinite(r) or not 0.0 <= r <= 1.0:
            raise ValueError(f"task {task_id!r}: reward {r} outside [0, 1]")
    n = len(values)
    mean = math.fsum(values) / n
    variance = math.fsum((r - mean) ** 2 for r in values) / n
    return GroupStat(task_id=task_id, category=category, mean=mean, phi=phi(mean), variance=variance,
                     n=n, region=region(mean, low, high))


def in_cooldown(task_id: str, cooldown: dict[str, int], step: int, cooldown_steps: int) -> bool:
    """True while ``step − cooldown[task_id] < cooldown_steps`` (cooldown = step last used as seed)."""
    last = cooldown.get(task_id)
    return last is not None and step - last < cooldown_steps


def select_seeds(stats: Sequence[GroupStat], cooldown: dict[str, int], step: int,
                 quota_per_category: int, cooldown_steps: int) -> list[GroupStat]:
    """Seed tasks for synthesis: boundary tasks not in cooldown, top-φ per category up to the quota.

    A task listed several times counts by its latest (last) entry. Within a category the order is
    φ descending, then variance descending, then task id, so the result is deterministic. The
    output lists categories in sorted order, each bucket in that ranking. Does not update
    ``cooldown``: the caller records ``cooldown[s.task_id] = step`` for the seeds it uses.
    """
    if quota_per_category < 0 or cooldown_steps < 0:
        raise ValueError("quota_per_category and cooldown_steps must be >= 0")
    latest: dict[str, GroupStat] = {}
    for s in stats:
        latest.pop(s.task_id, None)  # re-insert so the latest entry wins
        latest[s.task_id] = s
    buckets: dict[str, list[GroupStat]] = {}
    for s in latest.values():
        if s.region == "boundary" and not in_cooldown(s.task_id, cooldown, step, cooldown_steps):
            buckets.setdefault(s.category, []).append(s)
    out: list[GroupStat] = []
    for category in sorted(buckets):
        ranked = sorted(buckets[category], key=lambda s: (-s.phi, -s.variance, s.task_id))
        out.extend(ranked[:quota_per_category])
    return out
