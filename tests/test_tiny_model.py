"""`agentrl make-model`: deterministic builds, recipe-keyed caching, the shipped checkpoint."""

from __future__ import annotations

import json
from dataclasses import asdict

from agentrl.models.tiny_model import SHIPPED, STAMP, TinyModelRecipe, make_model


def _quiet(*_):
    pass


def test_build_is_deterministic_and_cached(tmp_path):
    recipe = TinyModelRecipe(sft_steps=3, sft_tasks=0, sft_batch=4, habit_tasks=12, habit_steps=2)
    a = make_model(tmp_path / "a", recipe=recipe, log=_quiet)
    b = make_model(tmp_path / "b", recipe=recipe, log=_quiet)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()

    messages = []
    make_model(tmp_path / "a", recipe=recipe, log=messages.append)
    assert any("reusing" in m for m in messages)  # same recipe: nothing rebuilt
    messages.clear()
    make_model(tmp_path / "a", recipe=TinyModelRecipe(sft_steps=4, sft_tasks=0, sft_batch=4, habit_steps=0), log=messages.append)
    assert not any("reusing" in m for m in messages)  # another recipe: rebuilt


def test_stage2_from_a_saved_stage1_model_equals_the_full_build(tmp_path):
    import pytest

    stage1 = TinyModelRecipe(sft_steps=3, sft_tasks=0, sft_batch=4, habit_steps=0)
    full = TinyModelRecipe(sft_steps=3, sft_tasks=0, sft_batch=4, habit_tasks=12, habit_steps=2)
    base = make_model(tmp_path / "base", recipe=stage1, log=_quiet)
    messages = []
    a = make_model(tmp_path / "a", recipe=full, base=base, log=messages.append)
    b = make_model(tmp_path / "b", recipe=full, log=_quiet)
    assert any("stage 1 from" in m for m in messages) and any("habits fired" in m for m in messages)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()
    assert (a / "model.safetensors").read_bytes() != (base / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="stage 1"):  # a base of another stage-1 recipe is refused
        make_model(tmp_path / "c", recipe=TinyModelRecipe(sft_steps=4, sft_tasks=0, sft_batch=4, habit_steps=2), base=base)


def test_shipped_checkpoint_is_the_default_recipe_output(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    stamp = json.loads((SHIPPED / STAMP).read_text())
    assert stamp["recipe"] == asdict(TinyModelRecipe())
    messages = []
    out = make_model(tmp_path / "m", log=messages.append)
    assert any("shipped" in m for m in messages)
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.vocab_size == len(tok)
    assert "<|im_end|>" in tok.get_vocab() and tok.chat_template
