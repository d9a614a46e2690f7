"""Trajectory records: every training episode of a run, as Parquet rows under ``run_dir/trajectories/``.

One row per episode: where it came from (``step``, ``task_id``, ``group_id``, ``index`` in the
group, ``policy_version`` = the behaviour version of its group), how it went (``outcome``,
``progress``, ``turn_passed``, ``termination``, ``rewards`` with every component), its size
(``tokens``, ``policy_tokens``, ``prompt_tokens``, call counts, seconds) and what was said:

* ``messages``: the token stream decoded in chunks of one source each, ``{role, turn, text}``
  with role ``prompt`` (system, tools, first user message), ``assistant`` (one chunk per sampled
  message: exactly the policy tokens) or ``environment`` (tool results, the next user message).
  Special tokens are kept, so the chunks joined are the text the model saw;
* ``calls``: the parsed calls log, per turn ``[{name, arguments, observation, step}]``;
* ``tool_errors``: the exceptions plugin tools raised, ``[{tool, arguments, type, message, where,
  turn}]`` (``Episode.tool_errors``); ``category``: the task's category where it has one.

``agentrl eval`` writes its episodes in the same format (``eval_records``), as step 0 with group
``eval/<task>[/<sample>]``, into ``trajectories/`` next to its results file.

``rewards``, ``calls`` and ``tool_errors`` are JSON strings (free-form arguments and observations would give Arrow
types that differ from row to row, as in ``tasks/io.py``); everything else is typed.

Files hold ``telemetry.trajectories_every`` steps each, ``steps-<first>-<last>.parquet``, one row
group per step. ``TrajectoryLog`` writes a window into a hidden partial file and renames it when
the window ends, so a file under its final name is always complete. No Ray here: the actor that
feeds it is ``rollout/trajectory_writer.py``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from agentrl.agent.episode import SEG_SUMMARY
from agentrl.api import Episode, EpisodeGroup
from agentrl.common.files import atomic_write

TRAJECTORY_DIR = "trajectories"
_FILE = re.compile(r"steps-(\d+)-(\d+)\.parquet")
JSON_FIELDS = ("rewards", "calls", "tool_errors")
EVAL_STEP = 0  # the step of an evaluation's records (training steps start at 1)

Decode = Callable[[list[int]], str]  # token ids -> text, special tokens kept


class TrajectoryError(ValueError):
    """No trajectories where asked (missing run folder, no files, no such step); names the path."""


def file_name(first: int, last: int) -> str:
    return f"steps-{first:06d}-{last:06d}.parquet"


def _schema():
    import pyarrow as pa

    i32, f64, s = pa.int32(), pa.float64(), pa.string()
    message = pa.struct([("role", s), ("turn", i32), ("text", s)])
    return pa.schema([
        ("step", i32), ("task_id", s), ("group_id", s), ("index", i32), ("policy_version", i32),
        ("outcome", f64), ("progress", f64), ("termination", s), ("n_turns", i32),
        ("turn_passed", pa.list_(pa.bool_())), ("tokens", i32), ("policy_tokens", i32),
        ("prompt_tokens", i32), ("call_blocks", i32), ("valid_calls", i32),
        ("gen_seconds", f64), ("env_seconds", f64), ("rewards", s), ("calls", s),
        ("messages", pa.list_(message)), ("tool_errors", s), ("category", s),
    ])


def render_messages(episode: Episode, decode: Decode) -> list[dict]:
    """The episode's token stream as ``{role, turn, text}`` chunks (see the module docstring).

    Assistant chunks are the ``step_spans``; what lies between them was injected by the
    environment. An environment chunk after a message that closed its turn opens the next turn
    (a user message); after any other message it holds that message's tool results."""
    ids = episode.token_ids
    chunks = [{"role": "prompt", "turn": 0, "text": decode(ids[: episode.prompt_len])}]
    pos = episode.prompt_len
    for (start, end), turn in zip(episode.step_spans, episode.step_turns):
        if start > pos:
            chunks.append({"role": "environment", "turn": turn, "text": decode(ids[pos:start])})
        chunks.append({"role": "assistant", "turn": turn, "text": decode(ids[start:end])})
        pos = end
    if pos < len(ids):  # tool results or a user message the token budget left unanswered
        last = episode.step_turns[-1] if episode.step_turns else 0
        closed = episode.step_spans and episode.segments[episode.step_spans[-1][0]] == SEG_SUMMARY
        chunks.append({"role": "environment", "turn": last + bool(closed), "text": decode(ids[pos:])})
    return chunks


def episode_records(group: EpisodeGroup, step: int, decode: Decode) -> list[dict]:
    """One row per episode of ``group``, trained at ``step``."""
    return [_record(e, step, e.task_id or group.task_id, group.group_id, index, group.version, decode)
            for index, e in enumerate(group.episodes)]


def eval_records(episodes: Iterable[tuple[Episode, str | None]], decode: Decode) -> list[dict]:
    """One row per ``(episode, task category or None)`` of an evaluation, as step ``EVAL_STEP``."""
    return [_record(e, EVAL_STEP, e.task_id, e.group_id, 0, e.policy_version, decode, category)
            for e, category in episodes]


def _record(e: Episode, step: int, task_id: str, group_id: str, index: int, version: int, decode: Decode,
            category: str | None = None) -> dict:
    return {
        "step": step, "task_id": task_id, "group_id": group_id, "index": index,
        "policy_version": version, "outcome": e.rewards.get("outcome"),
        "progress": e.rewards.get("progress"), "termination": e.termination, "n_turns": e.n_turns,
        "turn_passed": list(e.turn_passed), "tokens": len(e.token_ids), "policy_tokens": e.n_policy_tokens,
        "prompt_tokens": e.prompt_len, "call_blocks": e.n_call_blocks, "valid_calls": e.n_valid_calls,
        "gen_seconds": e.gen_seconds, "env_seconds": e.env_seconds,
        "rewards": json.dumps(e.rewards, sort_keys=True),
        "calls": json.dumps(e.calls, ensure_ascii=False, default=str),
        "messages": render_messages(e, decode),
        "tool_errors": json.dumps(e.tool_errors, ensure_ascii=False, default=str), "category": category,
    }


class TrajectoryLog:
    """Appends each step's rows to the window file of ``every`` steps; ``close`` ends the last one."""

    def __init__(self, out_dir: str | Path, every: int):
        if every < 1:
            raise ValueError("TrajectoryLog needs every >= 1 (0 means no log at all)")
        self.out_dir, self.every = Path(out_dir), every
        self._writer = None  # pyarrow ParquetWriter of the open window
        self._partial: Path | None = None
        self._window = self._first = self._last = None
        self.files: list[Path] = []  # completed files, in order

    def add(self, step: int, rows: list[dict]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        window = (step - 1) // self.every
        if self._writer is not None and window != self._window:
            self.close()
        if self._writer is None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._partial = self.out_dir / f".steps-{step:06d}.partial"
            self._writer = pq.ParquetWriter(self._partial, _schema())
            self._window, self._first = window, step
        self._writer.write_table(pa.Table.from_pylist(rows, schema=_schema()))
        self._last = step

    def close(self) -> Path | None:
        """Finish the open window under its final name; returns it (None when none was open)."""
        if self._writer is None:
            return None
        self._writer.close()
        path = self.out_dir / file_name(self._first, self._last)
        os.replace(self._partial, path)
        self._writer = self._partial = None
        self.files.append(path)
        return path


def discard_after(out_dir: str | Path, step: int) -> list[Path]:
    """Before a run resumed from its checkpoint at ``step`` records again: remove what was
    recorded after it: partial files (a window the process died in) and files of later steps;
    a file that straddles ``step`` is cut back to it. Returns the files removed or rewritten.
    (The writer closes its window at every checkpoint, so a file never straddles one.)"""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    out_dir = Path(out_dir)
    touched = list(out_dir.glob(".steps-*.partial"))
    for path in touched:
        path.unlink()
    for path in sorted(out_dir.glob("steps-*.parquet")):
        if not (m := _FILE.fullmatch(path.name)) or int(m[2]) <= step:
            continue
        touched.append(path)
        if int(m[1]) <= step:
            table, cut = pq.read_table(path), pa.BufferOutputStream()
            pq.write_table(table.filter(pc.less_equal(table["step"], step)), cut)
            atomic_write(out_dir / file_name(int(m[1]), step), cut.getvalue().to_pybytes())
        path.unlink()
    return touched


# ---------------------------------------------------------------- reading

def trajectory_files(run_dir: str | Path) -> list[tuple[int, int, Path]]:
    """``(first step, last step, path)`` of every complete file, by step; raises ``TrajectoryError``
    for a missing run folder or one without any."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise TrajectoryError(f"{run_dir}: no such run folder")
    found = []
    for path in sorted((run_dir / TRAJECTORY_DIR).glob("steps-*.parquet")):
        if m := _FILE.fullmatch(path.name):
            found.append((int(m[1]), int(m[2]), path))
    if not found:
        raise TrajectoryError(f"{run_dir / TRAJECTORY_DIR}: no trajectory files (the run had "
                              "telemetry.trajectories_every=0, or has not finished its first file yet)")
    return sorted(found)


def read_trajectories(run_dir: str | Path, *, step: int | None = None, task_id: str | None = None,
                      failed: bool = False, limit: int | None = None, category: str | None = None) -> list[dict]:
    """The recorded episodes, by step then group, with ``rewards``, ``calls`` and ``tool_errors``
    parsed (files written before ``tool_errors`` and ``category`` existed read as having none).

    ``step``: only that step (a step no file covers raises ``TrajectoryError``); ``task_id``: only
    that task; ``failed``: only episodes with outcome < 1; ``category``: only tasks of that
    category; ``limit``: at most that many."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = trajectory_files(run_dir)
    if step is not None and not any(first <= step <= last for first, last, _ in files):
        raise TrajectoryError(f"{Path(run_dir) / TRAJECTORY_DIR}: no step {step} recorded "
                              f"(files cover {_ranges(files)})")
    out: list[dict] = []
    for first, last, path in files:
        if step is not None and not first <= step <= last:
            continue
        try:
            rows = pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as err:
            raise TrajectoryError(f"{path}: not a readable Parquet file: {err}") from None
        for row in rows:
            # files written before these columns, or rows that never set them, read as none
            row = {**row, "tool_errors": row.get("tool_errors") or "[]", "category": row.get("category")}
            if ((step is None or row["step"] == step) and (task_id is None or row["task_id"] == task_id)
                    and not (failed and (row["outcome"] or 0.0) >= 1.0)
                    and (category is None or row["category"] == category)):
                out.append({**row, **{k: json.loads(row[k]) for k in JSON_FIELDS}})
                if limit is not None and len(out) >= limit:
                    return out
    return out


def _ranges(files: Iterable[tuple[int, int, Path]]) -> str:
    return ", ".join(f"step {a}" if a == b else f"steps {a}-{b}" for a, b, _ in files)
