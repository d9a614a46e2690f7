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


def discounted_reverse_cumsum(x: Tensor, factor: float, chunk: int = 64) -> Tensor:
    """y_t = sum_{k >= t} factor^(k - t) * x_k along dim 1 of a [B, T] tensor.

    A reverse scan done chunk by chunk: inside a chunk of C positions one [C, C] triangular matrix
    product, across chunks the carried y at the chunk's end (y_t += factor^(end - t) * y_end).
    T / C Python steps instead of T, and [C, C] memory however long the rows are.
    """
    out = torch.empty_like(x)
    carry = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    size = min(chunk, x.shape[1])
    i = torch.arange(size, device=x.device)
    lag = i[None, :] - i[:, None]  # [t, k] -> k - t
    base = torch.tensor(factor, dtype=x.dtype, device=x.device)
    weights = torch.where(lag >= 0, base ** lag.clamp(min=0), 0.0)  # one chunk's matrix; a shorter chunk uses its corner
    reach = base ** (size - i).to(x.dtype)  # factor^(chunk end - t)
    for end in range(x.shape[1], 0, -size):
        start = max(0, end - size)
        n = end - start
        seg = x[:, start:end] @ weights[:n, :n].T + carry[:, None] * reach[size - n:][None, :]
        out[:, start:end] = seg
        carry = seg[:, 0]
    return out


@torch.no_grad()
def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 0.95) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over the policy tokens of each row: (advantages, returns).

    For policy positions t < t' consecutive in the row (t' = next position with mask 1):
        delta_t = r_t + gamma * V_t' - V_t          (V_t' = 0 after the last policy token)
        A_t     = delta_t + gamma * lam * A_t'      (A_t' = 0 after the last policy token)
                = sum_{j >= 0} (gamma * lam)^j * delta_{t_j}   (t_0 = t, t_{j+1} = t_j')
        R_t     = A_t + V_t
    Rewards and values at mask-0 positions are ignored, so put the reward on a policy token (the
    last one, usually). Outputs are float32-or-wider, 0 off-mask, and carry no gradient.

    Vectorized: each row's policy tokens are packed to the front in order, the deltas are
    computed on the packed rows, A is a discounted reverse cumsum of them
    (``discounted_reverse_cumsum``), and the result is scattered back to the original positions.
    """
    _check_same(rewards=rewards, values=values, mask=mask)
    dtype = torch.promote_types(torch.promote_types(rewards.dtype, values.dtype), torch.float32)
    r, v, m = rewards.to(dtype), values.to(dtype), mask.bool()
    # where each position goes when a row's policy tokens are packed to the front in order (and
    # its other tokens behind them): a permutation, so scatter packs and gather unpacks
    cs = m.long().cumsum(dim=1)
    n = cs[:, -1:]
    pos = torch.arange(r.shape[1], device=r.device)[None, :]
    dest = torch.where(m, cs - 1, n + pos - cs)
    live = pos < n
    r_p = torch.zeros_like(r).scatter_(1, dest, r) * live
    v_p = torch.zeros_like(v).scatter_(1, dest, v) * live
    v_next = torch.cat([v_p[:, 1:], torch.zeros_like(v_p[:, :1])], dim=1) * (pos + 1 < n)
    adv_p = discounted_reverse_cumsum(r_p + gamma * v_next - v_p, gamma * lam)
    adv = torch.where(m, adv_p.gather(1, dest), torch.zeros_like(r))
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
