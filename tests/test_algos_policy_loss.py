"""``algos.losses.policy_loss``: the learner's whole policy loss, on hand-computed cases, and equal
(bit for bit, value and gradient) to the inline computation ``DeepSpeedLearner.train_step`` did
before it was factored out."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos.losses import (
    PolicyLossConfig,
    aggregate_tokens,
    kl_penalty,
    policy_loss,
    ppo_clip_loss,
    rollout_stats,
    sequence_mean_weights,
    truncated_is_weights,
)
from agentrl.config.schema import AlgoConfig

LN = math.log


def _hand_case():
    """One row, 4 positions; position 0 is a prompt token (mask 0) holding garbage.

    Policy tokens t = 1, 2, 3 with old = 0, so rho_t = exp(lp_t):
        rho = [1.5, 0.5, 1.0], A = [1, -1, 2], clip range [0.8, 1.28]
        t=1: min(1.5 * 1, 1.28 * 1)        = 1.28  -> l = -1.28  (clipped)
        t=2: min(0.5 * -1, 0.8 * -1)       = -0.8  -> l =  0.8   (clipped)
        t=3: min(1 * 2, 1 * 2)             = 2     -> l = -2
    rollout = [0, 0, -ln 4]: w = min(exp(old - rollout), 2) = [1, 1, 2], |old - rollout| = [0, 0, ln 4]
        pg  = (-1.28 + 0.8 - 2 * 2) / 3                         = -4.48 / 3
    entropy H = [0.5, 1, 1.5]: bonus = 3 / 3 = 1
    ref = 0, k1: KL = lp - ref = [ln 1.5, ln 0.5, 0]:  kl = ln(0.75) / 3
    L = pg - 0.1 * bonus + 0.5 * kl
    """
    lp = torch.tensor([[5.0, LN(1.5), LN(0.5), 0.0]], requires_grad=True)
    old = torch.tensor([[-3.0, 0.0, 0.0, 0.0]])
    adv = torch.tensor([[100.0, 1.0, -1.0, 2.0]])
    mask = torch.tensor([[0, 1, 1, 1]])
    roll = torch.tensor([[9.0, 0.0, 0.0, -LN(4.0)]])
    ref = torch.tensor([[7.0, 0.0, 0.0, 0.0]])
    ent = torch.tensor([[9.0, 0.5, 1.0, 1.5]], requires_grad=True)
    return lp, old, adv, mask, roll, ref, ent


def test_policy_loss_hand_computed():
    lp, old, adv, mask, roll, ref, ent = _hand_case()
    cfg = PolicyLossConfig(clip_low=0.2, clip_high=0.28, tis_cap=2.0, kl_coef=0.5, kl_estimator="k1", entropy_coef=0.1)
    loss, st = policy_loss(lp, old, adv, mask, cfg, rollout_logprobs=roll, ref_logprobs=ref, entropy=ent)
    pg, kl = -4.48 / 3, LN(0.75) / 3
    assert loss.item() == pytest.approx(pg - 0.1 * 1.0 + 0.5 * kl, abs=1e-6)
    assert st["pg_loss"].item() == pytest.approx(pg, abs=1e-6)
    assert st["kl"].item() == pytest.approx(kl, abs=1e-6)
    assert st["entropy_bonus"].item() == pytest.approx(1.0, abs=1e-6)
    assert st["clip_frac"].item() == pytest.approx(2 / 3, abs=1e-6)
    assert st["dual_clip_frac"].item() == 0.0
    assert st["is_weight_mean"].item() == pytest.approx(4 / 3, abs=1e-6)
    assert st["logprob_mismatch"].item() == pytest.approx(LN(4.0) / 3, abs=1e-6)
    assert st["entropy"].item() == pytest.approx(1.0, abs=1e-6)
    # approx_kl = mean(rho - 1 - ln rho) = (0.5 - ln 1.5 + (-0.5 + ln 2) + 0) / 3 = ln(4/3) / 3
    assert st["approx_kl"].item() == pytest.approx(LN(4 / 3) / 3, abs=1e-6)
    assert st["ratio_mean"].item() == pytest.approx(1.0, abs=1e-6) and st["n_tokens"].item() == 3
    assert all(not v.requires_grad for v in st.values())

    # Gradients. pg: t=1, 2 are clipped (0); t=3: d(-rho * A * w)/d lp = -1 * 2 * 2 = -4, / 3.
    # KL k1: 0.5 * 1/3 per token. Entropy: -0.1 / 3 per token. Position 0: nothing.
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, 1 / 6, 1 / 6, -4 / 3 + 1 / 6]]))
    torch.testing.assert_close(ent.grad, torch.tensor([[0.0, -1 / 30, -1 / 30, -1 / 30]]))


def test_policy_loss_k3_global_normalizer_and_optional_terms():
    lp, old, adv, mask, roll, ref, ent = _hand_case()
    # k3 = exp(ref - lp) - (ref - lp) - 1 = [1/1.5 - 1 + ln 1.5, 2 - 1 - ln 2, 0]
    k3 = (1 / 1.5 - 1 + LN(1.5)) + (1 - LN(2.0))
    cfg = PolicyLossConfig(kl_coef=0.5, kl_estimator="k3")
    # n_tokens_global = 6: this call holds half of the step's tokens, every term halves
    loss, st = policy_loss(lp, old, adv, mask, cfg, rollout_logprobs=roll, ref_logprobs=ref, n_tokens_global=6)
    assert st["kl"].item() == pytest.approx(k3 / 6, abs=1e-6)
    assert st["pg_loss"].item() == pytest.approx(-4.48 / 6, abs=1e-6)
    assert loss.item() == pytest.approx(-4.48 / 6 + 0.5 * k3 / 6, abs=1e-6)
    assert st["is_weight_mean"].item() == pytest.approx(4 / 3, abs=1e-6)  # stats stay means over this call
    assert "entropy_bonus" not in st and "entropy" not in st

    # no rollout logprobs: w = 1; no reference: no KL term, whatever kl_coef
    loss, st = policy_loss(lp, old, adv, mask, cfg)
    assert loss.item() == pytest.approx((-1.28 + 0.8 - 2) / 3, abs=1e-6) and loss.item() == st["pg_loss"].item()
    assert not {"kl", "is_weight_mean", "logprob_mismatch"} & set(st)


def test_policy_loss_dual_clip():
    """rho = 5, A = -1: min(-5, 1.28 * -1) = -5 -> l = 5, bounded by dual clip c = 3 -> l = 3.
    rho = 0.5, A = -1: l = 0.8 (clipped, below the bound). Mean (3 + 0.8) / 2 = 1.9."""
    lp = torch.tensor([[LN(5.0), LN(0.5)]])
    old, adv, mask = torch.zeros(1, 2), torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2)
    loss, st = policy_loss(lp, old, adv, mask, PolicyLossConfig(dual_clip=3.0))
    assert loss.item() == pytest.approx(1.9, abs=1e-6)
    assert st["dual_clip_frac"].item() == 0.5 and st["clip_frac"].item() == 0.5
    loss, _ = policy_loss(lp, old, adv, mask, PolicyLossConfig())
    assert loss.item() == pytest.approx((5 + 0.8) / 2, abs=1e-6)


def test_policy_loss_seq_mean_token_mean():
    """rho = 1 (lp = old), so l = -A. Row a: one policy token, A = 2; row b: three, A = [1, 1, -1].
    token_mean: (-2 - 1 - 1 + 1) / 4 = -3/4; seq_mean_token_mean: (-2 + (-1 - 1 + 1) / 3) / 2 = -7/6,
    also when the rows are two micro-batches called with the step's N = 4 and S = 2."""
    lp = torch.zeros(2, 3)
    adv = torch.tensor([[2.0, 5.0, 5.0], [1.0, 1.0, -1.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    tok, _ = policy_loss(lp, lp, adv, mask, PolicyLossConfig(loss_agg="token_mean"))
    seq_cfg = PolicyLossConfig(loss_agg="seq_mean_token_mean")
    seq, _ = policy_loss(lp, lp, adv, mask, seq_cfg)
    assert tok.item() == pytest.approx(-0.75, abs=1e-6) and seq.item() == pytest.approx(-7 / 6, abs=1e-6)
    parts = [policy_loss(lp[i:i + 1], lp[i:i + 1], adv[i:i + 1], mask[i:i + 1], seq_cfg, n_tokens_global=4,
                         n_sequences_global=2)[0] for i in range(2)]
    assert sum(parts).item() == pytest.approx(-7 / 6, abs=1e-6)


def test_policy_loss_config():
    algo = AlgoConfig(clip_low=0.1, clip_high=0.3, dual_clip=4.0, kl_coef=0.2, kl_estimator="k1", entropy_coef=0.01,
                      tis_cap=3.0, loss_agg="seq_mean_token_mean")
    assert PolicyLossConfig.from_algo(algo) == PolicyLossConfig(0.1, 0.3, 4.0, 3.0, 0.2, "k1", 0.01, "seq_mean_token_mean")
    default = AlgoConfig()
    assert PolicyLossConfig.from_algo(default) == PolicyLossConfig()  # same defaults as algo.*
    with pytest.raises(ValueError, match="loss_agg"):
        PolicyLossConfig(loss_agg="seq_mean")
    lp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(lp, lp, lp, torch.ones(1, 2), PolicyLossConfig(entropy_coef=0.1))


def test_rollout_stats_normalizer():
    old = torch.tensor([[0.0, -1.0, -2.0]])
    roll = torch.tensor([[5.0, -1.5, -1.0]])
    mask = torch.tensor([[0, 1, 1]])
    # w = min(exp([0.5, -1]), 2) = [e^0.5, e^-1], |old - roll| = [0.5, 1]
    st = rollout_stats(old, mask, rollout_logprobs=roll, tis_cap=2.0, n_tokens_global=4)
    assert st["is_weight_mean"].item() == pytest.approx((math.exp(0.5) + math.exp(-1)) / 4, abs=1e-6)
    assert st["logprob_mismatch"].item() == pytest.approx(1.5 / 4, abs=1e-6)
    assert set(rollout_stats(old, mask)) == set()


# ------------------------------------------------------------------ equivalence with the learner


def _learner_inline_loss(lp, ent, old, adv, mask, roll, ref, acfg, n_mini, seqs_mini):
    """The loss as DeepSpeedLearner.train_step computed it inline (commit 1010e42), for one micro-batch."""
    agg = 1.0 if acfg.loss_agg == "token_mean" else sequence_mean_weights(mask, seqs_mini, n_mini)
    is_w = truncated_is_weights(old, roll, acfg.tis_cap) if roll is not None else None
    pg, st = ppo_clip_loss(lp, old, adv * agg, mask, clip_low=acfg.clip_low, clip_high=acfg.clip_high,
                           dual_clip=acfg.dual_clip, is_weights=is_w, n_tokens_global=n_mini)
    loss = pg
    if acfg.entropy_coef > 0:
        loss = loss - acfg.entropy_coef * aggregate_tokens(ent * agg, mask, n_mini)
    if ref is not None:
        loss = loss + acfg.kl_coef * aggregate_tokens(kl_penalty(lp, ref, acfg.kl_estimator) * agg, mask, n_mini)
    return loss, st


@pytest.mark.parametrize("algo", [
    AlgoConfig(),
    AlgoConfig(kl_coef=0.05, kl_estimator="k1", entropy_coef=0.01),
    AlgoConfig(kl_coef=0.3, dual_clip=2.0, clip_low=0.1, clip_high=0.12, tis_cap=1.5, entropy_coef=0.2,
               loss_agg="seq_mean_token_mean"),
    AlgoConfig(kl_coef=0.0, loss_agg="seq_mean_token_mean"),
], ids=["default", "k1_entropy", "dual_seqmean_all", "no_kl_seqmean"])
@pytest.mark.parametrize("with_rollout", [True, False], ids=["rollout", "no_rollout"])
def test_policy_loss_equals_the_learners_inline_loss(algo, with_rollout):
    g = torch.Generator().manual_seed(7)
    shape = (3, 11)
    mask = torch.rand(shape, generator=g) > 0.3
    mask[1] = False  # a row without policy tokens
    old = -torch.rand(shape, generator=g) * 3
    roll = (old + 0.3 * torch.randn(shape, generator=g)) if with_rollout else None
    ref = old + 0.2 * torch.randn(shape, generator=g) if algo.kl_coef > 0 else None
    adv = torch.randn(shape, generator=g)
    base_lp = old + 0.4 * torch.randn(shape, generator=g)
    base_ent = torch.rand(shape, generator=g) * 4
    n_mini, seqs_mini = int(mask.sum()) + 5, 4  # as if the mini-batch had another micro-batch

    results = []
    for fn in ("inline", "policy_loss"):
        lp, ent = base_lp.clone().requires_grad_(), base_ent.clone().requires_grad_()
        if fn == "inline":
            loss, st = _learner_inline_loss(lp, ent, old, adv, mask, roll, ref, algo, n_mini, seqs_mini)
        else:
            loss, st = policy_loss(lp, old, adv, mask, PolicyLossConfig.from_algo(algo), rollout_logprobs=roll,
                                   ref_logprobs=ref, entropy=ent, n_tokens_global=n_mini, n_sequences_global=seqs_mini)
        loss.backward()
        results.append((loss.detach(), lp.grad, ent.grad, st["clip_frac"], st["approx_kl"]))
    for a, b in zip(*results):
        assert (a is None and b is None) or torch.equal(a, b), (a, b)
