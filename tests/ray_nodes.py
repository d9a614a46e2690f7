"""Helpers of the tests that start their own Ray nodes (`ray start --block` on loopback)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports the OS had free a moment ago (for a node's GCS, dashboard, agents)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def stop_node(proc: subprocess.Popen, marks: list[str]) -> None:
    """Stop a test's Ray node: the session `ray start` began (``proc``) and any process whose
    command line names one of ``marks`` (its temp folder, its GCS port). SIGTERM first (`ray start
    --block` takes the node down), SIGKILL after 5 s: a loaded machine took 30 s for the orderly way."""
    ours = {proc.pid}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(mark in text for mark in marks):
            ours.add(int(cmdline.parent.name))
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    for pid in ours:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(timeout=30)
