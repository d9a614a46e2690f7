"""LearnerGroup: ``learner.num_ranks`` LearnerActor ranks in one placement group, driven as one.

The driver, the weight sync and the checkpoint code call the group as they would call a single
``LearnerActor`` handle (``group.train.remote(refs)`` returns one ObjectRef): a call that touches
the model's state or its collectives goes to every rank, in the same order on each (Ray runs a
synchronous actor's calls in submission order, so the ranks' collectives line up), and its ref
resolves to rank 0's answer once every rank has finished, raising if any rank failed. Calls that
only read rank 0's copies (the methods' learner parts, the NCCL endpoint) go to rank 0 alone.
Each ``LearnerActor`` method says which with ``@group_call``; the group has no other calls.

Start-up (``create``): the ranks are placed in one placement group (a bundle of
``runtime.learner_cpus`` CPUs and ``runtime.learner_gpus`` GPUs each, PACK: on as few nodes as
fit); rank 0 binds the rendezvous store on a port the OS picks (``rendezvous``) and the others
connect to it (``join``), so no port is chosen before it is bound. A 1-rank group is one actor
with an in-process store, exactly the single learner of before.
"""

from __future__ import annotations

import time

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from agentrl.common.log import get_logger
from agentrl.config import Config
from agentrl.planning.placement import learner_bundles

log = get_logger(__name__)

PLACEMENT_NOTICE_S = 30.0  # how long to wait for the placement before saying what it waits for


@ray.remote(num_cpus=0)
def _rank0_answer(*answers):
    """Rank 0's answer, available once every rank's is (an error of any rank is raised)."""
    return answers[0]


def _merge_digests(digests: list[dict]) -> dict:
    """Rank 0's state digest plus every other rank's own parts (its optimizer partition and RNG),
    so equal digests mean every shard was restored."""
    merged = dict(digests[0])
    for rank, digest in enumerate(digests[1:], start=1):
        merged.update({f"{part}@rank{rank}": digest[part] for part in ("optimizer", "rng")})
    return merged


@ray.remote(num_cpus=0)
def _all_digests(*digests: dict) -> dict:
    return _merge_digests(list(digests))


@ray.remote(num_cpus=0)
def _all_parts(*saved: dict) -> dict:
    """``save_parts`` of every rank: the merged digest and every rank's parts."""
    digests = [s["digest"] for s in saved]
    return {"digest": _merge_digests(digests) if digests[0] is not None else None,
            "parts": [p for s in saved for p in s["parts"]]}


class _Call:
    """``group.<method>.remote(*args)``: one ObjectRef, as for a single actor, routed as the
    method declares (``group_call`` in learning/learner.py)."""

    def __init__(self, group: LearnerGroup, method: str, route: str, combine: str):
        self.group, self.method, self.route, self.combine = group, method, route, combine

    def remote(self, *args, **kwargs):
        from agentrl.learning.learner import RANK0, RANK0_WITH_GATHERS

        ranks = self.group.ranks
        if self.route == RANK0 or len(ranks) == 1:
            return getattr(ranks[0], self.method).remote(*args, **kwargs)
        if self.route == RANK0_WITH_GATHERS:
            head = getattr(ranks[0], self.method).remote(*args, **kwargs)
            return _rank0_answer.remote(head, *[a.gather_weights.remote() for a in ranks[1:]])
        refs = [getattr(actor, self.method).remote(*args, **kwargs) for actor in ranks]
        combine = {"rank0": _rank0_answer, "digests": _all_digests, "parts": _all_parts}[self.combine]
        return combine.remote(*refs)


class LearnerGroup:
    """The learner ranks of a run (see the module docstring). ``ranks[0]`` answers for the group."""

    def __init__(self, ranks: list, placement=None):
        self.ranks, self.placement = ranks, placement

    def __getattr__(self, method: str) -> _Call:
        from agentrl.learning.learner import GROUP_CALLS  # filled by LearnerActor's @group_call methods

        if method.startswith("__") or method not in GROUP_CALLS:
            raise AttributeError(f"LearnerGroup has no call {method!r}: the group routes the LearnerActor methods "
                                 f"declared with @group_call ({', '.join(sorted(GROUP_CALLS))})")
        return _Call(self, method, *GROUP_CALLS[method])

    @classmethod
    def create(cls, cfg: Config, model_path: str) -> LearnerGroup:
        """Place and start ``learner.num_ranks`` ranks, each with ``runtime.learner_cpus`` CPUs and
        ``runtime.learner_gpus`` GPUs, and build their learners of the model at ``model_path``."""
        from agentrl.learning.learner import LearnerActor

        n, cpus, gpus = cfg.learner.num_ranks, cfg.runtime.learner_cpus, cfg.runtime.learner_gpus
        bundles, grouped = learner_bundles(n, cpus, gpus)  # what `agentrl plan` checks (planning/placement.py)
        placement = placement_group(bundles, strategy="PACK", name="") if grouped else None
        if placement is not None:
            _wait_for_placement(placement, n, bundles[0])
        group = cls([], placement)
        try:
            for r in range(n):
                opts = {"num_cpus": cpus, "num_gpus": gpus}
                if placement is not None:
                    opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(placement, placement_group_bundle_index=r)
                actor = LearnerActor.options(**opts).remote(cfg, model_path, rank=r, world_size=n)
                group.ranks.append(actor)
            if n > 1:  # the ranks build their learners while the driver goes on (get_version waits for them)
                address = ray.get(group.ranks[0].rendezvous.remote())
                for actor in group.ranks:
                    actor.join.remote(address)
        except BaseException:
            group.kill()  # no half-started group left holding its CPUs/GPUs
            raise
        return group

    def kill(self) -> None:
        for actor in self.ranks:
            ray.kill(actor, no_restart=True)
        if self.placement is not None:
            ray.util.remove_placement_group(self.placement)


def _wait_for_placement(placement, n: int, bundle: dict) -> None:
    """Block until the placement group is placed, saying what it waits for while it waits (a
    placement the cluster cannot satisfy otherwise waits in Ray's queue without a word)."""
    t0 = time.monotonic()
    while True:
        ready, _ = ray.wait([placement.ready()], timeout=PLACEMENT_NOTICE_S)
        if ready:
            return
        log.info(f"learner group: waiting {time.monotonic() - t0:.0f}s for {n} bundles of {bundle} "
                 f"(cluster free: {ray.available_resources()})")


__all__ = ["LearnerGroup"]
