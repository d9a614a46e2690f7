"""Builtin domains, tool-schema derivation, the executable backend, and the task generator."""

from __future__ import annotations

import collections
import json
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.envs.builtin import BUILTIN_CLASSES, TOOL_OWNERS, Bank, Calendar, FileStore, ToolError
from agentrl.envs.builtin.generator import (
    builtin_split,
    dependency_depth,
    dependency_edges,
    generate_tasks,
)
from agentrl.envs.executable import ExecutableBackend
from agentrl.envs.registry import builtin_tool_specs, make_backend
from agentrl.envs.toolspec import function_spec, parse_google_docstring
from agentrl.tasks.schema import Task, ToolCall


# -- domains ------------------------------------------------------------------------------------
def test_bank_flow_and_errors():
    bank = Bank({"seq": 17})
    a = bank.open_account("Alice")["account_id"]
    b = bank.open_account("Bob")["account_id"]
    assert a != b and a[0] == "A" and len(a) == 5
    assert bank.deposit(a, 100) == {"balance": 100}
    assert bank.withdraw(a, 30) == {"balance": 70}
    assert bank.transfer(a, b, 20) == {"from_balance": 50, "to_balance": 20}
    assert bank.get_balance(b) == {"balance": 20}
    for bad in (lambda: bank.withdraw(a, 51), lambda: bank.deposit(a, 0), lambda: bank.deposit("A0000", 5),
                lambda: bank.transfer(a, a, 5), lambda: bank.open_account(" ")):
        with pytest.raises(ToolError):
            bad()
    assert bank.get_balance(a) == {"balance": 50}  # failed calls change nothing
    # The snapshot restores the domain, including the id sequence.
    clone = Bank(bank.snapshot())
    assert clone.snapshot() == bank.snapshot()
    assert clone.open_account("Carol") == bank.open_account("Carol")


def test_ids_are_deterministic_unique_and_not_consecutive():
    ids = [Bank({"seq": 5}).open_account("x")["account_id"] for _ in range(2)]
    assert ids[0] == ids[1]
    bank = Bank({"seq": 5})
    many = [bank.open_account("x")["account_id"] for _ in range(500)]
    assert len(set(many)) == 500
    nums = [int(i[1:]) for i in many]
    assert sum(1 for x, y in zip(nums, nums[1:]) if y == x + 1) == 0


def test_calendar_flow():
    cal = Calendar({})
    gym = cal.create_event("gym", "monday")["event_id"]
    lunch = cal.create_event("lunch", "monday")["event_id"]
    assert cal.list_events("monday") == {"events": [{"event_id": gym, "title": "gym"}, {"event_id": lunch, "title": "lunch"}]}
    assert cal.move_event(gym, "friday") == {"event_id": gym, "day": "friday"}
    with pytest.raises(ToolError):
        cal.move_event(gym, "friday")
    with pytest.raises(ToolError):
        cal.create_event("x", "someday")
    assert cal.cancel_event(lunch) == {"cancelled": lunch}
    assert cal.list_events("monday") == {"events": []}
    with pytest.raises(ToolError):
        cal.cancel_event(lunch)


def test_filestore_flow():
    fs = FileStore({"seq": 3})
    f = fs.write_file("notes.txt", "buy milk")["file_id"]
    with pytest.raises(ToolError):
        fs.write_file("notes.txt", "again")
    c = fs.copy_file(f, "copy.txt")["file_id"]
    assert fs.read_file(c) == {"path": "copy.txt", "text": "buy milk"}
    assert fs.find_file("copy.txt") == {"file_id": c}
    assert fs.delete_file(f) == {"deleted": f}
    with pytest.raises(ToolError):
        fs.find_file("notes.txt")


def test_tool_names_are_unique_and_small():
    for cls in BUILTIN_CLASSES.values():
        assert 4 <= len(cls.tool_names()) <= 5 and "snapshot" not in cls.tool_names()
    assert len(TOOL_OWNERS) == sum(len(c.tool_names()) for c in BUILTIN_CLASSES.values())


# -- toolspec -----------------------------------------------------------------------------------
def _sample(count: int, ratio: float, name: str, flag: bool, tags: list[str],
            mode: Literal["a", "b"], note: str | None = None) -> dict:
    """Do a sample thing.

    Longer explanation that is not part of the description.

    Args:
        count: How many.
        ratio (float): A ratio
            spanning two lines.
        name: The name.
        flag: A flag.
        tags: Some tags.
        mode: The mode.
        note: Optional note.

    Returns:
        Something.
    """
    return {}


def test_function_spec_types_docs_and_required():
    spec = function_spec(_sample).function
    assert spec.name == "_sample" and spec.description == "Do a sample thing."
    props = spec.parameters["properties"]
    assert props["count"] == {"type": "integer", "description": "How many."}
    assert props["ratio"] == {"type": "number", "description": "A ratio spanning two lines."}
    assert props["name"]["type"] == "string" and props["flag"]["type"] == "boolean"
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "description": "Some tags."}
    assert props["mode"] == {"type": "string", "enum": ["a", "b"], "description": "The mode."}
    assert props["note"] == {"type": "string", "description": "Optional note.", "default": None}
    assert spec.parameters["required"] == ["count", "ratio", "name", "flag", "tags", "mode"]
    assert spec.returns == {"type": "object"}


def test_function_spec_rejects_untyped_and_method_returns_typeddict():
    def untyped(x):  # noqa: ANN001
        """No types."""

    with pytest.raises(TypeError, match="x"):
        function_spec(untyped)
    spec = function_spec(Bank.transfer).function
    assert list(spec.parameters["properties"]) == ["from_id", "to_id", "amount"]
    assert spec.returns["properties"] == {"from_balance": {"type": "integer"}, "to_balance": {"type": "integer"}}
    assert parse_google_docstring(None) == ("", {})


def test_builtin_tool_specs():
    names = [s.name for s in builtin_tool_specs(["Calendar", "Bank"])]
    assert names == Calendar.tool_names() + Bank.tool_names()
    with pytest.raises(ValueError, match="Nope"):
        builtin_tool_specs(["Nope"])


# -- executable backend -------------------------------------------------------------------------
def _task(classes=("Bank",), initial_state=None, backend="builtin") -> Task:
    return Task(id="t", domain="x", tools=builtin_tool_specs(classes), backend=backend,
                initial_state=initial_state or {}, turns=[{"user": "hi"}])


def test_backend_dispatch_errors_and_state():
    init = {"Bank": {"seq": 1, "accounts": {"A1111": {"owner": "Zed", "balance": 40}}}}
    task = _task(("Bank", "Calendar"), init)
    be = make_backend(task)
    run = lambda name, **a: be.execute(ToolCall(name=name, arguments=a))  # noqa: E731
    assert run("deposit", account_id="A1111", amount=10) == {"balance": 50}
    assert run("deposit", account_id="A1111", amount=5.0) == {"balance": 55}  # integral float accepted as int
    assert "unknown tool" in run("fly")["error"]
    assert "write_file" in run("write_file", path="a", text="b")["error"]  # not a tool of this task
    assert "required" in run("deposit", account_id="A1111")["error"]
    assert "unexpected argument 'x'" in run("deposit", account_id="A1111", amount=1, x=1)["error"]
    assert "integer" in run("deposit", account_id="A1111", amount="5")["error"]
    assert "insufficient" in run("withdraw", account_id="A1111", amount=999)["error"]
    assert "'someday' is not one of" in run("list_events", day="someday")["error"]
    state = be.state()
    assert set(state) == {"Bank", "Calendar"} and state["Bank"]["accounts"]["A1111"]["balance"] == 55
    assert task.initial_state == init  # the task is never mutated
    assert make_backend(task).state()["Bank"]["accounts"]["A1111"]["balance"] == 40
    with pytest.raises(ValueError, match="'sgls-x'"):
        make_backend(_task(backend="sgls-x"))


json_values = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False)
                           | st.text(max_size=8),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                           max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(TOOL_OWNERS) + ["nope"]),
                          st.dictionaries(st.sampled_from(["account_id", "amount", "owner", "day", "title", "path",
                                                           "text", "file_id", "event_id", "from_id", "to_id", "zz"]),
                                          json_values, max_size=4)), max_size=8))
def test_backend_never_raises(calls):
    be = ExecutableBackend(_task(("Bank", "Calendar", "FileStore")))
    for name, args in calls:
        out = be.execute(ToolCall(name=name, arguments=args))
        json.dumps(out)
        assert isinstance(out, dict)
    json.dumps(be.state())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(-5, 80)), max_size=20))
def test_bank_conserves_money(moves):
    be = ExecutableBackend(_task())
    ids = [be.execute(ToolCall(name="open_account", arguments={"owner": o}))["account_id"] for o in "xyz"]
    for i in ids:
        be.execute(ToolCall(name="deposit", arguments={"account_id": i, "amount": 50}))
    for a, b, amt in moves:
        be.execute(ToolCall(name="transfer", arguments={"from_id": ids[a], "to_id": ids[b], "amount": amt}))
    balances = [acc["balance"] for acc in be.state()["Bank"]["accounts"].values()]
    assert sum(balances) == 150 and min(balances) >= 0


# -- generator ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def train() -> list[Task]:
    return builtin_split("train")


def test_generator_is_deterministic():
    a, b = generate_tasks(25, seed=7, id_prefix="g"), generate_tasks(25, seed=7, id_prefix="g")
    assert [t.model_dump() for t in a] == [t.model_dump() for t in b]
    assert [t.model_dump() for t in generate_tasks(10, seed=7, id_prefix="g")] == [t.model_dump() for t in a[:10]]
    assert [t.turns[0].user for t in generate_tasks(10, seed=8)] != [t.turns[0].user for t in a[:10]]
    assert a[3].id == "g-00003"


def test_splits_are_fixed_disjoint_and_sized(train):
    held = builtin_split("heldout")
    assert (len(train), len(held)) == (400, 200)
    keys = lambda ts: {tuple(u.user for u in t.turns) for t in ts}  # noqa: E731
    assert len(keys(train)) == 400 and len(keys(held)) == 200 and not keys(train) & keys(held)
    assert len({t.id for t in train + held}) == 600
    assert builtin_split("train")[0].model_dump() == train[0].model_dump()
    with pytest.raises(ValueError, match="valid"):
        builtin_split("valid")


def test_category_mix_shape_and_tools(train):
    mix = collections.Counter(t.category for t in train)
    assert 0.62 <= mix["base"] / 400 <= 0.78 and 0.09 <= mix["miss_param"] / 400 <= 0.21
    assert 0.09 <= mix["miss_func"] / 400 <= 0.21
    for t in train:
        assert t.backend == "builtin" and 1 <= len(t.turns) <= 4
        classes = set(t.initial_state)
        assert 1 <= len(classes) <= 2 and [s.name for s in t.tools] == [s.name for s in builtin_tool_specs(sorted(classes))]
        for u, turn in enumerate(t.turns):
            n = len(t.gold_calls(u))
            assert n <= 3 and (n >= 1 or t.category != "base")
            assert all(len(s) >= 1 for s in turn.gold)


def test_dependency_depth_reaches_three_and_never_more(train):
    depths = collections.Counter(dependency_depth(t) for t in train)
    assert max(depths) == 3 and depths[3] >= 3 and depths[2] >= 20 and depths[1] >= 100
    # A known chain: open_account -> deposit into the returned id.
    t = next(t for t in train for u in range(len(t.turns)) if [c.name for c in t.gold_calls(u)][:2] == ["open_account", "deposit"]
             and t.gold_calls(u)[1].arguments["account_id"] not in t.turns[u].user.split())
    edges, depth = dependency_edges(t)
    assert max(depth) >= 1 and edges


def test_miss_categories_structure(train):
    for t in train:
        empty = [u for u, turn in enumerate(t.turns) if not turn.gold]
        if t.category == "base":
            assert not empty and not any(turn.withheld_tools for turn in t.turns)
            continue
        (k,) = empty
        follow = t.turns[k + 1]
        assert len(t.gold_calls(k + 1)) == 1 and not t.turns[k].answer_facts
        if t.category == "miss_param":
            assert follow.user.startswith("The ") and follow.user.split(" is ")[1].rstrip(".").strip('"') in json.dumps(
                t.gold_calls(k + 1)[0].arguments)
        else:
            (tool,) = t.turns[k].withheld_tools
            assert all(turn.withheld_tools == [tool] for turn in t.turns[: k + 1])
            assert not any(turn.withheld_tools for turn in t.turns[k + 1:])
            assert follow.user == t.turns[k].user and t.gold_calls(k + 1)[0].name == tool
            assert all(c.name != tool for u in range(k) for c in t.gold_calls(u))


def test_answer_facts_come_from_results(train):
    from agentrl.envs.checker import canonical, gold_replay

    for t in train[:100]:
        for u, g in enumerate(gold_replay(t)):
            blob = canonical(g.results)
            assert all(f in blob for f in t.turns[u].answer_facts)
