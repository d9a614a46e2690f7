"""One real-model step, replayed through several learner paths in one run.

The step: 32 SmolLM2 episodes (4 bank tasks x 8 samples at T = 1, through vLLM and the real
episode loop at configs/smollm2_bank.yaml's limits), GRPO advantages from their outcomes, the
engine's log-probs as the sampler's, sampled by policy version 0; every path trains on the same
saved episodes. Each path trains on it once in a fresh subprocess, so its peak RSS is
its own. A path is a source tree and learner settings: ``--old-src`` points at a checkout of the
learner before the log-prob head (e.g. a ``git worktree`` of an older commit), run with the
settings configs/smollm2_bank.yaml had then.

Reported per path: the update's wall time, its phases (reference and pi_old passes, the
mini-batches' forward+backward, the optimizer steps), the peak RSS of the process, and the loss;
the JSON goes to ``--out``.

    git worktree add .cache/old-learner 7aa87fe
    .venv/bin/python benchmarks/real_model_step.py --old-src .cache/old-learner

Generation is measured too: the same 32 episodes' tasks sampled by a vLLM engine at float32 and
at bfloat16 (``rollout.engine.dtype``), each in its own process; the float32 engine's episodes
are the step the learners replay. A step's time is then generation + update.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# configs/smollm2_bank.yaml's algorithm; the learner settings of each path are below
ALGO = {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.001, "kl_estimator": "k3", "tis_cap": 2.0}
BASE = {"zero_stage": 1, "lr": 1e-5, "grad_clip": 1.0, "ppo_epochs": 1, "mini_batches": 2, "threads": 2}
PATHS = {
    # the learner as it was: head on every position, a separate pi_old pass, fp32
    "old": {"src": "old", "learner": {**BASE, "micro_batch_size": 4}},
    # the log-prob head on policy tokens only and pi_old from the rollout, still fp32
    "head+rollout_old": {"src": "new", "learner": {**BASE, "micro_batch_size": 4, "old_logprobs": "auto"}},
    # ... and bf16 autocast
    "head+rollout_old+bf16": {"src": "new", "learner": {**BASE, "micro_batch_size": 4, "old_logprobs": "auto",
                                                        "autocast": "bfloat16"}},
    # ... and gradient checkpointing (the memory lever)
    "new (+checkpointing)": {"src": "new", "learner": {**BASE, "micro_batch_size": 4, "old_logprobs": "auto",
                                                       "autocast": "bfloat16", "gradient_checkpointing": True}},
    # ... and ZeRO-0: one rank partitions nothing, so ZeRO-1's fp32 gradient copy and reduce bucket are overhead
    "new (+checkpointing +ZeRO-0)": {"src": "new", "learner": {**BASE, "zero_stage": 0, "micro_batch_size": 4,
                                                               "old_logprobs": "auto", "autocast": "bfloat16",
                                                               "gradient_checkpointing": True}},
}


def sample_step(model: str, dtype: str, tasks: int, per_task: int, out: Path | None) -> dict:
    """In this (fresh) process: sample ``tasks`` x ``per_task`` episodes of the bank suite with a
    vLLM engine at ``dtype`` through the real episode loop, at configs/smollm2_bank.yaml's limits
    and T = 1, and time it (the generation phase of a step; tools run in process). With ``out``,
    save them as a TrainBatch's fields: GRPO advantages of each task's group from the episodes'
    outcome (all turns passed), the engine's log-probs as the sampler's, policy version 0."""
    import asyncio

    import torch
    from transformers import AutoTokenizer

    from agentrl.agent.chat import formatter_for
    from agentrl.agent.episode import EpisodeLimits, run_episode
    from agentrl.config.engine_schema import EngineConfig
    from agentrl.engines.vllm_engine import SamplingConfig, VLLMEngine
    from agentrl.envs.builtin.generator import generate_tasks
    from agentrl.envs.session import LocalEnvSession
    from agentrl.rollout.worker import _EnginePolicy

    formatter = formatter_for(AutoTokenizer.from_pretrained(model))
    limits = EpisodeLimits(max_new_tokens=128, max_assistant_messages_per_turn=4, max_episode_tokens=1536)
    t0 = time.perf_counter()
    engine = VLLMEngine(model, EngineConfig(kv_cache_gib=2, max_model_len=2048, block_size=32, dtype=dtype), seed=0)
    start_s = time.perf_counter() - t0
    task_list = generate_tasks(tasks, seed=31_000, id_prefix="bench", suite="bank")
    per_message: dict[int, list[int]] = {}  # k-th message of an episode -> [prompt tokens, of them cached]

    class Recording(_EnginePolicy):
        """The rollout worker's policy, noting each message's prompt and prefix-cache hit."""

        def __init__(self):
            super().__init__(engine, SamplingConfig(temperature=1.0), formatter.eos_token_ids)
            self.calls = 0

        async def generate(self, prompt_ids, max_tokens):
            gen = await super().generate(prompt_ids, max_tokens)
            row = per_message.setdefault(self.calls, [0, 0])
            row[0] += len(prompt_ids)
            row[1] += gen.cached_tokens
            self.calls += 1
            return gen

    async def episodes():
        return await asyncio.gather(*[run_episode(t, Recording(), LocalEnvSession(t), formatter, limits)
                                      for t in task_list for _ in range(per_task)])

    t0 = time.perf_counter()
    eps = asyncio.run(episodes())
    gen_s = time.perf_counter() - t0
    cache = engine.cache_stats()
    engine.shutdown()  # its engine-core process would outlive this one
    outcome = torch.tensor([float(all(e.turn_passed)) for e in eps])
    adv = []
    for k in range(0, len(eps), per_task):  # GRPO: (r - group mean) / group std
        r = outcome[k : k + per_task]
        adv += ((r - r.mean()) / (r.std() + 1e-6)).tolist()
    lengths = [len(e.token_ids) for e in eps]
    policy_tokens = sum(sum(e.response_mask) for e in eps)
    if out is not None:
        out.write_text(json.dumps({
            "input_ids": [e.token_ids for e in eps], "response_mask": [e.response_mask for e in eps],
            "rollout_logprobs": [list(e.logprobs) for e in eps], "versions": [0] * len(eps),
            "advantages": [[a * m for m in e.response_mask] for a, e in zip(adv, eps)]}))
    return {"engine_dtype": dtype, "engine_start_s": start_s, "generation_s": gen_s, "episodes": len(eps),
            "tokens": sum(lengths), "policy_tokens": policy_tokens, "policy_fraction": policy_tokens / sum(lengths),
            "median_length": sorted(lengths)[len(lengths) // 2], "max_length": max(lengths),
            "success": float(outcome.mean()), "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "kv_cache": cache, "prefix_hit_by_message": {k: v[1] / v[0] for k, v in sorted(per_message.items()) if v[0]},
            "prompt_tokens_by_message": {k: v[0] for k, v in sorted(per_message.items())}}


def _cpu_seconds() -> float:
    """CPU seconds this process has used (all threads): the update's work, which other processes on
    a busy machine slow down less than its wall time."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_path(src: str, model: str, step_file: str, learner: dict) -> dict:
    """In this (fresh) process: build the learner of tree ``src`` and time one train_step."""
    sys.path.insert(0, src)
    import torch

    torch.set_num_threads(learner.get("threads") or 2)
    from agentrl.config.schema import AlgoConfig, LearnerConfig
    from agentrl.engines.deepspeed_learner import DeepSpeedLearner

    step = json.loads(Path(step_file).read_text())
    fields = LearnerConfig.model_fields
    if "versions" not in __import__("agentrl.api", fromlist=["TrainBatch"]).TrainBatch.__dataclass_fields__:
        step.pop("versions")  # an older tree's batch has no versions
    t0 = time.perf_counter()
    # the bf16 paths stand for the config's bf16 engines: their episodes' log-probs are pi_old
    # (learner.old_logprobs: auto); the replayed tokens cost the learner the same either way
    extra = {"sampler_dtype": learner["autocast"]} if learner.get("autocast") else {}
    lrn = DeepSpeedLearner(model, LearnerConfig(**{k: v for k, v in learner.items() if k in fields}), AlgoConfig(**ALGO),
                           "float32", seed=0, **extra)
    init_s = time.perf_counter() - t0
    phases: dict[str, float] = {}
    for name in ("_reference_and_old_passes", "_train_mini_batch", "_optimizer_step"):
        inner = getattr(lrn, name)

        def timed(*a, _inner=inner, _name=name, **k):
            t = time.perf_counter()
            try:
                return _inner(*a, **k)
            finally:
                phases[_name] = phases.get(_name, 0.0) + time.perf_counter() - t

        setattr(lrn, name, timed)
    t0, cpu0 = time.perf_counter(), _cpu_seconds()
    metrics = lrn.train_step(step)
    update_s, update_cpu_s = time.perf_counter() - t0, _cpu_seconds() - cpu0
    # _train_mini_batch includes the optimizer steps: report the forward+backward part alone
    phases["forward_backward"] = phases.pop("_train_mini_batch") - phases.get("_optimizer_step", 0.0)
    return {"init_s": init_s, "update_s": update_s, "update_cpu_s": update_cpu_s, "phases_s": phases,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "loss": metrics["loss"], "entropy": metrics.get("entropy"), "grad_norm": metrics["grad_norm"],
            "logprob_mismatch": metrics.get("logprob_mismatch"), "old_from_rollout": metrics.get("old_from_rollout", 0.0)}


def _subprocess(args: list[str], what: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"{what}: the subprocess failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][7:]) | {"load_after": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".cache/models/smollm2-warm")
    ap.add_argument("--old-src", help="a source tree of the learner before the log-prob head (skipped if not given)")
    ap.add_argument("--paths", default=",".join(PATHS), help="which of: " + ", ".join(PATHS))
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--per-task", type=int, default=8)
    ap.add_argument("--out", default="docs/benchmarks/real_model_step.json")
    ap.add_argument("--threads", type=int, help="the learners' torch threads (default: the config's 2); at 1 on a "
                    "busy machine, CPU seconds measure each path's work without OpenMP's waits")
    ap.add_argument("--reuse-step", action="store_true",
                    help="replay the episodes saved by an earlier run (and keep its generation numbers from --out)")
    ap.add_argument("--worker", nargs=3, metavar=("SRC", "STEP_FILE", "LEARNER_JSON"), help=argparse.SUPPRESS)
    ap.add_argument("--sample", nargs=2, metavar=("DTYPE", "STEP_FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        src, step_file, learner = args.worker
        print("RESULT " + json.dumps(run_path(src, args.model, step_file, json.loads(learner))))
        return
    if args.sample:
        dtype, step_file = args.sample
        result = sample_step(args.model, dtype, args.tasks, args.per_task, Path(step_file) if step_file != "-" else None)
        print("RESULT " + json.dumps(result), flush=True)
        return
    cache = ROOT / ".cache" / "benchmarks"
    cache.mkdir(parents=True, exist_ok=True)
    step_file = cache / "real_model_step.json"
    out: dict = {"machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()}, "date": time.strftime("%Y-%m-%d %H:%M"),
                 "model": args.model, "generation": {}, "paths": {}}
    common = ["--model", args.model, "--tasks", str(args.tasks), "--per-task", str(args.per_task)]
    if args.reuse_step:
        out["generation"] = json.loads(Path(args.out).read_text())["generation"]
    for dtype, save in () if args.reuse_step else (("float32", str(step_file)), ("bfloat16", "-")):
        res = _subprocess(common + ["--sample", dtype, save], f"sampling at {dtype}")
        out["generation"][dtype] = res
        print(f"generation at {dtype}: {res['generation_s']:.1f}s for {res['episodes']} episodes, {res['tokens']} tokens "
              f"(median {res['median_length']}, max {res['max_length']}, policy {res['policy_fraction']:.2f}), "
              f"success {res['success']:.2f}; prefix-cache hit rate {res['kv_cache']['prefix_cache_hit_rate']:.2f}, "
              f"preemptions {res['kv_cache']['preemptions']:.0f}", flush=True)
    for name in args.paths.split(","):
        spec = PATHS[name]
        if args.threads:
            spec = {**spec, "learner": {**spec["learner"], "threads": args.threads}}
        src = str(ROOT) if spec["src"] == "new" else args.old_src
        if src is None:
            print(f"{name}: skipped (no --old-src)")
            continue
        res = _subprocess(common + ["--worker", str(Path(src).resolve()), str(step_file), json.dumps(spec["learner"])], name)
        out["paths"][name] = res | {"learner": spec["learner"]}
        phases = ", ".join(f"{k} {v:.1f}s" for k, v in res["phases_s"].items())
        print(f"{name}: update {res['update_s']:.1f}s, {res['update_cpu_s']:.0f} CPU-s ({phases}), "
              f"peak RSS {res['peak_rss_gib']:.2f} GiB, loss {res['loss']:.4f}, old_from_rollout {res['old_from_rollout']}",
              flush=True)
    paths, gen = out["paths"], out["generation"]
    if "old" in paths:
        base = paths["old"]["update_s"]
        out["update_speedup_vs_old"] = {k: base / v["update_s"] for k, v in paths.items()}
        print("update speed-up against old: " + ", ".join(f"{k} {v:.2f}x" for k, v in out["update_speedup_vs_old"].items()))
        # a step = generation + update (weight sync: ~1.5 % of an old step, left out)
        old_step = gen["float32"]["generation_s"] + base
        out["step_s"] = {"old (fp32 engine)": old_step}
        for k, v in paths.items():
            if v["learner"].get("autocast") == "bfloat16":
                out["step_s"][f"{k} (bf16 engine)"] = gen["bfloat16"]["generation_s"] + v["update_s"]
        print("step (generation + update): " + ", ".join(f"{k} {v:.0f}s ({old_step / v:.2f}x)" for k, v in out["step_s"].items()))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
