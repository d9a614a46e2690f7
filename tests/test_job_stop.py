"""`ray job stop` and RAY_JOB_STOP_WAIT_TIME_S (issue 40): what docs/operating.md and the RayJob
manifests rely on. Ray's job supervisor sends the job's driver SIGTERM and SIGKILLs it
RAY_JOB_STOP_WAIT_TIME_S seconds later, reading the variable from the job's runtime_env env_vars.
On a real Ray head (job API on loopback, no auth), a stand-in driver that, like `agentrl train`,
needs a few seconds after its SIGTERM (finish the step, checkpoint) to write a file and exit 75:
with RAY_JOB_STOP_WAIT_TIME_S=60 in the job's runtime_env it finishes; with Ray's default (3 s)
it is killed first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from ray_nodes import free_ports, stop_node

DRIVER = ("import pathlib, signal, sys, time\n"
          "def stop(*_):\n"
          "    time.sleep(6)\n"
          "    pathlib.Path(sys.argv[1]).write_text('checkpointed')\n"
          "    sys.exit(75)\n"
          "signal.signal(signal.SIGTERM, stop)\n"
          "pathlib.Path(sys.argv[1] + '.started').write_text('')\n"
          "time.sleep(600)\n")


@pytest.mark.integration
@pytest.mark.heavy  # ~1 min (a dashboard to start, two jobs), and only Ray's behaviour under test
def test_ray_job_stop_waits_as_long_as_the_jobs_runtime_env_says(tmp_path, monkeypatch):
    gcs, dashboard, agent, client = free_ports(4)
    temp = tempfile.mkdtemp(prefix="ars-", dir="/tmp")  # short: Ray's socket paths must fit AF_UNIX
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env["RAY_AUTH_MODE"] = "disabled"  # loopback only
    ray_bin = str(Path(sys.executable).parent / "ray")
    node = subprocess.Popen(
        [ray_bin, "start", "--head", "--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1", "--port",
         str(gcs), "--num-cpus", "2", "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port",
         str(dashboard), "--dashboard-agent-listen-port", str(agent), "--ray-client-server-port", str(client),
         "--temp-dir", temp], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    try:
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
        from ray.job_submission import JobStatus, JobSubmissionClient

        deadline = time.monotonic() + 120
        while True:
            try:
                jobs = JobSubmissionClient(f"http://127.0.0.1:{dashboard}")
                break
            except Exception:  # noqa: BLE001 - the dashboard is not up yet
                assert node.poll() is None and time.monotonic() < deadline, "the Ray head did not start"
                time.sleep(1)

        def stopped(wait_s: str | None) -> tuple[bool, JobStatus]:
            marker = tmp_path / f"wait-{wait_s}"
            runtime_env = {"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": wait_s}} if wait_s else None
            job = jobs.submit_job(entrypoint=f"{sys.executable} {script} {marker}", runtime_env=runtime_env)
            end = time.monotonic() + 120
            while not Path(f"{marker}.started").exists():
                assert time.monotonic() < end, jobs.get_job_logs(job)
                time.sleep(0.5)
            jobs.stop_job(job)
            while (status := jobs.get_job_status(job)) not in (JobStatus.STOPPED, JobStatus.FAILED, JobStatus.SUCCEEDED):
                assert time.monotonic() < end, status
                time.sleep(0.5)
            time.sleep(8)  # a driver that was not killed has written its file by now
            return marker.exists(), status

        assert stopped("60") == (True, JobStatus.STOPPED)  # the driver's 6 s fit: it finished its checkpoint
        assert stopped(None) == (False, JobStatus.STOPPED)  # Ray's default 3 s: killed first
    finally:
        stop_node(node, [temp])
        subprocess.run(["rm", "-rf", temp], check=False)
