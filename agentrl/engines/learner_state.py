"""The learner's whole training state, saved and restored for an exact resume (docs/operating.md).

What a checkpoint's ``learner/`` folder holds:

* ``policy/``: DeepSpeed's ``save_checkpoint`` of the policy engine (with LoRA, of the adapters
  only: the frozen base is reloaded from ``model.path``): module weights, optimizer
  state (AdamW moments and step counts; ZeRO 1-3 partitions and the fp32 master weights of bf16
  and fp16 training included), the LR scheduler (its place in the warm-up) and DeepSpeed's step
  counters;
* ``critic/``: the same for the PPO critic's engine, when there is one;
* ``extra.pt``: the policy version, the learner group's size, the state of each of the methods'
  learner parts under its ``state_key`` (``engines/learner_parts.py``: e.g. an exploration
  policy's weights, kept between its derivations) and rank 0's RNG states (torch, Python, NumPy);
  ``extra_rank<r>.pt``: rank r's RNG states (r > 0).

DeepSpeed's own checkpoint rather than torch state dicts of module, optimizer and scheduler: it
knows where each ZeRO stage and mixed-precision wrapper keeps master weights and optimizer
partitions, so one code path covers ZeRO 0-3 and every dtype. On CPU its round trip is bitwise
for stages 0-3 (tests/test_resume.py, tests/test_learner_group.py). Every rank of a learner group
saves and loads together: DeepSpeed writes each rank's optimizer partition as its own file. ZeRO
partitions reload only at the world size they were saved with, so a restore into a group of
another size is refused with both sizes named.

The frozen KL reference is not saved: it is always the run's original ``model.path``, which the
learner loads before any state is restored.

``state_digest`` hashes everything a restore sets, from live state: at save time, and again after
a load. Equal digests mean the resumed learner holds bit for bit what the checkpointed one held.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from agentrl.engines.deepspeed_learner import DeepSpeedLearner

POLICY_TAG, CRITIC_TAG, EXTRA_FILE = "policy", "critic", "extra.pt"


def _extra_file(rank: int) -> str:
    return EXTRA_FILE if rank == 0 else f"extra_rank{rank}.pt"


def save_learner_state(learner: DeepSpeedLearner, out_dir: str | Path) -> dict[str, str]:
    """Write the learner's state into ``out_dir``; returns its ``state_digest``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = rng_state()
    # with LoRA only the adapters (and their optimizer state) are saved: the frozen base is model.path
    learner.engine.save_checkpoint(str(out), tag=POLICY_TAG, save_latest=False, exclude_frozen_parameters=learner.lora)
    if learner.critic is not None:
        learner.critic.engine.save_checkpoint(str(out), tag=CRITIC_TAG, save_latest=False)
    if learner.rank == 0:
        extra = {"version": learner.version, "world_size": learner.world, "rng": rng,
                 **{p.state_key: p.state_dict() for p in learner.parts.values()}}
    else:
        extra = {"rng": rng}
    torch.save(extra, out / _extra_file(learner.rank))
    return state_digest(learner, rng)


def load_learner_state(learner: DeepSpeedLearner, in_dir: str | Path) -> dict[str, str]:
    """Restore what ``save_learner_state`` wrote into a learner built from the run's config and
    ``model.path``; returns the ``state_digest`` of the restored state."""
    src = Path(in_dir)
    saved_world = int(torch.load(src / EXTRA_FILE, weights_only=False).get("world_size", 1))
    if saved_world != learner.world:
        raise ValueError(f"{src}: this checkpoint was saved by a learner group of {saved_world} rank(s), and ZeRO "
                         f"partitions reload only at that size; resume with learner.num_ranks={saved_world} "
                         f"(this run has {learner.world})")
    engines = [(learner.engine, POLICY_TAG)] + ([(learner.critic.engine, CRITIC_TAG)] if learner.critic is not None else [])
    for engine, tag in engines:
        path, _ = engine.load_checkpoint(str(src), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True,
                                         load_module_strict=not (learner.lora and tag == POLICY_TAG))
        if path is None:
            raise FileNotFoundError(f"{src / tag}: no DeepSpeed checkpoint of the {tag}")
    main = torch.load(src / EXTRA_FILE, weights_only=False)
    learner.version = int(main["version"])
    for part in learner.parts.values():
        if main.get(part.state_key) is not None:  # saved by a run with the same method
            part.load_state_dict(main[part.state_key])
    rng = main["rng"] if learner.rank == 0 else torch.load(src / _extra_file(learner.rank), weights_only=False)["rng"]
    set_rng_state(rng)
    return state_digest(learner, rng)


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def state_digest(learner: DeepSpeedLearner, rng: dict[str, Any] | None = None) -> dict[str, str]:
    """sha256 per part of the learner's state: weights, optimizer, LR scheduler, counters, RNG
    (``rng``, default the current states), the critic's when there is one, and each learner part's
    (under its ``state_key``).
    The optimizer part is this rank's partition (every rank of a group hashes its own); the
    weights are gathered in full (a collective under ZeRO-3)."""
    engine = learner.engine
    parts: dict[str, Any] = {
        "module": learner.state_dict_for_inference(),
        "optimizer": engine.optimizer.state_dict(),
        "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None,
        "counters": {"version": learner.version, "global_steps": engine.global_steps,
                     "global_samples": engine.global_samples, "skipped_steps": engine.skipped_steps},
        "rng": rng if rng is not None else rng_state(),
    }
    if learner.critic is not None:
        critic = learner.critic.engine
        parts["critic"] = {"module": _gathered(critic, learner.learner_cfg.zero_stage),
                           "optimizer": critic.optimizer.state_dict(), "global_steps": critic.global_steps}
    for part in learner.parts.values():
        parts[part.state_key] = part.state_dict()
    return {name: _sha(value) for name, value in parts.items()}


def _gathered(engine, zero_stage: int) -> dict[str, torch.Tensor]:
    """An engine's module weights, gathered under ZeRO-3."""
    params = list(engine.module.parameters())
    if zero_stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return {k: v.detach().cpu().clone() for k, v in engine.module.state_dict().items()}
    return {k: v.detach().cpu().clone() for k, v in engine.module.state_dict().items()}


def _sha(value: Any) -> str:
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()


def _feed(h, x: Any) -> None:
    """Hash ``x`` by content: tensors and arrays by dtype, shape and bytes; containers in a fixed
    order; other objects by class and attributes (never by ``repr``, which may hold an address)."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(x, np.ndarray):
        h.update(f"A{x.dtype}{x.shape}".encode())
        h.update(np.ascontiguousarray(x).tobytes())
    elif isinstance(x, dict):
        h.update(b"{")
        for key in sorted(x, key=repr):
            h.update(repr(key).encode())
            _feed(h, x[key])
        h.update(b"}")
    elif isinstance(x, (list, tuple)):
        h.update(b"[")
        for item in x:
            _feed(h, item)
        h.update(b"]")
    elif x is None or isinstance(x, (bool, int, float, str, bytes, np.generic, torch.dtype)):
        h.update(repr(x).encode())
    elif hasattr(x, "__dict__"):
        h.update(type(x).__name__.encode())
        _feed(h, vars(x))
    else:
        h.update(repr(x).encode())
