"""``engines.micro_batch``: rows of a ``train_step`` batch as a padded ``MicroBatch`` (no DeepSpeed)."""

from __future__ import annotations

import pytest
import torch

from agentrl.api import TrainBatch
from agentrl.engines.micro_batch import MicroBatch, pad_micro_batch

BATCH = {
    "input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9]],
    "response_mask": [[0, 1, 1], [0, 0], [0, 1, 0, 1]],
    "advantages": [[0.0, 0.5, 0.5], [0.0, 0.0], [0.0, -1.0, 0.0, -1.0]],
    "rollout_logprobs": [[0.0, -0.1, -0.2], [0.0, -0.3], [0.0, -0.4, -0.5, -0.6]],
}


def test_pad_micro_batch_rows_in_order():
    mb = pad_micro_batch(TrainBatch(**BATCH), [1, 2], pad_id=0)
    assert mb.input_ids.tolist() == [[4, 5, 0, 0], [6, 7, 8, 9]]
    assert mb.attention_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert mb.response_mask.dtype == torch.bool
    assert mb.response_mask.tolist() == [[False] * 4, [False, True, False, True]]
    assert mb.advantages.tolist() == [[0.0] * 4, [0.0, -1.0, 0.0, -1.0]]
    torch.testing.assert_close(mb.rollout_logprobs, torch.tensor([[0.0, -0.3, 0.0, 0.0], [0.0, -0.4, -0.5, -0.6]]))
    assert (mb.n_tokens, mb.n_sequences) == (2, 1)
    assert mb.ref_logprobs is mb.old_logprobs is mb.old_entropy is mb.old_values is mb.returns is None


def test_pad_micro_batch_token_rewards_and_no_rollout():
    ppo = {k: v for k, v in BATCH.items() if k not in ("advantages", "rollout_logprobs")}
    ppo["token_rewards"] = [[0.0, 0.0, 1.0], [0.0, 0.0], [0.0, 0.0, 0.0, -1.0]]
    mb = pad_micro_batch(TrainBatch(**ppo), [0], pad_id=7)
    assert mb.input_ids.tolist() == [[1, 2, 3]] and mb.advantages.tolist() == [[0.0, 0.0, 1.0]]
    assert mb.rollout_logprobs is None and (mb.n_tokens, mb.n_sequences) == (2, 1)
    assert pad_micro_batch(TrainBatch(**ppo, rollout_logprobs=None), [0], pad_id=7).rollout_logprobs is None


def test_train_batch_checks_its_shape():
    with pytest.raises(ValueError, match="exactly one of advantages and token_rewards"):
        TrainBatch(BATCH["input_ids"], BATCH["response_mask"])
    with pytest.raises(ValueError, match="one entry per sequence"):
        TrainBatch(BATCH["input_ids"], BATCH["response_mask"][:2], advantages=BATCH["advantages"])


def test_counts_and_misaligned_lists():
    mb = MicroBatch(torch.ones(3, 2, dtype=torch.long), torch.ones(3, 2, dtype=torch.long),
                    torch.tensor([[True, True], [False, False], [False, True]]), torch.zeros(3, 2))
    assert (mb.n_tokens, mb.n_sequences) == (3, 2)
    bad = BATCH | {"advantages": [[0.0, 0.5], [0.0, 0.0], [0.0] * 4]}
    with pytest.raises(ValueError, match="per-token list"):
        pad_micro_batch(TrainBatch(**bad), [0], pad_id=0)
