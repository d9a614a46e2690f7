"""``agentrl eval``: score a model (or the gold replay) on a task set through the real runtime.

Episodes run in the same Ray rollout workers (vLLM) and tool pool as training, and are checked
by the same per-turn checker; an entry passes when every turn passes. By default each task runs
once, greedy; ``--samples N --temperature T`` runs N episodes per task sampled at T over the full
distribution (top_p 1.0, as in training, whose config refuses a nucleus). Per-episode results go
to a JSONL file (``sample``: 0..N-1); the console shows accuracy per category, the mean success
over episodes, with N > 1 also pass@N (the share of tasks with at least one success), and ends
with ``overall accuracy: X.XXXX`` (the mean over episodes). ``--policy gold`` replays each task's
ground truth instead of a model (no vLLM engine is started): it must score 1.0000, which checks
the task import, the backend, the checker and the episode loop together.

Categories, behaviour rates and summary scores are shown only where the tasks define them
(``rollout_worker.eval_row``); exceptions plugin tools raised are counted and the first few
printed (``tool errors: ...``). The episodes are also written as trajectory records
(``trajectories/`` next to the results file), which ``agentrl show FOLDER`` prints.

The config comes from the CLI (``cli._eval_config``: a training run's own ``config.yaml`` for its
models); the rollout limits and dtype the workers are then built with are printed, so a score can
be read against the settings that produced it.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from functools import partial
from pathlib import Path

import ray

from agentrl.common.log import get_logger, set_level
from agentrl.config.schema import Config, RolloutConfig
from agentrl.driver.cluster import RolloutSide, init_ray, resolve_model_path
from agentrl.envs.behaviours import behaviour_rates
from agentrl.rollout.worker import tool_error_line
from agentrl.telemetry.progress import print_eval_progress
from agentrl.telemetry.summaries import summarize
from agentrl.telemetry.trajectories import EVAL_STEP, TRAJECTORY_DIR, TrajectoryLog, eval_records

log = get_logger(__name__)

# The gold replay is not a model: give it room for long-context tool outputs and every gold step
# (BFCL turns take up to ~20 calls; long_context observations run to thousands of tokens).
GOLD_LIMITS = {"max_new_tokens": 100_000, "max_assistant_messages_per_turn": 64, "max_episode_tokens": 10_000_000}


def rollout_settings(rollout: RolloutConfig, dtype: str, gold: bool, samples: int = 1, temperature: float = 0.0) -> str:
    """The limits and sampling one episode runs under, as printed before the evaluation."""
    if gold:
        sampling = f"samples={samples} (the gold replay does not sample)"
    elif temperature == 0.0:
        sampling = f"temperature=0.0 (greedy; top_p unused) samples={samples}"
    else:
        sampling = f"temperature={temperature} top_p=1.0 samples={samples}"
    return (f"max_new_tokens={rollout.max_new_tokens} max_episode_tokens={rollout.max_episode_tokens} "
            f"max_assistant_messages_per_turn={rollout.max_assistant_messages_per_turn} "
            + ("(the gold replay's own limits)" if gold else f"model.dtype={dtype}") + f" {sampling}")


def check_sampling(samples: int, temperature: float, gold: bool) -> None:
    """Refuse ``--samples``/``--temperature`` that cannot mean what they say (ValueError: the CLI exits 2)."""
    if samples < 1:
        raise ValueError(f"--samples must be >= 1, got {samples}")
    if not temperature >= 0.0:  # NaN too
        raise ValueError(f"--temperature must be >= 0, got {temperature}")
    if gold and samples != 1:
        raise ValueError(f"--policy gold with --samples {samples}: the gold replay is deterministic, every sample would "
                         "be the same episode; use --samples 1")
    if gold and temperature != 0.0:
        raise ValueError(f"--policy gold with --temperature {temperature}: the gold replay does not sample; "
                         "leave --temperature at 0")
    if samples > 1 and temperature == 0.0:
        raise ValueError(f"--samples {samples} with --temperature 0 (greedy): greedy samples are identical; "
                         "give --temperature > 0 (e.g. 1.0) or --samples 1")


def pass_at_n(results: list[dict]) -> dict[str, tuple[int, float]]:
    """{category: (tasks, share of tasks with at least one successful episode)} plus "overall"."""
    solved: dict[str | None, dict[str, bool]] = defaultdict(dict)
    for r in results:
        tasks = solved[r.get("category")]
        tasks[r["task_id"]] = tasks.get(r["task_id"], False) or r["outcome"] >= 1.0
    out = {c: (len(v), sum(v.values()) / len(v)) for c, v in sorted(solved.items()) if c is not None}
    every = [ok for v in solved.values() for ok in v.values()]
    out["overall"] = (len(every), sum(every) / len(every) if every else 0.0)
    return out


def first_per_category(tasks: list, limit: int | None) -> list:
    """The first ``limit`` tasks of each category, in the source's order (all when None)."""
    if limit is None:
        return tasks
    if limit < 1:
        raise ValueError(f"--limit must be >= 1, got {limit}")
    seen: dict[str, int] = defaultdict(int)
    out = []
    for t in tasks:
        if seen[t.category] < limit:  # (a task without a category of its own counts as "base")
            seen[t.category] += 1
            out.append(t)
    return out


def default_out(cfg: Config) -> Path:
    """Where results go without ``--out``: ``run.output_dir/eval/results.jsonl``."""
    return Path(cfg.run.output_dir) / "eval" / "results.jsonl"


def evaluate(cfg: Config, source: str, gold: bool, out_path: str | Path | None = None, limit: int | None = None,
             samples: int = 1, temperature: float = 0.0) -> dict[str, tuple[int, float]]:
    """{category: (episodes, mean success)} plus "overall"; prints the table and writes the JSONL
    (``out_path``, default ``default_out``) and the episodes as records ``agentrl show`` reads
    (``trajectories/`` next to it)."""
    from agentrl.envs.sources import resolve_task_sources

    set_level(cfg.telemetry.log_level)
    check_sampling(samples, temperature, gold)
    tasks = first_per_category(resolve_task_sources(source), limit)  # errors: the CLI reports them
    model_path = resolve_model_path(cfg)
    log.info(f"agentrl eval: {len(tasks)} tasks from {source}, policy {'gold' if gold else model_path}")
    import torch  # noqa: F401  (before Ray; see driver.train)

    owns_ray = init_ray(cfg)
    t0 = time.perf_counter()
    side = None
    try:
        if any(t.backend == "sgls" for t in tasks) and cfg.tools.sgls is None:
            raise ValueError(f"{source} has tasks with backend 'sgls' (LLM-simulated tools): set tools.sgls")
        rollout = cfg.rollout.model_copy(update=GOLD_LIMITS) if gold else cfg.rollout
        log.info(f"agentrl eval: {rollout_settings(rollout, cfg.model.dtype, gold, samples, temperature)}")
        side = RolloutSide.create(cfg, model_path, rollout_cfg=rollout, engine=not gold)
        side.start()
        results = side.evaluate(tasks, gold, samples, temperature, progress=partial(print_eval_progress, "agentrl eval", t0))
        side.shutdown_workers()
    except BaseException:
        if side is not None:  # e.g. a plugin's bad reward: on a cluster that outlives this call, free its actors
            side.kill()
        raise
    finally:
        if owns_ray:
            ray.shutdown()
    order = {t.id: i for i, t in enumerate(tasks)}
    results.sort(key=lambda r: (order[r["task_id"]], r["sample"]))
    episodes = [(r.pop("episode"), r["category"]) for r in results]
    out = Path(out_path) if out_path is not None else default_out(cfg)
    _write_results(results, out)
    records = write_records(episodes, out.parent, model_path)
    summary = summarize(results)  # mean success over episodes
    passed = pass_at_n(results) if samples > 1 else {}
    categories = len(summary) > 1  # else no task has a category: the overall lines say it all
    if categories and samples == 1:
        print(f"{'category':<16}{'entries':>8}{'accuracy':>10}")
        for cat, (n, acc) in summary.items():
            if cat != "overall":
                print(f"{cat:<16}{n:>8}{acc:>10.4f}")
    elif samples > 1:
        head = f"pass@{samples}"
        if categories:
            print(f"{'category':<16}{'tasks':>8}{'episodes':>10}{'accuracy':>10}{head:>10}")
        for cat, (n, acc) in summary.items():
            if cat != "overall":
                print(f"{cat:<16}{passed[cat][0]:>8}{n:>10}{acc:>10.4f}{passed[cat][1]:>10.4f}")
        print(f"accuracy: mean success over the {samples} episodes of each task; {head}: share of tasks with at "
              "least one success")
    for name, rate in behaviour_rates([r.get("behaviours") or {} for r in results]).items():
        print(f"behaviour {name}: {rate:.4f}")
    print_tool_errors(results)
    print(f"per-entry results: {out} ({time.perf_counter() - t0:.0f}s)")
    if records is not None:
        print(f"transcripts: agentrl show {out.parent} (--task ID, --failed, --category C)")
    if samples > 1:
        print(f"overall pass@{samples}: {passed['overall'][1]:.4f} ({passed['overall'][0]} tasks)")
    print(f"overall accuracy: {summary['overall'][1]:.4f}", flush=True)
    return summary


def print_tool_errors(results: list[dict], first: int = 3) -> None:
    """``tool errors: N in M episodes`` and the first ``first`` of them (nothing when none)."""
    errors = [(r["task_id"], e) for r in results for e in r.get("tool_errors") or ()]
    if not errors:
        return
    episodes = sum(bool(r.get("tool_errors")) for r in results)
    print(f"tool errors: {len(errors)} in {episodes} episode(s) (the model read each as an error; "
          "rollout.on_tool_error=fail stops at the first):")
    for task_id, error in errors[:first]:
        print(f"  {tool_error_line(task_id, error)}")
    if len(errors) > first:
        print(f"  ... {len(errors) - first} more: tool_errors in the results file, agentrl show")


def write_records(episodes: list, folder: Path, model_path: str) -> Path | None:
    """The evaluation's episodes as trajectory records (``telemetry/trajectories.eval_records``)
    in ``folder/trajectories/``; returns the file, or None (with a warning) when they could not be
    written: the results above stand without them."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        records = TrajectoryLog(folder / TRAJECTORY_DIR, every=1)
        records.add(EVAL_STEP, eval_records(episodes, lambda ids: tokenizer.decode(ids, skip_special_tokens=False)))
        return records.close()
    except Exception as err:  # noqa: BLE001 - the transcripts are a view; the results are written
        log.warning(f"warning: no transcripts written: {type(err).__name__}: {err}")
        return None


def _write_results(results: list[dict], out: Path) -> None:
    """One JSON object per episode."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
