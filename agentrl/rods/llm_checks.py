"""Deterministic parts of the ``llm`` synthesizer (``agentrl.rods.llm_synth``): reference
resolution, the text and argument gates, the data-flow walk of a gold plan, JSON-patch
application, and the "results only gained list items" test of the long_context augment."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

from agentrl.envs.builtin import TOOL_OWNERS
from agentrl.envs.checker import canonical, gold_replay
from agentrl.rods.llm_prompts import REF_RE
from agentrl.rods.signature import skill_signature
from agentrl.tasks.schema import Task, ToolCall


def scalars(value: Any) -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every non-null scalar leaf."""
    if isinstance(value, dict):
        for k, v in value.items():
            for p, s in scalars(v):
                yield (f"{k}.{p}" if p else str(k)), s
    elif isinstance(value, list):
        for i, v in enumerate(value):
            for p, s in scalars(v):
                yield (f"{i}.{p}" if p else str(i)), s
    elif value is not None:
        yield "", value


def said_in(value: Any, text: str) -> bool:
    """Whether ``text`` states ``value`` as a whole word, case-insensitively (an integral float
    also as an integer: 50.0 is said by "50")."""
    forms = [str(int(value)), str(value)] if isinstance(value, float) and value.is_integer() else [str(value).strip()]
    return any(re.search(rf"(?<!\w){re.escape(f)}(?!\w)", text, re.IGNORECASE) for f in forms if f)


def names_function(text: str, names: list[str]) -> str | None:
    """The first tool name ``text`` mentions as a function: an identifier-like name (with ``_``
    or camelCase) as a word, in any case, or any name written as a call, ``name(``. Plain-word
    names (``transfer``, ``grep``) used as words are ordinary language and pass."""
    for n in names:
        identifier = "_" in n or re.search(r"[a-z][A-Z]", n) is not None
        if identifier and re.search(rf"(?<!\w){re.escape(n)}(?!\w)", text, re.IGNORECASE):
            return n
        if re.search(rf"(?<![\w.]){re.escape(n)}\(", text):
            return n
    return None


def oversized(value: Any, max_chars: int, max_items: int) -> str | None:
    """``string_too_long`` / ``list_too_long`` for the first oversized string or list in
    ``value`` (recursively), else None."""
    if isinstance(value, str):
        return "string_too_long" if len(value) > max_chars else None
    if isinstance(value, list) and len(value) > max_items:
        return "list_too_long"
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return next((r for v in items if (r := oversized(v, max_chars, max_items))), None)


def calls_with_producers(task: Task) -> Iterator[tuple[int, int, ToolCall, Any, frozenset[str]]]:
    """(turn, call number, call, result, canonical scalars returned by earlier steps) in plan
    order, from one gold replay (raises if a gold call fails)."""
    gold = gold_replay(task)
    producers: set[str] = set()
    k = 0
    for u, turn in enumerate(task.turns):
        results = iter(gold[u].results)
        for step in turn.gold:
            new = []
            for call in step:
                result = next(results)
                yield u, k, call, result, frozenset(producers)
                new.append(result)
                k += 1
            producers |= {canonical(s) for r in new for _, s in scalars(r)}


def walk(task: Task) -> list[list[tuple[int, ToolCall, Any, list[str]]]]:
    """Per turn: (call number, call, result, arguments whose value an earlier result produced)."""
    out: list[list] = [[] for _ in task.turns]
    for u, k, call, result, produced in calls_with_producers(task):
        derived = [p for p, s in scalars(call.arguments) if canonical(s) in produced]
        out[u].append((k, call, result, derived))
    return out


def unstated_value(task: Task) -> tuple[int, str, Any] | None:
    """The first (turn, call name, value) of an argument the user never stated by that turn and
    no earlier result produced."""
    for u, _, call, _, produced in calls_with_producers(task):
        said = "\n".join(t.user for t in task.turns[: u + 1])
        for _, v in scalars(call.arguments):
            if isinstance(v, bool) or canonical(v) in produced or not re.search(r"[^\W_]", str(v)):
                continue
            if not said_in(v, said):
                return u, call.name, v
    return None


def apply_patch(state: dict[str, Any], ops: list[dict[str, Any]], roots: set[str]) -> dict[str, Any] | None:
    """``state`` with the JSON Patch add/replace ``ops`` applied, or None when an operation is
    outside ``roots`` (allowed top-level keys), replaces a whole root, or does not apply."""
    new = copy.deepcopy(state)
    for op in ops:
        path = op["path"]
        if not path.startswith("/"):
            return None
        parts = [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]
        if parts[0] not in roots or (len(parts) == 1 and (op["op"] == "replace" or parts[0] in new)):
            return None
        parent: Any = new
        for p in parts[:-1]:
            if isinstance(parent, dict) and p in parent:
                parent = parent[p]
            elif isinstance(parent, list) and p.isdigit() and int(p) < len(parent):
                parent = parent[int(p)]
            else:
                return None
        last, value = parts[-1], copy.deepcopy(op["value"])
        if isinstance(parent, dict):
            if op["op"] == "replace" and last not in parent:
                return None
            parent[last] = value
        elif isinstance(parent, list) and (last.isdigit() or (last == "-" and op["op"] == "add")):
            i = len(parent) if last == "-" else int(last)
            if op["op"] == "add" and i <= len(parent):
                parent.insert(i, value)
            elif op["op"] == "replace" and i < len(parent):
                parent[i] = value
            else:
                return None
        else:
            return None
    return new


def extends(old: Any, new: Any) -> bool:
    """``new`` says everything ``old`` says: equal, except that lists may have gained items."""
    if isinstance(old, dict) and isinstance(new, dict):
        return set(old) == set(new) and all(extends(old[k], new[k]) for k in old)
    if isinstance(old, list) and isinstance(new, list):
        pool = [canonical(x) for x in new]
        for x in old:
            if canonical(x) not in pool:
                return False
            pool.remove(canonical(x))
        return True
    return canonical(old) == canonical(new)


def tool_classes_of(task: Task) -> dict[str, str]:
    """Tool name -> backend class (builtin owners; BFCL's class docs; else the description's
    "belongs to the X" or the domain)."""
    if task.backend == "builtin":

        return {t.name: TOOL_OWNERS.get(t.name, task.domain) for t in task.tools}
    out: dict[str, str] = {}
    if task.backend == "bfcl":
        try:
            from agentrl.envs.bfcl.tasks import class_tools

            out = {t.name: c for c in task.initial_state.get("involved_classes", []) for t in class_tools(c)}
        except Exception:  # noqa: BLE001 - fall back to the descriptions
            out = {}
    for t in task.tools:
        if t.name not in out:
            m = re.match(r"This tool belongs to the (\w+)", t.function.description or "")
            out[t.name] = m.group(1) if m else task.domain
    return out


def signature_text(seed: Task, tool_class: dict[str, str]) -> str:
    """The seed's skill signature in words, for the planner (a hint: never enforced)."""
    try:

        s = skill_signature(seed)
        edges = ", ".join(f"call {i} -> call {j}" for i, j in s.edges) or "none"
        return (f"classes {', '.join(s.classes)}; {s.n_turns} turns; calls per turn {list(s.calls_per_turn)}; "
                f"results reused (data flow) {edges}; longest chain {s.depth}")
    except Exception:  # noqa: BLE001 - a signature is a hint for the planner, not a requirement
        return f"classes {', '.join(sorted(set(tool_class.values())))}; {len(seed.turns)} turns"


class RefError(ValueError):
    """A plan's ``"$K.path"`` reference that does not resolve."""


def resolve_refs(value: Any, results: list[Any]) -> Any:
    """``value`` with every reference string (``llm_prompts.REF_RE``) replaced by the scalar at
    its path in ``results[K]``; RefError when a reference points at a call that has not run, a
    missing key, or a non-scalar."""
    if isinstance(value, dict):
        return {k: resolve_refs(v, results) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_refs(v, results) for v in value]
    m = REF_RE.match(value) if isinstance(value, str) else None
    if m is None:
        return value
    k, path = int(m.group(1)), [p for p in m.group(2).split(".") if p]
    if k >= len(results):
        raise RefError(f"reference {value!r}: call {k} has not run before this call")
    out = results[k]
    for p in path:
        if isinstance(out, dict) and p in out:
            out = out[p]
        elif isinstance(out, list) and p.isdigit() and int(p) < len(out):
            out = out[int(p)]
        else:
            raise RefError(f"reference {value!r}: the result of call {k} has no {p!r}")
    if isinstance(out, (dict, list)) or out is None:
        raise RefError(f"reference {value!r} is not a single value")
    return out
