"""``run_dir/report.png``: the run at a glance, drawn from ``metrics.jsonl`` alone.

Reading only the JSONL means a report can be made for a run that crashed, is still going, or ran
on another machine. Bad lines, missing keys and empty runs give empty panels, never an exception.
Drawing uses matplotlib's Agg canvas directly (no pyplot), so no display or GUI backend is needed
and nothing leaks into global pyplot state.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from agentrl.telemetry.fields import FIELDS, METRICS_FILE

REPORT_FILE = "report.png"


def read_metrics(path: str | Path) -> list[dict]:
    """Records of a metrics.jsonl, skipping lines that do not parse (e.g. a torn last line)."""
    records = []
    try:
        with open(path, encoding="utf-8") as fh:
            for text in fh:
                try:
                    record = json.loads(text)
                except ValueError:
                    continue
                if isinstance(record, dict) and isinstance(record.get("step"), (int, float)):
                    records.append(record)
    except OSError:
        pass
    return records


def series(records: list[dict], field: str) -> tuple[list[float], list[float]]:
    """(steps, values) of a display field (``FIELDS``) or a raw metric name; last per step wins."""
    names = FIELDS.get(field, (field,))
    by_step: dict[float, float] = {}
    for record in records:
        for name in names:
            value = record.get(name)
            if isinstance(value, (int, float)) and math.isfinite(value):
                by_step[record["step"]] = float(value)
                break
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


# panel title -> (field, legend label) drawn in it
PANELS = {
    "reward per step": [("success", "success"), ("progress", "progress reward"),
                        ("eval/success", "eval success")],
    "reward std (within groups)": [("reward_std", "reward std")],
    "rollout throughput (tokens/s)": [("tokens_per_s", "tokens/s")],
    "time per phase (s)": [("time_gen", "generate"), ("time_learn", "learn"),
                           ("time_sync", "weight sync")],
    # what RL changed, at each held-out evaluation (step 0 = before training)
    "held-out success by category": [(f"eval/success/{c}", c) for c in ("base", "miss_param", "miss_func", "long_context")],
    "held-out behaviour rates": [],  # the behaviours the run's environments register (report_panels)
}


# drawn as a third row when the run used RODS (its metrics carry pool/size)
RODS_PANELS = {
    "RODS pool (tasks)": [("pool/seeds", "seeds"), ("pool/synthesized", "synthesized"), ("pool/pending", "queued")],
    "RODS regions and signal": [("pool/region_boundary", "boundary"), ("pool/region_too_hard", "too hard"),
                                ("pool/region_mastered", "mastered"),
                                ("train/groups_with_variance", "groups with reward variance")],
}


def report_panels(records: list[dict]) -> dict[str, list[tuple[str, str]]]:
    """The panels drawn for ``records``: ``PANELS``, with the held-out categories and behaviours the
    run logged (the categories: ``PANELS``' when none was logged), and RODS's if it ran."""
    panels = dict(PANELS)
    for title, prefix in (("held-out success by category", "eval/success/"), ("held-out behaviour rates", "eval/behaviour/")):
        if found := sorted({k for r in records for k in r if k.startswith(prefix)}):
            panels[title] = [(k, k[len(prefix):]) for k in found]
    if any("pool/size" in r for r in records):
        panels.update(RODS_PANELS)
    return panels


def write_report(run_dir: str | Path) -> Path:
    """Draw the report for ``run_dir`` and return its path (written even when there is no data)."""
    from matplotlib.figure import Figure

    run_dir = Path(run_dir)
    records = read_metrics(run_dir / METRICS_FILE)
    panels = report_panels(records)
    rows = len(panels) // 2
    fig = Figure(figsize=(10, 3.5 * rows), dpi=80)
    axes = fig.subplots(rows, 2).flatten()
    for ax, (title, lines) in zip(axes, panels.items()):
        drawn = 0
        for field, label in lines:
            steps, values = series(records, field)
            if steps:
                ax.plot(steps, values, marker="o" if len(steps) < 30 else None, ms=3, label=label)
                drawn += 1
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes,
                    color="grey")
    fig.suptitle(f"{run_dir.name}: {len(records)} records")
    fig.tight_layout()
    out = run_dir / REPORT_FILE
    run_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out
