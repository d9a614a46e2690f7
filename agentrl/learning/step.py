"""A step's groups -> the policy's batch, through the run's methods (no Ray: tested on its own).

The learner actor (``learning/learner.py``) calls ``prepare_step`` on the groups it fetched, in
this order, which a method's hooks rely on (``agentrl/methods/base.py``):

1. each method's ``regroup`` (e.g. the parts of a task's group sampled by different policies
   become one group);
2. the reward-shuffle control (``algo.shuffle_rewards``): rewards permuted across the episodes;
3. each method's ``trained_groups`` (e.g. the policy reads the outcome reward only);
4. ``build_batch`` with the configured estimator, KL in the reward when configured.

``StepInput.groups`` are the groups after 2 (what ``Method.after_update`` reads); the batch is
built from those after 3.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentrl.algos.batching import build_batch, shuffle_episode_rewards
from agentrl.api import EpisodeGroup, TrainBatch
from agentrl.methods.base import Method


@dataclass
class StepInput:
    batch: TrainBatch  # what the policy's update trains on
    groups: list[EpisodeGroup]  # the regrouped (and shuffled) groups, before trained_groups
    metrics: dict[str, float]  # build_batch's statistics and the methods' regroup metrics


def prepare_step(groups: list[EpisodeGroup], methods: Sequence[Method], algo_cfg, *, seed: int, version: int,
                 rollout_kl: Callable[[list[EpisodeGroup]], list[list[float]]] | None = None) -> StepInput:
    """The policy's batch of one step (see the module docstring). ``version``: the policy version
    before the update (it seeds the shuffle, so a run is reproducible); ``rollout_kl``: per-token
    KL of the sampled tokens against the reference, one list per episode, for KL in the reward."""
    metrics: dict[str, float] = {}
    for m in methods:
        groups, extra = m.regroup(groups)
        metrics.update(extra)
    if algo_cfg.shuffle_rewards:  # the control arm: same episodes, rewards detached from them
        groups = shuffle_episode_rewards(groups, random.Random(seed * 1_000_003 + version))
    trained = groups
    for m in methods:
        trained = m.trained_groups(trained)
    use_kl = rollout_kl is not None and algo_cfg.kl_in == "reward" and algo_cfg.kl_coef > 0
    batch, stats = build_batch(trained, algo_cfg, kl_per_token=rollout_kl(trained) if use_kl else None)
    return StepInput(batch, groups, {**stats, **metrics})


__all__ = ["StepInput", "prepare_step"]
