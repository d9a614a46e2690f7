"""Prompts and JSON schemas of the ``llm`` synthesizer (``agentrl.rods.llm_synth``).

Every LLM request of the pipeline is constrained to a JSON schema (structured outputs) and its
answer is parsed and validated against that schema again (an endpoint may ignore the
constraint, and a cut-off answer is not JSON). Each schema carries a ``title`` naming its stage
(``plan``, ``patch``, ``rewrite``, ``repair``, ``verdict``, ``miss_param``); it is an annotation
only, but it tells a scripted test LLM which stage is asking.

Plans refer to earlier results with *reference strings*: an argument ``"$K.path"`` is replaced,
at execution time, by the value at ``path`` (keys and list positions, dot-separated) of the
result of call ``K`` (calls numbered from 0 over the whole plan). Only string arguments can carry
a reference (the schema keeps each argument's own type).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from agentrl.envs.tool_schema import close_schema
from agentrl.tasks.schema import Task, ToolCall, ToolSpec

REF_RE = re.compile(r"^\$(\d+)((?:\.[^.\s]+)*)$")


def compact(value: Any, limit: int) -> str:
    """Compact JSON text of ``value``, cut to ``limit`` characters."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + " ...(truncated)"


# -- schemas ------------------------------------------------------------------------------------
def bounded(schema: Any, max_chars: int, max_items: int) -> Any:
    """A copy of ``schema`` where every string without ``maxLength`` or ``enum`` gets
    ``maxLength = max_chars`` and every array gets ``maxItems <= max_items``: decoding bounds, so
    a weak model cannot spend its whole token budget inside one string or list."""
    if isinstance(schema, list):
        return [bounded(s, max_chars, max_items) for s in schema]
    if not isinstance(schema, dict):
        return schema
    nested = ("items", "additionalProperties", "anyOf", "oneOf", "allOf", "prefixItems")
    out = {k: bounded(v, max_chars, max_items) if k in nested else v for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {k: bounded(v, max_chars, max_items) for k, v in schema["properties"].items()}
    types = schema.get("type")
    types = types if isinstance(types, list) else [types]
    if "string" in types and "maxLength" not in schema and "enum" not in schema and "const" not in schema:
        out["maxLength"] = max_chars
    if "array" in types:
        out["maxItems"] = min(schema.get("maxItems", max_items), max_items)
    return out


def call_schema(spec: ToolSpec) -> dict[str, Any]:
    params = copy.deepcopy(spec.function.parameters) or {"type": "object", "properties": {}}
    params.setdefault("type", "object")
    params.setdefault("properties", {})
    return {"type": "object", "properties": {"name": {"enum": [spec.name]}, "arguments": close_schema(params)},
            "required": ["name", "arguments"], "additionalProperties": False}


def plan_schema(tools: list[ToolSpec], tool_class: dict[str, str], min_turns: int = 2, max_turns: int = 5,
                max_calls: int = 3, bounds: tuple[int, int] | None = None) -> dict[str, Any]:
    """``{"turns": [{"calls": [{"name", "arguments"}, ...]}, ...]}``: ``min_turns``..``max_turns``
    turns of 1..``max_calls`` calls, all calls of a turn to tools of one class, each call's
    ``arguments`` valid for (the closed parameter schema of) its tool."""
    by_class: dict[str, list[ToolSpec]] = {}
    for t in tools:
        by_class.setdefault(tool_class.get(t.name, ""), []).append(t)
    variants = []
    for cls_tools in by_class.values():
        items = [call_schema(t) for t in cls_tools]
        variants.append({"type": "array", "minItems": 1, "maxItems": max_calls,
                         "items": items[0] if len(items) == 1 else {"anyOf": items}})
    calls = variants[0] if len(variants) == 1 else {"anyOf": variants}
    turn = {"type": "object", "properties": {"calls": calls}, "required": ["calls"], "additionalProperties": False}
    schema = {"title": "plan", "type": "object",
              "properties": {"turns": {"type": "array", "minItems": min_turns, "maxItems": max_turns, "items": turn}},
              "required": ["turns"], "additionalProperties": False}
    return bounded(schema, *bounds) if bounds else schema


def patch_schema(max_ops: int = 3) -> dict[str, Any]:
    op = {"type": "object",
          "properties": {"op": {"enum": ["add", "replace"]}, "path": {"type": "string", "maxLength": 200}, "value": {}},
          "required": ["op", "path", "value"], "additionalProperties": False}
    return {"title": "patch", "type": "object",
            "properties": {"patch": {"type": "array", "maxItems": max_ops, "items": op}},
            "required": ["patch"], "additionalProperties": False}


def texts_schema(n: int, title: str, max_chars: int = 500) -> dict[str, Any]:
    return {"title": title, "type": "object",
            "properties": {"turns": {"type": "array", "minItems": n, "maxItems": n,
                                     "items": {"type": "string", "minLength": 1, "maxLength": max_chars}}},
            "required": ["turns"], "additionalProperties": False}


VERDICT_SCHEMA: dict[str, Any] = {
    "title": "verdict", "type": "object",
    "properties": {"reason": {"type": "string", "maxLength": 300}, "verdict": {"enum": ["accept", "reject"]}},
    "required": ["reason", "verdict"], "additionalProperties": False,
}

MISS_PARAM_SCHEMA: dict[str, Any] = {
    "title": "miss_param", "type": "object",
    "properties": {"message": {"type": "string", "minLength": 1, "maxLength": 500}},
    "required": ["message"], "additionalProperties": False,
}


# -- rendering ----------------------------------------------------------------------------------
def short_description(spec: ToolSpec, limit: int = 200) -> str:
    desc = spec.function.description or ""
    if "Tool description: " in desc:  # BFCL: "This tool belongs to the X, ... Tool description: ..."
        desc = desc.split("Tool description: ", 1)[1]
    return desc[:limit]


def _type_text(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return "one of " + "|".join(map(str, prop["enum"]))
    kind = prop.get("type", "any")
    if kind == "array" and isinstance(prop.get("items"), dict):
        return f"list of {_type_text(prop['items'])}"
    if kind == "object" and prop.get("properties"):
        return compact({k: v for k, v in prop.items() if k != "description"}, 200)
    return "|".join(kind) if isinstance(kind, list) else str(kind)


def render_params(params: dict[str, Any]) -> str:
    """One line per tool: ``name (type[, optional]): description; ...``."""
    required = set(params.get("required", []))
    parts = []
    for name, prop in (params.get("properties") or {}).items():
        prop = prop if isinstance(prop, dict) else {}
        opt = "" if name in required else ", optional"
        desc = f": {str(prop['description'])[:120]}" if prop.get("description") else ""
        parts.append(f"{name} ({_type_text(prop)}{opt}){desc}")
    return "; ".join(parts) or "none"


def render_tools(tools: list[ToolSpec], tool_class: dict[str, str]) -> str:
    return "\n".join(f"- {t.name} [{tool_class.get(t.name, '?')}]: {short_description(t)} "
                     f"Arguments: {render_params(t.function.parameters)}" for t in tools)


def render_call(call: ToolCall) -> str:
    return f"{call.name}({compact(call.arguments, 400)})"


def render_example(task: Task, limit: int = 300) -> str:
    lines = []
    for u, turn in enumerate(task.turns):
        calls = task.gold_calls(u)
        lines.append(f"Turn {u + 1}: user: {turn.user[:limit]!r}")
        lines.append("  calls: " + ("; ".join(render_call(c) for c in calls) if calls else "(none)"))
    return "\n".join(lines)


def render_executed(walk: list[list[tuple[int, ToolCall, Any, list[str]]]], texts: list[str] | None = None) -> str:
    """The plan as executed: per turn its calls, the argument values taken from earlier results,
    and each call's result (``walk`` from ``llm_synth.walk``)."""
    lines = []
    for u, calls in enumerate(walk):
        lines.append(f"Turn {u + 1}:" + (f" user: {texts[u]!r}" if texts else ""))
        for k, call, result, derived in calls:
            note = f"  [values of {', '.join(derived)} come from earlier results]" if derived else ""
            lines.append(f"  call {k}: {render_call(call)} -> {compact(result, 300)}{note}")
    return "\n".join(lines)


# -- messages -----------------------------------------------------------------------------------
PLAN_SYSTEM = """\
You design training conversations for an assistant that uses tools. Propose a NEW conversation \
plan that exercises the same skills as the example (the same kinds of tools, a similar number of \
turns and calls per turn, results of earlier calls reused by later calls) with different values.
Rules:
- {min_turns} to {max_turns} user turns; each turn makes 1 to {max_calls} calls, all to tools of \
the same class (the class is in brackets after each tool).
- Every call must succeed when the plan runs in order on the initial state: use ids, names and \
values that exist there or that an earlier call returns.
- To reuse a value returned by an earlier call, write the string "$K.key" as the argument: K is \
the number of that call in the whole plan, counting from 0, and key the field of its result \
(nested fields and list positions separated by dots), e.g. "$0.account_id".
- Strings at most {max_chars} characters, lists at most {max_items} items.
Answer with the JSON object only: {{"turns": [{{"calls": [{{"name": ..., "arguments": {{...}}}}]}}]}}."""


def plan_messages(seed: Task, tools: list[ToolSpec], tool_class: dict[str, str], signature: str, blocked: list[str],
                  feedback: list[str], limits: dict[str, int], max_state_chars: int) -> list[dict[str, str]]:
    user = [f"Tools:\n{render_tools(tools, tool_class)}",
            f"Initial state: {compact(seed.initial_state, max_state_chars)}",
            f"Skills of the example: {signature}",
            f"Example conversation (do not copy it):\n{render_example(seed)}"]
    if blocked:
        user.append(f"Do not use these tools: {', '.join(blocked)}.")
    if feedback:
        user.append("Earlier attempts failed:\n" + "\n".join(f"- {f}" for f in feedback))
    return [{"role": "system", "content": PLAN_SYSTEM.format(**limits)}, {"role": "user", "content": "\n\n".join(user)}]


PATCH_SYSTEM = """\
A planned tool call failed on the initial state of the backend. If the failure is because the \
state lacks something the plan assumes (a record, a file, a balance), propose the smallest change \
to the initial state that makes the call succeed, as a JSON Patch: at most 3 operations \
{"op": "add" or "replace", "path": JSON Pointer such as "/Bank/accounts/A1234", "value": ...}. \
Paths must start with one of: {roots}. If the call itself is wrong, answer {"patch": []}.
Answer with the JSON object only: {"patch": [...]}."""


def patch_messages(state: dict[str, Any], done: str, failed: ToolCall, error: str, roots: list[str],
                   max_state_chars: int) -> list[dict[str, str]]:
    user = (f"Initial state: {compact(state, max_state_chars)}\n\nCalls that succeeded before:\n{done or '(none)'}\n\n"
            f"Failed call: {render_call(failed)}\nError: {error[:300]}")
    return [{"role": "system", "content": PATCH_SYSTEM.replace("{roots}", ", ".join(roots))}, {"role": "user", "content": user}]


REWRITE_SYSTEM = """\
Write what the user says in this conversation with an assistant that uses tools: exactly one \
message per turn, {n} in all. Each message must be a natural request a real person would type, \
coherent with the earlier ones, that leads to the calls listed for its turn. Never mention \
function or tool names, code or JSON. State every value the calls of a turn need (names, \
amounts, days, paths, texts, ids the user knows), except values marked as coming from earlier \
results: the assistant finds those itself, so refer to them naturally ("the new account", \
"that file").
Answer with the JSON object only: {{"turns": ["message 1", ...]}}."""


def rewrite_messages(executed: str, n: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": REWRITE_SYSTEM.format(n=n)},
            {"role": "user", "content": f"Conversation plan:\n{executed}"}]


def repair_messages(executed: str, n: int, reason: str) -> list[dict[str, str]]:
    user = (f"Conversation plan with the current user messages:\n{executed}\n\nA reviewer rejected these messages: "
            f"{reason[:300]}\nRewrite all {n} messages to fix that.")
    return [{"role": "system", "content": REWRITE_SYSTEM.format(n=n)}, {"role": "user", "content": user}]


JUDGE_SYSTEM = """\
You review a synthesized training conversation for an assistant that uses tools. Accept it only \
if every user message is natural and coherent with the earlier ones, names no function, and \
states (or lets the assistant find in earlier results) every value needed, so that an assistant \
would make exactly the listed calls in each turn. Otherwise reject it and say why in one sentence.
Answer with the JSON object only: {"reason": "...", "verdict": "accept" or "reject"}."""


def judge_messages(tools_text: str, executed: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": f"Tools:\n{tools_text}\n\nConversation:\n{executed}"}]


MISS_PARAM_SYSTEM = """\
Rewrite the user's message so that it leaves out one value: the user forgot to say it. Keep the \
rest of the request as it is and do not mention the missing value in any form.
Answer with the JSON object only: {"message": "..."}."""


def miss_param_messages(message: str, param: str, value: Any) -> list[dict[str, str]]:
    shown = json.dumps(value, ensure_ascii=False)
    return [{"role": "system", "content": MISS_PARAM_SYSTEM},
            {"role": "user", "content": f"Message: {message!r}\nLeave out the {param} ({shown})."}]
