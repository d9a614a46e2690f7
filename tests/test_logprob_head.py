"""The learner's log-prob head (engines/logprob_head.py) against plain autograd over full logits.

The head runs only on the scored positions, in chunks, with an analytic backward: its log-probs,
entropies and every parameter's gradient must equal those of the plain computation
(tests/plain_logprobs.py) within fp32 tolerance — padded and packed micro-batches, a temperature,
an entropy bonus, the module (ZeRO-3 / LoRA) path, LoRA adapters, and bf16 autocast within bf16's
tolerance."""

from __future__ import annotations

import pytest
import torch
from plain_logprobs import plain_token_logprobs

from agentrl.engines.hf_policy import micro_batch_logprobs, pad_batch, token_logprobs
from agentrl.engines.logprob_head import FusedLogprobHead, fused_head_weight, head_logprobs
from agentrl.engines.micro_batch import pack_sequences

VOCAB = 397


def _model(tied: bool = True, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, tie_word_embeddings=tied, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


SEQS = [[5, 17, 42, 7, 99, 3, 250, 11, 9], [8, 250, 1, 4], [4, 300, 12, 4, 77, 4, 4]]
# policy tokens: a prompt of 3 tokens, then the rest but one "tool result" token in the middle
MASKS = [[0, 0, 0, 1, 1, 0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 1, 1, 1, 0]]


def _loss_weights(mask: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.randn(mask.shape, generator=g) * mask


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_scored_positions_match_plain_autograd(tied, temperature):
    """Log-probs, entropies and all gradients on the scored positions, chunked (3 rows at a time)
    and with an entropy bonus in the loss, against full-logit autograd."""
    ids, attn, mask = pad_batch(SEQS, 0, MASKS)
    mask = mask.bool() & attn.bool()
    w, w_ent = _loss_weights(mask), _loss_weights(mask).flip(0)
    plain_model, model = _model(tied), _model(tied)
    lp_ref, ent_ref = plain_token_logprobs(plain_model, ids, attn, temperature=temperature)
    ((lp_ref * w).sum() + (ent_ref * w_ent * mask).sum()).backward()
    lp, ent = token_logprobs(model, ids, attn, score_mask=mask, with_entropy=True, entropy_grad=True,
                             temperature=temperature, max_logit_elements=3 * VOCAB)
    ((lp * w).sum() + (ent * w_ent).sum()).backward()
    torch.testing.assert_close(lp, torch.where(mask, lp_ref, 0.0).detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, torch.where(mask, ent_ref, 0.0).detach(), atol=1e-5, rtol=0)
    ref, got = _grads(plain_model), _grads(model)
    assert ref.keys() == got.keys()
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=1e-5, rtol=1e-4, msg=name)


def test_fused_and_module_paths_agree_and_entropy_is_detached_by_default():
    """The fused head and the module path (ZeRO-3, LoRA-wrapped or biased heads) give the same
    values and gradients; without an entropy bonus the entropy carries no gradient."""
    ids, attn, mask = pad_batch(SEQS, 0, MASKS)
    mask = mask.bool() & attn.bool()
    w = _loss_weights(mask)
    out = []
    for fused in (True, False):
        model = _model()
        lp, ent = token_logprobs(model, ids, attn, score_mask=mask, with_entropy=True, fused_head=fused,
                                 max_logit_elements=2 * VOCAB)
        assert not ent.requires_grad
        (lp * w).sum().backward()
        out.append((lp.detach(), ent, _grads(model)))
    torch.testing.assert_close(out[0][0], out[1][0], atol=1e-6, rtol=0)
    torch.testing.assert_close(out[0][1], out[1][1], atol=1e-6, rtol=0)
    for name in out[0][2]:
        torch.testing.assert_close(out[0][2][name], out[1][2][name], atol=1e-6, rtol=1e-5, msg=name)


def test_packed_micro_batch_matches_plain_autograd_per_sequence():
    """A packed row scored on its policy tokens = each sequence alone through plain autograd."""
    ids, positions, index = pack_sequences(SEQS)
    _, attn, mask = pad_batch(SEQS, 0, MASKS)
    mask = mask.bool() & attn.bool()
    packed_mask = torch.zeros(ids.numel(), dtype=torch.bool)
    packed_mask[index[mask]] = True
    w = _loss_weights(mask)
    model, plain_model = _model(), _model()
    lp = micro_batch_logprobs(model, ids, None, positions, index, score_mask=packed_mask.view_as(ids))
    (lp * w).sum().backward()
    total = 0.0
    for i, s in enumerate(SEQS):
        ref, _ = plain_token_logprobs(plain_model, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))
        torch.testing.assert_close(lp[i, : len(s)], torch.where(mask[i, : len(s)], ref[0], 0.0).detach(), atol=1e-5, rtol=0)
        total = total + (ref[0] * w[i, : len(s)]).sum()
    total.backward()
    for name, g in _grads(plain_model).items():
        torch.testing.assert_close(_grads(model)[name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_lora_adapters_get_the_plain_gradient():
    peft = pytest.importorskip("peft")
    ids, attn, mask = pad_batch(SEQS, 0, MASKS)
    mask = mask.bool() & attn.bool()
    w = _loss_weights(mask)
    grads = []
    for plain in (True, False):
        model = peft.get_peft_model(_model(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                              init_lora_weights=False))
        if plain:
            lp, _ = plain_token_logprobs(model, ids, attn)
        else:
            lp = token_logprobs(model, ids, attn, score_mask=mask)
        (lp * w).sum().backward()
        grads.append(_grads(model))
    assert grads[0] and grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4, msg=name)


def test_head_keeps_no_vocabulary_sized_tensor_for_backward():
    """What the fused head saves for its backward is O(rows x hidden), not O(rows x vocab)."""
    head = torch.nn.Linear(16, 5000, bias=False)
    h = torch.randn(40, 16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        lp, _ = head_logprobs(head, h, torch.randint(0, 5000, (40,)), with_entropy=True)
    assert lp.requires_grad and fused_head_weight(head) is head.weight
    assert max(saved) <= 5000 * 16  # the weight itself; nothing of 40 x 5000
    assert isinstance(lp.grad_fn, type(FusedLogprobHead.apply(h, head.weight, torch.zeros(40, dtype=torch.long),
                                                                1.0, 8, False, False)[0].grad_fn))


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="no bf16 units on this CPU")
def test_bf16_autocast_stays_close_to_fp32():
    """Under bf16 autocast the matmuls run in bf16 (the values move) but the log-probs stay within
    bf16's rounding of the fp32 ones, and the gradient points the same way."""
    ids, attn, mask = pad_batch(SEQS, 0, MASKS)
    mask = mask.bool() & attn.bool()
    w = _loss_weights(mask)
    results = []
    for autocast in (False, True):
        model = _model()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            lp = token_logprobs(model, ids, attn, score_mask=mask)
        (lp * w).sum().backward()
        results.append((lp.detach(), torch.cat([g.flatten() for g in _grads(model).values()])))
    (lp32, g32), (lp16, g16) = results
    assert not torch.equal(lp32, lp16)  # bf16 really ran
    torch.testing.assert_close(lp16, lp32, atol=0.05, rtol=0)
    assert torch.nn.functional.cosine_similarity(g16, g32, dim=0) > 0.99


def test_a_micro_batch_that_scores_nothing_still_reaches_every_parameter():
    """A learner rank's empty filler micro-batch (no policy token) must produce a zero gradient for
    every parameter, or the ranks' gradient reduction waits forever for it."""
    ids, attn, mask = pad_batch(SEQS, 0, MASKS)
    model = _model()
    lp = token_logprobs(model, ids, attn, score_mask=torch.zeros_like(mask, dtype=torch.bool))
    assert torch.equal(lp, torch.zeros_like(lp))
    (lp * 1.0).sum().backward()
    grads = _grads(model)
    assert len(grads) == len(list(model.parameters())) and all(not g.any() for g in grads.values())
