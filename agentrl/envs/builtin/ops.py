"""One builtin task under construction: a live backend, its entities, and the operations.

An *operation* is one user request and the minimal gold plan for it (one call, or a lookup and
then the call). Each operation picks its entities and values, checks it fits the turn's
constraints (``Req``), and only then executes its calls on the live backend, so ids and answer
facts are real results. The builder also tracks what the conversation has revealed (ids,
balances, file texts, listed days): that decides whether a plan needs a lookup and which
questions are worth asking (see generator.py for the language conventions).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable

from agentrl.envs.base import is_error
from agentrl.envs.builtin.calendar import DAYS
from agentrl.envs.executable import ExecutableBackend
from agentrl.tasks.schema import ToolCall

OWNERS = ("Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy", "Karl",
          "Laura", "Mike", "Nina", "Oscar", "Paula", "Quinn", "Rita", "Sam", "Tina", "Uma", "Victor",
          "Wendy", "Yara", "Zoe")
TITLES = ("gym", "dentist", "lunch", "standup", "review", "yoga", "dinner", "meeting", "party", "class",
          "call", "interview", "workshop", "concert", "haircut", "football", "piano", "movie", "doctor",
          "brunch", "training", "demo", "checkup", "swim")
PATHS = tuple(f"{stem}{ext}" for stem in ("notes", "todo", "plan", "report", "draft", "budget", "ideas",
              "list", "memo", "log", "recipe", "poem", "story", "letter", "diary", "goals") for ext in (".txt", ".md"))
TEXTS = ("buy milk", "call mom", "pay rent", "water plants", "fix the bike", "book flights", "clean the desk",
         "send the report", "walk the dog", "read a book", "learn french", "bake bread", "plan the trip",
         "call the bank", "renew passport", "feed the cat", "buy stamps", "back up photos")


class Reject(Exception):
    """This draw cannot produce a valid task; the caller draws again from the same rng."""


@dataclass
class Entity:
    kind: str  # "account" | "event" | "file"
    id: str
    handle: str  # owner / title / path
    initial: bool
    known: bool  # has the id been shown in the conversation (user text or a result)?
    day: str = ""  # events
    value_known: bool = False  # account: balance shown; file: text shown


@dataclass
class Req:
    """Constraints on the next operation (a miss_* turn needs a single call, a slot, a fresh tool)."""

    max_calls: int = 3
    single: bool = False
    need_missing: bool = False
    avoid_tools: frozenset[str] = frozenset()


@dataclass
class Op:
    text: str
    steps: list[list[ToolCall]] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)
    touched: frozenset[str] = frozenset()  # ids / days / paths / id counters this op depends on or changes
    missing: tuple[str, str] | None = None  # (request without the value, "The <slot> is <value>.")


class PlanBuilder:
    """Live state of one task being drawn: backend, entities, and what the model has been shown."""

    def __init__(self, rng: random.Random, domains: list[str]) -> None:
        self.rng = rng
        self.domains = domains
        self.backend = ExecutableBackend.for_classes({d: {"seq": rng.randrange(9000)} for d in domains})
        self.entities: list[Entity] = []
        self.used: set[str] = set()  # owners, titles and paths ever used (never reused: no ambiguity)
        self.listed_days: set[str] = set()
        self.focus: Entity | None = None
        self._setup()
        self.initial_state = self.backend.state()

    # -- plumbing ------------------------------------------------------------------------------
    def _run(self, op: Op, *calls: tuple[str, dict[str, Any]]) -> list[Any]:
        step, results = [], []
        for name, args in calls:
            call = ToolCall(name=name, arguments=args)
            result = self.backend.execute(call)
            if is_error(result):
                raise RuntimeError(f"generator bug: {name}({args}) -> {result['error']}")
            step.append(call)
            results.append(result)
        op.steps.append(step)
        op.results.extend(results)
        return results

    def _fresh(self, pool: tuple[str, ...]) -> str:
        free = [x for x in pool if x not in self.used]
        if not free:
            raise Reject("name pool exhausted")
        value = self.rng.choice(free)
        self.used.add(value)
        return value

    def _pick(self, kind: str, cond: Callable[[Entity], bool] = lambda e: True) -> Entity | None:
        found = [e for e in self.entities if e.kind == kind and cond(e)]
        if self.focus in found and self.rng.random() < 0.5:  # keep talking about the same thing:
            return self.focus  # this is what builds data-flow chains (copy -> copy -> read)
        return self.rng.choice(found) if found else None

    def _amount(self, upto: int = 200) -> int:
        return self.rng.randrange(5, min(upto, 200) + 1, 5)

    def _that(self, e: Entity, noun: str, name: str) -> str:
        return f"that {noun}" if self.focus is e and e.known and self.rng.random() < 0.5 else name

    def _ref(self, e: Entity) -> str:
        if e.kind == "account":
            return f"account {e.id}" if e.initial else self._that(e, "account", f"{e.handle}'s account")
        if e.kind == "event":
            return self._that(e, "event", f"the {e.handle} event") if e.known else f"the {e.handle} event on {e.day}"
        return self._that(e, "file", e.handle)

    @staticmethod
    def _ok(req: Req, n_calls: int, tool: str, missing: tuple[str, str] | None) -> bool:
        return (n_calls <= req.max_calls and (n_calls == 1 or not req.single)
                and (missing is not None or not req.need_missing) and tool not in req.avoid_tools)

    def _setup(self) -> None:
        """Create the initial entities through the tools themselves, then snapshot."""
        op = Op("")
        if "Bank" in self.domains:
            for _ in range(self.rng.randint(2, 3)):
                owner = self._fresh(OWNERS)
                (r,) = self._run(op, ("open_account", {"owner": owner}))
                self._run(op, ("deposit", {"account_id": r["account_id"], "amount": self.rng.randrange(20, 310, 10)}))
                self.entities.append(Entity("account", r["account_id"], owner, initial=True, known=True))
        if "Calendar" in self.domains:
            for _ in range(self.rng.randint(2, 4)):
                title, day = self._fresh(TITLES), self.rng.choice(DAYS)
                (r,) = self._run(op, ("create_event", {"title": title, "day": day}))
                self.entities.append(Entity("event", r["event_id"], title, initial=True, known=False, day=day))
        if "FileStore" in self.domains:
            for _ in range(self.rng.randint(2, 3)):
                path = self._fresh(PATHS)
                (r,) = self._run(op, ("write_file", {"path": path, "text": self.rng.choice(TEXTS)}))
                self.entities.append(Entity("file", r["file_id"], path, initial=True, known=False))

    # -- bank ----------------------------------------------------------------------------------
    def _balance(self, e: Entity) -> int:
        return self.backend.instances["Bank"].records[e.id]["balance"]

    def op_open(self, req: Req) -> Op | None:
        owner = self.rng.choice([o for o in OWNERS if o not in self.used] or [""])
        missing = ("Open a new account.", f"The owner is {owner}.")
        if not owner or not self._ok(req, 1, "open_account", missing):
            return None
        self.used.add(owner)
        op = Op(f"Open an account for {owner}.", missing=missing)
        (r,) = self._run(op, ("open_account", {"owner": owner}))
        e = Entity("account", r["account_id"], owner, initial=False, known=True, value_known=True)
        self.entities.append(e)
        op.facts, op.touched, self.focus = [r["account_id"]], frozenset({"seq:Bank", e.id}), e
        return op

    def _single_amount_op(self, req: Req, tool: str, verb: str, prep: str, need_funds: bool) -> Op | None:
        e = self._pick("account", lambda a: self._balance(a) >= 5 or not need_funds)
        if e is None:
            return None
        amount = self._amount(self._balance(e) if need_funds else 200)
        ref = self._ref(e)
        missing = (f"{verb} money {prep} {ref}.", f"The amount is {amount}.")
        if not self._ok(req, 1, tool, missing):
            return None
        op = Op(f"{verb} {amount} {prep} {ref}.", missing=missing)
        (r,) = self._run(op, (tool, {"account_id": e.id, "amount": amount}))
        e.value_known, self.focus = True, e
        op.facts, op.touched = [str(r["balance"])], frozenset({e.id})
        return op

    def op_deposit(self, req: Req) -> Op | None:
        return self._single_amount_op(req, "deposit", "Deposit", "into", need_funds=False)

    def op_withdraw(self, req: Req) -> Op | None:
        return self._single_amount_op(req, "withdraw", "Withdraw", "from", need_funds=True)

    def op_transfer(self, req: Req) -> Op | None:
        a = self._pick("account", lambda x: self._balance(x) >= 5)
        b = a and self._pick("account", lambda x: x is not a)
        if a is None or b is None:
            return None
        amount = self._amount(self._balance(a))
        ra, rb = self._ref(a), self._ref(b)
        missing = (f"Transfer money from {ra} to {rb}.", f"The amount is {amount}.")
        if not self._ok(req, 1, "transfer", missing):
            return None
        op = Op(f"Transfer {amount} from {ra} to {rb}.", missing=missing)
        (r,) = self._run(op, ("transfer", {"from_id": a.id, "to_id": b.id, "amount": amount}))
        a.value_known = b.value_known = True
        op.facts, op.touched, self.focus = [str(r["from_balance"]), str(r["to_balance"])], frozenset({a.id, b.id}), None
        return op

    def op_balance(self, req: Req) -> Op | None:
        e = self._pick("account", lambda a: not a.value_known)
        if e is None or not self._ok(req, 1, "get_balance", None):
            return None
        op = Op(f"What is the balance of {self._ref(e)}?")
        (r,) = self._run(op, ("get_balance", {"account_id": e.id}))
        e.value_known, self.focus = True, e
        op.facts, op.touched = [str(r["balance"])], frozenset({e.id})
        return op

    def op_withdraw_all(self, req: Req) -> Op | None:
        e = self._pick("account", lambda a: not a.value_known and self._balance(a) > 0)
        if e is None or not self._ok(req, 2, "withdraw", None):
            return None
        op = Op(f"Withdraw all the money from {self._ref(e)}.")
        (r,) = self._run(op, ("get_balance", {"account_id": e.id}))
        self._run(op, ("withdraw", {"account_id": e.id, "amount": r["balance"]}))
        e.value_known, self.focus = True, e
        op.facts, op.touched = [str(r["balance"])], frozenset({e.id})
        return op

    def op_move_all(self, req: Req) -> Op | None:
        a = self._pick("account", lambda x: not x.value_known and self._balance(x) > 0)
        b = a and self._pick("account", lambda x: x is not a)
        if a is None or b is None or not self._ok(req, 2, "transfer", None):
            return None
        op = Op(f"Move all the money from {self._ref(a)} to {self._ref(b)}.")
        (r,) = self._run(op, ("get_balance", {"account_id": a.id}))
        (t,) = self._run(op, ("transfer", {"from_id": a.id, "to_id": b.id, "amount": r["balance"]}))
        a.value_known = b.value_known = True
        op.facts, op.touched, self.focus = [str(r["balance"]), str(t["to_balance"])], frozenset({a.id, b.id}), None
        return op

    # -- calendar ------------------------------------------------------------------------------
    def _lookup_event(self, op: Op, e: Entity) -> None:
        """Run ``list_events`` on the event's day; every event listed becomes known."""
        (r,) = self._run(op, ("list_events", {"day": e.day}))
        self._mark_listed(e.day, r)

    def _mark_listed(self, day: str, result: dict[str, Any]) -> None:
        self.listed_days.add(day)
        ids = {ev["event_id"] for ev in result["events"]}
        for ent in self.entities:
            if ent.id in ids:
                ent.known = True

    def op_create(self, req: Req) -> Op | None:
        title = self.rng.choice([t for t in TITLES if t not in self.used] or [""])
        day = self.rng.choice(DAYS)
        missing = (f"Create an event called {title}.", f"The day is {day}.")
        if not title or not self._ok(req, 1, "create_event", missing):
            return None
        self.used.add(title)
        op = Op(f"Create an event called {title} on {day}.", missing=missing)
        (r,) = self._run(op, ("create_event", {"title": title, "day": day}))
        e = Entity("event", r["event_id"], title, initial=False, known=True, day=day)
        self.entities.append(e)
        op.facts, op.touched, self.focus = [r["event_id"]], frozenset({"seq:Calendar", f"day:{day}", e.id}), e
        return op

    def op_list(self, req: Req) -> Op | None:
        busy = sorted({e.day for e in self.entities if e.kind == "event"} - self.listed_days)
        free = [d for d in DAYS if d not in self.listed_days]
        day = self.rng.choice(busy if busy and self.rng.random() < 0.8 else free or [""])
        if not day or not self._ok(req, 1, "list_events", None):
            return None
        op = Op(f"What events are on {day}?")
        (r,) = self._run(op, ("list_events", {"day": day}))
        self._mark_listed(day, r)
        op.facts, op.touched, self.focus = [ev["title"] for ev in r["events"]], frozenset({f"day:{day}"}), None
        return op

    def op_move(self, req: Req) -> Op | None:
        e = self._pick("event")
        if e is None:
            return None
        new_day = self.rng.choice([d for d in DAYS if d != e.day])
        ref, n = self._ref(e), 1 if e.known else 2
        missing = (f"Move {ref} to a new day.", f"The day is {new_day}.") if e.known else None
        if not self._ok(req, n, "move_event", missing):
            return None
        op = Op(f"Move {ref} to {new_day}.", missing=missing)
        op.touched = frozenset({e.id, f"day:{e.day}", f"day:{new_day}"})
        if not e.known:
            self._lookup_event(op, e)
        self._run(op, ("move_event", {"event_id": e.id, "day": new_day}))
        e.day, self.focus = new_day, e
        return op

    def op_cancel(self, req: Req) -> Op | None:
        e = self._pick("event")
        if e is None or not self._ok(req, 1 if e.known else 2, "cancel_event", None):
            return None
        op = Op(f"Cancel {self._ref(e)}.", touched=frozenset({e.id, f"day:{e.day}"}))
        if not e.known:
            self._lookup_event(op, e)
        self._run(op, ("cancel_event", {"event_id": e.id}))
        self.entities.remove(e)
        self.focus = None
        return op

    # -- files ---------------------------------------------------------------------------------
    def _find(self, op: Op, e: Entity) -> None:
        if not e.known:
            self._run(op, ("find_file", {"path": e.handle}))
            e.known = True

    def op_write(self, req: Req) -> Op | None:
        path = self.rng.choice([p for p in PATHS if p not in self.used] or [""])
        text = self.rng.choice(TEXTS)
        missing = (f"Create a new file {path}.", f'The text is "{text}".')
        if not path or not self._ok(req, 1, "write_file", missing):
            return None
        self.used.add(path)
        op = Op(f'Write "{text}" to a new file {path}.', missing=missing)
        (r,) = self._run(op, ("write_file", {"path": path, "text": text}))
        e = Entity("file", r["file_id"], path, initial=False, known=True, value_known=True)
        self.entities.append(e)
        op.facts, op.touched, self.focus = [r["file_id"]], frozenset({"seq:FileStore", f"path:{path}", e.id}), e
        return op

    def op_read(self, req: Req) -> Op | None:
        e = self._pick("file", lambda f: not f.value_known)
        if e is None or not self._ok(req, 1 if e.known else 2, "read_file", None):
            return None
        op = Op(f"What is in {self._ref(e)}?", touched=frozenset({e.id, f"path:{e.handle}"}))
        self._find(op, e)
        (r,) = self._run(op, ("read_file", {"file_id": e.id}))
        e.value_known, self.focus, op.facts = True, e, [r["text"]]
        return op

    def op_copy(self, req: Req) -> Op | None:
        e = self._pick("file")
        path = self.rng.choice([p for p in PATHS if p not in self.used] or [""])
        if e is None or not path:
            return None
        ref = self._ref(e)
        missing = (f"Make a copy of {ref}.", f"The new path is {path}.") if e.known else None
        if not self._ok(req, 1 if e.known else 2, "copy_file", missing):
            return None
        self.used.add(path)
        op = Op(f"Copy {ref} to {path}.", missing=missing)
        op.touched = frozenset({e.id, f"path:{e.handle}", f"path:{path}", "seq:FileStore"})
        self._find(op, e)
        (r,) = self._run(op, ("copy_file", {"file_id": e.id, "path": path}))
        new = Entity("file", r["file_id"], path, initial=False, known=True, value_known=e.value_known)
        self.entities.append(new)
        op.facts, self.focus = [r["file_id"]], new
        return op

    def op_delete(self, req: Req) -> Op | None:
        e = self._pick("file")
        if e is None or not self._ok(req, 1 if e.known else 2, "delete_file", None):
            return None
        op = Op(f"Delete {self._ref(e)}.", touched=frozenset({e.id, f"path:{e.handle}"}))
        self._find(op, e)
        self._run(op, ("delete_file", {"file_id": e.id}))
        self.entities.remove(e)
        self.focus = None
        return op

    def op_find(self, req: Req) -> Op | None:
        e = self._pick("file", lambda f: not f.known)
        if e is None or not self._ok(req, 1, "find_file", None):
            return None
        op = Op(f"What is the id of {e.handle}?", touched=frozenset({f"path:{e.handle}"}))
        (r,) = self._run(op, ("find_file", {"path": e.handle}))
        e.known, self.focus, op.facts = True, e, [r["file_id"]]
        return op

    # -- choosing operations ---------------------------------------------------------------------
    OPS: dict[str, tuple[tuple[str, int], ...]] = {
        "Bank": (("op_open", 2), ("op_deposit", 2), ("op_withdraw", 1), ("op_transfer", 2), ("op_balance", 1),
                 ("op_withdraw_all", 1), ("op_move_all", 1)),
        "Calendar": (("op_create", 2), ("op_list", 1), ("op_move", 2), ("op_cancel", 1)),
        "FileStore": (("op_write", 2), ("op_read", 1), ("op_copy", 3), ("op_delete", 1), ("op_find", 1)),
    }

    def try_op(self, req: Req, attempts: int = 20) -> Op | None:
        for _ in range(attempts):
            names, weights = zip(*self.OPS[self.rng.choice(self.domains)])
            op = getattr(self, self.rng.choices(names, weights)[0])(req)
            if op is not None:
                return op
        return None


def spends_looked_up_balance(lookup: list[ToolCall], step: list[ToolCall]) -> int | None:
    """Index in ``step`` of the call that spends the balance that ``lookup`` (the previous step, a
    lone ``get_balance``) read: the plans of "withdraw / move all the money from ..."; else None."""
    if len(lookup) != 1 or lookup[0].name != "get_balance":
        return None
    account = lookup[0].arguments["account_id"]
    for i, call in enumerate(step):
        if (call.name == "transfer" and call.arguments["from_id"] == account) or (
                call.name == "withdraw" and call.arguments["account_id"] == account):
            return i
    return None
