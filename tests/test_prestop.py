"""The pods' preStop hook (agentrl/checkpointing/prestop.py): which processes it signals, and that it
waits for them. Its own processes only (a shared machine may run other agentrl runs): a stand-in
driver (``python -c ... agentrl train``) that, like the real one, ends a while after its SIGTERM,
stand-in actor workers titled as Ray titles agentrl's actors, and bystanders it must not touch.
The hook in a real pod has not run (no Kubernetes here)."""

from __future__ import annotations

import subprocess
import sys
import time

from agentrl.checkpointing.prestop import is_run_process, stop_run

SLOW_DRIVER = ("import signal, sys, time\n"
               "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(2), sys.exit(75)))\n"
               "time.sleep(120)\n")


def test_which_processes_are_the_runs():
    assert is_run_process(["/home/ray/anaconda3/bin/python", "/home/ray/anaconda3/bin/agentrl", "train", "c.yaml"])
    assert is_run_process(["python", "-m", "agentrl", "train", "--resume", "auto", "c.yaml"])
    assert is_run_process(["ray::LearnerActor"]) and is_run_process(["ray::RolloutWorker.rollout"])
    assert is_run_process(["ray::ReplayBuffer.add     "])
    assert not is_run_process(["/bin/sh", "-c", "agentrl train c.yaml"])  # the job's shell: not signalled
    assert not is_run_process(["ray::IDLE"]) and not is_run_process(["ray::RolloutWorkerX"])
    assert not is_run_process(["agentrl", "eval"]) and not is_run_process(["raylet", "--agentrl"]) and not is_run_process([])


def test_prestop_signals_the_run_and_waits_for_it():
    driver = subprocess.Popen([sys.executable, "-c", SLOW_DRIVER, "agentrl", "train", "job.yaml"])
    actor = subprocess.Popen(["bash", "-c", 'exec -a "ray::RolloutWorker" sleep 120'])
    bystanders = [subprocess.Popen(["sleep", "120"]), subprocess.Popen(["bash", "-c", 'exec -a "ray::IDLE" sleep 120'])]
    try:
        time.sleep(1)  # the driver's handler is installed
        t0 = time.monotonic()
        left = stop_run(30, log=lambda *a: None, candidates=[driver.pid, actor.pid] + [b.pid for b in bystanders])
        took = time.monotonic() - t0
        assert left == [] and 2 <= took < 20, (left, took)  # waited for the driver's 2 s
        assert driver.wait(timeout=5) == 75 and actor.wait(timeout=5) == -15
        assert all(b.poll() is None for b in bystanders)
        # a process that outlives the timeout is reported, and the hook still returns
        stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                                     "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(120)\n", "agentrl", "train"])
        time.sleep(1)
        assert stop_run(2, log=lambda *a: None, candidates=[stubborn.pid]) == [stubborn.pid]
        stubborn.kill()
    finally:
        for p in [driver, actor, *bystanders]:
            if p.poll() is None:
                p.kill()
