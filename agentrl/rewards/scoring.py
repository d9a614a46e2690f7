"""All rewards of one finished episode (docs/design.md §3), as the ``rewards`` dict the learner reads.

``outcome`` and ``progress`` come from the per-turn checks; ``process`` is the HierR score R_tool
with each component logged as ``process/<name>``; ``summary`` is R_sum (the rule scorer or an LLM
judge), replaced by the omission penalty when the model answered a turn that needed a call
without making one. Keys are flat floats so they can be averaged per step by telemetry.

A task scored by a reward function (``task.reward`` or its backend's default,
agentrl/rewards/registry.py) gets ``outcome`` from it and ``progress`` = ``process`` = its process
score (the outcome when it gives none). Every episode still carries the same keys, because
telemetry averages each key over all groups of a step and a run may mix both kinds of task: the
HierR components that compare against a gold plan are set to that process score, ``format``
is measured as usual, and ``omission`` is 0 (no gold plan says a call was needed).
"""

from __future__ import annotations

import json
from typing import Any

from agentrl.rewards.hierr import COMPONENTS, HierRWeights, process_components, process_reward
from agentrl.rewards.outcome import outcome_reward, progress_reward
from agentrl.rewards.registry import reward_name, run_reward
from agentrl.rewards.summary import OMISSION_REWARD, episode_summary_reward, is_omission
from agentrl.tasks.schema import Task


def predicted_turns(calls_log: list[list[dict]]) -> list[list[list[dict]]]:
    """Episode calls log (per turn: calls with their ``step`` index) -> per turn, per step, calls."""
    out = []
    for turn in calls_log:
        steps: dict[int, list[dict]] = {}
        for c in turn:
            steps.setdefault(int(c.get("step", 0)), []).append({"name": c["name"], "arguments": c["arguments"]})
        out.append([steps[k] for k in sorted(steps)])
    return out


def gold_turns(task: Task) -> list[list[list[dict]]]:
    return [[[{"name": c.name, "arguments": c.arguments} for c in step] for step in turn.gold] for turn in task.turns]


def seen_context(task: Task, calls_log: list[list[dict]]) -> str:
    """What the model saw: the user turns it reached and every observation it got."""
    users = [t.user for t in task.turns[: max(1, len(calls_log))]]
    observations = [json.dumps(c.get("observation"), sort_keys=True, default=str) for turn in calls_log for c in turn]
    return "\n".join(users + observations)


def score_episode(ep: Any, task: Task, summary: str = "rule", summary_max_chars: int = 400,
                  weights: HierRWeights = HierRWeights(), function_score: tuple[float, float] | None = None
                  ) -> dict[str, float]:
    """Fill ``ep.rewards`` (an ``agent.episode.Episode``) and return it.

    ``summary`` is "rule" or "none" here; "judge" scores are filled in by the caller (it needs an
    endpoint), which then calls ``apply_summary``. A task scored by a reward function is
    dispatched to it (module docstring), unless ``function_score`` gives its (outcome, process)
    already: a reward that reads the live session ran where the session was, before it closed
    (``rollout.worker``).
    """
    r = ep.rewards
    name = reward_name(task)
    if name is not None:
        _score_by_function(ep, task, name, function_score)
    else:
        _score_by_checks(ep, task, weights)
    if summary == "rule":
        facts = [list(t.answer_facts) for t in task.turns]
        apply_summary(ep, episode_summary_reward(ep.answers, facts, seen_context(task, ep.calls), ep.n_turns, summary_max_chars))
    return r


def _score_by_function(ep: Any, task: Task, name: str, given: tuple[float, float] | None) -> None:
    outcome, process = given if given is not None else run_reward(name, ep, task)
    r = ep.rewards
    r["outcome"], r["progress"], r["process"] = outcome, process, process
    fmt = ep.n_valid_calls / ep.n_call_blocks if ep.n_call_blocks else 1.0  # no calls, no malformed ones
    r.update({f"process/{k}": (fmt if k == "format" else process) for k in COMPONENTS})
    r["omission"] = 0.0


def _score_by_checks(ep: Any, task: Task, weights: HierRWeights) -> None:
    r = ep.rewards
    r["outcome"] = outcome_reward(ep.turn_passed, ep.n_turns)
    r["progress"] = progress_reward(ep.turn_passed, ep.n_turns)
    pred, gold = predicted_turns(ep.calls), gold_turns(task)
    comps = process_components(pred, gold, ep.n_call_blocks, ep.n_valid_calls)
    r["process"] = process_reward(comps, weights)
    r.update({f"process/{k}": float(v) for k, v in comps.items()})
    # Omission = answering a turn that needed a call without making one; a turn cut off before its
    # answer (e.g. mid-call) is not an omission. Answered turns are a prefix of the turns reached.
    answered = sum(1 for a in ep.answers if a is not None)
    r["omission"] = float(is_omission(pred[:answered], gold[:answered]))


def apply_summary(ep: Any, score: float) -> None:
    """Set R_sum; an omitting episode gets the omission penalty instead (SLCA-GRPO, docs/design.md §3)."""
    ep.rewards["summary_score"] = float(score)
    ep.rewards["summary"] = OMISSION_REWARD if ep.rewards.get("omission") else float(score)


def step_rewards(turn_passed: list[bool], n_turns: int, step_turns: list[int], kind: str) -> list[float]:
    """Per-step rewards whose sum is the episode reward: for ``progress`` 1/n_turns at the last
    step of each passed turn; for ``outcome`` 1 at the last step when every turn passed."""
    out = [0.0] * len(step_turns)
    if not step_turns:
        return out
    if kind == "outcome":
        out[-1] = outcome_reward(turn_passed, n_turns)
        return out
    if kind != "progress":
        raise ValueError(f"unknown reward kind {kind!r}; expected progress or outcome")
    last_step_of = {u: k for k, u in enumerate(step_turns)}
    for u, passed in enumerate(turn_passed):
        if passed and u in last_step_of:
            out[last_step_of[u]] += 1.0 / n_turns
    return out
