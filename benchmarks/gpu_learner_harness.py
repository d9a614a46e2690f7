"""The harness of ``gpu_learner_check.py``: model and batch sizes, results, and ``Run``, which builds
the random-init model, the synthetic batch, the plain-torch reference step and learners, and
compares their updates. The checks themselves, and the entry point, are in gpu_learner_check.py.
Imports nothing from Ray or vLLM (the GPU machine has neither)."""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

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
