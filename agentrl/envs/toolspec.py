"""Derive OpenAI function schemas (``ToolSpec``) from plain Python methods.

Executable domains are ordinary classes; writing their JSON schemas by hand would duplicate every
signature and drift out of date. The method *is* the tool: its name, type hints and Google-style
docstring are the single source of truth for what the model is shown and for what the backend
validates.

Supported hints: ``int`` -> integer, ``float`` -> number, ``str`` -> string, ``bool`` -> boolean,
``list[X]`` -> array of X, ``dict`` -> object, ``Literal[...]`` -> enum, ``X | None`` -> X (not
required when it has a default), ``TypedDict`` -> object with properties. A ``TypedDict`` return
annotation becomes the spec's ``returns`` schema (used by the LLM simulator to constrain output).
"""

from __future__ import annotations

import collections.abc
import inspect
import re
import types
import typing
from typing import Any, Callable, Literal, Union

from agentrl.tasks.schema import FunctionSpec, ToolSpec

_PRIMITIVES: dict[Any, dict[str, Any]] = {
    bool: {"type": "boolean"},  # before int: bool is a subclass of int
    int: {"type": "integer"},
    float: {"type": "number"},
    str: {"type": "string"},
}
_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?|Attributes):\s*$"
)
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")


def parse_google_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {arg: description}).

    The description is the first paragraph joined into one line: tool descriptions end up in
    every prompt, so only the summary is kept; later paragraphs are for humans.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    para: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line.strip()):
            break
        para.append(line.strip())
    description = " ".join(para)

    args: dict[str, str] = {}
    in_args, current, base_indent = False, None, None
    for line in lines:
        stripped = line.strip()
        header = _SECTION.match(stripped)
        indent = len(line) - len(line.lstrip())
        if header and indent == 0:
            in_args, current, base_indent = header.group(1) in {"Args", "Arguments", "Parameters"}, None, None
            continue
        if not in_args or not stripped:
            continue
        if indent == 0:  # dedented text ends the section
            in_args = False
            continue
        if base_indent is None:
            base_indent = indent
        m = _ARG_LINE.match(stripped)
        if indent == base_indent and m:
            current = m.group(1).lstrip("*")
            args[current] = m.group(3).strip()
        elif current is not None:  # continuation line of the current argument
            args[current] = (args[current] + " " + stripped).strip()
    return description, args


def type_to_schema(tp: Any, where: str = "type") -> dict[str, Any]:
    """JSON Schema for a type hint; raises TypeError (naming ``where``) for unsupported hints."""
    if tp is inspect.Parameter.empty or tp is Any:
        return {}
    if tp in _PRIMITIVES:
        return dict(_PRIMITIVES[tp])
    if tp is list:
        return {"type": "array"}
    if tp is dict:
        return {"type": "object"}
    if typing.is_typeddict(tp):
        hints = typing.get_type_hints(tp)
        required = sorted(getattr(tp, "__required_keys__", hints))
        props = {k: type_to_schema(v, f"{where}.{k}") for k, v in hints.items()}
        return {"type": "object", "properties": props, "required": required}
    origin, targs = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        kinds = {type(v) for v in targs}
        schema: dict[str, Any] = {}
        if len(kinds) == 1 and next(iter(kinds)) in _PRIMITIVES:
            schema.update(_PRIMITIVES[next(iter(kinds))])
        schema["enum"] = list(targs)
        return schema
    if origin in (list, tuple, collections.abc.Sequence):
        item = targs[0] if targs else Any
        return {"type": "array", **({"items": type_to_schema(item, f"{where}[]")} if item is not Any else {})}
    if origin is dict:
        return {"type": "object"}
    if origin in (Union, types.UnionType):
        rest = [a for a in targs if a is not type(None)]
        if len(rest) == 1:
            return type_to_schema(rest[0], where)
        return {"anyOf": [type_to_schema(a, where) for a in rest]}
    raise TypeError(f"{where}: unsupported type hint {tp!r} for a tool schema")


def function_spec(fn: Callable[..., Any], name: str | None = None) -> ToolSpec:
    """Build the ToolSpec of a function or method (``self``/``cls`` are skipped).

    Every parameter must be annotated: an unannotated argument would reach the model as an
    untyped slot, and tiny models fill those with whatever they like.
    """
    fname = name or fn.__name__
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    description, arg_docs = parse_google_docstring(inspect.getdoc(fn))
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in sig.parameters.items():
        if pname in {"self", "cls"}:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"{fname}: *args/**kwargs cannot be described as a tool schema")
        if pname not in hints:
            raise TypeError(f"{fname}: parameter {pname!r} has no type hint")
        prop = type_to_schema(hints[pname], f"{fname}.{pname}")
        if arg_docs.get(pname):
            prop["description"] = arg_docs[pname]
        if param.default is not inspect.Parameter.empty:
            prop["default"] = param.default
        else:
            required.append(pname)
        properties[pname] = prop
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    ret = hints.get("return")
    returns = type_to_schema(ret, f"{fname}.return") if ret is not None and ret is not type(None) else None
    return ToolSpec(
        function=FunctionSpec(name=fname, description=description, parameters=parameters, returns=returns or None)
    )


def public_methods(cls: type, exclude: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Names of the public methods defined on ``cls`` and its domain bases, in definition order.

    Definition order (not alphabetical) keeps the tool list in the order a human wrote it, which
    is also the order the model sees tools in the prompt.
    """
    names: list[str] = []
    for klass in reversed(cls.__mro__[:-1]):  # skip object
        for attr, value in vars(klass).items():
            if attr.startswith("_") or attr in exclude or attr in names:
                continue
            if inspect.isfunction(value):
                names.append(attr)
    return names


def class_tool_specs(cls: type, exclude: set[str] | frozenset[str] = frozenset()) -> list[ToolSpec]:
    """ToolSpecs of every public method of ``cls`` except ``exclude``."""
    return [function_spec(getattr(cls, n), n) for n in public_methods(cls, exclude)]
