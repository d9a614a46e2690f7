"""What an agent did at the decisions a habit concerns: the per-behaviour breakdown of an evaluation.

Success alone says whether RL helped; these rates say *what* it changed. Each behaviour is counted
where it applies (``hits`` out of ``opportunities``) and summed over episodes before dividing:

* ``miss_param_ask`` — a miss_param turn (the user left a value out) that the agent answered
  without a state-changing call, i.e. asked instead of guessing (the checker's verdict on that turn);
* ``miss_func_refuse`` — a miss_func turn (the needed tool is withheld) closed without a
  state-changing call;
* ``balance_lookup`` — where the gold plan reads a balance before spending it ("move all the
  money from ..."), the agent called ``get_balance`` on that account in that turn;
* ``transfer_swap`` — a gold ``transfer`` call the agent made with payer and payee swapped.

Only turns the episode reached count. These four concern agentrl's own suites (tasks scored by
per-turn checks against gold plans); a task scored by a reward function gets none of them, only
the behaviours its plugin registers (``register_behaviour``), and an episode's record lists only
the behaviours that had an opportunity in it (``episode_behaviours``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrl.envs.builtin.ops import spends_looked_up_balance
from agentrl.rewards.registry import reward_name
from agentrl.tasks.schema import Task

BEHAVIOURS = ("miss_param_ask", "miss_func_refuse", "balance_lookup", "transfer_swap")

# fn(episode, task) -> (hits, opportunities), or None when the behaviour does not apply
BehaviourFn = Callable[[Any, Task], "tuple[int, int] | None"]
_PLUGIN_BEHAVIOURS: dict[str, tuple[BehaviourFn, str | None]] = {}


def register_behaviour(name: str, fn: BehaviourFn, backend: str | None = None) -> BehaviourFn:
    """A behaviour of a plugin's own, counted in every evaluation (``behaviour <name>`` in
    ``agentrl eval``'s summary, ``eval/behaviour/<name>`` in training): ``fn(episode, task)``
    returns ``(hits, opportunities)`` for one finished episode (None or 0 opportunities: it does
    not apply). ``backend``: only tasks of that backend (None: every task). Returns ``fn``."""
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise ValueError(f"register_behaviour: name must be a non-empty string without '/', got {name!r}")
    if name in BEHAVIOURS:
        raise ValueError(f"register_behaviour({name!r}): {list(BEHAVIOURS)} are agentrl's own; pick another name")
    if not callable(fn):
        raise TypeError(f"register_behaviour({name!r}): fn must be callable (episode, task) -> (hits, opportunities)")
    _PLUGIN_BEHAVIOURS[name] = (fn, backend)
    return fn


def episode_behaviours(task: Task, episode: Any) -> dict[str, list[int]]:
    """{behaviour: [hits, opportunities]} of one finished episode, only the behaviours that had an
    opportunity in it: agentrl's own (module docstring) for a task scored by per-turn checks, and
    every plugin behaviour registered for the task's backend."""
    out: dict[str, list[int]] = {}
    if reward_name(task) is None:
        out.update(behaviour_counts(task, episode.turn_passed, episode.calls))
    for name, (fn, backend) in _PLUGIN_BEHAVIOURS.items():
        if backend is None or backend == task.backend:
            counted = fn(episode, task)
            if counted is not None:
                hits, n = counted
                out[name] = [int(hits), int(n)]
    return {name: c for name, c in out.items() if c[1] > 0}


def behaviour_counts(task: Task, turn_passed: list[bool], calls: list[list[dict]]) -> dict[str, list[int]]:
    """{behaviour: [hits, opportunities]} for one episode (``calls``: per turn reached, the
    ``{name, arguments, ...}`` dicts the agent made)."""
    out = {name: [0, 0] for name in BEHAVIOURS}
    for u, turn in enumerate(task.turns[: len(turn_passed)]):
        if not turn.gold and task.category in ("miss_param", "miss_func"):
            key = "miss_func_refuse" if turn.withheld_tools else "miss_param_ask"
            out[key][0] += int(turn_passed[u])
            out[key][1] += 1
        made = calls[u] if u < len(calls) else []
        for lookup in (s[0] for s, nxt in zip(turn.gold, turn.gold[1:]) if spends_looked_up_balance(s, nxt) is not None):
            account = lookup.arguments["account_id"]
            out["balance_lookup"][0] += any(
                c.get("name") == "get_balance" and (c.get("arguments") or {}).get("account_id") == account for c in made)
            out["balance_lookup"][1] += 1
        gold_pairs = {(c.arguments["from_id"], c.arguments["to_id"]) for step in turn.gold for c in step if c.name == "transfer"}
        made_pairs = {((c.get("arguments") or {}).get("from_id"), (c.get("arguments") or {}).get("to_id"))
                      for c in made if c.get("name") == "transfer"}
        for payer, payee in gold_pairs:  # a reverse transfer that the gold plan also makes is no swap
            out["transfer_swap"][0] += (payee, payer) in made_pairs - gold_pairs
            out["transfer_swap"][1] += 1
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
