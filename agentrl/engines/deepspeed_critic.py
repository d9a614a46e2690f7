"""The PPO critic: a value model trained as its own DeepSpeed engine next to the policy.

The value model is the policy's architecture with a scalar head, built by transformers'
``AutoModelForTokenClassification(num_labels=1)`` from a causal-LM checkpoint (the backbone loads,
the head starts fresh). Values follow agentrl's alignment convention: ``V[:, t]`` is the value of
the state *before* token ``t`` is generated, i.e. the head applied to the hidden state at
``t - 1`` (``V[:, 0] = 0``), so ``V`` sits on the same positions as the token logprobs and the
response mask.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from agentrl.algos.critic import value_loss
from agentrl.engines.deepspeed_setup import enable_layer_checkpointing, reset_prestepped_optimizer_state
from agentrl.engines.hf_policy import micro_batch_values

if TYPE_CHECKING:
    from agentrl.engines.micro_batch import MicroBatch


class _Values(nn.Module):
    """forward(*MicroBatch.forward_args()) -> values [B, T] in the padded layout (see the module
    docstring), for padded and packed micro-batches alike."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                unpack_index: Tensor | None = None) -> Tensor:
        return micro_batch_values(self.model, input_ids, attention_mask, position_ids, unpack_index)


class DeepSpeedCritic:
    """One optimizer step per learner step (whatever ``learner.ppo_epochs``); its weights live
    only in the learner actor (not saved with the policy checkpoint)."""

    def __init__(self, model_path: str, critic_cfg: Any, ds_config: dict, seed: int = 0, gradient_checkpointing: bool = False,
                 attn_implementation: str | None = None):
        import deepspeed
        from transformers import AutoModelForTokenClassification

        self.cfg = critic_cfg
        torch.manual_seed(seed + 1)
        attn = {"attn_implementation": attn_implementation} if attn_implementation else {}
        model = AutoModelForTokenClassification.from_pretrained(model_path, num_labels=1, dtype=torch.float32, **attn)
        model.eval()  # no dropout: values must be deterministic for the clipped loss
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        optimizer = torch.optim.AdamW(model.parameters(), lr=critic_cfg.lr, weight_decay=0.0)
        self.engine, _, _, _ = deepspeed.initialize(model=_Values(model), optimizer=optimizer, config=ds_config)
        self.engine.eval()
        if gradient_checkpointing:
            enable_layer_checkpointing(self.engine.module)
        reset_prestepped_optimizer_state(self.engine)

    @torch.no_grad()
    def values(self, *forward_args: Tensor | None) -> Tensor:
        """Values [B, T] of a micro-batch given as ``MicroBatch.forward_args()`` (or ids, mask)."""
        return self.engine(*forward_args).float()

    def train(self, micro: list[MicroBatch], n_tokens: int, loss_scale: int = 1) -> dict[str, float]:
        """One optimizer step on the clipped value loss over the micro-batches (their
        ``old_values`` and ``returns`` filled in by the learner); ``n_tokens``: the whole step's
        policy tokens (every rank's). In a learner group of N ranks ``loss_scale`` = N (DeepSpeed
        averages the ranks' gradients; the step's gradient is their sum), and the returned
        statistics are this rank's shares of sums over the step."""
        out = {"critic/loss": 0.0, "critic/clip_frac": 0.0, "critic/explained_var": 0.0}
        for k, m in enumerate(micro):
            self.engine.set_gradient_accumulation_boundary(k == len(micro) - 1)
            v = self.engine(*m.forward_args())
            loss, st = value_loss(v, m.old_values, m.returns, m.response_mask, self.cfg.value_clip, n_tokens)
            self.engine.backward(loss * loss_scale if loss_scale != 1 else loss)
            share = float(m.response_mask.sum()) / n_tokens
            out["critic/loss"] += float(loss.detach())
            out["critic/clip_frac"] += float(st.get("vf_clip_frac", 0.0)) * share
            out["critic/explained_var"] += float(st.get("explained_var", 0.0)) * share
        self.engine.step()
        return out

    def close(self) -> None:
        destroy = getattr(self.engine, "destroy", None)
        if destroy is not None:
            destroy()
        self.engine = None
