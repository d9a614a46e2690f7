"""Metrics from what the workers report: pure functions, no Ray, no torch.

``step_metrics`` turns one training step's group summaries (``rollout_worker.group_summary``),
phase timings and the learner's metrics into the ``train/*``, ``perf/*``, ``time/*``,
``reward/*`` and ``learner/*`` scalars the driver logs. ``eval_metrics`` turns the per-episode
results of a held-out evaluation (``RolloutWorker.evaluate``) into the ``eval/*`` scalars
(without the prefix): success, progress, calls, tool errors, success per category and behaviour
rates (the last two only where the tasks define them).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping

from agentrl.api import GroupSummary
from agentrl.envs.behaviours import behaviour_rates

# the phases of a step the driver times (seconds); ``generate`` comes from the summaries instead
STEP_TIMINGS = ("rollout_wait", "learn", "sync", "step")


def summarize(results: list[dict]) -> dict[str, tuple[int, float]]:
    """{category: (entries, accuracy)} plus "overall"; accuracy = mean outcome. Entries without a
    category (a reward-scored task that names none) count in "overall" only."""
    by_cat: dict[str, list[float]] = defaultdict(list)
    for r in results:
        if r.get("category") is not None:
            by_cat[r["category"]].append(r["outcome"])
    out = {c: (len(v), sum(v) / len(v)) for c, v in sorted(by_cat.items())}
    all_ = [r["outcome"] for r in results]
    out["overall"] = (len(all_), sum(all_) / len(all_) if all_ else 0.0)
    return out


def step_metrics(summaries: list[GroupSummary], timings: Mapping[str, float], learn: Mapping[str, float],
                 version: int, namespaces: tuple[str, ...] = ()) -> dict[str, float]:
    """One step's metrics from its group summaries.

    ``timings``: seconds per phase, keys ``STEP_TIMINGS`` (``rollout_wait``: generation time not
    hidden behind learning). ``learn``: the learner's metrics ({} when nothing was trained).
    ``version``: the learner's policy version after this step's update. Episodes dropped because
    their environment failed (after ``recovery/env_reruns`` of their group) are counted
    (``train/env_failures``, ``recovery/dropped_episodes``) and are in no other number; a group
    they emptied is left out. ``namespaces``: prefixes of learner metrics kept as they are instead
    of going under ``learner/`` (the run's methods', ``"<method name>/"``).
    """
    failures = float(sum(s.env_failures for s in summaries))
    reruns = float(sum(s.env_reruns for s in summaries))
    summaries = [s for s in summaries if s.outcome]
    outcomes = [o for s in summaries for o in s.outcome]
    progress = [p for s in summaries for p in s.progress]
    n = max(1, len(outcomes))
    tokens = sum(s.policy_tokens for s in summaries)
    group_std = [statistics.pstdev(s.progress) for s in summaries]
    t_gen = max((s.wall_seconds for s in summaries), default=0.0)
    calls = sum(s.calls for s in summaries)
    valid = sum(s.valid_calls for s in summaries)
    m = {
        "train/success": sum(outcomes) / n,
        "train/progress": sum(progress) / n,
        "train/reward_std": sum(group_std) / max(1, len(group_std)),
        # groups whose progress rewards differ: the ones a group-relative estimator learns from
        "train/groups_with_variance": sum(sd > 0 for sd in group_std) / max(1, len(group_std)),
        "train/episodes": float(len(outcomes)),
        "train/env_failures": failures,
        "recovery/dropped_episodes": failures,
        # groups rolled out again because an environment failed (a tool actor died): nothing dropped
        "recovery/env_reruns": reruns,
        # exceptions plugin tools raised (the model read each as an error; docs/own_tools.md)
        "train/tool_errors": float(sum(s.tool_errors for s in summaries)),
        "train/policy_tokens": float(tokens),
        "perf/tokens_per_s": tokens / max(t_gen, 1e-9),
        "train/calls_per_episode": calls / n,
        "train/valid_call_fraction": valid / max(1, calls),
        "train/redundant_call_fraction": sum(s.redundant_calls for s in summaries) / max(1, valid),
        "time/generate": t_gen,
        **{f"time/{k}": timings[k] for k in STEP_TIMINGS},
        "train/policy_version": float(version),
        "train/policy_lag": float(version - 1 - min(s.version for s in summaries)) if summaries else 0.0,
    }
    # HierR components, summary reward, omission rate: means over groups (groups are equal-sized)
    for key in (summaries[0].rewards if summaries else {}):
        m[f"reward/{key}"] = sum(s.rewards[key] for s in summaries) / len(summaries)
    # the learner's metrics under learner/, except the methods' own (their "<name>/" namespaces)
    m.update({k if k.startswith(namespaces) else f"learner/{k}": float(v) for k, v in learn.items()})
    return m


def eval_metrics(results: list[dict], seconds: float) -> dict[str, float]:
    """A held-out evaluation's summary from its per-episode results (greedy, one per task)."""
    n = max(1, len(results))
    out = {
        "success": sum(r["outcome"] for r in results) / n,
        "progress": sum(r["progress"] for r in results) / n,
        "mean_calls": sum(r["calls"] for r in results) / n,
        "redundant_call_rate": sum(r["redundant_calls"] for r in results) / max(1, sum(r["valid_calls"] for r in results)),
        "episodes": float(len(results)),
        "tool_errors": float(sum(len(r.get("tool_errors") or ()) for r in results)),
        "seconds": seconds,
    }
    # omission: only where a gold plan says a call was needed (not for reward-scored tasks)
    if judged := [r["omission"] for r in results if r.get("omission", 0.0) is not None]:
        out["omission_rate"] = sum(judged) / len(judged)
    # the rule summary score (absent when rewards.summary is judge or none: evaluation never calls the judge)
    if scored := [r["summary_score"] for r in results if r.get("summary_score") is not None]:
        out["summary_score"] = sum(scored) / len(scored)
    # what changed, not only how much: success per category and the rate of each behaviour
    for cat, (_, acc) in summarize(results).items():
        if cat != "overall":
            out[f"success/{cat}"] = acc
    out.update({f"behaviour/{k}": v for k, v in behaviour_rates([r.get("behaviours") or {} for r in results]).items()})
    return out
