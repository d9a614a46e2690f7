"""RODS building blocks (docs/design.md §5): boundary statistics, seed selection, skill signatures."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.envs.builtin.generator import MAX_DEPTH, builtin_split, dependency_depth
from agentrl.envs.checker import canonical, gold_replay
from agentrl.rods import GroupStat, group_stat, phi, region, select_seeds, skill_signature, tool_classes


# ------------------------------------------------------------------ boundary statistics
def test_phi_hand_computed():
    assert phi(0.0) == 0.0 and phi(1.0) == 0.0 and phi(0.5) == 1.0
    assert phi(0.25) == pytest.approx(0.75)


def test_group_stat_hand_computed():
    s = group_stat("t", "base", [0, 0, 1, 1])
    assert (s.mean, s.phi, s.variance, s.n, s.region) == (0.5, 1.0, 0.25, 4, "boundary")
    s = group_stat("t", "base", [0.0] * 8)
    assert (s.mean, s.phi, s.variance, s.region) == (0.0, 0.0, 0.0, "too_hard")
    s = group_stat("t", "base", [1.0] * 8)
    assert (s.mean, s.phi, s.variance, s.region) == (1.0, 0.0, 0.0, "mastered")
    s = group_stat("t", "miss_func", [0.5, 1.0])  # r̄ = 0.75, var = 0.0625, φ = 4·0.75·0.25
    assert (s.mean, s.variance, s.phi, s.category) == (0.75, 0.0625, 0.75, "miss_func")


def test_regions_at_threshold_edges():
    assert region(0.20) == "boundary" and region(0.85) == "boundary"  # both edges inclusive
    assert region(0.1999) == "too_hard" and region(0.8501) == "mastered"
    assert group_stat("t", "base", [0.2, 0.2]).region == "boundary"
    assert group_stat("t", "base", [0.85]).region == "boundary"
    assert group_stat("t", "base", [0.5], low=0.6, high=0.9).region == "too_hard"
    with pytest.raises(ValueError):
        region(0.5, low=0.9, high=0.1)


@pytest.mark.parametrize("rewards", [[], [1.5], [-0.1], [math.nan]])
def test_group_stat_rejects_bad_rewards(rewards):
    with pytest.raises(ValueError):
        group_stat("t", "base", rewards)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=16))
def test_phi_bounds_variance_and_peaks_at_half(rewards):
    s = group_stat("t", "base", rewards)
    assert 0.0 <= s.phi <= 1.0 and s.phi <= phi(0.5)
    assert s.variance <= s.mean * (1 - s.mean) + 1e-9  # Bhatia–Davis: var <= r̄(1 − r̄) = φ/4
    assert s.phi == pytest.approx(phi(1 - s.mean))  # symmetric about 1/2


@settings(max_examples=60, deadline=None)
@given(st.floats(0, 1))
def test_phi_maximal_at_half(m):
    assert 0.0 <= phi(m) <= phi(0.5) == 1.0


# ------------------------------------------------------------------ seed selection
def _s(task_id: str, mean: float, category: str = "base", variance: float = 0.1,
       phi_: float | None = None) -> GroupStat:
    return GroupStat(task_id, category, mean, phi(mean) if phi_ is None else phi_, variance, 8, region(mean))


def test_select_orders_by_phi_then_variance_then_id():
    stats = [_s("a", 0.3, phi_=0.84), _s("b", 0.5), _s("c", 0.7, variance=0.2, phi_=0.84),
             _s("d", 0.7, phi_=0.84), _s("e", 0.4, phi_=0.96), _s("hard", 0.1), _s("easy", 0.9)]
    got = [s.task_id for s in select_seeds(stats, {}, step=0, quota_per_category=10, cooldown_steps=5)]
    # φ: b 1.0 > e 0.96 > c = a = d 0.84 (c has more variance; a before d by id)
    assert got == ["b", "e", "c", "a", "d"]


def test_select_quota_per_category():
    stats = [_s(f"b{i}", 0.2 + 0.05 * i, "base") for i in range(6)]  # r̄ 0.20 .. 0.45: φ rises with i
    stats += [_s("m0", 0.4, "miss_param"), _s("f0", 0.9, "miss_func")]  # f0 is mastered
    got = select_seeds(stats, {}, step=0, quota_per_category=2, cooldown_steps=0)
    assert [(s.category, s.task_id) for s in got] == [("base", "b5"), ("base", "b4"), ("miss_param", "m0")]
    assert select_seeds(stats, {}, step=0, quota_per_category=0, cooldown_steps=0) == []


def test_select_cooldown():
    stats = [_s("a", 0.5), _s("b", 0.4)]
    cooldown = {"a": 10}
    ids = lambda step: [s.task_id for s in select_seeds(stats, cooldown, step, 5, cooldown_steps=3)]  # noqa: E731
    assert ids(10) == ["b"] and ids(12) == ["b"]  # 12 - 10 = 2 < 3: still cooling down
    assert ids(13) == ["a", "b"]  # 13 - 10 = 3: free again
    assert [s.task_id for s in select_seeds(stats, cooldown, 10, 5, cooldown_steps=0)] == ["a", "b"]


def test_select_latest_entry_wins():
    stats = [_s("a", 0.5), _s("b", 0.4), _s("a", 0.95), _s("b", 0.1), _s("b", 0.45)]
    assert [s.task_id for s in select_seeds(stats, {}, 0, 5, 0)] == ["b"]  # a mastered by now
    got = select_seeds([_s("x", 0.1), _s("x", 0.5)], {}, 0, 5, 0)
    assert len(got) == 1 and got[0].mean == 0.5


# ------------------------------------------------------------------ skill signatures
@pytest.fixture(scope="module")
def train_tasks():
    return builtin_split("train")


def test_signature_deterministic_and_value_free(train_tasks):
    task = next(t for t in train_tasks if len(t.turns) >= 2)
    sig = skill_signature(task)
    assert sig == skill_signature(task) == skill_signature(task.model_copy(deep=True))
    assert hash(sig) == hash(skill_signature(task.model_copy(deep=True)))
    assert skill_signature(task.model_copy(update={"id": "other"})) == sig
    dropped = task.model_copy(update={"turns": task.turns[:-1]}, deep=True)
    assert skill_signature(dropped) != sig and skill_signature(dropped).n_turns == sig.n_turns - 1
    assert sig.calls_per_turn == tuple(len(task.gold_calls(u)) for u in range(len(task.turns)))
    assert sig.backend == "builtin" and sig.category == task.category


def test_signature_edges_consistent_on_builtin_train(train_tasks):
    sigs = [skill_signature(t) for t in train_tasks]
    assert len(set(sigs)) > 20  # signatures actually discriminate
    assert any(s.depth >= 2 for s in sigs) and any(s.edges for s in sigs)  # the checks below bite
    for task in train_tasks:
        sig = skill_signature(task)
        assert sig.depth <= MAX_DEPTH and sig.depth == dependency_depth(task)
        calls = [c for u in range(len(task.turns)) for c in task.gold_calls(u)]
        results = [r for g in gold_replay(task) for r in g.results]
        assert sum(sig.calls_per_turn) == len(calls)
        depth = [0] * len(calls)
        for i, j in sig.edges:  # edges point forward and carry a value from i's result to j's arguments
            assert 0 <= i < j < len(calls)
            depth[j] = max(depth[j], depth[i] + 1)
            produced = set(_scalars(results[i]))
            assert produced & set(_scalars(calls[j].arguments)), (task.id, i, j)
        assert max(depth, default=0) == sig.depth
        assert sig.classes == tool_classes(task) == tuple(sorted(task.initial_state))  # keyed by class


def _scalars(value):
    if isinstance(value, dict):
        return [s for v in value.values() for s in _scalars(v)]
    if isinstance(value, list):
        return [s for v in value for s in _scalars(v)]
    return [] if value is None or isinstance(value, bool) else [canonical(value)]


def test_signature_bfcl():
    pytest.importorskip("bfcl_eval", reason="optional dependency bfcl-eval is not installed")
    from agentrl.envs.bfcl.tasks import bfcl_tasks

    task = next(t for t in bfcl_tasks("base", "train") if len(t.initial_state["involved_classes"]) > 1)
    sig = skill_signature(task)
    assert sig.classes == tuple(sorted(task.initial_state["involved_classes"]))
    assert sig.backend == "bfcl" and sig.n_turns == len(task.turns) and sig.category == "base"
    assert sig == skill_signature(task.model_copy(deep=True))
