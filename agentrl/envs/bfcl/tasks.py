"""BFCL v4 multi-turn entries as agentrl ``Task``s (categories base, miss_func, miss_param,
long_context; 200 entries each), with a fixed train/eval split.

What maps to what:

* id = the BFCL id (``multi_turn_base_0``), domain ``"bfcl"``, backend ``"bfcl"``,
  ``initial_state`` in the layout documented in ``agentrl.envs.bfcl.backend``.
* tools = the BFCL docs of the involved classes (in ``involved_classes`` order), converted to JSON
  Schema: BFCL writes ``dict``/``float``/``tuple``/``any`` where JSON Schema has
  ``object``/``number``/``array``/(no type), and a tool schema must validate as JSON Schema.
* turn k: user text = the contents of BFCL's ``question[k]`` joined by newlines; gold = the
  ground-truth call strings parsed with ``ast`` (positional arguments named from the method
  signature), one call per step in BFCL's order, since calls can depend on earlier ones (cd, ls).
* miss_func: ``missed_function = {"k": [names]}``: the names are ``withheld_tools`` in turns < k;
  turn k has no question in BFCL, and its user text is BFCL's FC-mode message
  (``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC``); the episode loop prefixes it with the
  announcement of the restored tools. One exception: a missed function that the ground truth
  already calls before turn k (only ``tail`` in miss_func_49, called in turn 1, restored in turn
  3) is not withheld at all; BFCL's FC handler hides it there yet expects the call, and a gold
  plan must be playable with the tools the agent sees.
* ``excluded_function`` is ignored, as bfcl-eval 2026.3.23 itself ignores it.

Split: BFCL's categories are index-aligned variants of one another (entry i of miss_func,
miss_param and long_context mostly rewrites base entry i), so one seeded permutation of the indices
0..199 (``random.Random(SPLIT_SEED)``) is applied to every category: the first 100 indices are
``train``, the other 100 ``eval``, and no entry has a variant on the other side.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import random
from pathlib import Path
from typing import Any

from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC as RESTORE_MESSAGE
from bfcl_eval.constants.eval_config import MULTI_TURN_FUNC_DOC_PATH, POSSIBLE_ANSWER_PATH, PROMPT_PATH
from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

from agentrl.envs.bfcl.backend import bfcl_class
from agentrl.tasks.schema import FunctionSpec, Task, ToolCall, ToolSpec, Turn

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
SPLITS = ("train", "eval", "full")
SPLIT_SEED = 20260323
ENTRIES_PER_CATEGORY = 200
TRAIN_PER_CATEGORY = 100
# BFCL (Gorilla) type names -> JSON Schema; "any" has no JSON Schema type (any value is valid).
TYPE_MAP = {"dict": "object", "object": "object", "float": "number", "number": "number", "integer": "integer",
            "string": "string", "boolean": "boolean", "array": "array", "tuple": "array", "any": None}


def _jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: invalid JSON: {exc.msg}") from None
    return rows


def to_json_schema(schema: dict[str, Any], where: str) -> dict[str, Any]:
    """A BFCL parameter schema as JSON Schema (recursing into properties and items)."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type":
            if value not in TYPE_MAP:
                raise ValueError(f"{where}.type: unknown BFCL type {value!r}; known: {sorted(TYPE_MAP)}")
            if TYPE_MAP[value] is not None:
                out["type"] = TYPE_MAP[value]
        elif key == "properties":
            out[key] = {name: to_json_schema(sub, f"{where}.properties.{name}") for name, sub in value.items()}
        elif key == "items":
            out[key] = to_json_schema(value, f"{where}.items")
        else:
            out[key] = value
    return out


@functools.lru_cache(maxsize=None)
def class_tools(class_name: str) -> tuple[ToolSpec, ...]:
    """The ToolSpecs of one BFCL class, from its multi-turn function doc file."""
    path = MULTI_TURN_FUNC_DOC_PATH / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    specs = []
    for doc in _jsonl(path):
        where = f"{path.name}:{doc['name']}.parameters"
        params = to_json_schema(doc.get("parameters") or {}, where)
        params["type"] = "object"
        params.setdefault("properties", {})
        specs.append(ToolSpec(function=FunctionSpec(name=doc["name"], description=doc.get("description", ""), parameters=params)))
    return tuple(specs)


def _literal(node: ast.expr, where: str) -> Any:
    value = ast.literal_eval(node)

    def check(v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, list):
            return [check(x) for x in v]
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            return {k: check(x) for k, x in v.items()}
        raise ValueError(f"{where}: argument value {v!r} is not JSON (executing it as JSON would change the call)")

    return check(value)


def parse_call(text: str, owners: dict[str, type], where: str) -> ToolCall:
    """``"mv(source='a', destination='b')"`` -> ToolCall; positional arguments get their names
    from the method signature (BFCL ground truth uses both forms)."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"{where}: not a Python call: {text!r} ({exc.msg})") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"{where}: expected name(args...), got {text!r}")
    name = node.func.id
    if name not in owners:
        raise ValueError(f"{where}: {name!r} is not a method of the involved classes")
    params = list(inspect.signature(getattr(owners[name], name)).parameters)[1:]  # drop self
    if len(node.args) > len(params):
        raise ValueError(f"{where}: {text!r} has {len(node.args)} positional arguments; {name} takes {params}")
    args = {params[i]: _literal(a, where) for i, a in enumerate(node.args)}
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError(f"{where}: **kwargs are not supported: {text!r}")
        args[kw.arg] = _literal(kw.value, where)
    return ToolCall(name=name, arguments=args)


def _call_name(text: str) -> str:
    return text.split("(", 1)[0].strip()


def entry_to_task(entry: dict[str, Any], ground_truth: list[list[str]], category: str) -> Task:
    """One BFCL question entry and its ground truth as a Task (see the module docstring)."""
    eid = entry["id"]
    classes = entry["involved_classes"]
    tools = [t for c in classes for t in class_tools(c)]
    owners = {t.name: bfcl_class(c) for c in classes for t in class_tools(c)}
    questions = entry["question"]
    if len(ground_truth) != len(questions):
        raise ValueError(f"{eid}: ground_truth has {len(ground_truth)} turns, question has {len(questions)}")
    missed = entry.get("missed_function") or {}
    holdout = {int(k): list(v) for k, v in missed.items()}
    called_early = {_call_name(c) for h in holdout for gt in ground_truth[:h] for c in gt}
    turns = []
    for k, (messages, gt) in enumerate(zip(questions, ground_truth)):
        if messages:
            user = "\n".join(m["content"] for m in messages if m.get("role") == "user")
        elif k in holdout:
            user = RESTORE_MESSAGE
        else:
            raise ValueError(f"{eid}: question[{k}] is empty but turn {k} restores no missed_function")
        withheld = sorted({n for h, names in holdout.items() if k < h for n in names if n not in called_early})
        gold = [[parse_call(c, owners, f"{eid}: ground_truth[{k}]")] for c in gt]
        turns.append(Turn(user=user, gold=gold, withheld_tools=withheld))
    return Task(
        id=eid,
        domain="bfcl",
        category=category,
        tools=tools,
        backend="bfcl",
        initial_state={
            "bfcl_id": eid,
            "involved_classes": list(classes),
            "initial_config": entry.get("initial_config") or {},
            "long_context": category == "long_context",
        },
        turns=turns,
    )


@functools.lru_cache(maxsize=None)
def _category_tasks(category: str) -> tuple[Task, ...]:
    qpath = PROMPT_PATH / f"BFCL_v4_multi_turn_{category}.json"
    apath = POSSIBLE_ANSWER_PATH / f"BFCL_v4_multi_turn_{category}.json"
    questions, answers = _jsonl(qpath), _jsonl(apath)
    gt = {a["id"]: a["ground_truth"] for a in answers}
    tasks = []
    for i, entry in enumerate(questions):
        if entry.get("id") != f"multi_turn_{category}_{i}":
            raise ValueError(f"{qpath}:{i + 1}: id: expected multi_turn_{category}_{i}, got {entry.get('id')!r}")
        if entry["id"] not in gt:
            raise ValueError(f"{apath}: no ground_truth for {entry['id']!r}")
        tasks.append(entry_to_task(entry, gt[entry["id"]], category))
    if len(tasks) != ENTRIES_PER_CATEGORY:
        raise ValueError(f"{qpath}: expected {ENTRIES_PER_CATEGORY} entries, found {len(tasks)}")
    return tuple(tasks)


def train_indices() -> frozenset[int]:
    """The entry indices (0..199) of the train side, the same in every category."""
    order = list(range(ENTRIES_PER_CATEGORY))
    random.Random(SPLIT_SEED).shuffle(order)
    return frozenset(order[:TRAIN_PER_CATEGORY])


def bfcl_tasks(category: str = "all", split: str = "full") -> list[Task]:
    """BFCL tasks of ``category`` (base, miss_func, miss_param, long_context or all) and
    ``split`` (train, eval or full), in category then BFCL index order.

    Tasks are cached and shared between calls: treat them as read-only.
    """
    if category != "all" and category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; expected one of {[*CATEGORIES, 'all']}")
    if split not in SPLITS:
        raise ValueError(f"unknown BFCL split {split!r}; expected one of {list(SPLITS)}")
    cats = CATEGORIES if category == "all" else (category,)
    train = train_indices()
    out = []
    for cat in cats:
        for i, task in enumerate(_category_tasks(cat)):
            if split == "full" or (i in train) == (split == "train"):
                out.append(task)
    return out
