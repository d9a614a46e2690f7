"""Per-rank memory estimate of the DeepSpeed learner, for a pre-flight check that a model fits.

Pure python: no torch, DeepSpeed or transformers import at module level (the planner may run where
none is installed; ``agentrl.algos.registry`` is torch-free). The check of the model states against
DeepSpeed's own estimators is ``engines/memory_vs_deepspeed.py``.

What lives on a learner rank (``engines/deepspeed_learner.py``) and how it is counted here, with
Psi the trained parameters, N = ``learner.num_ranks``, p the bytes of the training dtype (fp32 4,
bf16/fp16 2):

* the policy's DeepSpeed engine: *model states* (parameters, the fp32 copy the optimizer updates,
  gradients, AdamW's two fp32 moments) under the ZeRO partitioning rules (``model_states``), plus
  ZeRO's reduce bucket and, at stage 3, one gathered layer;
* a frozen reference model in the training dtype when ``algo.kl_coef > 0``: a plain module at
  ZeRO 0-2, partitioned like the policy's parameters at ZeRO-3 (and offloaded with them), none
  with LoRA (the reference is the policy with its adapters off);
* a PPO critic when the estimator needs one: a second DeepSpeed engine with its own model states
  (the value model = the causal LM without its LM head, plus a [hidden, 1] score head);
* a policy copy some methods keep (``Method.keeps_policy_copy``): a plain-torch fp32 copy of the
  policy with its own AdamW, e.g. an exploration policy derived from it; it computes as the
  policy does (its gradient checkpointing, without LoRA; bf16 when the policy computes in bf16,
  else fp32);
* activations of one micro-batch (``decoder_saved_bytes``, ``logits_bytes``).

Model states per rank follow DeepSpeed 0.19's optimizers (read in ``runtime/fp16/unfused_optimizer.py``,
``runtime/zero/stage_1_and_2.py``, ``runtime/zero/stage3.py``); in bytes, with full fine-tuning:

=======================  =============  ==================  ===============  ===================
term                     stage 0        stage 1             stage 2          stage 3
=======================  =============  ==================  ===============  ===================
parameters (dtype p)     p Psi          p Psi               p Psi            p Psi / N
fp32 master copy         4 Psi if p<4   4 Psi / N           4 Psi / N        4 Psi / N if p<4
gradients (dtype p)      p Psi          p Psi               p Psi / N        p Psi / N
fp32 gradient copy       4 Psi if p<4   4 Psi / N           4 Psi / N        4 min(Psi/N, 1e9)
AdamW moments (fp32)     8 Psi          8 Psi / N           8 Psi / N        8 Psi / N
=======================  =============  ==================  ===============  ===================

Stage 0 in bf16/fp16 is DeepSpeed's ``FP16_UnfusedOptimizer`` (fp32 copies of every weight and, at
the step, of every gradient). ZeRO-1/2 clone their fp32 partition and flatten its gradient into a
new fp32 buffer even when training in fp32; ZeRO-3 in fp32 updates its partition in place, and
converts gradients one sub-group (``sub_group_size``, 1e9 elements) at a time. The 16 bytes per
parameter of mixed-precision Adam (2 + 2 + 12) of the ZeRO paper (Rajbhandari et al. 2020) are the
stage-0 bf16 row without the fp32 gradient copy.

Offload (``offload_optimizer``, ZeRO-Offload) moves the fp32 copy, the fp32 gradients and the
moments to host memory; at stages 2-3 the reduced gradient partitions go straight to that host
buffer (no device gradients), and stages 1-2 keep a pinned p-byte staging copy of the partition on
the host. ``offload_params`` (stage 3) keeps the p-byte parameter partition on the host too.

LoRA: only the adapters (Psi = ``lora_params``) have gradients and optimizer state; the frozen
base stays in the training dtype on every rank (partitioned only at stage 3).

Not counted: the CUDA context and allocator fragmentation (leave headroom, see ``fits``),
DeepSpeed's stage-3 prefetch of layers beyond the one gathered, NCCL buffers, the step's token
tensors. Each term is an estimate to about +-20 %, meant to say "fits / does not fit", not to
replace a measurement (``benchmarks/learner_memory.py``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Mapping

from agentrl.algos.registry import estimator_for

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# hf_policy.DEFAULT_MAX_LOGIT_ELEMENTS (not imported: that module imports torch)
MAX_LOGIT_ELEMENTS = 1 << 26
# DeepSpeed's ZeRO defaults (deepspeed/runtime/zero/config.py)
REDUCE_BUCKET_ELEMENTS = 500_000_000
SUB_GROUP_SIZE = 1_000_000_000
LORA_ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# model types whose config.json this module reads (decoders of the Llama family)
KNOWN_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")
GiB = 1 << 30


@dataclass(frozen=True)
class ModelDims:
    """Dimensions of a Llama-family decoder (Qwen2/Qwen3/Llama/Mistral) and its parameter count.

    ``n_params`` counts every distinct parameter once (a tied LM head is the embedding). Build it
    with ``from_hf_config`` (a ``config.json`` dict) or ``from_pretrained_dir``, which compute
    ``n_params`` from the dimensions (``count_params``)."""

    n_params: int
    hidden: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int
    intermediate: int
    tied_embeddings: bool
    head_dim: int = 0  # 0 = hidden // heads
    qkv_bias: bool = False  # Qwen2: q/k/v projections have biases
    o_bias: bool = False  # Llama attention_bias=true: o_proj too
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm of each head's q and k
    model_type: str = "llama"

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def _linears(self) -> dict[str, tuple[int, int, bool]]:
        """One decoder layer's linear layers: name -> (in_features, out_features, bias)."""
        h, q, kv, inter = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        return {"q_proj": (h, q, self.qkv_bias), "k_proj": (h, kv, self.qkv_bias), "v_proj": (h, kv, self.qkv_bias),
                "o_proj": (q, h, self.o_bias), "gate_proj": (h, inter, self.mlp_bias), "up_proj": (h, inter, self.mlp_bias),
                "down_proj": (inter, h, self.mlp_bias)}

    def layer_params(self) -> int:
        """Parameters of one decoder layer: its 7 linears (+ biases), 2 RMSNorms (+ q/k norms)."""
        linears = sum(i * o + (o if b else 0) for i, o, b in self._linears().values())
        return linears + 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)

    def count_params(self) -> int:
        """embedding V h + layers x ``layer_params`` + final norm h + (untied) LM head V h."""
        emb = self.vocab * self.hidden
        return emb + self.layers * self.layer_params() + self.hidden + (0 if self.tied_embeddings else emb)

    @property
    def largest_layer_params(self) -> int:
        """Parameters of the largest single module (its own, not its children's), as DeepSpeed's
        ``model_to_params`` counts them: the embedding (V h) for every model of this family but
        the smallest-vocabulary ones."""
        linears = [i * o + (o if b else 0) for i, o, b in self._linears().values()]
        return max([self.vocab * self.hidden, *linears])

    def value_model_params(self) -> int:
        """Parameters of the PPO critic built from this model (``AutoModelForTokenClassification``,
        num_labels=1): the backbone without an untied LM head, plus the score head [h, 1] + bias."""
        return self.n_params - (0 if self.tied_embeddings else self.vocab * self.hidden) + self.hidden + 1

    def lora_params(self, rank: int, target_modules: Any = LORA_ALL_LINEAR) -> int:
        """Adapter parameters of LoRA rank r on ``target_modules`` (``lora_target_names``):
        r (in + out) per adapted linear per layer. 0 when r = 0."""
        if rank <= 0:
            return 0
        targets = lora_target_names(target_modules)
        return self.layers * sum(rank * (i + o) for name, (i, o, _) in self._linears().items() if name in targets)

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> "ModelDims":
        """From a HF ``config.json`` dict of a Qwen2/Qwen3/Llama/Mistral model (keys hidden_size,
        num_hidden_layers, vocab_size, num_attention_heads, num_key_value_heads, intermediate_size,
        tie_word_embeddings, head_dim, attention_bias, mlp_bias); ``n_params`` is computed.

        Missing keys take the transformers defaults of these model classes: kv heads = heads,
        head_dim = hidden / heads, untied embeddings, no biases (Qwen2: q/k/v biases always)."""
        cfg = dict(config.get("text_config") or config)
        model_type = str(cfg.get("model_type", "llama"))
        if model_type not in KNOWN_MODEL_TYPES:
            raise ValueError(f"model_type={model_type!r} is not a decoder this estimate knows ({', '.join(KNOWN_MODEL_TYPES)})")
        heads = int(cfg["num_attention_heads"])
        attention_bias = bool(cfg.get("attention_bias", False))
        dims = cls(
            n_params=0, hidden=int(cfg["hidden_size"]), layers=int(cfg["num_hidden_layers"]), vocab=int(cfg["vocab_size"]),
            heads=heads, kv_heads=int(cfg.get("num_key_value_heads") or heads), intermediate=int(cfg["intermediate_size"]),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)), head_dim=int(cfg.get("head_dim") or 0),
            qkv_bias=model_type == "qwen2" or attention_bias, o_bias=model_type != "qwen2" and attention_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)), qk_norm=model_type == "qwen3", model_type=model_type,
        )
        return replace(dims, n_params=dims.count_params())

    @classmethod
    def from_pretrained_dir(cls, path: str | Path) -> "ModelDims":
        """``from_hf_config`` of ``path/config.json`` (a local HF model folder)."""
        return cls.from_hf_config(json.loads((Path(path) / "config.json").read_text()))


def lora_target_names(target_modules: Any = LORA_ALL_LINEAR) -> tuple[str, ...]:
    """The decoder-layer linears ``model.lora.target_modules`` adapts: names (suffixes) of q/k/v/o
    and gate/up/down, or "all-linear" (every linear but the LM head)."""
    if target_modules == "all-linear":
        return LORA_ALL_LINEAR
    return tuple(name for name in LORA_ALL_LINEAR if name in tuple(target_modules))


# ---------------------------------------------------------------------------- activations
def decoder_layer_bytes_per_token(dims: ModelDims, p: int, *, seq_len: int = 0, attn_implementation: str = "sdpa",
                                  lora_rank: int = 0, lora_targets: tuple[str, ...] = ()) -> int:
    """Bytes one HF decoder layer keeps for backward per token, in training dtype p.

    Method of Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models" (sec. 4.1): add up the tensors each op saves for its backward. Their GPT layer
    (LayerNorm, GeLU MLP of 4h, dropout, 16-bit) keeps s b h (34 + 5 a s / h) bytes; the
    transformers Llama/Qwen2 layer (RMSNorm with an fp32 upcast, SwiGLU of width I, RoPE, no
    dropout in ``eval()``) keeps, per token:

    * each of the 2 RMSNorms: its input upcast to fp32 (4 h, saved by ``pow``) and the normalized
      tensor cast back (p h, saved by the weight multiply); its output, the input of q/k/v (resp.
      gate/up), p h: 2 (4 h + 2 p h) = 8 h + 4 p h;
    * attention, ``sdpa``: q, k and v (k and v expanded to all heads by ``repeat_kv`` whenever a
      mask is passed) and the output, 4 p a d, the fp32 log-sum-exp, 4 a, and the attention mask:
      ``scaled_dot_product_attention`` converts transformers' boolean [rows, 1, T, T] mask to the
      query's dtype on every call and keeps the converted copy for backward, p T per token per
      layer for rows of T tokens. A mask is materialized whenever a row of the micro-batch is
      padded (nearly always: rows are padded to the longest) or packed (one row of N tokens: p N
      per token per layer, which dominates long packed rows). ``eager`` keeps q, k, v and the
      output too, plus the fp32 softmax and its p-byte cast, (4 + p) a T per token (4 a T in
      fp32; the s^2 term of Korthikanti et al.), and no mask;
    * the SwiGLU MLP: gate, silu(gate), up and their product, 4 p I.

    LoRA (``lora_rank`` > 0, frozen base): autograd saves only what a needed gradient uses, so the
    norms keep 4 h each (their weights are frozen), a linear's input is kept only when the
    linear is adapted (q/k/v's input if one of them is, gate/up's likewise, the product p I if
    down_proj is), and each adapter keeps its rank-r intermediate A x, p r.

    Checked against the bytes autograd actually saves (``torch.autograd.graph.saved_tensors_hooks``)
    in tests/test_memory_estimate.py. q/k norms (Qwen3) and RoPE's cos/sin are left out (< 3 %).
    """
    h, a, d = dims.hidden, dims.heads, dims.head_dim
    attn = 4 * p * a * d
    if attn_implementation == "eager":
        attn += (4 + (p if p < 4 else 0)) * a * seq_len  # in fp32 the cast is the softmax itself
    elif attn_implementation == "sdpa":
        attn += 4 * a + p * seq_len
    elif attn_implementation == "flash_attention_2":  # q, k, v, out and the fp32 log-sum-exp; no mask
        attn += 4 * a
    else:
        raise ValueError(f"attn_implementation must be sdpa, eager or flash_attention_2, got {attn_implementation!r}")
    if lora_rank <= 0:
        return 8 * h + 4 * p * h + attn + 4 * p * dims.intermediate
    targets = set(lora_targets)
    inputs = p * h * (bool(targets & {"q_proj", "k_proj", "v_proj"}) + bool(targets & {"gate_proj", "up_proj"}))
    mlp = p * dims.intermediate * (3 + ("down_proj" in targets))
    return 8 * h + inputs + attn + mlp + p * lora_rank * len(targets)


def decoder_saved_bytes(dims: ModelDims, p: int, tokens: int, seq_len: int, *, gradient_checkpointing: bool = False,
                        attn_implementation: str = "sdpa", lora_rank: int = 0, lora_targets: tuple[str, ...] = ()) -> int:
    """What autograd keeps from one decoder forward of ``tokens`` tokens in rows of ``seq_len``.

    Without checkpointing, every layer's ``decoder_layer_bytes_per_token``; with HF gradient
    checkpointing, only each layer's input (p h per token per layer). Plus the final RMSNorm
    (4 h + p h per token; 4 h with a frozen LoRA base) and, for sdpa, transformers' boolean
    [rows, 1, T, T] attention mask (built once per forward when a row is padded or packed; the
    checkpoints keep it for their recompute)."""
    rows = math.ceil(tokens / seq_len)
    if gradient_checkpointing:
        per_token = dims.layers * p * dims.hidden
    else:
        per_token = dims.layers * decoder_layer_bytes_per_token(dims, p, seq_len=seq_len, attn_implementation=attn_implementation,
                                                                lora_rank=lora_rank, lora_targets=lora_targets)
    final_norm = 4 * dims.hidden + (p * dims.hidden if lora_rank <= 0 else 0)
    mask = rows * seq_len * seq_len if attn_implementation == "sdpa" else 0
    return tokens * (per_token + final_norm) + mask


def logit_elements(dims: ModelDims, tokens: int, seq_len: int, max_logit_elements: int = MAX_LOGIT_ELEMENTS) -> int:
    """Elements of the largest logits chunk the log-prob head (``engines/logprob_head.py``)
    materializes: chunk x V, with chunk = max(1, 2^26 // V) scored positions, at most the
    micro-batch's tokens (the head runs on the policy tokens only; all of them is the bound)."""
    return min(tokens, max(1, max_logit_elements // max(1, dims.vocab))) * dims.vocab


def logits_bytes(dims: ModelDims, p: int, tokens: int, seq_len: int, max_logit_elements: int = MAX_LOGIT_ELEMENTS) -> int:
    """Working set of one log-prob-head chunk of E elements (``logit_elements``), in its backward
    (the larger phase): the recomputed logits, log p, p and the logits' gradient in fp32 (16 E),
    plus the gradient cast to the compute dtype p when p < 4 (bf16 autocast). Only one chunk is
    alive at a time, and nothing of it is kept between forward and backward."""
    e = logit_elements(dims, tokens, seq_len, max_logit_elements)
    return e * (16 + (p if p < 4 else 0))


# ---------------------------------------------------------------------------- model states
def model_states(n_trained: int, n_frozen: int, *, p: int, zero_stage: int, num_ranks: int, offload_optimizer: bool = False,
                 offload_params: bool = False, largest_layer_params: int = 0,
                 reduce_bucket_elements: int = REDUCE_BUCKET_ELEMENTS,
                 sub_group_size: int = SUB_GROUP_SIZE) -> tuple[dict[str, int], dict[str, int]]:
    """(device, host) bytes per rank of one DeepSpeed engine's model states (see the module docstring's table).

    ``n_trained``: parameters with gradients (all of them, or the LoRA adapters); ``n_frozen``: the
    rest (a LoRA base), held in dtype p with no gradient or optimizer state. Device terms:
    ``parameters``, ``master_fp32``, ``gradients``, ``fp32_grads``, ``optimizer``, ``zero3_gathered``
    (stage 3: the largest layer's parameters, and gradients when it trains, gathered whole:
    2 p x largest layer, DeepSpeed's own 4 x largest layer in 16 bits) and ``zero_buffers``
    (stages 1-3: the reduce bucket, ``reduce_bucket_elements`` elements of dtype p, allocated
    whatever the model's size; stage 0 with N > 1: the all-reduce's flat buffer, up to that size).
    Offloaded terms go to the host dict under the same names (plus ``offload_staging`` at stages 1-2)."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0-3, got {zero_stage}")
    if offload_optimizer and zero_stage == 0:
        raise ValueError("offload_optimizer needs zero_stage 1-3")
    if offload_params and zero_stage != 3:
        raise ValueError("offload_params needs zero_stage 3")
    n, t = num_ranks, n_trained
    dev: dict[str, int] = {}
    host: dict[str, int] = {}
    params = p * (t + n_frozen)
    params = params // n if zero_stage == 3 else params
    (host if offload_params else dev)["parameters"] = params

    if zero_stage == 0:
        master = 4 * t if p < 4 else 0
        grads, fp32_grads = p * t, (4 * t if p < 4 else 0)
        moments = 8 * t
    else:
        shard = t / n
        master = int(4 * shard) if (zero_stage in (1, 2) or p < 4 or offload_optimizer) else 0
        grads = p * t if zero_stage == 1 else int(p * shard)
        if zero_stage == 3 and not offload_optimizer:
            fp32_grads = 4 * int(min(shard, sub_group_size))  # converted one sub-group at a time
        else:
            fp32_grads = int(4 * shard)
        if zero_stage >= 2 and offload_optimizer:
            grads = 0  # reduced partitions go straight into the host fp32 buffer
        moments = int(8 * shard)
    opt_side = host if offload_optimizer else dev
    opt_side["master_fp32"] = master
    dev["gradients"] = grads
    opt_side["fp32_grads"] = fp32_grads
    opt_side["optimizer"] = moments
    if offload_optimizer and zero_stage in (1, 2):
        host["offload_staging"] = int(p * t / n)
    if zero_stage == 3:
        dev["zero3_gathered"] = p * largest_layer_params * (2 if n_frozen == 0 else 1)
    if zero_stage >= 1:
        dev["zero_buffers"] = p * reduce_bucket_elements
    elif n > 1:
        dev["zero_buffers"] = p * min(reduce_bucket_elements, t)
    return dev, host


# ---------------------------------------------------------------------------- the estimate
DEVICE_TERMS = ("parameters", "master_fp32", "gradients", "fp32_grads", "optimizer", "zero3_gathered", "zero_buffers",
                "reference", "critic", "policy_copy", "activations", "logits")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per learner rank: ``device`` and ``host`` (steady state during training) by term,
    and ``init_host``, the host peak while the models load (every model is loaded on the host in
    fp32, or the reference in dtype p, before it moves to the device). ``inputs`` records the
    arguments, for the table."""

    device: dict[str, int]
    host: dict[str, int]
    init_host: int = 0
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def total_device(self) -> int:
        return sum(self.device.values())

    @property
    def total_host(self) -> int:
        return sum(self.host.values())

    @property
    def peak_host(self) -> int:
        """max(steady host state, the loading peak)."""
        return max(self.total_host, self.init_host)

    def fits(self, device_bytes: int, *, headroom: float = 0.9) -> bool:
        """``total_device`` <= headroom x the device's memory (the rest for the CUDA context,
        allocator fragmentation and what this estimate leaves out)."""
        return self.total_device <= headroom * device_bytes

    def table(self) -> str:
        """A short text table, GiB per rank."""
        def gib(b: int) -> str:
            return f"{b / GiB:10.2f}" if b else f"{'-':>10}"

        names = [k for k in DEVICE_TERMS if self.device.get(k) or self.host.get(k)]
        names += [k for k in {**self.device, **self.host} if k not in names and (self.device.get(k) or self.host.get(k))]
        lines = [f"{'per rank (GiB)':<16}{'device':>10}{'host':>10}"]
        lines += [f"{k:<16}{gib(self.device.get(k, 0))}{gib(self.host.get(k, 0))}" for k in names]
        lines.append(f"{'total':<16}{gib(self.total_device)}{gib(self.total_host)}")
        lines.append(f"{'host at load':<16}{'':>10}{gib(self.init_host)}")
        return "\n".join(lines)


def estimate_learner_memory(
    dims: ModelDims,
    *,
    dtype: str = "bfloat16",
    zero_stage: int = 1,
    num_ranks: int = 1,
    offload_optimizer: bool = False,
    offload_params: bool = False,
    gradient_checkpointing: bool = False,
    micro_batch_tokens: int,
    with_reference: bool = False,
    with_critic: bool = False,
    with_policy_copy: bool = False,
    lora_rank: int = 0,
    lora_params: int = 0,
    seq_len: int | None = None,
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa",
    critic_dims: ModelDims | None = None,
    lora_target_modules: Any = LORA_ALL_LINEAR,
    reduce_bucket_elements: int = REDUCE_BUCKET_ELEMENTS,
    sub_group_size: int = SUB_GROUP_SIZE,
    autocast: str | None = None,
) -> MemoryEstimate:
    """Per-rank device and host bytes of a ``DeepSpeedLearner`` step.

    ``micro_batch_tokens``: tokens in one forward/backward (micro_batch_size x max episode length,
    or ``learner.max_tokens_per_micro_batch``), padding included; ``seq_len``: the length of one
    padded row (default: all tokens in one row, as with packing): it sets the eager attention
    term, the mask and the logits chunking. ``lora_rank`` > 0: LoRA with ``lora_params`` adapter
    parameters (0 = computed from ``lora_target_modules``). ``critic_dims``: the critic's causal
    LM when it is not the policy's. ``autocast`` (``learner.autocast``): the policy's and
    critic's activations are kept in that dtype, while the model states stay in ``dtype``.

    Terms (bytes per rank):

    * ``model_states`` of the policy engine (Psi = n_params, or the adapters with LoRA);
    * ``reference``: p x n_params, / N at ZeRO-3 (on the host with ``offload_params``); 0 with LoRA;
    * ``critic``: the critic engine's ``model_states`` (value-model parameters, same ZeRO and
      offload settings), device part here and host part in ``host["critic"]``;
    * ``policy_copy``: 16 x n_params: fp32 weights (kept between its updates) + fp32 gradients +
      AdamW moments while it is updated (freed after; counted as if concurrent, conservatively);
    * ``activations``: the largest ``decoder_saved_bytes`` of the phases that run a backward
      (the policy and the critic in the compute dtype; the policy copy, a full model even with LoRA,
      in bf16 when that is the compute dtype, else fp32, with the learner's checkpointing), plus
      the decoder output and its gradient, 2 p h per token, and with checkpointing the layer being
      recomputed, one layer's saved tensors. A layer's backward briefly adds gradients of about
      0.6 of its saved tensors (measured on CPU); not added, as it does not coexist with the LM
      head's backward (which runs first, with every saved tensor alive) and is smaller than the
      logits chunk for these vocabularies;
    * ``logits``: the larger ``logits_bytes`` chunk of the policy and the policy copy, each in its
      compute dtype.
    """
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    if micro_batch_tokens <= 0 or num_ranks <= 0:
        raise ValueError("micro_batch_tokens and num_ranks must be > 0")
    p = DTYPE_BYTES[dtype]
    seq_len = min(seq_len or micro_batch_tokens, micro_batch_tokens)
    lora_targets = lora_target_names(lora_target_modules) if lora_rank > 0 else ()
    if lora_rank > 0 and lora_params <= 0:
        lora_params = dims.lora_params(lora_rank, lora_target_modules)
    trained, frozen = (lora_params, dims.n_params) if lora_rank > 0 else (dims.n_params, 0)
    zero = dict(zero_stage=zero_stage, num_ranks=num_ranks, offload_optimizer=offload_optimizer, offload_params=offload_params,
                reduce_bucket_elements=reduce_bucket_elements, sub_group_size=sub_group_size)
    device, host = model_states(trained, frozen, p=p, largest_layer_params=dims.largest_layer_params, **zero)

    loads = [4 * dims.n_params]  # host peaks while loading: each model in fp32 (the reference in p) ...
    steady_host = sum(host.values())  # ... next to the offloaded state of the engines built before it
    if with_reference and lora_rank == 0:
        ref = p * dims.n_params / (num_ranks if zero_stage == 3 else 1)
        (host if zero_stage == 3 and offload_params else device)["reference"] = ref
        loads.append(steady_host + p * dims.n_params)
    cdims = critic_dims or dims
    if with_critic:
        cdev, chost = model_states(cdims.value_model_params(), 0, p=p, largest_layer_params=cdims.largest_layer_params, **zero)
        device["critic"] = sum(cdev.values())
        loads.append(steady_host + 4 * cdims.value_model_params())
        if chost:
            host["critic"] = sum(chost.values())
    if with_policy_copy:
        device["policy_copy"] = 16 * dims.n_params
        loads.append(sum(host.values()) + 4 * dims.n_params)

    def working(d: ModelDims, q: int, ckpt: bool, lr: int = 0, lt: tuple[str, ...] = ()) -> int:
        saved = decoder_saved_bytes(d, q, micro_batch_tokens, seq_len, gradient_checkpointing=ckpt,
                                    attn_implementation=attn_implementation, lora_rank=lr, lora_targets=lt)
        layer = decoder_layer_bytes_per_token(d, q, seq_len=seq_len, attn_implementation=attn_implementation,
                                              lora_rank=lr, lora_targets=lt)
        return saved + micro_batch_tokens * ((layer if ckpt else 0) + 2 * q * d.hidden)

    a = DTYPE_BYTES[autocast] if autocast else p  # the compute dtype: activations and the head's matmuls
    acts = [working(dims, a, gradient_checkpointing, lora_rank, lora_targets)]
    logits = [logits_bytes(dims, a, micro_batch_tokens, seq_len)]
    if with_critic:
        acts.append(working(cdims, a, gradient_checkpointing))
    if with_policy_copy:  # a full model (no LoRA) at the policy's checkpointing; fp16 compute leaves it fp32
        copy_q = DTYPE_BYTES["bfloat16"] if (autocast or dtype) == "bfloat16" else 4
        acts.append(working(dims, copy_q, gradient_checkpointing))
        logits.append(logits_bytes(dims, copy_q, micro_batch_tokens, seq_len))
    device["activations"] = max(acts)
    device["logits"] = max(logits)
    inputs = dict(dtype=dtype, micro_batch_tokens=micro_batch_tokens, seq_len=seq_len, with_reference=with_reference,
                  with_critic=with_critic, with_policy_copy=with_policy_copy, gradient_checkpointing=gradient_checkpointing,
                  lora_rank=lora_rank, lora_params=lora_params, n_params=dims.n_params, autocast=autocast, **zero)
    return MemoryEstimate(device=device, host=host, init_host=max(loads), inputs=inputs)


def estimate_for_config(cfg: Any, dims: ModelDims | None = None, critic_dims: ModelDims | None = None,
                        policy_copy: bool = False) -> MemoryEstimate:
    """``estimate_learner_memory`` of a validated ``agentrl.config.schema.Config``.

    ``dims``: default read from ``cfg.model.path``/config.json (and the critic's from
    ``algo.critic.path`` when set). Micro-batch tokens: ``learner.max_tokens_per_micro_batch``, or
    ``micro_batch_size`` x ``rollout.max_episode_tokens``; rows of ``max_episode_tokens`` (one
    row per micro-batch with ``learner.packing``). Reference when ``algo.kl_coef > 0``; critic
    when the estimator needs one; ``policy_copy``: a method keeps an fp32 copy of the policy with
    its own AdamW beside it (``agentrl.methods.registry.keeps_policy_copy``)."""
    dims = dims or ModelDims.from_pretrained_dir(cfg.model.path)
    lc, algo = cfg.learner, cfg.algo
    needs_critic = estimator_for(algo).needs_critic
    if needs_critic and critic_dims is None and algo.critic is not None and algo.critic.path:
        critic_dims = ModelDims.from_pretrained_dir(algo.critic.path)
    tokens = lc.max_tokens_per_micro_batch or lc.micro_batch_size * cfg.rollout.max_episode_tokens
    seq_len = tokens if lc.packing else min(tokens, cfg.rollout.max_episode_tokens)
    lora = cfg.model.lora
    return estimate_learner_memory(
        dims, dtype=cfg.model.dtype, zero_stage=lc.zero_stage, num_ranks=lc.num_ranks, offload_optimizer=lc.offload_optimizer,
        offload_params=lc.offload_params, gradient_checkpointing=lc.gradient_checkpointing, micro_batch_tokens=tokens,
        seq_len=seq_len, with_reference=algo.kl_coef > 0, with_critic=needs_critic, with_policy_copy=policy_copy,
        lora_rank=lora.rank, lora_target_modules=lora.target_modules, critic_dims=critic_dims,
        attn_implementation=lc.attn_implementation or "sdpa", autocast=lc.autocast,
    )


__all__ = ["DTYPE_BYTES", "MemoryEstimate", "ModelDims",
           "decoder_layer_bytes_per_token", "decoder_saved_bytes", "estimate_for_config", "estimate_learner_memory",
           "logit_elements", "logits_bytes", "lora_target_names", "model_states"]
