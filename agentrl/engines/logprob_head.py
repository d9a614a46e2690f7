"""The LM head as a log-prob head: log p(target) (and the entropy) of selected positions only.

A causal LM's last layer maps each hidden state to V logits (V = 49,152 for SmolLM2, 150k for
Qwen). The learner needs one number per *scored* position (the log-prob of the token that
followed) and, for metrics or an entropy bonus, the entropy. Scored positions are the policy's
tokens: prompts, tool results, user turns and padding are never scored, so the head runs on the
gathered hidden states of the scored positions only, ``h`` [N, H].

For every chunk of rows (at most ``max_logit_elements`` logits at once), with z = h W^T / tau
(tau = the sampling temperature), lse = logsumexp(z) and p = softmax(z):

    lp_i  = z_{i, y_i} - lse_i
    H_i   = lse_i - sum_v p_iv z_iv

The backward never keeps a [N, V] tensor: ``FusedLogprobHead`` saves h, lse and H, recomputes each
chunk's logits and applies the analytic gradient

    dL/dz_iv = g_i (1[v = y_i] - p_iv) - e_i p_iv (log p_iv + H_i)      (e_i = dL/dH_i, 0 without
                                                                        an entropy bonus)
    dL/dh = (dL/dz / tau) W,   dL/dW = (dL/dz / tau)^T h

so a chunk costs one matmul forward and three backward, and the entropy is computed once, in the
forward, never recomputed. Under autocast the matmuls run in the autocast dtype (bf16 on CPUs with
AMX/AVX512-BF16 and on GPUs), softmax and the gradient of the logits in fp32, and the weight's
gradient is accumulated in fp32.

The fused path needs the head's weight as a plain tensor: a bias-free ``nn.Linear`` whose weight
is not partitioned (ZeRO-3 gathers a partitioned weight in the module's own forward hooks). Other
heads (ZeRO-3, a LoRA-wrapped head, a head with a bias) run ``checkpointed_logprobs``: the same
gathered rows, through the module, with each chunk in activation checkpointing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

# Upper bound on logits elements (rows * V) materialized at once: 2^26 fp32 = 256 MiB.
DEFAULT_MAX_LOGIT_ELEMENTS = 1 << 26


def _compute_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype a matmul on ``device`` runs in: the autocast dtype inside an autocast region."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return dtype


class FusedLogprobHead(torch.autograd.Function):
    """(lp [N], H [N]) = the module docstring's formulas for h [N, H], W [V, H], targets [N]."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, targets: Tensor, temperature: float, chunk: int, with_entropy: bool,
                entropy_grad: bool):
        cdt = _compute_dtype(h.device, weight.dtype)
        w = weight.to(cdt)
        lp = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
        lse = torch.empty_like(lp)
        ent = torch.zeros_like(lp)
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, h.shape[0], chunk):
                z = (h[s : s + chunk].to(cdt) @ w.t()).float()
                if temperature != 1.0:
                    z /= temperature
                lse_c = torch.logsumexp(z, dim=-1)
                lse[s : s + chunk] = lse_c
                lp[s : s + chunk] = z.gather(1, targets[s : s + chunk, None]).squeeze(1) - lse_c
                if with_entropy:
                    ent[s : s + chunk] = lse_c - (torch.softmax(z, dim=-1) * z).sum(-1)
        ctx.save_for_backward(h, weight, targets, lse, ent)
        ctx.temperature, ctx.chunk, ctx.cdt = temperature, chunk, cdt
        if not entropy_grad:
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp: Tensor | None, g_ent: Tensor | None):
        h, weight, targets, lse, ent = ctx.saved_tensors
        tau, chunk, cdt = ctx.temperature, ctx.chunk, ctx.cdt
        w = weight.to(cdt)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, h.shape[0], chunk):
                hc = h[s : s + chunk].to(cdt)
                z = (hc @ w.t()).float()
                if tau != 1.0:
                    z /= tau
                logp = z - lse[s : s + chunk, None]
                p = logp.exp()
                rows = torch.arange(hc.shape[0], device=h.device)
                if g_lp is not None:
                    g = g_lp[s : s + chunk, None].float()
                    dz = -g * p
                    dz[rows, targets[s : s + chunk]] += g.squeeze(1)
                else:
                    dz = torch.zeros_like(p)
                if g_ent is not None:  # an entropy bonus: dH/dz = -p (log p + H)
                    dz -= g_ent[s : s + chunk, None].float() * p * (logp + ent[s : s + chunk, None])
                if tau != 1.0:
                    dz /= tau
                dz = dz.to(cdt)
                if need_h:
                    grad_h[s : s + chunk] = (dz @ w).to(h.dtype)
                if need_w:
                    grad_w += (dz.t() @ hc).float()
        return grad_h, (grad_w.to(weight.dtype) if need_w else None), None, None, None, None, None


def fused_head_weight(head: nn.Module) -> Tensor | None:
    """The weight ``FusedLogprobHead`` can use for ``head``, or None when the head must run as a
    module (see the module docstring): not a bias-free ``nn.Linear``, or a ZeRO-3 partition."""
    if type(head) is not nn.Linear or head.bias is not None or hasattr(head.weight, "ds_id"):
        return None
    return head.weight


def checkpointed_logprobs(head: nn.Module, h: Tensor, targets: Tensor, temperature: float, chunk: int,
                          with_entropy: bool, entropy_grad: bool) -> tuple[Tensor, Tensor]:
    """The fallback: ``head`` on chunks of ``h`` through autograd, each chunk in activation
    checkpointing when a gradient is being recorded (its logits are recomputed in backward)."""

    def run(hc: Tensor, tc: Tensor) -> tuple[Tensor, Tensor]:
        z = head(hc).float()
        if temperature != 1.0:
            z = z / temperature
        lse = torch.logsumexp(z, dim=-1)
        lp = z.gather(1, tc[:, None]).squeeze(1) - lse
        if not with_entropy:
            return lp, torch.zeros_like(lp)
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            return lp, lse - (F.softmax(z, dim=-1) * z).sum(-1)

    lps, ents = [], []
    for s in range(0, h.shape[0], chunk):
        args = (h[s : s + chunk], targets[s : s + chunk])
        lp, ent = checkpoint(run, *args, use_reentrant=False) if torch.is_grad_enabled() else run(*args)
        lps.append(lp)
        ents.append(ent)
    if not lps:
        empty = h.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(lps), torch.cat(ents)


def head_logprobs(head: nn.Module, h: Tensor, targets: Tensor, *, temperature: float = 1.0, with_entropy: bool = False,
                  entropy_grad: bool = False, max_logit_elements: int = DEFAULT_MAX_LOGIT_ELEMENTS,
                  fused: bool = True) -> tuple[Tensor, Tensor]:
    """(log p(targets) [N], entropy [N]) in fp32 under softmax(head(h) / temperature), for
    gathered hidden states ``h`` [N, H]; the entropy is zeros without ``with_entropy`` and carries
    a gradient only with ``entropy_grad`` (an entropy bonus). ``fused=False`` forces the module
    path (tests compare the two)."""
    vocab = getattr(head, "out_features", None) or head.weight.shape[0]
    chunk = max(1, max_logit_elements // max(1, vocab))
    weight = fused_head_weight(head) if fused else None
    if weight is None or h.shape[0] == 0:
        return checkpointed_logprobs(head, h, targets, temperature, chunk, with_entropy, entropy_grad)
    return FusedLogprobHead.apply(h, weight, targets, temperature, chunk, with_entropy, with_entropy and entropy_grad)
