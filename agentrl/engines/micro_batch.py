"""``MicroBatch``: one padded micro-batch of a learner step, shared by the policy and the critic.

``train_step`` batches are python lists, one entry per sequence (see
``DeepSpeedLearner.train_step``); ``pad_micro_batch`` turns some of its rows into right-padded
[B, T] tensors on the learner's device. The learner's phases then fill in the rest: the critic's
values, returns and GAE advantages (PPO), the reference and pi_old log-probabilities.

``pack_micro_batch`` (``learner.packing``) makes the same micro-batch plus a packed copy of its
tokens: one row, episodes end to end, positions restarting per episode, which the model runs on
instead (``MicroBatch.forward_args``). ``split_micro_batches`` cuts length-sorted rows into
micro-batches by count or by a token budget (``learner.max_tokens_per_micro_batch``).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

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
    foreign = None
    if batch.foreign is not None:
        foreign = torch.tensor([bool(batch.foreign[i]) for i in rows], dtype=torch.bool, device=ids.device)
    return MicroBatch(ids, attn, (resp > 0) & (attn > 0), adv, roll[0] if roll else None, foreign_rows=foreign)


def pack_sequences(seqs: Sequence[Sequence[int]], device: torch.device | str | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``seqs`` end to end in one row: (packed ids long [1, N], position ids long [1, N] restarting
    at 0 at each sequence's first token, unpack index long [B, T]).

    ``unpack_index[b, t]`` is where token ``t`` of sequence ``b`` sits in the packed row, -1 past
    its end; with T the longest length it matches ``pad_batch``'s layout (``hf_policy.unpack``)."""
    if not seqs:
        raise ValueError("pack_sequences needs at least one sequence")
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    starts = torch.cumsum(lengths, 0) - lengths
    ids = torch.tensor([tok for s in seqs for tok in s], dtype=torch.long).unsqueeze(0)
    positions = torch.cat([torch.arange(int(n)) for n in lengths]).unsqueeze(0)
    t = torch.arange(int(lengths.max()))[None, :]
    index = torch.where(t < lengths[:, None], starts[:, None] + t, -1)
    return ids.to(device), positions.to(device), index.to(device)


def pack_micro_batch(batch: TrainBatch, rows: Sequence[int], pad_id: int,
                     device: torch.device | str | None = None) -> MicroBatch:
    """``pad_micro_batch(batch, rows, ...)`` plus the packed inputs the model runs on
    (``packed_ids``, ``packed_positions``, ``unpack_index``; see ``pack_sequences``).

    The padded per-token tensors stay: the loss, masks, advantages and values keep the [B, T]
    layout, and the packed forward's output is unpacked into it."""
    m = pad_micro_batch(batch, rows, pad_id, device)
    m.packed_ids, m.packed_positions, m.unpack_index = pack_sequences([batch.input_ids[i] for i in rows], m.input_ids.device)
    return m


def split_micro_batches(rows: Sequence[int], lengths: Sequence[int], micro_batch_size: int,
                        max_tokens: int | None = None, *, packed: bool = True) -> list[list[int]]:
    """Cut ``rows`` (length-sorted row indices; ``lengths[i]`` is row ``i``'s token count) into
    consecutive micro-batches, keeping their order.

    Without ``max_tokens``: ``micro_batch_size`` rows each. With it, the budget replaces the count:
    rows are added until the next one would take the micro-batch past ``max_tokens`` tokens, where
    a micro-batch costs what its forward processes: the sum of its lengths when ``packed``, else
    its rows times its longest length (padding included). A row over the budget on its own still
    forms a micro-batch (it cannot be split)."""
    if max_tokens is None:
        return [list(rows[i : i + micro_batch_size]) for i in range(0, len(rows), micro_batch_size)]
    out: list[list[int]] = []
    current: list[int] = []
    total = longest = 0
    for i in rows:
        n = lengths[i]
        cost = total + n if packed else (len(current) + 1) * max(longest, n)
        if current and cost > max_tokens:
            out.append(current)
            current, total, longest = [], 0, 0
        current.append(i)
        total, longest = total + n, max(longest, n)
    if current:
        out.append(current)
    return out


def padding_fraction(micro_batches: Sequence[Sequence[int]], lengths: Sequence[int], packed: bool) -> float:
    """Share of the tokens the forwards process that are padding: padding / (padding + real), over
    all ``micro_batches`` (row index lists; ``lengths[i]`` is row ``i``'s token count). A packed
    micro-batch has none; a padded one pads every row to its longest. 0 for no tokens."""
    real = sum(lengths[i] for mb in micro_batches for i in mb)
    processed = real if packed else sum(len(mb) * max((lengths[i] for i in mb), default=0) for mb in micro_batches)
    return (processed - real) / processed if processed else 0.0


__all__ = ["MicroBatch", "pack_micro_batch", "pack_sequences", "pad_micro_batch", "padding_fraction", "split_micro_batches"]
