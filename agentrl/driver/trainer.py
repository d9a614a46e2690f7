"""The driver loop: one process that places the actors and moves object refs between them.

    sample tasks -> rollouts (workers x tool pool) -> replay buffer -> learner -> weight sync

``Trainer.step`` runs five phases, one call each: (1) obtain this step's rollouts, (2) add them
to the replay buffer (and to the RODS pool's statistics), (3) learn, (4) weight sync, (5)
metrics. Which weights a rollout runs on, and when new weights may load, is decided by the
``RolloutScheduler`` (driver/scheduler.py); Ray and the rollout actors are set up by
driver/cluster.py, shared with ``agentrl eval``; the metric arithmetic is
``agentrl.telemetry.summaries``.

Runs the same in-process on an embedded Ray (``agentrl train CONFIG``) and under
``ray job submit`` against a cluster (Ray picks up ``RAY_ADDRESS``). The driver never fetches a
trajectory payload: each group is a return object of its worker's call, owned by the driver (it
outlives the worker) and left in the object store; the driver fetches the summaries and the
learner resolves the groups (so does the trajectory writer: rollout/trajectory_writer.py).
Where the step's tasks come from: driver/task_sources.py.
"""

from __future__ import annotations

import json
import shutil
import time
from functools import partial
from pathlib import Path

import ray

from agentrl.api import POLICY, GroupRef, GroupSummary
from agentrl.checkpointing.checkpoint import (
    POOL_LOG,
    TASKS_LOG,
    Checkpoint,
    engine_seed_rollout_cfg,
    open_checkpoint,
    reopen_run_dir,
    restore,
    run_storage,
    sync_run_files,
    write_checkpoint,
    write_final,
)
from agentrl.checkpointing.preemption import Preempted, ResumableFailure, StopOnSignal
from agentrl.config import Config, dump_config
from agentrl.config.process_env import set_default_env
from agentrl.driver.cluster import RolloutSide, init_ray, resolve_model_path
from agentrl.driver.scheduler import RolloutScheduler
from agentrl.driver.task_sources import TaskSampler, load_task_sources, start_synthesis_actor
from agentrl.envs.builtin.generator import text_key
from agentrl.envs.plugins import find_plugin_error
from agentrl.methods.registry import active_methods
from agentrl.rollout.trajectory_writer import Trajectories
from agentrl.telemetry.metrics import MetricsSink
from agentrl.telemetry.progress import ProgressLine, eval_table, print_eval_progress
from agentrl.telemetry.summaries import eval_metrics, step_metrics
from agentrl.telemetry.timeline import Timeline
from agentrl.telemetry.trackers import check_trackers
from agentrl.weight_sync import make_weight_sync


class Trainer:
    """The actors of a run and one training step over them (``step``), plus evaluation and checkpoints.

    ``rollout_side``: tool pool and rollout workers (``driver/cluster.py``); ``scheduler``:
    the rollouts in flight and when weights load (``driver/scheduler.py``); ``buffer``,
    ``learner``, and ``rods`` (the synthesis actor, or None) as in docs/design.md §1. ``resume``:
    the checkpoint a resumed run continues from (``checkpointing/checkpoint.py``); ``start_step`` is its step.
    """

    def __init__(self, cfg: Config, run_dir: Path, tasks: dict[str, list], resume: Checkpoint | None = None):
        from agentrl.driver.replay_buffer import ReplayBuffer
        from agentrl.learning.learner_group import LearnerGroup

        self.cfg, self.run_dir = cfg, run_dir
        self.storage = run_storage(cfg, run_dir)  # the run's folder in run.storage, or None
        model_path = resolve_model_path(cfg)
        heldout = tasks["heldout"]
        self.heldout = heldout[: cfg.tasks.heldout_size] if cfg.tasks.heldout_size else heldout
        heldout_keys = {text_key(t) for t in heldout}  # held-out tasks as their tuples of user turns
        self.sampler = None if cfg.rods.enabled else TaskSampler(cfg, tasks["train"], heldout_keys)
        self.rods = start_synthesis_actor(cfg, tasks, heldout, renumber=resume is None) if cfg.rods.enabled else None
        rt = cfg.runtime
        self.start_step = resume.step if resume is not None else 0
        self.rollout_side = RolloutSide.create(cfg, model_path, rollout_cfg=engine_seed_rollout_cfg(cfg, self.start_step),
                                               weight_sync=rt.weight_sync)
        self.workers, self.sgls = self.rollout_side.workers, self.rollout_side.sgls
        self.buffer = ReplayBuffer.remote(cfg.buffer.capacity_groups, cfg.buffer.max_staleness)
        self.methods = active_methods(cfg)  # research methods the config turns on (agentrl/methods/)
        # the learner scores tokens under the tempered distribution the rollouts sampled from
        self.learner = LearnerGroup.create(model_path, cfg.learner, cfg.algo, cfg.model.dtype, cfg.run.seed,
                                           cfg.rollout.temperature, self.methods, cpus=rt.learner_cpus, gpus=rt.learner_gpus,
                                           lora_cfg=cfg.model.lora, sampler_dtype=cfg.rollout.engine.dtype or cfg.model.dtype)
        starts = self.rollout_side.start()
        learner_version = ray.get(self.learner.get_version.remote())
        print(f"rollout engines ready ({', '.join(f'{s:.0f}s' for s in starts)}); learner ready (v{learner_version})", flush=True)
        sync = make_weight_sync(rt.weight_sync, self.learner, self.workers, self.rollout_side.role_workers)
        self.scheduler = RolloutScheduler(self._launch_rollouts, sync, cfg.train.async_rollouts,
                                          # a restarted engine cannot rejoin an NCCL group: a dead worker stops the run resumably
                                          revive=self.rollout_side.revive if rt.weight_sync == "object_store" else None,
                                          reissue=self.rollout_side.reissue,
                                          max_lag=cfg.buffer.max_staleness,
                                          revive_restarted=self.rollout_side.revive_restarted,
                                          timeout_s=rt.rollout_timeout_s)
        self.metrics = MetricsSink(run_dir, cfg.telemetry, cfg.run.name, resume_after=resume.step if resume else None)
        self.trajectories = Trajectories(run_dir, model_path, cfg.telemetry.trajectories_every)
        self.timeline = Timeline()  # the driver's phase spans; trace.json at shutdown (telemetry.trace)
        self.progress = ProgressLine(cfg.train.steps, live=None if cfg.telemetry.progress else False)
        self.version = 0  # the learner's policy version
        self.evals: dict[str, dict[str, float]] = {}  # the run's start evaluation (restored on resume)
        self.deadline: float | None = None  # train.max_minutes as a perf_counter time (set by train())
        if resume is not None:
            restore(self, resume)

    # ---------------------------------------------------------------- evaluation
    def evaluate(self) -> dict[str, float]:
        """Held-out evaluation (greedy, one episode per task) on the learner's latest weights."""
        self.settle()
        t0 = time.perf_counter()
        with self.timeline.span("eval", tasks=len(self.heldout)):
            results = self.rollout_side.evaluate(self.heldout, progress=partial(print_eval_progress, "held-out", t0))
        return eval_metrics(results, time.perf_counter() - t0)

    def settle(self, discard_pending: bool = False) -> None:
        """Bring the engines to the learner's latest weights (before an evaluation or the end).

        Rollouts in flight (train.async_rollouts) are waited for first (``RolloutScheduler.sync``);
        their results stay pending for their step, unless ``discard_pending`` (no step will use them)."""
        self.scheduler.sync(discard_in_flight=discard_pending)

    # ---------------------------------------------------------------- one step
    def step(self, step: int, last: bool = False) -> dict[str, float]:
        """One training step. ``last``: no rollouts are started for a next step (async mode)."""
        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        span = self.timeline.span
        with span("1 rollouts", step=step):
            summaries, entries = self._obtain_rollouts(step, timings)  # this step's rollouts
        with span("2 store", step=step):
            observed = self._store(step, summaries, entries)  # replay buffer, trajectories, RODS observe
        with span("3 learn", step=step):
            learn, trained = self._learn(step, len(entries), last, timings)  # async: step+1 rolls out meanwhile
        with span("4 sync", step=step):
            self._sync_weights(trained, timings)  # async: held back until step+1's rollouts are in
        timings["step"] = time.perf_counter() - t0
        with span("5 metrics", step=step):
            return self._metrics(summaries, learn, observed, timings)

    def _launch_rollouts(self, step: int) -> list:
        """Sample step ``step``'s tasks and start their rollouts; returns the pending Ray calls."""
        cfg = self.cfg
        if self.rods is not None:
            tasks = ray.get(self.rods.sample.remote(step, cfg.rollout.tasks_per_step))
        else:
            tasks = self.sampler.next(cfg.rollout.tasks_per_step)
        # a task that killed its rollout worker twice is not rolled out again (RolloutScheduler)
        tasks = [t for t in tasks if t.id not in self.scheduler.quarantined]
        return self.rollout_side.rollout(tasks, cfg.rollout, cfg.run.seed * 100_003 + step * 101)

    def _obtain_rollouts(self, step: int, timings: dict[str, float]) -> tuple[list[GroupSummary], list[GroupRef]]:
        """Phase 1: the group summaries and group refs of step ``step``."""
        t0 = time.perf_counter()
        summaries, entries = [], []
        for sums, refs in self.scheduler.take(step):
            summaries += sums
            entries += refs
        timings["rollout_wait"] = time.perf_counter() - t0  # generation time not hidden behind learning
        t1 = time.perf_counter()
        self.scheduler.catch_up()  # async: the update held back while these rollouts ran (if none still run)
        timings["sync"] = time.perf_counter() - t1
        return summaries, entries

    def _store(self, step: int, summaries: list[GroupSummary], entries: list[GroupRef]):
        """Phase 2: the groups into the replay buffer and the trajectory records (not awaited);
        with RODS, their rewards to the pool (boundary statistics from the batch itself: no extra
        rollouts). Returns the pending observe call (awaited in phase 5), or None."""
        ray.get(self.buffer.add.remote(entries))
        self.trajectories.add(step, entries)
        with (self.run_dir / TASKS_LOG).open("a", encoding="utf-8") as fh:  # the tasks each step trained on
            fh.write(json.dumps({"step": step, "task_ids": [s.task_id for s in summaries if s.policy == POLICY]}) + "\n")
        if self.rods is None:
            return None
        # RSPO: the boundary is the policy's, unless rspo.boundary_from_explorer
        mine = [s for s in summaries if s.outcome and (s.policy == POLICY or self.cfg.rspo.boundary_from_explorer)]
        return self.rods.observe.remote(step, [(s.task_id, s.progress) for s in mine])

    def _learn(self, step: int, n_groups: int, last: bool, timings: dict[str, float]) -> tuple[dict, bool]:
        """Phase 3: one update on up to twice the groups just added; returns (learner metrics,
        whether an update ran). In async mode the next steps' rollouts start while the learner
        trains (as far as buffer.max_staleness allows), none past the last step or once
        train.max_minutes has passed."""
        t0 = time.perf_counter()
        refs = ray.get(self.buffer.sample.remote(n_groups * 2, self.version))
        learning = self.learner.train.remote(refs) if refs else None
        out_of_time = self.deadline is not None and time.perf_counter() > self.deadline
        self.scheduler.prefetch(step + 1, until=step if last or out_of_time else self.cfg.train.steps)
        learn = self._await_learner(learning, step) if learning is not None else {}
        if not refs:  # said, since the step line alone would look like any other
            print(f"step {step}: no group to learn from (every episode dropped, or every group older than "
                  f"buffer.max_staleness={self.cfg.buffer.max_staleness}); no update, the policy stays at "
                  f"version {self.version}", flush=True)
        self.version += 1 if refs else 0
        timings["learn"] = time.perf_counter() - t0
        return learn, bool(refs)

    def _await_learner(self, learning, step: int) -> dict:
        """The update's metrics; a learner rank lost or an update past ``runtime.learner_timeout_s``
        ends the run with ``ResumableFailure`` (no state can be saved without the learner)."""
        timeout = self.cfg.runtime.learner_timeout_s
        try:
            return ray.get(learning, timeout=timeout)
        except ray.exceptions.GetTimeoutError as err:
            what = f"the learner did not finish step {step}'s update within runtime.learner_timeout_s={timeout:g}s"
            raise ResumableFailure(what) from err
        except ray.exceptions.RayActorError as err:
            what = f"a learner rank died during step {step}'s update ({type(err).__name__})"
            raise ResumableFailure(what) from err
        except ray.exceptions.ObjectLostError as err:
            # the groups are owned by this process and outlive their worker; only the loss of the
            # node that stores them (its object store) loses them
            what = f"step {step}'s groups were lost with the node that stored them ({type(err).__name__})"
            raise ResumableFailure(what) from err

    def _sync_weights(self, trained: bool, timings: dict[str, float]) -> None:
        """Phase 4: hand a new policy version to the scheduler: loaded now, or (async mode) after
        the next step's rollouts are in, timed then in phase 1."""
        t0 = time.perf_counter()
        if trained:
            self.scheduler.updated(self.version)
        if not self.cfg.train.async_rollouts:
            timings["sync"] = time.perf_counter() - t0

    def _metrics(self, summaries: list[GroupSummary], learn: dict, observed, timings: dict[str, float]) -> dict[str, float]:
        """Phase 5: the step's metrics (``telemetry.summaries.step_metrics``) plus the actors' own."""
        m = step_metrics(summaries, timings, learn, self.version, namespaces=tuple(f"{x.name}/" for x in self.methods))
        m.update(self.scheduler.pop_recoveries())  # recovery/worker_restarts, recovery/reissued_groups
        if m["train/env_failures"]:
            print(f"recovery: {m['train/env_failures']:.0f} episode(s) dropped: their environment failed", flush=True)
        m.update({f"buffer/{k}": float(v) for k, v in ray.get(self.buffer.stats.remote()).items()})
        if self.sgls is not None:  # simulated tool calls, cache hit rate within groups, retries
            m.update({f"sgls/{k}": float(v) for k, v in ray.get(self.sgls.stats.remote()).items()})
        if self.rods is not None:  # pool size, regions, phi histogram, synthesis throughput
            ray.get(observed)  # not awaited earlier (learning went ahead); an error in it surfaces here
            m.update(self.drain_pool_log())
        return m

    # ---------------------------------------------------------------- checkpoints, the end
    def write_trace(self) -> None:
        """``trace.json``: the driver's phase spans and Ray's timeline of every actor call
        (``telemetry.trace``). A failure costs the trace, never the run's results."""
        if not self.cfg.telemetry.trace:
            return
        try:
            path = self.timeline.write(self.run_dir, ray.timeline())
            print(f"step timeline: {path} (open in https://ui.perfetto.dev)", flush=True)
        except Exception as err:  # noqa: BLE001 - e.g. the GCS is gone
            print(f"warning: no step timeline written: {err}", flush=True)

    def drain_pool_log(self) -> dict[str, float]:
        """Append the RODS pool's events since the last drain to rods_pool.jsonl; returns its metrics."""
        rods_metrics, events = ray.get(self.rods.report.remote())
        with (self.run_dir / POOL_LOG).open("a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(e) + "\n" for e in events)
        return rods_metrics

    def checkpoint(self, step: int):
        """The run after ``step`` as ``checkpoint-<step>``, resumable (``checkpointing/checkpoint.py``)."""
        return write_checkpoint(self, step, self.evals)

    def save(self, out_dir: Path) -> None:
        """Learner weights (+ the RODS pool as rods_pool.json) into ``out_dir``, with a manifest;
        with run.storage uploaded there too (``checkpointing/checkpoint.write_final``)."""
        write_final(self, out_dir)

    def shutdown(self, raise_errors: bool = True) -> None:
        """Flush and stop everything. Every part runs even when one before it fails; failures are
        logged, and the first is raised only with ``raise_errors``: never while the run's own
        error propagates (it would mask it)."""
        errors = []
        # the trajectories first: the last groups are still on their way to the writer
        for name, part in (("trajectories", self.trajectories.close), ("trace", self.write_trace),
                           ("rods", self._stop_rods), ("rollout side", self.rollout_side.shutdown),
                           ("learner", self.learner.kill), ("metrics", self.metrics.close)):
            try:
                part()
            except Exception as err:  # noqa: BLE001 - logged; raised below unless an error is in flight
                print(f"warning: shutdown: {name} failed: {type(err).__name__}: {err}", flush=True)
                errors.append(err)
        if errors and raise_errors:
            raise errors[0]

    def _stop_rods(self) -> None:
        if self.rods is not None:
            ray.get(self.rods.shutdown.remote())
            self.drain_pool_log()  # jobs that finished after the last step


def train(cfg: Config, config_path: str | None = None, resume: str | Path | None = None,
          run_dir: Path | None = None) -> dict:
    """Run a training job end to end; returns the start/end held-out evaluations. ``run_dir``: the
    new run's folder (default ``run.output_dir/<run.name>-<timestamp>``). A SIGTERM ends the run
    after its current step with a checkpoint (``Preempted``; checkpointing/preemption.py). ``resume``: a run
    folder to continue from its newest complete checkpoint (``cfg`` is its config.yaml, with the
    overrides ``config/resume.py`` allows)."""
    from agentrl.telemetry.report import write_report

    set_default_env()
    resolve_model_path(cfg)  # a missing model or task set fails here: before a run folder exists or Ray starts
    check_trackers(cfg.telemetry.loggers)  # and a tracker package that is not installed
    checkpoint = open_checkpoint(resume, cfg) if resume is not None else None
    tasks = load_task_sources(cfg, checkpoint)
    run_dir = _make_run_dir(cfg, config_path, run_dir) if checkpoint is None else reopen_run_dir(checkpoint, cfg)
    store = run_storage(cfg, run_dir)  # run.storage: the checkpoints, final/ and the logs go there
    if store is not None:
        sync_run_files(store, run_dir)
        print(f"agentrl: run.storage: checkpoints, final/ and logs go to {store}", flush=True)

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
        print(f"agentrl: {err}", flush=True)
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
            print(f"agentrl: the run stopped: {err}; {again}", flush=True)
        elif bad_input is None:
            print(f"error: the run failed: {type(err).__name__}: {err}", flush=True)
        _close(trainer, owns_ray, raise_errors=False)
        if not _drop_if_bad_input(err, run_dir, fresh=checkpoint is None):
            _write_results(run_dir, trainer.evals, write_report, strict=False, store=store)
        raise
    _close(trainer, owns_ray)
    _write_results(run_dir, evals, write_report, store=store)
    print(f"training took {(time.perf_counter() - t_start) / 60:.1f} min; metrics in {run_dir}", flush=True)
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
        print(f"agentrl: run folder {run_dir} removed: the run stopped on bad input before its first checkpoint",
              flush=True)
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
            print(f"warning: {name} not written: {type(err).__name__}: {err}", flush=True)


def _make_run_dir(cfg: Config, config_path: str | None, run_dir: Path | None = None) -> Path:
    """``run_dir``, default ``run.output_dir/<run.name>-<timestamp>/``, with the resolved config in it."""
    if run_dir is None:
        run_dir = Path(cfg.run.output_dir) / f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    print(f"agentrl: run {run_dir} (config {config_path or 'defaults'})", flush=True)
    return run_dir


def _run(trainer: Trainer, cfg: Config, run_dir: Path, t_start: float, stop: StopOnSignal) -> dict[str, dict[str, float]]:
    """The evaluations, the steps and the checkpoints, from step 1 or after the resumed checkpoint;
    returns the start/end evaluations. With train.checkpoint_every the last step is checkpointed
    too, so ``--resume RUN train.steps=N`` can extend a finished run. When ``stop`` has seen a
    signal, the run checkpoints after the step in progress and raises ``Preempted``."""
    evals = trainer.evals
    step = saved = trainer.start_step
    if step == 0 and cfg.train.eval_at_start:
        evals["start"] = start = _evaluate(trainer, 0)
        print(f"held-out at start: success {start['success']:.2f} on {int(start['episodes'])} tasks "
              f"({start['seconds']:.0f}s)", flush=True)
    deadline = trainer.deadline = t_start + cfg.train.max_minutes * 60 if cfg.train.max_minutes else None
    _stop_if_signalled(trainer, stop, step, saved)
    for step in range(trainer.start_step + 1, cfg.train.steps + 1):
        m = trainer.step(step, last=step == cfg.train.steps)
        trainer.metrics.log(step, m)
        trainer.progress.update(step, m)
        if cfg.train.eval_every and step % cfg.train.eval_every == 0 and step < cfg.train.steps:
            _evaluate(trainer, step)
        if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
            trainer.checkpoint(step)
            saved = step
        _stop_if_signalled(trainer, stop, step, saved)
        if deadline and time.perf_counter() > deadline:
            print(f"train.max_minutes reached after step {step}", flush=True)
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
        print(f"held-out success: {evals['start']['success']:.2f} -> {evals['end']['success']:.2f}", flush=True)
