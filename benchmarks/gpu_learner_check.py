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

The harness (sizes, the model, the batch, the reference step, comparisons) is gpu_learner_harness.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
for folder in (REPO, REPO / "benchmarks"):  # a bare checkout (the GPU machine has no agentrl installed)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from gpu_learner_harness import TOL, Check, Run, StepResult  # noqa: E402  (after the path)

# The GPU machine has neither: a module that needs them must fail here too, not only there (``main``
# hides them before importing anything else).
BLOCKED = ("ray", "vllm")



class Checks(Run):
    """Each check runs one comparison and records it (``run_check``); ``main`` runs them in turn."""

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
        run = Checks(args)
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
