"""Give freed heap memory back to the operating system."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc


def return_freed_memory() -> None:
    """Collect garbage, then ask glibc to release the free memory it holds (``malloc_trim``).

    glibc keeps large freed blocks in its arenas, so a process that builds and drops a model-sized
    buffer at every weight sync (the learner's blob, the engine's received tensors) keeps its peak
    resident; a few such processes on one host reach Ray's memory monitor, which kills workers.
    A no-op where glibc's ``malloc_trim`` is absent (musl, macOS)."""
    gc.collect()
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


__all__ = ["return_freed_memory"]
