"""PPO with a learned critic (docs/design.md §4): GAE, clipped value loss, whitening; pure torch functions.

Token tensors are [B, T]. ``mask`` marks policy tokens (the ones the model generated); in agent
episodes environment observations are spliced in between them (mask 0). Those tokens are not
actions: the MDP's time steps are the policy tokens only, so GAE skips them and bootstraps from
the value at the next POLICY token of the row.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.algos.losses import aggregate_tokens


def _check_same(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1 or next(iter(tensors.values())).dim() != 2:
        raise ValueError(f"expected [B, T] tensors of one shape, got {shapes}")


@torch.no_grad()
def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 0.95) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over the policy tokens of each row: (advantages, returns).

    For policy positions t < t' consecutive in the row (t' = next position with mask 1):
        delta_t = r_t + gamma * V_t' - V_t          (V_t' = 0 after the last policy token)
        A_t     = delta_t + gamma * lam * A_t'      (A_t' = 0 after the last policy token)
        R_t     = A_t + V_t
    Rewards and values at mask-0 positions are ignored, so put the reward on a policy token (the
    last one, usually). Outputs are float32-or-wider, 0 off-mask, and carry no gradient.
    """
    _check_same(rewards=rewards, values=values, mask=mask)
    dtype = torch.promote_types(torch.promote_types(rewards.dtype, values.dtype), torch.float32)
    r, v, m = rewards.to(dtype), values.to(dtype), mask.bool()
    adv = torch.zeros_like(r)
    next_v = torch.zeros(r.shape[0], dtype=dtype, device=r.device)
    next_a = torch.zeros_like(next_v)
    # Backward over T, vectorized over B; at env tokens the carried (next_v, next_a) pass through.
    for t in range(r.shape[1] - 1, -1, -1):
        mt = m[:, t]
        a_t = r[:, t] + gamma * next_v - v[:, t] + gamma * lam * next_a
        adv[:, t] = torch.where(mt, a_t, torch.zeros_like(a_t))
        next_v = torch.where(mt, v[:, t], next_v)
        next_a = torch.where(mt, a_t, next_a)
    returns = torch.where(m, adv + v, torch.zeros_like(adv))
    return adv, returns


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = 0.2,
    n_tokens_global: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss (PPO2 / OpenAI baselines), token-level over the global token count.

    V_clip = V_old + clamp(V - V_old, -clip, clip)
    l_t    = 0.5 * max((V_t - R_t)^2, (V_clip_t - R_t)^2)    (clip=None: 0.5 * (V_t - R_t)^2)
    loss   = sum_t mask_t * l_t / n_tokens_global            (see ``losses.aggregate_tokens``)

    Stats (detached, over this call's masked tokens): ``vf_clip_frac`` (tokens where the clipped
    term is the larger one), ``value_mean``, ``explained_var`` = 1 - Var(R - V) / Var(R).
    """
    _check_same(values=values, old_values=old_values, returns=returns, mask=mask)
    m = mask.bool()
    returns, old_values = returns.detach(), old_values.detach()
    loss_unclipped = (values - returns) ** 2
    if clip is None:
        loss_tok = 0.5 * loss_unclipped
        clipped = torch.zeros_like(m)
    else:
        v_clip = old_values + (values - old_values).clamp(-clip, clip)
        loss_clipped = (v_clip - returns) ** 2
        loss_tok = 0.5 * torch.maximum(loss_unclipped, loss_clipped)
        clipped = loss_clipped > loss_unclipped
    loss = aggregate_tokens(loss_tok, m, n_tokens_global)

    with torch.no_grad():
        v, ret = values.detach().float(), returns.float()
        n = m.sum().clamp(min=1)
        mean = lambda x: aggregate_tokens(x, m, n)  # noqa: E731
        var_r = mean((ret - mean(ret)) ** 2)
        resid = ret - v
        var_resid = mean((resid - mean(resid)) ** 2)
        # Undefined for constant returns: report 0 (no variance explained) rather than NaN.
        ev = torch.where(var_r > 0, 1.0 - var_resid / var_r.clamp(min=1e-12), torch.zeros_like(var_r))
        stats = {"vf_clip_frac": mean(clipped.float()), "value_mean": mean(v), "explained_var": ev}
    return loss, stats


def whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mean_m(x)) / sqrt(var_m(x) + eps) over masked positions; 0 off-mask.

    Population (biased) variance, so the masked output has exactly mean 0 and variance ~1; used
    on PPO advantages over the whole batch (not per group, unlike GRPO).
    """
    if x.shape != mask.shape:
        raise ValueError(f"x and mask must have equal shapes, got {tuple(x.shape)} and {tuple(mask.shape)}")
    m = mask.bool()
    xf = x if x.is_floating_point() else x.to(torch.float32)
    zero = torch.zeros_like(xf)
    n = m.sum().clamp(min=1)
    mean = torch.where(m, xf, zero).sum() / n
    var = torch.where(m, (xf - mean) ** 2, zero).sum() / n
    return torch.where(m, (xf - mean) * torch.rsqrt(var + eps), zero)
