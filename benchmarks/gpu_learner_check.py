"""The learner's GPU code path, checked without Ray, vLLM or a model hub: minutes on one CUDA device.

What it runs: ``agentrl.engines.deepspeed_learner.DeepSpeedLearner`` itself (DeepSpeed engine, ZeRO,
packing, checkpointing, offload, LoRA, ``learner_state``) on a random-init Llama-style model it
builds and saves to a temp folder (``--quick``: a tiny one), with a synthetic batch of episodes of
varied lengths (prompt tokens masked out, advantages +-1, rollout logprobs = the model's own minus
0.1). Each check prints ``name: PASS|FAIL|SKIP measured vs tolerance, seconds``; the last line is the
verdict, ``GPU LEARNER CHECK: PASS (...)`` or ``GPU LEARNER CHECK: FAIL (failed: ...)`` (exit 0 / 1).

    .venv/bin/python benchmarks/gpu_learner_check.py --device cpu --quick      # here, ~30 s
    python3 benchmarks/gpu_learner_check.py --device cuda --out result.json     # on a GPU machine

Checks (the fp32 reference is one plain-torch AdamW step of ``agentrl.algos.losses.policy_loss``
on the whole padded batch, clipped at grad-norm 1, as tests/test_learner.py's
``test_train_step_matches_plain_torch``; "update error" is ||W_a - W_b|| / ||W_ref - W_0|| over every
weight, i.e. the difference of two updates relative to the size of the update):

* ``zero{0,1,2,3}_fp32``: one ``train_step`` (micro-batches of ``micro_batch_size``, our gradient
  accumulation) against the reference: update error, loss and gradient norm.
* ``bf16_zero2``: bf16 ZeRO-2 step: loss finite and within a bf16 tolerance of the fp32 loss; the
  fp32 master weights (``deepspeed.utils.safe_get_full_fp32_param``) moved in the direction of the
  fp32 reference update (cosine; bf16 gradients flip the sign of Adam's first, sign-like, update
  on near-zero gradient entries, so a relative error would be the wrong yardstick); the bf16
  weights moved.
* ``packed_vs_padded``: ``learner.packing`` with ``max_tokens_per_micro_batch`` against the padded
  ZeRO-2 step: update error and loss.
* ``grad_checkpointing``: on against off (ZeRO-2): update error and loss; on CUDA also the peak of
  ``torch.cuda.max_memory_allocated()`` during the step, which must be lower with checkpointing.
* ``offload_optimizer`` (ZeRO-2) / ``offload_params`` (ZeRO-3): against the same stage without
  offload. On CUDA optimizer offload runs DeepSpeed's CPU Adam, a C++ op compiled on first use
  (about a minute, cached in ``TORCH_EXTENSIONS_DIR``). On CPU, a refusal by DeepSpeed is a SKIP.
* ``lora_merged_logprobs``: LoRA (rank 8, alpha 16) learner after one step: its merged
  ``state_dict_for_inference()`` loaded into a plain HF model gives the learner's own
  ``compute_logprobs`` (and the merge is not the base model).
* ``checkpoint_round_trip``: ``save_learner_state`` after a step, a fresh learner's
  ``load_learner_state``: equal digests, then equal loss and weights after one more step on each.
* ``step_time``: seconds per ``train_step`` of the default learner settings (ZeRO-1; bf16 on CUDA,
  fp32 on CPU) after one warm-up step, and tokens/s: the throughput number to record.
* ``no_ray_vllm``: neither ``ray`` nor ``vllm`` was imported (the script also hides them, as on
  the GPU machine, where they are not installed).

``--quick`` runs every check too (on the tiny model each costs a second or two), with a smaller
batch and fewer timed steps; tests/test_gpu_learner_check.py runs it that way on CPU.

On the lent GPU machine (one H200: CUDA torch, transformers and peft are installed; Ray, vLLM,
DeepSpeed, hjson and pydantic are not; no network; at most 64 MiB travels with the working tree):

1. Here, once: ``benchmarks/gpu_learner_check.sh --prepare`` puts into the ignored
   ``.cache/gpu-wheels/`` (about 5 MiB): a pure-python ``deepspeed-0.19.8-py3-none-any.whl``
   built from PyPI's sdist with ``DS_BUILD_OPS=0`` (PyPI has no deepspeed wheel; ops are JIT-built
   where used), and ``hjson``, ``pydantic``, ``pydantic-core`` (cp312 manylinux, the GPU image's
   Python 3.12), ``annotated-types``, ``typing-inspection``, ``typing-extensions`` at the versions
   of this venv. DeepSpeed's other requirements (einops, msgpack, ninja, numpy, packaging, psutil,
   py-cpuinfo, tqdm, torch) are in the GPU image already.
2. Device tool: ``run(command="bash benchmarks/gpu_learner_check.sh", carry=[".cache/gpu-wheels"],
   timeout_s=600)``. The script installs the wheels (only if deepspeed does not import) with
   ``python3 -m pip install --no-index --no-deps --target /tmp/gpu-learner-check-site
   .cache/gpu-wheels/*.whl``, puts that folder and the repo on PYTHONPATH and python3's bin folder
   (ninja, for the JIT op) on PATH, exports ``DS_BUILD_OPS=0 HF_HUB_OFFLINE=1`` and runs this check
   under ``timeout 540``, writing ``$OUT/gpu_learner_check.json``. By hand, the same is::

       python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .cache/gpu-wheels/*.whl &&
       PYTHONPATH=/tmp/site:$PWD DS_BUILD_OPS=0 HF_HUB_OFFLINE=1 python3 benchmarks/gpu_learner_check.py --out $OUT/r.json
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a bare checkout (the GPU machine has no agentrl installed)
    sys.path.insert(0, str(REPO))

# The GPU machine has neither: a module that needs them must fail here too, not only there (``main``
# hides them before importing anything else).
BLOCKED = ("ray", "vllm")

CAP, ADV_OFFSET, KL_COEF = 2.0, 0.1, 0.001


@dataclass(frozen=True)
class Size:
    """The model, the batch and the learner settings of a run."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    episodes: int
    min_len: int
    max_len: int
    micro_batch_size: int
    max_tokens_per_micro_batch: int
    lr: float
    timed_steps: int


# default: a GPU-sized Llama (hidden 512, 4 layers, 8 heads / 2 kv heads, vocab 32000: ~45M params,
# untied head); --quick: a tiny tied one (the CPU test's size, like tests/test_learner.py's).
DEFAULT = Size(hidden=512, intermediate=1536, layers=4, heads=8, kv_heads=2, vocab=32000, tied=False, episodes=16,
               min_len=64, max_len=512, micro_batch_size=4, max_tokens_per_micro_batch=1024, lr=1e-4, timed_steps=5)
QUICK = Size(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=300, tied=True, episodes=6,
             min_len=7, max_len=20, micro_batch_size=2, max_tokens_per_micro_batch=32, lr=1e-3, timed_steps=2)

# Tolerances. fp32: every variant computes the same sums in another order or split (ZeRO partitions,
# micro-batches, packing, recompute), so updates agree to float rounding; Adam's first step is
# nearly sign(g), so an entry whose gradient is within rounding of 0 can move differently, which a
# relative error of 1e-3 still allows for a few per million.
TOL = {
    "update_fp32": 1e-3,      # update error, fp32 variants
    "loss_rel_fp32": 1e-5,    # |loss - loss_ref| <= 1e-5 * max(|loss_ref|, 1e-2)
    "grad_norm_rel": 1e-4,    # |grad_norm - ref| / ref
    "loss_rel_bf16": 2e-2,    # bf16 forward: logprobs carry ~3 significant digits
    "cos_bf16": 0.9,          # cosine(fp32-master update of the bf16 step, fp32 reference update) >=
    "lora_logprob": 1e-4,     # max |logprob| difference, merged plain model vs the learner
    "resume_loss_rel": 1e-6,  # loss after resume vs the uninterrupted learner
    "resume_update": 1e-4,    # update error of the step after resume (CUDA backward kernels may use atomics)
}


# ---------------------------------------------------------------------------------------------- results
@dataclass
class Check:
    name: str
    status: str  # PASS, FAIL or SKIP
    text: str
    seconds: float
    measured: dict[str, Any] = field(default_factory=dict)
    tolerance: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    """One learner's first ``train_step``: metrics, weights after it (fp32, CPU) and its cost."""

    metrics: dict[str, float]
    weights: dict[str, Any]
    step_s: float
    peak_mib: float | None = None
    growth_mib: float | None = None
    master: dict[str, Any] | None = None  # fp32 master weights (bf16 runs)
    facts: dict[str, Any] = field(default_factory=dict)  # what a probe saw in the learner


# ---------------------------------------------------------------------------------------------- the run
class Run:
    def __init__(self, args: argparse.Namespace):
        import torch

        self.args, self.torch = args, torch
        self.size = QUICK if args.quick else DEFAULT
        self.cuda = args.device == "cuda"
        self.device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        self.tmp = tempfile.TemporaryDirectory(prefix="gpu_learner_check_")
        self.checks: list[Check] = []
        self.steps: dict[str, StepResult] = {}
        self.model_dir = ""
        self.pad_id = 0  # the model's pad_token_id, so also the learner's
        self.batch: dict[str, list] = {}
        self.ref: StepResult | None = None
        self.w0: dict[str, Any] = {}

    # ------------------------------------------------------------------ set-up
    def build_model(self) -> dict[str, Any]:
        torch = self.torch
        from transformers import LlamaConfig, LlamaForCausalLM

        s = self.size
        torch.manual_seed(0)
        cfg = LlamaConfig(hidden_size=s.hidden, intermediate_size=s.intermediate, num_hidden_layers=s.layers,
                          num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, vocab_size=s.vocab,
                          tie_word_embeddings=s.tied, max_position_embeddings=max(128, s.max_len),
                          bos_token_id=1, eos_token_id=2, pad_token_id=0)
        model = LlamaForCausalLM(cfg)
        self.model_dir = os.path.join(self.tmp.name, "model")
        model.save_pretrained(self.model_dir)
        n_params = sum(p.numel() for p in model.parameters())
        return {"params": n_params, "hidden": s.hidden, "layers": s.layers, "heads": s.heads, "kv_heads": s.kv_heads,
                "vocab": s.vocab, "tied": s.tied}

    def _load(self):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=self.torch.float32).to(self.device).eval()

    def build_batch(self) -> dict[str, Any]:
        """Episodes of varied lengths; the first ~quarter to half of each is the (masked) prompt;
        advantages alternate +1 / -1; rollout logprobs are the model's own minus ``ADV_OFFSET``
        (truncated IS weights e^0.1, not trivially 1)."""
        torch = self.torch
        from agentrl.engines.hf_policy import pad_batch, token_logprobs

        s = self.size
        g = torch.Generator().manual_seed(1)
        lengths = torch.randint(s.min_len, s.max_len + 1, (s.episodes,), generator=g).tolist()
        seqs = [torch.randint(3, s.vocab, (n,), generator=g).tolist() for n in lengths]
        prompts = [max(2, int(n * float(torch.empty(()).uniform_(0.25, 0.5, generator=g)))) for n in lengths]
        mask = [[0] * p + [1] * (n - p) for p, n in zip(prompts, lengths)]
        model = self._load()
        ids, attn = pad_batch(seqs, self.pad_id, device=self.device)
        with torch.no_grad():
            lp0 = token_logprobs(model, ids, attn).cpu()
        del model
        roll = [[(float(lp0[i, t]) - ADV_OFFSET) * m for t, m in enumerate(mk)] for i, mk in enumerate(mask)]
        adv = [[(1.0 if i % 2 == 0 else -1.0) * m for m in mk] for i, mk in enumerate(mask)]
        self.batch = {"input_ids": seqs, "response_mask": mask, "rollout_logprobs": roll, "advantages": adv}
        return {"episodes": len(seqs), "tokens": sum(lengths), "policy_tokens": sum(map(sum, mask)),
                "min_len": min(lengths), "max_len": max(lengths)}

    def algo_cfg(self):
        from agentrl.config.schema import AlgoConfig

        return AlgoConfig(kl_coef=KL_COEF, tis_cap=CAP)

    def reference_step(self) -> None:
        """One plain-torch AdamW step of ``policy_loss`` on the whole padded batch (fp32), as the
        learner takes it: pi_old = this forward, the reference = the initial model (KL 0 and zero
        gradient at step one), loss normalized by the batch's policy tokens, grad-norm clip 1."""
        torch = self.torch
        from agentrl.algos.losses import PolicyLossConfig, policy_loss
        from agentrl.engines.hf_policy import pad_batch, token_logprobs

        b = self.batch
        model = self._load()
        self.w0 = self._state(model)
        opt = torch.optim.AdamW(model.parameters(), lr=self.size.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        ids, attn, mask, roll, adv = pad_batch(b["input_ids"], self.pad_id, b["response_mask"], b["rollout_logprobs"],
                                               b["advantages"], device=self.device)
        mask = (mask > 0) & (attn > 0)
        t0 = time.perf_counter()
        lp = token_logprobs(model, ids, attn)
        loss, _ = policy_loss(lp, lp.detach(), adv, mask, PolicyLossConfig.from_algo(self.algo_cfg()), rollout_logprobs=roll,
                              ref_logprobs=lp.detach(), n_tokens_global=int(mask.sum()))
        opt.zero_grad()
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        opt.step()
        self._sync()
        dt = time.perf_counter() - t0
        self.ref = StepResult({"loss": float(loss.detach()), "grad_norm": grad_norm}, self._state(model), dt)
        del model, opt

    def _state(self, model) -> dict[str, Any]:
        """fp32 CPU copies of the weights, under the names the learner's ``inference_weights`` uses."""
        sd = model.state_dict()
        return {k: v.detach().float().cpu().clone() for k, v in sd.items()
                if not (self.size.tied and k == "lm_head.weight")}

    # ------------------------------------------------------------------ learners
    def learner(self, dtype: str = "float32", lora=None, **learner_overrides):
        from agentrl.config.schema import LearnerConfig
        from agentrl.engines.deepspeed_learner import DeepSpeedLearner

        kw = {"zero_stage": 2, "lr": self.size.lr, "micro_batch_size": self.size.micro_batch_size, "grad_clip": 1.0}
        kw.update(learner_overrides)
        return DeepSpeedLearner(self.model_dir, LearnerConfig(**kw), self.algo_cfg(), dtype, seed=0, lora_cfg=lora)

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def _release(self, learner) -> None:
        if learner is not None:
            learner.close()
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()

    def timed_step(self, learner) -> tuple[dict[str, float], float, float | None, float | None]:
        """(metrics, seconds, peak MiB, peak minus what was allocated before the step) of one train_step."""
        torch = self.torch
        self._sync()
        before = None
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        m = learner.train_step(self.batch)
        self._sync()
        dt = time.perf_counter() - t0
        if not self.cuda:
            return m, dt, None, None
        peak = torch.cuda.max_memory_allocated()
        return m, dt, peak / 2**20, (peak - before) / 2**20

    def step(self, key: str, dtype: str = "float32", master: bool = False, probe: Callable[[Any], dict] | None = None,
             **kw) -> StepResult:
        """Build a learner, take one train_step, keep its metrics and weights (and what ``probe(learner)``
        reports about it), close it."""
        learner = None
        try:
            learner = self.learner(dtype=dtype, **kw)
            m, dt, peak, growth = self.timed_step(learner)
            weights = {k: v.float() for k, v in learner.inference_weights()}
            fp32 = self._master_weights(learner) if master else None
            facts = probe(learner) if probe is not None else {}
        finally:
            self._release(learner)
        self.steps[key] = StepResult(m, weights, dt, peak, growth, fp32, facts)
        return self.steps[key]

    def _master_weights(self, learner) -> dict[str, Any]:
        from deepspeed.utils import safe_get_full_fp32_param

        out = {}
        for name, p in learner.hf_model.named_parameters():
            full = safe_get_full_fp32_param(p)
            if full is None:
                raise RuntimeError(f"no fp32 master weight for {name}")
            out[name] = full.detach().float().cpu().clone()
        return out

    # ------------------------------------------------------------------ measures
    def update_error(self, a: dict[str, Any], b: dict[str, Any]) -> float:
        """||W_a - W_b|| / ||W_ref - W_0||: the difference of two updates, relative to the update."""
        torch = self.torch
        num = den = 0.0
        for k, w0 in self.w0.items():
            num += float(torch.sum((a[k] - b[k]).double() ** 2))
            den += float(torch.sum((self.ref.weights[k] - w0).double() ** 2))
        return math.sqrt(num / den) if den > 0 else float("inf")

    def loss_err(self, loss: float, ref: float) -> float:
        return abs(loss - ref) / max(abs(ref), 1e-2)

    def compare(self, res: StepResult, base: StepResult, what: str) -> tuple[bool, str, dict, dict]:
        """Update error and loss of ``res`` against ``base`` (fp32 tolerances)."""
        upd = self.update_error(res.weights, base.weights)
        lerr = self.loss_err(res.metrics["loss"], base.metrics["loss"])
        ok = upd <= TOL["update_fp32"] and lerr <= TOL["loss_rel_fp32"] and math.isfinite(res.metrics["loss"])
        text = (f"update err vs {what} {upd:.2e} <= {TOL['update_fp32']:.0e}, loss rel err {lerr:.2e} <= "
                f"{TOL['loss_rel_fp32']:.0e} (loss {res.metrics['loss']:.6g})")
        return ok, text, {"update_err": upd, "loss_rel_err": lerr, "loss": res.metrics["loss"]}, \
            {"update_err": TOL["update_fp32"], "loss_rel_err": TOL["loss_rel_fp32"]}

    # ------------------------------------------------------------------ the checks
    def run_check(self, name: str, fn: Callable[[], tuple[str, str, dict, dict]]) -> Check:
        t0 = time.perf_counter()
        try:
            status, text, measured, tol = fn()
        except Exception as e:  # a broken check is a FAIL with its reason; the other checks still run
            traceback.print_exc(file=sys.stderr)
            status, text, measured, tol = "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300], {}, {}
        check = Check(name, status, text, time.perf_counter() - t0, measured, tol)
        self.checks.append(check)
        print(f"{name}: {status} {text}, {check.seconds:.1f} s", flush=True)
        return check

    def check_zero(self, stage: int):
        def fn():
            res = self.step(f"zero{stage}", zero_stage=stage, probe=self._micro_batches)
            ok, text, measured, tol = self.compare(res, self.ref, "torch")
            gn, gref = res.metrics.get("grad_norm", float("nan")), self.ref.metrics["grad_norm"]
            gerr = abs(gn - gref) / gref
            ok = ok and gerr <= TOL["grad_norm_rel"] and res.metrics.get("lr") == self.size.lr
            measured.update(grad_norm=gn, grad_norm_ref=gref, grad_norm_rel_err=gerr, step_s=res.step_s)
            tol["grad_norm_rel_err"] = TOL["grad_norm_rel"]
            lr = res.metrics.get("lr")
            measured["lr"] = lr
            text += (f", grad-norm rel err {gerr:.2e} <= {TOL['grad_norm_rel']:.0e}, lr {lr:g}, "
                     f"{res.facts.get('micro_batches')} micro-batches")
            return ("PASS" if ok else "FAIL"), text, measured, tol
        return fn

    def check_bf16(self):
        torch = self.torch

        def fn():
            res = self.step("bf16", dtype="bfloat16", master=True, zero_stage=2)
            loss = res.metrics["loss"]
            lerr = self.loss_err(loss, self.ref.metrics["loss"])
            dot = n_ref = n_mov = 0.0
            moved = total = 0
            for k, w0 in self.w0.items():
                d_ref = (self.ref.weights[k] - w0).double().reshape(-1)
                d = (res.master[k] - w0).double().reshape(-1)
                dot += float(d @ d_ref)
                n_ref += float(d_ref @ d_ref)
                n_mov += float(d @ d)
                moved += int((res.weights[k] != w0.to(torch.bfloat16).float()).sum())
                total += w0.numel()
            cos = dot / math.sqrt(n_ref * n_mov) if n_ref > 0 and n_mov > 0 else 0.0
            frac = moved / total
            ratio = math.sqrt(n_mov / n_ref) if n_ref > 0 else 0.0
            ok = math.isfinite(loss) and lerr <= TOL["loss_rel_bf16"] and cos >= TOL["cos_bf16"] and moved > 0
            text = (f"loss {loss:.5g} rel err vs fp32 {lerr:.2e} <= {TOL['loss_rel_bf16']:.0e}, master-update cosine vs fp32 "
                    f"{cos:.4f} >= {TOL['cos_bf16']}, |update| / |fp32 update| {ratio:.3f}, bf16 weights moved {frac:.1%}")
            return ("PASS" if ok else "FAIL"), text, \
                {"loss": loss, "loss_rel_err": lerr, "update_cosine": cos, "update_norm_ratio": ratio, "moved_frac": frac,
                 "step_s": res.step_s}, {"loss_rel_err": TOL["loss_rel_bf16"], "update_cosine": TOL["cos_bf16"]}
        return fn

    def _base(self, key: str, stage: int, probe: Callable[[Any], dict] | None = None) -> StepResult:
        """The step of ZeRO-``stage`` fp32 without extras (taken by check_zero, or now)."""
        if key not in self.steps or (probe is not None and not self.steps[key].facts):
            self.step(key, zero_stage=stage, probe=probe)
        return self.steps[key]

    def _micro_batches(self, learner) -> dict[str, Any]:
        """How the learner cut this batch: micro-batches, packed or not (its own planning code)."""
        from agentrl.api import TrainBatch

        micro = [m for mini in learner._build_mini_batches(TrainBatch(**self.batch)) for m in mini.micro]
        return {"micro_batches": len(micro), "packed": all(m.packed for m in micro)}

    def check_packed(self):
        def fn():
            base = self._base("zero2", 2, probe=self._micro_batches)
            budget = self.size.max_tokens_per_micro_batch
            res = self.step("packed", zero_stage=2, packing=True, max_tokens_per_micro_batch=budget, probe=self._micro_batches)
            ok, text, measured, tol = self.compare(res, base, "padded")
            ok = ok and res.facts.get("packed") is True
            measured.update(step_s=res.step_s, step_s_padded=base.step_s, micro_batches=res.facts.get("micro_batches"),
                            micro_batches_padded=base.facts.get("micro_batches"))
            text += (f", {res.facts.get('micro_batches')} packed micro-batches (max_tokens_per_micro_batch {budget}) vs "
                     f"{base.facts.get('micro_batches')} padded ones of {self.size.micro_batch_size}")
            return ("PASS" if ok else "FAIL"), text, measured, tol
        return fn

    @staticmethod
    def _checkpointed_layers(learner) -> dict[str, Any]:
        """Decoder layers that will recompute in backward (HF's flag on, the layer itself in training mode)."""
        from transformers.modeling_layers import GradientCheckpointingLayer

        layers = [m for m in learner.engine.module.modules() if isinstance(m, GradientCheckpointingLayer)]
        return {"checkpointed_layers": sum(1 for m in layers if m.gradient_checkpointing and m.training)}

    def check_checkpointing(self):
        def fn():
            base = self._base("zero2", 2)
            res = self.step("gc", zero_stage=2, gradient_checkpointing=True, probe=self._checkpointed_layers)
            ok, text, measured, tol = self.compare(res, base, "off")
            layers = res.facts.get("checkpointed_layers", 0)
            ok = ok and layers == self.size.layers
            measured.update(step_s=res.step_s, step_s_off=base.step_s, checkpointed_layers=layers)
            text += f", {layers}/{self.size.layers} decoder layers recompute"
            if self.cuda and res.growth_mib is not None and base.growth_mib is not None:
                lower = res.growth_mib < base.growth_mib
                ok = ok and lower
                measured.update(peak_mib_on=res.peak_mib, peak_mib_off=base.peak_mib, step_growth_mib_on=res.growth_mib,
                                step_growth_mib_off=base.growth_mib)
                text += (f", max_memory_allocated on {res.peak_mib:.0f} MiB vs off {base.peak_mib:.0f} MiB (step growth "
                         f"{res.growth_mib:.0f} vs {base.growth_mib:.0f} MiB: {'lower' if lower else 'NOT lower'})")
            else:
                text += ", max_memory_allocated n/a (cpu)"
            return ("PASS" if ok else "FAIL"), text, measured, tol
        return fn

    def check_offload(self, stage: int, **flags):
        def fn():
            base = self._base(f"zero{stage}", stage)
            if self.cuda and flags.get("offload_optimizer"):
                print("  (optimizer offload uses DeepSpeed's CPU Adam: compiling its C++ op on first use may take a minute)",
                      flush=True)
            try:
                learner = self.learner(zero_stage=stage, **flags)
            except Exception as e:
                if self.cuda:
                    raise
                reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                return "SKIP", f"DeepSpeed refused offload on CPU: {type(e).__name__}: {reason[:200]}", {"reason": reason}, {}
            try:
                engine = learner.engine
                on = {"optimizer": engine.zero_offload_optimizer() is not None, "params": engine.zero_offload_param() is not None}
                optimizer = type(engine.basic_optimizer).__name__
                m, dt, peak, growth = self.timed_step(learner)
                weights = {k: v.float() for k, v in learner.inference_weights()}
            finally:
                self._release(learner)
            res = StepResult(m, weights, dt, peak, growth)
            ok, text, measured, tol = self.compare(res, base, f"zero{stage} without offload")
            wanted = {"optimizer": bool(flags.get("offload_optimizer")), "params": bool(flags.get("offload_params"))}
            ok = ok and on == wanted
            measured.update(step_s=dt, step_s_without=base.step_s, deepspeed_offload=on, optimizer=optimizer)
            text += (f", DeepSpeed offloads {' and '.join(k for k, v in on.items() if v) or 'nothing'} ({optimizer}), "
                     f"step {dt:.2f} s vs {base.step_s:.2f} s")
            return ("PASS" if ok else "FAIL"), text, measured, tol
        return fn

    def check_lora(self):
        torch = self.torch

        def fn():
            from agentrl.config.schema import LoraConfig
            from agentrl.engines.hf_policy import pad_batch, token_logprobs

            learner = None
            try:
                learner = self.learner(zero_stage=2, lora=LoraConfig(rank=8, alpha=16))
                m = learner.train_step(self.batch)
                sd = learner.state_dict_for_inference()
                got = learner.compute_logprobs(self.batch["input_ids"])
            finally:
                self._release(learner)
            plain = self._load()
            missing, unexpected = plain.load_state_dict({k: v.to(torch.float32) for k, v in sd.items()}, strict=False)
            if unexpected or set(missing) - {"lm_head.weight"}:
                raise RuntimeError(f"merged weights do not fit the plain model: missing {missing}, unexpected {unexpected}")
            if missing:
                plain.tie_weights()
            merged_delta = max(float((sd[k].float() - w0).abs().max()) for k, w0 in self.w0.items())
            ids, attn = pad_batch(self.batch["input_ids"], self.pad_id, device=self.device)
            with torch.no_grad():
                expect = token_logprobs(plain, ids, attn).cpu()
            del plain
            diff = max(float((torch.tensor(lp) - expect[i, : len(lp)]).abs().max()) for i, lp in enumerate(got))
            ok = diff <= TOL["lora_logprob"] and merged_delta > 0 and math.isfinite(m["loss"])
            text = (f"max |logprob(plain HF + merged) - learner| {diff:.2e} <= {TOL['lora_logprob']:.0e}, merged weights moved "
                    f"{merged_delta:.2e} > 0 (loss {m['loss']:.6g})")
            return ("PASS" if ok else "FAIL"), text, {"max_logprob_diff": diff, "merged_max_delta": merged_delta,
                                                      "loss": m["loss"]}, {"max_logprob_diff": TOL["lora_logprob"]}
        return fn

    def check_resume(self):
        def fn():
            from agentrl.engines.learner_state import load_learner_state, save_learner_state

            a = b = None
            try:
                a = self.learner(zero_stage=2)
                a.train_step(self.batch)
                ckpt = os.path.join(self.tmp.name, "learner_state")
                saved = save_learner_state(a, ckpt)
                b = self.learner(zero_stage=2)
                loaded = load_learner_state(b, ckpt)
                differ = sorted(k for k in set(saved) | set(loaded) if saved.get(k) != loaded.get(k))
                la, lb = a.train_step(self.batch)["loss"], b.train_step(self.batch)["loss"]
                wa = {k: v.float() for k, v in a.inference_weights()}
                wb = {k: v.float() for k, v in b.inference_weights()}
            finally:
                self._release(a)
                self._release(b)
            lerr = self.loss_err(lb, la)
            upd = self.update_error(wb, wa)
            ok = not differ and lerr <= TOL["resume_loss_rel"] and upd <= TOL["resume_update"]
            text = (f"digests {'equal (' + str(len(saved)) + ' parts)' if not differ else 'DIFFER: ' + ', '.join(differ)}, "
                    f"next-step loss rel err {lerr:.2e} <= {TOL['resume_loss_rel']:.0e}, update err {upd:.2e} <= "
                    f"{TOL['resume_update']:.0e}")
            return ("PASS" if ok else "FAIL"), text, {"digest_parts_differ": differ, "loss_rel_err": lerr, "update_err": upd}, \
                {"loss_rel_err": TOL["resume_loss_rel"], "update_err": TOL["resume_update"]}
        return fn

    def check_step_time(self):
        def fn():
            dtype = "bfloat16" if self.cuda else "float32"
            tokens = sum(len(s) for s in self.batch["input_ids"])
            learner = None
            times, losses = [], []
            try:
                learner = self.learner(dtype=dtype, zero_stage=1)  # LearnerConfig's default stage
                m, warm, _, _ = self.timed_step(learner)
                losses.append(m["loss"])
                for _ in range(self.size.timed_steps):
                    m, dt, peak, _ = self.timed_step(learner)
                    times.append(dt)
                    losses.append(m["loss"])
            finally:
                self._release(learner)
            mean = sum(times) / len(times)
            ok = all(math.isfinite(x) for x in losses)
            mem = f", peak {peak:.0f} MiB" if peak is not None else ""
            text = (f"{mean:.3f} s/step (min {min(times):.3f}, first {warm:.3f}), {tokens / mean:,.0f} tokens/s, "
                    f"ZeRO-1 {dtype}, {len(self.batch['input_ids'])} episodes / {tokens} tokens{mem}; losses finite")
            return ("PASS" if ok else "FAIL"), text, {"s_per_step": mean, "min_s": min(times), "first_s": warm,
                                                      "tokens_per_s": tokens / mean, "dtype": dtype, "peak_mib": peak}, {}
        return fn

    def check_imports(self):
        def fn():
            loaded = sorted(n for n, mod in sys.modules.items() if mod is not None and n.split(".")[0] in BLOCKED)
            ok = not loaded
            return ("PASS" if ok else "FAIL"), ("neither imported" if ok else "imported: " + ", ".join(loaded[:5])), \
                {"imported": loaded}, {}
        return fn


# ---------------------------------------------------------------------------------------------- main
def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="What each check compares, and how to run this on the lent GPU machine: the docstring.")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--quick", action="store_true", help="a tiny model and batch (the CPU test's size)")
    ap.add_argument("--out", help="write the results as JSON to this file")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (CPU); default: torch's")
    return ap.parse_args(argv)


def _quiet() -> None:
    # torch's own collectives deprecation notes, raised by DeepSpeed's ZeRO calls: noise here
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")


def _set_env(device: str) -> None:
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # CPU means CPU, also on a GPU machine (gloo, torch AdamW)
        os.environ["DS_ACCELERATOR"] = "cpu"
    else:
        os.environ.setdefault("DS_ACCELERATOR", "cuda")
    os.environ.setdefault("DS_BUILD_OPS", "0")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    for var, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TRANSFORMERS_VERBOSITY", "error"),
                       ("HF_HUB_DISABLE_PROGRESS_BARS", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(var, value)


def _hide(names: tuple[str, ...]) -> None:
    """Make ``names`` look not installed: with None in sys.modules, ``import ray`` raises
    ModuleNotFoundError and importlib.util.find_spec("ray") answers None, which is what the
    optional-dependency probes of transformers and peft see on the GPU machine too."""
    for name in names:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    _hide(BLOCKED)
    t_start = time.perf_counter()
    _set_env(args.device)
    _quiet()
    info: dict[str, Any] = {"device": args.device, "quick": args.quick, "python": platform.python_version()}
    checks: list[Check] = []
    run = None
    try:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        info["torch"] = torch.__version__
        if args.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("--device cuda, but torch sees no CUDA device (torch " + torch.__version__ + ")")
        torch.set_float32_matmul_precision("highest")  # fp32 means fp32 (no TF32) for the comparisons
        import deepspeed
        import peft
        import transformers

        transformers.logging.set_verbosity_error()
        info.update(deepspeed=deepspeed.__version__, transformers=transformers.__version__, peft=peft.__version__)
        if args.device == "cuda":
            info["gpu"] = torch.cuda.get_device_name(0)
            torch.cuda.set_device(0)
        print(f"gpu_learner_check: device {args.device}{' (' + info['gpu'] + ')' if 'gpu' in info else ''}, torch "
              f"{info['torch']}, deepspeed {info['deepspeed']}, transformers {info['transformers']}, peft {info['peft']}, "
              f"python {info['python']}", flush=True)
        from agentrl.engines.deepspeed_setup import init_process_group

        if not torch.distributed.is_initialized():
            init_process_group()  # once: every learner below reuses this 1-rank group
        run = Run(args)
        info["model"] = run.build_model()
        info["batch"] = run.build_batch()
        run.reference_step()
        print(f"model: {info['model']}; batch: {info['batch']}; reference step: loss {run.ref.metrics['loss']:.6g}, "
              f"grad-norm {run.ref.metrics['grad_norm']:.4g}", flush=True)
        for stage in (0, 1, 2, 3):
            run.run_check(f"zero{stage}_fp32", run.check_zero(stage))
        run.run_check("bf16_zero2", run.check_bf16())
        run.run_check("packed_vs_padded", run.check_packed())
        run.run_check("grad_checkpointing", run.check_checkpointing())
        run.run_check("offload_optimizer", run.check_offload(2, offload_optimizer=True))
        run.run_check("offload_params", run.check_offload(3, offload_params=True))
        run.run_check("lora_merged_logprobs", run.check_lora())
        run.run_check("checkpoint_round_trip", run.check_resume())
        run.run_check("step_time", run.check_step_time())
        run.run_check("no_ray_vllm", run.check_imports())
        checks = run.checks
    except Exception as e:  # set-up failed: no check could run
        traceback.print_exc(file=sys.stderr)
        checks = (run.checks if run is not None else []) + [Check("setup", "FAIL", f"{type(e).__name__}: {e}"[:300], 0.0)]
        print(f"setup: FAIL {checks[-1].text}", flush=True)
    finally:
        if run is not None:
            run.tmp.cleanup()

    total = time.perf_counter() - t_start
    failed = [c.name for c in checks if c.status == "FAIL"]
    passed = [c.name for c in checks if c.status == "PASS"]
    skipped = [c.name for c in checks if c.status == "SKIP"]
    if failed or not passed:
        verdict = f"GPU LEARNER CHECK: FAIL (failed: {', '.join(failed) or 'no check ran'})"
    else:
        skip = f", {len(skipped)} skipped: {', '.join(skipped)}" if skipped else ""
        verdict = (f"GPU LEARNER CHECK: PASS ({len(passed)} checks{skip}, device {args.device}"
                   f"{' ' + info['gpu'] if 'gpu' in info else ''}, torch {info.get('torch')}, deepspeed {info.get('deepspeed')}, "
                   f"{total:.0f} s)")
    if args.out:
        out = {"verdict": verdict, "ok": not failed and bool(passed), "total_s": total, **info,
               "tolerances": TOL, "checks": [c.__dict__ for c in checks]}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(verdict, flush=True)
    return 0 if not failed and passed else 1


if __name__ == "__main__":
    sys.exit(main())
