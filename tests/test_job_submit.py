"""The README's `ray job submit` command on a real two-node Ray cluster with token authentication.

`cluster/local-2node.sh` starts a head node and a worker node advertising {"rollout": 1}, on free
ports, in a temp folder and with a token of this test's own. The submit command is read from the
README ("Running on a real cluster") and run from the repo root, plus overrides that shrink the
quickstart to one short step and ask for the rollout workers on the worker node. Checks: the job
SUCCEEDED, its run folder has metrics, the RolloutWorker actor ran on the worker node, and the
job API refuses a request without the token. `cluster/stop.sh` stops exactly these two nodes
(never `ray stop`, which would stop every Ray on the machine). ~2 min on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agentrl.config.process_env import CACHE_DIRS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = ["run.name=job", "train.steps=1", "rollout.tasks_per_step=2", "rollout.group_size=2",
             "rollout.max_new_tokens=48", "train.eval_at_start=false", "train.eval_at_end=false",
             "telemetry.progress=false", "telemetry.tensorboard=false", "runtime.rollout_worker_resources={rollout: 1}"]


def readme_submit_command() -> list[str]:
    """The `ray job submit ...` line of the README's real-cluster section, as argv."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Running on a real cluster", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    (line,) = [x for x in block.splitlines() if x.startswith("ray job submit")]
    return shlex.split(line.split("#", 1)[0])


def free_ports() -> tuple[int, int, int, int]:
    """GCS, dashboard, Ray Client and dashboard-agent ports nothing listens on now; the worker
    node's agent takes the agent port + 1, so that one must be free too."""
    for _ in range(100):
        socks = [socket.socket() for _ in range(4)]
        for s in socks:  # held open together, so the four differ
            s.bind(("", 0))
        ports = tuple(s.getsockname()[1] for s in socks)
        for s in socks:
            s.close()
        if ports[3] + 1 not in ports and _free(ports[3] + 1):
            return ports
    raise RuntimeError("no free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def api(base: str, path: str, token: str | None) -> object:
    """GET a dashboard endpoint (JSON), with the bearer token when given."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=30) as resp:
        return json.loads(resp.read())


@pytest.fixture
def two_nodes():
    """The cluster of cluster/local-2node.sh; yields (env for clients, dashboard URL, temp folder)."""
    # A short folder of our own: Ray's socket paths under it must stay within the AF_UNIX limit.
    tmp = Path(tempfile.mkdtemp(prefix="arj-", dir="/tmp"))
    gcs, dashboard, client, agent = free_ports()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # Absolute caches: the job and actors run in Ray's copy of the repo, not here.
    for var in ("AGENTRL_CACHE", *CACHE_DIRS):
        if var in env:
            env[var] = str(Path(env[var]).resolve())
    env.update(RAY=str(Path(sys.executable).parent / "ray"), RAY_TMPDIR=str(tmp), RAY_PORT=str(gcs),
               DASHBOARD_PORT=str(dashboard), AGENT_PORT=str(agent),
               CLIENT_PORT=str(client), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    try:
        up = subprocess.run([str(ROOT / "cluster" / "local-2node.sh")], env=env, timeout=240, capture_output=True,
                            text=True)
        assert up.returncode == 0, up.stdout + up.stderr
        yield env, f"http://127.0.0.1:{dashboard}", tmp
    finally:
        subprocess.run([str(ROOT / "cluster" / "stop.sh")], env=env, timeout=120, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.heavy
def test_readme_job_submit_runs_rollouts_on_the_rollout_node(two_nodes):
    env, url, tmp = two_nodes
    token = env["RAY_AUTH_TOKEN"]
    with pytest.raises(urllib.error.HTTPError) as refused:  # token auth is on
        api(url, "/api/jobs/", token=None)
    assert refused.value.code == 401

    argv = readme_submit_command()
    assert argv[:5] == ["ray", "job", "submit", "--working-dir", "."], argv
    argv[0] = env["RAY"]
    proc = subprocess.run([*argv, f"run.output_dir={tmp / 'runs'}", *OVERRIDES], cwd=ROOT, text=True,
                          env=dict(env, RAY_ADDRESS=url), capture_output=True, timeout=600)
    log = (proc.stdout + proc.stderr)[-4000:]

    jobs = api(url, "/api/jobs/", token)
    assert [j["status"] for j in jobs] == ["SUCCEEDED"], log
    assert proc.returncode == 0, log
    (run_dir,) = (tmp / "runs").iterdir()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/success" in r] == [1], rows

    nodes = api(url, "/api/v0/nodes", token)["data"]["result"]["result"]
    (rollout_node,) = [n["node_id"] for n in nodes if "rollout" in n["resources_total"]]
    actors = api(url, "/api/v0/actors?filter_keys=class_name&filter_predicates=%3D&filter_values=RolloutWorker",
                 token)["data"]["result"]["result"]
    assert [a["node_id"] for a in actors] == [rollout_node], actors
