"""DeepSpeed set-up shared by the policy learner and the critic: the process group (one rank or
N), the config dict, and the fix for DeepSpeed's warm-up optimizer step."""

from __future__ import annotations

import os
from typing import Any

import torch


def host_rendezvous_store(world_size: int):
    """Rank 0's side of an N-rank rendezvous: a TCPStore on a port the OS picks as it binds.

    The port is bound before anyone learns its number, so nothing can take it in between (a port
    found free, released and re-bound later can be taken by another process: EADDRINUSE).
    Returns (store, (this node's IP, port)); the other ranks connect to that address."""
    import ray

    ip = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    store = torch.distributed.TCPStore(ip, 0, world_size, is_master=True, wait_for_workers=False)
    return store, (ip, store.port)


def init_process_group(rank: int = 0, world_size: int = 1, store=None, address: tuple[str, int] | None = None) -> None:
    """The learner group's torch.distributed group (gloo on CPU, NCCL on GPUs), before DeepSpeed.

    A 1-rank group rendezvouses through an in-process ``HashStore``: no port at all. Rank r > 0
    of an N-rank group connects to rank 0's ``host_rendezvous_store`` at ``address``. The RANK /
    WORLD_SIZE / LOCAL_RANK / MASTER_* variables are set for DeepSpeed, which reads them (and
    would otherwise try MPI discovery); LOCAL_RANK is 0 because each rank actor sees only its own
    device (Ray sets CUDA_VISIBLE_DEVICES per actor)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.accelerator import get_accelerator

    if store is None:
        if world_size == 1:
            store = torch.distributed.HashStore()
        else:
            if address is None:
                raise ValueError(f"rank {rank} of {world_size}: the rendezvous address of rank 0 is needed")
            store = torch.distributed.TCPStore(address[0], address[1], world_size, is_master=False)
    host, port = address if address is not None else ("127.0.0.1", 0)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0", MASTER_ADDR=host, MASTER_PORT=str(port))
    backend = get_accelerator().communication_backend_name()
    torch.distributed.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size)


def build_ds_config(learner_cfg: Any, dtype: str) -> dict[str, Any]:
    """The DeepSpeed config dict (kept separate so the settings are easy to read and test)."""
    zero: dict[str, Any] = {"stage": learner_cfg.zero_stage}
    if learner_cfg.zero_stage == 3:
        # We gather full weights ourselves (GatheredParameters) for sync and saving.
        zero["stage3_gather_16bit_weights_on_model_save"] = False
    if learner_cfg.offload_optimizer:  # ZeRO-Offload: optimizer state and fp32 master weights in host memory
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if learner_cfg.offload_params:  # ZeRO-3 only (the config refuses other stages)
        zero["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    return {
        # a client optimizer may run the offloaded step (``adamw``: torch AdamW on CPU machines)
        "zero_force_ds_cpu_optimizer": False,
        "train_micro_batch_size_per_gpu": learner_cfg.micro_batch_size,
        "gradient_accumulation_steps": 1,  # we accumulate; see the module docstring
        "gradient_clipping": float(learner_cfg.grad_clip),
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": dtype == "bfloat16"},
        "fp16": {"enabled": dtype == "float16", "initial_scale_power": 16},
        "steps_per_print": 1 << 30,  # silence DeepSpeed's own progress log
        "wall_clock_breakdown": False,
    }


def reset_prestepped_optimizer_state(engine: Any) -> None:
    """Undo DeepSpeed's warm-up optimizer step (policy and critic engines alike).

    Some wrappers (``FP16_UnfusedOptimizer``, used for bf16 with ZeRO-0) call
    ``optimizer.step()`` once with zero gradients at construction to allocate Adam state.
    That leaves Adam's step counter at 1 with empty moments, so the bias correction of the
    first real update is wrong (it came out 0.74x the intended size in our test). Torch
    optimizers re-create state lazily, so clearing it restores exact AdamW semantics."""
    opt = getattr(engine, "basic_optimizer", None)
    state = getattr(opt, "state", None)
    if not state:
        return
    steps = [s.get("step") for s in state.values() if isinstance(s, dict)]
    if any(st is not None and float(st) > 0 for st in steps):
        state.clear()


def adamw(params: list, learner_cfg: Any) -> torch.optim.Optimizer:
    """The learner's AdamW over ``params``. With optimizer offload on a GPU machine, DeepSpeed's
    vectorized CPU Adam (the same AdamW update; its first use compiles a C++ op, ~1 min): torch's
    AdamW stepping host tensors would be the bottleneck. On CPU machines torch's AdamW everywhere."""
    kwargs = dict(lr=learner_cfg.lr, betas=tuple(learner_cfg.betas), eps=learner_cfg.adam_eps,
                  weight_decay=learner_cfg.weight_decay)
    if learner_cfg.offload_optimizer and torch.cuda.is_available():
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, adamw_mode=True, **kwargs)
    return torch.optim.AdamW(params, **kwargs)


def enable_layer_checkpointing(module: torch.nn.Module) -> None:
    """Turn on HF gradient checkpointing's recompute in a model kept in ``eval()`` mode.

    HF checkpoints a decoder layer only when the layer is in training mode; the learner keeps the
    whole model in eval mode (no dropout: a stochastic forward would make the PPO ratio noisy). So
    only the layers' own ``training`` flag is set (not their submodules'): attention and dropout
    stay in eval mode, and the layer recomputes its activations in backward."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in module.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]
    if not layers:
        raise ValueError("learner.gradient_checkpointing=true, but the model has no checkpointable decoder layers "
                         "(transformers' GradientCheckpointingLayer)")
    for layer in layers:
        layer.training = True
