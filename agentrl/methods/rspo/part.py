"""RSPO's part of the learner: the explorer B beside the policy A (``engines/learner_parts.py``).

Built by ``RspoMethod.learner_part`` at the end of ``DeepSpeedLearner.__init__``. It holds the
``Explorer`` (``explorer.py``) and hands it what it needs from the learner (A's HF model, the pad
id, the device, the rank and the group's size); the learner, its checkpoint code and the learner
actor reach it only through the ``LearnerPart`` protocol, plus ``derive`` for RSPO's own hook.
"""

from __future__ import annotations

from typing import Any

from agentrl.api import TrainBatch
from agentrl.methods.rspo.explorer import Explorer
from agentrl.methods.rspo.groups import EXPLORER
from agentrl.weight_sync.object_store import weights_to_blob


class ExplorerPart:
    state_key = "explorer"  # extra.pt's key and the state digest's part name, as before RSPO was a method
    role = EXPLORER

    def __init__(self, learner: Any, rspo_cfg: Any):
        lcfg = learner.learner_cfg
        self.learner = learner
        self.foreign_is_cap = rspo_cfg.is_cap  # w_t = min(pi_A / pi_B, rspo.is_cap) on B's rows of A's update
        self.explorer = Explorer(rspo_cfg.explorer_lr or lcfg.lr, rspo_cfg.explorer_steps, rspo_cfg.grad_clip,
                                 lcfg.micro_batch_size, learner.temperature, learner.loss_cfg, learner.tied_embeddings,
                                 kl_every=rspo_cfg.kl_every, gradient_checkpointing=lcfg.gradient_checkpointing,
                                 autocast=_explorer_autocast(learner.compute_dtype))

    def derive(self, batch: TrainBatch) -> dict[str, float]:
        """Re-derive B from the current A on ``batch`` (process-reward advantages of A's episodes,
        ``groups.explorer_batch``); A is not touched."""
        lr = self.learner
        return self.explorer.derive(lr.hf_model, batch, lr.pad_id, lr.device, lr.rank, lr.world)

    def weights_version(self) -> int:
        return self.explorer.derivations  # 0: B is still the initial policy its engines loaded at start

    def weights_blob(self) -> bytes:  # B's engines run at the policy's engines' dtype
        return weights_to_blob(self.explorer.state_dict_for_inference(), self.learner.sampler_dtype)

    def logprobs(self, input_ids: list[list[int]]) -> list[list[float]]:
        if self.explorer.model is None:
            raise ValueError("no explorer has been derived")
        return self.explorer.logprobs([list(s) for s in input_ids], self.learner.pad_id, self.learner.device)

    def state_dict(self) -> dict:
        return self.explorer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.explorer.load_state_dict(state, self.learner.hf_model)  # A gives B's architecture


def _explorer_autocast(compute_dtype: str) -> str | None:
    """B's weights are fp32 whatever A's are; it matmuls in A's compute dtype under autocast when
    that is bfloat16. Not float16: A's fp16 engine scales its loss, B's plain AdamW has no scaler,
    and B's per-token gradients (advantage / the batch's token count) would underflow fp16."""
    return "bfloat16" if compute_dtype == "bfloat16" else None


__all__ = ["ExplorerPart"]
