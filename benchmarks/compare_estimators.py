"""Learning comparison of advantage estimators on the built-in suite (issue: algorithms).

Trains each estimator for each seed with the same rollout budget (steps x tasks_per_step x
group_size episodes), evaluating greedily on the held-out set every ``--eval-every`` steps, and
writes a Markdown table (final held-out success, mean calls per episode, redundant-call rate)
plus a PNG of held-out success against trajectories consumed to ``--out`` (run folders, with
their checkpoints, go to .cache/benchmarks/estimators).

    .venv/bin/python benchmarks/compare_estimators.py --out docs/benchmarks/estimators

Each run is ``agentrl train configs/quickstart.yaml`` in its own process (its own embedded Ray),
so a crash in one run is reported and the others still go ahead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# ppo needs a critic; its lr follows the policy's (the tiny model's learning rate).
EXTRA = {"ppo": ["algo.critic.lr=1e-4"]}


def train_quickstart(run_out: Path, overrides: list[str]) -> tuple[Path | None, float, str]:
    """``agentrl train configs/quickstart.yaml`` with ``overrides`` into a fresh ``run_out``, in its
    own process (its own embedded Ray). Returns (run folder or None on failure, minutes, stderr tail)."""
    if run_out.exists():
        import shutil

        shutil.rmtree(run_out)
    cmd = [sys.executable, "-m", "agentrl.cli", "train", str(ROOT / "configs" / "quickstart.yaml"),
           f"run.output_dir={run_out}", "train.max_minutes=null", "telemetry.progress=false", *overrides]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    minutes = (time.time() - t0) / 60
    return (next(run_out.iterdir()) if proc.returncode == 0 else None), minutes, proc.stderr[-2000:]


def run_one(estimator: str, seed: int, args, out: Path) -> dict:
    run_out = ROOT / ".cache" / "benchmarks" / "estimators" / f"{estimator}-s{seed}"  # checkpoints stay out of git
    run_dir, minutes, err = train_quickstart(run_out, [
        f"algo.advantage={estimator}", f"run.seed={seed}", f"run.name={estimator}-s{seed}",
        f"train.steps={args.steps}", f"train.eval_every={args.eval_every}", f"tasks.heldout_size={args.heldout}",
        f"rollout.tasks_per_step={args.tasks_per_step}", f"rollout.group_size={args.group_size}",
        *EXTRA.get(estimator, []), *args.override,
    ])
    if run_dir is None:
        return {"estimator": estimator, "seed": seed, "error": err, "minutes": minutes}
    evals = json.loads((run_dir / "evals.json").read_text())
    per_step = args.tasks_per_step * args.group_size
    curve = [(0, evals["start"]["success"])]
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "eval/success" in m:
            curve.append((m["step"] * per_step, m["eval/success"]))
    end = evals["end"]
    return {"estimator": estimator, "seed": seed, "minutes": minutes, "curve": curve, "start": evals["start"]["success"],
            "end": end["success"], "mean_calls": end["mean_calls"], "redundant_call_rate": end["redundant_call_rate"]}


def _mean_sd(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def table(results: list[dict], estimators: list[str]) -> str:
    rows = ["| estimator | runs | held-out success start | held-out success end | mean calls / episode "
            "| redundant-call rate | minutes / run |",
            "|---|---|---|---|---|---|---|"]
    for est in estimators:
        ok = [r for r in results if r["estimator"] == est and "error" not in r]
        failed = len([r for r in results if r["estimator"] == est and "error" in r])
        if not ok:
            rows.append(f"| {est} | 0 ok, {failed} failed | | | | | |")
            continue
        rows.append(
            f"| {est} | {len(ok)}{f' ({failed} failed)' if failed else ''} | {_mean_sd([r['start'] for r in ok])} | "
            f"{_mean_sd([r['end'] for r in ok])} | {_mean_sd([r['mean_calls'] for r in ok])} | "
            f"{_mean_sd([r['redundant_call_rate'] for r in ok])} | {statistics.mean(r['minutes'] for r in ok):.1f} |"
        )
    return "\n".join(rows)


def plot(results: list[dict], estimators: list[str], path: Path, series: str = "curve",
         ylabel: str = "held-out success (greedy)") -> None:
    """Mean over seeds of each run's ``series`` ([(trajectories, value)]) per estimator (or arm)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for est in estimators:
        curves = [r[series] for r in results if r["estimator"] == est and "error" not in r]
        if not curves:
            continue
        xs = [x for x, _ in curves[0]]
        ys = [statistics.mean(c[i][1] for c in curves if i < len(c)) for i in range(len(xs))]
        ax.plot(xs, ys, marker="o", label=f"{est} (mean of {len(curves)})")
    ax.set_xlabel("trajectories consumed")
    ax.set_ylabel(ylabel)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--estimators", default="grpo,slca,gigpo,ppo")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--tasks-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--heldout", type=int, default=100, help="held-out tasks per evaluation")
    p.add_argument("--out", default="docs/benchmarks/estimators")
    p.add_argument("override", nargs="*", help="extra KEY=VALUE overrides for every run")
    args = p.parse_args()
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    estimators = args.estimators.split(",")
    results = []
    for seed in map(int, args.seeds.split(",")):
        for est in estimators:
            r = run_one(est, seed, args, out)
            results.append(r)
            status = f"end {r['end']:.3f}" if "error" not in r else "FAILED"
            print(f"{est} seed {seed}: {status} ({r['minutes']:.1f} min)", flush=True)
            (out / "results.json").write_text(json.dumps(results, indent=1))
    md = table(results, estimators)
    (out / "table.md").write_text(md + "\n")
    plot(results, estimators, out / "success_vs_trajectories.png")
    print(md)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
