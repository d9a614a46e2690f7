"""Preemption: a SIGTERM to any process of the run (the driver, a learner rank, a rollout worker,
a tool actor) ends the run with a checkpoint.

The driver's handler records the signal (``StopOnSignal``). Every Ray worker process of the run
gets a handler too (``install_notice_handler``, which ``driver/cluster.py`` names as the job's
``worker_process_setup_hook``): it posts a notice (which process, where, when) to the cluster's
key-value store under the job's id and lets the process go on working; ``StopOnSignal.requested``
reports the first notice, so the driver treats an actor's SIGTERM as its own. On Kubernetes a
pod's SIGTERM goes to its ``ray start``; the manifests' preStop hooks pass it on to the run's
processes first (docs/cluster_operator.md).

The handler only records the signal. The driver's loop looks at it between steps: it finishes the
step in progress, writes a checkpoint and ends the run with ``EXIT_PREEMPTED``, so a launcher that
restarts the same command with ``--resume auto`` continues from that step. Nothing is cut off in
the middle of an update or a checkpoint write; the price is that the grace period between SIGTERM
and SIGKILL must cover one step plus a checkpoint (docs/operating.md, "Preemption").

A failure that a restart recovers from (a learner rank lost, a hung update or rollout call) ends
the run the same way, with ``ResumableFailure`` and the same exit status, from the newest
checkpoint already written (nothing new can be saved without the learner).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

from agentrl.common.log import get_logger

log = get_logger(__name__)

# EX_TEMPFAIL (sysexits.h): "try again later" — the run stopped cleanly on a signal, with a checkpoint
EXIT_PREEMPTED = 75


class Preempted(Exception):
    """The run stopped on a signal after ``step`` (checkpointed when ``checkpointed``)."""

    def __init__(self, step: int, signal_name: str, checkpointed: bool):
        self.step, self.signal_name, self.checkpointed = step, signal_name, checkpointed
        saved = f"checkpoint-{step} is the newest" if checkpointed else "no step trained yet: nothing to checkpoint"
        super().__init__(f"{signal_name} received: stopped after step {step} ({saved}); "
                         "run the same command with --resume auto to continue")


class ResumableFailure(RuntimeError):
    """A part of the run failed in a way a rerun recovers from (a learner rank died, an update or a
    rollout call did not return in time): the run stops with ``EXIT_PREEMPTED``, and the same
    command with ``--resume auto`` continues from the newest complete checkpoint."""


class StopOnSignal:
    """``with StopOnSignal() as stop:`` — ``stop.requested`` names the first SIGTERM received inside
    the block by this process, or else by a worker process of this Ray job (``notices``); None
    before. The previous handler is restored after the block. Outside the main thread (where Python
    cannot install handlers) this process's own signals are not seen."""

    SIGNALS = (signal.SIGTERM,)

    def __init__(self):
        self._requested: str | None = None
        self._previous: dict = {}

    @property
    def requested(self) -> str | None:
        if self._requested is None:
            found = notices()
            if found:
                first = min(found, key=lambda n: n.get("time", 0.0))
                self._announce(f"{first.get('signal', 'SIGTERM')} to {first.get('who', '?')} (pid {first.get('pid')} on "
                               f"{first.get('node', '?')})")
        return self._requested

    def _announce(self, what: str) -> None:
        self._requested = what
        log.warning(f"agentrl: {what} received: finishing this step, then a checkpoint and exit {EXIT_PREEMPTED}")

    def _handle(self, signum, frame) -> None:
        if self._requested is None:
            self._announce(signal.Signals(signum).name)

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        try:  # a long-lived cluster keeps its KV store: leave nothing of this job there
            clear_notices()
        except Exception:  # noqa: BLE001 - never mask the run's own outcome (a lost GCS among them)
            pass


# ---------------------------------------------------------------------------- worker processes
NOTICE_NAMESPACE = "agentrl_preemption"  # Ray KV namespace; keys "<job id>/<pid>"
NOTICE_HOOK = "agentrl.checkpointing.preemption.install_notice_handler"  # runtime_env worker_process_setup_hook


def install_notice_handler() -> None:
    """A Ray ``worker_process_setup_hook``: SIGTERM in this worker process posts a notice instead
    of ending the process. Ray's worker main loop installs its own SIGTERM handler (exit at once)
    after the setup hook runs, through ``ray._private.utils.set_sigterm_handler``; that call is
    redirected to install ours (tests/test_preemption_notice.py checks it against the installed Ray)."""
    import ray._private.utils as ray_utils

    def handler(signum, frame) -> None:
        # the notice is a GCS call: off the signal handler, on a thread of its own
        threading.Thread(target=_post_notice, args=(signal.Signals(signum).name,), daemon=True).start()

    ray_utils.set_sigterm_handler = lambda _ray_handler: signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGTERM, handler)


def _post_notice(signal_name: str) -> None:
    import ray
    from ray.experimental.internal_kv import _internal_kv_put

    try:
        title = open("/proc/self/cmdline", "rb").read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        title = "a Ray worker"
    context = ray.get_runtime_context()
    notice = {"signal": signal_name, "who": title, "pid": os.getpid(), "node": ray.util.get_node_ip_address(),
              "time": time.time()}
    _internal_kv_put(f"{context.get_job_id()}/{os.getpid()}", json.dumps(notice), namespace=NOTICE_NAMESPACE)


def notices(job_id: str | None = None) -> list[dict]:
    """The SIGTERM notices worker processes of ``job_id`` (default: this process's Ray job) posted;
    [] when Ray is not running here."""
    import sys

    ray = sys.modules.get("ray")  # never import Ray here: without it there are no workers to hear from
    if ray is None or not ray.is_initialized():
        return []
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_list

    job_id = job_id or ray.get_runtime_context().get_job_id()
    out = []
    try:
        keys = _internal_kv_list(f"{job_id}/", namespace=NOTICE_NAMESPACE)
        raws = [_internal_kv_get(key, namespace=NOTICE_NAMESPACE) for key in keys]
    except Exception:  # noqa: BLE001 - an unreachable store is no notice; the next step looks again
        return []
    for raw in raws:
        try:
            out.append(json.loads(raw))
        except (TypeError, ValueError):
            continue
    return out


def clear_notices(job_id: str | None = None) -> None:
    """Delete the notices of ``job_id`` (default: this process's Ray job); nothing without Ray."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    from ray.experimental.internal_kv import _internal_kv_del

    _internal_kv_del(f"{job_id or ray.get_runtime_context().get_job_id()}/", del_by_prefix=True, namespace=NOTICE_NAMESPACE)


__all__ = ["EXIT_PREEMPTED", "NOTICE_HOOK", "NOTICE_NAMESPACE", "Preempted", "ResumableFailure", "StopOnSignal",
           "clear_notices", "install_notice_handler", "notices"]
