"""Sequence packing (``learner.packing``) and token-budget micro-batches, on tiny random HF models.

The packed forward (one row, positions restarting per episode, no attention mask) must give the
padded forward's per-token logprobs, entropies, values and parameter gradients, because nothing
downstream of the forward knows which layout ran.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, LlamaConfig, Qwen2Config

from agentrl.api import TrainBatch
from agentrl.engines.hf_policy import micro_batch_logprobs, micro_batch_values, pad_batch, token_logprobs, unpack
from agentrl.engines.micro_batch import pack_micro_batch, pack_sequences, pad_micro_batch, padding_fraction, split_micro_batches

VOCAB = 100
LENGTHS = [5, 17, 40, 9, 23]


def _config(kind: str, **extra):
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, **extra)
    return Qwen2Config(**common) if kind == "qwen2" else LlamaConfig(**common)


def _model(kind: str, attn: str = "sdpa", seed: int = 0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(_config(kind), attn_implementation=attn, dtype=torch.float32).eval()


def _seqs(seed: int = 1, lengths=LENGTHS) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in lengths]


def _both_layouts(seqs):
    """(padded forward args, packed forward args), as ``MicroBatch.forward_args`` returns them."""
    ids, attn = pad_batch(seqs, pad_id=0)
    packed_ids, positions, index = pack_sequences(seqs)
    return (ids, attn, None, None), (packed_ids, None, positions, index), attn.bool()


def _grads(model, args, adv, mask, **kw):
    model.zero_grad()
    lp, ent = micro_batch_logprobs(model, *args, with_entropy=True, entropy_grad=True, **kw)
    ((lp * adv + 0.1 * ent) * mask).sum().backward()
    return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_grads_close(ga: dict, gb: dict) -> None:
    for name, g in ga.items():
        err = float((g - gb[name]).norm())
        assert err <= 1e-5 * float(g.norm()) + 1e-8, f"{name}: |diff| {err:.3g} vs |grad| {float(g.norm()):.3g}"


@pytest.mark.parametrize("kind,attn", [("qwen2", "sdpa"), ("llama", "sdpa"), ("qwen2", "eager"), ("llama", "eager")])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_equals_padded_logprobs_entropy_and_grads(kind, attn, temperature):
    model = _model(kind, attn)
    seqs = _seqs()
    padded, packed, mask = _both_layouts(seqs)
    adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(2))
    lp_a, ent_a, g_a = _grads(model, padded, adv, mask, temperature=temperature)
    lp_b, ent_b, g_b = _grads(model, packed, adv, mask, temperature=temperature)
    assert lp_b.shape == ent_b.shape == mask.shape
    torch.testing.assert_close(lp_b, lp_a, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, rtol=0, atol=1e-5)
    # the alignment convention: position 0 of each episode and padding are 0, every other real token is scored
    scored = mask.clone()
    scored[:, 0] = False
    assert (lp_b[~scored] == 0).all() and (ent_b[~scored] == 0).all() and (lp_b[scored] < 0).all()
    _assert_grads_close(g_a, g_b)


@pytest.mark.parametrize("full_forward", [False, True])
def test_packed_row_matches_each_episode_alone(full_forward):
    """Ground truth without any padding or packing: every episode run by itself. ``full_forward``:
    the model's own forward instead of decoder + chunked LM head (``logit_scale``, unused by Qwen2,
    is one of the attributes that select it)."""
    model = _model("qwen2")
    if full_forward:
        model.config.logit_scale = 1.0
    seqs = _seqs()
    _, packed, _ = _both_layouts(seqs)
    with torch.no_grad():
        lp = micro_batch_logprobs(model, *packed)
        for b, s in enumerate(seqs):
            alone = token_logprobs(model, torch.tensor([s]))[0]
            torch.testing.assert_close(lp[b, : len(s)], alone, rtol=0, atol=1e-5)


def test_episodes_are_isolated_in_the_packed_row():
    model = _model("llama")
    seqs = _seqs(lengths=[12, 15, 8])
    changed = [[(t + 7) % VOCAB for t in seqs[0]]] + seqs[1:]
    with torch.no_grad():
        ids, positions, _ = pack_sequences(seqs)
        assert token_logprobs(model, ids, position_ids=positions).shape == (1, sum(len(s) for s in seqs))
        lp, lp_changed = (micro_batch_logprobs(model, *_both_layouts(s)[1]) for s in (seqs, changed))
        # control: the same rows with an all-ones mask handed to the model (no per-episode mask) leak
        leaky = [model(input_ids=pack_sequences(s)[0], attention_mask=torch.ones_like(ids), position_ids=positions).logits
                 for s in (seqs, changed)]
    assert not torch.allclose(lp[0], lp_changed[0])
    torch.testing.assert_close(lp_changed[1:], lp[1:], rtol=0, atol=1e-6)
    n0 = len(seqs[0])
    assert not torch.allclose(leaky[0][0, n0:], leaky[1][0, n0:], atol=1e-4)


def test_chunked_checkpointed_lm_head_gives_the_same_result():
    model = _model("qwen2")
    seqs = _seqs()
    _, packed, mask = _both_layouts(seqs)
    adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(3))
    lp_a, ent_a, g_a = _grads(model, packed, adv, mask)
    # 3 positions per chunk on the 94-token packed row: ~32 checkpointed chunks
    lp_b, ent_b, g_b = _grads(model, packed, adv, mask, max_logit_elements=3 * VOCAB)
    torch.testing.assert_close(lp_b, lp_a, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, rtol=0, atol=1e-5)
    _assert_grads_close(g_a, g_b)


def test_packed_row_takes_no_attention_mask():
    model = _model("qwen2")
    ids, positions, _ = pack_sequences(_seqs(lengths=[4, 5]))
    with pytest.raises(ValueError, match="takes no attention_mask"):
        token_logprobs(model, ids, torch.ones_like(ids), position_ids=positions)


def test_unpack_is_a_differentiable_gather():
    packed = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]], requires_grad=True)
    index = torch.tensor([[0, 1, -1], [2, 3, 4]])
    out = unpack(packed, index)
    assert out.tolist() == [[1.0, 2.0, 0.0], [3.0, 4.0, 5.0]]
    (out * torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 5.0]])).sum().backward()
    assert packed.grad.tolist() == [[1.0, 2.0, 3.0, 4.0, 5.0]]  # nothing leaks from the padding slot


def test_pack_micro_batch_keeps_the_padded_tensors():
    batch = TrainBatch(input_ids=[[1, 2, 3], [4, 5], [6, 7, 8, 9]],
                       response_mask=[[0, 1, 1], [0, 0], [0, 1, 0, 1]],
                       advantages=[[0.0, 0.5, 0.5], [0.0, 0.0], [0.0, -1.0, 0.0, -1.0]])
    padded, packed = pad_micro_batch(batch, [1, 0, 2], pad_id=0), pack_micro_batch(batch, [1, 0, 2], pad_id=0)
    for name in ("input_ids", "attention_mask", "response_mask", "advantages"):
        assert torch.equal(getattr(packed, name), getattr(padded, name))
    assert (packed.n_tokens, packed.n_sequences) == (padded.n_tokens, padded.n_sequences)
    assert packed.packed_ids.tolist() == [[4, 5, 1, 2, 3, 6, 7, 8, 9]]
    assert packed.packed_positions.tolist() == [[0, 1, 0, 1, 2, 0, 1, 2, 3]]
    assert packed.unpack_index.tolist() == [[0, 1, -1, -1], [2, 3, 4, -1], [5, 6, 7, 8]]
    assert not padded.packed and packed.packed
    ids, attn, pos, index = padded.forward_args()
    assert ids is padded.input_ids and attn is padded.attention_mask and pos is None and index is None
    ids, attn, pos, index = packed.forward_args()
    assert ids is packed.packed_ids and attn is None and pos is packed.packed_positions and index is packed.unpack_index
    assert torch.equal(unpack(packed.packed_ids, packed.unpack_index), packed.input_ids)  # pad id 0


def test_split_by_count_and_by_token_budget():
    lengths = [8, 9, 10, 12, 50]
    rows = [0, 1, 2, 3, 4]
    assert split_micro_batches(rows, lengths, 2) == [[0, 1], [2, 3], [4]]
    assert split_micro_batches([3, 1, 0], lengths, 5) == [[3, 1, 0]]
    # packed cost = sum of lengths: 8+9+10 = 27 <= 28, +12 = 39 > 28; 50 alone is over the budget
    assert split_micro_batches(rows, lengths, 2, max_tokens=28) == [[0, 1, 2], [3], [4]]
    # padded cost = rows x longest: 3 x 10 = 30 > 28, then 2 x 12 = 24
    assert split_micro_batches(rows, lengths, 2, max_tokens=28, packed=False) == [[0, 1], [2, 3], [4]]
    # the budget replaces the count (micro_batch_size 1 is ignored) and is inclusive
    assert split_micro_batches(rows[:4], lengths, 1, max_tokens=39) == [[0, 1, 2, 3]]
    assert split_micro_batches([4], lengths, 2, max_tokens=10) == [[4]]
    assert split_micro_batches([], lengths, 2, max_tokens=10) == split_micro_batches([], lengths, 2) == []


def test_padding_fraction():
    lengths = [2, 4, 3]
    # padded: [0, 1] -> 2 x 4 = 8 slots for 6 tokens, [2] -> 3 for 3: 2 / 11
    assert padding_fraction([[0, 1], [2]], lengths, packed=False) == pytest.approx(2 / 11)
    assert padding_fraction([[0, 1], [2]], lengths, packed=True) == 0.0
    assert padding_fraction([], lengths, packed=False) == 0.0


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_value_model_on_both_layouts(kind):
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_config(_config(kind, num_labels=1), dtype=torch.float32).eval()
    seqs = _seqs()
    padded, packed, mask = _both_layouts(seqs)
    v_padded = micro_batch_values(model, *padded)
    v_packed = micro_batch_values(model, *packed)
    assert v_packed.shape == mask.shape
    torch.testing.assert_close(v_packed, v_padded, rtol=0, atol=1e-5)
    # the critic's shifted scores (what ``_Values`` computes) on every real token but each row's first
    with torch.no_grad():
        scores = model(input_ids=padded[0], attention_mask=padded[1], use_cache=False).logits[..., 0]
    legacy = torch.cat([torch.zeros(len(seqs), 1), scores[:, :-1]], dim=1)
    scored = mask.clone()
    scored[:, 0] = False
    torch.testing.assert_close(v_packed[scored], legacy[scored], rtol=0, atol=1e-5)
    assert (v_packed[~scored] == 0).all()
    # gradients reach the value model through the unpacking
    (v_packed * mask).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
