"""Weight sync, learner -> rollout engines, after every update: both sides of each transport.

``object_store`` (default; CPU and any cluster, ``object_store.py``): the learner serializes its
weights once (``weights_to_blob``, safetensors bytes) into Ray's object store; each rollout
worker fetches the blob (zero-copy on the learner's node, one transfer per remote node) and its
vLLM worker extension loads it (``blob_to_state_dict``). ``nccl`` (GPU clusters, ``nccl.py``):
the learner broadcasts packed tensors to every engine over an NCCL group, through vLLM's
weight-transfer engine.

This package sits below ``engines`` (the learner and the vLLM engine use its serialization and
NCCL helpers) and above nothing of ours: the sync objects take Ray actor handles as arguments.
"""

from __future__ import annotations


def make_weight_sync(kind: str, learner, workers: list, roles: dict[str, list] | None = None):
    """The sync object for ``runtime.weight_sync``: ``sync(version)`` loads the learner's current
    weights into every rollout worker, and into the workers of each of the methods' rollout roles
    (``roles``: role name -> its workers) the weights of the learner part that serves it."""
    if kind == "object_store":
        from agentrl.weight_sync.object_store import ObjectStoreWeightSync

        return ObjectStoreWeightSync(learner, workers, roles)
    for role, role_workers in (roles or {}).items():
        if role_workers:
            raise ValueError(f"runtime.weight_sync={kind} cannot serve the {role} engines' own weights; use object_store")
    if kind == "nccl":
        from agentrl.weight_sync.nccl import NcclWeightSync

        return NcclWeightSync(learner, workers)
    raise ValueError(f"runtime.weight_sync: unknown kind {kind!r} (known: object_store, nccl)")
