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
from ray_nodes import free_ports

from agentrl.checkpointing.checkpoint import LATEST, complete_checkpoints
from agentrl.checkpointing.preemption import EXIT_PREEMPTED
from agentrl.cli import main
from agentrl.config import dump_config, load_config
from agentrl.telemetry.metrics import METRICS_FILE

pytestmark = pytest.mark.integration


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _logged(path: Path) -> list[dict]:
    """``_jsonl`` while another thread may be writing: a line read half-written counts as not yet there."""
    try:
        return _jsonl(path)
    except ValueError:
        return []


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


def test_sigterm_checkpoints_and_resume_auto_continues(tiny_model_dir, ray_cluster, tmp_path, capsys):
    """SIGTERM during step 3 (sent once step 3's tasks are stored, before its update, so strictly
    after the driver looked for a signal following step 2): step 3 finishes, its periodic held-out
    evaluation is skipped (a grace period is for the checkpoint), checkpoint-3, exit 75; the resume
    continues with steps 4 and 5."""
    config = tmp_path / "job.yaml"
    config.write_text(dump_config(load_config(None, [
        f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path / 'runs'}", "run.name=job", "tasks.heldout_size=2",
        "rollout.group_size=2", "rollout.tasks_per_step=2", "rollout.max_new_tokens=48", "learner.micro_batch_size=4",
        "learner.lr=1e-3", "train.steps=5", "train.checkpoint_every=3", "train.eval_every=3", "train.keep_checkpoints=1",
        "train.eval_at_start=false", "train.eval_at_end=false", "telemetry.progress=false",
        "telemetry.trajectories_every=0", "telemetry.ray_metrics=false", "telemetry.tensorboard=false"])))
    run = tmp_path / "runs" / "job"
    (run / "stale.txt").parent.mkdir(parents=True)
    (run / "stale.txt").write_text("an attempt that died before its first checkpoint")

    watcher = _sigterm_when(lambda: any(r.get("step") == 3 for r in _logged(run / "tasks.jsonl")))
    assert main(["train", str(config), "--resume", "auto"]) == EXIT_PREEMPTED
    watcher.join(timeout=1)
    assert [p.name for p in (tmp_path / "runs").glob("job.attempt-*")] and not (run / "stale.txt").exists()
    rows = _jsonl(run / METRICS_FILE)
    assert [r["step"] for r in rows] == [1, 2, 3]  # the step in progress finished
    assert not [k for r in rows for k in r if k.startswith("eval/")]  # step 3's evaluation waited for no one
    assert "held-out evaluation at step 3 skipped: SIGTERM received" in capsys.readouterr().out
    assert (run / LATEST).read_text().strip() == "checkpoint-3"
    assert [s for s, _ in complete_checkpoints(run)] == [3]
    assert not (run / "final").exists()

    assert main(["train", str(config), "--resume", "auto"]) == 0
    (resumed,) = _jsonl(run / "resumes.jsonl")
    assert resumed["step"] == 3 and resumed["learner_digest_match"]
    assert [r["step"] for r in _jsonl(run / METRICS_FILE)] == [1, 2, 3, 4, 5]
    assert [r["train/policy_version"] for r in _jsonl(run / METRICS_FILE)] == [1, 2, 3, 4, 5]
    assert [s for s, _ in complete_checkpoints(run)] == [5] and (run / "final").is_dir()  # checkpoint-3 pruned


@pytest.mark.heavy
def test_a_lost_learner_stops_the_run_resumably_and_resume_auto_recovers(tiny_model_dir, ray_cluster, tmp_path,
                                                                         monkeypatch):
    """The learner killed during step 2's update: the run stops with EXIT_PREEMPTED (nothing can be
    saved without the learner; checkpoint-1 is the newest), and ``--resume auto`` continues from
    checkpoint-1: steps 2 and 3 are trained, each logged once."""
    import ray

    from agentrl.driver import trainer as driver

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


# ------------------------------------------------------------------ a two-node cluster, SIGTERM to actors
def _processes(mark: str) -> list[int]:
    return [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/cmdline")
            if mark in p.read_bytes().replace(b"\0", b" ").decode(errors="replace")] if Path("/proc").exists() else []


def _actor_pid(title: str, mark: str) -> int:
    """The pid of the process Ray titled ``ray::<title>...`` under this test's cluster (a child of a
    raylet whose command line names the cluster's temp folder ``mark``)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if not cmdline.read_bytes().startswith(f"ray::{title}".encode()):
                continue
            pid = int(cmdline.parent.name)
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if mark in Path(f"/proc/{parent}/cmdline").read_bytes().decode(errors="replace"):
                return pid
        except (OSError, ValueError, IndexError):
            continue
    raise AssertionError(f"no ray::{title} process of this test's cluster")


@pytest.fixture
def two_nodes(tmp_path):
    """A head (3 CPUs) and a worker node (3 CPUs, the custom resource `rollout`) on loopback, in a
    temp folder of their own, without auth (loopback only); stopped by their own pids."""
    import subprocess
    import sys
    import tempfile

    temp = tempfile.mkdtemp(prefix="arw-", dir="/tmp")  # short: Ray's socket paths must fit AF_UNIX
    gcs, client, dashboard, agent_head, agent_worker = free_ports(5)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env["RAY_AUTH_MODE"] = "disabled"
    ray_bin = str(Path(sys.executable).parent / "ray")
    address = f"127.0.0.1:{gcs}"
    common = ["start", "--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]
    nodes = [subprocess.Popen([ray_bin, *common, "--head", "--port", str(gcs), "--num-cpus", "3", "--include-dashboard",
                               "false", "--dashboard-port", str(dashboard), "--dashboard-agent-listen-port",
                               str(agent_head), "--ray-client-server-port", str(client), "--temp-dir", temp],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)]
    try:
        _wait_for_nodes(ray_bin, env, address, 1)
        nodes.append(subprocess.Popen([ray_bin, *common, "--address", address, "--num-cpus", "3", "--resources",
                                       '{"rollout": 1}', "--dashboard-agent-listen-port", str(agent_worker),
                                       "--temp-dir", f"{temp}/worker"],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True))
        _wait_for_nodes(ray_bin, env, address, 2)
        yield env | {"RAY_ADDRESS": address}, temp
    finally:
        for node in nodes:
            try:
                os.killpg(node.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for node in nodes:
            try:
                node.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for pid in _processes(temp) + _processes(f":{gcs}"):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for node in nodes:
            try:
                os.killpg(node.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            node.wait(timeout=30)
        subprocess.run(["rm", "-rf", temp], check=False)


def _wait_for_nodes(ray_bin: str, env: dict, address: str, count: int, timeout: float = 120) -> None:
    import subprocess

    deadline = time.monotonic() + timeout
    while True:
        up = subprocess.run([ray_bin, "status", "--address", address], env=env, capture_output=True, text=True, timeout=60)
        active = up.stdout.split("Active:", 1)[-1].split("Pending:", 1)[0]
        if up.returncode == 0 and active.count("node_") >= count:
            return
        assert time.monotonic() < deadline, f"Ray nodes did not start: {up.stdout}{up.stderr}"
        time.sleep(1)


@pytest.mark.heavy
def test_sigterm_to_a_learner_rank_or_a_rollout_worker_checkpoints_and_resume_auto_continues(tiny_model_dir, two_nodes,
                                                                                              tmp_path):
    """On a two-node cluster (the rollout worker on the worker node, by a custom resource), `agentrl
    train --resume auto` runs as a separate driver, with run.storage. A SIGTERM to the learner
    rank's process: the step in progress finishes, a complete checkpoint is in storage (its
    manifest), exit 75, the notice named in the output.
    The same command again resumes; a SIGTERM to the rollout worker's process (its vLLM engine's
    host) does the same. The third time the run finishes: every step logged once, the learner
    state each resume loaded equal to the saved one (digest)."""
    import subprocess
    import sys

    from agentrl.checkpointing.checkpoint import PREFIX
    from agentrl.checkpointing.storage import Storage

    env, temp = two_nodes
    stored = Storage(tmp_path / "store").child("job")
    config = tmp_path / "job.yaml"
    config.write_text(dump_config(load_config(None, [
        f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path / 'runs'}", "run.name=job", "tasks.heldout_size=2",
        "rollout.group_size=2", "rollout.tasks_per_step=2", "rollout.max_new_tokens=48", "learner.micro_batch_size=4",
        "learner.lr=1e-3", "train.steps=6", "train.checkpoint_every=100", "train.eval_at_start=false",
        "train.eval_at_end=false", "telemetry.progress=false", "telemetry.trajectories_every=0",
        "telemetry.ray_metrics=false", "telemetry.tensorboard=false", "runtime.rollout_worker_resources={rollout: 1}",
        "runtime.learner_cpus=1", "runtime.rollout_worker_cpus=1", f"run.storage={tmp_path / 'store'}"])))
    run = tmp_path / "runs" / "job"

    def attempt(victim: str | None, name: str) -> tuple[int, str]:
        """One `agentrl train --resume auto`; SIGTERM to the process titled ray::<victim> once a step
        past the ones already logged is logged."""
        done = len(_jsonl(run / METRICS_FILE))
        log = tmp_path / f"{name}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "agentrl", "train", str(config), "--resume", "auto"],
                                    cwd=Path(__file__).resolve().parents[1], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            if victim is not None:
                deadline = time.monotonic() + 900
                while len(_jsonl(run / METRICS_FILE)) <= done:
                    assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                    time.sleep(0.5)
                os.kill(_actor_pid(victim, temp), signal.SIGTERM)
            rc = proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
        return rc, log.read_text()

    rc, out = attempt("LearnerActor", "learner")
    assert rc == EXIT_PREEMPTED, out[-3000:]
    assert "agentrl: SIGTERM to ray::LearnerActor" in out and "then a checkpoint and exit 75" in out, out[-3000:]
    first = [r["step"] for r in _jsonl(run / METRICS_FILE)]
    assert first == list(range(1, len(first) + 1)) and 1 <= first[-1] < 6
    assert stored.complete_numbered(PREFIX) == [first[-1]]  # the step in progress finished, then saved

    rc, out = attempt("RolloutWorker", "rollout")
    assert rc == EXIT_PREEMPTED, out[-3000:]
    assert "agentrl: SIGTERM to ray::RolloutWorker" in out, out[-3000:]
    second = [r["step"] for r in _jsonl(run / METRICS_FILE)]
    assert second == list(range(1, len(second) + 1)) and first[-1] < second[-1] < 6
    assert stored.complete_numbered(PREFIX)[-1] == second[-1]

    rc, out = attempt(None, "finish")
    assert rc == 0, out[-3000:]
    assert [r["step"] for r in _jsonl(run / METRICS_FILE)] == [1, 2, 3, 4, 5, 6]
    resumes = _jsonl(run / "resumes.jsonl")
    assert [r["step"] for r in resumes] == [first[-1], second[-1]] and all(r["learner_digest_match"] for r in resumes)
    assert (run / "final").is_dir()
