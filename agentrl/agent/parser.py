"""Hermes-style tool calls: render them for SFT/prompts, parse them out of model text.

The model writes calls as::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Oslo"}}
    </tool_call>

This is the layout Qwen2.5 / Hermes models are trained on and what vLLM's ``hermes`` tool parser
reads, so the same text works with our tiny model, SmolLM2 and Qwen.

Why a hand-written scanner instead of a regex: the parser runs on every assistant message of every
rollout, on text from a policy that may be anywhere from random init to nearly converged. It must
never raise (a crash kills a rollout worker), must count malformed blocks (the HierR ``format``
component is ``n_valid / n_blocks``), and must keep the text outside the blocks (the summary
segment and R_sum read it).

Block boundaries follow vLLM's hermes parser (``<tool_call>(.*?)</tool_call>|<tool_call>(.*)``):
a block runs from an opening tag to the *first* closing tag after it; an opening tag with no
closing tag swallows the rest of the text and is reported as unclosed. A stray ``</tool_call>``
with no opening tag stays in ``content``.

This is the default ``agent.tool_format``; the other formats (``llama3_json``, ``pythonic``) live in
``agentrl.agent.tool_formats`` and return the same ``ParsedMessage``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.tasks.schema import ToolCall

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


def format_tool_call(call: ToolCall) -> str:
    """One call as a Hermes block: ``<tool_call>\\n{json}\\n</tool_call>``.

    ``json.dumps`` with default separators and ``ensure_ascii=False`` (the byte-for-byte layout of
    the Qwen2.5 chat template's ``tojson``). The only deviation: a literal ``</tool_call>`` inside
    a string value is written as ``<\\/tool_call>`` (a valid JSON escape that decodes to the same
    string) so the block cannot end early and format -> parse always round-trips.
    """
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    body = body.replace(CLOSE_TAG, "<\\/tool_call>")
    return f"{OPEN_TAG}\n{body}\n{CLOSE_TAG}"


def format_tool_calls(calls: list[ToolCall]) -> str:
    """Render calls as Hermes blocks joined by ``"\\n"`` (empty string for no calls)."""
    return "\n".join(format_tool_call(c) for c in calls)


@dataclass
class ParsedMessage:
    """What one assistant message contains.

    ``calls`` are the valid calls in order; ``errors`` holds one human-readable reason per
    malformed block (so ``n_blocks == n_valid + len(errors)``); ``content`` is the text outside the
    blocks, stripped; ``has_call_attempt`` is True when any ``<tool_call>`` tag appeared, valid or
    not (a message without one is a candidate summary / final answer).
    """

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    n_blocks: int = 0
    n_valid: int = 0
    content: str = ""
    has_call_attempt: bool = False

    @property
    def format_valid_fraction(self) -> float:
        """n_valid / n_blocks, 1.0 when there are no blocks (nothing was malformed).

        The same ratio over a whole episode's blocks is HierR's ``format`` component
        (docs/design.md §3)."""
        return self.n_valid / self.n_blocks if self.n_blocks else 1.0


def _short(text: str, limit: int = 60) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_block(body: str, known_tools: set[str] | None) -> tuple[ToolCall | None, str | None]:
    """Decode one block body into a call, or return the reason it is malformed. Never raises."""
    try:
        obj = json.loads(body)
    except RecursionError:  # deeply nested input: json's C scanner recurses
        return None, "invalid JSON: nesting too deep"
    except Exception as exc:  # JSONDecodeError, ValueError (e.g. int too long), anything else
        return None, f"invalid JSON ({type(exc).__name__}): {_short(body)!r}"
    if not isinstance(obj, dict):
        return None, f"call must be a JSON object, got {type(obj).__name__}"
    return checked_call(obj.get("name"), obj.get("arguments", {}), known_tools)


def checked_call(name: Any, args: Any, known_tools: set[str] | None,
                 args_key: str = "arguments") -> tuple[ToolCall | None, str | None]:
    """A decoded call's name and arguments as a ``ToolCall``, or the reason it is malformed.

    Shared by every tool-call format (``agentrl.agent.tool_formats``) so that a bad name, bad
    arguments or an unknown tool read the same, whatever the syntax. ``args_key``: what the format
    calls the arguments, for the message. Never raises."""
    if not isinstance(name, str) or not name.strip():
        return None, "missing or non-string 'name'" if not isinstance(name, str) else "empty 'name'"
    if not isinstance(args, dict):
        return None, f"'{args_key}' of {name!r} must be a JSON object, got {type(args).__name__}"
    if known_tools is not None and name not in known_tools:
        return None, f"unknown tool {name!r}"
    try:
        return ToolCall(name=name, arguments=args), None
    except Exception as exc:  # defensive: pydantic should accept any str-keyed dict
        return None, f"invalid call ({type(exc).__name__})"


def _coerce(text: Any) -> str:
    """Any model output as text (a parser never raises, whatever it is handed)."""
    return text if isinstance(text, str) else "" if text is None else str(text)


Checked = tuple[ToolCall | None, str | None]  # a call, or the reason it is malformed
FindCall = Callable[[str, int], int | None]
ReadCalls = Callable[[str, int, set[str] | None], tuple[list[Checked], int | None]]


def scan_calls(text: str, find: FindCall, read: ReadCalls,
               known_tools: set[str] | None = None) -> tuple[ParsedMessage, list[str]]:
    """The one loop that walks an assistant text for its calls, whatever their syntax: every tool
    format (hermes here, llama3_json and pythonic in ``agentrl.agent.tool_formats``) counts
    blocks, collects errors and keeps the text between the calls the same way, so HierR's
    ``format`` score and the summary segment mean the same thing in every format.

    ``find(text, pos)``: where the next call starts at or after ``pos``, None when there is none.
    ``read(text, start, known_tools)``: one ``(call, error)`` per block found there (a pythonic
    call list holds several) and the index just past them; None when the block never closes, so
    it swallows the rest of the text. Returns the message without ``content`` and the text
    between the calls (the gaps), which the format cleans of its own markers."""
    out, gaps, pos = ParsedMessage(), [], 0
    while (start := find(text, pos)) is not None:
        gaps.append(text[pos:start])
        out.has_call_attempt = True
        checked, end = read(text, start, known_tools)
        for call, err in checked:
            out.n_blocks += 1
            if call is not None:
                out.calls.append(call)
                out.n_valid += 1
            else:
                out.errors.append(err or "invalid call")
        if end is None:
            return out, gaps
        pos = end
    gaps.append(text[pos:])
    return out, gaps


def _find_block(text: str, pos: int) -> int | None:
    start = text.find(OPEN_TAG, pos)
    return start if start >= 0 else None


def _read_block(text: str, start: int, known_tools: set[str] | None) -> tuple[list[Checked], int | None]:
    """The block opened at ``start``: up to the first closing tag, or unclosed (the rest of the text)."""
    body_start = start + len(OPEN_TAG)
    end = text.find(CLOSE_TAG, body_start)
    if end < 0:
        return [(None, f"unclosed {OPEN_TAG}: {_short(text[body_start:])!r}")], None
    return [_parse_block(text[body_start:end], known_tools)], end + len(CLOSE_TAG)


def parse_assistant(text: str, known_tools: set[str] | None = None) -> ParsedMessage:
    """Split an assistant message into valid calls, per-block errors and free text.

    ``known_tools``: when given, a call to a name outside it is a malformed block (counts against
    the format score and is not executed). Missing ``arguments`` means ``{}``; extra keys in the
    call object are ignored. Never raises on any ``str``.
    """
    out, gaps = scan_calls(_coerce(text), _find_block, _read_block, known_tools)
    out.content = "".join(gaps).strip()
    return out
