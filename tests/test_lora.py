"""LoRA for the learner (agentrl/engines/lora.py) on tiny random HF models (Qwen2, Llama, GPT-2).

The property the weight sync relies on: a plain (un-wrapped) model loaded with ``merged_weights``
scores tokens exactly as the trained peft model does, so the inference engine samples from the
policy the learner trains.
"""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch

from agentrl.config.schema import LoraConfig
from agentrl.engines.hf_policy import token_logprobs
from agentrl.engines.lora import (
    adapter_state_dict,
    apply_lora,
    iter_merged_weights,
    load_adapter_state_dict,
    merged_weights,
    save_adapter,
    trainable_parameters,
    unwrap_base,
)

ATTN_MLP = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _config(kind: str, tied: bool = False):
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    if kind == "gpt2":
        return GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2,
                          tie_word_embeddings=tied)
    cls = Qwen2Config if kind == "qwen2" else LlamaConfig
    return cls(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2,
               pad_token_id=0)


def _model(config, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 97, (3, 12), generator=g)
    attn = torch.ones_like(ids)
    attn[1, 9:] = 0  # right padding
    return ids, attn


def _train(peft_model, steps: int = 3) -> None:
    """A few AdamW steps on a random linear loss of the token logprobs: moves every adapter."""
    opt = torch.optim.AdamW(trainable_parameters(peft_model), lr=1e-2)
    ids, attn = _batch(seed=7)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))
    for _ in range(steps):
        loss = (token_logprobs(peft_model, ids, attn) * weights).sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _lora(rank: int = 4, alpha: float = 8.0, targets=ATTN_MLP) -> LoraConfig:
    return LoraConfig(rank=rank, alpha=alpha, target_modules=targets)


def test_starts_equal_to_base_and_only_adapters_train():
    cfg = _config("qwen2")
    base = _model(cfg)
    ids, attn = _batch()
    with torch.no_grad():
        before = token_logprobs(base, ids, attn)
    linear_shapes = {n: (m.in_features, m.out_features) for n, m in base.named_modules()
                     if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in ATTN_MLP}
    model = apply_lora(base, _lora(rank=4))
    assert not model.training  # eval mode kept (peft switches to train)
    with torch.no_grad():
        assert torch.equal(token_logprobs(model, ids, attn), before)  # B = 0

    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(linear_shapes) == 2 * len(ATTN_MLP)
    # A: r x in, B: out x r for each adapted layer
    assert sum(p.numel() for p in trainable.values()) == sum(4 * (i + o) for i, o in linear_shapes.values())
    assert trainable_parameters(model) == list(trainable.values())
    assert unwrap_base(model) is base and unwrap_base(base) is base


@pytest.mark.parametrize("kind,tied,targets", [("qwen2", False, ATTN_MLP), ("qwen2", True, "all-linear"),
                                                ("llama", True, ["q_proj", "v_proj"]), ("gpt2", True, ["c_attn", "c_fc"])])
def test_merged_weights_reproduce_trained_policy(kind, tied, targets):
    cfg = _config(kind, tied=tied)
    base = _model(cfg)
    expected = {k: (tuple(v.shape), v.dtype) for k, v in _model(cfg).state_dict().items()}
    model = apply_lora(base, _lora(targets=targets))
    _train(model)
    ids, attn = _batch()
    with torch.no_grad():
        lp_peft = token_logprobs(model, ids, attn)
        full_logits = model(input_ids=ids, attention_mask=attn).logits  # peft's own forward agrees with the split path
    ref = torch.log_softmax(full_logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0] * attn[:, 1:]
    assert torch.allclose(lp_peft[:, 1:], ref, atol=1e-5)

    names = [k for k, _ in iter_merged_weights(model)]
    assert names == list(expected)  # exactly the plain model's keys, in state_dict order
    sd = merged_weights(model)
    assert {k: (tuple(v.shape), v.dtype) for k, v in sd.items()} == expected
    assert all(v.device.type == "cpu" for v in sd.values())
    if tied:
        assert torch.equal(sd["lm_head.weight"], sd[next(k for k in sd if k.endswith("wte.weight") or "embed_tokens" in k)])
        assert "lm_head.weight" not in merged_weights(model, drop_keys={"lm_head.weight"})
    plain = _model(cfg, seed=123)
    plain.load_state_dict(sd, strict=True)
    with torch.no_grad():
        lp_plain = token_logprobs(plain, ids, attn)
        lp_base = token_logprobs(_model(cfg), ids, attn)
    assert (lp_peft - lp_base).abs().max() > 1e-3  # training moved the policy, so the check below means something
    assert torch.allclose(lp_plain, lp_peft, atol=1e-5), (lp_plain - lp_peft).abs().max()


def test_merged_weights_leave_live_model_unchanged():
    model = apply_lora(_model(_config("llama")), _lora())
    _train(model, steps=2)
    live = {k: v.clone() for k, v in model.state_dict().items()}
    ids, attn = _batch()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attn).logits
    sd = merged_weights(model, device=None)
    for v in sd.values():
        v.add_(1.0)  # returned tensors are copies: writing to them cannot reach the model
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, attention_mask=attn).logits, out)
    assert all(torch.equal(v, live[k]) for k, v in model.state_dict().items())


def test_gather_is_called_one_module_at_a_time():
    model = apply_lora(_model(_config("qwen2")), _lora(targets=["q_proj"]))
    calls: list[list[torch.nn.Parameter]] = []

    @contextlib.contextmanager
    def gather(params):
        calls.append(params)
        yield

    names = [k for k, _ in iter_merged_weights(model, gather=gather)]
    q = [c for c in calls if len(c) == 4]  # a LoRA layer: base weight, bias, A, B together
    assert len(q) == 2 and all(sum(p.requires_grad for p in c) == 2 for c in q)
    assert max(len(c) for c in calls) == 4 and all(c for c in calls)
    gathered = {id(p) for c in calls for p in c}
    assert gathered == {id(p) for p in model.parameters()}
    assert names == list(_model(_config("qwen2")).state_dict())


def test_adapter_state_round_trip(tmp_path):
    from peft import PeftModel

    cfg = _config("qwen2")
    model = apply_lora(_model(cfg), _lora())
    _train(model)
    sd = adapter_state_dict(model)
    assert set(sd) == {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(".lora_" in k and k.startswith("base_model.model.") for k in sd)

    fresh = apply_lora(_model(cfg), _lora())
    assert not torch.equal(merged_weights(fresh)["model.layers.0.self_attn.q_proj.weight"],
                           merged_weights(model)["model.layers.0.self_attn.q_proj.weight"])
    load_adapter_state_dict(fresh, sd)
    ids, attn = _batch()
    with torch.no_grad():
        assert torch.equal(token_logprobs(fresh, ids, attn), token_logprobs(model, ids, attn))
    assert all(torch.equal(a, b) for a, b in zip(merged_weights(fresh).values(), merged_weights(model).values()))

    with pytest.raises(ValueError, match="missing"):
        load_adapter_state_dict(fresh, {k: v for i, (k, v) in enumerate(sd.items()) if i})
    bad = dict(sd)
    k0 = next(iter(bad))
    bad[k0] = bad[k0][:1]
    with pytest.raises(ValueError, match="shape"):
        load_adapter_state_dict(fresh, bad)

    save_adapter(model, str(tmp_path / "adapter"))
    loaded = PeftModel.from_pretrained(_model(cfg), str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        assert torch.allclose(token_logprobs(loaded, ids, attn), token_logprobs(model, ids, attn), atol=1e-6)


def test_save_merged_hf_folder(tmp_path):
    """What the learner's save_pretrained does under LoRA: the HF model inside the wrapper writes the
    merged weights; the folder loads as a plain model that scores like the trained policy."""
    from transformers import AutoModelForCausalLM

    cfg = _config("qwen2", tied=True)
    model = apply_lora(_model(cfg), _lora())
    _train(model)
    unwrap_base(model).save_pretrained(str(tmp_path), state_dict=merged_weights(model, drop_keys={"lm_head.weight"}))
    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert not any("lora" in k or "base_layer" in k for k in plain.state_dict())
    ids, attn = _batch()
    with torch.no_grad():
        assert torch.allclose(token_logprobs(plain, ids, attn), token_logprobs(model, ids, attn), atol=1e-5)


def test_bf16_merge_matches_fp32_merge():
    model = apply_lora(_model(_config("qwen2")), _lora())
    _train(model)
    fp32 = merged_weights(model)
    model.to(torch.bfloat16)  # what DeepSpeed does to the module under bf16
    bf16 = merged_weights(model)
    assert all(v.dtype == torch.bfloat16 for v in bf16.values())
    for k, v in bf16.items():
        assert torch.allclose(v.float(), fp32[k], rtol=1e-2, atol=1e-2), k


def test_target_errors(caplog):
    cfg = _config("qwen2")
    with pytest.raises(ValueError, match=r"model\.lora\.target_modules=\['qproj', 'vproj'\] matches no module.*q_proj"):
        apply_lora(_model(cfg), _lora(targets=["qproj", "vproj"]))
    with pytest.raises(ValueError, match=r"model\.lora\.target_modules: 'mlp' matches model\.layers\.0\.mlp .*not a linear"):
        apply_lora(_model(cfg), _lora(targets=["mlp"]))
    with pytest.raises(ValueError, match=r"'embed_tokens' matches model\.embed_tokens \(Embedding\)"):
        apply_lora(_model(cfg), _lora(targets=["embed_tokens"]))
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        apply_lora(_model(_config("qwen2", tied=True)), _lora(targets=["q_proj", "lm_head"]))
    with pytest.raises(ValueError, match="rank must be > 0"):
        apply_lora(_model(cfg), _lora(rank=0))
    with caplog.at_level(logging.WARNING, logger="agentrl.engines.lora"):
        model = apply_lora(_model(cfg), _lora(targets=["q_proj", "qkv_proj"]))
    assert "['qkv_proj'] match no module" in caplog.text
    assert sum(p.requires_grad for p in model.parameters()) == 2 * 2


def test_rejects_unsupported_lora_layers():
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    model = get_peft_model(_model(_config("qwen2")), PeftLoraConfig(r=2, target_modules=["embed_tokens", "q_proj"]))
    with pytest.raises(ValueError, match=r"model\.embed_tokens: LoRA layer Embedding over Embedding is not supported"):
        merged_weights(model)
    dora = get_peft_model(_model(_config("qwen2")), PeftLoraConfig(r=2, target_modules=["q_proj"], use_dora=True))
    with pytest.raises(ValueError, match="variant"):
        merged_weights(dora)
    with pytest.raises(ValueError, match="not a peft"):
        adapter_state_dict(_model(_config("qwen2")))


@pytest.mark.parametrize("checkpoint_first", [True, False])
def test_adapter_gradients_with_layer_checkpointing(checkpoint_first):
    """The learner's ``learner.gradient_checkpointing`` (HF non-reentrant recompute in an eval-mode
    model) with LoRA, enabled before or after wrapping: the adapters get the gradients they get
    without it (frozen embeddings: nothing upstream requires grad, which reentrant checkpointing
    would need peft's ``enable_input_require_grads`` hook for)."""
    from agentrl.engines.deepspeed_setup import enable_layer_checkpointing

    ids, attn = _batch()
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))

    def grads(checkpointing: bool) -> dict[str, torch.Tensor]:
        base = _model(_config("qwen2"))
        if checkpointing and checkpoint_first:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model = apply_lora(base, _lora())
        _train(model, steps=1)  # B != 0, so A gets a gradient too
        if checkpointing and not checkpoint_first:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if checkpointing:
            enable_layer_checkpointing(model)
        calls = []
        base.model.layers[0].self_attn.q_proj.register_forward_hook(lambda *_: calls.append(1))
        (token_logprobs(model, ids, attn) * weights).sum().backward()
        assert len(calls) == (2 if checkpointing else 1)  # the recompute in backward really ran
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    plain, ckpt = grads(False), grads(True)
    assert plain.keys() == ckpt.keys() and all(g.abs().sum() > 0 for g in plain.values())
    assert all(torch.allclose(plain[k], ckpt[k], atol=1e-6) for k in plain)
