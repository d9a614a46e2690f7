"""RSPO on the data: mixed groups, the reward swap, and the explorer's process-reward batch.

RSPO (a reconstruction from the method's abstract; docs/design.md §4, "RSPO") trains the policy A
on the outcome reward only and uses a dense process reward solely to decide which trajectories
get sampled: an explorer B, derived from A by a few optimizer steps on the process reward,
contributes G_B of each task's G episodes. This module holds what happens to the episodes:

* ``merge_mixed_groups``: A's part and B's part of a task's group (same ``mix_key``) become one
  group, so the base estimator's baseline covers the union (same task, same initial state);
* ``swap_rewards``: before A's update, every episode's ``process`` key (the key RSPO's process
  reward lives under) is overwritten by ``algo.reward`` — so no estimator, not even one that reads
  the process score (SLCA's R_tool), sees the process reward; with ``rspo.swap=false`` the
  ablation writes the process reward into ``algo.reward`` instead;
* ``explorer_batch``: the episodes A produced this step with GRPO advantages of the process
  reward within each group,

      A^B_i = (p_i - mean_A(p)) / (std_A(p) + eps)   over the group's A episodes,

  on every policy token; the explorer's derivation steps train on it. Torch is imported inside.

The importance correction of B's tokens in A's update (w_t = min(pi_A / pi_B, rspo.is_cap)) is a
per-row cap of ``losses.policy_loss`` (``foreign_rows``; the cap is the explorer part's ``foreign_is_cap``).
"""

from __future__ import annotations

from dataclasses import replace

from agentrl.api import POLICY, EpisodeGroup, TrainBatch

# the explorer's rollout role: Episode.policy / EpisodeGroup.policy of its episodes, the plan's role
# name, the learner part's role
EXPLORER = "explorer"


def merge_mixed_groups(groups: list[EpisodeGroup]) -> list[EpisodeGroup]:
    """Groups with the same non-empty ``mix_key`` merged into one (policy episodes first), in
    order of first appearance; others unchanged. The merged group keeps the policy part's id and
    version (the explorer was derived from that version)."""
    order: list[str] = []
    parts: dict[str, list[EpisodeGroup]] = {}
    for i, g in enumerate(groups):
        key = g.mix_key or f"#{i}"
        if key not in parts:
            order.append(key)
            parts[key] = []
        parts[key].append(g)
    merged = []
    for key in order:
        ps = sorted(parts[key], key=lambda g: g.policy != POLICY)  # the policy's part first
        if len(ps) == 1:
            merged.append(ps[0])
            continue
        if len({g.task_id for g in ps}) != 1:
            raise ValueError(f"groups with mix_key {key!r} are of different tasks: {sorted({g.task_id for g in ps})}")
        head = ps[0]
        merged.append(replace(head, episodes=[e for g in ps for e in g.episodes],
                              wall_seconds=max(g.wall_seconds for g in ps)))
    return merged


def swap_rewards(groups: list[EpisodeGroup], dst: str, src: str) -> list[EpisodeGroup]:
    """New groups in which every episode's ``rewards[dst]`` is its ``rewards[src]``."""
    return [replace(g, episodes=[replace(e, rewards={**e.rewards, dst: e.rewards[src]}) for e in g.episodes])
            for g in groups]


def policy_rewards(groups: list[EpisodeGroup], outcome: str, process: str, swap: bool) -> list[EpisodeGroup]:
    """The rewards the policy's update reads. ``swap`` (RSPO): every process-side key
    (``"process"``, the score SLCA's tool segments read, and ``process``, the explorer's reward)
    holds the ``outcome`` reward (``algo.reward``), so the process reward cannot reach the
    policy's gradient; not ``swap`` (the ablation): ``outcome`` holds the process reward."""
    if not swap:
        return swap_rewards(groups, outcome, process)
    for key in sorted({"process", process} - {outcome}):
        groups = swap_rewards(groups, key, outcome)
    return groups


def explorer_batch(groups: list[EpisodeGroup], process_key: str, eps: float = 1e-6) -> TrainBatch | None:
    """A's episodes of (merged) groups with GRPO advantages of ``rewards[process_key]`` within
    each group, broadcast on policy tokens; None when no group has two A episodes."""
    import torch

    from agentrl.algos.advantages import grpo

    ids, masks, logprobs, advantages = [], [], [], []
    for g in groups:
        eps_a = [e for e in g.episodes if e.policy != EXPLORER]
        if len(eps_a) < 2:
            continue
        adv = grpo(torch.tensor([e.rewards[process_key] for e in eps_a], dtype=torch.float32), eps)
        for e, a in zip(eps_a, adv.tolist()):
            ids.append(e.token_ids)
            masks.append(e.response_mask)
            logprobs.append(e.logprobs)
            advantages.append([a * m for m in e.response_mask])
    if not ids:
        return None
    return TrainBatch(input_ids=ids, response_mask=masks, advantages=advantages, rollout_logprobs=logprobs)


def success_shares(groups: list[EpisodeGroup], outcome_key: str = "outcome") -> dict[str, float]:
    """Per policy: mean outcome and mean process score, and the share of all successes that came
    from the explorer (``rspo/*`` metrics; means over the given groups' episodes)."""
    out: dict[str, float] = {}
    eps = [e for g in groups for e in g.episodes]
    for who in (POLICY, EXPLORER):
        mine = [e for e in eps if e.policy == who]
        if mine:
            out[f"rspo/{who}_success"] = sum(e.rewards[outcome_key] for e in mine) / len(mine)
            out[f"rspo/{who}_process"] = sum(e.rewards.get("process", 0.0) for e in mine) / len(mine)
    wins = sum(e.rewards[outcome_key] for e in eps)
    out["rspo/explorer_success_share"] = (sum(e.rewards[outcome_key] for e in eps if e.policy == EXPLORER) / wins
                                          if wins > 0 else 0.0)
    return out
