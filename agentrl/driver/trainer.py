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
import time
from functools import partial
from pathlib import Path

import ray

from agentrl.api import POLICY, GroupRef, GroupSummary
from agentrl.checkpointing.checkpoint import (
    BUFFER_FILE,
    POOL_LOG,
    POOL_STATE,
    RESUMES_LOG,
    SAMPLER_PART,
    SCHEDULER_PART,
    TASKS_LOG,
    TRAINER_PART,
    Checkpoint,
    RunParts,
    engine_seed_rollout_cfg,
    restore,
    run_storage,
    write_checkpoint,
    write_final,
)
from agentrl.checkpointing.preemption import ResumableFailure
from agentrl.checkpointing.records import RemotePart
from agentrl.common.log import get_logger
from agentrl.config import Config
from agentrl.driver.cluster import RolloutSide, resolve_model_path
from agentrl.driver.scheduler import RolloutScheduler
from agentrl.driver.task_sources import TaskSampler, start_synthesis_actor
from agentrl.methods.registry import active_methods
from agentrl.rollout.trajectory_writer import Trajectories
from agentrl.tasks.schema import text_key
from agentrl.telemetry.metrics import MetricsSink
from agentrl.telemetry.progress import ProgressLine, print_eval_progress
from agentrl.telemetry.summaries import eval_metrics, step_metrics
from agentrl.telemetry.timeline import Timeline
from agentrl.weight_sync import make_weight_sync

log = get_logger(__name__)


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
        self.rods = start_synthesis_actor(cfg, tasks, heldout, resuming=resume is not None) if cfg.rods.enabled else None
        rt = cfg.runtime
        self.start_step = resume.step if resume is not None else 0
        self.rollout_side = RolloutSide.create(cfg, model_path, rollout_cfg=engine_seed_rollout_cfg(cfg, self.start_step),
                                               weight_sync=rt.weight_sync)
        self.workers, self.sgls = self.rollout_side.workers, self.rollout_side.sgls
        self.buffer = ReplayBuffer.remote(cfg.buffer.capacity_groups, cfg.buffer.max_staleness)
        self.methods = active_methods(cfg)  # research methods the config turns on (agentrl/methods/)
        self.task_stat_roles = {r.name for m in self.methods for r in m.rollout_roles() if r.feeds_task_stats}
        self.learner = LearnerGroup.create(cfg, model_path)
        starts = self.rollout_side.start()
        learner_version = ray.get(self.learner.get_version.remote())
        log.info(f"rollout engines ready ({', '.join(f'{s:.0f}s' for s in starts)}); learner ready (v{learner_version})")
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
            self._resume(resume)

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
        # the boundary is the policy's, and that of the methods' roles that ask for it (feeds_task_stats)
        mine = [s for s in summaries if s.outcome and (s.policy == POLICY or s.policy in self.task_stat_roles)]
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
            log.warning(f"step {step}: no group to learn from (every episode dropped, or every group older than "
                        f"buffer.max_staleness={self.cfg.buffer.max_staleness}); no update, the policy stays at "
                        f"version {self.version}")
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
            log.warning(f"recovery: {m['train/env_failures']:.0f} episode(s) dropped: their environment failed")
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
            log.info(f"step timeline: {path} (open in https://ui.perfetto.dev)")
        except Exception as err:  # noqa: BLE001 - e.g. the GCS is gone
            log.warning(f"warning: no step timeline written: {err}")

    def drain_pool_log(self) -> dict[str, float]:
        """Append the RODS pool's events since the last drain to rods_pool.jsonl; returns its metrics."""
        rods_metrics, events = ray.get(self.rods.report.remote())
        with (self.run_dir / POOL_LOG).open("a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(e) + "\n" for e in events)
        return rods_metrics

    def state_dict(self) -> dict:
        """The driver's own part of a checkpoint: the policy version and the start evaluation."""
        return {"version": self.version, "evals": self.evals}

    def load_state_dict(self, state: dict) -> None:
        self.version = state["version"]
        self.evals = {k: v for k, v in state["evals"].items() if k != "end"}  # a new end comes with the new last step

    def run_parts(self) -> RunParts:
        """What a checkpoint saves, in restore order: the learner, then the driver's counters, the
        task sampler or the RODS pool, the replay buffer, and the scheduler last (restoring it in
        sync mode loads the checkpoint's weights into the engines). ``final/`` keeps the pool."""
        parts = {TRAINER_PART: self}
        if self.sampler is not None:
            parts[SAMPLER_PART] = self.sampler
        if self.rods is not None:
            parts[POOL_STATE] = _PoolPart(self)
        parts[BUFFER_FILE] = RemotePart(self.buffer)
        parts[SCHEDULER_PART] = self.scheduler
        return RunParts(self.run_dir, self.storage, self.cfg.train.keep_checkpoints, self.learner, parts,
                        final=(POOL_STATE,) if self.rods is not None else ())

    def checkpoint(self, step: int):
        """The run after ``step`` as ``checkpoint-<step>``, resumable (``checkpointing/checkpoint.py``)."""
        self.trajectories.checkpoint()
        return write_checkpoint(self.run_parts(), step)

    def save(self, out_dir: Path) -> None:
        """Learner weights (+ the RODS pool as rods_pool.json) into ``out_dir``, with a manifest;
        with run.storage uploaded there too (``checkpointing/checkpoint.write_final``)."""
        write_final(self.run_parts(), out_dir)

    def _resume(self, ckpt: Checkpoint) -> None:
        """Every part restored from ``ckpt``; what was restored appended to ``resumes.jsonl``."""
        digest = restore(self.run_parts(), ckpt)
        record = {"time": time.time(), "checkpoint": ckpt.path.name, "step": ckpt.step, "version": self.version,
                  "steps": self.cfg.train.steps, "learner_digest_match": True, "learner_digest": digest,
                  "buffer_groups": ray.get(self.buffer.stats.remote())["size"],
                  "rollouts_in_flight": sum(len(call.result[1]) for call in self.scheduler.in_flight)}
        with (self.run_dir / RESUMES_LOG).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")

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
                log.warning(f"warning: shutdown: {name} failed: {type(err).__name__}: {err}")
                errors.append(err)
        if errors and raise_errors:
            raise errors[0]

    def _stop_rods(self) -> None:
        if self.rods is not None:
            ray.get(self.rods.shutdown.remote())
            self.drain_pool_log()  # jobs that finished after the last step


class _PoolPart:
    """The RODS synthesis actor as a checkpoint part. Saving drains its events into
    ``rods_pool.jsonl`` first, so the log holds everything up to the saved state."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer

    def state_dict(self) -> dict:
        self.trainer.drain_pool_log()
        return ray.get(self.trainer.rods.state_dict.remote())

    def load_state_dict(self, state: dict) -> None:
        ray.get(self.trainer.rods.load_state_dict.remote(state))
