"""What each method buys on the learnable quickstart: arms x seeds, one driver for every comparison.

Each run is ``agentrl train configs/quickstart.yaml`` in its own process (its own embedded Ray)
with the same steps and episodes per step (8 tasks x 8 episodes), so every arm consumes the same
number of trajectories; held-out success is greedy on all 200 held-out tasks at the start, at
``--steps // 2`` and at the end. The start (the warm start, greedy) is the same for every arm and
seed, so only the plan's first run measures it. Arms (``--arms`` takes arm or family names; ``rods``
and ``rspo`` name both, and mean the arm):

* estimators — ``grpo`` (the quickstart as shipped), ``dr_grpo``, ``rloo``, ``raft``, ``gigpo``,
  ``turn_grpo``, ``ppo``, ``slca`` (SLCA-GRPO with the rule summary scorer, no LLM);
* learning — ``grpo`` and its control ``shuffled`` (rewards permuted across a step's episodes);
* rods — ``static`` (GRPO on a fixed pool of the first 64 bank-train tasks) and ``rods`` (the same
  seeds, RODS growing the pool with resampled variants, injection every 2 steps);
* rspo — ``rspo`` (GRPO + RSPO: 2 of 8 episodes per group from the explorer), ``process_only``
  (``rspo.swap=false``: the policy trained on the process score), ``gigpo`` and ``rspo_gigpo``;
* combined — ``combined`` (RODS x SLCA x RSPO from the 64 seeds) against ``static`` and ``grpo``.

Writes ``results.json``, ``table.md`` and ``curves_<family>.png`` (held-out success against
trajectories consumed, mean and a min-max band over seeds; ``curves.png`` with every arm when an
``--out`` holds 2-5 of them) to ``--out``; run folders go to
.cache/benchmarks/<name of --out> (.cache/benchmarks/methods by default). ``--keep-done`` skips runs
already in results.json.

    .venv/bin/python benchmarks/compare_methods.py --arms all                       # the suite
    .venv/bin/python benchmarks/compare_methods.py --arms slca --seeds 0            # one arm alone
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / ".cache" / "benchmarks" / "methods"
SEED_TASKS = 64  # the static pool and RODS's seeds: the first 64 bank-train tasks
SEEDS_FILE = RUNS / f"seeds-{SEED_TASKS}.jsonl"
STATIC = ["tasks.train={seeds}", "tasks.fresh_train=false"]
RODS = [*STATIC, "rods.enabled=true", "rods.epoch_steps=2"]  # inject every 2 steps: visible within 10 steps
RSPO = ["rspo.enabled=true"]

# arm -> (overrides, the arm it is compared with, minutes per run measured on 2 otherwise idle
# cores at 10 steps; ppo's is a guess, its critic adds a forward/backward)
ARMS: dict[str, tuple[list[str], str | None, float]] = {
    "grpo": ([], None, 4.6),
    "shuffled": (["algo.shuffle_rewards=true"], "grpo", 4.6),
    "dr_grpo": (["algo.advantage=dr_grpo"], "grpo", 4.6),
    "rloo": (["algo.advantage=rloo"], "grpo", 4.6),
    "raft": (["algo.advantage=raft"], "grpo", 4.6),
    "gigpo": (["algo.advantage=gigpo"], "grpo", 4.6),
    "turn_grpo": (["algo.advantage=turn_grpo"], "grpo", 4.6),
    "ppo": (["algo.advantage=ppo", "algo.critic.lr=1e-4"], "grpo", 6.5),  # the critic follows the policy's lr
    "slca": (["algo.advantage=slca"], "grpo", 4.4),
    "static": (STATIC, "grpo", 4.5),
    "rods": (RODS, "static", 4.6),
    "rspo": (RSPO, "grpo", 6.1),
    "process_only": ([*RSPO, "rspo.swap=false"], "grpo", 6.1),
    "rspo_gigpo": ([*RSPO, "algo.advantage=gigpo"], "gigpo", 6.1),
    "combined": ([*RODS, *RSPO, "algo.advantage=slca"], "static", 6.3),
}
FAMILIES = {
    "estimators": ["grpo", "dr_grpo", "rloo", "raft", "gigpo", "turn_grpo", "ppo", "slca"],
    "learning": ["grpo", "shuffled"],
    "rods": ["static", "rods"],
    "rspo": ["grpo", "rspo", "process_only", "gigpo", "rspo_gigpo"],
    "combined": ["grpo", "static", "combined"],
}
FAMILIES["all"] = list(ARMS)
# per-step training metrics kept for each run (RSPO's and RODS's appear only in their arms)
TRAIN_KEYS = ("train/success", "train/calls_per_episode", "train/groups_with_variance", "train/redundant_call_fraction",
              "reward/summary_score", "reward/omission", "reward/process", "rspo/policy_process",
              "rspo/explorer_success_share", "rspo/kl_policy_explorer", "pool/size", "pool/synthesized",
              "pool/region_boundary", "pool/region_too_hard", "pool/region_mastered")


def train_quickstart(run_out: Path, overrides: list[str], config: Path | None = None) -> tuple[Path | None, float, str]:
    """``agentrl train configs/quickstart.yaml`` (or ``config``) with ``overrides`` into a fresh
    ``run_out``, in its own process. Returns (run folder or None on failure, minutes, stderr tail)."""
    shutil.rmtree(run_out, ignore_errors=True)
    cmd = [sys.executable, "-m", "agentrl.cli", "train", str(config or ROOT / "configs" / "quickstart.yaml"),
           f"run.output_dir={run_out}", "train.max_minutes=null", "telemetry.progress=false", *overrides]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    minutes = (time.time() - t0) / 60
    return (next(run_out.iterdir()) if proc.returncode == 0 else None), minutes, proc.stderr[-2000:]


def run_one(arm: str, seed: int, args, measure_start: bool) -> dict:
    name = f"{arm}-s{seed}"
    overrides = [o.format(seeds=SEEDS_FILE) for o in ARMS[arm][0]]
    # one folder of runs per --out (the default's is RUNS itself), so one setting's runs never replace another's
    run_dir, minutes, err = train_quickstart(RUNS.parent / args.out.name / name, [
        f"run.seed={seed}", f"run.name={name}", f"rollout.engine.seed={seed}", f"train.steps={args.steps}",
        f"train.eval_every={args.steps // 2}", f"train.eval_at_start={str(measure_start).lower()}",
        *overrides, *args.override])
    if run_dir is None:
        return {"arm": arm, "seed": seed, "minutes": round(minutes, 1), "error": err}
    evals = json.loads((run_dir / "evals.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    mid = next((m["eval/success"] for m in metrics if "eval/success" in m and 0 < m["step"] < args.steps), None)
    steps = [m for m in metrics if "train/success" in m]
    rollout = yaml.safe_load((run_dir / "config.yaml").read_text())["rollout"]  # --override may change the batch
    per_step = rollout["tasks_per_step"] * rollout["group_size"]
    return {
        "arm": arm, "seed": seed, "minutes": round(minutes, 1), "run_dir": str(run_dir.relative_to(ROOT)),
        "start_detail": evals.get("start"), "mid": mid, "end": evals["end"]["success"],
        "end_detail": evals["end"], "trajectories": [0, args.steps // 2 * per_step, args.steps * per_step],
        "train": {k: [m.get(k) for m in steps] for k in TRAIN_KEYS if any(k in m for m in steps)},
    }


# ---- summaries ----------------------------------------------------------------------------------

def _mean_measured(values: list) -> float:
    """Mean over the steps that measured the metric (None where a step did not, e.g. the KL
    with rspo.kl_every > 1)."""
    return statistics.mean(v for v in values if v is not None)


def _ok(results: list[dict], arm: str) -> list[dict]:
    return [r for r in results if r["arm"] == arm and "error" not in r]


def _ms(xs: list, digits: int = 3) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}" if len(xs) > 1 else f"{xs[0]:.{digits}f}"


def reached_at(results: list[dict], arm: str, target: float) -> str:
    """Trajectories at the first evaluation where the arm's mean success is >= ``target``."""
    rs = _ok(results, arm)
    means = [statistics.mean(r[k] for r in rs) for k in ("mid", "end")]
    hits = [x for x, m in zip(rs[0]["trajectories"][1:], means) if m >= target]
    return str(hits[0]) if hits else f"not within {rs[0]['trajectories'][-1]}"


def versus(results: list[dict], arm: str, base: str) -> str:
    """Difference of means with its standard error over seeds; flagged when it exceeds 2 SE."""
    a, b = [r["end"] for r in _ok(results, arm)], [r["end"] for r in _ok(results, base)]
    if len(a) < 2 or len(b) < 2:
        return "-"
    diff = statistics.mean(a) - statistics.mean(b)
    se = (statistics.variance(a) / len(a) + statistics.variance(b) / len(b)) ** 0.5
    verdict = "exceeds 2 SE" if abs(diff) > 2 * se else "within 2 SE"
    return f"{diff:+.3f} ± {se:.3f} vs {base} ({verdict})"


def table(results: list[dict], start: dict | None, arms: list[str], steps: int) -> str:
    s0 = f"{start['success']:.3f}" if start else "-"
    lines = [f"Held-out success (greedy, 200 tasks); the start is the warm start's, the same for every run: {s0}.", "",
             "| arm | seeds | mid | end | end, each seed | end vs its base arm | min/run |", "|---|---|---|---|---|---|---|"]
    for arm in arms:
        rs = _ok(results, arm)
        if rs:
            base, each = ARMS[arm][1], ", ".join(f"{r['end']:.3f}" for r in rs)
            lines.append(f"| {arm} | {len(rs)} | {_ms([r['mid'] for r in rs])} | {_ms([r['end'] for r in rs])} | "
                         f"{each} | {versus(results, arm, base) if base else '-'} | "
                         f"{statistics.mean(r['minutes'] for r in rs):.1f} |")
    keys = [("mean_calls", "calls / episode"), ("redundant_call_rate", "redundant-call rate"),
            ("omission_rate", "omission rate"), ("summary_score", "summary score (rule)")]
    lines += ["", "At the end (greedy, held-out):", "", "| arm | " + " | ".join(k[1] for k in keys) + " |",
              "|---|" + "---|" * len(keys)]
    if start:
        lines.append("| (start) | " + " | ".join(f"{start.get(k, float('nan')):.3f}" for k, _ in keys) + " |")
    for arm in arms:
        if rs := _ok(results, arm):
            lines.append(f"| {arm} | " + " | ".join(_ms([r["end_detail"].get(k) for r in rs]) for k, _ in keys) + " |")
    pool_arms = [a for a in arms if any("pool/size" in r["train"] for r in _ok(results, a))]
    if pool_arms:
        lines += ["", "RODS pool (per run, mean ± std over seeds):", "",
                  "| arm | pool size, mid / end | synthesized, end | boundary / too hard / mastered fraction, end "
                  "| trajectories to reach static's end success |", "|---|---|---|---|---|"]
        static_end = statistics.mean(r["end"] for r in _ok(results, "static")) if _ok(results, "static") else None
        for arm in pool_arms:
            rs, half = _ok(results, arm), steps // 2 - 1

            def at(key: str, i: int, digits: int = 3, rs=rs) -> str:
                return _ms([r["train"][key][i] for r in rs if key in r["train"]], digits)
            regions = " / ".join(at(f"pool/region_{k}", -1, 2) for k in ("boundary", "too_hard", "mastered"))
            reach = reached_at(results, arm, static_end) if static_end is not None else "-"
            lines.append(f"| {arm} | {at('pool/size', half, 1)} / {at('pool/size', -1, 1)} | "
                         f"{at('pool/synthesized', -1, 1)} | {regions} | {reach} |")
    rspo_arms = [a for a in arms if any("rspo/kl_policy_explorer" in r["train"] for r in _ok(results, a))]
    if rspo_arms:
        lines += ["", "RSPO (training episodes; per run means over steps):", "",
                  "| arm | policy's process score, first 3 / last 3 steps | explorer success share | KL(A‖B) |",
                  "|---|---|---|---|"]
        for arm in rspo_arms:
            rs = _ok(results, arm)
            proc = [r["train"].get("rspo/policy_process") or [] for r in rs]
            lines.append(f"| {arm} | {_ms([statistics.mean(p[:3]) for p in proc if p])} / "
                         f"{_ms([statistics.mean(p[-3:]) for p in proc if p])} | "
                         f"{_ms([statistics.mean(r['train']['rspo/explorer_success_share']) for r in rs])} | "
                         f"{_ms([_mean_measured(r['train']['rspo/kl_policy_explorer']) for r in rs])} |")
    return "\n".join(lines)


def plot(results: list[dict], start: dict | None, family: str, arms: list[str], path: Path,
         extra: str | None = None) -> None:
    """Held-out success and training success against trajectories; a third panel shows the
    per-step training metric ``extra`` (by default the RODS pool size, when an arm has a pool)."""
    from matplotlib.figure import Figure

    if extra is None and any("pool/size" in r["train"] for a in arms for r in _ok(results, a)):
        extra = "pool/size"
    fig = Figure(figsize=(16 if extra else 11, 4), dpi=90)
    ax1, ax2, *ax3 = fig.subplots(1, 3 if extra else 2)
    for arm in arms:
        rs = [r for r in _ok(results, arm) if r["mid"] is not None]
        if not rs:
            continue
        xs = rs[0]["trajectories"]
        ys = [[start["success"] if start else None, r["mid"], r["end"]] for r in rs]
        cols = list(zip(*ys))
        line, = ax1.plot(xs, [statistics.mean(c) for c in cols], marker="o", lw=2, label=f"{arm} ({len(rs)} seeds)")
        ax1.fill_between(xs, [min(c) for c in cols], [max(c) for c in cols], color=line.get_color(), alpha=0.15)
        train = [r["train"]["train/success"] for r in rs]
        n, per_step = min(map(len, train)), xs[-1] // len(train[0])
        ax2.plot([(i + 1) * per_step for i in range(n)], [statistics.mean(t[i] for t in train) for i in range(n)],
                 color=line.get_color(), label=arm)
        if ax3 and all(extra in r["train"] for r in rs):
            values = [r["train"][extra] for r in rs]
            ax3[0].plot([(i + 1) * per_step for i in range(n)], [statistics.mean(v[i] for v in values) for i in range(n)],
                        color=line.get_color(), label=arm)
    ax1.set(title=f"{family}: held-out success (greedy), band = min-max over seeds", xlabel="trajectories consumed",
            ylim=(0, 1))
    ax2.set(title="training success (sampled), mean over seeds", xlabel="trajectories consumed", ylim=(0, 1))
    if ax3:
        ax3[0].set(title=f"training {extra}, mean over seeds", xlabel="trajectories consumed")
    for ax in (ax1, ax2, *ax3):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


# ---- driver -------------------------------------------------------------------------------------

def expand_arms(spec: str) -> list[str]:
    """``--arms``: comma-separated arms or families, in order, each arm once. A name that is both
    an arm and a family (``rods``, ``rspo``) is the arm: ``--arms grpo,rspo`` runs two arms."""
    names = [a for name in spec.split(",") for a in ([name] if name in ARMS else FAMILIES.get(name, [name]))]
    return list(dict.fromkeys(names))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", default="all", help=f"comma-separated arms ({', '.join(ARMS)}) or families "
                                                 f"({', '.join(FAMILIES)})")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "methods")
    p.add_argument("--override", action="append", default=[], help="extra KEY=VALUE for every run")
    p.add_argument("--keep-done", action="store_true", help="skip runs already in --out's results.json without an error")
    p.add_argument("--plot-train", metavar="KEY", choices=TRAIN_KEYS,
                   help="a third curve panel: this per-step training metric (default: the RODS pool size, if any)")
    args = p.parse_args()
    arms = expand_arms(args.arms)
    if unknown := [a for a in arms if a not in ARMS]:
        p.error(f"unknown arm(s) {unknown}; arms: {list(ARMS)}; families: {list(FAMILIES)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    path = args.out / "results.json"
    saved = json.loads(path.read_text()) if path.exists() else {"start": None, "runs": []}
    done = {(r["arm"], r["seed"]) for r in saved["runs"] if "error" not in r}
    # arm-major: every seed of an arm before the next arm, so a partial suite has whole comparisons
    plan = [(a, s) for a in arms for s in seeds if not (args.keep_done and (a, s) in done)]
    minutes = sum(ARMS[a][2] for a, _ in plan)
    print(f"plan: {len(plan)} runs of {args.steps} steps ({', '.join(f'{a}-s{s}' for a, s in plan)}); "
          f"~{minutes:.0f} min on 2 otherwise idle cores", flush=True)
    if any("{seeds}" in o for a, _ in plan for o in ARMS[a][0]):
        from agentrl.envs.sources import resolve_task_source
        from agentrl.tasks.io import save_tasks

        SEEDS_FILE.parent.mkdir(parents=True, exist_ok=True)
        save_tasks(resolve_task_source("builtin:bank-train")[:SEED_TASKS], SEEDS_FILE)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [r for r in saved["runs"] if (r["arm"], r["seed"]) not in plan]
    # one run at a time: minutes per run are part of the result, and runs sharing the 2 cores slow
    # each other unpredictably (docs/benchmarks.md, "Throughput")
    for i, (arm, seed) in enumerate(plan, 1):
        measure_start = saved["start"] is None  # the first run measures the shared start
        r = run_one(arm, seed, args, measure_start)
        runs.append(r)
        if measure_start and r.get("start_detail"):
            saved["start"] = r["start_detail"]
        status = r.get("error", "")[-300:] or f"mid {r['mid']} -> end {r['end']:.3f}"
        print(f"[{i}/{len(plan)}] {arm}-s{seed}: {status} ({r['minutes']} min)", flush=True)
        path.write_text(json.dumps({"start": saved["start"], "steps": args.steps, "runs": runs}, indent=1))
    runs.sort(key=lambda r: (list(ARMS).index(r["arm"]), r["seed"]))
    path.write_text(json.dumps({"start": saved["start"], "steps": args.steps, "runs": runs}, indent=1))
    present = [a for a in ARMS if _ok(runs, a)]
    (args.out / "table.md").write_text(table(runs, saved["start"], present, args.steps) + "\n")
    for family, members in FAMILIES.items():
        if family != "all" and sum(bool(_ok(runs, a)) for a in members) >= 2:
            plot(runs, saved["start"], family, [a for a in members if _ok(runs, a)], args.out / f"curves_{family}.png",
                 args.plot_train)
    if 2 <= len(present) <= 5:  # a setting's own comparison (base, method, control) in one figure
        plot(runs, saved["start"], "all arms", present, args.out / "curves.png", args.plot_train)
    print(table(runs, saved["start"], present, args.steps))
    return 0 if all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
