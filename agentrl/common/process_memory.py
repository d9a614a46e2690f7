"""Give freed heap memory back to the operating system."""

from __future__ import annotations

import ctypes
import gc

try:  # glibc, looked up once: the process's own symbols (ctypes.util.find_library would run ldconfig per call)
    _MALLOC_TRIM = ctypes.CDLL(None).malloc_trim
except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim with
    _MALLOC_TRIM = None


def return_freed_memory() -> None:
    """Collect garbage, then ask glibc to release the free memory it holds (``malloc_trim``).

    glibc keeps large freed blocks in its arenas, so a process that builds and drops a model-sized
    buffer at every weight sync (the learner's blob, the engine's received tensors), or that
    generated a batch (a vLLM CPU worker's scratch), keeps its peak resident; a few such processes
    on one host reach Ray's memory monitor, which kills workers. A no-op without glibc."""
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


__all__ = ["return_freed_memory"]
