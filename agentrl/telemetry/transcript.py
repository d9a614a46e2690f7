"""``agentrl show``: recorded episodes (``telemetry/trajectories.py``) as text a person can read.

Each episode prints a header (step, or ``eval`` for an evaluation's records, task, behaviour
version, outcome and progress, turns passed, termination, size, tool errors), its rewards, the
conversation, the parsed calls log and the exceptions its plugin tools raised. The records keep the
chat template's text verbatim; for reading, chunks are split at the template's message headers
(ChatML's ``<|im_start|>role``, Llama-3's ``<|start_header_id|>``), the remaining special tokens
are dropped, tool responses are shown as ``tool`` lines, and long messages are cut (``raw``
prints every chunk as recorded instead). On a terminal rich colours the labels; elsewhere the
lines are plain and never wrapped.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from typing import TextIO

_HEADER = re.compile(r"<\|im_start\|>(\w+)\n|<\|start_header_id\|>(\w+)<\|end_header_id\|>\n*")
_SPECIAL = re.compile(r"<\|[^<>|\s]+\|>")
_TOOL_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.S)
MAX_CHARS = 600  # per message, unless raw
LABEL = 11  # label column width ("environment")
STYLES = {"header": "bold", "assistant": "green", "tool": "yellow", "user": "cyan", "calls": "magenta",
          "turn": "dim", "rewards": "dim", "system": "dim", "error": "bold red"}


def split_messages(text: str) -> list[tuple[str | None, str]]:
    """Chat-template text -> ``(role, content)`` per message, special tokens and empty messages
    dropped; ``role`` is None for text before the first header (an assistant message's body)."""
    parts, role, pos = [], None, 0
    for m in _HEADER.finditer(text):
        parts.append((role, text[pos:m.start()]))
        role, pos = m[1] or m[2], m.end()
    parts.append((role, text[pos:]))
    cleaned = [(r, _SPECIAL.sub("", body).strip()) for r, body in parts]
    return [(r, body) for r, body in cleaned if body]


def _messages(chunk: dict, raw: bool) -> Iterator[tuple[str, str]]:
    """(label, text) lines of one recorded chunk."""
    if raw:
        yield chunk["role"], chunk["text"]
        return
    for role, body in split_messages(chunk["text"]):
        responses = _TOOL_RESPONSE.findall(body)
        if responses and not _TOOL_RESPONSE.sub("", body).strip():
            for response in responses:
                yield "tool", response.strip()
        else:
            yield role or chunk["role"], body


def _cut(text: str, raw: bool) -> str:
    if raw or len(text) <= MAX_CHARS:
        return text
    return f"{text[:MAX_CHARS]} … [{len(text) - MAX_CHARS} more chars; --raw shows all]"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}".rstrip("0").rstrip(".") if value % 1 else f"{value:.0f}"


def header(row: dict) -> str:
    passed = row["turn_passed"]
    evaluated = str(row["group_id"]).startswith("eval/")  # agentrl eval's records (trajectories.eval_records)
    where = "eval" if evaluated else f"step {row['step']}"
    task = f"task {row['task_id']}" + (f" ({row['category']})" if row.get("category") else "")
    group = "" if evaluated else f" | group {row['group_id']} #{row['index']}"
    errors = len(row.get("tool_errors") or ())
    return (f"{where} | {task} | v{row['policy_version']}{group} | outcome {_number(row['outcome'])} "
            f"progress {_number(row['progress'])} | turns passed {sum(passed)}/{row['n_turns']} | {row['termination']} | "
            f"{row['tokens']} tokens, {row['policy_tokens']} policy" + (f" | {errors} tool error(s)" if errors else ""))


def episode_lines(row: dict, raw: bool = False) -> list[tuple[str, str]]:
    """One episode as ``(text, style)`` lines."""
    lines = [(header(row), "header")]
    rewards = " · ".join(f"{k} {_number(v)}" for k, v in sorted(row["rewards"].items()))
    lines.append((f"{'rewards':<{LABEL}} {rewards}", "rewards"))
    turn, passed = -1, row["turn_passed"]
    for chunk in row["messages"]:
        if chunk["turn"] != turn:
            turn = chunk["turn"]
            verdict = ("passed" if passed[turn] else "failed") if turn < len(passed) else "not finished"
            lines.append((f"-- turn {turn + 1}: {verdict} --", "turn"))
        for label, text in _messages(chunk, raw):
            indented = _cut(text, raw).replace("\n", "\n" + " " * (LABEL + 1))
            lines.append((f"{label:<{LABEL}} {indented}", label))
    for t, calls in enumerate(row["calls"]):
        for call in calls:
            args = json.dumps(call.get("arguments"), ensure_ascii=False)
            obs = json.dumps(call.get("observation"), ensure_ascii=False)
            lines.append((f"{'calls':<{LABEL}} turn {t + 1}: {call.get('name')}({args}) -> {_cut(obs, raw)}", "calls"))
    for error in row.get("tool_errors") or ():
        args = json.dumps(error.get("arguments"), ensure_ascii=False)
        where = f" at {error['where']}" if error.get("where") else ""
        lines.append((f"{'tool error':<{LABEL}} turn {int(error.get('turn', 0)) + 1}: {error.get('tool')}({args}) raised "
                      f"{error.get('type')}: {error.get('message')}{where}", "error"))
    return lines


def print_episodes(rows: list[dict], file: TextIO | None = None, raw: bool = False, live: bool | None = None) -> None:
    """Print ``rows`` (from ``read_trajectories``), a blank line between episodes."""
    file = file if file is not None else sys.stdout
    if live is None:
        live = getattr(file, "isatty", lambda: False)()
    console = None
    if live:
        from rich.console import Console

        console = Console(file=file, highlight=False, markup=False)
    for n, row in enumerate(rows):
        if n:
            print(file=file)
        for text, style in episode_lines(row, raw):
            if console is not None:
                console.print(text, style=STYLES.get(style, ""), soft_wrap=True)
            else:
                print(text, file=file)
    file.flush()
