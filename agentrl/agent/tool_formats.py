"""Tool-call formats: how the policy writes its calls (``agent.tool_format``), per model family.

* ``hermes`` (the default): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, in
  ``agentrl.agent.parser``. Qwen2.5/3, Hermes, SmolLM2 and our tiny model.
* ``llama3_json`` (Llama 3.1/3.3): a bare JSON object ``{"name": ..., "parameters": {...}}``,
  several separated by ``;`` (or newlines), optionally after ``<|python_tag|>``; a call starts a
  line (braces inside an answer's prose are content).
* ``pythonic`` (Llama 3.2/4): a Python list of calls, ``[f(a=1, b="x"), g()]``, literal values
  only, optionally after ``<|python_tag|>`` or inside ``<|python_start|>...<|python_end|>``.

A ``ToolFormat`` has ``render(calls) -> str`` (what the gold replay, the SFT data and the chat
formatter write for an assistant message's calls) and ``parse(text, known_tools=None) ->
ParsedMessage`` (what the episode loop reads out of sampled text); ``get_format(name)`` finds one.

Why the grammar of vLLM's tool parsers (``vllm.tool_parsers``: ``Llama3JsonToolParser``,
``PythonicToolParser``, ``Hermes2ProToolParser``) but not the parsers themselves: they serve an
OpenAI endpoint, so per message they answer "tools called or not", and on any malformed call they
give up on the whole message and return it as content, logging a traceback each time (a random-init
policy would flood the logs). The episode loop needs per-call answers: the valid calls of a message
run, each malformed one counts against HierR's ``format`` score and gets an error observation, and
the text outside the calls is kept for the summary reward. They also need a tokenizer (the llama3
one refuses a vocabulary without ``<|python_tag|>``), and importing vLLM costs seconds in processes
that never start an engine (SFT, ``agentrl eval --policy gold``). So for a well-formed message both
give the same calls (tests/test_tool_formats.py runs vLLM's parsers on rendered calls), and only the
handling of malformed ones differs:

* llama3_json: as in vLLM, every ``{`` outside an earlier call starts a call, decoded with
  ``json.JSONDecoder.raw_decode``; the object needs ``name`` and ``arguments`` or ``parameters``. A
  ``{`` that does not decode is one malformed call that ends at its matching brace, or swallows the
  rest of the text when the braces never balance (like an unclosed ``<tool_call>``).
* pythonic: a call list starts at ``[`` followed by a name and ``(``, runs to its matching ``]`` and
  is read with ``ast`` (parsed, never evaluated); each element is one call, checked on its own.
  Values are the literals vLLM accepts (constants, lists, tuples and sets as lists, dicts,
  ``-``/``+`` numbers, ``true``/``false``/``null``); dict keys must be strings (JSON's). Positional
  arguments, which vLLM drops silently, make a malformed call (the tool would miss them). Text before
  or after the list is kept as content (vLLM treats such a message as text), so content + calls
  round-trips as it does for hermes.
"""

from __future__ import annotations

import ast
import json
import keyword
import math
import re
import unicodedata
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl.agent.parser import (
    Checked,
    ParsedMessage,
    _coerce,
    _short,
    checked_call,
    format_tool_calls,
    parse_assistant,
    scan_calls,
)
from agentrl.tasks.schema import ToolCall

PYTHON_TAG = "<|python_tag|>"  # Llama 3.x: "what follows is a tool call"
PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"  # Llama 4's wrapper of a call list


@dataclass(frozen=True)
class ToolFormat:
    name: str
    render: Callable[[list[ToolCall]], str]
    """The calls as the model writes them ("" for none); raises ValueError on a call the format
    cannot express (e.g. a pythonic call to a name that is not an identifier)."""
    parse: Callable[..., ParsedMessage]
    """``parse(text, known_tools=None)``: valid calls, one error per malformed call, the text outside
    the calls; never raises on any string."""

    def render_message(self, content: str, calls: list[ToolCall]) -> str:
        """An assistant message with text and calls, laid out as our chat template lays out a
        message's ``tool_calls``: the content, then ``\\n`` and the calls (no newline without content)."""
        if not calls:
            return content
        rendered = self.render(calls)
        return f"{content}\n{rendered}" if content else rendered


def _balanced_end(text: str, start: int, quotes: str) -> int | None:
    """Index just past the bracket that closes the one at ``start``, skipping quoted strings
    (backslash escapes; Python's triple quotes too when ``'`` is among ``quotes``); None when it
    never closes. Brackets of any kind count as one depth: only the extent of a malformed call is
    wanted here, its syntax error is reported by the real parser."""
    depth, i, n = 0, start, len(text)
    while i < n:
        ch = text[i]
        if ch in quotes:
            q = ch * 3 if "'" in quotes and text.startswith(ch * 3, i) else ch
            j = i + len(q)
            while j < n and not text.startswith(q, j):
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                return None
            i = j + len(q)
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


# --- llama3_json ------------------------------------------------------------------------------
_DECODER = json.JSONDecoder()
_LEADING_SEPARATOR = re.compile(r"^\s*;")


def render_llama3_json(calls: list[ToolCall]) -> str:
    """``{"name": ..., "parameters": {...}}`` per call, the layout of Llama 3.1's chat template
    (``json.dumps`` default separators), joined by ``"; "`` (what vLLM's parser splits on)."""
    return "; ".join(json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False) for c in calls)


def _llama3_call(text: str, start: int, known_tools: set[str] | None) -> tuple[list[Checked], int | None]:
    """The call whose object starts at ``text[start] == "{"``: ([(call, error)], end); end None when
    the object never closes (it swallows the rest of the text)."""
    try:
        obj, end = _DECODER.raw_decode(text, start)
    except Exception as exc:  # JSONDecodeError, RecursionError (deep nesting), ValueError (huge int)
        end = _balanced_end(text, start, '"')
        if end is None:
            return [(None, f"unclosed {{: {_short(text[start:])!r}")], None
        why = "nesting too deep" if isinstance(exc, RecursionError) else type(exc).__name__
        return [(None, f"invalid JSON ({why}): {_short(text[start:end])!r}")], end
    name = obj.get("name")
    key = "arguments" if "arguments" in obj else "parameters"
    if key not in obj and isinstance(name, str) and name.strip():
        return [(None, f"call to {name!r} has no 'parameters'")], end
    return [checked_call(name, obj.get(key), known_tools, key)], end


# Where a call starts: an object whose first key is "name" (or 'name', a malformed call), at the start of a line, after
# <|python_tag|> or after the ";" between calls. Braces elsewhere ("in {EUR}", a JSON value quoted in
# an answer) are content, as in vLLM's parser, which reads calls only from a message that starts
# with one: a final answer that mentions braces must still close its turn.
_LLAMA3_CALL_START = re.compile(r'(?:^|;|<\|python_tag\|>)[ \t]*(\{\s*["\']name["\'])', re.MULTILINE)


def _llama3_start(text: str, pos: int) -> int | None:
    found = _LLAMA3_CALL_START.search(text, pos)
    return found.start(1) if found else None


def parse_llama3_json(text: str, known_tools: set[str] | None = None) -> ParsedMessage:
    """Llama 3 JSON calls out of ``text``; ``;`` between calls and ``<|python_tag|>`` are not
    content. A ``<|python_tag|>`` with no call after it is one malformed call. Never raises."""
    text = _coerce(text)
    out, gaps = scan_calls(text, _llama3_start, _llama3_call, known_tools)
    gaps = [g if k == 0 else _LEADING_SEPARATOR.sub("", g) for k, g in enumerate(gaps)]
    if out.n_blocks == 0 and PYTHON_TAG in text:
        out.has_call_attempt, out.n_blocks = True, 1
        out.errors.append(f"{PYTHON_TAG} without a JSON call")
    out.content = "".join(gaps).replace(PYTHON_TAG, "").strip()
    return out


# --- pythonic ---------------------------------------------------------------------------------
_CALL_LIST = re.compile(r"\[\s*[^\W\d][\w.]*\s*\(")  # "[" name "(": where a call list starts
_JSON_NAMES = {"null": None, "true": True, "false": False}


def _is_name(text: str, dotted: bool = False) -> bool:
    """A name Python reads back unchanged: identifiers, not keywords, already NFKC-normal (the
    parser normalizes identifiers, so "ﬁ" would come back as "fi")."""
    parts = text.split(".") if dotted else [text]
    return all(p.isidentifier() and not keyword.iskeyword(p) and unicodedata.normalize("NFKC", p) == p for p in parts)


def _py(value: Any) -> str:
    """A JSON value as a Python literal (``ast`` reads it back equal)."""
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"a pythonic call cannot carry {value!r}")
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError("a pythonic call's dict arguments need string keys")
        return "{" + ", ".join(f"{k!r}: {_py(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"a pythonic call carries literals only, got {type(value).__name__}")


def render_pythonic(calls: list[ToolCall]) -> str:
    """``[f(a=1, b='x'), g()]``: keyword arguments as Python literals (``repr`` of strings)."""
    if not calls:
        return ""
    parts = []
    for c in calls:
        bad = [n for n in c.arguments if not _is_name(n)]
        if not _is_name(c.name, dotted=True) or bad:
            raise ValueError(f"tool call {c.name}({', '.join(bad)}) cannot be written in the pythonic format: "
                             "names must be Python identifiers")
        parts.append(f"{c.name}(" + ", ".join(f"{k}={_py(v)}" for k, v in c.arguments.items()) + ")")
    return "[" + ", ".join(parts) + "]"


def _literal(node: ast.expr) -> Any:
    """The value of a literal node, the grammar of vLLM's ``get_parameter_value``; ValueError
    for anything else (names, calls, operators, comprehensions...)."""
    if isinstance(node, ast.Constant):
        if node.value is None or isinstance(node.value, (str, int, float)):  # bool is an int
            return node.value
    elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_literal(e) for e in node.elts]
    elif isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):  # k is None for **d
                raise ValueError("dict keys must be strings")
            out[k.value] = _literal(v)
        return out
    elif isinstance(node, ast.JoinedStr) and all(isinstance(p, ast.Constant) for p in node.values):
        return "".join(str(p.value) for p in node.values)  # an f-string without placeholders
    elif isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _literal(node.operand)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return -v if isinstance(node.op, ast.USub) else v
    raise ValueError(f"not a literal: {type(node).__name__}")


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _python_call(node: ast.expr, known_tools: set[str] | None) -> tuple[ToolCall | None, str | None]:
    if not isinstance(node, ast.Call):
        return None, f"list element is not a call ({type(node).__name__})"
    name = _dotted(node.func)
    if name is None:
        return None, "call target must be a name"
    if node.args:
        return None, f"positional arguments in the call to {name!r}: pass them by name"
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            return None, f"**-unpacking in the call to {name!r}"
        if kw.arg in args:
            return None, f"argument {kw.arg!r} repeated in the call to {name!r}"
        try:
            args[kw.arg] = _literal(kw.value)
        except (ValueError, RecursionError):
            return None, f"argument {kw.arg!r} of {name!r} is not a literal"
    return checked_call(name, args, known_tools)


def _python_calls(src: str, known_tools: set[str] | None) -> list[Checked]:
    """One (call, error) per element of the list ``src``; one error when it is not a list."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning for "\d" and the like
            tree = ast.parse(src, mode="eval").body
    except Exception as exc:  # SyntaxError, ValueError (null bytes), RecursionError, MemoryError
        return [(None, f"invalid Python call list ({type(exc).__name__}): {_short(src)!r}")]
    if not isinstance(tree, ast.List):
        return [(None, f"expected a list of calls: {_short(src)!r}")]
    out = []
    for node in tree.elts:
        try:
            out.append(_python_call(node, known_tools))
        except RecursionError:
            out.append((None, "call nested too deep"))
    return out


def _call_list_start(text: str, pos: int) -> int | None:
    found = _CALL_LIST.search(text, pos)
    return found.start() if found else None


def _call_list(text: str, start: int, known_tools: set[str] | None) -> tuple[list[Checked], int | None]:
    """The call list opened at ``start``: one (call, error) per element, up to its matching ``]``;
    unclosed, one error and the rest of the text."""
    end = _balanced_end(text, start, "'\"")
    if end is None:
        return [(None, f"unclosed call list: {_short(text[start:])!r}")], None
    return _python_calls(text[start:end], known_tools), end


def parse_pythonic(text: str, known_tools: set[str] | None = None) -> ParsedMessage:
    """Python call lists out of ``text``; the Llama wrapper tokens are not content, and one with
    no call list after it is one malformed call. Never raises."""
    out, gaps = scan_calls(_coerce(text), _call_list_start, _call_list, known_tools)
    content = "".join(gaps)  # the markers are looked for here only: a string argument may hold one
    if out.n_blocks == 0 and (PYTHON_TAG in content or PYTHON_START in content):
        out.has_call_attempt, out.n_blocks = True, 1
        out.errors.append("call marker without a call list")
    for tag in (PYTHON_TAG, PYTHON_START, PYTHON_END):
        content = content.replace(tag, "")
    out.content = content.strip()
    return out


FORMATS: dict[str, ToolFormat] = {
    "hermes": ToolFormat("hermes", format_tool_calls, parse_assistant),
    "llama3_json": ToolFormat("llama3_json", render_llama3_json, parse_llama3_json),
    "pythonic": ToolFormat("pythonic", render_pythonic, parse_pythonic),
}
"""The formats ``agent.tool_format`` can name."""


def get_format(name: str | ToolFormat) -> ToolFormat:
    """The format called ``name`` (a ``ToolFormat`` is returned as is); ValueError for an unknown one."""
    if isinstance(name, ToolFormat):
        return name
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown tool format {name!r}; one of {', '.join(FORMATS)}") from None
