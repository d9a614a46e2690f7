"""``agentrl train``: one run from start (or a checkpoint) to its results.

``train`` opens the checkpoint it resumes from, makes or reopens the run folder, starts Ray and
the ``Trainer`` (driver/trainer.py), evaluates, steps, checkpoints every
``train.checkpoint_every`` steps and on a preemption signal (exit 75 from the CLI), saves
``final/`` and writes ``evals.json`` and ``report.png``. A run that stops on bad input before its
first checkpoint leaves no folder behind.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import ray

from agentrl.checkpointing.checkpoint import open_checkpoint, reopen_run_dir, run_storage, sync_run_files
from agentrl.checkpointing.preemption import Preempted, ResumableFailure, StopOnSignal
from agentrl.common.log import get_logger, set_level
from agentrl.common.plugins import find_plugin_error
from agentrl.config import Config, dump_config
from agentrl.config.process_env import set_default_env
from agentrl.driver.cluster import init_ray, resolve_model_path
from agentrl.driver.task_sources import load_task_sources
from agentrl.driver.trainer import Trainer
from agentrl.telemetry.progress import eval_table
from agentrl.telemetry.trackers import check_trackers

log = get_logger(__name__)


def train(cfg: Config, config_path: str | None = None, resume: str | Path | None = None,
          run_dir: Path | None = None) -> dict:
    """Run a training job end to end; returns the start/end held-out evaluations. ``run_dir``: the
    new run's folder (default ``run.output_dir/<run.name>-<timestamp>``). A SIGTERM ends the run
    after its current step with a checkpoint (``Preempted``; checkpointing/preemption.py). ``resume``: a run
    folder to continue from its newest complete checkpoint (``cfg`` is its config.yaml, with the
    overrides ``config/resume.py`` allows)."""
    from agentrl.telemetry.report import write_report

    set_default_env()
    set_level(cfg.telemetry.log_level)
    resolve_model_path(cfg)  # a missing model or task set fails here: before a run folder exists or Ray starts
    check_trackers(cfg.telemetry.loggers)  # and a tracker package that is not installed
    checkpoint = open_checkpoint(resume, cfg) if resume is not None else None
    tasks = load_task_sources(cfg, resuming=checkpoint is not None)
    run_dir = _make_run_dir(cfg, config_path, run_dir) if checkpoint is None else reopen_run_dir(checkpoint, cfg)
    store = run_storage(cfg, run_dir)  # run.storage: the checkpoints, final/ and the logs go there
    if store is not None:
        sync_run_files(store, run_dir)
        log.info(f"agentrl: run.storage: checkpoints, final/ and logs go to {store}")

    # Load torch's libraries before Ray starts: under `ray job submit --working-dir`, importing torch
    # after ray.init() sometimes died with "oneMKL FATAL ERROR: Cannot load libtorch_cpu.so"
    # (4 of 17 tries), never when torch came first (0 of 8).
    import torch  # noqa: F401

    owns_ray = init_ray(cfg)
    t_start = time.perf_counter()
    try:
        trainer = Trainer(cfg, run_dir, tasks, resume=checkpoint)
    except BaseException as err:
        if owns_ray:
            ray.shutdown()
        _drop_if_bad_input(err, run_dir, fresh=checkpoint is None)
        raise
    try:
        with StopOnSignal() as stop:
            evals = _run(trainer, cfg, run_dir, t_start, stop)
    except Preempted as err:
        log.warning(f"agentrl: {err}")
        _close(trainer, owns_ray, raise_errors=False)
        _write_results(run_dir, trainer.evals, write_report, strict=False, store=store)
        raise
    except BaseException as err:
        # the run's own error is what propagates; first what can be written is: the metrics so
        # far (closed by shutdown), the evaluations done, the report
        bad_input = find_plugin_error(err)  # the CLI prints it, once, and exits 2
        if isinstance(err, ResumableFailure):
            trainer.rollout_side.kill()  # a hung worker would never answer the shutdown below
            again = ("run the same command with --resume auto to continue from the newest complete checkpoint"
                     if cfg.train.checkpoint_every else "train.checkpoint_every=0: no checkpoint, a rerun starts over")
            log.error(f"agentrl: the run stopped: {err}; {again}")
        elif bad_input is None:
            log.error(f"error: the run failed: {type(err).__name__}: {err}")
        _close(trainer, owns_ray, raise_errors=False)
        if not _drop_if_bad_input(err, run_dir, fresh=checkpoint is None):
            _write_results(run_dir, trainer.evals, write_report, strict=False, store=store)
        raise
    _close(trainer, owns_ray)
    _write_results(run_dir, evals, write_report, store=store)
    log.info(f"training took {(time.perf_counter() - t_start) / 60:.1f} min; metrics in {run_dir}")
    _print_evals(evals)
    return evals


def _drop_if_bad_input(err: BaseException, run_dir: Path, fresh: bool) -> bool:
    """After a plugin's bad input (``PluginError``, e.g. a reward that returned a string): a new run
    folder without a checkpoint holds nothing worth keeping, so it is removed (True); one with a
    checkpoint, or a resumed run's, is kept and marked with ``FAILED`` (its text: the error)."""
    from agentrl.checkpointing.checkpoint import find_checkpoint

    bad = find_plugin_error(err)
    if bad is None:
        return False
    if fresh and find_checkpoint(run_dir) is None:
        shutil.rmtree(run_dir, ignore_errors=True)
        log.warning(f"agentrl: run folder {run_dir} removed: the run stopped on bad input before its first checkpoint")
        return True
    (run_dir / "FAILED").write_text(f"{bad}\n", encoding="utf-8")
    return False


def _close(trainer: Trainer, owns_ray: bool, raise_errors: bool = True) -> None:
    try:
        trainer.shutdown(raise_errors=raise_errors)
    finally:
        if owns_ray:
            ray.shutdown()  # before the summary, so no actor log lands after the last line


def _write_results(run_dir: Path, evals: dict, write_report, strict: bool = True, store=None) -> None:
    """``evals.json`` and ``report.png``, then (run.storage: ``store``) the run's config, logs and
    results uploaded; with ``strict=False`` (after a failure) a failing write is logged, not raised."""
    writes = [("evals.json", lambda: (run_dir / "evals.json").write_text(json.dumps(evals, indent=2))),
              ("report.png", lambda: write_report(run_dir))]
    if store is not None:
        writes.append((f"the upload to {store}", lambda: sync_run_files(store, run_dir)))
    for name, write in writes:
        try:
            write()
        except Exception as err:  # noqa: BLE001 - logged when strict=False
            if strict:
                raise
            log.warning(f"warning: {name} not written: {type(err).__name__}: {err}")


def _make_run_dir(cfg: Config, config_path: str | None, run_dir: Path | None = None) -> Path:
    """``run_dir``, default ``run.output_dir/<run.name>-<timestamp>/``, with the resolved config in it."""
    if run_dir is None:
        run_dir = Path(cfg.run.output_dir) / f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    log.info(f"agentrl: run {run_dir} (config {config_path or 'defaults'})")
    return run_dir


def _run(trainer: Trainer, cfg: Config, run_dir: Path, t_start: float, stop: StopOnSignal) -> dict[str, dict[str, float]]:
    """The evaluations, the steps and the checkpoints, from step 1 or after the resumed checkpoint;
    returns the start/end evaluations. With train.checkpoint_every the last step is checkpointed
    too, so ``--resume RUN train.steps=N`` can extend a finished run. When ``stop`` has seen a
    signal, the run checkpoints after the step in progress (skipping a periodic evaluation due
    then; one already under way finishes first) and raises ``Preempted``."""
    evals = trainer.evals
    step = saved = trainer.start_step
    if step == 0 and cfg.train.eval_at_start:
        evals["start"] = start = _evaluate(trainer, 0)
        log.info(f"held-out at start: success {start['success']:.2f} on {int(start['episodes'])} tasks "
                 f"({start['seconds']:.0f}s)")
    deadline = trainer.deadline = t_start + cfg.train.max_minutes * 60 if cfg.train.max_minutes else None
    _stop_if_signalled(trainer, stop, step, saved)
    for step in range(trainer.start_step + 1, cfg.train.steps + 1):
        m = trainer.step(step, last=step == cfg.train.steps)
        trainer.metrics.log(step, m)
        trainer.progress.update(step, m)
        if cfg.train.eval_every and step % cfg.train.eval_every == 0 and step < cfg.train.steps:
            if stop.requested is None:
                _evaluate(trainer, step)
            else:  # the grace period is for the checkpoint: a held-out pass (400 tasks) could outlast it
                log.warning(f"held-out evaluation at step {step} skipped: {stop.requested} received; the checkpoint "
                            "comes first (a resumed run does not redo it)")
        if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
            trainer.checkpoint(step)
            saved = step
        _stop_if_signalled(trainer, stop, step, saved)
        if deadline and time.perf_counter() > deadline:
            log.info(f"train.max_minutes reached after step {step}")
            break
    trainer.progress.close()
    # async: rollouts started for a step that will not run (the time limit fell during the
    # update) finish before the engines get the final weights; they are discarded
    trainer.settle(discard_pending=True)
    if cfg.train.eval_at_end:
        evals["end"] = _evaluate(trainer, step)
    if cfg.train.checkpoint_every and saved != step:
        trainer.checkpoint(step)
    trainer.save(run_dir / "final")
    return evals


def _stop_if_signalled(trainer: Trainer, stop: StopOnSignal, step: int, saved: int) -> None:
    """After ``step`` (0: before the first): on a signal, checkpoint (unless ``step`` is already
    saved, or nothing was trained) and raise ``Preempted``."""
    if stop.requested is None:
        return
    if step > saved:
        trainer.checkpoint(step)
    raise Preempted(step, stop.requested, checkpointed=step > 0)


def _evaluate(trainer: Trainer, step: int) -> dict[str, float]:
    """A held-out evaluation, logged as ``eval/*`` at ``step``."""
    e = trainer.evaluate()
    trainer.metrics.log(step, {f"eval/{k}": v for k, v in e.items()})
    return e


def _print_evals(evals: dict[str, dict[str, float]]) -> None:
    """The two evaluation tables and the last line, ``held-out success: START -> END``."""

    if evals:
        eval_table("held-out evaluation (greedy)",
                   {row: {k: v for k, v in e.items() if "/" not in k} for row, e in evals.items()})
        eval_table("held-out success by category, and behaviour rates", {
            row: {k: v for k, v in e.items() if "/" in k} for row, e in evals.items()})
    if "start" in evals and "end" in evals:
        log.info(f"held-out success: {evals['start']['success']:.2f} -> {evals['end']['success']:.2f}")
