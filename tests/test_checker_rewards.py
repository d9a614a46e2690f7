"""Per-turn checker and outcome/progress rewards: gold plans pass, perturbed plans fail."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.envs.builtin.generator import builtin_split
from agentrl.envs.checker import TurnCheck, check_turn, gold_replay
from agentrl.envs.registry import make_backend
from agentrl.rewards.outcome import outcome_reward, progress_reward
from agentrl.tasks.schema import Task, ToolCall

MUTATING = {"open_account", "deposit", "withdraw", "transfer", "create_event", "move_event", "cancel_event",
            "write_file", "copy_file", "delete_file"}


@pytest.fixture(scope="module")
def train() -> list[Task]:
    return builtin_split("train")


def play(task: Task, turns_calls: list[list[ToolCall]]) -> list[TurnCheck]:
    """Run a scripted 'model' (a list of calls per turn) and check every turn."""
    backend, gold = make_backend(task), gold_replay(task)
    checks = []
    for u, calls in enumerate(turns_calls):
        results = [(c, backend.execute(c)) for c in calls]
        checks.append(check_turn(task, u, backend.state(), results, gold=gold))
    return checks


def gold_calls(task: Task) -> list[list[ToolCall]]:
    return [task.gold_calls(u) for u in range(len(task.turns))]


def test_every_gold_trajectory_passes(train):
    for task in train:
        checks = play(task, gold_calls(task))
        assert all(c.passed for c in checks), (task.id, [c.reason for c in checks])
        passed = [c.passed for c in checks]
        assert outcome_reward(passed, len(task.turns)) == 1.0 and progress_reward(passed, len(task.turns)) == 1.0


def test_check_turn_without_precomputed_gold_matches(train):
    task = next(t for t in train if len(t.turns) >= 3)
    backend = make_backend(task)
    for u in range(len(task.turns)):
        results = [(c, backend.execute(c)) for c in task.gold_calls(u)]
        assert check_turn(task, u, backend.state(), results).passed
    with pytest.raises(IndexError):
        check_turn(task, len(task.turns), {}, [])


def _pick(train, data, cond):
    cands = [(t, u) for t in train for u in range(len(t.turns)) if cond(t, u)]
    return cands[data.draw(st.integers(0, len(cands) - 1), label="candidate")]  # an index keeps reports short


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.data())
def test_dropping_a_call_fails_that_turn(train, data):
    task, u = _pick(train, data, lambda t, u: len(t.gold_calls(u)) > 0)
    script = gold_calls(task)
    i = data.draw(st.integers(0, len(script[u]) - 1))
    script[u] = script[u][:i] + script[u][i + 1:]
    checks = play(task, script[: u + 1])
    assert all(c.passed for c in checks[:u]) and not checks[u].passed


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.data())
def test_changing_an_argument_of_a_state_change_fails(train, data):
    task, u = _pick(train, data, lambda t, u: any(c.name in MUTATING for c in t.gold_calls(u)))
    script = gold_calls(task)
    # The turn's last state change: nothing later in the turn can undo the difference.
    i = max(i for i, c in enumerate(script[u]) if c.name in MUTATING)
    call = script[u][i]
    key = data.draw(st.sampled_from(sorted(call.arguments)))
    value = call.arguments[key]
    if isinstance(value, int):
        new = value + 5
    elif value in ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"):
        new = "sunday" if value != "sunday" else "monday"
    else:
        new = value + "x"
    script[u][i] = ToolCall(name=call.name, arguments={**call.arguments, key: new})
    checks = play(task, script[: u + 1])
    assert not checks[u].passed and not checks[u].state_match, task.id


def test_state_change_on_an_empty_gold_turn_fails(train):
    tested = 0
    for task in train:
        for u, turn in enumerate(task.turns):
            if turn.gold:
                continue
            script = gold_calls(task)[: u + 1]
            # Do next turn's (state-changing) work early: exactly the mistake an eager agent makes.
            script[u] = task.gold_calls(u + 1)
            if not any(c.name in MUTATING for c in script[u]):
                continue
            checks = play(task, script)
            assert not checks[u].passed and not checks[u].state_match, task.id
            tested += 1
    assert tested >= 50


def test_extra_read_only_calls_and_reordering_pass(train):
    task = next(t for t in train if any(len(s) >= 2 for turn in t.turns for s in turn.gold)
                and "get_balance" in {s.name for s in t.tools})
    script = [list(reversed(c)) if len(c) >= 2 and len(task.turns[u].gold) == 1 else c
              for u, c in enumerate(gold_calls(task))]
    backend = make_backend(task)
    acc = next(iter(backend.state()["Bank"]["accounts"]))
    script[-1] = [ToolCall(name="get_balance", arguments={"account_id": acc}), ToolCall(name="nope")] + script[-1]
    assert all(c.passed for c in play(task, script))


def test_reason_names_the_difference(train):
    task = next(t for t in train if t.turns[0].gold and t.gold_calls(0)[0].name == "deposit")
    backend = make_backend(task)
    check = check_turn(task, 0, backend.state(), [])
    assert not check.passed and not check.state_match and not check.results_match
    assert "balance" in check.reason and "gold result" in check.reason


def test_rewards_count_missing_turns_as_failed():
    assert progress_reward([True, False, True, True], 4) == 0.75
    assert outcome_reward([True, False, True, True], 4) == 0.0
    assert progress_reward([True, True], 4) == 0.5  # truncated after two of four turns
    assert outcome_reward([True, True], 4) == 0.0
    assert outcome_reward([True, True, True], 3) == 1.0
    assert progress_reward([], 2) == 0.0 and outcome_reward([], 2) == 0.0
    with pytest.raises(ValueError):
        progress_reward([True, True, True], 2)
    with pytest.raises(ValueError):
        outcome_reward([], 0)


@given(st.lists(st.booleans(), max_size=6), st.integers(0, 4))
def test_reward_properties(passed, missing):
    n = len(passed) + missing
    if n == 0:
        return
    p, o = progress_reward(passed, n), outcome_reward(passed, n)
    assert 0.0 <= p <= 1.0 and o in (0.0, 1.0)
    assert (o == 1.0) == (p == 1.0) == (missing == 0 and all(passed))
