"""Experiment trackers (``telemetry.loggers``: ``mlflow``, ``wandb``): the run's metrics, its
resolved config and ``report.png``, in the tracker a team already uses.

``MetricsSink`` (telemetry/metrics.py) drives them, so a tracker gets exactly what
``metrics.jsonl`` gets: the same names and steps (values that are not finite, written as null
there, are left out here). At start each tracker gets the resolved config the driver saved as
``RUN/config.yaml`` (MLflow: flattened ``section.key`` params and the file as an artifact;
W&B: the nested config); at the end, when the sink closes, the report drawn from the finished
``metrics.jsonl`` (the same picture the driver then writes as ``RUN/report.png``) and the run's
status (an exception in flight when the sink closes marks the run failed).

The packages are an optional extra (``pip install -e '.[trackers]'`` in the agentrl clone: the
``agentrl`` distribution on PyPI is another project; docker/Dockerfile.gpu has it) imported only when a
tracker is configured; ``check_trackers`` names the extra before anything starts. Settings come
from the trackers' own environment variables; agentrl only fills in what keeps a run local and
reproducible when they are unset:

* MLflow: ``MLFLOW_TRACKING_URI``, else a store beside the runs, ``<run.output_dir>/mlruns``: the
  SQLite database ``mlflow.db`` (MLflow's own default backend, which its file store now refuses
  to replace) and the artifacts under ``artifacts/`` (MLflow would put them under the current
  folder); ``MLFLOW_EXPERIMENT_NAME``, else ``agentrl``. The run is named after the run folder.
* W&B: ``WANDB_MODE``, else ``offline`` (no account or network needed; ``wandb sync RUN/wandb/...``
  uploads later); ``WANDB_PROJECT``, else ``agentrl``; ``WANDB_DIR``, else the run folder.

A resumed run (``--resume``) continues the same tracker runs: their ids are kept in
``RUN/trackers.json``. MLflow then holds two values for the steps redone after the checkpoint
(charts show the later); W&B keeps the first and ignores steps at or below the last it has.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from agentrl.config import InputError

IDS_FILE = "trackers.json"
CONFIG_FILE = "config.yaml"  # written by the driver (driver/trainer.py) before the sink exists
DEFAULT_PROJECT = "agentrl"
# (module to find, pip package) per tracker
PACKAGES = {"mlflow": ("mlflow", "mlflow-skinny"), "wandb": ("wandb", "wandb")}
SQL_STORE = [("sqlalchemy", "sqlalchemy"), ("alembic", "alembic")]  # MLflow's SQLite store: agentrl's default
PARAM_CHARS = 500  # older MLflow servers refuse longer param values; the whole config is an artifact


class TrackerUnavailable(InputError):
    """A configured tracker's package is missing: bad input like the runtime's others (the CLI
    prints it and exits 2)."""


def check_trackers(names: Iterable[str]) -> None:
    """Raise ``TrackerUnavailable`` naming the extra when a configured tracker is not installed
    (found without importing it: mlflow and wandb take seconds to import)."""
    missing = []
    for name in names:
        needed = [PACKAGES[name]]
        if name == "mlflow" and os.environ.get("MLFLOW_TRACKING_URI", "sqlite:").startswith("sqlite:"):
            needed += SQL_STORE
        missing += [f"{name} (pip package {pip})" for module, pip in needed if importlib.util.find_spec(module) is None]
    if missing:
        raise TrackerUnavailable(f"telemetry.loggers: {', '.join(missing)} not installed: "
                                 "pip install -e '.[trackers]' in the agentrl clone (the agentrl on PyPI is another "
                                 "project)")


def open_trackers(names: Iterable[str], run_dir: Path, resume: bool, warn) -> list[Tracker]:
    """The configured trackers, started; one that fails to start is reported with ``warn(name, err)``
    and left out (telemetry must not end a run). ``resume``: continue the runs in ``RUN/trackers.json``."""
    names = list(dict.fromkeys(names))
    check_trackers(names)
    ids = _read_ids(run_dir) if resume else {}
    config = _read_config(run_dir)
    trackers: list[Tracker] = []
    for name in names:
        try:
            trackers.append(TRACKERS[name](run_dir, config, ids.get(name)))
        except Exception as err:
            warn(f"tracker {name}", err)
    if trackers:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / IDS_FILE).write_text(json.dumps({t.name: t.ids for t in trackers}, indent=1))
    return trackers


def run_status() -> str:
    """How the run ends, read from the exception being handled when the sink closes: the driver
    closes it inside its ``except`` on a failure, so none in flight means the run finished."""
    err = sys.exc_info()[1]
    if err is None:
        return "FINISHED"
    # Preempted (checkpointing/preemption.py, a layer above this one) and Ctrl-C stop a healthy run
    return "KILLED" if isinstance(err, KeyboardInterrupt) or type(err).__name__ == "Preempted" else "FAILED"


def finite(values: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in values.items() if math.isfinite(v)}


class Tracker:
    name = ""
    ids: dict[str, str] = {}

    def log(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def finish(self, report: Path | None, status: str) -> None:
        raise NotImplementedError


class MlflowTracker(Tracker):
    """One MLflow run per agentrl run, through ``MlflowClient`` (no global active-run state)."""

    name = "mlflow"

    def __init__(self, run_dir: Path, config: dict | None, previous: dict | None):
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        store = run_dir.resolve().parent / "mlruns"
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{store / 'mlflow.db'}"
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            store.mkdir(parents=True, exist_ok=True)  # SQLite creates the file, not its folder
        self.client = MlflowClient(tracking_uri=uri)
        if previous and previous.get("tracking_uri") == uri:
            self.run_id = previous["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
            found = self.client.get_experiment_by_name(experiment)
            if found is not None:
                exp_id = found.experiment_id
            else:  # agentrl's own store keeps its artifacts beside the database, not under the cwd
                where = None if os.environ.get("MLFLOW_TRACKING_URI") else (store / "artifacts").as_uri()
                exp_id = self.client.create_experiment(experiment, artifact_location=where)
            run = self.client.create_run(exp_id, run_name=run_dir.name, tags={"agentrl.run_dir": str(run_dir.resolve())})
            self.run_id = run.info.run_id
            params = [Param(k, v[:PARAM_CHARS]) for k, v in flatten(config or {}).items()]
            for i in range(0, len(params), 100):  # MLflow's batch limit
                self.client.log_batch(self.run_id, params=params[i:i + 100], tags=[RunTag("agentrl", "1")] if i == 0 else [])
            if (run_dir / CONFIG_FILE).exists():
                self.client.log_artifact(self.run_id, str(run_dir / CONFIG_FILE))
        self.ids = {"tracking_uri": uri, "run_id": self.run_id}

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in finite(values).items()]
        for i in range(0, len(metrics), 1000):  # MLflow's batch limit
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def finish(self, report: Path | None, status: str) -> None:
        try:
            if report is not None:
                self.client.log_artifact(self.run_id, str(report))
        finally:
            self.client.set_terminated(self.run_id, status=status)


class WandbTracker(Tracker):
    """One W&B run per agentrl run; offline unless WANDB_MODE says otherwise."""

    name = "wandb"

    def __init__(self, run_dir: Path, config: dict | None, previous: dict | None):
        import wandb

        # console="off": W&B would otherwise wrap stdout/stderr, where the progress line and Ray's
        # actor logs go; the run folder and the driver's output keep them.
        kwargs: dict[str, Any] = dict(project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT, name=run_dir.name,
                                      config=config or {}, reinit="create_new",
                                      settings=wandb.Settings(console="off"))
        if not os.environ.get("WANDB_MODE"):
            kwargs["mode"] = "offline"
        if not os.environ.get("WANDB_DIR"):
            kwargs["dir"] = str(run_dir)
        if previous and previous.get("id"):
            kwargs.update(id=previous["id"], resume="allow")
        self.wandb = wandb
        self.run = wandb.init(**kwargs)
        self.ids = {"id": self.run.id, "project": str(kwargs["project"])}

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(finite(values), step=step)

    def finish(self, report: Path | None, status: str) -> None:
        try:
            if report is not None:
                artifact = self.wandb.Artifact(f"report-{self.run.id}", type="report")
                artifact.add_file(str(report))
                self.run.log_artifact(artifact)
        finally:
            self.run.finish(exit_code=0 if status == "FINISHED" else 1)


TRACKERS: dict[str, type[Tracker]] = {"mlflow": MlflowTracker, "wandb": WandbTracker}


def draw_report(metrics_file: Path) -> Path | None:
    """``report.png`` beside the closed ``metrics_file``; None without one (telemetry.jsonl off)."""
    from agentrl.telemetry.report import write_report  # matplotlib: only when a tracker wants the report

    return write_report(metrics_file.parent) if metrics_file.exists() else None


def flatten(tree: dict, prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``; lists and nulls as JSON text."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value)
    return out


def _read_config(run_dir: Path) -> dict | None:
    try:
        tree = yaml.safe_load((run_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return tree if isinstance(tree, dict) else None


def _read_ids(run_dir: Path) -> dict:
    try:
        ids = json.loads((run_dir / IDS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return ids if isinstance(ids, dict) else {}
