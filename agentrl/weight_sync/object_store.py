"""The object-store weight sync: a safetensors blob through Ray's object store.

Learner side: ``weights_to_blob`` (called by the learner actor's ``publish_weights``). Engine
side: ``blob_to_state_dict`` (called by the vLLM worker extension). Driver side:
``ObjectStoreWeightSync.sync``.
"""

from __future__ import annotations

from torch import Tensor

from agentrl.api import EXPLORER


def weights_to_blob(state_dict: dict[str, Tensor]) -> bytes:
    """Safetensors bytes of ``state_dict``. Tensors are cloned into independent storage first, so
    shared storage (tied weights, views) cannot trip safetensors' aliasing check."""
    from safetensors.torch import save

    return save({k: v.clone() for k, v in state_dict.items()})


def blob_to_state_dict(blob: bytes) -> dict[str, Tensor]:
    """Inverse of ``weights_to_blob``."""
    from safetensors.torch import load

    return load(blob)


class ObjectStoreWeightSync:
    """``sync(version)``: the learner's weights into every policy worker and, with RSPO, the
    explorer's (when re-derived since the last sync) into every explorer worker."""

    name = "object_store"

    def __init__(self, learner, workers: list, explorers: list | None = None):
        self.learner, self.workers, self.explorers = learner, workers, explorers or []

    def sync(self, version: int) -> None:
        import ray  # here, not at import: the learner imports this module where Ray may be absent (GPU check)

        box = ray.get(self.learner.publish_weights.remote())
        # A top-level ObjectRef argument is resolved by Ray: each worker receives the bytes.
        loads = [w.load_weights.remote(box[0], version) for w in self.workers]
        if self.explorers:
            explorer_box = ray.get(self.learner.publish_explorer_weights.remote())
            if explorer_box is not None:  # the explorer derived from this version
                loads += [w.load_weights.remote(explorer_box[0], version) for w in self.explorers]
        ray.get(loads)

    def load_into(self, worker, role: str, version: int) -> None:
        """The weights a restarted worker's role should hold at ``version`` into that worker: the
        learner's current weights, or for an RSPO explorer worker the explorer's latest derivation
        (none yet: the explorer is the initial policy, which the restarted engine loaded at start)."""
        import ray

        if role == EXPLORER:
            box = ray.get(self.learner.publish_explorer_weights.remote(again=True))
            if box is not None:
                ray.get(worker.load_weights.remote(box[0], version))
            return
        box = ray.get(self.learner.publish_weights.remote())
        ray.get(worker.load_weights.remote(box[0], version))
