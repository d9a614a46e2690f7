"""A resumed run on different capacity (issue 40): a run that lost a node goes on with what is left.

* ``rollout.num_workers`` may change on ``--resume`` (``RESUMABLE``): the tasks a step draws and the
  in-flight rollouts a checkpoint keeps do not depend on how many engines roll them out;
* ``learner.num_ranks`` may not: the checkpoint is DeepSpeed's ZeRO checkpoint of that many ranks
  (DeepSpeed's universal checkpoints, which could re-partition it, are not used), and the error
  names the key, both values and the way to go on with another number of ranks;
* end to end (the session's Ray cluster): a run with 2 rollout engines is stopped by a SIGTERM to
  the driver after a checkpoint, and ``--resume auto rollout.num_workers=1`` finishes it on one
  engine: the learner state it loads is the saved one (digest), every step is logged once, the
  policy versions go on, and the run's config.yaml records the new capacity.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from agentrl.config import ConfigError, dump_config, load_config
from agentrl.config.resume import load_resume_config, resumable

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_MODEL = ROOT / "agentrl" / "assets" / "tiny-agent"


def _run_dir(tmp_path: Path, *overrides: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    cfg = load_config(None, [f"model.path={SHIPPED_MODEL}", *overrides])
    (run / "config.yaml").write_text(dump_config(cfg))
    return run


def test_rollout_workers_may_change_on_resume_learner_ranks_may_not(tmp_path):
    run = _run_dir(tmp_path, "rollout.num_workers=4", "learner.num_ranks=2")
    assert resumable("rollout.num_workers") and not resumable("learner.num_ranks")
    assert load_resume_config(run, ["rollout.num_workers=1"]).rollout.num_workers == 1
    assert load_resume_config(run, ["rollout.num_workers=8"]).rollout.num_workers == 8
    # an engine killed for GPU memory resumes with a smaller share; its cores may move
    moved = load_resume_config(run, ["rollout.engine.gpu_memory_utilization=0.3", "rollout.engine.cpu_threads_bind=0",
                                     "learner.threads=1", "rspo.explorer_cpu_threads_bind=1"])
    assert (moved.rollout.engine.gpu_memory_utilization, moved.rollout.engine.cpu_threads_bind) == (0.3, "0")
    assert (moved.learner.threads, moved.rspo.explorer_cpu_threads_bind) == (1, "1")
    with pytest.raises(ConfigError) as err:
        load_resume_config(run, ["rollout.num_workers=2", "learner.num_ranks=1"])
    text = str(err.value)
    assert text.startswith(f"{run / 'config.yaml'}: learner.num_ranks: cannot change on --resume from 2 to 1 "
                           "(set by override 'learner.num_ranks=1')"), text
    assert "universal checkpoints" in text and "model.path=RUN/checkpoint-K learner.num_ranks=1" in text
    assert err.value.key == "learner.num_ranks"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.integration
@pytest.mark.heavy  # ~75 s; make test keeps test_preemption.py's SIGTERM -> --resume auto and the config test above
def test_a_preempted_run_resumes_on_fewer_rollout_workers(tiny_model_dir, ray_cluster, tmp_path, capsys):
    from agentrl.checkpointing.checkpoint import LATEST
    from agentrl.checkpointing.preemption import EXIT_PREEMPTED
    from agentrl.cli import main
    from agentrl.telemetry.metrics import METRICS_FILE

    config = tmp_path / "job.yaml"
    config.write_text(dump_config(load_config(None, [
        f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path / 'runs'}", "run.name=job", "tasks.heldout_size=2",
        "rollout.num_workers=2", "rollout.group_size=2", "rollout.tasks_per_step=2", "rollout.max_new_tokens=48",
        "learner.micro_batch_size=4", "learner.lr=1e-3", "train.steps=4", "train.checkpoint_every=2",
        "train.eval_at_start=false", "train.eval_at_end=false", "telemetry.progress=false",
        "telemetry.trajectories_every=0", "telemetry.ray_metrics=false", "telemetry.tensorboard=false"])))
    run = tmp_path / "runs" / "job"

    def sigterm_after_step_1():
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if any(r.get("step") == 1 for r in _jsonl(run / METRICS_FILE)):
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=sigterm_after_step_1, daemon=True)
    watcher.start()
    assert main(["train", str(config), "--resume", "auto"]) == EXIT_PREEMPTED
    watcher.join(timeout=1)
    first = capsys.readouterr().out
    assert "rollout engines ready (" in first and first.split("rollout engines ready (")[1].split(")")[0].count("s") == 2
    stopped = [r["step"] for r in _jsonl(run / METRICS_FILE)]
    last = stopped[-1]
    assert last < 4 and stopped == list(range(1, last + 1))
    assert (run / LATEST).read_text().strip() == f"checkpoint-{last}"

    assert main(["train", str(config), "rollout.num_workers=1", "--resume", "auto"]) == 0
    second = capsys.readouterr().out
    engines = second.split("rollout engines ready (")[1].split(")")[0]
    assert engines.count("s") == 1, second  # one engine now
    (resumed,) = _jsonl(run / "resumes.jsonl")
    assert resumed["step"] == last and resumed["learner_digest_match"]
    rows = _jsonl(run / METRICS_FILE)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["train/policy_version"] for r in rows] == [1, 2, 3, 4]
    assert load_config(run / "config.yaml").rollout.num_workers == 1
    assert (run / "final").is_dir()
