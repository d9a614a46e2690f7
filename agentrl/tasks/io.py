"""Task files: JSONL (one task per line) and Parquet (one JSON string per row, column ``task``).

Task sets are written by people and by synthesizers, and read at the start of long runs, so a bad
file must fail at load time with a message that points at the exact spot:
``tasks.jsonl:3: turns.0.gold.0.0.name: Field required``. JSONL lines are 1-based (as editors
show them); Parquet rows are 0-based (as ``pyarrow`` / ``pandas`` index them) and written
``tasks.parquet:row 2: ...``.

Parquet stores each task as its JSON text rather than a nested struct: ``arguments`` and
``initial_state`` are free-form JSON whose Arrow types would differ from task to task, and the
string form round-trips exactly. ``id``/``domain``/``category``/``backend`` are stored as extra
columns so a file can be filtered without parsing every task. Free-form ``metadata`` (what a
plugin's reward function reads) travels inside that JSON like every other field.

Whether a task's ``backend`` and ``reward`` name something registered is known only above this
layer (``agentrl/envs/registry.py``, ``agentrl/rewards/registry.py``), so those modules register
hooks here (``register_task_hook``) that see each task's JSON object before it is validated:
they may fill in defaults (a plugin backend's tools) and reject unknown names, and their errors
get the same file:line as every other error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentrl.common.files import atomic_write
from agentrl.tasks.schema import Task

_INDEX_COLUMNS = ("id", "domain", "category", "backend")


class TaskFileError(ValueError):
    """A task file that cannot be loaded; the message names file, line/row and field."""


TaskHook = Callable[[dict[str, Any]], dict[str, Any]]
_HOOKS: dict[str, TaskHook] = {}


def register_task_hook(name: str, hook: TaskHook) -> None:
    """Run ``hook`` on every task's JSON object before it is validated, in registration order
    (re-registering a name replaces its hook in place). It returns the object (possibly with
    defaults filled in) or raises ValueError with ``field: reason``; the loader prefixes file:line."""
    _HOOKS[name] = hook


def _format_validation(where: str, err: ValidationError) -> str:
    parts = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"]) or "<task>"
        parts.append(f"{loc}: {e['msg']}")
    return f"{where}: " + "; ".join(parts)


def _parse(text: str, where: str, seen: dict[str, str]) -> Task:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskFileError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(data, dict):
        raise TaskFileError(f"{where}: expected a JSON object, got {type(data).__name__}")
    for hook in list(_HOOKS.values()):
        try:
            data = hook(data)
        except ValueError as exc:
            raise TaskFileError(f"{where}: {exc}") from None
    try:
        task = Task.model_validate(data)
    except ValidationError as exc:
        raise TaskFileError(_format_validation(where, exc)) from None
    if task.id in seen:
        raise TaskFileError(f"{where}: id: duplicate task id {task.id!r} (first at {seen[task.id]})")
    seen[task.id] = where
    return task


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".parquet"):
        raise TaskFileError(f"{path}: unsupported task file type {suffix or '(none)'!r}; use .jsonl or .parquet")
    return suffix[1:]


def load_tasks(path: str | os.PathLike[str]) -> list[Task]:
    """Read and validate every task of a ``.jsonl`` or ``.parquet`` file (blank JSONL lines are
    skipped; task ids must be unique within the file)."""
    path = Path(path)
    kind = _kind(path)
    seen: dict[str, str] = {}
    if kind == "jsonl":
        tasks = []
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if line.strip():
                    tasks.append(_parse(line, f"{path}:{lineno}", seen))
        return tasks

    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise TaskFileError(f"{path}: not a readable Parquet file: {exc}") from None
    if "task" not in table.column_names:
        raise TaskFileError(f"{path}: missing column 'task' (found {table.column_names})")
    tasks = []
    for row, text in enumerate(table.column("task").to_pylist()):
        where = f"{path}:row {row}"
        if not isinstance(text, str):
            raise TaskFileError(f"{where}: task: expected a JSON string, got {type(text).__name__}")
        tasks.append(_parse(text, where, seen))
    return tasks


def save_tasks(tasks: Iterable[Task], path: str | os.PathLike[str]) -> None:
    """Write tasks to ``.jsonl`` or ``.parquet`` (atomically: a crash never leaves half a file)."""
    path = Path(path)
    kind = _kind(path)
    tasks = list(tasks)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "jsonl":
        atomic_write(path, "".join(task.model_dump_json() + "\n" for task in tasks))
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {c: pa.array([getattr(t, c) for t in tasks], pa.string()) for c in _INDEX_COLUMNS}
    columns["task"] = pa.array([t.model_dump_json() for t in tasks], pa.string())
    out = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), out)
    atomic_write(path, out.getvalue().to_pybytes())
