"""The learner's memory estimate (agentrl/engines/memory_estimate.py) next to a measurement.

    .venv/bin/python benchmarks/learner_memory.py                       # tiny model, ZeRO 0, 256 and 1024 tokens
    .venv/bin/python benchmarks/learner_memory.py --zero-stages 0 1 2 --lengths 512 --checkpointing both

Every case runs in a fresh subprocess that imports torch, DeepSpeed and transformers first, then
builds the real ``DeepSpeedLearner`` (``Config().learner`` / ``.algo`` with the case's settings)
and runs one ``train_step`` on a synthetic batch of ``micro_batch_size`` rows of up to ``length``
tokens (one padded micro-batch, the second half of each row policy tokens). A thread samples the process's
resident set size (psutil, every 2 ms; ``resource.getrusage`` gives the same high-water mark
without the sampling) and reports two growths:

* ``init``: RSS after the learner is built minus RSS before, against the estimate's terms that
  exist by then: parameters, the optimizer's fp32 copy (ZeRO-1/2 and mixed precision), the
  reference model. Its peak (``init peak``) includes the fp32 copy of the model each rank loads
  on the host, the estimate's ``init_host``.
* ``step``: the peak RSS during the first ``train_step`` minus RSS before it, against what the
  first step allocates: gradients (and their fp32 copy), AdamW's moments (torch creates them at
  the first step), the activations and the LM-head logits chunk, and the part of ZeRO's reduce
  bucket the gradients touch.

On CPU the "device" is host memory, so RSS sees everything the estimate splits into device and
host. RSS is only a coarse stand-in for GPU memory: it counts touched pages, not allocations
(a 5e8-element ``torch.empty`` bucket costs nothing until written, where the CUDA caching
allocator reserves all of it), glibc keeps some freed memory in its arenas (a later peak may
reuse it without growing RSS; each case runs with ``MALLOC_MMAP_THRESHOLD_=65536`` so that large
tensors are mmapped and returned on free), the CPU SDPA kernel and allocator differ from CUDA's, and the
interpreter, DeepSpeed's gloo process group and the kernels' scratch buffers add their own
megabytes. Use it to check the estimate's terms and their scaling (activations ~ tokens,
checkpointing's cut), not its absolute GPU numbers; the tiny model's model states are a few MB,
within that noise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="What is measured, and why CPU RSS is only a coarse stand-in: see the module docstring.")
    ap.add_argument("--model", default=str(REPO / "agentrl" / "assets" / "tiny-agent"), help="HF model folder")
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024], help="tokens per row of the synthetic batch")
    ap.add_argument("--micro-batch-size", type=int, default=8, help="rows (= learner.micro_batch_size: one micro-batch)")
    ap.add_argument("--zero-stages", type=int, nargs="+", default=[0], choices=[0, 1, 2, 3])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--kl-coef", type=float, default=0.001, help="> 0 builds the frozen reference model")
    ap.add_argument("--checkpointing", default="off", choices=["off", "on", "both"], help="learner.gradient_checkpointing")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of each case")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # one case, as JSON: run in a subprocess
    return ap.parse_args(argv)


class _RssSampler:
    """Peak RSS of this process, sampled by a daemon thread."""

    def __init__(self, interval_s: float = 0.002):
        import psutil

        self._proc, self._interval = psutil.Process(), interval_s
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def now(self) -> int:
        return self._proc.memory_info().rss

    def reset(self) -> int:
        self.peak = self.now()
        return self.peak

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(self._interval)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self.now())


def _estimate(case: dict):
    from agentrl.engines.memory_estimate import ModelDims, estimate_learner_memory

    dims = ModelDims.from_pretrained_dir(case["model"])
    est = estimate_learner_memory(dims, dtype=case["dtype"], zero_stage=case["zero_stage"], num_ranks=1,
                                  gradient_checkpointing=case["ckpt"], micro_batch_tokens=case["rows"] * case["length"],
                                  seq_len=case["length"], with_reference=case["kl_coef"] > 0)
    p = {"float32": 4, "bfloat16": 2, "float16": 2}[case["dtype"]]
    dev = est.device
    init = sum(dev.get(k, 0) for k in ("parameters", "master_fp32", "reference"))
    touched_bucket = p * min(500_000_000, dims.n_params) if dev.get("zero_buffers") else 0
    step = sum(dev.get(k, 0) for k in ("gradients", "fp32_grads", "optimizer", "activations", "logits")) + touched_bucket
    return est, init, step


def _worker(case: dict) -> dict:
    """One case in this process: build, step, measure."""
    sys.path.insert(0, str(REPO))
    from agentrl.config.process_env import set_default_env

    set_default_env(REPO)
    import deepspeed  # noqa: F401  (imported before the baseline: import costs are not the learner's)
    import torch
    import transformers  # noqa: F401

    from agentrl.config.schema import Config
    from agentrl.engines.deepspeed_learner import DeepSpeedLearner

    torch.set_num_threads(case["threads"])
    cfg = Config()
    lcfg = cfg.learner.model_copy(update={"zero_stage": case["zero_stage"], "micro_batch_size": case["rows"],
                                          "gradient_checkpointing": case["ckpt"]})
    acfg = cfg.algo.model_copy(update={"kl_coef": case["kl_coef"]})
    g = torch.Generator().manual_seed(0)
    rows, length = case["rows"], case["length"]
    # row r is r tokens shorter than the longest: padded, as the learner's micro-batches nearly always are
    # (a padded row makes transformers build the attention mask; equal rows would let sdpa skip it)
    ids = [row[: length - r] for r, row in enumerate(torch.randint(3, 600, (rows, length), generator=g).tolist())]
    resp = [[0] * (len(row) // 2) + [1] * (len(row) - len(row) // 2) for row in ids]
    adv = [[float(r % 2 * 2 - 1) * m for m in mask] for r, mask in enumerate(resp)]

    sampler = _RssSampler()
    rss0 = sampler.reset()
    t0 = time.perf_counter()
    learner = DeepSpeedLearner(case["model"], lcfg, acfg, dtype=case["dtype"], seed=0)
    init_peak = sampler.peak
    rss_init = sampler.reset()
    learner.train_step({"input_ids": ids, "response_mask": resp, "advantages": adv})
    step_peak = sampler.stop()
    seconds = time.perf_counter() - t0
    learner.close()
    import resource

    return {"init": rss_init - rss0, "init_peak": max(init_peak, rss_init) - rss0, "step": step_peak - rss_init,
            "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    if args.worker:
        print("RESULT " + json.dumps(_worker(json.loads(args.worker))), flush=True)
        return
    ckpts = {"off": [False], "on": [True], "both": [False, True]}[args.checkpointing]
    print(f"model {args.model}, {args.dtype}, {args.micro_batch_size} rows per micro-batch, kl_coef {args.kl_coef} "
          "(MiB; est = memory_estimate, meas = RSS growth)")
    print("| ZeRO | ckpt | tokens | est init | meas init | est init peak | meas init peak | est step | meas step | step ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for stage in args.zero_stages:
        for ckpt in ckpts:
            for length in args.lengths:
                case = dict(model=args.model, zero_stage=stage, ckpt=ckpt, rows=args.micro_batch_size, length=length,
                            dtype=args.dtype, kl_coef=args.kl_coef, threads=args.threads)
                est, est_init, est_step = _estimate(case)
                # a fixed mmap threshold: glibc's default one grows to 32 MB after the first large free, and
                # freed tensors below it then stay in the heap, in RSS (see the module docstring)
                env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MALLOC_MMAP_THRESHOLD_": "65536"}
                out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(case)], capture_output=True,
                                     text=True, cwd=REPO, env=env)
                lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
                if out.returncode or not lines:
                    print(f"| {stage} | {ckpt} | {case['rows'] * length} | case failed: {out.stderr.strip()[-400:]} |")
                    continue
                r = json.loads(lines[-1][len("RESULT "):])
                print(f"| {stage} | {'on' if ckpt else 'off'} | {case['rows'] * length} | {est_init / MiB:.1f} | "
                      f"{r['init'] / MiB:.1f} | {(est_init + est.init_host) / MiB:.1f} | {r['init_peak'] / MiB:.1f} | "
                      f"{est_step / MiB:.1f} | {r['step'] / MiB:.1f} | {r['step'] / est_step:.2f} |", flush=True)


if __name__ == "__main__":
    main()
