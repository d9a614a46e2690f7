"""The plan that splits a learner step across ranks (engines/learner_shards.py): pure python."""

from __future__ import annotations

import random

import pytest

from agentrl.engines.learner_shards import plan_mini_batch, snake_owner
from agentrl.engines.micro_batch import split_micro_batches


def _split(lengths, size=3, budget=None):
    return lambda rows: split_micro_batches(rows, lengths, size, budget)


def test_snake_order_deals_micro_batches_back_and_forth():
    assert [snake_owner(k, 3) for k in range(8)] == [0, 1, 2, 2, 1, 0, 0, 1]
    assert {snake_owner(k, 1) for k in range(5)} == {0}


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("budget", [None, 60])
def test_the_ranks_run_exactly_one_ranks_micro_batches_in_equal_numbers(world, budget):
    rng = random.Random(world)
    lengths = [rng.randint(5, 40) for _ in range(17)]
    tokens = [max(0, n - 4) for n in lengths]
    tokens[3] = 0  # a row without policy tokens
    rows = list(range(17))
    one = plan_mini_batch(rows, lengths, tokens, 0, 1, _split(lengths, budget=budget))
    plans = [plan_mini_batch(rows, lengths, tokens, r, world, _split(lengths, budget=budget)) for r in range(world)]
    # the same micro-batches as one rank, each on exactly one rank
    assert sorted(m for p in plans for m in p.rows) == sorted(one.rows)
    # every rank runs the same number (its own plus empty ones), the fewest that covers the busiest rank
    assert {p.n_micro for p in plans} == {max(len(p.rows) for p in plans)}
    assert all(p.n_empty == p.n_micro - len(p.rows) >= 0 for p in plans)
    # normalisers are the whole mini-batch's on every rank
    assert {(p.n_tokens, p.n_sequences) for p in plans} == {(sum(tokens), 16)}
    assert {p.filler_row for p in plans} == {min(rows, key=lambda i: lengths[i])}


def test_a_rank_with_no_rows_runs_empty_micro_batches_only():
    lengths = [10, 12]
    plans = [plan_mini_batch([0, 1], lengths, [6, 8], r, 3, _split(lengths, size=1)) for r in range(3)]
    assert [len(p.rows) for p in plans] == [1, 1, 0] and [p.n_empty for p in plans] == [0, 0, 1]
