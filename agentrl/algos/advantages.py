"""Group-relative advantage estimators (docs/design.md §4) as pure torch functions.

A *group* is the G episodes of one task rolled out from the same initial state; the group's own
rewards are the baseline, so no critic is needed. The group-level functions take the 1-D reward
tensor of ONE group and return one advantage per episode; ``grouped`` applies them to a flat batch
of several groups; ``broadcast_to_tokens`` spreads episode advantages over policy tokens.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

AdvantageFn = Callable[[Tensor], Tensor]


def grpo(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """GRPO: A_i = (r_i - mean(r)) / (std(r) + eps).

    ``std`` is the unbiased (Bessel-corrected, G-1) sample std, as in DeepSeekMath/TRL/verl.
    A group of one has no baseline: its advantage is 0. A group with equal rewards gets 0 too
    (numerator is 0), which is what filters out uninformative groups.
    """
    r = rewards.to(torch.float32) if not rewards.is_floating_point() else rewards
    if r.numel() < 2:
        return torch.zeros_like(r)
    return (r - r.mean()) / (r.std(unbiased=True) + eps)


def dr_grpo(rewards: Tensor) -> Tensor:
    """Dr.GRPO ("GRPO done right", Liu et al. 2025): A_i = r_i - mean(r).

    Drops the std division, which up-weights near-deterministic groups and biases toward easy and
    very hard questions. (Dr.GRPO also drops per-sequence length normalization; our loss is
    already token-level over a global token count, see ``losses.ppo_clip_loss``.)
    """
    r = rewards.to(torch.float32) if not rewards.is_floating_point() else rewards
    if r.numel() < 2:
        return torch.zeros_like(r)
    return r - r.mean()


def rloo(rewards: Tensor) -> Tensor:
    """RLOO (REINFORCE leave-one-out): A_i = r_i - (sum_j r_j - r_i) / (G - 1).

    Each episode's baseline is the mean of the OTHER G-1 rewards, so the baseline is independent
    of the episode and the estimator is unbiased. Equals G/(G-1) * (r_i - mean(r)). G=1 -> 0.
    """
    r = rewards.to(torch.float32) if not rewards.is_floating_point() else rewards
    g = r.numel()
    if g < 2:
        return torch.zeros_like(r)
    return r - (r.sum() - r) / (g - 1)


def raft(rewards: Tensor) -> Tensor:
    """RAFT / rejection-sampling fine-tuning (Dong et al. 2023; RAFT++, Xiong et al. 2025):
    A_i = 1 if r_i = max_g r and max_g r > 0, else 0.

    Only the group's best episodes are reinforced (imitated); the others get no gradient, so
    nothing is pushed down. Xiong et al. find it learns faster than GRPO early in training and
    lowers entropy faster later (no negative samples to keep exploring).
    """
    r = rewards.to(torch.float32) if not rewards.is_floating_point() else rewards
    if r.numel() == 0:
        return r.clone()
    best = r.max()
    return ((r == best) & (best > 0)).to(r.dtype)


ADVANTAGES: dict[str, AdvantageFn] = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo, "raft": raft}


def get_advantage(name: str) -> AdvantageFn:
    """Look up an estimator by config name; KeyError names the known ones."""
    try:
        return ADVANTAGES[name]
    except KeyError:
        raise KeyError(f"unknown advantage estimator {name!r}; known: {sorted(ADVANTAGES)}") from None


def grouped(fn: AdvantageFn, rewards: Tensor, group_ids: Tensor, **kwargs) -> Tensor:
    """Apply a group-level estimator to a flat batch: out[i] = fn(rewards[group == g_i])[pos of i].

    ``rewards`` and ``group_ids`` are 1-D of length N; episodes of a group need not be contiguous.
    The order within a group is preserved, so position-dependent estimators stay correct.
    """
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError("rewards and group_ids must be 1-D of equal length, "
                         f"got {tuple(rewards.shape)} and {tuple(group_ids.shape)}")
    r = rewards.to(torch.float32) if not rewards.is_floating_point() else rewards
    out = torch.zeros_like(r)
    for g in torch.unique(group_ids):
        idx = (group_ids == g).nonzero(as_tuple=True)[0]
        out[idx] = fn(r[idx], **kwargs).to(out.dtype)
    return out


def broadcast_to_tokens(adv: Tensor, mask: Tensor) -> Tensor:
    """Token advantages [B, T]: A[b, t] = adv[b] * mask[b, t] (0 on non-policy tokens)."""
    if adv.dim() != 1 or mask.dim() != 2 or adv.shape[0] != mask.shape[0]:
        raise ValueError(f"expected adv [B] and mask [B, T], got {tuple(adv.shape)} and {tuple(mask.shape)}")
    return adv.unsqueeze(1) * mask.to(adv.dtype)
