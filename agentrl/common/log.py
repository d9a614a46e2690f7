"""agentrl's messages: one logger tree (``agentrl.*``), written as the plain lines a user reads.

Levels say what a line is: INFO for a run's status (engines ready, held-out result, where files
went), WARNING for what a run survives (a worker restarted, an episode dropped, a file not
written), ERROR for what stops it. The first ``get_logger`` call gives the ``agentrl`` logger one
handler that writes each message, as is, to the standard output of the moment (so Ray forwards
an actor's lines to the driver, and pytest's capture sees them); ``telemetry.log_level`` sets
the driver's threshold (``set_level``). A program that embeds agentrl may remove that handler
and attach its own. Command output (``agentrl eval``'s tables, the CLI's answers) is printed,
not logged: it is what the command is for.
"""

from __future__ import annotations

import logging
import sys

ROOT = "agentrl"


class _StdoutLines(logging.Handler):
    """Each record's message on a line of ``sys.stdout`` as it is when the record is emitted."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stdout.write(self.format(record) + "\n")
            sys.stdout.flush()
        except Exception:  # a closed stream must not take the run down
            self.handleError(record)


_installed = False  # our handler is added once per process; a host may remove it for good


def get_logger(name: str) -> logging.Logger:
    """The logger of module ``name`` (``__name__``), below ``agentrl``. The first call in a process
    gives the ``agentrl`` logger its stdout handler (module docstring)."""
    global _installed
    root = logging.getLogger(ROOT)
    if not _installed:
        _installed = True
        handler = _StdoutLines()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
        root.propagate = False  # not twice when the host program logs to the terminal too
        if root.level == logging.NOTSET:
            root.setLevel(logging.INFO)
    return logging.getLogger(name if name == ROOT or name.startswith(ROOT + ".") else f"{ROOT}.{name}")


def set_level(level: str) -> None:
    """Show agentrl's messages at ``level`` ("DEBUG", "INFO", "WARNING", "ERROR") and above."""
    logging.getLogger(ROOT).setLevel(level)


__all__ = ["get_logger", "set_level"]
