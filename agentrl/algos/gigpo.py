"""GiGPO: Group-in-Group Policy Optimization (Feng et al. 2025) as pure torch functions (docs/design.md §4).

Two nested baselines for multi-step agents, both critic-free:

* episode level: GRPO over the G episodes' final rewards (the outer group);
* step level: steps of the group (across ALL its episodes) that start from the same environment
  state form an "anchor-state" group; their discounted returns are z-scored within it, which
  credits the action taken at that state relative to the other actions tried there.

A[i, k] = A_ep[i] + omega * A_step[i, k]. A state visited once has no baseline: A_step = 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.algos.advantages import grpo

# Defaults from the GiGPO paper (omega = 1, gamma = 0.95); see docs/design.md §4.
DEFAULT_OMEGA = 1.0
DEFAULT_GAMMA = 0.95


def _as_float(x: Tensor) -> Tensor:
    return x if x.is_floating_point() else x.to(torch.float32)


def discounted_returns(step_rewards: Tensor, gamma: float) -> Tensor:
    """R_k = sum_{j >= k} gamma^(j - k) * r_j over the steps of one episode ([S] -> [S])."""
    if step_rewards.dim() != 1:
        raise ValueError(f"step_rewards must be 1-D [S], got shape {tuple(step_rewards.shape)}")
    r = _as_float(step_rewards)
    out = torch.zeros_like(r)
    running = torch.zeros((), dtype=r.dtype, device=r.device)
    # Backward recursion R_k = r_k + gamma * R_{k+1}: O(S), no gamma^S underflow issues.
    for k in range(r.numel() - 1, -1, -1):
        running = r[k] + gamma * running
        out[k] = running
    return out


def step_group_advantages(returns: Tensor, state_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """A_k = (R_k - mean(R_s)) / (std(R_s) + eps) with s = state_ids[k] the anchor-state group.

    Both inputs are 1-D over all steps of ONE episode group, flattened across episodes. ``std`` is
    unbiased, as in ``advantages.grpo``; groups of one step get 0 (``grpo`` handles that).
    """
    if returns.dim() != 1 or returns.shape != state_ids.shape:
        raise ValueError(
            f"returns and state_ids must be 1-D of equal length, got {tuple(returns.shape)} and {tuple(state_ids.shape)}"
        )
    r = _as_float(returns)
    out = torch.zeros_like(r)
    if r.numel() == 0:
        return out
    _, inverse, counts = torch.unique(state_ids, return_inverse=True, return_counts=True)
    for s in (counts >= 2).nonzero(as_tuple=True)[0]:
        idx = (inverse == s).nonzero(as_tuple=True)[0]
        out[idx] = grpo(r[idx], eps).to(out.dtype)
    return out


def gigpo(
    episode_rewards: Tensor,
    step_rewards: list[Tensor],
    step_state_ids: list[Tensor],
    omega: float = DEFAULT_OMEGA,
    gamma: float = DEFAULT_GAMMA,
    eps: float = 1e-6,
) -> list[Tensor]:
    """Per-step advantages of ONE group of G episodes: out[i][k] = A_ep[i] + omega * A_step[i, k].

    A_ep = grpo(episode_rewards); A_step = ``step_group_advantages`` of the discounted returns
    (``discounted_returns(step_rewards[i], gamma)``) grouped by ``step_state_ids``. Episode i has
    S_i >= 0 steps; step_rewards[i] and step_state_ids[i] are 1-D [S_i]. State ids must be
    comparable across the episodes of the group (e.g. a hash of the observation history).
    """
    if episode_rewards.dim() != 1:
        raise ValueError(f"episode_rewards must be 1-D [G], got shape {tuple(episode_rewards.shape)}")
    g = episode_rewards.shape[0]
    if len(step_rewards) != g or len(step_state_ids) != g:
        raise ValueError(
            f"need one step_rewards and step_state_ids tensor per episode: G={g}, "
            f"got {len(step_rewards)} and {len(step_state_ids)}"
        )
    for i, (r, s) in enumerate(zip(step_rewards, step_state_ids)):
        if r.dim() != 1 or r.shape != s.shape:
            raise ValueError(
                f"episode {i}: step_rewards and step_state_ids must be 1-D of equal length, "
                f"got {tuple(r.shape)} and {tuple(s.shape)}"
            )
    a_ep = grpo(episode_rewards, eps)
    lengths = [r.numel() for r in step_rewards]
    if sum(lengths) == 0:
        return [torch.zeros(0, dtype=a_ep.dtype, device=a_ep.device) for _ in range(g)]
    returns = torch.cat([discounted_returns(r, gamma).to(a_ep.dtype) for r in step_rewards])
    ids = torch.cat([s.to(step_state_ids[0].device) for s in step_state_ids])
    a_step = step_group_advantages(returns, ids, eps)
    return [a_ep[i] + omega * part for i, part in enumerate(torch.split(a_step, lengths))]


def steps_to_tokens(step_adv: Tensor, step_spans: list[tuple[int, int]], length: int) -> Tensor:
    """Token advantages [length]: step_adv[k] on tokens [start_k, end_k), 0 elsewhere.

    Spans are the policy-token ranges of each step (a step's action); tokens outside every span
    (prompt, environment observations, padding) get 0 so the loss mask need not be trusted here.
    """
    if step_adv.dim() != 1 or step_adv.shape[0] != len(step_spans):
        raise ValueError(f"need one span per step advantage, got {tuple(step_adv.shape)} and {len(step_spans)} spans")
    out = torch.zeros(length, dtype=_as_float(step_adv).dtype, device=step_adv.device)
    for k, (start, end) in enumerate(step_spans):
        if not 0 <= start <= end <= length:
            raise ValueError(f"span {k} = [{start}, {end}) is not inside [0, {length})")
        out[start:end] = step_adv[k]
    return out
