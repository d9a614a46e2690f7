"""agentrl.engines.memory_estimate: parameter counts against real models, the ZeRO model-state
rules by hand, the activation formula against what autograd saves, DeepSpeed's own estimator."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentrl.engines.memory_estimate import (
    MAX_LOGIT_ELEMENTS,
    ModelDims,
    decoder_saved_bytes,
    estimate_for_config,
    estimate_learner_memory,
    logit_elements,
    lora_target_names,
    model_states,
)
from agentrl.engines.memory_vs_deepspeed import compare_with_deepspeed

# Public config.json dimensions (Hugging Face model cards' configs) and their published parameter counts.
PUBLIC = {
    "Qwen2.5-0.5B": (dict(model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                          num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
                     494_032_768),
    "Qwen3-4B": (dict(model_type="qwen3", hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128, intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True), 4_022_468_096),
    "Qwen2.5-7B": (dict(model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                        num_key_value_heads=4, intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
                   7_615_616_512),
    "Llama-3.1-8B": (dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                          num_key_value_heads=8, intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False),
                     8_030_261_248),
    "Llama-3.1-70B": (dict(model_type="llama", hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                           num_key_value_heads=8, intermediate_size=28672, vocab_size=128256, tie_word_embeddings=False),
                      70_553_706_496),
}


def _tiny(kind: str, **extra):
    """A random tiny HF causal LM (transformers config object, model)."""
    import transformers

    prefix = {"qwen2": "Qwen2", "llama": "Llama", "qwen3": "Qwen3", "mistral": "Mistral"}[kind]
    config_cls, model_cls = f"{prefix}Config", f"{prefix}ForCausalLM"
    kw = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=176,
              vocab_size=300)
    kw.update(extra)
    cfg = getattr(transformers, config_cls)(**kw)
    return cfg, getattr(transformers, model_cls)(cfg)


# ---------------------------------------------------------------------------- parameter counts
@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_n_params_of_public_configs(name):
    cfg, published = PUBLIC[name]
    assert ModelDims.from_hf_config(cfg).n_params == published


@pytest.mark.parametrize("kind,extra", [
    ("qwen2", dict(tie_word_embeddings=True)),
    ("qwen2", dict(tie_word_embeddings=False)),
    ("llama", dict(tie_word_embeddings=True)),
    ("llama", dict(tie_word_embeddings=False)),
    ("llama", dict(tie_word_embeddings=False, attention_bias=True, mlp_bias=True, num_key_value_heads=4)),
    ("llama", dict(tie_word_embeddings=False, head_dim=24)),
    ("qwen3", dict(tie_word_embeddings=True, head_dim=32)),
    ("mistral", dict(tie_word_embeddings=False)),
])
def test_n_params_equals_a_real_models_count(kind, extra):
    pytest.importorskip("transformers")
    cfg, model = _tiny(kind, **extra)
    dims = ModelDims.from_hf_config(cfg.to_dict())
    assert dims.n_params == sum(p.numel() for p in model.parameters())
    assert dims.largest_layer_params == max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())


def test_value_model_and_lora_counts():
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForTokenClassification

    cfg, model = _tiny("qwen2", tie_word_embeddings=False)
    dims = ModelDims.from_hf_config(cfg.to_dict())
    cfg.num_labels = 1
    critic = AutoModelForTokenClassification.from_config(cfg)
    assert dims.value_model_params() == sum(p.numel() for p in critic.parameters())
    for targets in (["q_proj", "v_proj"], ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]):
        peft_model = get_peft_model(_tiny("qwen2")[1], LoraConfig(r=4, lora_alpha=8, target_modules=targets))
        trained = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        assert dims.lora_params(4, targets) == trained
    assert dims.lora_params(4, "all-linear") == dims.lora_params(4) and dims.lora_params(0) == 0


def test_repository_tiny_model_dir():
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "agentrl" / "assets" / "tiny-agent"
    dims = ModelDims.from_pretrained_dir(path)
    assert (dims.hidden, dims.layers, dims.vocab, dims.tied_embeddings) == (192, 4, 640, True)
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    assert dims.n_params == sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(path).parameters())


def test_unknown_model_type_is_refused():
    with pytest.raises(ValueError, match="gpt2"):
        ModelDims.from_hf_config({"model_type": "gpt2", "hidden_size": 8})


# ---------------------------------------------------------------------------- model states by hand
PSI, LARGEST, BUCKET = 1200, 50, 100  # trained parameters, largest layer, reduce-bucket elements


def _states(p, stage, n, off=False, off_params=False, frozen=0, trained=PSI, sub_group=10**9):
    dev, host = model_states(trained, frozen, p=p, zero_stage=stage, num_ranks=n, offload_optimizer=off,
                             offload_params=off_params, largest_layer_params=LARGEST, reduce_bucket_elements=BUCKET,
                             sub_group_size=sub_group)
    return {k: v for k, v in dev.items() if v}, {k: v for k, v in host.items() if v}


@pytest.mark.parametrize("p,stage,n,device", [
    # fp32, one rank, no ZeRO: the classic 16 bytes per parameter (4 weights + 4 grads + 8 moments)
    (4, 0, 1, dict(parameters=4800, gradients=4800, optimizer=9600)),
    # bf16 stage 0 (FP16_UnfusedOptimizer): fp32 copies of weights and of gradients; N > 1 adds the all-reduce buffer
    (2, 0, 1, dict(parameters=2400, master_fp32=4800, gradients=2400, fp32_grads=4800, optimizer=9600)),
    (2, 0, 4, dict(parameters=2400, master_fp32=4800, gradients=2400, fp32_grads=4800, optimizer=9600, zero_buffers=200)),
    # stage 1: the optimizer's side (fp32 copy, fp32 gradients, moments) / N
    (2, 1, 1, dict(parameters=2400, master_fp32=4800, gradients=2400, fp32_grads=4800, optimizer=9600, zero_buffers=200)),
    (2, 1, 2, dict(parameters=2400, master_fp32=2400, gradients=2400, fp32_grads=2400, optimizer=4800, zero_buffers=200)),
    (2, 1, 4, dict(parameters=2400, master_fp32=1200, gradients=2400, fp32_grads=1200, optimizer=2400, zero_buffers=200)),
    (4, 1, 2, dict(parameters=4800, master_fp32=2400, gradients=4800, fp32_grads=2400, optimizer=4800, zero_buffers=400)),
    # stage 2: + gradients / N
    (2, 2, 2, dict(parameters=2400, master_fp32=2400, gradients=1200, fp32_grads=2400, optimizer=4800, zero_buffers=200)),
    (2, 2, 4, dict(parameters=2400, master_fp32=1200, gradients=600, fp32_grads=1200, optimizer=2400, zero_buffers=200)),
    (4, 2, 4, dict(parameters=4800, master_fp32=1200, gradients=1200, fp32_grads=1200, optimizer=2400, zero_buffers=400)),
    # stage 3: + parameters / N, one layer gathered (params + grads); fp32 needs no separate master copy
    (2, 3, 1, dict(parameters=2400, master_fp32=4800, gradients=2400, fp32_grads=4800, optimizer=9600, zero3_gathered=200,
                   zero_buffers=200)),
    (2, 3, 4, dict(parameters=600, master_fp32=1200, gradients=600, fp32_grads=1200, optimizer=2400, zero3_gathered=200,
                   zero_buffers=200)),
    (4, 3, 2, dict(parameters=2400, gradients=2400, fp32_grads=2400, optimizer=4800, zero3_gathered=400, zero_buffers=400)),
])
def test_model_states_by_hand(p, stage, n, device):
    dev, host = _states(p, stage, n)
    assert dev == device and host == {}


def test_offload_moves_the_optimizer_side_to_the_host():
    # stage 1: gradients stay whole on the device; the pinned bf16 staging copy of the partition is on the host
    assert _states(2, 1, 2, off=True) == (dict(parameters=2400, gradients=2400, zero_buffers=200),
                                          dict(master_fp32=2400, fp32_grads=2400, optimizer=4800, offload_staging=1200))
    # stage 2: reduced gradient partitions go straight to the host buffer
    assert _states(2, 2, 4, off=True) == (dict(parameters=2400, zero_buffers=200),
                                          dict(master_fp32=1200, fp32_grads=1200, optimizer=2400, offload_staging=600))
    # stage 3 (fp32 too: the host copy is the master), + offload_params: the parameter partition on the host
    assert _states(4, 3, 2, off=True) == (dict(parameters=2400, zero3_gathered=400, zero_buffers=400),
                                          dict(master_fp32=2400, fp32_grads=2400, optimizer=4800))
    assert _states(2, 3, 4, off=True, off_params=True) == (
        dict(zero3_gathered=200, zero_buffers=200), dict(parameters=600, master_fp32=1200, fp32_grads=1200, optimizer=2400))


def test_stage3_converts_fp32_gradients_one_sub_group_at_a_time():
    assert _states(2, 3, 1, sub_group=500)[0]["fp32_grads"] == 2000
    assert _states(2, 3, 1, sub_group=500, off=True)[1]["fp32_grads"] == 4800  # the host buffer is whole


def test_lora_trains_only_the_adapters():
    # 10,000 frozen base parameters + 120 adapter parameters, bf16
    dev, host = _states(2, 1, 2, frozen=10_000, trained=120)
    assert dev == dict(parameters=20_240, master_fp32=240, gradients=240, fp32_grads=240, optimizer=480, zero_buffers=200)
    dev, _ = _states(2, 3, 4, frozen=10_000, trained=120)
    assert dev == dict(parameters=5060, master_fp32=120, gradients=60, fp32_grads=120, optimizer=240, zero3_gathered=100,
                       zero_buffers=200)  # the gathered layer has no gradient


def test_invalid_combinations():
    with pytest.raises(ValueError, match="offload_optimizer"):
        _states(2, 0, 1, off=True)
    with pytest.raises(ValueError, match="offload_params"):
        _states(2, 2, 1, off=True, off_params=True)
    with pytest.raises(ValueError, match="dtype"):
        estimate_learner_memory(ModelDims.from_hf_config(PUBLIC["Qwen2.5-0.5B"][0]), dtype="int8", micro_batch_tokens=8)


def test_the_gpu_sizing_table_is_the_estimate():
    """docs/gpu.md's "Sizing the learner" table, row by row, is what the estimate gives for its
    stated settings (bf16, ZeRO-3, the reference, one packed 16k-token micro-batch,
    flash_attention_2): a change to the estimate that leaves the table stale fails here."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "gpu.md").read_text(encoding="utf-8")
    num = r" \| ([\d.]+)"
    rows = re.findall(r"^\| ((?:Qwen3|Llama)[^|]+) \| (\d+) \| ([^|]+)" + 5 * num + r" \|$", doc, flags=re.M)
    assert len(rows) == 13
    gib = 1024**3
    for name, ranks, levers, states, ref, acts, total, host in rows:
        lora = re.search(r"model\.lora\.rank=(\d+)", levers)
        e = estimate_learner_memory(ModelDims.from_hf_config(PUBLIC[name][0]), dtype="bfloat16", zero_stage=3,
                                    num_ranks=int(ranks), micro_batch_tokens=16384, seq_len=16384, with_reference=True,
                                    gradient_checkpointing="gradient_checkpointing" in levers,
                                    offload_optimizer="offload_optimizer" in levers,
                                    lora_rank=int(lora[1]) if lora else 0, attn_implementation="flash_attention_2")
        d = e.device
        model_states_gib = sum(v for k, v in d.items() if k not in ("reference", "activations", "logits")) / gib
        got = (model_states_gib, d.get("reference", 0) / gib, (d["activations"] + d["logits"]) / gib,
               e.total_device / gib, e.total_host / gib)
        want = tuple(float(x) for x in (states, ref, acts, total, host))
        assert all(abs(g - w) <= 0.051 for g, w in zip(got, want)), (name, ranks, levers, want, [round(g, 1) for g in got])


# ---------------------------------------------------------------------------- DeepSpeed's estimator
@pytest.mark.parametrize("name", ["Qwen2.5-0.5B", "Qwen3-4B", "Llama-3.1-8B", "Llama-3.1-70B"])
def test_zero3_model_states_match_deepspeeds_estimator(name):
    pytest.importorskip("deepspeed")
    dims = ModelDims.from_hf_config(PUBLIC[name][0])
    for gpus, nodes in ((1, 1), (8, 1), (8, 8)):
        for offload, offload_params in ((False, False), (True, False), (True, True)):
            c = compare_with_deepspeed(dims, zero_stage=3, num_gpus_per_node=gpus, num_nodes=nodes,
                                       offload_optimizer=offload, offload_params=offload_params)
            assert 0.8 <= c.device_ratio <= 1.2, (name, gpus, nodes, offload, offload_params, c)
            assert 0.8 <= c.host_ratio <= 1.2, (name, gpus, nodes, offload, offload_params, c)
        c = compare_with_deepspeed(dims, zero_stage=2, num_gpus_per_node=gpus, num_nodes=nodes)
        assert c.ours_device == c.ds_device  # 2 Psi + 18 Psi / N, term for term


# ---------------------------------------------------------------------------- activations
@pytest.fixture(autouse=True)
def _torch_linear(monkeypatch):
    """torch's own F.linear: a ZeRO-3 engine built earlier in this process (tests/test_learner.py)
    leaves DeepSpeed's memory-efficient linear in its place for good (ZeRO-3's
    ``memory_efficient_linear``), which saves different tensors for backward."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.nn.functional, "linear", torch._C._nn.linear)


def _saved_bytes(decoder, **inputs) -> int:
    """Bytes of the distinct storages autograd saves in a forward (parameters excluded)."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in decoder.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        decoder(**inputs, use_cache=False)
    return sum(seen.values())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("ckpt", [False, True])
@pytest.mark.parametrize("kind,extra", [("qwen2", {}), ("llama", dict(head_dim=24, num_key_value_heads=4))])
def test_decoder_activations_match_what_autograd_saves(dtype, attn, ckpt, kind, extra):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    cfg, model = _tiny(kind, hidden_size=96, num_hidden_layers=3, intermediate_size=256, attn_implementation=attn, **extra)
    model = model.to(getattr(torch, dtype)).eval()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()  # HF checkpoints only layers in training mode (no dropout in these configs)
    rows, seq = 3, 80
    ids = torch.randint(0, cfg.vocab_size, (rows, seq))
    mask = torch.ones_like(ids)
    mask[0, -9:] = 0  # a padded row: transformers materializes the mask
    got = _saved_bytes(model.model, input_ids=ids, attention_mask=mask)
    if ckpt and attn == "sdpa":
        got += rows * seq * seq  # the bool mask: kept by the checkpoints for their recompute, unseen by the hooks
    p = 4 if dtype == "float32" else 2
    est = decoder_saved_bytes(ModelDims.from_hf_config(cfg.to_dict()), p, rows * seq, seq, gradient_checkpointing=ckpt,
                              attn_implementation=attn)
    assert est == pytest.approx(got, rel=0.05)


def test_lora_activations_match_what_autograd_saves():
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    all_linear = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    # MLP-only adapters: the first layer's attention keeps nothing (nothing before it needs a gradient), an
    # edge effect of 1/layers the estimate leaves out; 8 layers keep it under the tolerance
    for targets, layers in ((all_linear, 2), (["q_proj", "v_proj"], 2), (["gate_proj", "up_proj"], 8)):
        cfg, model = _tiny("qwen2", hidden_size=96, num_hidden_layers=layers, intermediate_size=256)
        dims = ModelDims.from_hf_config(cfg.to_dict())
        # adapters are added in fp32, then everything is cast to bf16, as DeepSpeed does to the learner's module
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=16, target_modules=targets)).to(torch.bfloat16).eval()
        ids = torch.randint(0, cfg.vocab_size, (2, 64))
        mask = torch.ones_like(ids)
        mask[1, -5:] = 0
        got = _saved_bytes(model.base_model.model.model, input_ids=ids, attention_mask=mask)
        got += 4 * dims.hidden * 128  # the first layer's input norm keeps nothing (the frozen embedding needs no gradient)
        est = decoder_saved_bytes(dims, 2, 128, 64, lora_rank=16, lora_targets=lora_target_names(targets))
        assert est == pytest.approx(got, rel=0.05), targets


def test_logits_are_chunked_at_2_pow_26_elements():
    dims = ModelDims.from_hf_config(PUBLIC["Qwen2.5-0.5B"][0])
    chunk = MAX_LOGIT_ELEMENTS // dims.vocab  # 441 scored positions of 151,936 logits
    assert logit_elements(dims, 8 * 4096, 4096) == chunk * dims.vocab <= MAX_LOGIT_ELEMENTS
    assert logit_elements(dims, 300, 100) == 300 * dims.vocab  # fewer tokens than a chunk: all at once
    # the head runs on gathered positions: the rows' layout does not matter
    assert logit_elements(dims, 1024 * 64, 64) == logit_elements(dims, 1024 * 64, 1024 * 64)


# ---------------------------------------------------------------------------- the whole estimate
def _est(dims=None, **kw):
    dims = dims or ModelDims.from_hf_config(PUBLIC["Qwen2.5-0.5B"][0])
    args = dict(dtype="bfloat16", zero_stage=1, num_ranks=1, micro_batch_tokens=8 * 1024, seq_len=1024)
    args.update(kw)
    return estimate_learner_memory(dims, **args)


def test_gradient_checkpointing_lowers_the_activations():
    plain, ckpt = _est(), _est(gradient_checkpointing=True)
    assert ckpt.device["activations"] < plain.device["activations"] / 4
    assert ckpt.device["logits"] == plain.device["logits"]
    assert ckpt.total_device < plain.total_device


def test_more_ranks_less_per_rank_at_stage3():
    totals = [_est(zero_stage=3, num_ranks=n).total_device for n in (1, 2, 4, 8, 16)]
    assert all(a > b for a, b in zip(totals, totals[1:]))
    stage1 = [_est(zero_stage=1, num_ranks=n).device["parameters"] for n in (1, 8)]
    assert stage1[0] == stage1[1]  # stage 1 never partitions the parameters


def test_optional_models_and_offload():
    dims = ModelDims.from_hf_config(PUBLIC["Llama-3.1-8B"][0])
    base = _est(dims)
    full = _est(dims, with_reference=True, with_critic=True, with_policy_copy=True)
    assert full.device["reference"] == 2 * dims.n_params
    assert full.device["policy_copy"] == 16 * dims.n_params
    critic_states = sum(model_states(dims.value_model_params(), 0, p=2, zero_stage=1, num_ranks=1)[0].values())
    assert full.device["critic"] == critic_states
    # the policy copy computes as the policy does: its pass costs no more than the policy's
    assert full.device["activations"] == base.device["activations"] and full.device["logits"] == base.device["logits"]
    # ... at the policy's compute dtype and checkpointing also when the weights are fp32 (bf16 autocast)
    mixed = dict(dtype="float32", autocast="bfloat16", gradient_checkpointing=True)
    mixed_copy, mixed_base = _est(dims, with_policy_copy=True, **mixed), _est(dims, **mixed)
    assert mixed_copy.device["activations"] == mixed_base.device["activations"]
    assert mixed_copy.device["logits"] == mixed_base.device["logits"]
    assert mixed_copy.device["activations"] < _est(dims, dtype="float32", with_policy_copy=True).device["activations"] / 4
    # fp16 compute leaves the copy in fp32 (it has no loss scaler): its pass costs more than the policy's
    fp16_copy, fp16_base = _est(dims, dtype="float16", with_policy_copy=True), _est(dims, dtype="float16")
    assert fp16_copy.device["activations"] > fp16_base.device["activations"]
    assert fp16_copy.device["logits"] == fp16_base.device["logits"]  # the head chunk is sized for fp32 logits either way
    lora_copy = _est(dims, lora_rank=16, with_policy_copy=True)  # ... but it is a full model: no LoRA savings
    assert lora_copy.device["activations"] > _est(dims, lora_rank=16).device["activations"]
    off = _est(dims, offload_optimizer=True)
    assert off.total_device < base.total_device and off.total_host > base.total_host == 0
    assert base.init_host == 4 * dims.n_params  # every rank loads the policy in fp32 on the host
    lora = _est(dims, lora_rank=16, with_reference=True)
    assert lora.inputs["lora_params"] == dims.lora_params(16)
    # with LoRA the reference is the policy with its adapters off: no second copy
    assert lora.device["optimizer"] == 8 * dims.lora_params(16) and "reference" not in lora.device
    z3 = _est(dims, with_reference=True, zero_stage=3, num_ranks=8)  # partitioned like the policy
    assert z3.device["reference"] == 2 * dims.n_params / 8
    offloaded = _est(dims, with_reference=True, zero_stage=3, num_ranks=8, offload_params=True)
    assert offloaded.host["reference"] == 2 * dims.n_params / 8
    table = full.table()
    assert "reference" in table and "total" in table and "host at load" in table
    assert full.fits(10**13) and not full.fits(10**9)


def test_estimate_for_config():
    from pathlib import Path

    from agentrl.config.schema import Config

    path = str(Path(__file__).resolve().parents[1] / "agentrl" / "assets" / "tiny-agent")
    cfg = Config.model_validate({"model": {"path": path, "dtype": "bfloat16"},
                                 "learner": {"zero_stage": 2, "num_ranks": 2, "micro_batch_size": 4},
                                 "rollout": {"max_episode_tokens": 512}})
    est = estimate_for_config(cfg)
    assert est.inputs["micro_batch_tokens"] == 4 * 512 and est.inputs["seq_len"] == 512
    assert "reference" in est.device and "critic" not in est.device  # default kl_coef > 0, GRPO
    ppo = cfg.model_copy(update={"algo": cfg.algo.model_copy(update={"advantage": "ppo", "kl_coef": 0.0,
                                                                      "critic": cfg.algo.critic or _critic()})})
    est = estimate_for_config(ppo)
    assert "critic" in est.device and "reference" not in est.device
    packed = cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"packing": True,
                                                                              "max_tokens_per_micro_batch": 3000})})
    assert estimate_for_config(packed).inputs["seq_len"] == 3000  # one packed row


def _critic():
    from agentrl.config.schema import CriticConfig

    return CriticConfig()


def test_module_is_torch_free():
    code = ("import sys, agentrl.engines.memory_estimate as m; "
            "m.estimate_learner_memory(m.ModelDims.from_pretrained_dir('agentrl/assets/tiny-agent'), micro_batch_tokens=64); "
            "assert not {'torch', 'deepspeed', 'transformers'} & set(sys.modules), sorted(sys.modules)")
    from pathlib import Path

    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
