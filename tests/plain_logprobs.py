"""The plain-autograd reference the learner's log-prob head is tested against: the model's full
logits, log_softmax over the vocabulary at every position, nothing chunked, fused or skipped."""

from __future__ import annotations

import torch
from torch import Tensor


def plain_token_logprobs(model, input_ids: Tensor, attention_mask: Tensor | None = None, *, temperature: float = 1.0,
                         position_ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(logprobs, entropy) [B, T] in agentrl's alignment (out[:, t] scores token t; 0 at t = 0 and
    on padding), with gradients through everything. Packed rows: ``position_ids`` and no mask."""
    kwargs = {"position_ids": position_ids} if position_ids is not None else {"attention_mask": attention_mask}
    logits = model(input_ids=input_ids, use_cache=False, **kwargs).logits.float() / temperature
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    lp = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    if position_ids is not None:
        valid = position_ids[:, 1:] != 0
    else:
        valid = (attention_mask[:, 1:] > 0) if attention_mask is not None else torch.ones_like(lp, dtype=torch.bool)
    zero = lp.new_zeros(lp.shape[0], 1)
    return (torch.cat([zero, torch.where(valid, lp, 0.0)], 1), torch.cat([zero, torch.where(valid, ent, 0.0)], 1))
