"""Ray and the rollout side of a run, shared by ``agentrl train`` (driver.py) and ``agentrl eval`` (evaluate.py).

* ``init_ray``: join the configured cluster (``runtime.ray_address``, ``RAY_ADDRESS``) or start an
  embedded one with ``embedded_cpus`` logical CPUs;
* ``resolve_model_path``: ``model.path`` as an absolute path, or a readable error;
* ``RolloutSide``: the tool pool (plus the SGLS server when ``tools.sgls`` is set) and
  the rollout workers, placed with their ``runtime.*`` resources; it fans tasks out over the
  workers for rollouts and evaluations.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import ray

from agentrl.api import EXPLORER
from agentrl.config import Config
from agentrl.config.schema import explorer_group_size


def init_ray(cfg: Config) -> bool:
    """Connect to (or start) Ray; True when this call started/connected it and should shut it down."""
    if ray.is_initialized():
        return False
    if cfg.runtime.ray_address:
        ray.init(address=cfg.runtime.ray_address, log_to_driver=True)
    elif os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=True)  # under `ray job submit`, or a user-started cluster
    else:
        tmp = os.environ.get("RAY_TMPDIR", "/tmp/agentrl-ray")
        ray.init(num_cpus=embedded_cpus(cfg), include_dashboard=True, _temp_dir=tmp, log_to_driver=True)
    return True


def embedded_cpus(cfg: Config) -> int:
    """Logical CPUs for an embedded cluster: at least what the actors ask for.

    Ray CPUs are scheduling tokens, not cores. On a 2-core machine one rollout worker (1 CPU),
    the learner (1 CPU) and the tool-pool actors (0.1 each) ask for 2.1, and Ray would leave an actor
    pending forever; the engines share the cores anyway.
    """
    rt = cfg.runtime
    workers = cfg.rollout.num_workers + (cfg.rspo.explorer_workers if cfg.rspo.enabled else 0)
    need = rt.rollout_worker_cpus * workers + rt.learner_cpus + rt.tool_actor_cpus * cfg.tools.num_actors
    if cfg.tools.sgls is not None:
        need += cfg.tools.sgls.num_cpus
    if cfg.rods.enabled:
        need += cfg.rods.num_cpus
    return rt.num_cpus or max(os.cpu_count() or 1, math.ceil(need))


def resolve_model_path(cfg: Config) -> str:
    """``model.path`` resolved; exits with a hint when no model is there (the CLI exits 2)."""
    path = Path(cfg.model.path)
    if not (path / "config.json").exists():
        where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
        hint = ""
        if path.parts[-3:] == ("agentrl", "assets", "tiny-agent"):  # the quickstart's: relative to the repo root
            hint = " Run from the repository root, where the shipped model is."
        elif "tiny-agent" in str(path):
            hint = " Build it with `agentrl make-model`."
        raise SystemExit(f"error: model.path: no model at {path}{where}.{hint}")
    return str(path.resolve())


def shard(items: list, n: int) -> list[list]:
    """``items`` dealt round-robin into ``n`` lists (some empty when there are fewer than ``n``)."""
    return [items[i::n] for i in range(n)]


class RolloutSide:
    """The tool pool and ``rollout.num_workers`` rollout workers (one vLLM engine each), plus,
    with RSPO, ``rspo.explorer_workers`` workers that serve the explorer.

    ``sgls`` is the run's SGLS server actor (None unless ``tools.sgls`` is set); every
    tool-pool actor reaches it. Each worker gets the ``ToolPool`` (``tools.placement`` decides
    whether executable backends run in the worker or on the pool actors). Workers get
    ``runtime.rollout_worker_cpus`` / ``_gpus``.
    ``explorer_episodes``: G_B, the explorer's episodes per group (0 without RSPO).
    """

    def __init__(self, sgls, pool, workers: list, engine: bool = True, explorers: list | None = None,
                 explorer_episodes: int = 0):
        self.sgls, self.pool, self.workers, self.engine = sgls, pool, workers, engine
        self.explorers = explorers or []
        self.explorer_episodes = explorer_episodes

    @classmethod
    def create(cls, cfg: Config, model_path: str, *, rollout_cfg=None, weight_sync: str = "object_store",
               engine: bool = True) -> RolloutSide:
        """Place the actors (they start in the background; ``start`` waits for the engines).

        ``rollout_cfg`` replaces ``cfg.rollout`` for the workers (the gold replay's limits);
        ``engine=False`` (the gold replay) asks for no GPUs and starts no vLLM engine."""
        from agentrl.runtime.rollout_worker import RolloutWorker
        from agentrl.runtime.tool_pool import ToolPool, start_sgls_server

        rt = cfg.runtime
        sgls = start_sgls_server(cfg, cfg.model.dtype)
        pool = ToolPool.create(cfg.tools.num_actors, rt.tool_actor_cpus, cfg.tools.max_concurrency, sgls,
                               cfg.tools.sgls, placement=cfg.tools.placement)
        rollout_cfg = cfg.rollout if rollout_cfg is None else rollout_cfg
        options = {"num_cpus": rt.rollout_worker_cpus, "num_gpus": rt.rollout_worker_gpus if engine else 0,
                   "resources": dict(rt.rollout_worker_resources)}
        workers = [
            RolloutWorker.options(**options).remote(model_path, rollout_cfg, cfg.model.dtype, pool, i,
                                                    weight_sync=weight_sync, rewards_cfg=cfg.rewards)
            for i in range(cfg.rollout.num_workers)
        ]
        if not (cfg.rspo.enabled and engine):
            return cls(sgls, pool, workers, engine)
        # RSPO: the explorer starts as the initial policy; its workers get their own engine seeds
        n = cfg.rollout.num_workers
        explorers = [
            RolloutWorker.options(**options).remote(model_path, rollout_cfg, cfg.model.dtype, pool, n + j,
                                                    weight_sync=weight_sync, rewards_cfg=cfg.rewards, role=EXPLORER)
            for j in range(cfg.rspo.explorer_workers)
        ]
        g_b = explorer_group_size(cfg.rspo.explorer_fraction, cfg.rollout.group_size)
        return cls(sgls, pool, workers, engine, explorers, g_b)

    def start(self) -> list[float]:
        """Build every worker's engine (and tokenizer); returns each worker's start seconds."""
        return ray.get([w.start.remote(engine=self.engine) for w in self.workers + self.explorers])

    def rollout(self, tasks: list, rollout_cfg, tag: int) -> list:
        """Start ``rollout_cfg.group_size`` episodes per task, tasks split over the workers; returns
        the pending calls (each resolves to (group summaries, group refs)). Worker ``i`` tags its
        groups ``tag + i`` (episode seeds). With RSPO the explorer's workers run G_B of each
        group's episodes and the policy's workers the rest; both parts carry the same mix key
        (the task's place in this step), which the learner merges them by."""
        keys = [f"{tag}/{k}" for k in range(len(tasks))]
        g_policy = rollout_cfg.group_size - self.explorer_episodes
        calls = []
        for workers, size in ((self.workers, g_policy), (self.explorers, self.explorer_episodes)):
            if not workers or size <= 0:
                continue
            parts = zip(workers, shard(tasks, len(workers)), shard(keys, len(workers)))
            calls += [w.rollout.remote(part, size, rollout_cfg.temperature, rollout_cfg.top_p, tag + i, part_keys)
                      for i, (w, part, part_keys) in enumerate(parts) if part]
        return calls

    def evaluate(self, tasks: list, gold: bool = False) -> list[dict]:
        """One greedy episode (or the gold replay) per task, over all workers; per-task results."""
        calls = [w.evaluate.remote(part, gold) for w, part in zip(self.workers, shard(tasks, len(self.workers))) if part]
        return [r for rs in ray.get(calls) for r in rs]

    def shutdown_workers(self) -> None:
        ray.get([w.shutdown.remote() for w in self.workers + self.explorers])

    def shutdown(self) -> None:
        """Stop the engines, then the SGLS server's."""
        self.shutdown_workers()
        if self.sgls is not None:
            ray.get(self.sgls.shutdown.remote())
