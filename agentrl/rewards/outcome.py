"""Outcome and progress rewards from per-turn checks (docs/design.md §3).

Both take the number of turns the task *expects*, not the number the episode reached: an episode
cut off after two of four turns must not score like a finished two-turn task.
"""

from __future__ import annotations

from collections.abc import Sequence


def _passed(turn_passed: Sequence[bool], n_turns_expected: int) -> int:
    if n_turns_expected < 1:
        raise ValueError(f"n_turns_expected must be >= 1, got {n_turns_expected}")
    if len(turn_passed) > n_turns_expected:
        raise ValueError(f"{len(turn_passed)} turn results for a task of {n_turns_expected} turns")
    return sum(1 for p in turn_passed if p)


def progress_reward(turn_passed: Sequence[bool], n_turns_expected: int) -> float:
    """R_P = turns passed / turns expected; missing (truncated) turns count as failed."""
    return _passed(turn_passed, n_turns_expected) / n_turns_expected


def outcome_reward(turn_passed: Sequence[bool], n_turns_expected: int) -> float:
    """R_out = 1 when every expected turn is present and passed, else 0."""
    return 1.0 if _passed(turn_passed, n_turns_expected) == n_turns_expected else 0.0
