"""The name table behind every ``register_*`` (agentrl/common/registry.py), and that each
plugin-facing registry uses it: a name held by one definition, replaced by the same one, and an
unknown name reported with its close match."""

from __future__ import annotations

import pytest

from agentrl.common.registry import Registry, where


def first(x):
    return x


def second(x):
    return x


def test_a_name_is_held_by_one_definition_and_the_same_one_replaces_it():
    table: Registry[int] = Registry("widget")
    table.add("a", 1, owner=where(first))
    table.add("a", 2, owner=where(first))  # its module imported again
    assert table.get("a") == 2 and table.names() == ["a"] and "a" in table
    with pytest.raises(ValueError, match=r"widget 'a' is already registered by .*\.first; pick another name for .*\.second"):
        table.add("a", 3, owner=where(second))
    assert table.get("a") == 2


def test_an_unclaimed_registration_replaces_freely_and_gives_up_the_claim():
    table: Registry[int] = Registry("backend", {"builtin": 0})
    table.add("x", 1, owner=where(first))
    table.add("x", 2)  # agentrl's own re-registration (owner None) wins ...
    table.add("x", 3, owner=where(second))  # ... and leaves the name unclaimed
    assert table.items() == [("builtin", 0), ("x", 3)]


def test_unknown_names_get_the_close_match_and_the_known_ones():
    table: Registry[int] = Registry("reward")
    assert table.unknown("x") == "unknown reward 'x' (known: none)"
    table.add("goal_reached", 1)
    assert table.unknown("goal_reachd") == "unknown reward 'goal_reachd' (did you mean 'goal_reached'? known: goal_reached)"


def test_a_copy_is_independent():
    table: Registry[int] = Registry("method")
    table.add("a", 1, owner="m.A")
    scratch = table.copy()
    scratch.add("b", 2)
    with pytest.raises(ValueError):
        scratch.add("a", 9, owner="m.B")  # the claim came along
    assert table.names() == ["a"] and scratch.names() == ["a", "b"]


def test_the_plugin_registries_share_it():
    """Estimators, methods, backends, rewards, behaviours and task sources: one table type."""
    from agentrl.algos import registry as estimators
    from agentrl.envs import behaviours, sources
    from agentrl.envs import registry as backends
    from agentrl.methods import registry as methods
    from agentrl.rewards import registry as rewards

    tables = [estimators._REGISTRY, methods._REGISTRY, backends._BACKENDS, rewards._REWARDS, behaviours._BEHAVIOURS,
              sources.TASK_SOURCES]
    assert all(isinstance(t, Registry) for t in tables)
    with pytest.raises(ValueError, match="task source 'builtin' is already registered"):
        sources.register_task_source("builtin", first, "builtin:<mine>")
