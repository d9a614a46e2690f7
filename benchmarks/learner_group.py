"""Learner group (agentrl/learning/learner_group.py): step time and per-rank peak memory with each memory lever.

    .venv/bin/python benchmarks/learner_group.py --size 135m --micro-batch-size 2 --out .cache/bench-learner-group/135m
    .venv/bin/python benchmarks/learner_group.py --size small --steps 1 --cases z1 z3x2      # smoke run

At 135m, micro-batches of 8 x 1000 tokens need ~12 GiB of activations per rank (the estimate), so
a 2-rank case wants ~30 GiB: a case whose ranks x (estimate + baseline RSS) exceed --mem-fraction
of the available memory is skipped, not run. One step of the default 32 episodes (~18k tokens) is
~20 TFLOP at 135m: several minutes per step on one thread; --episodes/--max-len make it shorter.

A random-init Llama model ("135m": SmolLM2-135M's dimensions; "small": ~2M parameters) is written
once under .cache/bench-learner-group/models, and one synthetic step of ``--episodes`` episodes
(lengths uniform in [--min-len, --max-len], GRPO groups of --group-size) goes to the object store.
Each case starts a LearnerGroup (1 CPU and 1 torch thread per rank, gloo), runs ``--steps`` train
steps on that same step and is killed; a case that fails is recorded with its error. Columns:

* step s: median wall time of ``ray.get(group.train.remote(refs))`` at the driver (the first step
  also allocates AdamW's moments; every time is in results.json);
* peak RSS/rank: the learner's ``memory/peak_rss_mib``, max over ranks of the process's resident
  high-water mark since it started (model loading included);
* est/rank: ``estimate_learner_memory`` for the case's settings, device + host terms (on CPU both
  are host memory, both in RSS), split into model states (+ reference model, ZeRO buffers) and
  activations (+ the LM-head logits chunk), for micro-batches of micro_batch_size x --max-len
  tokens (the config's bound, as ``estimate_for_config``; results.json also has ``estimate_step``,
  for the largest micro-batch this step makes on a rank). ZeRO's reduce bucket is counted as the
  pages RSS can see, p x min(bucket, trained parameters), not the whole 5e8-element buffer a CUDA
  allocator would reserve (as benchmarks/learner_memory.py does);
* overhead: peak RSS - baseline - est. The estimate counts model states and activations, RSS also
  holds the Python/torch/DeepSpeed/Ray process. The "baseline" case measures that process: a 1-rank
  group on a ~0-parameter model of the same code, trained on one tiny step; without it, overhead is
  RSS - est;
* padded frac: padding / processed tokens over every rank's micro-batches as the learner forms them
  (rows length-sorted, dealt to the ranks, split by micro_batch_size or the token budget; the empty
  micro-batches that keep ranks in step left out).

RSS is a coarse stand-in for device memory: it counts touched pages, glibc keeps freed memory
(MALLOC_MMAP_THRESHOLD_=65536 is set for the ranks to limit that), and on a CPU-only machine
offload moves nothing off a device: optimizer/parameter offload cannot show a memory effect here.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
SIZES = {  # LlamaConfig dimensions; every model has tied embeddings
    "135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                 intermediate_size=1536, vocab_size=49152),
    "small": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=384, vocab_size=8192),
    "baseline": dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                     intermediate_size=16, vocab_size=64),
}
# name -> (ranks, ZeRO stage, learner settings, LoRA rank); "baseline" runs the ~0-parameter model
CASES = {
    "baseline": (1, 1, {}, 0),
    "z1": (1, 1, {}, 0),
    "z3": (1, 3, {}, 0),
    "z3x2": (2, 3, {}, 0),
    "z3x2-ckpt": (2, 3, {"gradient_checkpointing": True}, 0),
    "z3x2-pack": (2, 3, {"packing": True}, 0),
    "z2x2-offload-opt": (2, 2, {"offload_optimizer": True}, 0),
    "z3x2-offload-params": (2, 3, {"offload_params": True}, 0),
    "z1-lora16": (1, 1, {}, 16),
}
LEVER_NAMES = {"gradient_checkpointing": "ckpt", "packing": "packing", "offload_optimizer": "offload opt",
               "offload_params": "offload params"}


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="What each number means: see the module docstring.")
    ap.add_argument("--size", default="small", choices=["small", "135m"])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--steps", type=int, default=3, help="train steps per case (the median time is reported)")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--group-size", type=int, default=8, help="episodes per GRPO group")
    ap.add_argument("--min-len", type=int, default=200)
    ap.add_argument("--max-len", type=int, default=1000)
    ap.add_argument("--micro-batch-size", type=int, default=8, help="learner.micro_batch_size")
    ap.add_argument("--max-tokens", type=int, default=None, help="learner.max_tokens_per_micro_batch (default: none)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--kl-coef", type=float, default=0.001, help="> 0: a frozen reference model (not with LoRA)")
    ap.add_argument("--num-cpus", type=int, default=2, help="ray.init(num_cpus=...): at least the largest group's ranks")
    ap.add_argument("--mem-fraction", type=float, default=0.9,
                    help="skip a case whose ranks x (estimate + baseline RSS) exceed this share of the available memory")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds one build or step may take before the case fails")
    ap.add_argument("--out", default=str(REPO / ".cache" / "bench-learner-group" / "out"))
    return ap.parse_args(argv)


def build_model(size: str) -> str:
    """A random-init LlamaForCausalLM of ``SIZES[size]`` (seed 0), written once and reused."""
    path = REPO / ".cache" / "bench-learner-group" / "models" / f"llama-{size}"
    if not (path / "config.json").exists():
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        cfg = LlamaConfig(**SIZES[size], tie_word_embeddings=True, max_position_embeddings=8192)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        LlamaForCausalLM(cfg).save_pretrained(tmp)
        tmp.rename(path)
    return str(path)


def make_groups(n: int, lo: int, hi: int, vocab: int, group_size: int, seed: int = 0) -> list:
    """``n`` random episodes of ``lo``-``hi`` tokens (up to 32 prompt tokens) in GRPO groups, with
    rewards that vary within each group (so the advantages are not all 0)."""
    from agentrl.api import Episode, EpisodeGroup

    rng = random.Random(seed)
    groups = []
    for g, start in enumerate(range(0, n, group_size)):
        eps = []
        for k in range(min(group_size, n - start)):
            length = rng.randint(lo, hi)
            prompt = min(32, length // 2)
            mask = [0] * prompt + [1] * (length - prompt)
            eps.append(Episode(task_id=f"t{g}", token_ids=[rng.randrange(3, vocab) for _ in range(length)], response_mask=mask,
                               logprobs=[-5.5 * m for m in mask], segments=[2 * m for m in mask], prompt_len=prompt,
                               turn_passed=[bool(k % 2)], n_turns=1, rewards={"outcome": float(k % 2), "progress": float(k % 2)}))
        groups.append(EpisodeGroup(f"t{g}", f"g{g}", 0, eps))
    return groups


def padded(lengths: list[int], ranks: int, mbs: int, max_tokens: int | None, packed: bool) -> tuple[float, int, int]:
    """(padded fraction, the largest micro-batch's processed tokens, its row length) of the
    micro-batches the ranks run (``learner_shards.plan_mini_batch``, as the learner plans them)."""
    from agentrl.engines.learner_shards import plan_mini_batch
    from agentrl.engines.micro_batch import padding_fraction, split_micro_batches

    rows = list(range(len(lengths)))

    def split(sorted_rows: list[int]) -> list[list[int]]:
        return split_micro_batches(sorted_rows, lengths, mbs, max_tokens, packed=packed)

    micro = [mb for r in range(ranks) for mb in plan_mini_batch(rows, lengths, lengths, r, ranks, split).rows]
    cost, mb = max(((sum(lengths[i] for i in mb) if packed else len(mb) * max(lengths[i] for i in mb)), mb) for mb in micro)
    return padding_fraction(micro, lengths, packed), cost, cost if packed else max(lengths[i] for i in mb)


def estimate(model: str, name: str, args: argparse.Namespace, tokens: int = 0, seq_len: int = 0) -> dict:
    """The case's per-rank estimate (MiB): model states and activations, device + host together;
    micro-batches of ``tokens`` in rows of ``seq_len`` (default: the config's bound)."""
    from agentrl.engines.memory_estimate import DTYPE_BYTES, ModelDims, estimate_learner_memory

    ranks, zero, levers, lora = CASES[name]
    dims = ModelDims.from_pretrained_dir(model)
    max_len = 16 if name == "baseline" else args.max_len
    tokens = tokens or args.max_tokens or args.micro_batch_size * max_len
    seq_len = seq_len or (tokens if levers.get("packing") else min(tokens, max_len))
    est = estimate_learner_memory(
        dims, dtype=args.dtype, zero_stage=zero, num_ranks=ranks, offload_optimizer=levers.get("offload_optimizer", False),
        offload_params=levers.get("offload_params", False), gradient_checkpointing=levers.get("gradient_checkpointing", False),
        micro_batch_tokens=tokens, seq_len=seq_len,
        with_reference=args.kl_coef > 0 and not lora, lora_rank=lora)  # with LoRA the reference is the adapters off
    terms: dict[str, int] = {}
    for part in (est.device, est.host):
        for k, v in part.items():
            terms[k] = terms.get(k, 0) + v
    trained = est.inputs["lora_params"] if lora else dims.n_params
    terms["zero_buffers"] = min(terms.get("zero_buffers", 0), DTYPE_BYTES[args.dtype] * trained)  # touched pages only
    acts = terms.get("activations", 0) + terms.get("logits", 0)
    states = sum(v for k, v in terms.items() if k not in ("activations", "logits"))
    return {"states_mib": states / MiB, "activations_mib": acts / MiB, "total_mib": (states + acts) / MiB,
            "micro_batch_tokens": tokens, "terms_mib": {k: v / MiB for k, v in terms.items()},
            "init_host_mib": est.init_host / MiB, "n_params": dims.n_params}


def describe(name: str) -> dict:
    ranks, zero, levers, lora = CASES[name]
    return {"case": name, "ranks": ranks, "zero": zero, "error": None,
            "levers": ", ".join([LEVER_NAMES[k] for k in levers] + ([f"LoRA r={lora}"] if lora else []))}


def run_case(name: str, model: str, refs: list, args: argparse.Namespace) -> dict:
    """Build the case's group, train ``--steps`` steps, kill it; errors are recorded, not raised."""
    import ray

    from agentrl.config.schema import AlgoConfig, Config, LearnerConfig, LoraConfig, ModelConfig
    from agentrl.learning.learner_group import LearnerGroup

    ranks, zero, levers, lora = CASES[name]
    out, group = describe(name), None
    try:  # validated: a lever the config refuses fails here, with the config's message
        lcfg = LearnerConfig(zero_stage=zero, num_ranks=ranks, micro_batch_size=args.micro_batch_size, threads=1,
                             max_tokens_per_micro_batch=args.max_tokens, **levers)
        lora_cfg = LoraConfig(rank=lora, alpha=2.0 * lora) if lora else LoraConfig()
        cfg = Config(model=ModelConfig(path=model, dtype=args.dtype, lora=lora_cfg), learner=lcfg,
                     algo=AlgoConfig(kl_coef=args.kl_coef))  # runtime: 1 CPU per rank, no GPU
        t0 = time.perf_counter()
        group = LearnerGroup.create(cfg, model)
        ray.get(group.get_version.remote(), timeout=args.timeout)  # every rank built (or its error)
        out["build_s"] = time.perf_counter() - t0
        times = []
        for s in range(args.steps):
            t0 = time.perf_counter()
            metrics = ray.get(group.train.remote(refs), timeout=args.timeout)
            times.append(time.perf_counter() - t0)
            print(f"    step {s + 1}/{args.steps}: {times[-1]:.1f} s, peak RSS/rank {metrics['memory/peak_rss_mib']:.0f} MiB",
                  flush=True)
        out.update(step_s=statistics.median(times), step_times_s=times, learner_step_s=metrics["step_time_s"],
                   peak_rss_mib=metrics["memory/peak_rss_mib"], tokens=metrics["tokens"])
    except Exception as e:  # noqa: BLE001 (a failed case is a result)
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        out["error"] = f"{type(e).__name__}: {lines[-1] if lines else ''}"[:400]
        print(f"    failed: {out['error']}", flush=True)
    finally:
        if group is not None:
            group.kill()
    return out


def table(results: list[dict], baseline: float | None) -> str:
    base = "baseline" if baseline is not None else "(no baseline case)"
    rows = ["| case | ranks | ZeRO | levers | step s | peak RSS/rank MiB | est/rank MiB (states + acts) | "
            f"overhead MiB (RSS - {base} - est) | padded frac | policy tokens |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        e = r["estimate"]
        est = f"{e['total_mib']:.0f} ({e['states_mib']:.0f} + {e['activations_mib']:.0f})"
        head = f"| {r['case']} | {r['ranks']} | {r['zero']} | {r['levers'] or '-'} |"
        if r["error"]:
            rows.append(f"{head} - | {r['error'].replace('|', '/')} | {est} | - | {r['padded_frac']:.3f} | - |")
            continue
        over = r["peak_rss_mib"] - (0.0 if baseline is None or r["case"] == "baseline" else baseline) - e["total_mib"]
        rows.append(f"{head} {r['step_s']:.2f} | {r['peak_rss_mib']:.0f} | {est} | {over:.0f} | {r['padded_frac']:.3f} | "
                    f"{r['tokens']:.0f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    from agentrl.config.process_env import set_default_env

    set_default_env(REPO)
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")  # inherited by the ranks: freed tensors leave RSS
    import psutil
    import ray

    from agentrl.api import GroupRef

    t_start = time.perf_counter()
    model, base_model = build_model(args.size), build_model("baseline")
    groups = make_groups(args.episodes, args.min_len, args.max_len, SIZES[args.size]["vocab_size"], args.group_size)
    lengths = [len(e.token_ids) for g in groups for e in g.episodes]
    fractions = {k: padded(lengths, 1, args.micro_batch_size, args.max_tokens, packed=k == "packed")[0]
                 for k in ("padded", "packed")}
    print(f"model {model}: {sum(lengths)} tokens in {len(lengths)} episodes; padded fraction of one rank's micro-batches "
          f"{fractions['padded']:.3f} without packing, {fractions['packed']:.3f} with", flush=True)
    ray.init(address="local", num_cpus=args.num_cpus, num_gpus=0, include_dashboard=False, log_to_driver=False,
             object_store_memory=512 * MiB, _temp_dir=os.environ.get("RAY_TMPDIR", "/tmp/agentrl-ray-bench"))
    refs = [GroupRef(ray.put(g), g.version) for g in groups]
    tiny = [GroupRef(ray.put(g), g.version) for g in make_groups(2, 16, 16, SIZES["baseline"]["vocab_size"], 2)]
    results, baseline = [], None
    try:
        for i, name in enumerate(args.cases, start=1):
            print(f"[{i}/{len(args.cases)}] {name} (elapsed {time.perf_counter() - t_start:.0f} s)", flush=True)
            is_base, (ranks, _, levers, _) = name == "baseline", CASES[name]
            est = estimate(base_model if is_base else model, name, args)
            need, free = ranks * (est["total_mib"] + (baseline or 0.0)), psutil.virtual_memory().available / MiB
            if need > args.mem_fraction * free:  # an OOM here could take other processes of the machine with it
                r = {**describe(name), "error": f"skipped: estimate {need:.0f} MiB for {ranks} rank(s) > "
                                                f"{args.mem_fraction:.0%} of the {free:.0f} MiB available"}
                print(f"    {r['error']}", flush=True)
            else:
                r = run_case(name, base_model if is_base else model, tiny if is_base else refs, args)
            r["estimate"] = est
            if is_base and not r["error"]:
                baseline = r["peak_rss_mib"]
            step_lengths = [16, 16] if is_base else lengths
            r["padded_frac"], tokens, seq_len = padded(step_lengths, ranks, args.micro_batch_size, args.max_tokens,
                                                       levers.get("packing", False))
            r["estimate_step"] = estimate(base_model if is_base else model, name, args, tokens, seq_len)  # results.json only
            results.append(r)
    finally:
        ray.shutdown()
    from agentrl.engines.memory_estimate import ModelDims

    described = {"135m": "135m (SmolLM2-135M's dimensions, random init)", "small": "small (random init)"}[args.size]
    notes = [
        f"model {described}: {ModelDims.from_pretrained_dir(model).n_params:,} parameters",
        f"step: {len(lengths)} episodes of {args.min_len}-{args.max_len} tokens, micro_batch_size {args.micro_batch_size}, "
        f"token budget {args.max_tokens}, {args.dtype}, kl_coef {args.kl_coef}, {args.steps} steps per case",
        f"padded fraction (1 rank): {fractions['padded']:.3f} without packing, {fractions['packed']:.3f} with",
        "peak RSS/rank: max over ranks of the process's resident high-water mark (loading included)",
        "est: estimate_learner_memory, device + host per rank (ZeRO bucket: touched pages only); it counts model states "
        "and activations, RSS also holds the Python/torch/DeepSpeed process: overhead = RSS - baseline case's RSS - est",
        "RSS is a coarse stand-in for device memory; on this CPU-only machine offload moves nothing off a device, "
        "so its memory effect cannot show here",
    ]
    text = table(results, baseline) + "\n\n" + "\n".join(f"* {n}" for n in notes) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "padded_fraction": fractions, "baseline_rss_mib": baseline,
                                                  "cases": results}, indent=2))
    (out / "table.md").write_text(text)
    print(f"\n{text}\nwritten: {out / 'results.json'}, {out / 'table.md'} "
          f"(total {time.perf_counter() - t_start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
