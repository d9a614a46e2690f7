"""A SIGTERM to an actor's process is a preemption notice, not a death (issue 40, item 1).

``init_ray`` names ``install_notice_handler`` as the job's ``worker_process_setup_hook``; in every
worker process it replaces the handler Ray's worker loop installs (exit at once) with one that
posts a notice to the cluster's key-value store and lets the process work on. Checked here against
the installed Ray, in a subprocess that starts its own embedded cluster as ``agentrl train`` does:
a sync actor busy in a call and an async actor idle each get a SIGTERM; both stay alive, the busy
call returns, and the driver's ``StopOnSignal`` reports the first notice (process title, pid,
node); the notices are cleared when the block ends. ``ray.kill`` (a hung actor's restart, the
shutdown) posts none. The whole run (a learner rank's and a rollout
worker's SIGTERM -> checkpoint -> ``--resume auto``) is tests/test_preemption.py's two-node test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import asyncio, os, signal, sys, time
import ray
from agentrl.config import load_config
from agentrl.driver.cluster import init_ray
from agentrl.checkpointing.preemption import StopOnSignal, notices

assert init_ray(load_config(None, ["runtime.num_cpus=2"]))

@ray.remote(num_cpus=0)
class Busy:
    def pid(self):
        return os.getpid()
    def work(self, seconds):
        time.sleep(seconds)
        return "done"

@ray.remote(num_cpus=0)
class Idle:
    async def pid(self):
        return os.getpid()

busy, idle = Busy.remote(), Idle.remote()
busy_pid, idle_pid = ray.get([busy.pid.remote(), idle.pid.remote()])
with StopOnSignal() as stop:
    assert stop.requested is None
    call = busy.work.remote(4)
    time.sleep(1)
    os.kill(busy_pid, signal.SIGTERM)
    assert ray.get(call, timeout=60) == "done"  # the call in progress finishes
    time.sleep(2)
    os.kill(idle_pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while len(notices()) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sorted(n["pid"] for n in notices()) == sorted([busy_pid, idle_pid]), notices()
    print("REQUESTED", stop.requested)
    assert ray.get([busy.pid.remote(), idle.pid.remote()], timeout=30) == [busy_pid, idle_pid]  # both alive
print("LEFT", len(notices()))

# ray.kill, which the runtime uses on hung actors (a restart) and at shutdown, is no notice: Ray
# ends the process without a SIGTERM, and at once
victim = Busy.options(max_restarts=1).remote()
first = ray.get(victim.pid.remote())
t0 = time.monotonic()
ray.kill(victim, no_restart=False)
second = first
while second == first and time.monotonic() - t0 < 60:  # the restarted actor is a new process
    time.sleep(0.5)
    try:
        second = ray.get(victim.pid.remote(), timeout=60)
    except ray.exceptions.RayActorError:
        continue
ray.kill(victim, no_restart=True)
time.sleep(2)
print("KILLS", first != second, round(time.monotonic() - t0, 1), len(notices()))
ray.shutdown()
"""


@pytest.mark.integration
def test_an_actors_sigterm_is_a_notice_the_driver_sees(tmp_path):
    temp = tempfile.mkdtemp(prefix="arn-", dir="/tmp")  # short: Ray's socket paths must fit AF_UNIX
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    env.update(RAY_TMPDIR=temp)
    try:
        res = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=300, start_new_session=True)
    finally:
        subprocess.run(["rm", "-rf", temp], check=False)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    line = next(x for x in res.stdout.splitlines() if x.startswith("REQUESTED"))
    assert line.startswith("REQUESTED SIGTERM to ray::Busy") and "(pid " in line, line
    assert "agentrl: SIGTERM to ray::Busy" in res.stdout and "then a checkpoint and exit 75" in res.stdout
    assert "LEFT 0" in res.stdout
    kills = next(x for x in res.stdout.splitlines() if x.startswith("KILLS")).split()
    assert kills[1] == "True" and float(kills[2]) < 30 and kills[3] == "0", kills
