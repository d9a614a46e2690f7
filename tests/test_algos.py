"""Advantage estimators and PPO/KL losses against hand computations and invariants."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.algos.advantages import ADVANTAGES, broadcast_to_tokens, dr_grpo, get_advantage, grouped, grpo, raft, rloo
from agentrl.algos.losses import aggregate_tokens, kl_penalty, ppo_clip_loss, sequence_mean_weights, truncated_is_weights


def close(a, b, tol=1e-5):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32), atol=tol)


# --- advantages -----------------------------------------------------------------------------
def test_grpo_hand():
    # r = [1, 0, 0, 1]: mean 0.5, unbiased std = sqrt(4 * 0.25 / 3) = 0.57735
    a = grpo(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    s = math.sqrt(1 / 3)
    assert close(a, [0.5 / (s + 1e-6), -0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.5 / (s + 1e-6)])


def test_dr_grpo_and_rloo_hand():
    r = torch.tensor([3.0, 1.0, 2.0])
    assert close(dr_grpo(r), [1.0, -1.0, 0.0])
    # leave-one-out: 3 - (1+2)/2 = 1.5, 1 - (3+2)/2 = -1.5, 2 - (3+1)/2 = 0
    assert close(rloo(r), [1.5, -1.5, 0.0])


def test_raft_hand():
    assert close(raft(torch.tensor([0.5, 1.0, 0.0, 1.0])), [0.0, 1.0, 0.0, 1.0])  # the best, all of them
    assert close(raft(torch.tensor([0.25, 0.5, 0.0])), [0.0, 1.0, 0.0])  # best partial progress
    assert close(raft(torch.tensor([0.0, 0.0])), [0.0, 0.0])  # nothing to imitate
    # unlike the baselined estimators, a group that all succeeds is reinforced (imitation)
    assert close(raft(torch.tensor([1.0, 1.0])), [1.0, 1.0]) and close(raft(torch.tensor([0.7])), [1.0])


def test_degenerate_groups_are_zero():
    for name, fn in ADVANTAGES.items():
        if name == "raft":  # no baseline: see test_raft_hand
            continue
        assert close(fn(torch.tensor([0.7])), [0.0])
        assert close(fn(torch.tensor([0.5, 0.5, 0.5])), [0.0, 0.0, 0.0])
    assert grpo(torch.tensor([1, 0])).dtype == torch.float32  # integer rewards are accepted


def test_registry():
    assert get_advantage("rloo") is rloo
    with pytest.raises(KeyError, match="grpo"):
        get_advantage("nope")


def test_grouped_non_contiguous():
    r = torch.tensor([1.0, 10.0, 0.0, 20.0, 30.0])
    g = torch.tensor([0, 1, 0, 1, 1])
    out = grouped(dr_grpo, r, g)
    assert close(out, [0.5, -10.0, -0.5, 0.0, 10.0])
    assert close(grouped(grpo, r, g, eps=0.0)[[0, 2]], grpo(torch.tensor([1.0, 0.0]), eps=0.0))


def test_broadcast():
    m = torch.tensor([[0, 1, 1], [1, 0, 0]])
    assert close(broadcast_to_tokens(torch.tensor([2.0, -1.0]), m), [[0, 2, 2], [-1, 0, 0]])


# --- losses ---------------------------------------------------------------------------------
def test_ppo_clip_hand():
    # tokens: ratio e^{0.5}=1.6487 (A=+1 -> clipped at 1.28), ratio e^{-0.5}=0.6065 (A=-1 -> clipped
    # at 0.8), ratio 1 (A=2), masked token.
    lp = torch.tensor([[0.5, -0.5, 0.0, 9.0]])
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -1.0, 2.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, st_ = ppo_clip_loss(lp, old, adv, mask)
    # -min(1.6487, 1.28) = -1.28 ; -min(-0.6065, -0.8) = 0.8 ; -2
    assert close(loss, (-1.28 + 0.8 - 2.0) / 3)
    assert close(st_["clip_frac"], 2 / 3)
    assert close(st_["ratio_mean"], (math.exp(0.5) + math.exp(-0.5) + 1) / 3)

    def k3(x):
        return math.exp(x) - 1 - x

    assert close(st_["approx_kl"], (k3(0.5) + k3(-0.5)) / 3)
    # unclipped side: ratio < 1 with A > 0 is not clipped: -(0.6065 * 1)
    loss2, s2 = ppo_clip_loss(torch.tensor([[-0.5]]), torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1))
    assert close(loss2, -math.exp(-0.5)) and close(s2["clip_frac"], 0.0)


def test_dual_clip_and_is_weights():
    lp = torch.tensor([[2.0, 0.0]])  # ratio e^2 = 7.39 with A = -1: PPO loss 7.39, dual clip bounds to 3
    old = torch.zeros(1, 2)
    adv = torch.tensor([[-1.0, 1.0]])
    mask = torch.ones(1, 2)
    loss, s = ppo_clip_loss(lp, old, adv, mask, dual_clip=3.0)
    assert close(loss, (3.0 - 1.0) / 2) and close(s["dual_clip_frac"], 0.5)
    loss_w, _ = ppo_clip_loss(lp, old, adv, mask, is_weights=torch.tensor([[0.5, 2.0]]))
    assert close(loss_w, (math.exp(2.0) * 0.5 - 1.0 * 2.0) / 2)
    with pytest.raises(ValueError):
        ppo_clip_loss(lp, old, adv, mask, dual_clip=1.0)


def test_n_tokens_global_and_1d_advantages():
    lp, old, mask = torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, _ = ppo_clip_loss(lp, old, torch.tensor([1.0, -2.0]), mask, n_tokens_global=10)
    assert close(loss, (-1 - 1 + 2) / 10)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 7), st.integers(1, 3), st.integers(0, 2**31 - 1), st.booleans())
def test_microbatch_sum_equals_full(B, T, n_micro, seed, dual):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    old = torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) < 0.7
    w = torch.rand(B, T, generator=g, dtype=torch.float64) + 0.5
    n = mask.sum().clamp(min=1)
    kw = dict(dual_clip=3.0 if dual else None)
    full, _ = ppo_clip_loss(lp, old, adv, mask, is_weights=w, n_tokens_global=n, **kw)
    parts = sum(ppo_clip_loss(lp[i], old[i], adv[i], mask[i], is_weights=w[i], n_tokens_global=n, **kw)[0]
                for i in torch.arange(B).chunk(n_micro))
    assert torch.allclose(full, parts, atol=1e-10)
    if mask.any():  # default n_tokens_global is the mask count
        assert torch.allclose(ppo_clip_loss(lp, old, adv, mask, is_weights=w, **kw)[0], full)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 7), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_sequence_mean_weights_give_mean_of_sequence_means(B, T, n_micro, seed):
    """Weighted token aggregation == mean over sequences of each one's token mean, also when the
    step is split into micro-batches (weights use the step's global counts)."""
    g = torch.Generator().manual_seed(seed)
    vals = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) < 0.6
    n_seq, n_tok = int((mask.sum(1) > 0).sum()), int(mask.sum())
    if n_seq == 0:
        assert torch.all(sequence_mean_weights(mask, 1, 1.0) == 0)
        return
    expect = sum(vals[i][mask[i]].mean() for i in range(B) if mask[i].any()) / n_seq
    parts = sum(aggregate_tokens(vals[i] * sequence_mean_weights(mask[i], n_seq, n_tok), mask[i], n_tok)
                for i in torch.arange(B).chunk(n_micro))
    assert torch.allclose(parts, expect, atol=1e-10)


def test_sequence_mean_weights_hand():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    w = sequence_mean_weights(mask, n_sequences=2, n_tokens_global=4)
    assert close(w[0, 0], 4 / (2 * 3)) and close(w[1, 0], 4 / 2) and torch.all(w[2] == 0)


def test_gradient_zero_where_masked_even_with_garbage():
    lp = torch.tensor([[0.1, 500.0, float("nan")], [-0.2, 0.3, -1e4]], requires_grad=True)
    old = torch.tensor([[0.0, -500.0, 0.0], [0.0, 0.0, float("inf")]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 0]])
    isw = torch.tensor([[1.0, float("nan"), 1.0], [1.0, 1.0, float("inf")]])
    loss, _ = ppo_clip_loss(lp, old, torch.tensor([1.0, -1.0]), mask, is_weights=isw)
    kl = aggregate_tokens(kl_penalty(lp, torch.zeros(2, 3)), mask)
    (loss + kl).backward()
    assert torch.isfinite(loss) and torch.isfinite(kl)
    assert torch.all(lp.grad[mask == 0] == 0)
    assert torch.all(lp.grad[mask == 1] != 0)


def test_kl_estimators():
    lp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    d = ref - lp
    assert close(kl_penalty(lp, ref, "k1"), lp - ref)
    assert close(kl_penalty(lp, ref, "k3"), torch.exp(d) - d - 1)
    assert torch.all(kl_penalty(lp, ref) >= 0)
    assert close(kl_penalty(lp, lp), [0.0, 0.0])
    with pytest.raises(ValueError):
        kl_penalty(lp, ref, "k9")


def test_truncated_is_weights():
    old = torch.tensor([0.0, 0.0, -1.0], requires_grad=True)
    roll = torch.tensor([0.0, -3.0, 0.0])
    w = truncated_is_weights(old, roll, cap=2.0)
    assert close(w, [1.0, 2.0, math.exp(-1.0)]) and not w.requires_grad
