"""The metrics file's name and the display fields read from a metrics row, shared by the sinks
(``metrics.py``), the progress line and ``report.png`` (``report.py``) without importing the sinks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

METRICS_FILE = "metrics.jsonl"

# display field -> metric names that carry it, canonical name first
FIELDS: dict[str, tuple[str, ...]] = {
    "success": ("train/success", "success", "reward/success", "rollout/success"),
    "progress": ("train/progress", "progress", "reward/progress", "rollout/progress"),
    "reward_std": ("train/reward_std", "reward_std", "reward/std", "rollout/reward_std"),
    "tokens_per_s": ("perf/tokens_per_s", "tokens_per_s", "rollout/tokens_per_s"),
    "time_gen": ("time/generate", "time/gen", "time_gen", "gen_s"),
    "time_learn": ("time/learn", "time_learn", "learn_s"),
    "time_sync": ("time/sync", "time_sync", "sync_s"),
    "lag": ("train/policy_lag", "policy_lag", "lag", "buffer/lag"),
}


def pick(metrics: Mapping[str, Any], field: str) -> float | None:
    """The value of display ``field`` (see ``FIELDS``) in ``metrics``, or None when absent."""
    for name in FIELDS[field]:
        value = metrics.get(name)
        if value is not None:
            try:
                return float(value)
            except (TypeError, ValueError):
                return None
    return None
