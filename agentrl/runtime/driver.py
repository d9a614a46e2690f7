"""The driver loop: one process that places the actors and moves object refs between them.

    sample tasks -> rollouts (workers x simulators) -> replay buffer -> learner -> weight sync

Runs the same in-process on an embedded Ray (``agentrl train CONFIG``) and under
``ray job submit`` against a cluster (Ray picks up ``RAY_ADDRESS``). The driver never touches a
trajectory payload: workers put groups into the object store and the learner resolves them.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

import ray

from agentrl.config import Config, dump_config
from agentrl.rewards.behaviours import behaviour_rates
from agentrl.runtime.env import set_default_env
from agentrl.runtime.evaluate import summarize

POOL_LOG = "rods_pool.jsonl"  # append-only RODS pool events (one JSON object per line)
POOL_STATE = "rods_pool.json"  # the RODS pool in a checkpoint folder


class TaskSampler:
    """Training tasks per step: shuffled passes over the train set, or fresh generated tasks."""

    def __init__(self, cfg: Config, train_tasks: list, heldout_keys: set[tuple[str, ...]]):
        self.cfg = cfg
        self.rng = random.Random(cfg.run.seed)
        self.heldout_keys = heldout_keys  # held-out tasks as their tuples of user turns
        self.tasks = [] if cfg.tasks.fresh_train else list(train_tasks)
        self.order: list = []
        self.fresh_seed = 1_000_000 + cfg.run.seed * 10_000

    def next(self, n: int) -> list:
        if self.cfg.tasks.fresh_train:
            from agentrl.envs.builtin.generator import generate_tasks

            self.fresh_seed += 1
            return generate_tasks(n, seed=self.fresh_seed, id_prefix=f"fresh{self.fresh_seed}",
                                  exclude=self.heldout_keys, suite=self.cfg.tasks.fresh_suite)
        out = []
        while len(out) < n:
            if not self.order:
                self.order = list(self.tasks)
                self.rng.shuffle(self.order)
            out.append(self.order.pop())
        return out


def _shard(items: list, n: int) -> list[list]:
    return [items[i::n] for i in range(n)]


def _load_task_sources(cfg: Config) -> dict[str, list]:
    """tasks.heldout and (unless fresh_train) tasks.train, loaded once, before the run folder and
    Ray exist: a bad path, a malformed file or a missing/wrong benchmark package is reported with
    its key, not as a traceback mid-start."""
    from agentrl.tasks.io import TaskFileError, resolve_task_sources

    keys = ["heldout"] + ([] if cfg.tasks.fresh_train else ["train"])
    loaded: dict[str, list] = {"train": []}
    for key in keys:
        try:
            tasks = loaded[key] = resolve_task_sources(getattr(cfg.tasks, key))
        except (TaskFileError, ValueError, RuntimeError) as err:
            raise SystemExit(f"error: tasks.{key}: {err}") from None
        n_sgls = sum(t.backend == "sgls" for t in tasks)
        if n_sgls and cfg.simulators.sgls is None:
            raise SystemExit(f"error: tasks.{key}: {n_sgls} tasks use backend 'sgls' (LLM-simulated tools) but "
                             "simulators.sgls is not set (give it model_path or endpoint)")
    if cfg.rods.enabled and cfg.rods.resume_from:
        try:
            loaded["rods_state"] = json.loads(Path(cfg.rods.resume_from).read_text())
        except (OSError, ValueError) as err:
            raise SystemExit(f"error: rods.resume_from: cannot read the pool state {cfg.rods.resume_from}: {err}") from None
    return loaded


def _model_path(cfg: Config) -> str:
    path = Path(cfg.model.path)
    if not (path / "config.json").exists():
        hint = " Build it with `agentrl make-model`." if "tiny-agent" in str(path) else ""
        raise SystemExit(f"error: model.path: no model at {path}.{hint}")
    return str(path.resolve())


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, tasks: dict[str, list]):
        from agentrl.runtime.learner import LearnerActor
        from agentrl.runtime.replay_buffer import ReplayBuffer
        from agentrl.runtime.rollout_worker import RolloutWorker
        from agentrl.runtime.simulator_pool import SimulatorPool, start_sgls_server
        from agentrl.runtime.weight_sync import make_weight_sync
        from agentrl.telemetry.metrics import MetricsSink
        from agentrl.telemetry.progress import ProgressLine

        self.cfg, self.run_dir = cfg, run_dir
        model_path = _model_path(cfg)
        heldout = tasks["heldout"]
        self.heldout = heldout[: cfg.tasks.heldout_size] if cfg.tasks.heldout_size else heldout
        heldout_texts = {turn.user for t in heldout for turn in t.turns}
        heldout_keys = {tuple(turn.user for turn in t.turns) for t in heldout}
        self.sampler = None if cfg.rods.enabled else TaskSampler(cfg, tasks["train"], heldout_keys)
        self.rods = None
        if cfg.rods.enabled:  # the pool replaces the sampler; seeds = tasks.train
            from agentrl.runtime.synthesis_actor import SynthesisActor

            self.rods = SynthesisActor.options(num_cpus=cfg.rods.num_cpus, num_gpus=cfg.rods.num_gpus).remote(
                tasks["train"], cfg.rods, cfg.rollout.tasks_per_step, frozenset(heldout_texts), cfg.run.seed, cfg.model.dtype,
                state=tasks.get("rods_state"), resume=True)
        rt = cfg.runtime
        self.sgls = start_sgls_server(cfg, cfg.model.dtype)
        self.pool = SimulatorPool.create(cfg.simulators.num_actors, rt.simulator_cpus, cfg.simulators.max_concurrency, self.sgls,
                                         cfg.simulators.sgls)
        self.workers = [
            RolloutWorker.options(num_cpus=rt.rollout_worker_cpus, num_gpus=rt.rollout_worker_gpus).remote(
                model_path, cfg.rollout, cfg.model.dtype, self.pool.actors, i, weight_sync=rt.weight_sync,
                rewards_cfg=cfg.rewards,
            )
            for i in range(cfg.rollout.num_workers)
        ]
        self.buffer = ReplayBuffer.remote(cfg.buffer.capacity_groups, cfg.buffer.max_staleness)
        # the learner scores tokens under the tempered distribution the rollouts sampled from
        self.learner = LearnerActor.options(num_cpus=rt.learner_cpus, num_gpus=rt.learner_gpus).remote(
            model_path, cfg.learner, cfg.algo, cfg.model.dtype, cfg.run.seed, cfg.rollout.temperature)
        starts = ray.get([w.start.remote() for w in self.workers])
        learner_version = ray.get(self.learner.get_version.remote())
        print(f"rollout engines ready ({', '.join(f'{s:.0f}s' for s in starts)}); learner ready (v{learner_version})", flush=True)
        self.sync = make_weight_sync(rt.weight_sync, self.learner, self.workers)
        self.metrics = MetricsSink(run_dir, cfg.telemetry, cfg.run.name)
        self.progress = ProgressLine(cfg.train.steps, live=None if cfg.telemetry.progress else False)
        self.version = 0
        self._pending: list = []  # async_rollouts: the next step's rollout calls, in flight
        self._sync_due = False  # async_rollouts: the engines are one update behind the learner
        self.deadline: float | None = None  # train.max_minutes as a perf_counter time (set by train())

    # ---------------------------------------------------------------- evaluation
    def evaluate(self) -> dict[str, float]:
        self.settle()
        t0 = time.perf_counter()
        shards = _shard(self.heldout, len(self.workers))
        results = [r for rs in ray.get([w.evaluate.remote(s) for w, s in zip(self.workers, shards) if s]) for r in rs]
        n = max(1, len(results))
        out = {
            "success": sum(r["outcome"] for r in results) / n,
            "progress": sum(r["progress"] for r in results) / n,
            "mean_calls": sum(r["calls"] for r in results) / n,
            "redundant_call_rate": sum(r["redundant_calls"] for r in results) / max(1, sum(r["valid_calls"] for r in results)),
            "episodes": float(len(results)),
            "seconds": time.perf_counter() - t0,
        }
        # what changed, not only how much: success per category and the rate of each behaviour
        for cat, (_, acc) in summarize(results).items():
            if cat != "overall":
                out[f"success/{cat}"] = acc
        out.update({f"behaviour/{k}": v for k, v in behaviour_rates([r["behaviours"] for r in results]).items()})
        return out

    # ---------------------------------------------------------------- one step
    def _launch_rollouts(self, step: int) -> list:
        """Sample step ``step``'s tasks and start their rollouts; returns the pending Ray calls."""
        cfg = self.cfg
        if self.rods is not None:
            tasks = ray.get(self.rods.sample.remote(step, cfg.rollout.tasks_per_step))
        else:
            tasks = self.sampler.next(cfg.rollout.tasks_per_step)
        return [
            w.rollout.remote(shard, cfg.rollout.group_size, cfg.rollout.temperature, cfg.rollout.top_p,
                             cfg.run.seed * 100_003 + step * 101 + i)
            for i, (w, shard) in enumerate(zip(self.workers, _shard(tasks, len(self.workers))))
            if shard
        ]

    def settle(self, discard_pending: bool = False) -> None:
        """Bring the engines to the learner's latest weights (before an evaluation or the end).

        With train.async_rollouts the next step's rollouts may be running and the sync waits for
        them: loading weights mid-episode would mix two policies in one trajectory. Their
        results stay pending for that step, unless ``discard_pending`` (no step will use them)."""
        if self._pending:
            ray.wait(self._pending, num_returns=len(self._pending))
            if discard_pending:
                self._pending = []
        if self._sync_due:
            self.sync.sync(self.version)
            self._sync_due = False

    def step(self, step: int, last: bool = False) -> dict[str, float]:
        """One training step. ``last``: no rollouts are started for a next step (async mode)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        if not self._pending:  # nothing in flight: roll out on the newest weights
            self.settle()
            self._pending = self._launch_rollouts(step)
        pending, self._pending = self._pending, []
        summaries, entries = [], []
        for sums, refs in ray.get(pending):
            summaries += sums
            entries += [([ref], s["version"]) for ref, s in zip(refs, sums)]
        t_wait = time.perf_counter() - t0
        t2 = time.perf_counter()
        self.settle()  # async: the previous update, held back while these rollouts ran
        t_sync = time.perf_counter() - t2
        ray.get(self.buffer.add.remote(entries))
        observed = None
        if self.rods is not None:  # boundary statistics from the batch itself: no extra rollouts
            observed = self.rods.observe.remote(step, [(s["task_id"], s["progress"]) for s in summaries])

        t1 = time.perf_counter()
        boxes = ray.get(self.buffer.sample.remote(len(entries) * 2, self.version))
        learning = self.learner.train.remote(boxes) if boxes else None
        out_of_time = self.deadline is not None and time.perf_counter() > self.deadline
        if cfg.train.async_rollouts and not last and not out_of_time:
            # the next batch is generated by the engines' current weights while the learner trains
            self._pending = self._launch_rollouts(step + 1)
        learn = ray.get(learning) if learning is not None else {}
        self.version += 1 if boxes else 0
        t_learn = time.perf_counter() - t1

        self._sync_due = bool(boxes)
        if not cfg.train.async_rollouts:  # async: held back until the next rollouts are in
            t2 = time.perf_counter()
            self.settle()
            t_sync = time.perf_counter() - t2
        t_gen = max((s["wall_seconds"] for s in summaries), default=0.0)

        outcomes = [o for s in summaries for o in s["outcome"]]
        progress = [p for s in summaries for p in s["progress"]]
        n = max(1, len(outcomes))
        mean_p = sum(progress) / n
        tokens = sum(s["policy_tokens"] for s in summaries)
        group_std = [statistics.pstdev(s["progress"]) for s in summaries]
        m = {
            "train/success": sum(outcomes) / n,
            "train/progress": mean_p,
            "train/reward_std": sum(group_std) / max(1, len(group_std)),
            # groups whose progress rewards differ: the ones a group-relative estimator learns from
            "train/groups_with_variance": sum(sd > 0 for sd in group_std) / max(1, len(group_std)),
            "train/episodes": float(len(outcomes)),
            "train/policy_tokens": float(tokens),
            "perf/tokens_per_s": tokens / max(t_gen, 1e-9),
            "train/calls_per_episode": sum(s["calls"] for s in summaries) / n,
            "train/valid_call_fraction": sum(s["valid_calls"] for s in summaries) / max(1, sum(s["calls"] for s in summaries)),
            "train/redundant_call_fraction": (sum(s["redundant_calls"] for s in summaries)
                                              / max(1, sum(s["valid_calls"] for s in summaries))),
            "time/generate": t_gen,
            "time/rollout_wait": t_wait,  # generation time not hidden behind learning
            "time/learn": t_learn,
            "time/sync": t_sync,
            "time/step": time.perf_counter() - t0,
            "train/policy_version": float(self.version),
            "train/policy_lag": float(self.version - 1 - min(s["version"] for s in summaries)) if summaries else 0.0,
        }
        # HierR components, summary reward, omission rate: means over groups (groups are equal-sized)
        for key in (summaries[0]["rewards"] if summaries else {}):
            m[f"reward/{key}"] = sum(s["rewards"][key] for s in summaries) / len(summaries)
        m.update({f"learner/{k}": float(v) for k, v in learn.items()})
        m.update({f"buffer/{k}": float(v) for k, v in ray.get(self.buffer.stats.remote()).items()})
        if self.sgls is not None:  # simulated tool calls, cache hit rate within groups, retries
            m.update({f"sgls/{k}": float(v) for k, v in ray.get(self.sgls.stats.remote()).items()})
        if self.rods is not None:  # pool size, regions, phi histogram, synthesis throughput
            ray.get(observed)  # not awaited earlier (learning went ahead); an error in it surfaces here
            m.update(self.drain_pool_log())
        return m

    def drain_pool_log(self) -> dict[str, float]:
        """Append the RODS pool's events since the last drain to rods_pool.jsonl; returns its metrics."""
        rods_metrics, events = ray.get(self.rods.report.remote())
        with (self.run_dir / POOL_LOG).open("a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(e) + "\n" for e in events)
        return rods_metrics

    def save(self, out_dir: Path) -> None:
        """Learner weights (+ the RODS pool as rods_pool.json) into ``out_dir``."""
        ray.get(self.learner.save.remote(str(out_dir.resolve())))
        if self.rods is not None:
            self.drain_pool_log()  # the log holds everything up to the saved state
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / POOL_STATE).write_text(json.dumps(ray.get(self.rods.state_dict.remote())))

    def shutdown(self) -> None:
        if self.rods is not None:
            ray.get(self.rods.shutdown.remote())
            self.drain_pool_log()  # jobs that finished after the last step
        ray.get([w.shutdown.remote() for w in self.workers])
        if self.sgls is not None:
            ray.get(self.sgls.shutdown.remote())
        self.metrics.close()


def _init_ray(cfg: Config) -> bool:
    """Connect to (or start) Ray; True when this call started/connected it and should shut it down."""
    import os

    if ray.is_initialized():
        return False
    if cfg.runtime.ray_address:
        ray.init(address=cfg.runtime.ray_address, log_to_driver=True)
    elif os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=True)  # under `ray job submit`, or a user-started cluster
    else:
        tmp = os.environ.get("RAY_TMPDIR", "/tmp/agentrl-ray")
        ray.init(num_cpus=_embedded_cpus(cfg), include_dashboard=True, _temp_dir=tmp, log_to_driver=True)
    return True


def _embedded_cpus(cfg: Config) -> int:
    """Logical CPUs for an embedded cluster: at least what the actors ask for.

    Ray CPUs are scheduling tokens, not cores. On a 2-core machine one rollout worker (1 CPU),
    the learner (1 CPU) and the simulators (0.1 each) ask for 2.1, and Ray would leave an actor
    pending forever; the engines share the cores anyway.
    """
    import math
    import os

    rt = cfg.runtime
    need = rt.rollout_worker_cpus * cfg.rollout.num_workers + rt.learner_cpus + rt.simulator_cpus * cfg.simulators.num_actors
    if cfg.simulators.sgls is not None:
        need += cfg.simulators.sgls.num_cpus
    if cfg.rods.enabled:
        need += cfg.rods.num_cpus
    return rt.num_cpus or max(os.cpu_count() or 1, math.ceil(need))


def train(cfg: Config, config_path: str | None = None) -> dict:
    """Run a training job end to end; returns the start/end held-out evaluations."""
    from agentrl.telemetry.progress import eval_table
    from agentrl.telemetry.report import write_report

    set_default_env()
    _model_path(cfg)  # a missing model or task set fails here: before a run folder exists or Ray starts
    tasks = _load_task_sources(cfg)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(cfg.run.output_dir) / f"{cfg.run.name}-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    print(f"agentrl: run {run_dir} (config {config_path or 'defaults'})", flush=True)

    # Load torch's libraries before Ray starts: under `ray job submit --working-dir`, importing torch
    # after ray.init() sometimes died with "oneMKL FATAL ERROR: Cannot load libtorch_cpu.so"
    # (4 of 17 tries), never when torch came first (0 of 8).
    import torch  # noqa: F401

    owns_ray = _init_ray(cfg)
    t_start = time.perf_counter()
    trainer = Trainer(cfg, run_dir, tasks)
    evals: dict[str, dict[str, float]] = {}
    try:
        if cfg.train.eval_at_start:
            evals["start"] = trainer.evaluate()
            trainer.metrics.log(0, {f"eval/{k}": v for k, v in evals["start"].items()})
            start = evals["start"]
            print(f"held-out at start: success {start['success']:.2f} on {int(start['episodes'])} tasks "
                  f"({start['seconds']:.0f}s)", flush=True)
        deadline = trainer.deadline = t_start + cfg.train.max_minutes * 60 if cfg.train.max_minutes else None
        for step in range(1, cfg.train.steps + 1):
            m = trainer.step(step, last=step == cfg.train.steps)
            trainer.metrics.log(step, m)
            trainer.progress.update(step, m)
            if cfg.train.eval_every and step % cfg.train.eval_every == 0 and step < cfg.train.steps:
                e = trainer.evaluate()
                trainer.metrics.log(step, {f"eval/{k}": v for k, v in e.items()})
            if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
                trainer.save(run_dir / f"checkpoint-{step}")
            if deadline and time.perf_counter() > deadline:
                print(f"train.max_minutes reached after step {step}", flush=True)
                break
        trainer.progress.close()
        # async: rollouts started for a step that will not run (the time limit fell during the
        # update) finish before the engines get the final weights; they are discarded
        trainer.settle(discard_pending=True)
        if cfg.train.eval_at_end:
            evals["end"] = trainer.evaluate()
            trainer.metrics.log(step, {f"eval/{k}": v for k, v in evals["end"].items()})
        trainer.save(run_dir / "final")
    finally:
        trainer.shutdown()
        if owns_ray:
            ray.shutdown()  # before the summary, so no actor log lands after the last line
    (run_dir / "evals.json").write_text(json.dumps(evals, indent=2))
    write_report(run_dir)
    print(f"training took {(time.perf_counter() - t_start) / 60:.1f} min; metrics in {run_dir}", flush=True)
    if evals:
        eval_table("held-out evaluation (greedy)",
                   {row: {k: v for k, v in e.items() if "/" not in k} for row, e in evals.items()})
        eval_table("held-out success by category, and behaviour rates", {
            row: {k: v for k, v in e.items() if "/" in k} for row, e in evals.items()})
    if "start" in evals and "end" in evals:
        print(f"held-out success: {evals['start']['success']:.2f} -> {evals['end']['success']:.2f}", flush=True)
    return evals
