"""One call per training step fans metrics out to JSONL, TensorBoard, Ray's metrics (Prometheus)
and the experiment trackers of ``telemetry.loggers`` (MLflow, W&B: telemetry/trackers.py).

Telemetry must never be why a run dies: every sink is wrapped, a failing sink logs one warning and
the others carry on. Heavy imports (torch's SummaryWriter, Ray) happen lazily so a sink with
TensorBoard off costs nothing, and Ray is only used when the process already has it initialized
(the driver owns ``ray.init``; a sink must not start a cluster).

The metric names the rest of agentrl reads back (progress line, report) are listed in
``FIELDS``: each display field takes the first of its names present in a step's metrics, so the
loop may log ``train/success`` or plain ``success``.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.common.files import atomic_write
from agentrl.telemetry.fields import FIELDS, METRICS_FILE, pick  # noqa: F401 - their home for the sinks' users
from agentrl.telemetry.trackers import check_trackers, draw_report, open_trackers, run_status

log = logging.getLogger(__name__)

TB_DIR = "tb"


def ray_metric_name(name: str) -> str:
    """Prometheus-safe gauge name: ``train/success`` -> ``agentrl_train_success``."""
    return "agentrl_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)


# Ray's metrics export prefixes every application metric (ray.util.metrics) with "ray_" on each
# node's Prometheus endpoint (tests/test_metrics_export.py scrapes one).
PROMETHEUS_PREFIX = "ray_"


def prometheus_name(name: str) -> str:
    """The name a metric has in Prometheus, as Ray exports the gauge: ``train/success`` ->
    ``ray_agentrl_train_success`` (labelled ``run=<run.name>``, plus Ray's own labels)."""
    return PROMETHEUS_PREFIX + ray_metric_name(name)


def keep_steps_through(path: str | Path, step: int) -> list[dict]:
    """Rewrite the JSONL file ``path`` keeping only the records with ``"step"`` <= ``step`` (and any
    line that is not such a record); returns the records kept. A torn last line (the process died
    while writing it) is dropped. The rewrite is atomic (``atomic_write``).
    No file: nothing to do."""
    path = Path(path)
    if not path.exists():
        return []
    kept_lines, kept = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] > step:
            continue
        kept_lines.append(line)
        kept.append(record)
    atomic_write(path, "".join(x + "\n" for x in kept_lines))
    return [r for r in kept if isinstance(r, dict)]


def _scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Keep values that are numbers (int, bool, numpy/torch 0-d); drop the rest silently."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, (str, bytes)) or value is None:
            continue
        try:
            out[str(name)] = float(value)
        except (TypeError, ValueError):
            continue
    return out


class MetricsSink:
    """Writes each step's scalars to ``run_dir/metrics.jsonl``, ``run_dir/tb``, Ray gauges and the
    configured experiment trackers.

    ``telemetry_cfg`` is a ``TelemetryConfig`` (``jsonl``, ``tensorboard``, ``ray_metrics``,
    ``loggers``); None means the first three on and no tracker. A tracker whose package is missing
    stops the sink at once (``TrackerUnavailable``, naming the extra); one that fails to start or
    to log is warned about, like the other sinks. ``close`` ends the tracker runs with the report
    and the run's status (``trackers.run_status``).

    ``resume_after=k`` continues the files of a run resumed from its checkpoint at step k: rows of
    ``metrics.jsonl`` for steps after k (written before the run died, and about to be written
    again) are dropped first, so the file keeps one row per step (plus evaluation rows), and
    ``elapsed_s`` goes on from the last row kept. TensorBoard gets ``purge_step=k+1``: events
    after step k in the old event files are hidden from then on (torch's SummaryWriter; the
    fallback writer cannot purge). Ray gauges keep no history. Trackers continue the tracker runs named
    in the run folder's ``trackers.json`` (telemetry/trackers.py says what they keep of the redone steps).
    """

    def __init__(self, run_dir: str | Path, telemetry_cfg: Any = None, run_name: str = "agentrl",
                 resume_after: int | None = None):
        self.run_dir = Path(run_dir)
        self.run_name = str(run_name)
        self._use_jsonl = bool(getattr(telemetry_cfg, "jsonl", True))
        self._use_tb = bool(getattr(telemetry_cfg, "tensorboard", True))
        self._use_ray = bool(getattr(telemetry_cfg, "ray_metrics", True))
        loggers = list(getattr(telemetry_cfg, "loggers", None) or [])
        check_trackers(loggers)  # before any file is opened: a missing package is a setup error
        self._warned: set[str] = set()
        # first: starting them takes seconds (imports, W&B's service), which elapsed_s should not count
        self._trackers = open_trackers(loggers, self.run_dir, resume_after is not None, self._warn) if loggers else []
        self._resume_after = resume_after
        self._start = time.time()
        if resume_after is not None:
            kept = keep_steps_through(self.run_dir / METRICS_FILE, resume_after)
            self._start -= float(kept[-1].get("elapsed_s") or 0.0) if kept else 0.0
        self._jsonl = None
        self._tb = None
        self._gauges: dict[str, Any] = {}
        self._closed = False
        if self._use_jsonl:
            self._guard("jsonl", self._open_jsonl)
        if self._use_tb:
            self._guard("tensorboard", self._open_tb)

    # -- setup ---------------------------------------------------------------------------------

    def _open_jsonl(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.run_dir / METRICS_FILE, "a", encoding="utf-8", buffering=1)

    def _open_tb(self) -> None:
        path = self.run_dir / TB_DIR
        path.mkdir(parents=True, exist_ok=True)
        try:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if self._resume_after is None else self._resume_after + 1
            self._tb = SummaryWriter(str(path), purge_step=purge)
        except Exception as err:  # torch missing or torch/tensorboard version skew
            log.debug("torch SummaryWriter unavailable (%s); using tensorboard.summary.Writer", err)
            from tensorboard.summary import Writer

            self._tb = Writer(str(path))

    # -- logging -------------------------------------------------------------------------------

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record ``metrics`` (name -> number; non-numbers are skipped) for training ``step``."""
        if self._closed:
            return
        values = _scalars(metrics)
        step = int(step)
        if self._jsonl is not None:
            self._guard("jsonl", self._write_jsonl, step, values)
        if self._tb is not None:
            self._guard("tensorboard", self._write_tb, step, values)
        if self._use_ray and self._ray_ready():
            self._guard("ray_metrics", self._write_ray, values)
        for tracker in self._trackers:
            self._guard(f"tracker {tracker.name}", tracker.log, step, values)

    def _write_jsonl(self, step: int, values: dict[str, float]) -> None:
        now = time.time()
        # JSON has no NaN/Infinity; write null so every line parses everywhere
        record = {"step": step, "time": round(now, 3), "elapsed_s": round(now - self._start, 3)}
        record.update({k: (v if math.isfinite(v) else None) for k, v in values.items()})
        self._jsonl.write(json.dumps(record) + "\n")

    def _write_tb(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self._tb.add_scalar(name, value, step)
        self._tb.flush()  # steps are seconds apart; make TensorBoard show them now

    @staticmethod
    def _ray_ready() -> bool:
        ray = sys.modules.get("ray")  # never import Ray here: the driver decides whether it runs
        try:
            return ray is not None and ray.is_initialized()
        except Exception:
            return False

    def _write_ray(self, values: dict[str, float]) -> None:
        from ray.util.metrics import Gauge

        tags = {"run": self.run_name}
        for name, value in values.items():
            if not math.isfinite(value):
                continue
            key = ray_metric_name(name)
            gauge = self._gauges.get(key)
            if gauge is None:
                gauge = self._gauges[key] = Gauge(key, description=f"agentrl metric {name}",
                                                  tag_keys=("run",))
            gauge.set(value, tags=tags)

    def _guard(self, sink: str, fn, *args) -> None:
        """Run one sink's work; on failure warn once per sink and keep training going."""
        try:
            fn(*args)
        except Exception as err:
            self._warn(sink, err)

    def _warn(self, sink: str, err: Exception) -> None:
        if sink not in self._warned:
            self._warned.add(sink)
            log.warning("telemetry sink %s failed (further failures not reported): %r", sink, err)

    # -- teardown ------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush and close the files; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._jsonl is not None:
            self._guard("jsonl", self._jsonl.close)
            self._jsonl = None
        if self._tb is not None:
            self._guard("tensorboard", self._tb.close)
            self._tb = None
        if self._trackers:
            self._finish_trackers()

    def _finish_trackers(self) -> None:
        """End each tracker run with the report of the now complete ``metrics.jsonl`` and the run's status."""
        status = run_status()  # read first: drawing the report must not be what it sees
        report = None
        if self._use_jsonl:
            try:
                report = draw_report(self.run_dir / METRICS_FILE)
            except Exception as err:
                self._warn("report for the trackers", err)
        for tracker in self._trackers:
            self._guard(f"tracker {tracker.name}", tracker.finish, report, status)
        self._trackers = []

    def __enter__(self) -> MetricsSink:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
