"""Stage-2 SFT (agentrl/models/sft.py): padding is masked out of loss and attention, so the pad id
does not matter. Stage 2 relies on this when a pretrained tokenizer sets no pad token and it pads
with the end token instead (tests/test_make_model_pretrained.py runs that path end to end)."""

from __future__ import annotations

import functools

import pytest
import torch

from agentrl.models.sft import lr_at, sft


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=50, tie_word_embeddings=True, max_position_embeddings=64)
    return Qwen2ForCausalLM(cfg)


def test_sft_losses_do_not_depend_on_the_pad_id():
    g = torch.Generator().manual_seed(1)
    lengths = [5, 9, 12, 7, 16, 3]  # unequal, so every batch of 2 pads one row
    sequences = []
    for n in lengths:
        ids = torch.randint(3, 50, (n,), generator=g).tolist()
        sequences.append((ids, [0] * (n // 2) + [1] * (n - n // 2)))  # the prompt half is not learned
    lr = functools.partial(lr_at, steps=6, peak=1e-2, warmup=1, decay_fraction=0.25, floor=0.1)
    runs = [sft(_model(), sequences, 6, lr, 2, seed=0, pad_id=pad, log=lambda *a: None) for pad in (0, 2, 49)]
    assert all(len(r) == 6 for r in runs)
    assert runs[0][0] != pytest.approx(runs[0][-1])  # the model did learn: otherwise equality would be vacuous
    for other in runs[1:]:
        assert other == pytest.approx(runs[0], abs=1e-6)
