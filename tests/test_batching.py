"""Rewards -> per-token advantages for every estimator, on real episodes of the built-in suite.

Episodes come from the real episode loop (``run_episode`` with scripted policies and a local
backend session), so step spans, segments and calls logs are exactly what rollouts produce.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl.agent.chat import ChatFormatter
from agentrl.agent.episode import SEG_SUMMARY, SEG_TOOL, EpisodeLimits, Generation, run_episode
from agentrl.agent.gold import GoldPolicy
from agentrl.algos.batching import build_batch
from agentrl.api import EpisodeGroup
from agentrl.config import load_config
from agentrl.envs.builtin.generator import builtin_split
from agentrl.envs.session import LocalEnvSession
from agentrl.rewards.scoring import score_episode, step_rewards

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class Say:
    """A policy that always answers ``text`` (no tool call): omits every needed call."""

    def __init__(self, formatter: ChatFormatter, text: str = "Done: 5."):
        self.formatter, self.text = formatter, text

    async def generate(self, prompt_ids, max_tokens):
        ids = self.formatter.render_assistant_ids(self.text)
        return Generation(ids, [-0.5] * len(ids), "stop")


@pytest.fixture(scope="module")
def task():
    # a multi-turn base task whose every turn needs calls
    return next(t for t in builtin_split("train")
                if t.category == "base" and len(t.turns) >= 2 and all(turn.gold for turn in t.turns))


def _episode(task, policy, formatter):
    ep = asyncio.run(run_episode(task, policy, LocalEnvSession(task), formatter, EpisodeLimits(max_episode_tokens=2048)))
    score_episode(ep, task)
    return ep


@pytest.fixture(scope="module")
def group(task, formatter):
    gold = [_episode(task, GoldPolicy(task, formatter), formatter) for _ in range(2)]
    omit = [_episode(task, Say(formatter), formatter) for _ in range(2)]
    return EpisodeGroup(task.id, "g", 0, gold + omit)


def _algo(*overrides):
    return load_config(None, list(overrides)).algo


def test_steps_cover_exactly_the_policy_tokens(group):
    for e in group.episodes:
        covered = [0] * len(e.token_ids)
        for start, end in e.step_spans:
            covered[start:end] = [1] * (end - start)
        assert covered == e.response_mask
        assert e.step_turns == sorted(e.step_turns) and len(e.step_states) == len(e.step_spans)
    # every episode starts from the same prompt, i.e. the same state; gold episodes replay alike
    firsts = {e.step_states[0] for e in group.episodes}
    assert len(firsts) == 1
    assert group.episodes[0].step_states == group.episodes[1].step_states


def test_rewards_of_gold_and_omitting_episodes(group, task):
    gold, omit = group.episodes[0].rewards, group.episodes[2].rewards
    assert gold["outcome"] == 1.0 and gold["process"] == pytest.approx(1.0) and gold["summary"] == pytest.approx(1.0)
    assert gold["omission"] == 0.0
    assert omit["outcome"] == 0.0 and omit["omission"] == 1.0 and omit["summary"] == -0.5
    assert omit["process/name_f1"] == 0.0
    assert len(group.episodes[0].answers) == len(task.turns)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_episode_level_estimators_broadcast(group, name):
    batch, stats = build_batch([group], _algo(f"algo.advantage={name}"))
    assert stats["groups_with_signal"] == 1.0
    for e, adv in zip(group.episodes, batch.advantages):
        values = {a for a, m in zip(adv, e.response_mask) if m}
        assert len(values) == 1  # one scalar per episode
        assert all(a == 0 for a, m in zip(adv, e.response_mask) if not m)
    signs = [next(a for a, m in zip(adv, e.response_mask) if m) > 0 for e, adv in zip(group.episodes, batch.advantages)]
    assert signs == [True, True, False, False]


def test_slca_routes_summary_reward_to_summary_tokens_only(group):
    batch, stats = build_batch([group], _algo("algo.advantage=slca"))
    for e, adv in zip(group.episodes, batch.advantages):
        seg = e.segments
        tool = {a for a, s in zip(adv, seg) if s == SEG_TOOL}
        summ = {a for a, s in zip(adv, seg) if s == SEG_SUMMARY}
        assert len(tool) <= 1 and len(summ) == 1
    # the omitting episodes have no tool segment at all; the gold ones share the tool advantage 0
    # (only two episodes with a tool segment and equal R_tool), while summaries are ranked
    gold_sum = next(a for a, s in zip(batch.advantages[0], group.episodes[0].segments) if s == SEG_SUMMARY)
    omit_sum = next(a for a, s in zip(batch.advantages[2], group.episodes[2].segments) if s == SEG_SUMMARY)
    assert gold_sum > 0 > omit_sum
    assert stats["episodes_with_summary"] == 1.0


def test_gigpo_adds_step_advantages_on_shared_states(group):
    grpo, _ = build_batch([group], _algo("algo.advantage=grpo"))
    gig, _ = build_batch([group], _algo("algo.advantage=gigpo"))
    e = group.episodes[0]
    first = slice(*e.step_spans[0])
    # step 0 is a shared state for all four episodes: its step advantage is non-zero, so GiGPO
    # differs from GRPO there; with omega = 0 it is GRPO again
    assert gig.advantages[0][first] != grpo.advantages[0][first]
    flat, _ = build_batch([group], _algo("algo.advantage=gigpo", "algo.gigpo.omega=0.0"))
    for a, b in zip(flat.advantages, grpo.advantages):
        assert a == pytest.approx(b, abs=1e-6)


def test_turn_grpo_credits_each_turn_among_episodes_that_reached_it(group):
    """Gold episodes pass every turn, omitting ones fail turn 0: turn 0 is ranked (gold +,
    omit -); later turns are reached from the gold state only by the two gold episodes, which
    both pass, so their tokens get 0 — where episode-level GRPO credits them too."""
    batch, stats = build_batch([group], _algo("algo.advantage=turn_grpo"))
    assert stats["groups_with_signal"] == 1.0
    for e, adv in zip(group.episodes, batch.advantages):
        assert all(a == 0 for a, m in zip(adv, e.response_mask) if not m)
        by_turn = {}
        for (start, end), u in zip(e.step_spans, e.step_turns):
            by_turn.setdefault(u, set()).update(adv[start:end])
        assert all(len(v) == 1 for v in by_turn.values())  # one value per turn
        first = next(iter(by_turn[0]))
        assert first > 0 if e.rewards["outcome"] == 1.0 else first < 0
        assert all(next(iter(v)) == 0 for u, v in by_turn.items() if u > 0)


def test_ppo_token_rewards_sum_to_the_episode_reward(group):
    batch, _ = build_batch([group], _algo("algo.advantage=ppo", "algo.critic.lr=1e-5"))
    assert batch.advantages is None
    for e, tr in zip(group.episodes, batch.token_rewards):
        assert sum(tr) == pytest.approx(e.rewards["progress"])
        assert all(r == 0 for r, m in zip(tr, e.response_mask) if not m)


def test_kl_in_reward_lowers_the_reward_of_divergent_episodes(group):
    n = len(group.episodes)
    kl = [[0.0] * len(e.token_ids) for e in group.episodes]
    kl[0] = [1.0] * len(kl[0])  # episode 0 diverged from the reference; its twin did not
    batch, _ = build_batch([group], _algo("algo.kl_in=reward", "algo.kl_coef=0.01"), kl_per_token=kl)
    a0 = next(a for a, m in zip(batch.advantages[0], group.episodes[0].response_mask) if m)
    a1 = next(a for a, m in zip(batch.advantages[1], group.episodes[1].response_mask) if m)
    assert a0 < a1 and n == 4


def test_step_rewards_place_turn_credit_on_the_turn_last_step():
    assert step_rewards([True, False, True], 3, [0, 0, 1, 2, 2], "progress") == pytest.approx([0, 1 / 3, 0, 0, 1 / 3])
    assert step_rewards([True, True], 2, [0, 1, 1], "outcome") == [0, 0, 1.0]
    assert step_rewards([True, False], 2, [0, 1], "outcome") == [0, 0]
    assert step_rewards([], 2, [], "progress") == []
    with pytest.raises(ValueError, match="unknown reward kind"):
        step_rewards([True], 1, [0], "bogus")
    assert torch.tensor(step_rewards([True] * 4, 4, [0, 1, 2, 3], "progress")).sum() == pytest.approx(1.0)


class CutOff:
    """A policy whose first message is cut off by the token budget (mid-call by default)."""

    def __init__(self, formatter: ChatFormatter, text: str = '<tool_call>\n{"name": "get_balance", "argum'):
        self.formatter, self.text = formatter, text

    async def generate(self, prompt_ids, max_tokens):
        ids = self.formatter.encode(self.text)
        return Generation(ids, [-0.1] * len(ids), "length")


def test_segments_come_from_the_parsed_structure(group, task, formatter):
    gold = group.episodes[0]
    # every turn of the gold episode ends with a summary message; the calls are tool segment
    for start, end in gold.step_spans:
        kinds = set(gold.segments[start:end])
        assert len(kinds) == 1 and kinds <= {SEG_TOOL, SEG_SUMMARY}
    closing = [max(k for k, u in enumerate(gold.step_turns) if u == turn) for turn in range(len(task.turns))]
    assert [gold.segments[gold.step_spans[k][0]] for k in closing] == [SEG_SUMMARY] * len(task.turns)
    cut = _episode(task, CutOff(formatter), formatter)
    assert cut.termination == "length" and cut.answers == [None]
    assert SEG_SUMMARY not in cut.segments and SEG_TOOL in cut.segments
    assert cut.rewards["summary"] == 0.0 and cut.rewards["omission"] == 0.0
    prose = _episode(task, CutOff(formatter, "Let me look that up and then"), formatter)
    assert prose.termination == "length" and SEG_SUMMARY not in prose.segments  # closed no turn


def test_every_configurable_estimator_has_a_batch_builder(group):
    """config.schema.KNOWN_ADVANTAGES (validated without torch) and runtime.batching agree."""
    from agentrl.config.schema import KNOWN_ADVANTAGES

    for name in sorted(KNOWN_ADVANTAGES):
        extra = ["algo.critic.lr=1e-5"] if name == "ppo" else []
        batch, _ = build_batch([group], _algo(f"algo.advantage={name}", *extra))
        assert len(batch.input_ids) == len(group.episodes), name
