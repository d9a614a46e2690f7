"""Weight sync, learner -> rollout engines, after every update.

``object_store`` (default; CPU and any cluster): the learner serializes its weights once
(safetensors bytes) into Ray's object store; each rollout worker fetches the blob (zero-copy on
the learner's node, one transfer per remote node) and loads it into its vLLM engine through the
worker extension. ``nccl`` (GPU clusters): see ``agentrl.runtime.weight_sync_nccl``.
"""

from __future__ import annotations

import ray


class ObjectStoreWeightSync:
    name = "object_store"

    def __init__(self, learner, workers: list):
        self.learner, self.workers = learner, workers

    def sync(self, version: int) -> None:
        box = ray.get(self.learner.publish_weights.remote())
        # A top-level ObjectRef argument is resolved by Ray: each worker receives the bytes.
        ray.get([w.load_weights.remote(box[0], version) for w in self.workers])


def make_weight_sync(kind: str, learner, workers: list):
    if kind == "object_store":
        return ObjectStoreWeightSync(learner, workers)
    if kind == "nccl":
        from agentrl.runtime.weight_sync_nccl import NcclWeightSync

        return NcclWeightSync(learner, workers)
    raise ValueError(f"runtime.weight_sync: unknown kind {kind!r} (known: object_store, nccl)")
