"""The object-store weight sync: a safetensors blob through Ray's object store.

Learner side: ``weights_to_blob`` (called by the learner actor's ``publish_weights``). Engine
side: ``blob_to_state_dict`` (called by the vLLM worker extension). Driver side:
``ObjectStoreWeightSync.sync``.
"""

from __future__ import annotations

from torch import Tensor

from agentrl.api import POLICY


def weights_to_blob(state_dict: dict[str, Tensor], dtype: str | None = None) -> bytes:
    """Safetensors bytes of ``state_dict``, its floating-point tensors in ``dtype`` (the engines'
    weight dtype; None: as they are). vLLM's weight loaders copy each tensor into a parameter of
    the engine's dtype (the same round-to-nearest-even), so for the decoder models agentrl trains
    the engine ends with the same weights, and the blob, which every engine process on the way
    holds a copy of, shrinks: half the bytes for fp32 weights and bf16 engines. (A model whose
    loader keeps some parameter in fp32 or transforms it on load would get it rounded first.)
    Tensors get independent storage, so shared storage (tied weights, views) cannot trip
    safetensors' aliasing check."""
    import torch
    from safetensors.torch import save

    target = getattr(torch, dtype) if dtype else None

    def own(v: Tensor) -> Tensor:
        if target is not None and v.is_floating_point() and v.dtype != target:
            return v.to(target)  # a new tensor: its own storage
        return v.clone()

    return save({k: own(v) for k, v in state_dict.items()})


def blob_to_state_dict(blob: bytes) -> dict[str, Tensor]:
    """Inverse of ``weights_to_blob``."""
    from safetensors.torch import load

    return load(blob)


class ObjectStoreWeightSync:
    """``sync(version)``: the learner's weights into every policy worker and, for each of the
    methods' rollout roles (``roles``: role -> workers), its learner part's weights into the role's
    workers when they changed since the last sync (``LearnerActor.publish_role_weights``)."""

    name = "object_store"

    def __init__(self, learner, workers: list, roles: dict[str, list] | None = None):
        self.learner, self.workers, self.roles = learner, workers, roles or {}

    def sync(self, version: int) -> None:
        import ray  # here, not at import: the learner imports this module where Ray may be absent (GPU check)

        box = ray.get(self.learner.publish_weights.remote())
        # A top-level ObjectRef argument is resolved by Ray: each worker receives the bytes.
        loads = [w.load_weights.remote(box[0], version) for w in self.workers]
        for role, workers in self.roles.items():
            if not workers:
                continue
            role_box = ray.get(self.learner.publish_role_weights.remote(role))
            if role_box is not None:  # the part changed (e.g. re-derived from this version)
                loads += [w.load_weights.remote(role_box[0], version) for w in workers]
        ray.get(loads)

    def load_into(self, worker, role: str, version: int) -> None:
        """The weights a restarted worker's role should hold at ``version`` into that worker: the
        learner's current weights, or for a worker of a method's role its learner part's latest
        weights (none yet: the initial policy, which the restarted engine loaded at start)."""
        import ray

        if role != POLICY:
            box = ray.get(self.learner.publish_role_weights.remote(role, again=True))
            if box is not None:
                ray.get(worker.load_weights.remote(box[0], version))
            return
        box = ray.get(self.learner.publish_weights.remote())
        ray.get(worker.load_weights.remote(box[0], version))
