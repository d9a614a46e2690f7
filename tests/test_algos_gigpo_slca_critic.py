"""GiGPO, SLCA and critic (GAE / value loss / whiten) against hand computations and invariants."""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agentrl.algos.advantages import grpo, rloo
from agentrl.algos.critic import discounted_reverse_cumsum, gae, value_loss, whiten
from agentrl.algos.gigpo import discounted_returns, gigpo, step_group_advantages, steps_to_tokens
from agentrl.algos.losses import ppo_clip_loss
from agentrl.algos.slca import SEG_ENV, SEG_SUMMARY, SEG_TOOL, route_segments, slca

EPS = 1e-6
PROPS = settings(max_examples=60, deadline=None)


def close(a, b, tol=1e-5):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32), atol=tol)


def t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


# --- GiGPO ----------------------------------------------------------------------------------
def test_discounted_returns_hand():
    # gamma 0.5: R2 = 2, R1 = 0 + 0.5*2 = 1, R0 = 1 + 0.5*1 = 1.5
    assert close(discounted_returns(t([1.0, 0.0, 2.0]), 0.5), [1.5, 1.0, 2.0])
    assert discounted_returns(torch.zeros(0), 0.9).shape == (0,)
    assert discounted_returns(t([1, 2], torch.long), 1.0).dtype == torch.float32


def test_step_group_advantages_hand():
    # state 7: returns [1, 2, 3], mean 2, unbiased std 1 -> [-1, 0, 1]; states 9, 4 are singletons -> 0
    a = step_group_advantages(t([1.0, 2.0, 3.0, 5.0, 7.0]), t([7, 7, 7, 9, 4], torch.long))
    d = 1 + EPS
    assert close(a, [-1 / d, 0.0, 1 / d, 0.0, 0.0])
    # non-contiguous members of a state group
    a = step_group_advantages(t([1.0, 5.0, 3.0]), t([1, 2, 1], torch.long))
    s = math.sqrt(2)  # [1, 3]: mean 2, unbiased std sqrt(2)
    assert close(a, [-1 / (s + EPS), 0.0, 1 / (s + EPS)])


def test_gigpo_hand():
    # G = 3, episode rewards [1, 0, 1]: mean 2/3, deviations [1/3, -2/3, 1/3],
    # unbiased var (1/9 + 4/9 + 1/9) / 2 = 1/3, std 0.57735 -> A_ep = [0.57735, -1.15470, 0.57735]
    s = math.sqrt(1 / 3) + EPS
    a_ep = [1 / 3 / s, -2 / 3 / s, 1 / 3 / s]
    # gamma 0.5 returns: ep0 rewards [0, 1] -> [0.5, 1]; ep1 [0, 0] -> [0, 0]; ep2 [1] -> [1]
    # state 10 (first step of every episode): returns [0.5, 0, 1], mean 0.5, unbiased std 0.5
    #   -> A_step = [0, -1, 1]; states 11 and 12 are singletons -> 0.  omega = 2:
    out = gigpo(
        t([1.0, 0.0, 1.0]),
        [t([0.0, 1.0]), t([0.0, 0.0]), t([1.0])],
        [t([10, 11], torch.long), t([10, 12], torch.long), t([10], torch.long)],
        omega=2.0,
        gamma=0.5,
    )
    d = 0.5 + EPS
    assert [o.shape[0] for o in out] == [2, 2, 1]
    assert close(out[0], [a_ep[0] + 0.0, a_ep[0]])
    assert close(out[1], [a_ep[1] - 2 * 0.5 / d, a_ep[1]])
    assert close(out[2], [a_ep[2] + 2 * 0.5 / d])


def test_gigpo_empty_episodes_and_defaults():
    # Episode 1 has no steps but its reward still enters the episode-level baseline:
    # rewards [1, 0]: mean 0.5, unbiased std sqrt(0.5) -> A_ep = [0.70711, -0.70711]
    out = gigpo(t([1.0, 0.0]), [t([1.0, 1.0]), torch.zeros(0)], [t([3, 3], torch.long), torch.zeros(0, dtype=torch.long)])
    a0 = 0.5 / (math.sqrt(0.5) + EPS)
    # default gamma 0.95: returns [1.95, 1], same state 3 -> mean 1.475, std sqrt(2 * 0.475^2) = 0.67175
    st_ = math.sqrt(2) * 0.475 + EPS
    assert close(out[0], [a0 + 0.475 / st_, a0 - 0.475 / st_])
    assert out[1].shape == (0,)
    all_empty = gigpo(t([1.0, 0.0]), [torch.zeros(0)] * 2, [torch.zeros(0, dtype=torch.long)] * 2)
    assert [o.numel() for o in all_empty] == [0, 0]


def test_gigpo_shape_errors():
    with pytest.raises(ValueError, match="one step_rewards"):
        gigpo(t([1.0, 0.0]), [t([1.0])], [t([1], torch.long)])
    with pytest.raises(ValueError, match="episode 0"):
        gigpo(t([1.0]), [t([1.0, 2.0])], [t([1], torch.long)])
    with pytest.raises(ValueError):
        step_group_advantages(t([1.0, 2.0]), t([1], torch.long))


def test_steps_to_tokens_hand():
    out = steps_to_tokens(t([2.0, -1.0]), [(1, 3), (5, 6)], 7)
    assert close(out, [0, 2, 2, 0, 0, -1, 0])
    with pytest.raises(ValueError, match="one span"):
        steps_to_tokens(t([2.0]), [(0, 1), (1, 2)], 3)
    with pytest.raises(ValueError, match="not inside"):
        steps_to_tokens(t([2.0]), [(2, 5)], 3)


@PROPS
@given(
    st.lists(st.floats(-3, 3), min_size=1, max_size=6),
    st.lists(st.integers(0, 5), min_size=6, max_size=6),
    st.floats(0, 3),
    st.data(),
)
def test_gigpo_equals_grpo_without_repeated_states(ep_rewards, lengths, omega, data):
    g = len(ep_rewards)
    lengths = lengths[:g]
    step_r = [t(data.draw(st.lists(st.floats(-2, 2), min_size=n, max_size=n))) for n in lengths]
    ids = torch.arange(sum(lengths)).split(lengths)  # every step its own state -> A_step = 0
    out = gigpo(t(ep_rewards), step_r, list(ids), omega=omega)
    a_ep = grpo(t(ep_rewards))
    for i, o in enumerate(out):
        assert o.shape == (lengths[i],)
        assert close(o, a_ep[i].expand(lengths[i]), 1e-6)


# --- SLCA -----------------------------------------------------------------------------------
def test_segment_constants_match_agent():
    from agentrl.agent import episode

    assert (SEG_ENV, SEG_TOOL, SEG_SUMMARY) == (episode.SEG_ENV, episode.SEG_TOOL, episode.SEG_SUMMARY)


def test_slca_hand():
    # tool: present in episodes 0, 1 with [1, 0]: mean 0.5, std sqrt(0.5) -> +-0.70711, times lam 2;
    # episode 2 has no tool segment (its NaN reward is never read) -> 0.
    # summary: present only in episode 1 -> fewer than 2 -> all 0.
    a_tool, a_sum = slca(
        t([1.0, 0.0, float("nan")]),
        t([0.2, 0.8, 0.5]),
        t([True, True, False], torch.bool),
        t([False, True, False], torch.bool),
        lam_tool=2.0,
    )
    x = 0.5 / (math.sqrt(0.5) + EPS)
    assert close(a_tool, [2 * x, -2 * x, 0.0])
    assert close(a_sum, [0.0, 0.0, 0.0])
    # summary in all three: [0.2, 0.8, 0.5], mean 0.5, deviations [-0.3, 0.3, 0], var 0.18/2, std 0.3
    every = torch.ones(3, dtype=torch.bool)
    _, a_sum = slca(t([1.0, 0.0, 1.0]), t([0.2, 0.8, 0.5]), every, every, lam_sum=0.5)
    assert close(a_sum, [-0.5 * 0.3 / (0.3 + EPS), 0.5 * 0.3 / (0.3 + EPS), 0.0])
    with pytest.raises(ValueError, match="equal length"):
        slca(t([1.0]), t([1.0, 2.0]), t([True], torch.bool), t([True], torch.bool))


def test_route_segments_hand():
    seg = t([[0, 1, 1, 2], [1, 0, 2, 0]], torch.long)
    out = route_segments(t([1.0, 2.0]), t([-1.0, -3.0]), seg)
    assert close(out, [[0, 1, 1, -1], [2, 0, -3, 0]])
    with pytest.raises(ValueError):
        route_segments(t([1.0]), t([1.0]), seg)


@PROPS
@given(st.integers(1, 6), st.integers(1, 8), st.data())
def test_slca_segments_are_locked(g, length, data):
    floats = st.lists(st.floats(-5, 5), min_size=g, max_size=g)
    bools = st.lists(st.booleans(), min_size=g, max_size=g)
    r_tool, r_tool2, r_sum, r_sum2 = (t(data.draw(floats)) for _ in range(4))
    has_tool, has_sum = t(data.draw(bools), torch.bool), t(data.draw(bools), torch.bool)
    row = st.lists(st.integers(0, 2), min_size=length, max_size=length)
    seg = t(data.draw(st.lists(row, min_size=g, max_size=g)), torch.long)

    def tokens(rt, rs):
        return route_segments(*slca(rt, rs, has_tool, has_sum), seg)

    base = tokens(r_tool, r_sum)
    tool_tok, sum_tok = seg == SEG_TOOL, seg == SEG_SUMMARY
    assert torch.equal(tokens(r_tool, r_sum2)[~sum_tok], base[~sum_tok])  # r_sum never reaches tool/env tokens
    assert torch.equal(tokens(r_tool2, r_sum)[~tool_tok], base[~tool_tok])  # r_tool never reaches summary/env tokens
    assert torch.all(base[seg == SEG_ENV] == 0)


# --- critic ---------------------------------------------------------------------------------
def test_gae_hand():
    # Row 0: policy positions 0, 2, 3 (position 1 is an env token; its reward 9 and value 7 are skipped).
    # gamma 0.9, lam 0.5 (gamma*lam = 0.45):
    #   t=3: delta = 1 + 0 - 0.4 = 0.6;             A = 0.6;                        R = 1.0
    #   t=2: delta = 0 + 0.9*0.4 - 0.2 = 0.16;      A = 0.16 + 0.45*0.6 = 0.43;     R = 0.63
    #   t=0: delta = 0 + 0.9*0.2 - 0.5 = -0.32;     A = -0.32 + 0.45*0.43 = -0.1265; R = 0.3735
    # Row 1: no policy tokens -> all 0.
    r = t([[0.0, 9.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    v = t([[0.5, 7.0, 0.2, 0.4], [1.0, 2.0, 3.0, 4.0]])
    m = t([[1, 0, 1, 1], [0, 0, 0, 0]], torch.long)
    adv, ret = gae(r, v, m, gamma=0.9, lam=0.5)
    assert close(adv, [[-0.1265, 0, 0.43, 0.6], [0, 0, 0, 0]])
    assert close(ret, [[0.3735, 0, 0.63, 1.0], [0, 0, 0, 0]])
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        gae(r, v[:, :3], m)


def test_value_loss_hand():
    # tok0: (1-2)^2 = 1; V_clip = 0.5 + clamp(0.5, +-0.2) = 0.7, (0.7-2)^2 = 1.69 -> 0.5*1.69 = 0.845 (clipped)
    # tok1: (0.5-0)^2 = 0.25; V_clip = 0.5 -> 0.25 -> 0.125 (not clipped).  loss = (0.845 + 0.125)/2 = 0.485
    v = t([[1.0, 0.5]]).requires_grad_()
    old, ret, m = t([[0.5, 0.5]]), t([[2.0, 0.0]]), t([[1, 1]])
    loss, stats = value_loss(v, old, ret, m, clip=0.2)
    assert close(loss, 0.485) and close(stats["vf_clip_frac"], 0.5) and close(stats["value_mean"], 0.75)
    # explained var: Var(R) = 1; residual [1, -0.5] has mean 0.25, var 0.5625 -> 1 - 0.5625 = 0.4375
    assert close(stats["explained_var"], 0.4375)
    assert all(not s.requires_grad for s in stats.values())
    # unclipped: (0.5 + 0.125)/2 = 0.3125; global token count 5 -> (0.845 + 0.125)/5
    assert close(value_loss(v, old, ret, m, clip=None)[0], 0.3125)
    assert close(value_loss(v, old, ret, m, n_tokens_global=5)[0], 0.97 / 5)
    # clipped branch active on tok0 with V - V_old beyond the clip: no gradient flows to V there
    loss, _ = value_loss(v, old, ret, t([[1, 0]]))
    loss.backward()
    assert close(v.grad, [[0.0, 0.0]])


def test_whiten_hand():
    # masked [1, 2, 3]: mean 2, population var 2/3 -> [-1, 0, 1] / sqrt(2/3); the masked-out 100 -> 0
    out = whiten(t([1.0, 2.0, 3.0, 100.0]), t([1, 1, 1, 0]))
    s = math.sqrt(2 / 3)
    assert close(out, [-1 / s, 0.0, 1 / s, 0.0])
    with pytest.raises(ValueError):
        whiten(t([1.0, 2.0]), t([1]))


@st.composite
def token_batch(draw, max_b=4, max_t=6):
    b, n = draw(st.integers(1, max_b)), draw(st.integers(1, max_t))
    grid = lambda elem: st.lists(st.lists(elem, min_size=n, max_size=n), min_size=b, max_size=b)  # noqa: E731
    mask = t(draw(grid(st.booleans())), torch.bool)
    return (lambda lo, hi: t(draw(grid(st.floats(lo, hi))))), mask


@PROPS
@given(token_batch())
def test_gae_unit_discount_zero_values_is_reward_to_go(batch):
    mat, mask = batch
    r = mat(-3, 3)
    adv, ret = gae(r, torch.zeros_like(r), mask, gamma=1.0, lam=1.0)
    # reward-to-go over the row's policy tokens: reversed cumsum of the masked rewards
    rtg = torch.where(mask, r, 0.0).flip(1).cumsum(1).flip(1)
    expected = torch.where(mask, rtg, 0.0)
    assert close(ret, expected) and close(adv, expected)


@PROPS
@given(token_batch(), st.floats(0, 1), st.floats(0, 1), st.data())
def test_gae_ignores_env_tokens(batch, gamma, lam, data):
    mat, mask = batch
    r, v = mat(-3, 3), mat(-3, 3)
    n = r.shape[1]
    k = data.draw(st.integers(1, 4))
    total = n + k
    env_cols = sorted(data.draw(st.lists(st.integers(0, total - 1), min_size=k, max_size=k, unique=True)))
    keep = torch.tensor([c for c in range(total) if c not in env_cols])
    big = lambda x, fill: torch.full((x.shape[0], total), fill, dtype=x.dtype).index_copy(1, keep, x)  # noqa: E731
    noise_r, noise_v = big(r, 123.0), big(v, -77.0)  # arbitrary junk on the inserted env columns
    adv, ret = gae(r, v, mask, gamma, lam)
    adv2, ret2 = gae(noise_r, noise_v, big(mask, False), gamma, lam)
    assert close(adv2[:, keep], adv) and close(ret2[:, keep], ret)
    assert torch.all(adv2[:, env_cols] == 0) and torch.all(ret2[:, env_cols] == 0)


def _gae_loop(r, v, m, gamma, lam):
    """The textbook backward recursion, one position at a time: the reference for the vectorized gae."""
    adv = torch.zeros_like(r)
    next_v = torch.zeros(r.shape[0], dtype=r.dtype)
    next_a = torch.zeros_like(next_v)
    for pos in range(r.shape[1] - 1, -1, -1):
        mt = m[:, pos]
        a_t = r[:, pos] + gamma * next_v - v[:, pos] + gamma * lam * next_a
        adv[:, pos] = torch.where(mt, a_t, torch.zeros_like(a_t))
        next_v = torch.where(mt, v[:, pos], next_v)
        next_a = torch.where(mt, a_t, next_a)
    return adv, torch.where(m, adv + v, torch.zeros_like(adv))


@PROPS
@given(token_batch(max_t=12), st.floats(0, 1), st.floats(0, 1))
def test_gae_equals_the_backward_recursion(batch, gamma, lam):
    mat, mask = batch
    r, v = mat(-3, 3), mat(-3, 3)
    adv, ret = gae(r, v, mask, gamma, lam)
    ref_adv, ref_ret = _gae_loop(r, v, mask, gamma, lam)
    assert close(adv, ref_adv) and close(ret, ref_ret)


def test_gae_on_long_rows_spans_chunks():
    # rows longer than the scan's chunk (64) with env tokens spread over them: same as the recursion
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(3, 700, generator=g), torch.randn(3, 700, generator=g)
    m = torch.rand(3, 700, generator=g) < 0.7
    adv, ret = gae(r, v, m, 0.99, 0.95)
    ref_adv, ref_ret = _gae_loop(r, v, m, 0.99, 0.95)
    assert torch.allclose(adv, ref_adv, atol=1e-4) and torch.allclose(ret, ref_ret, atol=1e-4)
    assert torch.allclose(discounted_reverse_cumsum(torch.ones(1, 600), 1.0), torch.arange(600, 0, -1.0)[None])


def _row_splits(data, b):
    cuts = sorted(data.draw(st.lists(st.integers(1, b - 1), max_size=3, unique=True))) if b > 1 else []
    bounds = [0, *cuts, b]
    return list(zip(bounds[:-1], bounds[1:]))


@PROPS
@given(token_batch(max_b=6), st.one_of(st.none(), st.floats(0.05, 1.0)), st.data())
def test_value_loss_micro_batch_invariant(batch, clip, data):
    mat, mask = batch
    assume(mask.any())
    v, old, ret = mat(-3, 3), mat(-3, 3), mat(-3, 3)
    n = mask.sum()
    full, _ = value_loss(v, old, ret, mask, clip=clip, n_tokens_global=n)
    parts = sum(
        value_loss(v[a:b], old[a:b], ret[a:b], mask[a:b], clip=clip, n_tokens_global=n)[0]
        for a, b in _row_splits(data, v.shape[0])
    )
    assert torch.allclose(parts, full, atol=1e-6, rtol=1e-6)


@PROPS
@given(token_batch(max_b=6), st.data())
def test_ppo_clip_loss_micro_batch_invariant(batch, data):
    mat, mask = batch
    assume(mask.any())
    lp, old, adv = mat(-3, 0), mat(-3, 0), mat(-2, 2)
    n = mask.sum()
    full, _ = ppo_clip_loss(lp, old, adv, mask, dual_clip=3.0, n_tokens_global=n)
    parts = sum(
        ppo_clip_loss(lp[a:b], old[a:b], adv[a:b], mask[a:b], dual_clip=3.0, n_tokens_global=n)[0]
        for a, b in _row_splits(data, lp.shape[0])
    )
    assert torch.allclose(parts, full, atol=1e-6, rtol=1e-6)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-16, 16), min_size=1, max_size=8))
def test_rloo_and_grpo_agree_on_sign(quarters):
    # Rewards on a 0.25 grid keep every sum exact, so "equals the mean" is decided exactly by both.
    r = t(quarters) / 4
    assert torch.equal(torch.sign(grpo(r)), torch.sign(rloo(r)))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-10, 10), min_size=1, max_size=8))
def test_rloo_and_grpo_agree_on_sign_any_float(rewards):
    r = t(rewards)
    a, b = grpo(r), rloo(r)
    # both are positive multiples of r_i - mean(r); only float rounding near 0 may differ
    assert torch.all((torch.sign(a) == torch.sign(b)) | (a.abs() < 1e-4) | (b.abs() < 1e-4))
