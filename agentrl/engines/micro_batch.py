"""``MicroBatch``: one padded micro-batch of a learner step, shared by the policy and the critic.

``train_step`` batches are python lists, one entry per sequence (see
``DeepSpeedLearner.train_step``); ``pad_micro_batch`` turns some of its rows into right-padded
[B, T] tensors on the learner's device. The learner's phases then fill in the rest: the critic's
values, returns and GAE advantages (PPO), the reference and pi_old log-probabilities.
"""

from __future__ import annotations

from typing import Sequence

import torch

from agentrl.api import MicroBatch, TrainBatch
from agentrl.engines.hf_policy import pad_batch


def pad_micro_batch(batch: TrainBatch, rows: Sequence[int], pad_id: int,
                    device: torch.device | str | None = None) -> MicroBatch:
    """Rows ``rows`` of a ``TrainBatch`` as a ``MicroBatch``.

    Advantages come from ``token_rewards`` when the batch has them (a critic estimator), else
    from ``advantages``; ``rollout_logprobs`` is optional. The response mask is restricted to real
    (attended) tokens."""
    columns = [batch.response_mask, batch.per_token] + ([batch.rollout_logprobs] if batch.rollout_logprobs is not None else [])
    ids, attn, resp, adv, *roll = pad_batch(
        [batch.input_ids[i] for i in rows], pad_id, *[[col[i] for i in rows] for col in columns], device=device
    )
    explorer = None
    if batch.explorer is not None:
        explorer = torch.tensor([bool(batch.explorer[i]) for i in rows], dtype=torch.bool, device=ids.device)
    return MicroBatch(ids, attn, (resp > 0) & (attn > 0), adv, roll[0] if roll else None, explorer_rows=explorer)


__all__ = ["MicroBatch", "pad_micro_batch"]
