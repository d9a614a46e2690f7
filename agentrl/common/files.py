"""Writing a file so that a crash or an error never leaves a part of it: ``atomic_write``.

Run folders, checkpoints and task files are read back by the next process (a resumed run, a
report, another command), which must find either the new content or the old one, never a torn
file. Every writer in agentrl goes through this one routine, so each gets the same guarantee:
the data is written to a temporary file in the same folder (a rename is atomic only within one
filesystem), flushed and fsynced, renamed over the path, and the folder is fsynced so that the
rename itself survives a power loss.

This module imports nothing of agentrl: every layer may use it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def atomic_write(path: str | os.PathLike[str], data: bytes | str, *, encoding: str = "utf-8") -> None:
    """``path`` holds ``data`` afterwards, or (after any error, or a crash at any point) what it held
    before, never a part. A ``str`` is encoded with ``encoding``. A new file gets the permissions
    ``open`` gives one (0o666 less the umask). The parent folder must exist.

    The temporary file is ``.<name>.<random>.tmp`` next to ``path``: random so that two writers of
    one path never share it, hidden and ``.tmp`` so that listings and cleanups skip it. An error
    removes it; only a crash (the process killed mid-write) can leave one behind."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode(encoding)  # before any file exists: an unencodable text leaves nothing
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a folder by its path: a file written or renamed there by someone else (another
    process, a move), or a folder, whose fsync makes the names created or renamed in it durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
