"""τ²-bench airline (50 tasks) and retail (114 tasks) as agentrl ``Task``s on SGLS.

What maps to what (``tau2_tasks(domain, split)``):

* id ``tau2-<domain>-<τ² id>``, domain ``tau2-<domain>``, backend ``"sgls"``, category ``base``;
  tools = ``agentrl.envs.tau2.tools.tool_specs(domain)`` (every task gets the domain's full tool set,
  as in τ²).
* One turn. τ² runs an LLM *user simulator* that reveals the scenario bit by bit; agentrl has none,
  so the user turn states the whole scenario at once: the τ² fields ``reason_for_call``,
  ``known_info``, ``unknown_info`` and ``task_instructions`` (verbatim, labelled, in that order,
  empty ones and ``"."`` left out; they are written to the user in the second person, which the
  header says), then — with ``preconfirm=True``, the default — one sentence granting the explicit
  confirmation the policy requires before any DB write (there is no later user turn that could
  give it, so without it a policy-following agent can never write). Conditional instructions
  ("if the agent says X, reply Y") are thereby shown upfront; that is the price of one turn.
* gold = τ²'s ``evaluation_criteria.actions`` in order, one call per step, *minus the actions that
  fail when replayed* on the shipped DB (reads of ids the simulated user gets wrong on purpose,
  e.g. retail 46's ``#9502126``, and two writes: retail 64's exchange of a still-pending order, and
  retail 105's only action, an exchange the user's gift card cannot pay for). A failing action
  changes nothing in the DB (checked in tests), so the gold end state is the same with or without
  them; they are listed by ``failed_gold_actions``.
* ``answer_facts`` = τ²'s ``communicate_info`` (strings the agent must say; τ²'s COMMUNICATE check,
  ``agentrl.envs.tau2.outcome.check_communicate``).
* ``initial_state`` = ``{"about_db": <one sentence>, "db": <excerpt>, "policy": <policy.md>}``. The
  policy is the agent's system prompt in τ² (agentrl's system prompt is per run, so it travels with
  the task). Key names are chosen so SGLS's sorted-key JSON of the state reads about_db, db, policy:
  when its ``max_state_chars`` cut applies, the policy (which the simulator does not need) is cut
  first. The excerpt is what SGLS needs to answer consistently, selected by this rule:

  - ids found in the scenario text, in the gold actions' arguments and in the gold actions'
    results (the gold actions are executed on a copy of the DB): user ids, reservation / order ids,
    flight numbers, product and item ids, emails, and (retail) a user whose first and last name and
    zip code all appear in the scenario;
  - every such user's full record and all of their reservations / orders (full records), and the
    owner of every referenced reservation / order;
  - airline: every flight of those reservations, in the gold arguments / results (search results
    included) or named in the scenario, with its ``dates`` cut down to the dates that occur with
    that flight (reservation legs, gold arguments, the searched date); a flight the scenario names,
    or one with no such date, also gets the dates the scenario names (``2024-05-26``, ``May 26``);
  - retail: every product referenced by id, and the product of every referenced item id (the items
    of the orders the gold actions looked at are referenced through those actions' results).

  Records keep the shipped DB's layout, keyed as in the DB (``{"users": {id: record}, ...}``).
  The checker never reads this excerpt: it replays calls on the full shipped DB.

Split: τ²'s ``split_tasks.json`` (``train`` / ``test``; ``full`` = every task, τ²'s ``base``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from typing import Any

from agentrl.envs.base import is_error
from agentrl.envs.tau2 import check_domain
from agentrl.envs.tau2.tools import base_db, cow_db, execute, policy, raw_tasks, splits, tool_specs
from agentrl.tasks.schema import Task, ToolCall, Turn

SPLITS = ("train", "test", "full")
ID_PREFIX = "tau2-"
ABOUT_DB = {
    "airline": ("db is an excerpt of the airline database: the records relevant to this conversation (flights "
                "only on the relevant dates). Other users, reservations, flights and dates exist but are not shown."),
    "retail": ("db is an excerpt of the retail database: the records relevant to this conversation. Other users, "
               "orders and products exist but are not shown."),
}
USER_HEADER = "Hello. Here is what I need; my notes are written to me, so \"you\" means me."
USER_FIELDS = (
    ("reason_for_call", "Why I am contacting you"),
    ("known_info", "What I know"),
    ("unknown_info", "What I do not know"),
    ("task_instructions", "How I want it handled"),
)
PRECONFIRM = ("I confirm in advance every action that carries out the request above, so you do not need to ask "
              "me to confirm before taking it.")

_TOKEN = re.compile(r"[#\w.@+-]+")
_ISO_DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")
_MONTH_DAY = re.compile(r"\bMay (\d{1,2})(?:st|nd|rd|th)?\b")


def task_id(domain: str, raw_id: str) -> str:
    return f"{ID_PREFIX}{domain}-{raw_id}"


def domain_of(task: Task) -> str:
    """``"airline"`` / ``"retail"`` from a task's domain ``tau2-<domain>``."""
    if not task.domain.startswith(ID_PREFIX):
        raise ValueError(f"task {task.id!r}: domain {task.domain!r} is not a τ² domain (tau2-airline, tau2-retail)")
    return check_domain(task.domain[len(ID_PREFIX):])


def raw_id_of(task: Task) -> str:
    prefix = f"{ID_PREFIX}{domain_of(task)}-"
    if not task.id.startswith(prefix):
        raise ValueError(f"task {task.id!r} does not come from τ² (ids are {prefix}<τ² id>)")
    return task.id[len(prefix):]


def user_text(instructions: dict[str, Any], preconfirm: bool = True) -> str:
    """The single user turn built from τ²'s ``user_scenario.instructions`` (see module docstring)."""
    parts = [USER_HEADER]
    for key, label in USER_FIELDS:
        value = (instructions.get(key) or "").strip()
        if value and value != ".":
            parts.append(f"{label}:\n{value}")
    if preconfirm:
        parts.append(PRECONFIRM)
    return "\n\n".join(parts)


# ---- gold replay --------------------------------------------------------------------------------


def _gold_trace(domain: str, raw: dict[str, Any]) -> list[tuple[dict[str, Any], Any]]:
    """Each τ² action with its observation, executed in order on one fresh DB."""
    actions = raw["evaluation_criteria"].get("actions") or []
    for a in actions:
        if a.get("requestor", "assistant") != "assistant":
            raise ValueError(f"τ² {domain} task {raw['id']}: action {a['action_id']} has requestor "
                             f"{a['requestor']!r}; only the agent's actions are supported")
    db = cow_db(domain)
    return [(a, execute(domain, db, {"name": a["name"], "arguments": a["arguments"]})) for a in actions]


# ---- reference scan and DB excerpt --------------------------------------------------------------


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _tokens(texts: Iterable[str]) -> set[str]:
    out = set()
    for text in texts:
        for tok in _TOKEN.findall(text):
            out.add(tok)
            out.add(tok.rstrip(".,;:"))
    return out


def _dates(texts: Iterable[str]) -> set[str]:
    out = set()
    for text in texts:
        out.update(_ISO_DATE.findall(text))
        out.update(f"2024-05-{int(d):02d}" for d in _MONTH_DAY.findall(text) if 1 <= int(d) <= 31)
    return out


def _flight_legs(value: Any, legs: dict[str, set[str]], default_date: str | None = None) -> None:
    """Collect (flight_number, date) pairs from any object carrying both (``date`` may be null in
    direct-search results: the searched date is used then)."""
    if isinstance(value, dict):
        fn = value.get("flight_number")
        if isinstance(fn, str):
            date = value.get("date") or default_date
            legs.setdefault(fn, set())
            if isinstance(date, str):
                legs[fn].add(date)
        for v in value.values():
            _flight_legs(v, legs, default_date)
    elif isinstance(value, list):
        for v in value:
            _flight_legs(v, legs, default_date)


@functools.lru_cache(maxsize=None)
def _item_index(domain: str) -> dict[str, str]:
    """retail item id -> product id."""
    db = base_db(domain)
    return {item: pid for pid, p in db["products"].items() for item in p["variants"]}


@functools.lru_cache(maxsize=None)
def _email_index(domain: str) -> dict[str, str]:
    return {u["email"].lower(): uid for uid, u in base_db(domain)["users"].items()}


def _airline_excerpt(scenario: list[str], trace: list[tuple[dict[str, Any], Any]]) -> dict[str, Any]:
    db = base_db("airline")
    values = [a["arguments"] for a, _ in trace] + [obs for _, obs in trace]
    tokens = _tokens(scenario) | _tokens(s for v in values for s in _strings(v))
    users = {t for t in tokens if t in db["users"]}
    reservations = {t for t in tokens if t in db["reservations"]}
    users |= {db["reservations"][r]["user_id"] for r in reservations}
    for u in users:
        reservations.update(r for r in db["users"][u]["reservations"] if r in db["reservations"])
    legs: dict[str, set[str]] = {}
    for r in reservations:
        _flight_legs(db["reservations"][r]["flights"], legs)
    for action, obs in trace:
        _flight_legs(action["arguments"], legs)
        searched = action["arguments"].get("date") if action["name"].startswith("search_") else None
        if not is_error(obs):
            _flight_legs(obs, legs, searched)
    named = {t for t in _tokens(scenario) if t in db["flights"]}
    for t in named:
        legs.setdefault(t, set())
    named_dates = _dates(scenario)
    flights = {}
    for fn in sorted(legs):
        if fn not in db["flights"]:
            continue
        flight = db["flights"][fn]
        dates = legs[fn] | (named_dates if fn in named or not legs[fn] else set())
        keep = sorted(dates & set(flight["dates"]))
        static = {k: v for k, v in flight.items() if k != "dates"}
        flights[fn] = {**static, "dates": {d: flight["dates"][d] for d in keep}}
    return {
        "users": {u: db["users"][u] for u in sorted(users)},
        "reservations": {r: db["reservations"][r] for r in sorted(reservations)},
        "flights": flights,
    }


def _retail_excerpt(scenario: list[str], trace: list[tuple[dict[str, Any], Any]]) -> dict[str, Any]:
    db = base_db("retail")
    values = [a["arguments"] for a, _ in trace] + [obs for _, obs in trace]
    tokens = _tokens(scenario) | _tokens(s for v in values for s in _strings(v))
    emails = _email_index("retail")
    users = {t for t in tokens if t in db["users"]} | {emails[t.lower()] for t in tokens if t.lower() in emails}
    text = " ".join(scenario).lower()
    for uid, u in db["users"].items():
        name = f"{u['name']['first_name']} {u['name']['last_name']}".lower()
        if name in text and u["address"]["zip"] in text:
            users.add(uid)
    orders = {t for t in tokens if t in db["orders"]}
    users |= {db["orders"][o]["user_id"] for o in orders}
    for u in users:
        orders.update(o for o in db["users"][u]["orders"] if o in db["orders"])
    items = _item_index("retail")
    products = {t for t in tokens if t in db["products"]} | {items[t] for t in tokens if t in items}
    return {
        "users": {u: db["users"][u] for u in sorted(users)},
        "orders": {o: db["orders"][o] for o in sorted(orders)},
        "products": {p: db["products"][p] for p in sorted(products)},
    }


def db_excerpt(domain: str, raw: dict[str, Any],
               trace: list[tuple[dict[str, Any], Any]] | None = None) -> dict[str, Any]:
    """The records of the shipped DB relevant to one τ² task (selection rule: module docstring);
    ``trace`` is ``_gold_trace(domain, raw)`` when the caller has it already."""
    scenario = [v for v in (raw["user_scenario"].get("instructions") or {}).values() if isinstance(v, str)]
    trace = _gold_trace(domain, raw) if trace is None else trace
    excerpt = (_airline_excerpt if domain == "airline" else _retail_excerpt)(scenario, trace)
    return json.loads(json.dumps(excerpt))  # a plain copy: it must not alias the package's cached DB


# ---- tasks --------------------------------------------------------------------------------------


def failed_gold_actions(domain: str, raw_id: str) -> list[dict[str, Any]]:
    """τ²'s gold actions of one task that fail when replayed (left out of ``Task`` gold), each as
    ``{"action_id", "name", "arguments", "error"}``."""
    raw = _raw(domain, raw_id)
    return [{"action_id": a["action_id"], "name": a["name"], "arguments": a["arguments"], "error": obs["error"]}
            for a, obs in _gold_trace(domain, raw) if is_error(obs)]


def _raw(domain: str, raw_id: str) -> dict[str, Any]:
    for t in raw_tasks(check_domain(domain)):
        if t["id"] == raw_id:
            return t
    raise KeyError(f"τ² {domain} has no task {raw_id!r}")


def raw_task(task: Task) -> dict[str, Any]:
    """The τ² task dict a ``Task`` was made from (read-only)."""
    return _raw(domain_of(task), raw_id_of(task))


def evaluation_criteria(task: Task) -> dict[str, Any]:
    """τ²'s ``evaluation_criteria`` of a task: ``actions``, ``communicate_info``,
    ``nl_assertions``, ``reward_basis`` (read-only)."""
    return raw_task(task)["evaluation_criteria"]


def raw_to_task(domain: str, raw: dict[str, Any], preconfirm: bool = True) -> Task:
    trace = _gold_trace(domain, raw)
    gold = [[ToolCall(name=a["name"], arguments=a["arguments"])] for a, obs in trace if not is_error(obs)]
    criteria = raw["evaluation_criteria"]
    return Task(
        id=task_id(domain, raw["id"]),
        domain=f"{ID_PREFIX}{domain}",
        tools=tool_specs(domain),
        backend="sgls",
        initial_state={"about_db": ABOUT_DB[domain], "db": db_excerpt(domain, raw, trace), "policy": policy(domain)},
        turns=[Turn(user=user_text(raw["user_scenario"]["instructions"], preconfirm), gold=gold,
                    answer_facts=list(criteria.get("communicate_info") or []))],
    )


@functools.lru_cache(maxsize=None)
def _domain_tasks(domain: str, preconfirm: bool) -> tuple[Task, ...]:
    return tuple(raw_to_task(domain, raw, preconfirm) for raw in raw_tasks(domain))


def tau2_tasks(domain: str, split: str = "full", *, preconfirm: bool = True) -> list[Task]:
    """τ² tasks of ``domain`` (airline or retail) and ``split`` (train, test or full), in τ²'s
    file order. Tasks are cached and shared between calls: treat them as read-only."""
    check_domain(domain)
    if split not in SPLITS:
        raise ValueError(f"unknown τ² split {split!r}; expected one of {list(SPLITS)}")
    tasks = _domain_tasks(domain, preconfirm)
    if split == "full":
        return list(tasks)
    keep = set(splits(domain)[split])
    return [t for t in tasks if raw_id_of(t) in keep]


def tau2_policy(domain: str) -> str:
    """The domain's agent policy (also ``task.initial_state["policy"]``): the system prompt."""
    return policy(check_domain(domain))
