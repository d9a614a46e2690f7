"""The imperfect teacher's habits, the behaviour rates that measure them, and the reward shuffle."""

from __future__ import annotations

import asyncio
import random

from agentrl.agent.chat import ChatFormatter
from agentrl.agent.episode import EpisodeLimits, run_episode
from agentrl.agent.gold import GoldPolicy
from agentrl.agent.teacher import Habits, demonstration
from agentrl.algos.batching import shuffle_episode_rewards
from agentrl.api import Episode, EpisodeGroup
from agentrl.envs.behaviours import behaviour_rates
from agentrl.envs.builtin.behaviours import behaviour_counts
from agentrl.envs.builtin.generator import builtin_split, generate_tasks
from agentrl.envs.builtin.ops import spends_looked_up_balance
from agentrl.envs.session import LocalEnvSession
from agentrl.tasks.schema import text_key


def _play(task, played, formatter):
    limits = EpisodeLimits(max_new_tokens=10_000, max_assistant_messages_per_turn=16, max_episode_tokens=100_000)
    return asyncio.run(run_episode(task, GoldPolicy(played, formatter), LocalEnvSession(task), formatter, limits))


def _formatter():
    from transformers import AutoTokenizer

    from agentrl.models.tiny_model import SHIPPED

    return ChatFormatter(AutoTokenizer.from_pretrained(SHIPPED))


def test_bank_suite_is_one_domain_and_heldout_is_unseen():
    train, held = builtin_split("bank-train"), builtin_split("bank-heldout")
    assert len(train) == 400 and len(held) == 200
    assert {t.domain for t in train + held} == {"bank"}
    assert not {text_key(t) for t in train} & {text_key(t) for t in held}
    cats = {c: sum(t.category == c for t in held) for c in ("base", "miss_param", "miss_func")}
    assert cats["miss_param"] > 30 and cats["miss_func"] > 5  # the habits have somewhere to show
    # the full suite is unchanged by the suite option (its splits are what earlier runs used)
    assert builtin_split("heldout")[0].turns[0].user == "Deposit money into account A5572."


def test_zero_rates_give_the_gold_plan():
    rng = random.Random(0)
    for task in generate_tasks(30, seed=3, suite="bank"):
        played, fired = demonstration(task, Habits(), rng)
        assert played.model_dump() == task.model_dump() and not any(fired.values())


def test_habits_fire_where_they_apply_and_the_checker_fails_those_turns():
    formatter = _formatter()
    tasks = generate_tasks(60, seed=5, suite="bank")
    always = Habits(guess_missing=1.0, skip_lookup=1.0, swap_transfer=1.0)
    seen = {"guess": 0, "swap": 0, "skip": 0}
    swaps_seen = swaps_fired = guesses_failed = 0
    for task in tasks:
        played, fired = demonstration(task, always, random.Random(1))
        gold_ep, ep = _play(task, task, formatter), _play(task, played, formatter)
        assert all(gold_ep.turn_passed)
        gold_counts = behaviour_counts(task, gold_ep.turn_passed, gold_ep.calls)
        counts = behaviour_counts(task, ep.turn_passed, ep.calls)
        assert gold_counts["transfer_swap"][0] == 0
        assert gold_counts["miss_param_ask"][0] == gold_counts["miss_param_ask"][1]
        if fired["guess_missing"]:
            seen["guess"] += 1
            u = next(i for i, t in enumerate(task.turns) if not t.gold and not t.withheld_tools)
            assert played.turns[u].gold  # a call where asking was due
            guesses_failed += not ep.turn_passed[u]  # unless the guess errors out (more than the balance)
            assert counts["miss_param_ask"] == [int(ep.turn_passed[u]), 1]
        if fired["swap_transfer"]:
            seen["swap"] += 1
            first = min(u for u, t in enumerate(task.turns) if any(c.name == "transfer" for s in t.gold for c in s))
            assert not ep.turn_passed[first]  # the swapped payer/payee leaves the wrong balances
            swaps_seen += counts["transfer_swap"][0]
            swaps_fired += fired["swap_transfer"]
        if fired["skip_lookup"]:
            seen["skip"] += 1
            u = next(i for i, t in enumerate(task.turns) if any(
                spends_looked_up_balance(a, b) is not None for a, b in zip(t.gold, t.gold[1:])))
            assert len(played.turns[u].gold) < len(task.turns[u].gold)  # the lookup step is gone
            assert not ep.turn_passed[u] and counts["balance_lookup"][0] == 0 < counts["balance_lookup"][1]
            assert gold_counts["balance_lookup"][0] == gold_counts["balance_lookup"][1]
    assert seen["guess"] >= 5 and seen["swap"] >= 20 and seen["skip"] >= 5
    assert guesses_failed >= 0.6 * seen["guess"]
    # the behaviour rate sees the swaps (not those of mutually reverse transfers the gold also makes)
    assert swaps_seen >= 0.8 * swaps_fired


def test_rates_follow_the_configured_share():
    tasks = generate_tasks(400, seed=9, suite="bank")
    rng = random.Random(2)
    fired = [demonstration(t, Habits(guess_missing=0.6, skip_lookup=0.5, swap_transfer=0.3), rng)[1] for t in tasks]
    n_lookup = sum(spends_looked_up_balance(a, b) is not None for t in tasks for turn in t.turns
                   for a, b in zip(turn.gold, turn.gold[1:]))
    n_ask = sum(t.category == "miss_param" for t in tasks)
    n_transfer = sum(c.name == "transfer" for t in tasks for turn in t.turns for s in turn.gold for c in s)
    assert abs(sum(f["guess_missing"] for f in fired) / n_ask - 0.6) < 0.1
    assert abs(sum(f["skip_lookup"] for f in fired) / n_lookup - 0.5) < 0.12
    # a skipped lookup removes its transfer from the swap's reach only when both fire; roughly 0.3
    assert abs(sum(f["swap_transfer"] for f in fired) / n_transfer - 0.3) < 0.08


def test_behaviour_rates_pool_hits_over_opportunities():
    per_episode = [{"miss_param_ask": [1, 1], "transfer_swap": [0, 2], "miss_func_refuse": [0, 0], "balance_lookup": [0, 0]},
                   {"miss_param_ask": [0, 1], "transfer_swap": [2, 2], "miss_func_refuse": [0, 0], "balance_lookup": [0, 0]}]
    assert behaviour_rates(per_episode) == {"miss_param_ask": 0.5, "transfer_swap": 0.5}


def test_shuffle_permutes_reward_records_across_the_step_and_nothing_else():
    def episode(g, i):
        return Episode(f"t{g}", [g, i], [0, 1], [0.0, -1.0], [0, 2], 1, [i == 0], 1,
                       rewards={"outcome": float(i == 0), "progress": g + i / 10})

    groups = [EpisodeGroup(f"t{g}", f"t{g}#0", 0, [episode(g, i) for i in range(4)]) for g in range(3)]
    before = [dict(e.rewards) for g in groups for e in g.episodes]
    out = shuffle_episode_rewards(groups, random.Random(0))
    after = [e.rewards for g in out for e in g.episodes]
    assert [dict(e.rewards) for g in groups for e in g.episodes] == before  # inputs untouched
    assert sorted(map(str, after)) == sorted(map(str, before)) and after != before  # a permutation, not the identity
    assert {a["progress"] // 1 for a in after[:4]} != {0}  # records cross group boundaries
    assert [e.token_ids for g in out for e in g.episodes] == [e.token_ids for g in groups for e in g.episodes]
