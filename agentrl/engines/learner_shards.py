"""How one learner step is split across the ranks of a learner group (pure python).

Every rank receives the whole step (the same group refs, the same seeded mini-batch permutation)
and derives the same plan from it, so no statistic needs a round trip: a mini-batch's policy-token
and sequence counts, which normalize the loss, are the whole mini-batch's on every rank.

Per mini-batch, rows are sorted by length and cut into micro-batches (by count or by a token
budget) exactly as one rank would cut them, so padding is what it is on one rank; the micro-batches
are then dealt out in snake order (ranks 0..N-1, then N-1..0, ...), which evens out their tokens
across ranks since neighbours in length order have similar lengths. Under ZeRO every forward and backward is
a collective (ZeRO-3 gathers parameters in forward; ZeRO 1-2 reduce gradients at the boundary),
so every rank must run the same number of micro-batches: a rank with fewer runs *empty* ones
(a real row with no policy token, contributing zero loss and zero gradient). With one rank the
plan is today's single-process split: sorted rows, chunked.

The sum of the ranks' micro-batch losses, each normalized by the whole mini-batch's token count,
is the one-rank loss; DeepSpeed averages gradients over ranks, so each rank scales its loss by N
before backward, and the update equals one rank's (up to the order of floating-point sums).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass
class MiniBatchPlan:
    rows: list[list[int]]  # this rank's micro-batches, as row indices of the step's batch
    n_micro: int  # micro-batches every rank runs: the most any rank has (the rest are empty ones)
    n_tokens: int  # policy tokens of the whole mini-batch (all ranks)
    n_sequences: int  # rows with at least one policy token, whole mini-batch
    filler_row: int  # the mini-batch's shortest row: what an empty micro-batch runs on

    @property
    def n_empty(self) -> int:
        return self.n_micro - len(self.rows)


def rank_rows(rows: Sequence[int], lengths: Sequence[int], rank: int, world: int) -> list[int]:
    """Rank ``rank``'s share of ``rows``: every ``world``-th row in length order, from ``rank``
    (a learner part's plain-torch model, with no collectives in its forward, splits this way)."""
    return sorted(rows, key=lambda i: lengths[i])[rank::world]


def snake_owner(k: int, world: int) -> int:
    """The rank that runs micro-batch ``k``: 0, 1, .., N-1, N-1, .., 0, 0, 1, .."""
    turn, pos = divmod(k, world)
    return pos if turn % 2 == 0 else world - 1 - pos


def plan_mini_batch(rows: Sequence[int], lengths: Sequence[int], policy_tokens: Sequence[int], rank: int, world: int,
                    split: Callable[[list[int]], list[list[int]]]) -> MiniBatchPlan:
    """The plan of one mini-batch (``rows``) for ``rank`` of ``world``; ``split`` cuts length-sorted
    rows into micro-batches."""
    if not rows:
        raise ValueError("a mini-batch needs at least one row")
    micro = split(sorted(rows, key=lambda i: lengths[i]))
    shares = [[m for k, m in enumerate(micro) if snake_owner(k, world) == r] for r in range(world)]
    return MiniBatchPlan(
        rows=shares[rank], n_micro=max(len(s) for s in shares),
        n_tokens=sum(policy_tokens[i] for i in rows), n_sequences=sum(1 for i in rows if policy_tokens[i] > 0),
        filler_row=min(rows, key=lambda i: lengths[i]),
    )


__all__ = ["MiniBatchPlan", "plan_mini_batch", "rank_rows", "snake_owner"]
