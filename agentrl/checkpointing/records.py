"""How a run's parts put their state into a checkpoint: the ``Stateful`` protocol every saved
component follows, and the compact records of episode groups (msgpack).

Groups live in Ray's object store; their refs die with the run, so a part that holds groups (the
replay buffer, the scheduler's rollouts launched ahead) saves their payloads. msgpack stores the
episodes' long lists of token ids and log-probs as packed ints and float64 (exact) at a fraction
of JSON's size and parse time.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgpack
import ray

from agentrl.api import EpisodeGroup, GroupRef


class Stateful(Protocol):
    """A component a checkpoint saves and a resumed run restores: its state as plain data (JSON
    for a ``.json`` part, msgpack for a ``.msgpack`` one), and back."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


class RemotePart:
    """An actor's ``state_dict`` / ``load_state_dict`` called from the driver (the replay buffer)."""

    def __init__(self, actor):
        self.actor = actor

    def state_dict(self) -> Any:
        return ray.get(self.actor.state_dict.remote())

    def load_state_dict(self, state: Any) -> None:
        ray.get(self.actor.load_state_dict.remote(state))


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, default=str)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def pack_groups(refs: list[GroupRef]) -> list[dict]:
    """The groups behind ``refs`` with their versions (payloads fetched from the object store)."""
    groups = ray.get([r.ref for r in refs]) if refs else []
    return [{"version": r.version, "task_id": r.task_id, "group": g.to_dict()} for r, g in zip(refs, groups)]


def unpack_groups(records: list[dict]) -> list[GroupRef]:
    """Put the groups back into the object store; their new refs, with the saved versions."""
    return [GroupRef(ray.put(EpisodeGroup.from_dict(r["group"])), r["version"], r["task_id"]) for r in records]
