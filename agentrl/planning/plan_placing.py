"""Where Ray puts a run's actors, simulated on a ``Cluster`` (``planning/cluster_shape.py``) for
``agentrl plan`` (``planning/plan.py``).

The roles are placed one after another in the order the driver creates them (``plan_roles``), each
by the rule Ray itself applies to it (Ray 2.60's schedulers, ``src/ray/raylet/scheduling/policy``):

* a placement group (``Role.group``) is placed by the GCS's bundle policies, which score each node
  that can hold a bundle by the share of each requested resource it would still have free,
  ``sum((available - requested) / available)``, and take the highest score: a new group goes to the
  emptiest node, so independent groups (one per rollout engine) spread over the nodes. STRICT_PACK:
  all bundles together on the best node; PACK: the bundles (the most GPUs first) on the best node
  for the first one, as many as fit there, then on the next best node for the rest. A group is
  placed whole or not at all.
* a plain actor is placed by the raylet's hybrid policy from the driver's node (node 0 here: the
  head a job's driver runs on, or this machine): an actor asking for no GPU goes to a node without
  GPUs when one has room; the driver's node while its busiest resource stays under half used; else
  the node least used.

Ties go to the lower node index (Ray breaks them by node id or hash order, which a declared shape
does not have): a plan's node names may be a permutation of Ray's, its layout is the same.
"""

from __future__ import annotations

from agentrl.planning.cluster_shape import EPS, Cluster, Node, fmt_num
from agentrl.planning.placement import Role

SPREAD_THRESHOLD = 0.5  # Ray's scheduler_spread_threshold: a node under this utilization counts as empty


class NodeState:
    """Free resources of one node during the simulated placement: CPUs, custom resources and each
    GPU's free fraction (a whole-GPU request takes free GPUs, a fractional one shares a GPU)."""

    def __init__(self, node: Node):
        self.node = node
        self.cpus = node.cpus
        self.custom = dict(node.resources)
        self.gpus = [1.0] * int(node.gpus)
        self.users: list[list[str]] = [[] for _ in self.gpus]

    def copy(self) -> NodeState:
        new = NodeState.__new__(NodeState)
        new.node, new.cpus, new.custom = self.node, self.cpus, dict(self.custom)
        new.gpus, new.users = list(self.gpus), [list(u) for u in self.users]
        return new

    @property
    def used(self) -> bool:
        """Whether any bundle of the run took resources here."""
        return (self.cpus < self.node.cpus - EPS or any(u for u in self.users)
                or any(v < self.node.resources.get(k, 0.0) - EPS for k, v in self.custom.items()))

    def _gpu_slots(self, want: float) -> list[int] | None:
        if want <= EPS:
            return []
        if want >= 1 - EPS:
            whole = [i for i, f in enumerate(self.gpus) if f >= 1 - EPS]
            return whole[: round(want)] if len(whole) >= round(want) else None
        part = [i for i, f in enumerate(self.gpus) if f >= want - EPS]
        return part[:1] or None

    def fits(self, bundle: dict[str, float]) -> bool:
        if bundle.get("CPU", 0.0) > self.cpus + EPS:
            return False
        if any(v > self.custom.get(k, 0.0) + EPS for k, v in bundle.items() if k not in ("CPU", "GPU")):
            return False
        return self._gpu_slots(bundle.get("GPU", 0.0)) is not None

    def take(self, bundle: dict[str, float], who: str) -> None:
        self.cpus -= bundle.get("CPU", 0.0)
        for k, v in bundle.items():
            if k not in ("CPU", "GPU"):
                self.custom[k] = self.custom.get(k, 0.0) - v
        want = bundle.get("GPU", 0.0)
        for i in self._gpu_slots(want) or []:
            self.gpus[i] -= min(1.0, want)
            self.users[i].append(who)

    def available(self, resource: str) -> float:
        if resource == "CPU":
            return self.cpus
        if resource == "GPU":
            return sum(self.gpus)
        return self.custom.get(resource, 0.0)

    def bundle_score(self, bundle: dict[str, float]) -> float:
        """Ray's LeastResourceScorer: per requested resource, the share of what is free now that
        stays free; -1 where the bundle does not fit. Higher is better (emptier)."""
        if not self.fits(bundle):
            return -1.0
        score = 0.0
        for k, want in bundle.items():
            have = self.available(k)
            score += (have - want) / have if have > EPS else 0.0
        return score

    def utilization(self) -> float:
        """Ray's critical resource utilization (its busiest resource), 0 below the spread threshold."""
        shares = [1 - self.cpus / self.node.cpus if self.node.cpus > EPS else 0.0]
        if self.gpus:
            shares.append(1 - sum(self.gpus) / len(self.gpus))
        worst = max(shares)
        return 0.0 if worst < SPREAD_THRESHOLD else worst

    def free_text(self) -> str:
        text = f"{self.node.name}: {fmt_num(max(self.cpus, 0))}/{fmt_num(self.node.cpus)} CPU"
        if self.gpus:
            text += f", {fmt_num(sum(1 for f in self.gpus if f >= 1 - EPS))}/{len(self.gpus)} GPU"
        text += "".join(f", {k} {fmt_num(v)}/{fmt_num(self.node.resources[k])}" for k, v in self.custom.items())
        return text + " free"


def _best_for_bundle(bundle: dict[str, float], states: list[NodeState], candidates: list[int]) -> int | None:
    best, best_score = None, -1.0
    for i in candidates:
        score = states[i].bundle_score(bundle)
        if score >= 0 and (best is None or score > best_score + EPS):
            best, best_score = i, score
    return best


def _sum_bundles(bundles: tuple[dict[str, float], ...]) -> dict[str, float]:
    total: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            total[k] = total.get(k, 0.0) + v
    return total


def _holds(state: NodeState, role: Role) -> bool:
    """Whether ``state`` takes every bundle of ``role`` (it is changed: pass a copy)."""
    for b in role.bundles:
        if not state.fits(b):
            return False
        state.take(b, role.name)
    return True


def _place_group(role: Role, states: list[NodeState]) -> list[int | None]:
    """A placement group, whole or not at all (see the module docstring)."""
    trial = [s.copy() for s in states]
    where: list[int | None] = [None] * len(role.bundles)
    if role.strategy == "STRICT_PACK":
        together = _sum_bundles(role.bundles)
        # the aggregate's score picks the node; taking the bundles one by one checks each GPU's share
        for i in sorted(range(len(states)), key=lambda i: (-trial[i].bundle_score(together), i)):
            if trial[i].bundle_score(together) >= 0 and _holds(trial[i].copy(), role):
                for b in role.bundles:
                    states[i].take(b, role.name)
                return [i] * len(role.bundles)
        return where
    # PACK: the most GPUs (then CPUs) first, on the best node for it, then every other bundle that fits there
    pending = sorted(range(len(role.bundles)), key=lambda k: (-role.bundles[k].get("GPU", 0.0),
                                                             -role.bundles[k].get("CPU", 0.0), k))
    candidates = list(range(len(states)))
    while pending:
        node = _best_for_bundle(role.bundles[pending[0]], trial, candidates)
        if node is None:
            return [None] * len(role.bundles)
        for k in list(pending):
            if trial[node].fits(role.bundles[k]):
                trial[node].take(role.bundles[k], role.name)
                where[k] = node
                pending.remove(k)
        candidates.remove(node)
    for k, node in enumerate(where):
        states[node].take(role.bundles[k], role.name)
    return where


def _place_actor(role: Role, states: list[NodeState]) -> list[int | None]:
    """A plain actor by Ray's hybrid policy, from the driver's node (index 0)."""
    (bundle,) = role.bundles

    def pick(nodes: list[int]) -> int | None:
        fit = [i for i in nodes if states[i].fits(bundle)]
        if not fit:
            return None
        lowest = min(states[i].utilization() for i in fit)
        if 0 in fit and states[0].utilization() <= lowest + EPS:
            return 0
        return min(fit, key=lambda i: (states[i].utilization(), i))

    spot = None
    if bundle.get("GPU", 0.0) <= EPS:  # Ray's scheduler_avoid_gpu_nodes: GPU nodes only when nothing else has room
        spot = pick([i for i, s in enumerate(states) if not s.gpus])
    if spot is None:
        spot = pick(list(range(len(states))))
    if spot is not None:
        states[spot].take(bundle, role.name)
    return [spot]


def place_role(role: Role, states: list[NodeState]) -> list[int | None]:
    """Node index per bundle of ``role`` (None: no node has room), taking the resources it uses."""
    if role.group or len(role.bundles) > 1:
        return _place_group(role, states)
    return _place_actor(role, states)


def why_not(role: Role, bundle: dict[str, float], cluster: Cluster, states: list[NodeState]) -> str:
    """Why ``bundle`` of ``role`` has no node: too big for any node, a resource no node has, or
    taken by the roles placed before it."""
    what = f"{role.name}: bundle {fmt_bundle(bundle)}"
    keys = f" (set by {', '.join(role.keys)})" if role.keys else ""
    for k, v in bundle.items():
        if k not in ("CPU", "GPU") and not any(n.resources.get(k, 0.0) >= v - EPS for n in cluster.nodes):
            have = "no node has it" if not any(k in n.resources for n in cluster.nodes) else "no node has that much"
            return f"{what} needs the custom resource {k}: {fmt_num(v)}; {have}{keys}"
    empty = [NodeState(n) for n in cluster.nodes]
    if not any(s.fits(bundle) for s in empty):
        biggest = max(cluster.nodes, key=lambda n: (n.gpus, n.cpus))
        return (f"{what} fits on no node of this cluster, even an empty one (largest: {fmt_num(biggest.cpus)} CPU, "
                f"{fmt_num(biggest.gpus)} GPU){keys}")
    free = [s.free_text() for s in states]
    free = free if len(free) <= 6 else [*free[:6], f"... {len(free) - 6} more nodes"]
    return f"{what} does not fit next to the roles placed before it ({'; '.join(free)}){keys}"


def idle_nodes(states: list[NodeState]) -> list[NodeState]:
    """Nodes the run leaves without any of its actors: a GPU node, or any node but the driver's
    (node 0, where the driver and Ray's head processes run)."""
    return [s for i, s in enumerate(states) if not s.used and (s.gpus or i > 0)]


def fmt_bundle(b: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {fmt_num(v)}" for k, v in b.items()) + "}" if b else "{} (0 CPU)"


__all__ = ["NodeState", "fmt_bundle", "idle_nodes", "place_role", "why_not"]
