"""Preemption: SIGTERM → the step in progress finishes → checkpoint → exit 75 (EXIT_PREEMPTED);
the same command with ``--resume auto`` continues from that checkpoint, in the same run folder.

In process (the session's Ray cluster): the test sends SIGTERM to itself once step 2 is logged,
as a launcher or Kubernetes would to the driver. What the resumed run equals: the learner state
it loads is the saved one bit for bit (digest), and every step is logged once; its rollouts after
the resume are not the uninterrupted run's (the engines' sampling streams are seeded again at the
resume step), which tests/test_resume.py's exactness tests cover where the rollouts are the same.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.config import dump_config, load_config
from agentrl.runtime.checkpoint import LATEST, complete_checkpoints
from agentrl.runtime.preemption import EXIT_PREEMPTED
from agentrl.telemetry.metrics import METRICS_FILE

pytestmark = pytest.mark.integration


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _sigterm_when(predicate, timeout_s: float = 900) -> threading.Thread:
    def watch():
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_sigterm_checkpoints_and_resume_auto_continues(tiny_model_dir, ray_cluster, tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text(dump_config(load_config(None, [
        f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path / 'runs'}", "run.name=job", "tasks.heldout_size=2",
        "rollout.group_size=2", "rollout.tasks_per_step=2", "rollout.max_new_tokens=48", "learner.micro_batch_size=4",
        "learner.lr=1e-3", "train.steps=5", "train.checkpoint_every=2", "train.keep_checkpoints=1",
        "train.eval_at_start=false", "train.eval_at_end=false", "telemetry.progress=false",
        "telemetry.trajectories_every=0", "telemetry.ray_metrics=false", "telemetry.tensorboard=false"])))
    run = tmp_path / "runs" / "job"
    (run / "stale.txt").parent.mkdir(parents=True)
    (run / "stale.txt").write_text("an attempt that died before its first checkpoint")

    watcher = _sigterm_when(lambda: any(r.get("step") == 3 for r in _jsonl(run / METRICS_FILE)))
    assert main(["train", str(config), "--resume", "auto"]) == EXIT_PREEMPTED
    watcher.join(timeout=1)
    assert [p.name for p in (tmp_path / "runs").glob("job.attempt-*")] and not (run / "stale.txt").exists()
    stopped = [r["step"] for r in _jsonl(run / METRICS_FILE)]
    last = stopped[-1]
    assert last >= 3 and stopped == list(range(1, last + 1))  # the step in progress finished
    assert (run / LATEST).read_text().strip() == f"checkpoint-{last}"
    assert [s for s, _ in complete_checkpoints(run)] == [last]  # keep_checkpoints=1 pruned checkpoint-2
    assert not (run / "final").exists()

    assert main(["train", str(config), "--resume", "auto"]) == 0
    (resumed,) = _jsonl(run / "resumes.jsonl")
    assert resumed["step"] == last and resumed["learner_digest_match"]
    assert [r["step"] for r in _jsonl(run / METRICS_FILE)] == [1, 2, 3, 4, 5]
    assert [r["train/policy_version"] for r in _jsonl(run / METRICS_FILE)] == [1, 2, 3, 4, 5]
    assert [s for s, _ in complete_checkpoints(run)] == [5] and (run / "final").is_dir()


@pytest.mark.heavy
def test_a_lost_learner_stops_the_run_resumably_and_resume_auto_recovers(tiny_model_dir, ray_cluster, tmp_path,
                                                                         monkeypatch):
    """The learner killed during step 2's update: the run stops with EXIT_PREEMPTED (nothing can be
    saved without the learner; checkpoint-1 is the newest), and ``--resume auto`` continues from
    checkpoint-1: steps 2 and 3 are trained, each logged once."""
    import ray

    from agentrl.runtime import driver

    learn = driver.Trainer._learn

    def kill_then_learn(self, step, *args, **kwargs):
        if step == 2:
            ray.kill(self.learner.ranks[0])
        return learn(self, step, *args, **kwargs)

    config = tmp_path / "job.yaml"
    config.write_text(dump_config(load_config(None, [
        f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path / 'runs'}", "run.name=job", "tasks.heldout_size=2",
        "rollout.group_size=2", "rollout.tasks_per_step=2", "rollout.max_new_tokens=48", "learner.micro_batch_size=4",
        "train.steps=3", "train.checkpoint_every=1", "train.eval_at_start=false", "train.eval_at_end=false",
        "telemetry.progress=false", "telemetry.trajectories_every=0", "telemetry.ray_metrics=false",
        "telemetry.tensorboard=false", "telemetry.trace=false"])))
    run = tmp_path / "runs" / "job"
    with monkeypatch.context() as patch:
        patch.setattr(driver.Trainer, "_learn", kill_then_learn)
        assert main(["train", str(config), "--resume", "auto"]) == EXIT_PREEMPTED
    assert [r["step"] for r in _jsonl(run / METRICS_FILE)] == [1]
    assert [s for s, _ in complete_checkpoints(run)] == [1]

    assert main(["train", str(config), "--resume", "auto"]) == 0
    (resumed,) = _jsonl(run / "resumes.jsonl")
    assert resumed["step"] == 1 and resumed["learner_digest_match"]
    assert [r["step"] for r in _jsonl(run / METRICS_FILE)] == [1, 2, 3]
    assert [r["train/policy_version"] for r in _jsonl(run / METRICS_FILE)] == [1, 2, 3]
