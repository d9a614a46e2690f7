"""RODS versus the same training on the fixed seed set (issue: RODS), on the built-in suite.

Both arms train the tiny model with GRPO on the same seed tasks (the first ``--seeds-n`` builtin
train tasks, written to a JSONL file), the same trajectory budget (steps x tasks_per_step x
group_size episodes) and the same run seeds; the RODS arm adds ``rods.enabled=true`` (resample
synthesizer, injection every ``--epoch-steps`` steps). For each run it records held-out success
(greedy, ``--heldout`` tasks) every ``--eval-every`` steps and, every step, the fraction of
training groups whose rewards differ (``train/groups_with_variance``: the groups GRPO learns
from). Writes results.json, table.md and two PNGs to ``--out``; run folders (with the RODS pool
logs) go to .cache/benchmarks/rods.

    .venv/bin/python benchmarks/rods_vs_fixed.py --out docs/benchmarks/rods

A small seed set makes the pool's growth visible within a CPU budget: with 400 seeds and a few
hundred trajectories, synthesized variants would be a few percent of what is sampled.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_estimators import plot, table, train_quickstart  # noqa: E402  (same-folder benchmark helpers)

ROOT = Path(__file__).resolve().parents[1]
ARMS = {"fixed": [], "rods": ["rods.enabled=true"]}


def run_one(arm: str, seed: int, args, seeds_file: Path) -> dict:
    run_dir, minutes, err = train_quickstart(ROOT / ".cache" / "benchmarks" / "rods" / f"{arm}-s{seed}", [
        f"run.seed={seed}", f"run.name={arm}-s{seed}", f"tasks.train={seeds_file}", "tasks.fresh_train=false",
        f"train.steps={args.steps}", f"train.eval_every={args.eval_every}", f"tasks.heldout_size={args.heldout}",
        f"rollout.tasks_per_step={args.tasks_per_step}", f"rollout.group_size={args.group_size}",
        f"rods.epoch_steps={args.epoch_steps}", *ARMS[arm], *args.override,
    ])
    if run_dir is None:
        return {"estimator": arm, "seed": seed, "error": err, "minutes": minutes}
    evals = json.loads((run_dir / "evals.json").read_text())
    per_step = args.tasks_per_step * args.group_size
    curve, variance, pool = [(0, evals["start"]["success"])], [], []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "eval/success" in m:
            curve.append((m["step"] * per_step, m["eval/success"]))
        if "train/groups_with_variance" in m:
            variance.append((m["step"] * per_step, m["train/groups_with_variance"]))
        if "pool/size" in m:
            pool.append({k: m[k] for k in ("step", "pool/size", "pool/synthesized", "pool/pending", "synth/queued",
                                           "synth/acceptance_rate", "pool/total_injected") if k in m})
    end = evals["end"]
    return {"estimator": arm, "seed": seed, "minutes": minutes, "curve": curve, "variance": variance, "pool": pool,
            "start": evals["start"]["success"], "end": end["success"], "mean_calls": end["mean_calls"],
            "redundant_call_rate": end["redundant_call_rate"]}


def variance_table(results: list[dict]) -> str:
    """Mean fraction of groups with reward variance, per arm, in the first and second half."""
    rows = ["| arm | groups with reward variance, first half of steps | second half | synthesized tasks in pool at end |",
            "|---|---|---|---|"]
    for arm in ARMS:
        ok = [r for r in results if r["estimator"] == arm and "error" not in r]
        if not ok:
            continue
        cut = [max(1, len(r["variance"]) // 2) for r in ok]  # a 1-step run has only a first half
        half = [statistics.mean(v for _, v in r["variance"][:c]) for r, c in zip(ok, cut)]
        late = [statistics.mean(v for _, v in (r["variance"][c:] or r["variance"][-1:])) for r, c in zip(ok, cut)]
        synth = [r["pool"][-1]["pool/synthesized"] for r in ok if r["pool"]]
        rows.append(f"| {arm} | {statistics.mean(half):.3f} | {statistics.mean(late):.3f} | "
                    f"{statistics.mean(synth):.1f} |" if synth else
                    f"| {arm} | {statistics.mean(half):.3f} | {statistics.mean(late):.3f} | — |")
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2", help="run seeds (run.seed)")
    p.add_argument("--seeds-n", type=int, default=64, help="seed tasks: the first N builtin train tasks")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--tasks-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--epoch-steps", type=int, default=2, help="RODS injection period (rods.epoch_steps)")
    p.add_argument("--heldout", type=int, default=100, help="held-out tasks per evaluation")
    p.add_argument("--out", default="docs/benchmarks/rods")
    p.add_argument("override", nargs="*", help="extra KEY=VALUE overrides for every run")
    args = p.parse_args()
    from agentrl.envs.builtin.generator import builtin_split
    from agentrl.tasks.io import save_tasks

    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    seeds_file = ROOT / ".cache" / "benchmarks" / "rods" / f"seeds-{args.seeds_n}.jsonl"
    seeds_file.parent.mkdir(parents=True, exist_ok=True)
    save_tasks(builtin_split("train")[: args.seeds_n], seeds_file)
    results = []
    for seed in map(int, args.seeds.split(",")):
        for arm in ARMS:
            r = run_one(arm, seed, args, seeds_file)
            results.append(r)
            status = f"end {r['end']:.3f}" if "error" not in r else "FAILED: " + r["error"][-300:]
            print(f"{arm} seed {seed}: {status} ({r['minutes']:.1f} min)", flush=True)
            (out / "results.json").write_text(json.dumps(results, indent=1))
    md = table(results, list(ARMS)).replace("| estimator |", "| arm |") + "\n\n" + variance_table(results)
    (out / "table.md").write_text(md + "\n")
    plot(results, list(ARMS), out / "success_vs_trajectories.png")
    plot(results, list(ARMS), out / "groups_with_variance.png", series="variance",
         ylabel="training groups with reward variance")
    print(md)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
