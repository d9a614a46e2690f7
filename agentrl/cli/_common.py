"""What every subcommand shares."""

from __future__ import annotations

import sys


def fail(message: object) -> int:
    """Bad input: print ``error: <message>`` to stderr; the exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    return 2
