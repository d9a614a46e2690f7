"""A Kubernetes preStop hook for agentrl's pods: ``python -m agentrl.checkpointing.prestop [--timeout S]``.

Kubernetes sends a deleted or preempted pod's SIGTERM to the container's main process, which in a
KubeRay pod is ``ray start``: it stops the node's Ray processes at once, and agentrl's actors there
die without a checkpoint. A preStop hook runs first, inside the pod's grace period, so the
manifests in deploy/ run this module there. It sends SIGTERM to the run's processes in this pod
(the ``agentrl train`` driver, and the Ray workers titled after agentrl's actors); a driver stops
after the step in progress with a checkpoint (checkpointing/preemption.py), an actor posts a notice
that makes the driver do the same. Then it waits until those processes have exited (the driver
ends the run with exit 75, and Ray ends the run's actors with it) or ``--timeout`` seconds have
passed, and returns, letting Kubernetes stop ``ray start``. Always exits 0: a preStop hook's
failure only delays the pod.

Standard library only: it runs in the pod's Python without importing Ray.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

# process titles Ray gives the workers of agentrl's actors ("ray::<class>" or "ray::<class>.<method>")
ACTOR_TITLES = tuple(f"ray::{name}" for name in ("LearnerActor", "RolloutWorker", "ToolBackendActor", "SGLSServer",
                                                  "SynthesisActor", "ReplayBuffer", "TrajectoryWriter"))


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def is_run_process(argv: list[str]) -> bool:
    """An agentrl actor's Ray worker, or an ``agentrl train`` driver (``agentrl train ...``,
    ``python -m agentrl train ...``); not a shell whose one argument is that command line."""
    if not argv:
        return False
    title = argv[0].split(" ", 1)[0]  # setproctitle may pad the title
    if any(title == t or title.startswith(t + ".") for t in ACTOR_TITLES):
        return True
    return any(os.path.basename(a) == "agentrl" and argv[i + 1:i + 2] == ["train"] for i, a in enumerate(argv))


def run_processes(candidates: list[int] | None = None) -> list[int]:
    """The pids of this pod's (this machine's) run processes, this one left out; among
    ``candidates`` only, when given (a test on a shared machine signals its own processes only)."""
    me = os.getpid()
    if candidates is None:
        candidates = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    return [pid for pid in candidates if pid != me and is_run_process(_argv(pid))]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited; its parent has not collected it yet


def stop_run(timeout_s: float, log=print, candidates: list[int] | None = None) -> list[int]:
    """SIGTERM every run process here (among ``candidates``, when given), wait until they have
    exited or ``timeout_s`` passed; returns the pids still alive (empty: all ended)."""
    pids = run_processes(candidates)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            continue
    log(f"agentrl prestop: SIGTERM to {len(pids)} run process(es): {pids}; waiting up to {timeout_s:g}s for them")
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(1)
    log(f"agentrl prestop: {'all ended' if not left else f'still running after {timeout_s:g}s: {left}'}")
    return left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.checkpointing.prestop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=280.0,
                        help="seconds to wait for the run's processes (keep it under terminationGracePeriodSeconds)")
    args = parser.parse_args(argv)
    stop_run(args.timeout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
