"""DeepSpeed set-up shared by the policy learner and the critic: the config dict, the
single-process rank environment, and the fix for DeepSpeed's warm-up optimizer step."""

from __future__ import annotations

import os
import socket
from typing import Any

import torch


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_single_process_env() -> None:
    """Rank/world env for a 1-process group; without it DeepSpeed tries MPI discovery (mpi4py).

    Existing values win, so a multi-rank launcher can still set them, except that a 1-process
    group always takes a free local port of its own: nobody else joins it, and an inherited
    MASTER_PORT can be one the parent process's own group still listens on (EADDRINUSE in a
    learner started by a process that ran one)."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    if os.environ["WORLD_SIZE"] == "1":
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(_free_port())
    else:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def build_ds_config(learner_cfg: Any, dtype: str) -> dict[str, Any]:
    """The DeepSpeed config dict (kept separate so the settings are easy to read and test)."""
    zero: dict[str, Any] = {"stage": learner_cfg.zero_stage}
    if learner_cfg.zero_stage == 3:
        # We gather full weights ourselves (GatheredParameters) for sync and saving.
        zero["stage3_gather_16bit_weights_on_model_save"] = False
    return {
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
