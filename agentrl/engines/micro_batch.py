"""``MicroBatch``: one padded micro-batch of a learner step, shared by the policy and the critic.

``train_step`` batches are python lists, one entry per sequence (see
``DeepSpeedLearner.train_step``); ``pad_micro_batch`` turns some of its rows into right-padded
[B, T] tensors on the learner's device. The learner's phases then fill in the rest: the critic's
values, returns and GAE advantages (PPO), the reference and pi_old log-probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from agentrl.engines.hf_policy import pad_batch


@dataclass
class MicroBatch:
    """[B, T] tensors of one micro-batch, token-aligned like ``hf_policy.token_logprobs``."""

    input_ids: Tensor  # long, right-padded with the learner's pad id
    attention_mask: Tensor  # long, 1 on real tokens
    response_mask: Tensor  # bool, the policy tokens: batch response_mask > 0 on real tokens
    # float32 per-token advantages; for PPO the token rewards, until the critic phase replaces them
    # with (whitened) GAE advantages
    advantages: Tensor
    rollout_logprobs: Tensor | None = None  # the sampler's logprobs, when the batch has them
    # filled in by the learner's phases
    ref_logprobs: Tensor | None = None  # frozen reference (KL in the loss)
    old_logprobs: Tensor | None = None  # pi_old
    old_entropy: Tensor | None = None  # entropy of pi_old
    old_values: Tensor | None = None  # critic values before its update (PPO)
    returns: Tensor | None = None  # GAE returns, the critic's targets (PPO)
    n_tokens: int = field(init=False)  # policy tokens
    n_sequences: int = field(init=False)  # rows with at least one policy token

    def __post_init__(self) -> None:
        self.n_tokens = int(self.response_mask.sum())
        self.n_sequences = int((self.response_mask.sum(dim=1) > 0).sum())


def pad_micro_batch(
    batch: Mapping[str, Any],
    rows: Sequence[int],
    pad_id: int,
    device: torch.device | str | None = None,
) -> MicroBatch:
    """Rows ``rows`` of a ``train_step`` batch as a ``MicroBatch``.

    Advantages come from ``token_rewards`` when the batch has them (PPO), else from
    ``advantages``; ``rollout_logprobs`` is optional. The response mask is restricted to real
    (attended) tokens."""
    adv_key = "token_rewards" if "token_rewards" in batch else "advantages"
    keys = ["response_mask", adv_key] + (["rollout_logprobs"] if batch.get("rollout_logprobs") is not None else [])
    ids, attn, resp, adv, *roll = pad_batch(
        [batch["input_ids"][i] for i in rows], pad_id, *[[batch[k][i] for i in rows] for k in keys], device=device
    )
    return MicroBatch(ids, attn, (resp > 0) & (attn > 0), adv, roll[0] if roll else None)


__all__ = ["MicroBatch", "pad_micro_batch"]
