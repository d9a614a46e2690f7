"""Seeded generator of multi-turn builtin tasks (Bank, Calendar, FileStore).

Tasks are built by *executing* the plan while writing it: each operation picks entities and
values, runs its calls on a live backend, and renders one templated sentence. Ids therefore come
from real results, answer facts are real values, and a task can never carry a gold call that
fails. The language is deliberately small and regular (a ~2M-parameter model must learn it):

* entities from the initial state are named by what the user can know — an account by its id,
  an event by title and day, a file by its path; entities created in the conversation by a
  handle ("Alice's account", "the gym event", "notes.txt") or, right after they were mentioned
  alone, "that account" / "that event" / "that file";
* gold plans are minimal given what the conversation has revealed: a lookup (``find_file``,
  ``list_events``, ``get_balance``) is in the plan exactly when the needed id or balance was
  never shown, and questions are only asked about values the model cannot already know, so
  "answer from memory" and "call the tool" never disagree with the checker.

Categories: ``base``; ``miss_param`` (one value is left out, gold is empty, the next turn says
"The <slot> is <value>." and carries the calls); ``miss_func`` (the needed tool is withheld up to
and including that turn, gold is empty, the next turn repeats the request verbatim with the tool
visible again).
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agentrl.envs.builtin.ops import Op, PlanBuilder, Reject, Req, spends_looked_up_balance
from agentrl.envs.checker import canonical, gold_replay
from agentrl.envs.registry import builtin_tool_specs
from agentrl.tasks.schema import Task, Turn, text_key

CATEGORIES = (("base", 0.70), ("miss_param", 0.15), ("miss_func", 0.15))
DOMAIN_LABEL = {"Bank": "bank", "Calendar": "calendar", "FileStore": "files"}
MAX_DEPTH = 3
TRAIN_SEED, HELDOUT_SEED = 0, 1


@dataclass(frozen=True)
class Suite:
    """Which domains and categories a stream of tasks draws from. ``all`` is the full builtin suite;
    ``bank`` is the quickstart's: one domain whose values are digits (the tiny model copies digits
    far more reliably than words), with more miss_param turns, so that what the warm start gets
    wrong is a decision (ask or guess? look the balance up or assume it?) rather than a copy error."""

    name: str
    domains: tuple[str, ...]
    categories: tuple[tuple[str, float], ...]
    # Number of user turns, drawn uniformly from these; () = the default draw (see ``_draw``).
    turns: tuple[int, ...] = ()
    # Weights of 1, 2 and 3 calls in a turn that is not a miss_* pair; () = base_turn's own draw.
    calls: tuple[float, float, float] | tuple[()] = ()
    # Properties every task must have (names in ``REQUIREMENTS``); a draw without them is rejected.
    require: tuple[str, ...] = ()


SUITES = {
    "all": Suite("all", tuple(sorted(DOMAIN_LABEL)), CATEGORIES),
    "bank": Suite("bank", ("Bank",), (("base", 0.45), ("miss_param", 0.45), ("miss_func", 0.10))),
}
# Split name -> (suite, size). Held-out splits exclude every task whose user turns equal a train task's.
SPLITS = {"train": ("all", 400), "heldout": ("all", 200), "bank-train": ("bank", 400), "bank-heldout": ("bank", 200)}
SPLIT_SIZES = {name: size for name, (_, size) in SPLITS.items()}


# -- the method settings (docs/benchmarks.md, "Each method where its premise holds") -------------
def looks_up_before_spending(task: Task) -> bool:
    """Some turn's plan reads a balance (a lone ``get_balance`` step) and then spends it: the
    decision the warm start's ``skip_lookup`` habit gets wrong ("withdraw / move all the money")."""
    return any(spends_looked_up_balance(a, b) is not None for t in task.turns for a, b in zip(t.gold, t.gold[1:]))


def reports_facts(task: Task) -> bool:
    """Every turn needs calls and its answer must state at least two facts read from their results,
    one turn's at least three (each a value the tiny model must copy digit by digit)."""
    counts = [len(t.answer_facts) if t.gold else 0 for t in task.turns]
    return min(counts) >= 2 and max(counts) >= 3


REQUIREMENTS = {"lookup": looks_up_before_spending, "no_lookup": lambda t: not looks_up_before_spending(t),
                "reports_facts": reports_facts}
SUITES.update({
    # sparse success, where a dense process score helps exploration: every task has both decisions
    # the warm start gets wrong (ask for the missing value, look the balance up before spending it)
    # in 3-4 turns, all of which must pass.
    "bank-sparse": Suite("bank-sparse", ("Bank",), (("miss_param", 1.0),), turns=(3, 4), require=("lookup",)),
    # SLCA's cross-segment credit: two turns of two plain calls each (no lookup habit to fail),
    # whose answers state 2-4 values read from the results: the calls are mostly right, and the
    # answers go wrong on their own (digits copied wrong, a value left out).
    "bank-report": Suite("bank-report", ("Bank",), (("base", 1.0),), turns=(2,), calls=(0, 1, 0),
                         require=("no_lookup", "reports_facts")),
})
SPLITS.update({
    # RODS's pool-bound setting: a fixed pool of the first 4 bank-train tasks (same tasks, own ids);
    # the first 8, its earlier version, did not saturate in 26 epochs (docs/benchmarks.md)
    "bank-pool4": ("bank", 4), "bank-pool8": ("bank", 8),
    "bank-sparse-train": ("bank-sparse", 400), "bank-sparse-heldout": ("bank-sparse", 200),
    "bank-report-train": ("bank-report", 400), "bank-report-heldout": ("bank-report", 200),
})
SPLIT_SIZES.update({name: size for name, (_, size) in SPLITS.items()})


# -- turns --------------------------------------------------------------------------------------
def base_turn(b: PlanBuilder, target: int | None = None) -> Turn:
    """1-3 calls (``target``, drawn when None) from one or more operations, one sentence each."""
    if target is None:
        target = b.rng.choices((1, 2, 3), (0.4, 0.35, 0.25))[0]
    ops: list[Op] = []
    steps: list[list] = []
    last_touched: frozenset[str] = frozenset()
    n = 0
    for _ in range(6):
        if n >= target:
            break
        op = b.try_op(Req(max_calls=target - n), attempts=5)
        if op is None:
            continue
        # Independent single-step ops share a step (parallel calls); anything touching the same
        # id, day, path or id counter must come after, because order changes its results.
        if steps and len(op.steps) == 1 and not (op.touched & last_touched):
            steps[-1] = steps[-1] + op.steps[0]
            last_touched |= op.touched
        else:
            steps.extend(op.steps)
            last_touched = op.touched
        ops.append(op)
        n += sum(len(s) for s in op.steps)
    if not ops:
        raise Reject("no applicable operation")
    return Turn(user=" ".join(o.text for o in ops), gold=steps, answer_facts=_facts(ops))


def miss_turns(b: PlanBuilder, category: str, used_tools: set[str]) -> list[Turn]:
    """The empty-gold turn and its follow-up, both built from one single-call operation."""
    b.focus = None  # the follow-up may be far from its antecedent; name things fully
    if category == "miss_param":
        op = b.try_op(Req(single=True, need_missing=True))
        if op is None or op.missing is None:
            raise Reject("no operation with a missing slot")
        return [Turn(user=op.missing[0]), Turn(user=op.missing[1], gold=op.steps, answer_facts=_facts([op]))]
    op = b.try_op(Req(single=True, avoid_tools=frozenset(used_tools)))
    if op is None:
        raise Reject("no operation with an unused tool")
    tool = op.steps[0][0].name
    return [Turn(user=op.text, withheld_tools=[tool]), Turn(user=op.text, gold=op.steps, answer_facts=_facts([op]))]


def _facts(ops: list[Op]) -> list[str]:
    return list(dict.fromkeys(f for o in ops for f in o.facts))


# -- dependency depth ---------------------------------------------------------------------------
def _scalars(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _scalars(v)]
    if isinstance(value, list):
        return [s for v in value for s in _scalars(v)]
    return [] if value is None or isinstance(value, bool) else [value]


def _said(value: Any, text: str) -> bool:
    return re.search(rf"(?<![\w.-]){re.escape(str(value))}(?![\w-])", text) is not None


def dependency_edges(task: Task) -> tuple[list[tuple[int, int]], list[int]]:
    """Data-flow edges between gold calls and each call's depth (calls numbered in plan order).

    Edge i -> j when an argument value of call j equals a scalar returned by an earlier step's
    call i *and the user never stated that value* (turns <= j): a value the user typed is not
    evidence that the model copied it from a result, and small integers would otherwise link
    unrelated calls. Depth of a call: 0 without incoming edges, else 1 + max depth of its sources.
    """
    gold = gold_replay(task)
    producers: dict[str, list[int]] = {}
    edges: list[tuple[int, int]] = []
    depth: list[int] = []
    said = ""
    for u, turn in enumerate(task.turns):
        said += " " + turn.user
        results = iter(gold[u].results)
        for step in turn.gold:
            new: list[tuple[int, Any]] = []
            for call in step:
                j = len(depth)
                sources = sorted({i for v in _scalars(call.arguments) if not _said(v, said)
                                  for i in producers.get(canonical(v), [])})
                edges.extend((i, j) for i in sources)
                depth.append(1 + max(depth[i] for i in sources) if sources else 0)
                new.append((j, next(results)))
            for j, result in new:  # calls of one step cannot see each other's results
                for v in _scalars(result):
                    producers.setdefault(canonical(v), []).append(j)
    return edges, depth


def dependency_depth(task: Task) -> int:
    """Length of the longest data-flow chain in the gold plan (0 = no call copies a result)."""
    return max(dependency_edges(task)[1], default=0)


# -- tasks and splits ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """A fixed task shape for ``draw_shaped``: category, domain classes and calls per turn (in a
    miss_* task the empty-gold turn is the first 0; the turn after it is its single-call follow-up)."""

    category: str
    domains: tuple[str, ...]
    calls_per_turn: tuple[int, ...]


def _draw(rng: random.Random, shape: Shape | None = None, suite: Suite = SUITES["all"]) -> Task:
    if shape is None:
        category = rng.choices([c for c, _ in suite.categories], [w for _, w in suite.categories])[0]
        if len(suite.domains) == 1:
            domains = list(suite.domains)
        else:
            domains = sorted(rng.sample(sorted(suite.domains), rng.choices((1, 2), (0.7, 0.3))[0]))
        if suite.turns:
            n_turns = rng.choice(suite.turns)
        else:
            n_turns = rng.choice((1, 2, 2, 3, 3, 4) if category == "base" else (2, 3, 3, 4))
        miss_at = rng.randrange(n_turns - 1) if category != "base" else -1
    else:
        category, domains, n_turns = shape.category, sorted(shape.domains), len(shape.calls_per_turn)
        miss_at = shape.calls_per_turn.index(0) if category != "base" and 0 in shape.calls_per_turn else -1
        if category != "base" and miss_at < 0:
            raise ValueError(f"shape {shape}: a {category} task needs an empty-gold turn")
    builder = PlanBuilder(rng, domains)
    turns: list[Turn] = []
    while len(turns) < n_turns:
        if len(turns) == miss_at:
            used = {c.name for t in turns for step in t.gold for c in step}
            pair = miss_turns(builder, category, used)
            for t in turns:  # the schema wants a withheld tool hidden in every earlier turn too
                t.withheld_tools = list(pair[0].withheld_tools)
            turns.extend(pair)
        else:
            if shape:
                target = shape.calls_per_turn[len(turns)]
            else:  # None: base_turn's own draw
                target = rng.choices((1, 2, 3), suite.calls)[0] if suite.calls else None
            turns.append(base_turn(builder, target))
    task = Task(
        id="pending",
        domain="+".join(DOMAIN_LABEL[d] for d in domains),
        category=category,
        tools=builtin_tool_specs(domains),
        backend="builtin",
        initial_state=builder.initial_state,
        turns=turns,
    )
    if dependency_depth(task) > MAX_DEPTH:
        raise Reject("dependency chain too deep")
    if shape is None and any(not REQUIREMENTS[r](task) for r in suite.require):
        raise Reject(f"not every property of suite {suite.name!r}: {suite.require}")
    if canonical(gold_replay(task)[-1].state) != canonical(builder.backend.state()):
        raise RuntimeError("generator bug: replaying the gold plan does not reproduce the live state")
    return task


def draw_shaped(rng: random.Random, shape: Shape) -> Task:
    """One task of exactly ``shape``'s category and domains with, when the draw allows it, its
    calls per turn (operations may fall short of a turn's target: compare signatures to be sure).
    Raises ``Reject`` when this draw cannot make such a task; draw again from the same rng."""
    if any(not 0 <= c <= 3 for c in shape.calls_per_turn) or not shape.calls_per_turn:
        raise ValueError(f"shape {shape}: calls per turn must be 0..3, at least one turn")
    return _draw(rng, shape)


def _stream(seed: int, suite: str = "all") -> Iterator[Task]:
    """Endless deterministic stream of distinct tasks; task i depends only on (suite, seed, i)."""
    seen: set[tuple[str, ...]] = set()
    prefix = "agentrl-builtin" if suite == "all" else f"agentrl-builtin-{suite}"
    i = 0
    while True:
        rng = random.Random(f"{prefix}:{seed}:{i}")
        i += 1
        for _ in range(100):
            try:
                task = _draw(rng, suite=SUITES[suite])
                break
            except Reject:
                continue
        else:
            raise RuntimeError(f"generator could not draw task {i - 1} of seed {seed}")
        key = text_key(task)
        if key not in seen:
            seen.add(key)
            yield task


def generate_tasks(
    n: int, seed: int = 0, id_prefix: str = "builtin", exclude: set[tuple[str, ...]] | None = None, suite: str = "all"
) -> list[Task]:
    """``n`` distinct builtin tasks of ``suite`` (see ``SUITES``), ids ``{id_prefix}-00000``...;
    same arguments, same tasks. ``exclude`` holds text keys (the tuple of a task's user turns)
    that must not be produced.
    """
    if suite not in SUITES:
        raise ValueError(f"unknown builtin suite {suite!r}; expected one of {sorted(SUITES)}")
    out: list[Task] = []
    if n <= 0:
        return out
    for task in _stream(seed, suite):
        if exclude and text_key(task) in exclude:
            continue
        out.append(task.model_copy(update={"id": f"{id_prefix}-{len(out):05d}"}))
        if len(out) == n:
            return out
    return out  # pragma: no cover - the stream is endless


@functools.lru_cache(maxsize=None)
def _split(name: str) -> tuple[Task, ...]:
    suite, size = SPLITS[name]
    if not name.endswith("heldout"):
        return tuple(generate_tasks(size, TRAIN_SEED, f"builtin-{name}", suite=suite))
    train_keys = {text_key(t) for t in _split(name.replace("heldout", "train"))}
    return tuple(generate_tasks(size, HELDOUT_SEED, f"builtin-{name}", exclude=train_keys, suite=suite))


def builtin_split(name: str) -> list[Task]:
    """The fixed builtin splits (``SPLITS``): ``train`` (400 tasks) and ``heldout`` (200, no
    user-text overlap with train) of the full suite, and ``bank-train`` / ``bank-heldout`` of the
    quickstart's bank suite. Returns fresh copies, so callers may mutate them."""
    if name not in SPLIT_SIZES:
        raise ValueError(f"unknown builtin split {name!r}; expected one of {sorted(SPLIT_SIZES)}")
    return [t.model_copy(deep=True) for t in _split(name)]
