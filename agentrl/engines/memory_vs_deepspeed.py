"""The learner memory estimate's model states against DeepSpeed's own estimators (the check that
``engines/memory_estimate.py`` counts ZeRO's partitions as DeepSpeed does; tests/test_memory_estimate.py).

Kept apart from the estimate, which the planner reads: this needs DeepSpeed (imported inside
``compare_with_deepspeed``).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.engines.memory_estimate import ModelDims, model_states

MODEL_STATE_TERMS = ("parameters", "master_fp32", "gradients", "fp32_grads", "optimizer", "zero3_gathered")


@dataclass(frozen=True)
class DeepSpeedComparison:
    """Model states of one engine: ours against DeepSpeed's ``estimate_zero{2,3}_model_states_mem_needs``.

    ``*_device``: bytes per GPU. ``*_host_node``: bytes per node (DeepSpeed's unit): ours is the
    ranks of a node x max(the fp32 model each rank loads, the offloaded states)."""

    zero_stage: int
    num_ranks: int
    ours_device: int
    ds_device: int
    ours_host_node: int
    ds_host_node: int

    @property
    def device_ratio(self) -> float:
        return self.ours_device / self.ds_device

    @property
    def host_ratio(self) -> float:
        return self.ours_host_node / self.ds_host_node if self.ds_host_node else float("nan")


def compare_with_deepspeed(dims: ModelDims, *, zero_stage: int, num_gpus_per_node: int = 1, num_nodes: int = 1,
                           offload_optimizer: bool = False, offload_params: bool = False,
                           additional_buffer_factor: float = 1.0) -> DeepSpeedComparison:
    """Our ``model_states`` (bf16, full fine-tuning, no buffers or activations) next to DeepSpeed's.

    DeepSpeed's estimators assume 16-bit mixed-precision Adam. Stage 3 (``runtime/zero/stage3.py``):
    GPU 4 x largest layer + 18 Psi / N (2 params + 4 fp32 grads + 4 fp32 params + 8 moments; 2 Psi / N
    with offload_optimizer, nothing but the gathered layer with offload_params too); CPU per node
    4 Psi per GPU to load the model (zero_init=False: this learner loads the whole model on every
    rank) or 16 (18 with offload_params) Psi / nodes when offloading, times
    ``additional_buffer_factor`` (DeepSpeed's default 1.5; 1.0 here for a like-for-like figure).
    Stage 2 (``runtime/zero/stage_1_and_2.py``): GPU 2 Psi + 18 Psi / N (2 Psi with offload);
    CPU as for stage 3, except that with offload it takes max(4 x the GPUs of *all* nodes, 16) Psi
    per node (every node's fp32 load counted on one node: our host figure is 1/nodes of it there),
    and leaves out the p-byte staging copy ours counts (host ratio 1.125 on one rank).

    Ours equals stage 2's GPU figure term for term; at stage 3 it differs by the 2 Psi / N 16-bit
    gradient partition DeepSpeed leaves out (ours higher, up to 20/18) and by the fp32 gradients
    being converted one sub-group (1e9 elements) at a time (ours lower when Psi / N > 1e9)."""
    if zero_stage not in (2, 3):
        raise ValueError("DeepSpeed has model-state estimators for ZeRO stages 2 and 3 only")
    n = num_gpus_per_node * num_nodes
    psi = dims.n_params
    if zero_stage == 3:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        ds_cpu, ds_gpu, _ = estimate_zero3_model_states_mem_needs(
            psi, dims.largest_layer_params, num_gpus_per_node=num_gpus_per_node, num_nodes=num_nodes,
            cpu_offload=offload_optimizer, cpu_offload_params=offload_params, zero_init=False,
            additional_buffer_factor=additional_buffer_factor)
    else:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        ds_cpu, ds_gpu = estimate_zero2_model_states_mem_needs(
            psi, num_gpus_per_node=num_gpus_per_node, num_nodes=num_nodes, cpu_offload=offload_optimizer,
            additional_buffer_factor=additional_buffer_factor)
    dev, host = model_states(psi, 0, p=2, zero_stage=zero_stage, num_ranks=n, offload_optimizer=offload_optimizer,
                             offload_params=offload_params, largest_layer_params=dims.largest_layer_params)
    ours_dev = sum(v for k, v in dev.items() if k in MODEL_STATE_TERMS)
    ours_host = num_gpus_per_node * max(4 * psi, sum(host.values()))
    return DeepSpeedComparison(zero_stage, n, ours_dev, int(ds_gpu), ours_host, int(ds_cpu))


__all__ = ["MODEL_STATE_TERMS", "DeepSpeedComparison", "compare_with_deepspeed"]
