"""Does the quickstart learn, and what does RSPO add? Arms over seeds on the quickstart.

Arms, each ``agentrl train configs/quickstart.yaml`` in its own process with the same number of
steps and episodes (``train.max_minutes=null``; 8 tasks x 8 episodes per step), greedy held-out
success at the start, mid-run and the end:

* ``rl`` — the quickstart as shipped (GRPO on the progress reward);
* ``shuffled`` — the same with ``algo.shuffle_rewards=true``: every step's rewards are permuted
  across its episodes before the advantages, so any gain it shows is drift, not learning;
* ``rspo`` — GRPO + RSPO: 2 of each group's 8 episodes from the explorer (derived each step on
  the HierR process score), the policy trained on the progress reward only;
* ``process_only`` — the ablation ``rspo.swap=false``: the policy itself trained on the process
  score (the misaligned baseline RSPO argues against).

The RSPO arms go to their own folder: ``--arms rl,rspo,process_only --out docs/benchmarks/rspo``.

Writes ``results.json``, ``table.md`` (mean ± std over seeds) and ``curves.png`` to ``--out``;
run folders go to .cache/benchmarks/learning.

    .venv/bin/python benchmarks/learning_quickstart.py --out docs/benchmarks/learning
    .venv/bin/python benchmarks/learning_quickstart.py --arms shuffled --seeds 1   # one arm alone
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_estimators import ROOT, train_quickstart  # noqa: E402

ARMS = {"rl": [], "shuffled": ["algo.shuffle_rewards=true"], "rspo": ["rspo.enabled=true"],
        "process_only": ["rspo.enabled=true", "rspo.swap=false"]}
COLORS = {"rl": "tab:blue", "shuffled": "tab:red", "rspo": "tab:green", "process_only": "tab:orange"}
MINUTES_PER_RUN = {"rl": 7, "shuffled": 7, "rspo": 9, "process_only": 9}  # on 2 otherwise idle cores


def run_one(arm: str, seed: int, args) -> dict:
    name = f"{arm}-s{seed}"
    run_dir, minutes, err = train_quickstart(ROOT / ".cache" / "benchmarks" / "learning" / name, [
        f"run.seed={seed}", f"run.name={name}", f"rollout.engine.seed={seed}", f"train.steps={args.steps}",
        f"train.eval_every={args.steps // 2}", *ARMS[arm], *args.override])
    if run_dir is None:
        return {"arm": arm, "seed": seed, "minutes": minutes, "error": err}
    evals = json.loads((run_dir / "evals.json").read_text())
    mid = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    mid = [m for m in mid if "eval/success" in m and m["step"] == args.steps // 2]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "arm": arm, "seed": seed, "minutes": round(minutes, 1), "run_dir": str(run_dir.relative_to(ROOT)),
        "start": evals["start"]["success"], "mid": mid[0]["eval/success"] if mid else None, "end": evals["end"]["success"],
        "start_detail": evals["start"], "end_detail": evals["end"],
        "train_success": [m["train/success"] for m in steps if "train/success" in m],
        # the dense process score of the policy's own episodes (all episodes without RSPO)
        "train_process": [m.get("rspo/policy_process", m.get("reward/process")) for m in steps if "train/success" in m],
        "rspo": {k: [m[k] for m in steps if k in m] for k in ("rspo/explorer_success_share", "rspo/kl_policy_explorer",
                                                             "rspo/is_weight_mean", "rspo/is_clip_frac")},
    }


def _ms(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def table(results: list[dict]) -> str:
    lines = ["| arm | seeds | start | mid | end | end − start (each seed) | min/run |", "|---|---|---|---|---|---|---|"]
    for arm in ARMS:
        rs = [r for r in results if r["arm"] == arm and "error" not in r]
        if not rs:
            continue
        gains = [r["end"] - r["start"] for r in rs]
        lines.append(f"| {arm} | {len(rs)} | {_ms([r['start'] for r in rs])} | {_ms([r['mid'] for r in rs])} | "
                     f"{_ms([r['end'] for r in rs])} | {_ms(gains)} ({', '.join(f'{g:+.3f}' for g in gains)}) | "
                     f"{statistics.mean(r['minutes'] for r in rs):.1f} |")
    lines += ["", "| arm | process score, steps 1-3 | process score, last 3 steps | explorer success share | KL(A‖B) |",
              "|---|---|---|---|---|"]
    for arm in ARMS:
        rs = [r for r in results if r["arm"] == arm and "error" not in r and r.get("train_process")]
        if rs:
            first = _ms([statistics.mean(r["train_process"][:3]) for r in rs])
            last = _ms([statistics.mean(r["train_process"][-3:]) for r in rs])
            share = _ms([statistics.mean(v) for r in rs if (v := r["rspo"].get("rspo/explorer_success_share"))])
            kl = _ms([statistics.mean(v) for r in rs if (v := r["rspo"].get("rspo/kl_policy_explorer"))])
            lines.append(f"| {arm} | {first} | {last} | {share} | {kl} |")
    keys = [k for k in (results[0].get("end_detail") or {}) if "/" in k] if results else []
    if keys:
        lines += ["", "| arm | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
        for arm in ARMS:
            rs = [r for r in results if r["arm"] == arm and "error" not in r]
            for when in ("start", "end"):
                cells = [_ms([r[f"{when}_detail"].get(k) for r in rs]) for k in keys]
                if rs:
                    lines.append(f"| {arm} ({when}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: list[dict], args, out: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4), dpi=90)
    ax1, ax2, ax3 = fig.subplots(1, 3)
    xs = [0, args.steps // 2, args.steps]
    for arm, color in COLORS.items():
        rs = [r for r in results if r["arm"] == arm and "error" not in r and r["mid"] is not None]
        if not rs:
            continue
        for i, r in enumerate(rs):
            ax1.plot(xs, [r["start"], r["mid"], r["end"]], color=color, alpha=0.35, marker="o", ms=3)
            ax2.plot(range(1, len(r["train_success"]) + 1), r["train_success"], color=color, alpha=0.5,
                     label=arm if i == 0 else None)
            process = r.get("train_process") or []
            if process and None not in process:
                ax3.plot(range(1, len(process) + 1), process, color=color, alpha=0.5, label=arm if i == 0 else None)
        mean = [statistics.mean(r[k] for r in rs) for k in ("start", "mid", "end")]
        ax1.plot(xs, mean, color=color, lw=2.5, marker="o", label=f"{arm} (mean of {len(rs)})")
    ax1.set(title="held-out success (greedy)", xlabel="step", ylim=(0, 1))
    ax2.set(title="training success (sampled, T = 1)", xlabel="step", ylim=(0, 1))
    ax3.set(title="process score of the policy's episodes", xlabel="step")
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "curves.png")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "learning")
    p.add_argument("--arms", default="rl,shuffled", help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--override", action="append", default=[], help="extra KEY=VALUE for every run")
    p.add_argument("--keep-done", action="store_true", help="skip runs already in --out's results.json without an error")
    args = p.parse_args()
    arms, seeds = args.arms.split(","), [int(s) for s in args.seeds.split(",")]
    if unknown := [a for a in arms if a not in ARMS]:
        p.error(f"unknown arm(s) {unknown}; known: {list(ARMS)}")
    path = args.out / "results.json"
    done = {(r["arm"], r["seed"]) for r in (json.loads(path.read_text()) if path.exists() else []) if "error" not in r}
    plan = [(a, s) for s in seeds for a in arms if not (args.keep_done and (a, s) in done)]
    minutes = sum(MINUTES_PER_RUN[a] for a, _ in plan)
    print(f"plan: {len(plan)} runs ({', '.join(f'{a}-s{s}' for a, s in plan)}), ~{minutes} min", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    results = [r for r in (json.loads(path.read_text()) if path.exists() else []) if (r["arm"], r["seed"]) not in plan]
    for i, (arm, seed) in enumerate(plan, 1):
        r = run_one(arm, seed, args)
        results.append(r)
        status = r.get("error", "")[-300:] or f"{r['start']:.3f} -> {r['mid']} -> {r['end']:.3f}"
        print(f"[{i}/{len(plan)}] {arm}-s{seed}: {status} ({r['minutes']} min)", flush=True)
        path.write_text(json.dumps(results, indent=1))
    results.sort(key=lambda r: (list(ARMS).index(r["arm"]), r["seed"]))
    path.write_text(json.dumps(results, indent=1))
    (args.out / "table.md").write_text(table(results) + "\n")
    plot(results, args, args.out)
    print(table(results))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
