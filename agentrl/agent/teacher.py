"""An imperfect teacher: gold demonstrations with systematic, checker-visible habits.

Agents are usually warm-started on logs of an earlier agent that was right most of the time but
had habits. RL is good at removing such habits: the right behaviour is already in the model's
distribution (the teacher showed it in the other demonstrations), so sampled episodes find it,
and the fix is one generic decision that transfers to unseen tasks. This module writes such logs
for the SFT warm start (``agentrl make-model``); each habit fires independently at its own rate
wherever it applies, and the rest of every demonstration stays gold:

* ``guess_missing`` — on a miss_param turn (the user left a value out; gold is to ask), the
  teacher calls the tool anyway with a guessed value. The checker fails that turn: a state-changing
  call was made where none was due.
* ``skip_lookup`` — where the plan looks a balance up before acting on it ("move all the money
  from ..."), the teacher skips the ``get_balance`` and acts on a guessed amount. The checker
  fails the turn: the wrong amount moves.
* ``swap_transfer`` — in a ``transfer`` call the teacher swaps the paying and the receiving
  account. The checker fails the turn: the balances differ from the gold state. (Off by default:
  on the tiny model it blurred the copying of account ids instead of teaching a clean swap.)

A turn in which a habit fired ends with a plain "Done." (its gold answer facts describe a state
the demonstration did not reach).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from agentrl.envs.builtin.calendar import DAYS
from agentrl.envs.builtin.ops import OWNERS, PATHS, TEXTS, spends_looked_up_balance
from agentrl.tasks.schema import Task, ToolCall, Turn


@dataclass(frozen=True)
class Habits:
    """Rate at which each habit fires where it applies (0 = the gold teacher)."""

    guess_missing: float = 0.0
    skip_lookup: float = 0.0
    swap_transfer: float = 0.0

    def any(self) -> bool:
        return any(v > 0 for v in asdict(self).values())


def _guess(value, rng: random.Random):
    """A plausible value of the same kind that is not the one the user will give."""
    if isinstance(value, int):
        return rng.choice([v for v in range(5, 205, 5) if v != value])
    for pool in (OWNERS, DAYS, PATHS, TEXTS):
        if value in pool:
            return rng.choice([v for v in pool if v != value])
    return rng.choice(TEXTS)


def _guessed_call(follow_up: Turn, rng: random.Random) -> ToolCall | None:
    """The follow-up turn's single call with the value its user text supplies replaced by a guess."""
    (call,) = follow_up.gold[0]
    args = dict(call.arguments)
    given = [k for k, v in args.items() if f" {v}." in follow_up.user or f'"{v}"' in follow_up.user]
    if not given:
        return None
    args[given[0]] = _guess(args[given[0]], rng)
    return ToolCall(name=call.name, arguments=args)


def _skip_lookups(gold: list[list[ToolCall]], rate: float, rng: random.Random) -> tuple[list[list[ToolCall]], int]:
    steps, fired, i = [], 0, 0
    while i < len(gold):
        spend = spends_looked_up_balance(gold[i], gold[i + 1]) if i + 1 < len(gold) else None
        if spend is not None and rng.random() < rate:
            step = list(gold[i + 1])
            step[spend] = ToolCall(name=step[spend].name,
                                   arguments={**step[spend].arguments, "amount": _guess(step[spend].arguments["amount"], rng)})
            steps.append(step)
            fired, i = fired + 1, i + 2
        else:
            steps.append(list(gold[i]))
            i += 1
    return steps, fired


def _swapped(call: ToolCall) -> ToolCall:
    args = dict(call.arguments)
    args["from_id"], args["to_id"] = args["to_id"], args["from_id"]
    return ToolCall(name=call.name, arguments=args)


def demonstration(task: Task, habits: Habits, rng: random.Random) -> tuple[Task, dict[str, int]]:
    """The plan the teacher plays for ``task`` (a copy with habit-altered turns), and how often
    each habit fired. The environment and checker still use the original task."""
    fired = {name: 0 for name in asdict(habits)}
    turns: list[Turn] = []
    for u, turn in enumerate(task.turns):
        new = turn.model_copy(deep=True)
        is_ask = task.category == "miss_param" and not turn.gold and not turn.withheld_tools and u + 1 < len(task.turns)
        if is_ask and rng.random() < habits.guess_missing:
            guess = _guessed_call(task.turns[u + 1], rng)
            if guess is not None:
                new.gold, new.answer_facts = [[guess]], []
                fired["guess_missing"] += 1
        new.gold, skipped = _skip_lookups(new.gold, habits.skip_lookup, rng)
        if skipped:
            new.answer_facts = []
            fired["skip_lookup"] += skipped
        steps = []
        for step in new.gold:
            out = []
            for call in step:
                if call.name == "transfer" and rng.random() < habits.swap_transfer:
                    call = _swapped(call)
                    new.answer_facts = []
                    fired["swap_transfer"] += 1
                out.append(call)
            steps.append(out)
        new.gold = steps
        turns.append(new)
    return task.model_copy(update={"turns": turns}), fired
