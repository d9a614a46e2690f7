"""ReplayBuffer: an actor holding object refs of whole groups, tagged with their policy version.

Groups are the unit (group-relative advantages need every episode of a group). The payloads stay
in the object store; this actor only keeps refs and a little metadata. ``sample`` enforces the
staleness bound: a group produced by policy version v may train learner version at most
v + max_staleness; older ones are dropped and counted, never silently used.
"""

from __future__ import annotations

from collections import deque

import ray

from agentrl.api import GroupRef
from agentrl.checkpointing.records import pack_groups, unpack_groups


@ray.remote(num_cpus=0)
class ReplayBuffer:
    def __init__(self, capacity_groups: int, max_staleness: int):
        self.capacity = capacity_groups
        self.max_staleness = max_staleness
        self.items: deque[GroupRef] = deque()
        self.dropped_stale = 0
        self.dropped_full = 0
        self.added = 0

    def add(self, entries: list[GroupRef]) -> int:
        """Append groups (oldest dropped beyond capacity); returns the buffer's size."""
        for entry in entries:
            if len(self.items) >= self.capacity:
                self.items.popleft()
                self.dropped_full += 1
            self.items.append(entry)
            self.added += 1
        return len(self.items)

    def sample(self, max_groups: int, learner_version: int) -> list[GroupRef]:
        """Oldest-first, up to ``max_groups`` fresh-enough groups; removes what it returns."""
        out = []
        while self.items and len(out) < max_groups:
            entry = self.items.popleft()
            if learner_version - entry.version > self.max_staleness:
                self.dropped_stale += 1
                continue
            out.append(entry)
        return out

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the counters and the groups still held, oldest first, with
        their payloads (fetched here: the refs die with the run)."""
        return {"counters": {"added": self.added, "dropped_stale": self.dropped_stale, "dropped_full": self.dropped_full},
                "groups": pack_groups(list(self.items))}

    def load_state_dict(self, state: dict) -> int:
        """Back to ``state_dict``'s contents (the groups put into the object store again)."""
        self.items = deque(unpack_groups(state["groups"]))
        counters = state["counters"]
        self.added, self.dropped_stale, self.dropped_full = counters["added"], counters["dropped_stale"], counters["dropped_full"]
        return len(self.items)

    def stats(self) -> dict[str, int]:
        return {"size": len(self.items), "added": self.added, "dropped_stale": self.dropped_stale,
                "dropped_full": self.dropped_full}
