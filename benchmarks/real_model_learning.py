"""SmolLM2 learning runs, collected: held-out start -> end per run, mean ± SE per arm, paired
differences, time per step by phase, curves (docs/benchmarks.md, "A real model learns clearly").

The runs are ordinary ``agentrl train configs/smollm2_bank.yaml ...`` runs (their commands are in
docs/benchmarks.md). Run folders do not outlive the machine they ran on, so each run's small files
(``config.yaml``, ``metrics.jsonl``, ``evals.json``, ``resumes.jsonl``) are copied into
``--out/<run name>/`` and ``results.json`` is rebuilt from every run copied there so far: runs
made in different sessions add up. A run's arm is its name without the ``_s<seed>`` suffix;
``--base ARM`` names the arm the others are compared with (paired by seed).

    .venv/bin/python benchmarks/real_model_learning.py .cache/wt38/runs/rl15_s0-* --out docs/benchmarks/smollm2_rl
    .venv/bin/python benchmarks/real_model_learning.py --out docs/benchmarks/smollm2_rl   # rebuild only
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
from pathlib import Path

KEPT = ("config.yaml", "metrics.jsonl", "evals.json", "resumes.jsonl")
PHASES = ("time/generate", "time/learn", "time/sync", "time/step")
CURVE = ("train/success", "train/progress")
# RSPO's measures over a run: who found the successes, how far the explorer drifted, and each
# policy's process score (a run without rspo.enabled logs none of them)
RSPO = ("rspo/explorer_success_share", "rspo/kl_policy_explorer", "rspo/policy_process", "rspo/explorer_process",
        "rspo/policy_success", "rspo/explorer_success")


def copy_run(run: Path, out: Path) -> Path:
    """The run's small files into ``out/<run name>/`` (the timestamp dropped from the folder name)."""
    name = re.sub(r"-\d{8}-\d{6}$", "", run.name)
    dest = out / name
    dest.mkdir(parents=True, exist_ok=True)
    for f in KEPT:
        if (run / f).is_file():
            shutil.copyfile(run / f, dest / f)
    if not (dest / "evals.json").is_file():
        raise SystemExit(f"{run}: no evals.json (the run has not finished)")
    return dest


def read_run(folder: Path) -> dict:
    evals = json.loads((folder / "evals.json").read_text())
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "train/success" in r]
    cfg = (folder / "config.yaml").read_text()
    seed = re.search(r"_s(\d+)$", folder.name)
    return {
        "run": folder.name, "arm": re.sub(r"_s\d+$", "", folder.name), "seed": int(seed[1]) if seed else None,
        "steps": len(steps), "shuffled": "shuffle_rewards: true" in cfg,
        "start": evals.get("start"), "end": evals["end"],
        "seconds_per_step": {p: statistics.mean(r[p] for r in steps if p in r) for p in PHASES
                             if any(p in r for r in steps)},
        "curve": [{k: r.get(k) for k in ("step", *CURVE)} for r in steps],
        "rspo": _rspo_over_run(steps, cfg),
    }


def _rspo_over_run(steps: list[dict], cfg_text: str) -> dict:
    """RSPO's measures over the run, and the explorer's share of all the run's successes (a
    step without any success logs a share of 0, so the mean of the per-step shares understates
    it): the steps' success rates weighted by each policy's episodes per step (rollout.group_size
    split by rspo.explorer_fraction, times rollout.tasks_per_step)."""
    import yaml

    from agentrl.config.schema import explorer_group_size

    out = {k: _over_run([r[k] for r in steps if r.get(k) is not None]) for k in RSPO if any(r.get(k) is not None for r in steps)}
    if "rspo/explorer_success" in out and "rspo/policy_success" in out:
        cfg = yaml.safe_load(cfg_text)
        g, tasks = cfg["rollout"]["group_size"], cfg["rollout"]["tasks_per_step"]
        n_b = explorer_group_size(cfg["rspo"]["explorer_fraction"], g) * tasks
        b = sum(x * n_b for x in out["rspo/explorer_success"]["values"])
        a = sum(x * (g * tasks - n_b) for x in out["rspo/policy_success"]["values"])
        out["explorer_share_of_all_successes"] = {"successes": round(a + b), "explorer": round(b),
                                                  "share": b / (a + b) if a + b else float("nan"),
                                                  "explorer_episode_share": n_b / (g * tasks)}
    return out


def _over_run(xs: list[float]) -> dict:
    """A measure over the steps that logged it: mean, min, max, and the values in step order."""
    return {"mean": statistics.mean(xs), "min": min(xs), "max": max(xs), "steps": len(xs), "values": xs}


def _mean_se(xs: list[float]) -> tuple[float, float]:
    return statistics.mean(xs), (statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan"))


def summarize(runs: list[dict], base: str | None) -> dict:
    """Per arm: end - start per seed, mean ± SE; against ``base``: the paired difference of the
    gains per seed (each run's own start: greedy decoding of the same warm start measured 0.145 and
    0.130 in two sessions, so a run without a start of its own is given the first one measured)."""
    starts = [r["start"]["success"] for r in runs if r["start"]]
    start = starts[0] if starts else None
    arms: dict[str, dict] = {}
    for r in runs:
        arms.setdefault(r["arm"], {"runs": []})["runs"].append(r)
    for a in arms.values():
        a["gain_by_seed"] = {r["seed"]: r["end"]["success"] - (r["start"] or {"success": start})["success"]
                             for r in a["runs"]}
        a["gain_mean"], a["gain_se"] = _mean_se(list(a["gain_by_seed"].values()))
        a["end_mean"], a["end_se"] = _mean_se([r["end"]["success"] for r in a["runs"]])
    for arm, a in arms.items():
        if base and arm != base and base in arms:
            base_gains = arms[base]["gain_by_seed"]
            diffs = [base_gains[s] - g for s, g in a["gain_by_seed"].items() if s in base_gains]
            if diffs:
                a[f"{base}_minus_this"] = {"by_seed": diffs, "mean": statistics.mean(diffs),
                                           "se": _mean_se(diffs)[1]}
    return {"start_success": start, "arms": {k: {kk: vv for kk, vv in v.items() if kk != "runs"} | {
        "seeds": sorted(r["seed"] for r in v["runs"])} for k, v in arms.items()}, "runs": runs}


def table(summary: dict, base: str | None) -> str:
    lines = ["held-out greedy success on the 200 bank-heldout tasks; start = the run's own measurement "
             f"(the first one measured, {summary['start_success']}, for a run without one)", "",
             "| run | steps | start | end | end − start | success/base | success/miss_func | success/miss_param | "
             "miss_param ask | gen s/step | learn s/step |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["runs"]:
        s, e, t = r["start"] or {"success": summary["start_success"]}, r["end"], r["seconds_per_step"]
        lines.append(f"| {r['run']} | {r['steps']} | {s['success']:.3f} | {e['success']:.3f} | "
                     f"{e['success'] - s['success']:+.3f} | {e.get('success/base', float('nan')):.3f} | "
                     f"{e.get('success/miss_func', float('nan')):.3f} | {e.get('success/miss_param', float('nan')):.3f} | "
                     f"{e.get('behaviour/miss_param_ask', float('nan')):.3f} | {t.get('time/generate', float('nan')):.0f} | "
                     f"{t.get('time/learn', float('nan')):.0f} |")
    paired = f"{base or '-'}'s gain − this arm's (paired by seed, mean ± SE)"
    lines += ["", f"| arm | seeds | end − start, mean ± SE | {paired} |", "|---|---|---|---|"]
    for arm, a in summary["arms"].items():
        d = a.get(f"{base}_minus_this")
        vs = f"{d['mean']:+.3f} ± {d['se']:.3f} ({len(d['by_seed'])} pairs)" if d else "-"
        lines.append(f"| {arm} | {a['seeds']} | {a['gain_mean']:+.3f} ± {a['gain_se']:.3f} | {vs} |")
    rspo_runs = [r for r in summary["runs"] if r.get("rspo")]
    if rspo_runs:
        lines += ["", "RSPO over the run (mean [min, max] over the steps that logged it)", "",
                  "| run | " + " | ".join(k.removeprefix("rspo/") for k in RSPO) + " |", "|---" * (len(RSPO) + 1) + "|"]
        for r in rspo_runs:
            cells = [(f"{m['mean']:.3f} [{m['min']:.3f}, {m['max']:.3f}]" if (m := r["rspo"].get(k)) else "-")
                     for k in RSPO]
            lines.append(f"| {r['run']} | " + " | ".join(cells) + " |")
        for r in rspo_runs:
            if (pooled := r["rspo"].get("explorer_share_of_all_successes")) is not None:
                lines.append(f"\n{r['run']}: the explorer found {pooled['explorer']} of the run's {pooled['successes']} "
                             f"training successes ({pooled['share']:.2f}), with {pooled['explorer_episode_share']:.2f} "
                             "of the episodes")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    """Left: held-out success, start -> end, per run (the measure the claims rest on). Middle and
    right: the sampled training curves, each seed thin and the arm's mean over seeds thick (one
    step holds 4 tasks, so a single seed's curve is mostly noise)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    colors = {arm: f"C{i}" for i, arm in enumerate(summary["arms"])}
    labelled = set()
    for r in summary["runs"]:
        start = (r["start"] or {"success": summary["start_success"]})["success"]
        marker = "osD^v"[(r["seed"] or 0) % 5]  # one marker per seed, one color per arm
        axes[0].plot([0, r["steps"]], [start, r["end"]["success"]], f"{marker}-", color=colors[r["arm"]], alpha=0.7,
                     label=None if r["arm"] in labelled else f"{r['arm']} (marker = seed)")
        labelled.add(r["arm"])
    for ax, key in zip(axes[1:], CURVE):
        for arm, color in colors.items():
            curves = [r["curve"] for r in summary["runs"] if r["arm"] == arm]
            for c in curves:
                ax.plot([x["step"] for x in c], [x[key] for x in c], color=color, alpha=0.25, linewidth=0.8)
            # the mean over the seeds that logged the step (a stopped run's steps are fewer)
            by_step: dict[int, list[float]] = {}
            for c in curves:
                for x in c:
                    if x[key] is not None:
                        by_step.setdefault(x["step"], []).append(x[key])
            steps = sorted(by_step)
            ax.plot(steps, [statistics.mean(by_step[s]) for s in steps], color=color, linewidth=2.2,
                    label=f"{arm} (mean of {len(curves)} seeds)")
        ax.set_xlabel("step (32 episodes)")
        ax.set_title(f"{key} (sampled, T = 1)")
        ax.legend(fontsize=7)
    axes[0].set_xlabel("step")
    axes[0].set_title("held-out greedy success (200 tasks)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", type=Path, help="finished run folders to copy in")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks/smollm2_rl"))
    ap.add_argument("--base", default="rl15", help="the arm the others are compared with")
    args = ap.parse_args()
    for run in args.runs:
        print(f"copied {copy_run(run, args.out)}")
    runs = sorted((read_run(f) for f in args.out.iterdir() if (f / "evals.json").is_file()),
                  key=lambda r: (r["arm"], r["seed"] or 0))
    if not runs:
        raise SystemExit(f"no runs in {args.out}")
    summary = summarize(runs, args.base)
    (args.out / "results.json").write_text(json.dumps(summary, indent=1))
    (args.out / "table.md").write_text(table(summary, args.base))
    plot(summary, args.out / "curves.png")
    print(table(summary, args.base))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
