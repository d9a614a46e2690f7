"""What a person watching a run sees: one live progress line, and small eval tables.

On a terminal the line redraws in place (rich Live). Where stdout is not a terminal (CI, files,
``ray job submit`` logs) a redrawn line would be noise or lost, so each step prints one plain line
instead, and tables print as aligned text, never wrapped at rich's default 80 columns.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from agentrl.telemetry.fields import pick


def _num(value: float) -> str:
    """Compact number: 850, 1.2k, 3.4M."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{suffix}"
    return f"{value:.0f}"


def format_step(step: int, total: int | None, metrics: Mapping[str, Any]) -> str:
    """``step 3/20 | success 0.41 | progress 0.55 | reward std 0.32 | 1.2k tok/s | gen 5.1s ...``.

    Fields missing from ``metrics`` are left out rather than shown as zeros.
    """
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    for field, label in (("success", "success"), ("progress", "progress"),
                         ("reward_std", "reward std")):
        value = pick(metrics, field)
        if value is not None:
            parts.append(f"{label} {value:.2f}")
    tps = pick(metrics, "tokens_per_s")
    if tps is not None and math.isfinite(tps):
        parts.append(f"{_num(tps)} tok/s")
    times = [f"{label} {value:.1f}s" for field, label in
             (("time_gen", "gen"), ("time_learn", "learn"), ("time_sync", "sync"))
             if (value := pick(metrics, field)) is not None]
    if times:
        parts.append(" ".join(times))
    lag = pick(metrics, "lag")
    if lag is not None and math.isfinite(lag):
        parts.append(f"lag {lag:g}")
    return " | ".join(parts)


def print_eval_progress(label: str, t0: float, done: int, total: int, success: float) -> None:
    """``held-out: 60/200 episodes, success so far 0.15 (120s)``: a long evaluation's heartbeat
    (``t0``: its ``time.perf_counter()`` start)."""
    print(f"{label}: {done}/{total} episodes, success so far {success:.2f} ({time.perf_counter() - t0:.0f}s)",
          flush=True)


def _is_tty(file: TextIO) -> bool:
    try:
        return file.isatty()
    except Exception:
        return False


class ProgressLine:
    """The training loop's status line; call ``update`` once per step, ``close`` at the end.

    ``live=None`` decides by whether ``file`` (default stdout) is a terminal; ``live=False`` (or
    ``telemetry.progress: false``) forces one plain line per step.
    """

    def __init__(self, total_steps: int | None, *, live: bool | None = None,
                 file: TextIO | None = None, start_step: int = 0) -> None:
        self.total = total_steps
        self.file = file if file is not None else sys.stdout
        self.live = _is_tty(self.file) if live is None else (live and _is_tty(self.file))
        self._progress = None
        self._task = None
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(BarColumn(bar_width=20), TextColumn("{task.description}"),
                                      TimeElapsedColumn(), console=Console(file=self.file),
                                      transient=False)
            self._task = self._progress.add_task(format_step(start_step, total_steps, {}),
                                                 total=total_steps, completed=start_step)
            self._progress.start()

    def update(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Show ``step`` (1-based count of finished steps) with its metrics."""
        text = format_step(step, self.total, metrics)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, description=text)
        else:
            print(text, file=self.file, flush=True)

    def print(self, text: str) -> None:
        """A message above the live line (or a plain line), without tearing the display."""
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.file, flush=True)

    def close(self) -> None:
        """Stop redrawing; the last line stays on screen."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or isinstance(value, int):
        return str(int(value))
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if not math.isfinite(number):
        return str(number)
    return str(int(number)) if number.is_integer() and abs(number) >= 10 else f"{number:.3f}"


def eval_table(title: str, rows: Mapping[str, Mapping[str, Any]], *,
               file: TextIO | None = None, live: bool | None = None) -> str:
    """Print ``rows`` (row name -> column -> value) as a table; returns the plain-text rendering.

    Columns are the union of the rows' keys in first-seen order, e.g. rows ``start``/``end`` by
    columns ``success``, ``progress``, ``mean calls``, ``episodes``. A missing cell shows ``-``.
    """
    file = file if file is not None else sys.stdout
    columns: list[str] = []
    for row in rows.values():
        columns += [c for c in row if c not in columns]
    cells = [[name] + [_cell(row.get(c)) for c in columns] for name, row in rows.items()]
    header = [""] + columns
    widths = [max(len(r[i]) for r in [header, *cells]) for i in range(len(header))]

    def line(row: list[str]) -> str:  # row names left-aligned, numbers right-aligned
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    plain = "\n".join([title, line(header), *(line(r) for r in cells)])
    if (_is_tty(file) if live is None else live and _is_tty(file)):
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        table.add_column("")
        for c in columns:
            table.add_column(c, justify="right")
        for r in cells:
            table.add_row(*r)
        Console(file=file).print(table)
    else:
        print(plain, file=file, flush=True)
    return plain
