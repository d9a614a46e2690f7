"""SLCA-GRPO: segment-locked credit assignment (docs/design.md §4) as pure torch functions.

Each episode carries two rewards: R_tool (process reward of the tool-calling turns) and R_sum
(quality of the final summary). Each is z-scored within the group over the episodes that HAVE that
segment, and each advantage is routed only to its own segment's tokens, so the summary reward never
credits tool calls and vice versa.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.algos.advantages import grpo

# Segment labels, identical to SEG_ENV/SEG_TOOL/SEG_SUMMARY in agentrl/agent/episode.py. Duplicated
# on purpose: algos/ stays free of agent/ imports (pure tensor code); tests pin the two together.
SEG_ENV, SEG_TOOL, SEG_SUMMARY = 0, 1, 2


def _segment_advantage(r: Tensor, has: Tensor, eps: float) -> Tensor:
    if r.dim() != 1 or has.shape != r.shape:
        raise ValueError(
            f"reward and presence mask must be 1-D of equal length, got {tuple(r.shape)} and {tuple(has.shape)}"
        )
    r = r if r.is_floating_point() else r.to(torch.float32)
    present = has.bool()
    out = torch.zeros_like(r)
    idx = present.nonzero(as_tuple=True)[0]
    # grpo returns 0 for fewer than 2 episodes: no baseline for the segment in this group.
    # Rewards of absent segments are never read (they may be NaN or placeholders).
    out[idx] = grpo(r[idx], eps).to(out.dtype)
    return out


def slca(
    r_tool: Tensor,
    r_sum: Tensor,
    has_tool: Tensor,
    has_sum: Tensor,
    lam_tool: float = 1.0,
    lam_sum: float = 1.0,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """Segment advantages of ONE group of G episodes: (A_tool [G], A_sum [G]).

    A_tool[i] = lam_tool * (r_tool[i] - mean_P(r_tool)) / (std_P(r_tool) + eps) for i in P, else 0,
    with P = {i : has_tool[i]} (unbiased std, as ``advantages.grpo``); |P| < 2 -> all 0. Same for
    the summary with has_sum and lam_sum. lambda is applied AFTER normalizing, so it is a pure
    weight between the two segments' gradients, not undone by the z-score.
    """
    if not (r_tool.shape == r_sum.shape == has_tool.shape == has_sum.shape) or r_tool.dim() != 1:
        raise ValueError(
            "r_tool, r_sum, has_tool, has_sum must be 1-D [G] of equal length, got "
            f"{tuple(r_tool.shape)}, {tuple(r_sum.shape)}, {tuple(has_tool.shape)}, {tuple(has_sum.shape)}"
        )
    a_tool = lam_tool * _segment_advantage(r_tool, has_tool, eps)
    a_sum = lam_sum * _segment_advantage(r_sum, has_sum, eps)
    return a_tool, a_sum


def route_segments(a_tool: Tensor, a_sum: Tensor, segments: Tensor) -> Tensor:
    """Token advantages [B, T]: a_tool[b] where segments[b, t] == SEG_TOOL, a_sum[b] where
    SEG_SUMMARY, 0 elsewhere (environment tokens, prompt, padding)."""
    if segments.dim() != 2 or a_tool.dim() != 1 or a_tool.shape != a_sum.shape or a_tool.shape[0] != segments.shape[0]:
        raise ValueError(
            f"expected a_tool [B], a_sum [B], segments [B, T], got {tuple(a_tool.shape)}, "
            f"{tuple(a_sum.shape)}, {tuple(segments.shape)}"
        )
    dtype = torch.promote_types(a_tool.dtype, a_sum.dtype)
    if not dtype.is_floating_point:
        dtype = torch.float32
    tool = a_tool.to(dtype).unsqueeze(1).expand(segments.shape)
    summ = a_sum.to(dtype).unsqueeze(1).expand(segments.shape)
    zero = torch.zeros((), dtype=dtype, device=segments.device)
    return torch.where(segments == SEG_TOOL, tool, torch.where(segments == SEG_SUMMARY, summ, zero))
