"""Torch helpers shared by the learner and tests: per-token logprobs of a HF causal LM, padding.

No Ray and no DeepSpeed here, so tests and the reference model can use these directly.

Alignment convention (used everywhere in agentrl): ``out[:, t]`` is the logprob of token ``t``
given tokens ``< t``, i.e. logprobs live on the token they score, like the inference engine's
sampled-token logprobs and the ``response_mask``. Position 0 has no context and gets 0.

Compute and memory: the [B, T, V] logits tensor is the largest activation of a small LM (vocab
150k × 1k tokens × 8 sequences is ~5 GB in fp32), and the LM head is a large share of its compute.
We run the decoder once, gather the hidden states of the positions that are scored (the policy's
tokens, when the caller says which: ``score_mask``), and run the LM head on those alone as a
log-prob head (``engines/logprob_head.py``) that holds one chunk of logits at a time, in forward
and in backward.

Packing (``learner.packing``): a micro-batch can instead be one row of its episodes end to end,
with ``position_ids`` restarting at 0 at each episode's first token and no ``attention_mask``.
transformers (5.x, ``masking_utils``) then restricts attention to each episode on its own:
``_preprocess_mask_arguments`` calls ``find_packed_sequence_indices(position_ids)`` when the 2D
mask is None and there is no cache, and ``create_causal_mask`` ANDs the causal mask with
``packed_sequence_mask_function`` (disabling SDPA's ``is_causal`` skip), which the sdpa and eager
mask builders both materialize; flash-attention derives its varlen boundaries from the same
position ids. No compute goes to padding. ``unpack`` then puts the packed row's per-token values
back in the padded [B, T] layout, so the loss, masks and metrics never see the difference.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from agentrl.engines.logprob_head import DEFAULT_MAX_LOGIT_ELEMENTS, checkpointed_logprobs, head_logprobs

# Config attributes that post-process logits inside forward(); models that have them are run
# through their full forward (unchunked) so the result stays exact.
_LOGIT_POSTPROCESS_ATTRS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")


def _split_model(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """(decoder, lm_head) when logits are exactly ``lm_head(decoder(...).last_hidden_state)``."""
    config = getattr(model, "config", None)
    if config is None or any(getattr(config, a, None) is not None for a in _LOGIT_POSTPROCESS_ATTRS):
        return None
    get_decoder = getattr(model, "get_decoder", None)
    get_head = getattr(model, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    decoder, head = get_decoder(), get_head()
    if decoder is None or head is None or decoder is model:
        return None
    return decoder, head


def token_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    position_ids: Tensor | None = None,
    score_mask: Tensor | None = None,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    max_logit_elements: int = DEFAULT_MAX_LOGIT_ELEMENTS,
    temperature: float = 1.0,
    fused_head: bool = True,
) -> Tensor | tuple[Tensor, Tensor]:
    """out[:, t] = log p(input_ids[:, t] | input_ids[:, :t]) in float32; out[:, 0] = 0.

    ``temperature``: score under softmax(logits / temperature), the distribution a sampler at
    that temperature draws from (what vLLM's processed logprobs report).

    ``score_mask`` (bool, the layout of ``input_ids``): the positions whose log-prob is wanted
    (the policy tokens); the LM head runs on those only (``engines/logprob_head.py``) and every
    other position is 0. None: every position with context. Positions where ``attention_mask`` is
    0 (right padding) are 0 either way. With ``with_entropy`` also returns the entropy of the
    predictive distribution at each scored token, aligned the same way (detached unless
    ``entropy_grad``). Differentiable w.r.t. the model parameters when grad is enabled.
    ``fused_head=False`` runs the head as a module even where the fused log-prob head could.

    A packed row (``position_ids`` [1, N] restarting at 0 per episode, ``attention_mask`` None; see
    the module docstring) scores each token within its own episode, and every episode's first
    token gets 0 like position 0 of a padded row. ``unpack`` turns the result into [B, T].
    """
    bsz, seqlen = input_ids.shape
    forward_kwargs = _forward_kwargs(input_ids, attention_mask, position_ids)
    scored = _has_context(input_ids, attention_mask, position_ids)
    if score_mask is not None:
        scored = scored & score_mask.bool()
    rows, cols = scored.nonzero(as_tuple=True)
    # A micro-batch that scores nothing (a rank's empty filler) must still give every parameter a
    # (zero) gradient: data-parallel ranks reduce them together, and a rank whose backward reaches
    # no parameter would leave the others waiting. So it scores one position, times 0.
    keep_graph = rows.numel() == 0 and torch.is_grad_enabled() and seqlen > 1
    if keep_graph:
        rows, cols = rows.new_zeros(1), rows.new_ones(1)
    targets = input_ids[rows, cols]
    split = _split_model(model)
    if split is None:  # logits post-processed inside forward(): the full forward, then gather
        logits = model(input_ids=input_ids, **forward_kwargs).logits
        lp_sel, ent_sel = checkpointed_logprobs(_Identity(), logits[rows, cols - 1], targets, temperature,
                                                max(1, max_logit_elements // max(1, logits.shape[-1])),
                                                with_entropy, entropy_grad)
    else:
        decoder, head = split
        hidden = decoder(input_ids=input_ids, **forward_kwargs).last_hidden_state
        lp_sel, ent_sel = head_logprobs(head, hidden[rows, cols - 1], targets, temperature=temperature,
                                        with_entropy=with_entropy, entropy_grad=entropy_grad,
                                        max_logit_elements=max_logit_elements, fused=fused_head)
    if keep_graph:
        lp_sel, ent_sel = lp_sel * 0.0, ent_sel * 0.0
    lp = lp_sel.new_zeros(bsz, seqlen).index_put((rows, cols), lp_sel)
    if not with_entropy:
        return lp
    ent = ent_sel.new_zeros(bsz, seqlen).index_put((rows, cols), ent_sel)
    return lp, (ent if entropy_grad else ent.detach())


class _Identity(nn.Module):
    """The 'head' of rows that already are logits (a model whose forward post-processes them)."""

    def forward(self, x: Tensor) -> Tensor:
        return x


def _forward_kwargs(input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor | None) -> dict:
    """Keyword arguments of the HF forward for a padded batch or a packed row.

    A packed row must reach the model without an attention mask: transformers only derives the
    per-episode mask from ``position_ids`` when the mask is None (an all-ones mask would silently
    let episodes attend to each other)."""
    if position_ids is None:
        return {"attention_mask": torch.ones_like(input_ids) if attention_mask is None else attention_mask, "use_cache": False}
    if attention_mask is not None:
        raise ValueError("a packed row (position_ids given) takes no attention_mask: the mask comes from position_ids")
    if position_ids.shape != input_ids.shape:
        raise ValueError(f"position_ids {tuple(position_ids.shape)} must have the shape of input_ids {tuple(input_ids.shape)}")
    return {"position_ids": position_ids, "use_cache": False}


def _has_context(input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor | None) -> Tensor:
    """bool [B, T]: the token is real and has an earlier token of its own sequence to be scored by.

    Padded: position 0 and padding do not. Packed: each episode's first token (position id 0) does not."""
    if position_ids is not None:
        return position_ids != 0
    real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    return real & (torch.arange(input_ids.shape[1], device=input_ids.device) > 0)


def unpack(packed: Tensor, index: Tensor) -> Tensor:
    """Per-token values of a packed row ([1, N] or [N]) in the padded layout [B, T]:
    ``out[b, t] = packed[index[b, t]]``, 0 where ``index`` is -1 (padding).

    A gather, so gradients flow back into the packed row (and nothing flows from padding)."""
    flat = packed.reshape(-1)
    real = index >= 0
    out = flat[index.clamp(min=0)]
    return torch.where(real, out, torch.zeros_like(out))


def micro_batch_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
    unpack_index: Tensor | None = None,
    **kwargs,
) -> Tensor | tuple[Tensor, Tensor]:
    """``token_logprobs`` on the arguments of ``MicroBatch.forward_args()`` (either layout),
    always answered in the padded [B, T] layout; ``kwargs`` go to ``token_logprobs``.

    The arguments are positional so an ``nn.Module`` wrapper (what DeepSpeed calls) can pass
    ``*m.forward_args()`` straight through."""
    out = token_logprobs(model, input_ids, attention_mask, position_ids=position_ids, **kwargs)
    if unpack_index is None:
        return out
    return tuple(unpack(t, unpack_index) for t in out) if isinstance(out, tuple) else unpack(out, unpack_index)


def micro_batch_values(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
    unpack_index: Tensor | None = None,
) -> Tensor:
    """Values [B, T] fp32 of a token-classification value model (``num_labels=1``) on the
    arguments of ``MicroBatch.forward_args()`` (either layout), in the padded layout.

    Aligned like the logprobs: ``out[:, t]`` is the score of the hidden state at ``t - 1``, the
    value of the state token ``t`` is sampled from. 0 where there is no such state in the token's
    own episode (its first token) and on padding (GAE and the value loss only read policy tokens)."""
    scores = model(input_ids=input_ids, **_forward_kwargs(input_ids, attention_mask, position_ids)).logits[..., 0].float()
    values = torch.cat([scores.new_zeros(scores.shape[0], 1), scores[:, :-1]], dim=1)
    values = torch.where(_has_context(input_ids, attention_mask, position_ids), values, torch.zeros_like(values))
    return values if unpack_index is None else unpack(values, unpack_index)


def pad_batch(
    seqs: Sequence[Sequence[int]],
    pad_id: int,
    *per_token_lists: Sequence[Sequence[float]],
    device: torch.device | str | None = None,
) -> tuple[Tensor, ...]:
    """Right-pad ``seqs`` to the longest: returns (input_ids long [B, T], attention_mask long
    [B, T], *one float32 [B, T] tensor per extra per-token list, padded with 0).

    Every extra list must have the same lengths as ``seqs`` (one value per token); a mismatch is
    an error because a shifted mask or advantage would silently train on the wrong tokens.
    """
    if not seqs:
        raise ValueError("pad_batch needs at least one sequence")
    bsz, seqlen = len(seqs), max(len(s) for s in seqs)
    ids = torch.full((bsz, seqlen), pad_id, dtype=torch.long)
    mask = torch.zeros((bsz, seqlen), dtype=torch.long)
    extras = [torch.zeros((bsz, seqlen), dtype=torch.float32) for _ in per_token_lists]
    for i, s in enumerate(seqs):
        n = len(s)
        ids[i, :n] = torch.as_tensor(list(s), dtype=torch.long)
        mask[i, :n] = 1
        for j, values in enumerate(per_token_lists):
            if len(values[i]) != n:
                raise ValueError(f"per-token list {j} row {i} has {len(values[i])} values for {n} tokens")
            extras[j][i, :n] = torch.as_tensor(list(values[i]), dtype=torch.float32)
    out = (ids, mask, *extras)
    if device is not None:
        out = tuple(t.to(device) for t in out)
    return out
