"""The quickstart's behaviours, registered like any environment's (``envs/behaviours.py``): what
the bank suite's habits concern, counted where they apply (``hits`` out of ``opportunities``):

* ``miss_param_ask`` — a miss_param turn (the user left a value out) that the agent answered
  without a state-changing call, i.e. asked instead of guessing (the checker's verdict on that turn);
* ``miss_func_refuse`` — a miss_func turn (the needed tool is withheld) closed without a
  state-changing call;
* ``balance_lookup`` — where the gold plan reads a balance before spending it ("move all the
  money from ..."), the agent called ``get_balance`` on that account in that turn;
* ``transfer_swap`` — a gold ``transfer`` call the agent made with payer and payee swapped.

Only turns the episode reached count, and only on builtin tasks scored by per-turn checks against
their gold plans (a builtin task with a reward function of its own gets none of them).
"""

from __future__ import annotations

from agentrl.envs.behaviours import register_behaviour
from agentrl.envs.builtin.ops import spends_looked_up_balance
from agentrl.tasks.schema import Task

BEHAVIOURS = ("miss_param_ask", "miss_func_refuse", "balance_lookup", "transfer_swap")


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


def _counter(name: str):
    def count(episode, task: Task) -> tuple[int, int] | None:
        """Behaviour ``name`` of one episode, or None for a task scored by a reward function."""
        if task.reward is not None:
            return None
        hits, n = behaviour_counts(task, episode.turn_passed, episode.calls)[name]
        return hits, n
    return count


for _name in BEHAVIOURS:
    register_behaviour(_name, _counter(_name), backend="builtin")
