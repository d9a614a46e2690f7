"""Preemption: a SIGTERM to the driver process (``ray job stop``, a launcher's stop) ends a run with a checkpoint.

Only the driver handles it: on Kubernetes a pod's SIGTERM goes to its ``ray start``, not to the
driver or the actors (docs/cluster_operator.md says what a preempted pod costs).

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

import signal
import threading

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
    """``with StopOnSignal() as stop:`` — ``stop.requested`` is the name of the first SIGTERM
    received inside the block (None before); the previous handler is restored after it. Outside
    the main thread (where Python cannot install handlers) it never fires."""

    SIGNALS = (signal.SIGTERM,)

    def __init__(self):
        self.requested: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.requested is None:
            self.requested = signal.Signals(signum).name
            print(f"agentrl: {self.requested} received: finishing this step, then a checkpoint and exit "
                  f"{EXIT_PREEMPTED}", flush=True)

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


__all__ = ["EXIT_PREEMPTED", "Preempted", "ResumableFailure", "StopOnSignal"]
