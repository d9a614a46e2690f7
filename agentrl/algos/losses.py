"""Policy-loss terms (docs/design.md §4) as pure torch functions over [B, T] token tensors.

Aggregation is token-level over a GLOBAL token count: ``loss = sum(loss_tok * mask) / N`` with N
the number of policy tokens in the whole optimizer step (all micro-batches, all ranks). Summing
the losses of micro-batches then gives exactly the full-batch loss, so gradient accumulation and
data parallelism do not change the objective (a per-micro-batch mean would weight tokens of short
micro-batches more).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

# exp() of a log-ratio beyond this is treated as this (keeps ratios finite; gradient is cut there).
_LOG_RATIO_CLAMP = 20.0


def aggregate_tokens(values: Tensor, mask: Tensor, n_tokens_global: float | Tensor | None = None) -> Tensor:
    """sum(values over mask) / n_tokens_global (default: mask.sum(), at least 1).

    Masked-out positions are excluded with ``where`` (not multiplied), so NaN/inf there cannot
    leak into the loss or its gradient."""
    m = mask.bool()
    total = torch.where(m, values, torch.zeros_like(values)).sum()
    n = m.sum().clamp(min=1) if n_tokens_global is None else n_tokens_global
    return total / n


def sequence_mean_weights(mask: Tensor, n_sequences: int, n_tokens_global: float) -> Tensor:
    """Per-token weights that turn the global token mean into a mean of per-sequence means.

    w_it = n_tokens_global / (n_sequences * L_i), with L_i = mask[i].sum(), so that
    sum_it mask_it * w_it * l_it / n_tokens_global = (1 / n_sequences) * sum_i (1 / L_i) sum_t l_it
    ("seq-mean-token-mean"). ``n_sequences`` counts the sequences with policy tokens in the
    whole optimizer step (all micro-batches), like ``n_tokens_global``. Rows without policy
    tokens get weight 0.
    """
    lengths = mask.bool().sum(dim=1, keepdim=True).to(torch.float32)
    w = float(n_tokens_global) / (n_sequences * lengths.clamp(min=1.0))
    return torch.where(lengths > 0, w, torch.zeros_like(w)).expand(mask.shape)


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    return aggregate_tokens(values.detach().float(), mask, None)


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    is_weights: Tensor | None = None,
    n_tokens_global: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level PPO-clip with asymmetric clip range (DAPO "clip-higher").

    ratio_t = exp(logprobs_t - old_logprobs_t)
    l_t     = -min(ratio_t * A_t, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A_t)
    dual clip (Ye et al. 2020, c = dual_clip > 1): for A_t < 0, l_t = min(l_t, -c * A_t), bounding
              the loss when a very unlikely-under-old token became likely
    l_t    *= w_t  with w_t = is_weights (truncated IS weights, treated as constants)
    loss    = sum_t mask_t * l_t / n_tokens_global

    ``advantages`` is [B, T] or [B] (broadcast over tokens). Stats (detached, means over this
    call's masked tokens): ``clip_frac`` (tokens where the clipped branch is active),
    ``dual_clip_frac``, ``approx_kl`` (k3 estimate of KL(pi_old || pi)), ``ratio_mean``,
    ``n_tokens``.
    """
    m = mask.bool()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand_as(logprobs)
    advantages = advantages.detach()
    # Zero the log-ratio off-mask before exp: padding logprobs may be garbage.
    log_ratio = torch.where(m, logprobs - old_logprobs.detach(), torch.zeros_like(logprobs))
    log_ratio = log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    loss_tok = -torch.minimum(surr1, surr2)
    dual_active = torch.zeros_like(m)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bound = -dual_clip * advantages
        dual_active = (advantages < 0) & (loss_tok > bound)
        loss_tok = torch.where(dual_active, bound, loss_tok)
    if is_weights is not None:
        w = torch.where(m, is_weights.detach(), torch.zeros_like(is_weights))
        loss_tok = loss_tok * w
    loss = aggregate_tokens(loss_tok, m, n_tokens_global)

    with torch.no_grad():
        clipped = ((ratio < 1.0 - clip_low) & (advantages < 0)) | ((ratio > 1.0 + clip_high) & (advantages > 0))
        stats = {
            "clip_frac": _masked_mean(clipped.float(), m),
            "dual_clip_frac": _masked_mean(dual_active.float(), m),
            "approx_kl": _masked_mean(ratio - 1.0 - log_ratio, m),
            "ratio_mean": _masked_mean(ratio, m),
            "n_tokens": m.sum().float(),
        }
    return loss, stats


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL(pi || pi_ref) estimate from samples of pi (Schulman's estimators).

    k1 = lp - ref                       (unbiased, high variance, can be negative)
    k2 = 0.5 * (lp - ref)^2
    k3 = exp(ref - lp) - (ref - lp) - 1 (unbiased, >= 0, low variance; GRPO's choice)

    Aggregate with ``aggregate_tokens`` and the same n_tokens_global as the policy loss.
    """
    ref_logprobs = ref_logprobs.detach()
    if kind == "k1":
        return logprobs - ref_logprobs
    if kind == "k2":
        return 0.5 * (logprobs - ref_logprobs) ** 2
    if kind in ("k3", "low_var_kl"):
        d = (ref_logprobs - logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        return torch.exp(d) - d - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}; known: k1, k2, k3")


def truncated_is_weights(old_logprobs: Tensor, rollout_logprobs: Tensor, cap: float | Tensor) -> Tensor:
    """w_t = min(pi_old / pi_rollout, cap) = min(exp(old - rollout), cap), detached.

    Corrects for the gap between the inference engine's sampling distribution (vLLM kernels,
    possibly a stale policy version, or another policy a method samples with) and the learner's
    pi_old; the cap bounds the variance (truncated IS, as in TIS / IMPALA). ``cap`` may be a tensor
    broadcast against the logprobs (a cap per row: ``foreign_caps``)."""
    with torch.no_grad():
        w = torch.exp((old_logprobs - rollout_logprobs).clamp(max=_LOG_RATIO_CLAMP))
        return torch.minimum(w, torch.as_tensor(cap, dtype=w.dtype, device=w.device))


def foreign_caps(foreign_rows: Tensor, tis_cap: float, foreign_is_cap: float) -> Tensor:
    """[B, 1] IS caps: ``foreign_is_cap`` on rows another policy B sampled (w_t = min(pi_A / pi_B,
    C_B)), ``tis_cap`` on the policy's own rows."""
    rows = foreign_rows.bool().unsqueeze(1)
    return torch.where(rows, torch.tensor(foreign_is_cap), torch.tensor(tis_cap)).to(torch.float32)


def is_weight_sums(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, cap: float) -> dict[str, float]:
    """Over ``mask``: the sum of truncated IS weights min(exp(old - rollout), cap), how many were
    truncated, and the token count (summed over micro-batches for means over another policy's tokens)."""
    with torch.no_grad():
        m = mask.bool()
        raw = torch.exp((old_logprobs - rollout_logprobs).clamp(max=_LOG_RATIO_CLAMP))
        return {"weight_sum": float(raw.clamp(max=cap)[m].sum()), "clipped": float((raw > cap)[m].sum()),
                "tokens": float(m.sum())}


def rollout_stats(
    old_logprobs: Tensor,
    mask: Tensor,
    *,
    rollout_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    tis_cap: float = 2.0,
    n_tokens_global: float | Tensor | None = None,
) -> dict[str, Tensor]:
    """Diagnostics of the learner's scores against the sampler's, aggregated like a loss term
    (``aggregate_tokens``: sum over ``mask`` / ``n_tokens_global``, default the mean over ``mask``).

    ``is_weight_mean`` (of ``truncated_is_weights(old, rollout, tis_cap)``) and
    ``logprob_mismatch`` (of |old - rollout|) when ``rollout_logprobs`` is given, ``entropy`` when
    ``entropy`` is given. Detached."""
    out: dict[str, Tensor] = {}
    with torch.no_grad():
        if entropy is not None:
            out["entropy"] = aggregate_tokens(entropy.detach(), mask, n_tokens_global)
        if rollout_logprobs is not None:
            is_w = truncated_is_weights(old_logprobs, rollout_logprobs, tis_cap)
            out["is_weight_mean"] = aggregate_tokens(is_w, mask, n_tokens_global)
            out["logprob_mismatch"] = aggregate_tokens((old_logprobs - rollout_logprobs).abs(), mask, n_tokens_global)
    return out


LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean")


@dataclass(frozen=True)
class PolicyLossConfig:
    """The settings of ``policy_loss``; names and defaults as in ``AlgoConfig`` (``algo.*``)."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    tis_cap: float = 2.0
    kl_coef: float = 0.001
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    loss_agg: str = "token_mean"
    foreign_is_cap: float | None = None  # the cap of rows another policy sampled (a method's learner part sets it)

    def __post_init__(self) -> None:
        if self.loss_agg not in LOSS_AGGREGATIONS:
            raise ValueError(f"unknown loss_agg {self.loss_agg!r}; known: {', '.join(LOSS_AGGREGATIONS)}")

    @classmethod
    def from_algo(cls, algo_cfg: Any) -> PolicyLossConfig:
        """The same-named attributes of an ``AlgoConfig`` (or any object carrying them)."""
        return cls(**{f.name: getattr(algo_cfg, f.name) for f in fields(cls) if hasattr(algo_cfg, f.name)})


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: PolicyLossConfig = PolicyLossConfig(),
    *,
    rollout_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    n_tokens_global: float | Tensor | None = None,
    n_sequences_global: int | None = None,
    foreign_rows: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The learner's whole policy loss for one micro-batch (docs/design.md §4, "The policy loss").

    All [B, T]; ``logprobs`` (and ``entropy``, if the bonus is on) carry the gradient, every other
    input is treated as a constant. With N = ``n_tokens_global`` (policy tokens of the optimizer
    step; default: of this call) and m_t = ``mask``:

        rho_t = exp(logprobs_t - old_logprobs_t)
        l_t   = -min(rho_t A_t, clip(rho_t, 1 - clip_low, 1 + clip_high) A_t)
                dual clip (cfg.dual_clip = c > 1): for A_t < 0, l_t = min(l_t, -c A_t)
        w_t   = min(exp(old_logprobs_t - rollout_logprobs_t), C)   (1 without rollout_logprobs)
                C = tis_cap; on ``foreign_rows`` (sampled by another policy B) C = cfg.foreign_is_cap,
                so w_t = min(pi_A / pi_B, C)
        L     = sum_t m_t g_t w_t l_t / N                                   ("pg_loss", ``ppo_clip_loss``)
              + kl_coef * sum_t m_t g_t KL_t / N                            ("kl", only with ref_logprobs)
              - entropy_coef * sum_t m_t g_t H_t / N                        ("entropy_bonus", only if entropy_coef > 0)

    KL_t = ``kl_penalty(logprobs, ref_logprobs, kl_estimator)`` (k1 or k3), H_t = ``entropy``.
    g_t (``cfg.loss_agg``): 1 for ``token_mean``; for ``seq_mean_token_mean`` the
    ``sequence_mean_weights`` N / (S * L_i) (S = ``n_sequences_global``, default: rows of this call
    with policy tokens), which makes L a mean over sequences of per-sequence token means. Since
    g_t >= 0 it scales the advantage of the clipped term exactly. Summing the losses of the
    micro-batches of a step, each called with the step's N (and S), gives the step's loss.

    Stats (detached): ``pg_loss`` and, when active, ``kl`` and ``entropy_bonus`` (the terms above,
    unscaled by their coefficients); means over this call's masked tokens of ``clip_frac``,
    ``dual_clip_frac``, ``approx_kl``, ``ratio_mean`` (from ``ppo_clip_loss``), ``is_weight_mean``
    and ``logprob_mismatch`` (with ``rollout_logprobs``) and ``entropy`` (when given), see
    ``rollout_stats``; ``n_tokens`` of this call.
    """
    if cfg.entropy_coef > 0 and entropy is None:
        raise ValueError("entropy_coef > 0 needs the entropy")
    weights: Tensor | float = 1.0
    if cfg.loss_agg == "seq_mean_token_mean":
        n_tok = int(mask.bool().sum()) if n_tokens_global is None else n_tokens_global
        n_seq = int((mask.bool().sum(dim=1) > 0).sum()) if n_sequences_global is None else n_sequences_global
        weights = sequence_mean_weights(mask, n_seq, n_tok)
    cap: float | Tensor = cfg.tis_cap
    if foreign_rows is not None and cfg.foreign_is_cap is not None:
        cap = foreign_caps(foreign_rows, cfg.tis_cap, cfg.foreign_is_cap).to(old_logprobs.device)
    is_w = truncated_is_weights(old_logprobs, rollout_logprobs, cap) if rollout_logprobs is not None else None
    pg, stats = ppo_clip_loss(
        logprobs, old_logprobs, advantages * weights, mask, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
        dual_clip=cfg.dual_clip, is_weights=is_w, n_tokens_global=n_tokens_global,
    )
    stats["pg_loss"] = pg.detach()
    loss = pg
    if cfg.entropy_coef > 0:
        bonus = aggregate_tokens(entropy * weights, mask, n_tokens_global)
        loss = loss - cfg.entropy_coef * bonus
        stats["entropy_bonus"] = bonus.detach()
    if ref_logprobs is not None:
        kl = aggregate_tokens(kl_penalty(logprobs, ref_logprobs, cfg.kl_estimator) * weights, mask, n_tokens_global)
        loss = loss + cfg.kl_coef * kl
        stats["kl"] = kl.detach()
    stats.update(rollout_stats(old_logprobs, mask, rollout_logprobs=rollout_logprobs, entropy=entropy, tis_cap=cfg.tis_cap))
    return loss, stats
