"""Behaviours: what an agent did at the decisions a habit concerns, counted per finished episode.

Success alone says whether RL helped; behaviour rates say *what* it changed. An environment (or a
plugin) registers each of its behaviours (``register_behaviour``): a function of a finished
episode and its task that returns ``(hits, opportunities)``. Every evaluation counts them
(``behaviour <name>`` in ``agentrl eval``'s summary, ``eval/behaviour/<name>`` in training), an
episode's record lists only those that had an opportunity in it (``episode_behaviours``), and a
rate sums hits and opportunities over episodes before dividing (``behaviour_rates``). The
quickstart's bank behaviours are registered this way by the builtin environment
(``envs/builtin/behaviours.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrl.common.registry import Registry, where
from agentrl.tasks.schema import Task

# fn(episode, task) -> (hits, opportunities), or None when the behaviour does not apply
BehaviourFn = Callable[[Any, Task], "tuple[int, int] | None"]
_BEHAVIOURS: Registry[tuple[BehaviourFn, str | None]] = Registry("behaviour")


def register_behaviour(name: str, fn: BehaviourFn, backend: str | None = None) -> BehaviourFn:
    """Count behaviour ``name`` in every evaluation: ``fn(episode, task)`` returns ``(hits,
    opportunities)`` for one finished episode (None or 0 opportunities: it does not apply).
    ``backend``: only tasks of that backend (None: every task). Returns ``fn``."""
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise ValueError(f"register_behaviour: name must be a non-empty string without '/', got {name!r}")
    if not callable(fn):
        raise TypeError(f"register_behaviour({name!r}): fn must be callable (episode, task) -> (hits, opportunities)")
    _BEHAVIOURS.add(name, (fn, backend), owner=where(fn))
    return fn


def episode_behaviours(task: Task, episode: Any) -> dict[str, list[int]]:
    """{behaviour: [hits, opportunities]} of one finished episode: every behaviour registered for
    the task's backend (or for every backend) that had an opportunity in it."""
    out: dict[str, list[int]] = {}
    for name, (fn, backend) in _BEHAVIOURS.items():
        if backend is None or backend == task.backend:
            counted = fn(episode, task)
            if counted is not None and counted[1] > 0:
                out[name] = [int(counted[0]), int(counted[1])]
    return out


def behaviour_rates(per_episode: list[dict[str, list[int]]]) -> dict[str, float]:
    """Pooled rate of each behaviour that had an opportunity at least once."""
    rates = {}
    for name in dict.fromkeys(n for c in per_episode for n in c):
        hits = sum(c[name][0] for c in per_episode if name in c)
        n = sum(c[name][1] for c in per_episode if name in c)
        if n:
            rates[name] = hits / n
    return rates
