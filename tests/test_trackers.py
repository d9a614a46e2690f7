"""Experiment trackers (``telemetry.loggers``), driven through the real ``MetricsSink`` as the driver
drives it (config.yaml in the run folder, a few steps of metrics, evaluations, close), and read
back from what the trackers wrote: a real MLflow SQLite store (``MlflowClient``) and a real offline
W&B run (its ``.wandb`` transaction log). No network.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from agentrl.config import InputError, dump_config, load_config
from agentrl.telemetry import trackers
from agentrl.telemetry.metrics import METRICS_FILE, MetricsSink
from agentrl.telemetry.report import read_metrics

STEPS = {
    1: {"train/success": 0.25, "train/progress": 0.5, "time/generate": 3.5, "train/kl": float("nan"), "note": "text"},
    2: {"train/success": 0.5, "train/progress": 0.625, "time/generate": 3.25, "train/kl": 0.01, "done": True},
    3: {"train/success": 0.75, "train/progress": 0.75, "time/generate": 3.0, "train/kl": 0.02},
}
EVALS = {0: {"eval/success": 0.3, "eval/success/base": 0.5}, 3: {"eval/success": 0.6, "eval/success/base": 0.75}}


def run_folder(tmp_path: Path, loggers: str) -> tuple[Path, object]:
    """A run folder as the driver makes it: the resolved config saved as config.yaml."""
    cfg = load_config(None, [f"telemetry.loggers={loggers}", "rollout.max_new_tokens=77", "run.name=trk",
                             "telemetry.tensorboard=false"])
    run_dir = tmp_path / "runs" / "trk-20250101-000000"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    return run_dir, cfg


def drive(sink: MetricsSink, steps=STEPS, evals=EVALS) -> None:
    """The driver's order: the start evaluation at step 0, then each step's metrics (and the final
    evaluation at the last step, after its metrics)."""
    if 0 in evals:
        sink.log(0, evals[0])
    for step, metrics in steps.items():
        sink.log(step, metrics)
        if step in evals and step:
            sink.log(step, evals[step])


def jsonl_series(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(step, value)] from metrics.jsonl (nulls, the non-finite values, left out)."""
    out: dict[str, list] = {}
    for row in read_metrics(run_dir / METRICS_FILE):
        for key, value in row.items():
            if key not in ("step", "time", "elapsed_s") and value is not None:
                out.setdefault(key, []).append((row["step"], value))
    return out


@pytest.fixture
def tracker_env(tmp_path, monkeypatch):
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_MODE", "WANDB_PROJECT", "WANDB_DIR",
                "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    return tmp_path


# ---------------------------------------------------------------------------------- MLflow

def mlflow_run(run_dir: Path):
    from mlflow.tracking import MlflowClient

    ids = json.loads((run_dir / trackers.IDS_FILE).read_text())["mlflow"]
    client = MlflowClient(tracking_uri=ids["tracking_uri"])
    return client, client.get_run(ids["run_id"])


def test_mlflow_gets_the_jsonl_metrics_the_config_and_the_report(tracker_env):
    run_dir, cfg = run_folder(tracker_env, "[mlflow]")
    with MetricsSink(run_dir, cfg.telemetry, cfg.run.name) as sink:
        drive(sink)
    client, run = mlflow_run(run_dir)
    # default store: SQLite + artifacts beside the runs, in experiment "agentrl", the run named after its folder
    store = tracker_env / "runs" / "mlruns"
    assert run.info.artifact_uri.startswith((store / "artifacts").as_uri()) and (store / "mlflow.db").is_file()
    assert client.get_experiment(run.info.experiment_id).name == "agentrl"
    assert run.info.run_name == run_dir.name and run.info.status == "FINISHED"

    expected = jsonl_series(run_dir)
    assert "train/kl" in expected and len(expected["train/kl"]) == 2  # the NaN step is null there, absent here
    got = {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
           for key in run.data.metrics}
    assert got == expected

    assert run.data.params["rollout.max_new_tokens"] == "77"
    assert run.data.params["telemetry.loggers"] == '["mlflow"]'
    assert run.data.params["model.path"] == cfg.model.path
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"config.yaml", "report.png"}
    local = Path(client.download_artifacts(run.info.run_id, "report.png", str(tracker_env / "dl")))
    assert local.read_bytes() == (run_dir / "report.png").read_bytes()  # the report of the finished metrics


def test_mlflow_run_is_failed_when_closed_on_an_error_and_continued_on_resume(tracker_env, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tracker_env / 'store.db'}")
    monkeypatch.chdir(tracker_env)  # a store of the user's own: MLflow puts its artifacts under ./mlruns
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "exp-x")
    run_dir, cfg = run_folder(tracker_env, "[mlflow]")
    sink = MetricsSink(run_dir, cfg.telemetry, cfg.run.name)
    drive(sink, steps={1: STEPS[1], 2: STEPS[2]}, evals={})
    try:
        raise RuntimeError("the run failed")
    except RuntimeError:
        sink.close()  # the driver closes the sink inside its `except` on a failure
    client, run = mlflow_run(run_dir)
    assert run.info.status == "FAILED" and client.get_experiment(run.info.experiment_id).name == "exp-x"
    first = run.info.run_id

    # resumed from the checkpoint at step 1: the same MLflow run goes on, step 2 is logged again
    with MetricsSink(run_dir, cfg.telemetry, cfg.run.name, resume_after=1) as sink:
        drive(sink, steps={2: {"train/success": 0.55}, 3: STEPS[3]}, evals={})
    client, run = mlflow_run(run_dir)
    assert run.info.run_id == first and run.info.status == "FINISHED"
    history = sorted((m.step, m.value) for m in client.get_metric_history(first, "train/success"))
    assert history == [(1, 0.25), (2, 0.5), (2, 0.55), (3, 0.75)]
    assert [r["train/success"] for r in read_metrics(run_dir / METRICS_FILE)] == [0.25, 0.55, 0.75]
    # the documented rule (docs/operating.md, "The run folder after a resume"): per metric and step
    # of metrics.jsonl, the value logged last is metrics.jsonl's
    for key, series in jsonl_series(run_dir).items():
        last: dict[int, tuple[int, float]] = {}
        for m in client.get_metric_history(first, key):
            if m.step not in last or m.timestamp >= last[m.step][0]:
                last[m.step] = (m.timestamp, m.value)
        assert all(last[step][1] == value for step, value in series), key


# ---------------------------------------------------------------------------------- W&B

def wandb_records(path: Path) -> list:
    """The records of a ``.wandb`` file: a 7-byte W&B header, then LevelDB's log format (32 KiB
    blocks of chunks, each ``crc32 | length | type``; FULL=1, FIRST=2, MIDDLE=3, LAST=4)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
    return out


def wandb_flushed() -> None:
    """Wait until W&B's service has written everything. ``run.finish()`` returns once the service
    has the run's exit record, not once its transaction log is on disk: about one test in five
    found no ``.wandb`` file yet on this shared machine. ``wandb.teardown()`` stops the service,
    which closes the logs; the driver's process gets the same at exit (W&B's atexit hook)."""
    import wandb

    wandb.teardown()


def test_wandb_offline_run_gets_the_jsonl_metrics_the_config_and_the_report(tracker_env):
    run_dir, cfg = run_folder(tracker_env, "[wandb]")
    with MetricsSink(run_dir, cfg.telemetry, cfg.run.name) as sink:
        drive(sink)
    wandb_flushed()
    found = list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))  # offline by default, in the run folder
    assert len(found) == 1, sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    log_file = found[0]
    records = wandb_records(log_file)
    kinds = [r.WhichOneof("record_type") for r in records]

    (run,) = [r.run for r in records if r.HasField("run")]
    ids = json.loads((run_dir / trackers.IDS_FILE).read_text())["wandb"]
    assert run.run_id == ids["id"] and run.display_name == run_dir.name and run.project == "agentrl"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["rollout"]["max_new_tokens"] == 77 and config["telemetry"]["loggers"] == ["wandb"]

    rows: dict[int, dict[str, float]] = {}
    for r in records:
        if r.HasField("history"):
            # a name with "/" is stored as its parts (nested_key), W&B's sections
            items = {i.key or "/".join(i.nested_key): i.value_json for i in r.history.item}
            row = {k: json.loads(v) for k, v in items.items() if not k.startswith("_")}
            rows.setdefault(r.history.step.num, {}).update(row)
    got: dict[str, list] = {}
    for step in sorted(rows):
        for key, value in rows[step].items():
            got.setdefault(key, []).append((step, value))
    expected = jsonl_series(run_dir)
    assert got.keys() == expected.keys()
    for key in expected:
        assert [s for s, _ in got[key]] == [s for s, _ in expected[key]]
        assert all(math.isclose(a, b) for (_, a), (_, b) in zip(got[key], expected[key]))

    (artifact,) = [r.artifact for r in records if r.HasField("artifact")]
    assert artifact.type == "report" and [e.path for e in artifact.manifest.contents] == ["report.png"]
    assert kinds[-1] == "exit" and records[-1].exit.exit_code == 0


def wandb_history(log_file: Path) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    for r in wandb_records(log_file):
        if r.HasField("history"):
            items = {i.key or "/".join(i.nested_key): i.value_json for i in r.history.item}
            rows.setdefault(r.history.step.num, {}).update({k: json.loads(v) for k, v in items.items() if not k.startswith("_")})
    return rows


def test_a_resumed_wandb_run_is_sent_the_redone_steps_with_the_resumed_values(tracker_env):
    """The W&B half of the resume rule: agentrl continues the same W&B run and sends it the steps
    after the checkpoint again, with the resumed run's values (a W&B server then keeps the first
    values of those steps, since its steps must increase; docs/operating.md)."""
    run_dir, cfg = run_folder(tracker_env, "[wandb]")
    with MetricsSink(run_dir, cfg.telemetry, cfg.run.name) as sink:
        drive(sink, steps={1: STEPS[1], 2: STEPS[2]}, evals={})
    wandb_flushed()
    with MetricsSink(run_dir, cfg.telemetry, cfg.run.name, resume_after=1) as sink:
        drive(sink, steps={2: {"train/success": 0.55}, 3: STEPS[3]}, evals={})
    wandb_flushed()
    logs = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(logs) == 2, logs
    ids = {r.run.run_id for log in logs for r in wandb_records(log) if r.HasField("run")}
    assert ids == {json.loads((run_dir / trackers.IDS_FILE).read_text())["wandb"]["id"]}  # one W&B run
    first, resumed = (wandb_history(log) for log in logs)
    assert first[2]["train/success"] == 0.5 and resumed[2]["train/success"] == 0.55 and resumed[3]["train/success"] == 0.75
    assert 1 not in resumed  # the steps up to the checkpoint are not sent again
    assert [r["train/success"] for r in read_metrics(run_dir / METRICS_FILE)] == [0.25, 0.55, 0.75]


# ---------------------------------------------------------------------------------- setup errors

def test_a_missing_tracker_package_names_the_extra_before_any_file(tracker_env, monkeypatch):
    monkeypatch.setitem(trackers.PACKAGES, "wandb", ("agentrl_test_no_such_module", "wandb"))
    run_dir, cfg = run_folder(tracker_env, "[mlflow, wandb]")
    with pytest.raises(InputError) as err:
        MetricsSink(run_dir, cfg.telemetry, cfg.run.name)
    assert str(err.value) == ("telemetry.loggers: wandb (pip package wandb) not installed: "
                                   "pip install -e '.[trackers]' in the agentrl clone (the agentrl on PyPI is another "
                                   "project)")
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml"]


def test_a_tracker_that_cannot_start_is_warned_about_and_the_rest_goes_on(tracker_env, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://nowhere")
    run_dir, cfg = run_folder(tracker_env, "[mlflow, wandb]")
    with MetricsSink(run_dir, cfg.telemetry, cfg.run.name) as sink:
        drive(sink)
    assert "telemetry sink tracker mlflow failed" in caplog.text
    assert list(json.loads((run_dir / trackers.IDS_FILE).read_text())) == ["wandb"]
    assert len(read_metrics(run_dir / METRICS_FILE)) == 5  # steps 0-3 and the final evaluation
    wandb_flushed()
    assert list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
