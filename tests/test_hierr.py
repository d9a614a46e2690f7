"""HierR process score: hand-computed components, loose equality, and properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.rewards.hierr import (
    COMPONENTS,
    HierRWeights,
    loosely_equal,
    multiset_f1,
    process_components,
    process_reward,
)
from agentrl.tasks.schema import ToolCall


def c(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


def n_calls(turns) -> int:
    return sum(len(step) for turn in turns for step in turn)


# Turn 1: two parallel lookups, then a booking. Turn 2: ask (no calls). Turn 3: one call.
GOLD = [
    [[c("get_w", city="Oslo"), c("get_w", city="Bergen")], [c("book", id="A4100", n=55)]],
    [],
    [[c("cancel", id="A4100")]],
]


def comps(pred, gold=GOLD, n_blocks=None, n_valid=None):
    n = n_calls(pred)
    return process_components(pred, gold, n if n_blocks is None else n_blocks, n if n_valid is None else n_valid)


def test_perfect_episode_scores_one_everywhere():
    got = comps(GOLD)
    assert got == {k: 1.0 for k in COMPONENTS}
    assert process_reward(got) == pytest.approx(1.0)


def test_default_weights_are_the_papers_and_sum_to_one():
    w = HierRWeights()
    assert (w.format, w.name_f1, w.key_jaccard, w.value_match, w.parallel) == (0.10, 0.25, 0.15, 0.20, 0.30)
    assert sum((w.format, w.name_f1, w.key_jaccard, w.value_match, w.parallel)) == pytest.approx(1.0)


def test_wrong_name():
    got = process_components([[[c("get_x", city="Oslo")]]], [[[c("get_w", city="Oslo")]]], 1, 1)
    assert got == {"format": 1.0, "name_f1": 0.0, "key_jaccard": 0.0, "value_match": 0.0, "parallel": 1.0}
    assert process_reward(got) == pytest.approx(0.10 + 0.30)


def test_name_f1_is_a_multiset_f1():
    assert multiset_f1(["a", "b", "b"], ["a", "a", "b"]) == pytest.approx(2 * 2 / 6)
    assert multiset_f1([], []) == 1.0
    assert multiset_f1(["a"], []) == 0.0
    got = process_components([[[c("a"), c("a")]]], [[[c("a")]]], 2, 2)
    assert got["name_f1"] == pytest.approx(2 * 1 / 3)


def test_missing_key():
    got = process_components([[[c("book", id="a4100")]]], [[[c("book", id="A4100", n=55)]]], 1, 1)
    assert got["key_jaccard"] == pytest.approx(1 / 2)
    assert got["value_match"] == pytest.approx(1 / 2)  # id matches case-insensitively, n missing
    assert got["name_f1"] == 1.0 and got["parallel"] == 1.0


def test_extra_key_lowers_jaccard_not_values():
    got = process_components([[[c("book", id="A4100", n="55", note="x")]]], [[[c("book", id="A4100", n=55)]]], 1, 1)
    assert got["key_jaccard"] == pytest.approx(2 / 3)
    assert got["value_match"] == 1.0


def test_wrong_value():
    got = process_components([[[c("book", id="A4100", n=56)]]], [[[c("book", id="A4100", n=55)]]], 1, 1)
    assert got["key_jaccard"] == 1.0
    assert got["value_match"] == pytest.approx(1 / 2)
    assert process_reward(got) == pytest.approx(0.10 + 0.25 + 0.15 + 0.20 * 0.5 + 0.30)


def test_parallel_done_sequentially_and_vice_versa():
    parallel = [[[c("a", x=1), c("b", y=2)]]]
    sequential = [[[c("a", x=1)], [c("b", y=2)]]]
    got = process_components(sequential, parallel, 2, 2)
    assert got == {"format": 1.0, "name_f1": 1.0, "key_jaccard": 1.0, "value_match": 1.0, "parallel": 0.0}
    assert process_reward(got) == pytest.approx(0.70)
    assert process_components(parallel, sequential, 2, 2)["parallel"] == 0.0


def test_parallel_calls_matched_regardless_of_order():
    pred = [[[c("get_w", city="bergen"), c("get_w", city="OSLO")], [c("book", id="A4100", n=55.0)]], [],
            [[c("cancel", id="A4100")]]]
    assert comps(pred) == {k: 1.0 for k in COMPONENTS}


def test_each_predicted_call_matches_one_gold_call():
    got = process_components([[[c("get_w", city="Oslo")]]], [[[c("get_w", city="Oslo"), c("get_w", city="Oslo")]]], 1, 1)
    assert got["key_jaccard"] == pytest.approx(0.5) and got["value_match"] == pytest.approx(0.5)
    assert got["parallel"] == 0.0


def test_matching_stays_within_a_turn():
    gold = [[[c("a", x=1)]], [[c("b", y=1)]]]
    pred = [[], [[c("a", x=1)], [c("b", y=1)]]]
    got = process_components(pred, gold, 2, 2)
    assert got["name_f1"] == 1.0  # names are pooled over the episode
    assert got["key_jaccard"] == pytest.approx(0.5) and got["value_match"] == pytest.approx(0.5)
    assert got["parallel"] == pytest.approx(0.5)  # turn 1: no step; turn 2: 1 call vs 1


def test_early_stop_counts_missing_turns_as_no_calls():
    gold = [[[c("a", x=1)]], [[c("b", y=2)]]]
    got = process_components([[[c("a", x=1)]]], gold, 1, 1)
    assert got == {"format": 1.0, "name_f1": pytest.approx(2 / 3), "key_jaccard": 0.5, "value_match": 0.5, "parallel": 0.5}
    expected = 0.10 + 0.25 * 2 / 3 + 0.15 * 0.5 + 0.20 * 0.5 + 0.30 * 0.5
    assert process_reward(got) == pytest.approx(expected)


def test_format_component():
    assert comps(GOLD, n_blocks=4, n_valid=3)["format"] == pytest.approx(0.75)
    # No call blocks at all: perfect only if the gold wanted no calls either.
    assert process_components([[]], [[[c("a")]]], 0, 0)["format"] == 0.0
    ask_only = process_components([[]], [[]], 0, 0)
    assert ask_only == {k: 1.0 for k in COMPONENTS}


def test_gold_calls_without_arguments_are_not_scored_on_arguments():
    got = process_components([[[c("list", page=3)]]], [[[c("list")]]], 1, 1)
    assert got["key_jaccard"] == 1.0 and got["value_match"] == 1.0 and got["name_f1"] == 1.0


def test_accepts_toolcall_objects():
    gold = [[[ToolCall(name="a", arguments={"x": 1})]]]
    assert process_components([[[c("a", x="1")]]], gold, 1, 1) == {k: 1.0 for k in COMPONENTS}


def test_input_errors():
    with pytest.raises(ValueError, match="predicted turns"):
        process_components([[], []], [[]], 0, 0)
    with pytest.raises(ValueError, match="n_valid"):
        process_components([[]], [[]], 1, 2)
    with pytest.raises(ValueError, match="missing"):
        process_reward({"format": 1.0})
    with pytest.raises(ValueError):
        HierRWeights(format=-0.1)


def test_custom_weights_are_normalised():
    got = {"format": 1.0, "name_f1": 0.0, "key_jaccard": 0.0, "value_match": 0.0, "parallel": 1.0}
    w = HierRWeights(format=1, name_f1=1, key_jaccard=1, value_match=1, parallel=0)
    assert process_reward(got, w) == pytest.approx(0.25)


@pytest.mark.parametrize(
    "a, b, equal",
    [
        (20, 20.0, True),
        (20, "20", True),
        ("20.0", 20, True),
        (" 20 ", 20.0, True),
        (1000, "1e3", True),
        (0.1 + 0.2, 0.3, True),
        ("Oslo", " oslo ", True),
        (None, None, True),
        (None, "None", False),
        (None, 0, False),
        (True, 1, False),
        (True, True, True),
        ("true", True, False),
        ("007", "7", False),  # two strings compare as strings (ids keep their zeros)
        ("20", "20.0", False),
        ("abc", 1, False),
        ("nan", float("nan"), False),
        (10**400, 10**400, True),
        (10**400, "1", False),
        ([1, "a"], ["1", "A"], True),
        ([1, 2], [2, 1], False),
        ([1], [1, 1], False),
        ({"a": 1, "b": ["X"]}, {"b": ["x"], "a": "1"}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        (20, 21, False),
    ],
)
def test_loosely_equal(a, b, equal):
    assert loosely_equal(a, b) is equal
    assert loosely_equal(b, a) is equal


# ------------------------------------------------------------------------------------- properties

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("pq"), inner, max_size=2),
    max_leaves=5,
)
calls = st.builds(
    lambda n, a: {"name": n, "arguments": a}, st.sampled_from("abc"), st.dictionaries(st.sampled_from("xyz"), values, max_size=3)
)
turns = st.lists(st.lists(calls, max_size=3), max_size=3)
episodes = st.lists(turns, min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(gold=episodes, pred=episodes, data=st.data())
def test_components_and_reward_in_unit_interval(gold, pred, data):
    pred = pred[: len(gold)]
    n_blocks = data.draw(st.integers(0, 6))
    n_valid = data.draw(st.integers(0, n_blocks))
    got = process_components(pred, gold, n_blocks, n_valid)
    assert set(got) == set(COMPONENTS)
    assert all(0.0 <= v <= 1.0 for v in got.values())
    assert 0.0 <= process_reward(got) <= 1.0


@settings(max_examples=200, deadline=None)
@given(gold=episodes)
def test_gold_against_itself_scores_one(gold):
    n = n_calls(gold)
    got = process_components(gold, gold, n, n)
    assert got == {k: 1.0 for k in COMPONENTS}
    assert process_reward(got) == pytest.approx(1.0)


@given(st.fixed_dictionaries({k: st.floats(0, 1) for k in COMPONENTS}))
def test_process_reward_in_unit_interval(components):
    assert 0.0 <= process_reward(components) <= 1.0
