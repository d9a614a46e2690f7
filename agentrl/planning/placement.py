"""Placement is data: the run's resource plan, from its config.

``plan_roles(cfg)`` turns a ``Config`` into one ``Role`` per actor of the run (docs/design.md §9):
its bundles (the resources Ray reserves), the placement strategy, and whether the runtime puts it
in a placement group. The runtime places from the same functions (``learner_bundles`` in
``LearnerGroup.create``, ``rollout_bundle`` / ``rollout_uses_groups`` in ``RolloutSide.create``),
so ``agentrl plan`` prints and checks (``planning/plan.py``) exactly what a run asks Ray for:

* the learner: ``learner.num_ranks`` bundles of {CPU: runtime.learner_cpus, GPU:
  runtime.learner_gpus}, PACK (as few nodes as fit); one rank is a plain actor with that request;
* each rollout engine (``rollout.num_workers``, plus the methods' rollout roles' workers): one bundle
  of {CPU: runtime.rollout_worker_cpus, GPU: runtime.rollout_worker_gpus} plus
  ``runtime.rollout_worker_resources``, in a placement group of its own (STRICT_PACK: an engine's
  tensor-parallel GPUs on one node) when it asks for GPUs or ``rollout.engine.tensor_parallel_size``
  > 1; without GPUs a plain actor. Engines are independent groups: Ray places each
  on the node with the most of its resources free, so they spread (``planning/plan_placing.py``);
* tool-pool actors, the SGLS server, the RODS synthesis actor: plain actors with their ``*_cpus`` /
  ``num_gpus``; the replay buffer asks for nothing (0 CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.config import Config
from agentrl.methods.registry import extra_roles


@dataclass(frozen=True)
class Role:
    """One actor (or the learner's ranks) of the run and what it asks Ray for.

    ``strategy``: PACK / STRICT_PACK for a placement group (``group``), or "actor" for an actor
    placed by its own request. ``kind``: "learner" or "engine" (whose memory is checked), else "".
    ``keys``: the config keys that size it, for messages."""

    name: str
    bundles: tuple[dict[str, float], ...]
    strategy: str
    group: bool
    keys: tuple[str, ...]
    kind: str = ""

    @property
    def gpus(self) -> float:
        return sum(b.get("GPU", 0.0) for b in self.bundles)

    @property
    def cpus(self) -> float:
        return sum(b.get("CPU", 0.0) for b in self.bundles)


def _bundle(**resources: float) -> dict[str, float]:
    """A bundle without its zero entries (Ray refuses 0-valued bundle resources)."""
    return {k: float(v) for k, v in resources.items() if v > 0}


def learner_bundles(num_ranks: int, cpus: float, gpus: float) -> tuple[list[dict[str, float]], bool]:
    """The learner ranks' bundles, one per rank, and whether they go in a (PACK) placement group:
    when there is more than one rank and a rank asks for anything."""
    bundle = _bundle(CPU=cpus, GPU=gpus)
    return [dict(bundle) for _ in range(num_ranks)], bool(bundle) and num_ranks > 1


def rollout_bundle(cfg: Config) -> dict[str, float]:
    """One rollout engine's bundle: its CPUs, its GPUs (all of its tensor-parallel GPUs, on one
    node) and ``runtime.rollout_worker_resources``."""
    rt = cfg.runtime
    return {**_bundle(CPU=rt.rollout_worker_cpus, GPU=rt.rollout_worker_gpus),
            **{k: float(v) for k, v in rt.rollout_worker_resources.items() if v > 0}}


def rollout_uses_groups(cfg: Config) -> bool:
    """Each rollout engine in its own STRICT_PACK placement group: when it asks for GPUs or is
    tensor-parallel. CPU engines stay plain actors (no group to create on the CPU path)."""
    return cfg.runtime.rollout_worker_gpus > 0 or cfg.rollout.engine.tensor_parallel_size > 1


def plan_roles(cfg: Config) -> list[Role]:
    """The run's actors and their bundles, in the order the driver starts them."""
    rt, roles = cfg.runtime, []
    if cfg.rods.enabled:
        roles.append(Role("rods", (_bundle(CPU=cfg.rods.num_cpus, GPU=cfg.rods.num_gpus),), "actor", False,
                          ("rods.num_cpus", "rods.num_gpus")))
    sgls = cfg.tools.sgls
    if sgls is not None:
        roles.append(Role("sgls", (_bundle(CPU=sgls.num_cpus, GPU=sgls.num_gpus),), "actor", False,
                          ("tools.sgls.num_cpus", "tools.sgls.num_gpus")))
    if cfg.tools.placement == "pool" or sgls is not None:
        roles += [Role(f"tool_pool[{i}]", (_bundle(CPU=rt.tool_actor_cpus),), "actor", False,
                       ("tools.num_actors", "runtime.tool_actor_cpus")) for i in range(cfg.tools.num_actors)]
    grouped = rollout_uses_groups(cfg)
    engine_keys = ("runtime.rollout_worker_cpus", "runtime.rollout_worker_gpus", "runtime.rollout_worker_resources",
                   "rollout.engine.tensor_parallel_size")
    engines = [("rollout", cfg.rollout.num_workers, "rollout.num_workers")]
    engines += [(r.name, r.workers, r.workers_key) for r in extra_roles(cfg)]  # the methods' engines
    for name, count, key in engines:
        roles += [Role(f"{name}[{i}]", (rollout_bundle(cfg),), "STRICT_PACK" if grouped else "actor", grouped,
                       (key, *engine_keys), kind="engine") for i in range(count)]
    roles.append(Role("buffer", ({},), "actor", False, ()))
    bundles, group = learner_bundles(cfg.learner.num_ranks, rt.learner_cpus, rt.learner_gpus)
    roles.append(Role("learner", tuple(bundles), "PACK" if group else "actor", group,
                      ("learner.num_ranks", "runtime.learner_cpus", "runtime.learner_gpus"), kind="learner"))
    return roles


__all__ = ["Role", "learner_bundles", "plan_roles", "rollout_bundle", "rollout_uses_groups"]
