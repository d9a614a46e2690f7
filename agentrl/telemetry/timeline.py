"""The step timeline: where a run's time went, as a Chrome trace (``trace.json`` in the run folder).

Two sources, one file, one clock (wall time in microseconds, Chrome's trace-event format):

* the driver's own spans: each step's phases (``1 rollouts`` ... ``5 metrics``) and the held-out
  evaluations, recorded here;
* Ray's task timeline (``ray.timeline()``): every actor call on every worker process — rollout
  calls, tool calls, the learner's update, weight loads — which the driver hands in when it writes.

Open the file in chrome://tracing or https://ui.perfetto.dev. No Ray import here: the caller
passes Ray's events.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from agentrl.common.files import atomic_write

TRACE_FILE = "trace.json"


class Timeline:
    """Driver spans as complete ("X") trace events."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    @contextmanager
    def span(self, name: str, **args) -> Iterator[None]:
        """Record the wall time of the ``with`` block as a span named ``name`` on the driver's track."""
        start = time.time()
        try:
            yield
        finally:
            self.events.append({"name": name, "cat": "driver", "ph": "X", "ts": start * 1e6,
                                "dur": (time.time() - start) * 1e6, "pid": "driver", "tid": "phases", "args": args})

    def write(self, run_dir: str | os.PathLike, ray_events: Iterable[dict] = ()) -> Path:
        """``trace.json`` with Ray's events and the driver's spans, written atomically."""
        path = Path(run_dir) / TRACE_FILE
        atomic_write(path, json.dumps({"traceEvents": [*ray_events, *self.events], "displayTimeUnit": "ms"}))
        return path
