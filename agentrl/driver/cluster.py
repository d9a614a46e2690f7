"""Ray and the rollout side of a run, shared by ``agentrl train`` (driver.py) and ``agentrl eval`` (evaluate.py).

* ``init_ray``: join the configured cluster (``runtime.ray_address``, ``RAY_ADDRESS``) or start an
  embedded one with ``embedded_cpus`` logical CPUs;
* ``resolve_model_path``: ``model.path`` as an absolute path, or a readable error;
* ``RolloutSide``: the tool pool (plus the SGLS server when ``tools.sgls`` is set) and
  the rollout workers, placed with their ``runtime.*`` resources (an engine with GPUs in a placement
  group of its own: ``planning/placement.py``); it fans tasks out over the workers for rollouts and
  evaluations.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from agentrl.agent.chat import with_template_text
from agentrl.api import POLICY, GroupRef, GroupSummary
from agentrl.checkpointing.preemption import NOTICE_HOOK
from agentrl.common.log import get_logger
from agentrl.config import Config, InputError
from agentrl.methods.base import RolloutRole
from agentrl.methods.registry import extra_roles
from agentrl.models.hub import HubModelError, parse_hub_id, resolve_hub_model
from agentrl.planning.cluster_shape import embedded_cpus
from agentrl.planning.placement import rollout_bundle, rollout_uses_groups

log = get_logger(__name__)


def init_ray(cfg: Config) -> bool:
    """Connect to (or start) Ray; True when this call started/connected it and should shut it down.
    Every worker process of the run gets the preemption notice handler (checkpointing/preemption.py): a
    SIGTERM to an actor makes the driver checkpoint and stop, as one to the driver does. Under `ray
    job submit` Ray merges this with the job's runtime_env."""
    if ray.is_initialized():
        return False
    hook = {"worker_process_setup_hook": NOTICE_HOOK}
    if cfg.runtime.ray_address:
        ray.init(address=cfg.runtime.ray_address, log_to_driver=True, runtime_env=hook)
    elif os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=True, runtime_env=hook)  # under `ray job submit`, or a user-started cluster
    else:
        tmp = os.environ.get("RAY_TMPDIR", "/tmp/agentrl-ray")
        ray.init(num_cpus=embedded_cpus(cfg), include_dashboard=True, _temp_dir=tmp, log_to_driver=True, runtime_env=hook)
    return True


def resolve_model_path(cfg: Config) -> str:
    """``model.path`` as the absolute model folder every actor loads (on any node): a local folder,
    else a hub id (``org/name[@revision]``) found in the Hugging Face cache (``models/hub.py``).
    Exits with a hint when neither is there (the CLI exits 2)."""
    path = Path(cfg.model.path)
    if (path / "config.json").exists():  # a folder wins over a hub id of the same spelling
        return str(path.resolve())
    where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
    if parse_hub_id(cfg.model.path) is not None:
        try:
            return str(resolve_hub_model(cfg.model.path))
        except HubModelError as err:
            raise InputError(f"model.path: no model folder at {path}{where}, and {err}") from None
    hint = ""
    if path.parts[-3:] == ("agentrl", "assets", "tiny-agent"):  # the quickstart's: relative to the repo root
        hint = " Run from the repository root, where the shipped model is."
    elif "tiny-agent" in str(path):
        hint = " Build it with `agentrl make-model`."
    raise InputError(f"model.path: no model at {path}{where}.{hint}")


@dataclass
class RolloutCall:
    """One pending ``RolloutWorker.rollout`` call and what it was given, so that the tasks of a
    worker that died can be re-issued exactly (``RolloutScheduler``). ``result``: the fetched
    (summaries, group refs), once fetched."""

    worker: Any  # the actor handle (still valid after Ray restarts the actor)
    worker_index: int
    role: str
    tasks: list
    keys: list[str]
    group_size: int
    temperature: float
    top_p: float
    tag: int
    env_retries: int = 0
    ref: Any = None  # the summaries
    group_refs: list = field(default_factory=list, repr=False)  # one per task, owned by this (the calling) process
    result: Any = field(default=None, repr=False)

    def launch(self) -> "RolloutCall":
        """Start the call (again, after a restart) on its worker; returns self. One return object
        per group (``RolloutWorker.rollout``): owned here, so they outlive the worker."""
        self.result = None
        refs = self.worker.rollout.options(num_returns=len(self.tasks) + 1).remote(
            self.tasks, self.group_size, self.temperature, self.top_p, self.tag, self.keys, self.env_retries)
        self.ref, self.group_refs = refs[0], list(refs[1:])
        return self

    def part(self, i: int) -> RolloutCall:
        """Task ``i`` alone, as a call of its own (not launched): how the scheduler re-issues a dead call."""
        return replace(self, tasks=self.tasks[i:i + 1], keys=self.keys[i:i + 1], ref=None, group_refs=[], result=None)

    @staticmethod
    def merge(results: list[tuple[list, list]]) -> tuple[list[GroupSummary], list[GroupRef]]:
        """Several calls' results as one."""
        return [s for r in results for s in r[0]], [g for r in results for g in r[1]]

    def fetch(self, timeout: float | None = None) -> tuple[list[GroupSummary], list[GroupRef]]:
        """(summaries, refs of the stored groups): only the summaries travel here."""
        summaries = ray.get(self.ref, timeout=timeout)
        return summaries, [GroupRef(ref, s.version, s.task_id) for s, ref in zip(summaries, self.group_refs, strict=True)
                           if s.outcome]  # a group every episode of which was dropped is None


# how often a long evaluation reports how far it is (a person watching a run otherwise sees
# nothing for the minutes a 200-task evaluation of a pretrained model takes on CPU)
EVAL_PROGRESS_EVERY_S = 60.0


def shard(items: list, n: int) -> list[list]:
    """``items`` dealt round-robin into ``n`` lists (some empty when there are fewer than ``n``)."""
    return [items[i::n] for i in range(n)]


class RolloutSide:
    """The tool pool and ``rollout.num_workers`` rollout workers (one vLLM engine each), plus the
    workers of the methods' rollout roles (``roles``: each ``RolloutRole`` with its workers, e.g.
    an exploration policy's engines; ``agentrl.methods``).

    ``sgls`` is the run's SGLS server actor (None unless ``tools.sgls`` is set); every
    tool-pool actor reaches it. Each worker gets the ``ToolPool`` (``tools.placement`` decides
    whether executable backends run in the worker or on the pool actors). Workers get
    ``runtime.rollout_worker_cpus`` / ``_gpus``.
    """

    def __init__(self, sgls, pool, workers: list, engine: bool = True,
                 roles: list[tuple[RolloutRole, list]] | None = None, env_retries: int = 0):
        self.sgls, self.pool, self.workers, self.engine = sgls, pool, workers, engine
        self.roles = roles or []
        self.env_retries = env_retries  # times a group whose environment failed is rolled out again
        self.killed = False  # kill() was called: nothing left to shut down

    @classmethod
    def create(cls, cfg: Config, model_path: str, *, rollout_cfg=None, weight_sync: str = "object_store",
               engine: bool = True) -> RolloutSide:
        """Place the actors (they start in the background; ``start`` waits for the engines).

        ``rollout_cfg`` replaces ``cfg.rollout`` for the workers (the gold replay's limits);
        ``engine=False`` (the gold replay) asks for no GPUs and starts no vLLM engine."""
        from agentrl.rollout.tool_pool import ToolPool, start_sgls_server
        from agentrl.rollout.worker import RolloutWorker

        rt = cfg.runtime
        sgls = start_sgls_server(cfg, cfg.model.dtype, max_restarts=rt.max_actor_restarts)
        pool = ToolPool.create(cfg.tools.num_actors, rt.tool_actor_cpus, cfg.tools.max_concurrency, sgls,
                               cfg.tools.sgls, placement=cfg.tools.placement, max_restarts=rt.max_actor_restarts,
                               call_timeout_s=rt.tool_call_timeout_s, plugins=cfg.plugins)
        rollout_cfg = cfg.rollout if rollout_cfg is None else rollout_cfg
        # max_restarts: Ray restarts a dead worker; the driver rebuilds its engine (revive) and
        # re-issues its undelivered groups. No task retries: a re-run needs the engine first.
        base = {"num_cpus": rt.rollout_worker_cpus, "num_gpus": rt.rollout_worker_gpus if engine else 0,
                "resources": dict(rt.rollout_worker_resources), "max_restarts": rt.max_actor_restarts}
        # with GPUs (or tensor parallelism) each engine gets a placement group of its own: one
        # STRICT_PACK bundle holding all of its GPUs (planning/placement.py, what `agentrl plan` checks)
        grouped = engine and rollout_uses_groups(cfg)

        def options() -> dict:
            return _engine_group_options(cfg, base) if grouped else base
        # agent.chat_template read here: a relative path means the driver's working directory
        agent = with_template_text(cfg.agent)
        workers = [
            RolloutWorker.options(**options()).remote(model_path, rollout_cfg, cfg.model.dtype, pool, i,
                                                      weight_sync=weight_sync, rewards_cfg=cfg.rewards, agent_cfg=agent,
                                                      plugins=cfg.plugins)
            for i in range(cfg.rollout.num_workers)
        ]
        roles = []
        n = cfg.rollout.num_workers  # worker indices go on past the policy's: engine seeds of their own
        for role in extra_roles(cfg) if engine else []:  # the gold replay samples under no policy
            # a role's engines start as the initial policy; e.g. cores of their own on a CPU node
            role_cfg = rollout_cfg
            if role.engine_update:
                role_cfg = rollout_cfg.model_copy(update={"engine": rollout_cfg.engine.model_copy(update=role.engine_update)})
            roles.append((role, [
                RolloutWorker.options(**options()).remote(model_path, role_cfg, cfg.model.dtype, pool, n + j,
                                                          weight_sync=weight_sync, rewards_cfg=cfg.rewards, role=role.name,
                                                          agent_cfg=agent, plugins=cfg.plugins)
                for j in range(role.workers)]))
            n += role.workers
        return cls(sgls, pool, workers, engine, roles, env_retries=rt.max_actor_restarts)

    @property
    def role_workers(self) -> dict[str, list]:
        """The workers of each of the methods' rollout roles, by role name (the weight sync feeds them)."""
        return {role.name: ws for role, ws in self.roles}

    def all_workers(self) -> list:
        """The policy's rollout workers, then every role's."""
        return self.workers + [w for _, ws in self.roles for w in ws]

    def start(self) -> list[float]:
        """Build every worker's engine (and tokenizer); returns each worker's start seconds. A
        worker that dies meanwhile (restarted by Ray, ``runtime.max_actor_restarts``) is revived."""
        workers = self.all_workers()
        out = []
        for w, ref in zip(workers, [w.start.remote(engine=self.engine) for w in workers]):
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayActorError as err:
                log.warning(f"recovery: a rollout worker died while starting ({type(err).__name__}); waiting for its restart")
                out.append(self.revive(w))
        return out

    def rollout(self, tasks: list, rollout_cfg, tag: int) -> list[RolloutCall]:
        """Start ``rollout_cfg.group_size`` episodes per task, tasks split over the workers; returns
        the pending calls (each ``ref`` resolves to (group summaries, group refs)). Worker ``i`` tags its
        groups ``tag + i`` (episode seeds). Each of the methods' rollout roles runs its
        ``episodes_per_group`` of each group's episodes on its workers and the policy's workers the
        rest; every part carries the same mix key (the task's place in this step), by which a
        method's ``regroup`` can merge them."""
        keys = [f"{tag}/{k}" for k in range(len(tasks))]
        parts = [(self.workers, rollout_cfg.group_size - sum(r.episodes_per_group for r, _ in self.roles), POLICY, 0)]
        first = len(self.workers)
        for role, ws in self.roles:  # worker indices (and episode seeds) go on past the policy's
            parts.append((ws, role.episodes_per_group, role.name, first))
            first += len(ws)
        calls = []
        for workers, size, role, first in parts:
            if not workers or size <= 0:
                continue
            parts = zip(workers, shard(tasks, len(workers)), shard(keys, len(workers)))
            calls += [RolloutCall(w, first + i, role, part, part_keys, size, rollout_cfg.temperature, rollout_cfg.top_p,
                                  tag + i, self.env_retries).launch()
                      for i, (w, part, part_keys) in enumerate(parts) if part]
        return calls

    def revive(self, worker, attempts: int = 30) -> float:
        """Wait until Ray has restarted ``worker`` (a call to a restarting actor waits for it) and
        rebuild its engine; returns the seconds that took. Raises the actor's error when it stays
        dead (out of ``runtime.max_actor_restarts``)."""
        t0 = time.perf_counter()
        for attempt in range(attempts):
            try:
                ray.get(worker.start.remote(engine=self.engine))
                return time.perf_counter() - t0
            except ray.exceptions.ActorUnavailableError:
                time.sleep(min(2.0, 0.2 * (attempt + 1)))  # restarting: not reachable yet
            except ray.exceptions.RayActorError:
                if attempt == attempts - 1:
                    raise
                time.sleep(min(2.0, 0.2 * (attempt + 1)))  # the handle may not know of the restart yet
        raise RuntimeError("rollout worker did not come back")

    def revive_restarted(self) -> list[tuple[Any, str]]:
        """Revive every worker Ray restarted between calls (it died while idle, e.g. after
        returning its groups): it has no engine until ``start``. Returns the revived (worker, role)s."""
        revived = []
        roles = [(w, POLICY) for w in self.workers] + [(w, role.name) for role, ws in self.roles for w in ws]
        for w, role in roles:
            try:
                ready = ray.get(w.ready.remote())
            except ray.exceptions.RayActorError:
                ready = False
            if not ready:
                log.warning("recovery: a rollout worker was restarted while idle; rebuilding its engine")
                self.revive(w)
                revived.append((w, role))
        return revived

    def kill(self) -> None:
        """Stop every rollout-side actor at once, without asking it: a hung worker would never
        answer a shutdown call (the run is stopping on a ``ResumableFailure``)."""
        for actor in [*self.all_workers(), *self.pool.actors, *([self.sgls] if self.sgls else [])]:
            ray.kill(actor, no_restart=True)
        self.killed = True

    @staticmethod
    def reissue(call: RolloutCall) -> RolloutCall:
        """The call's tasks again, on its (restarted) worker."""
        return call.launch()

    def evaluate(self, tasks: list, gold: bool = False, samples: int = 1, temperature: float = 0.0,
                 progress: Callable[[int, int, float], None] | None = None,
                 progress_every_s: float = EVAL_PROGRESS_EVERY_S) -> list[dict]:
        """Per-episode results over all workers. By default one greedy episode (or the gold replay)
        per task (training's held-out evaluation); ``samples`` > 1: that many episodes per task at
        ``temperature``, each (task, sample) its own entry to deal to the workers (rows carry
        ``sample``; at 1 the worker tags episodes as training's evaluation always has).

        ``progress(finished, total, mean outcome so far)`` is called every ``progress_every_s``
        while episodes are still running (a 200-task evaluation of a 135M model takes minutes)."""
        entries = shard([(t, k) for t in tasks for k in range(samples)], len(self.workers))
        used = [(w, part) for w, part in zip(self.workers, entries) if part]
        calls = [w.evaluate.remote([t for t, _ in part], gold, temperature, [k for _, k in part] if samples > 1 else None)
                 for w, part in used]
        total = sum(len(part) for _, part in used)
        while progress is not None:
            finished, _ = ray.wait(calls, num_returns=len(calls), timeout=progress_every_s)
            if len(finished) == len(calls):
                break
            try:
                tallies = ray.get([w.eval_progress.remote() for w, _ in used])
            except ray.exceptions.RayError:
                break  # a worker died: the ray.get below raises its evaluate call's error
            done, outcome = sum(n for n, _ in tallies), sum(s for _, s in tallies)
            progress(done, total, outcome / done if done else 0.0)
        return [r for rs in ray.get(calls) for r in rs]

    def shutdown_workers(self) -> None:
        _raise_first(_get_each([w.shutdown.remote() for w in self.all_workers()]))

    def shutdown(self) -> None:
        """Stop the engines, then the SGLS server's; an actor that fails to stop (e.g. dead for
        good) does not keep the others running: the first error is raised after all were asked."""
        if self.killed:
            return
        errors = _get_each([w.shutdown.remote() for w in self.all_workers()])
        if self.sgls is not None:
            errors += _get_each([self.sgls.shutdown.remote()])
        _raise_first(errors)


def _engine_group_options(cfg: Config, options: dict) -> dict:
    """``options`` plus a new placement group of one STRICT_PACK bundle (``rollout_bundle``): the
    actor's CPUs, GPUs and custom resources, reserved together on one node."""
    group = placement_group([rollout_bundle(cfg)], strategy="STRICT_PACK")
    return {**options, "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)}


def _get_each(refs: list) -> list[Exception]:
    """``ray.get`` of every ref; returns the errors."""
    errors = []
    for ref in refs:
        try:
            ray.get(ref)
        except Exception as err:  # noqa: BLE001 - returned
            errors.append(err)
    return errors


def _raise_first(errors: list[Exception]) -> None:
    if errors:
        raise errors[0]
