"""BFCL v4 multi-turn (the ``bfcl-eval`` package) as an agentrl backend and task source.

``bfcl-eval`` is an optional dependency pinned to one release: the tasks, the executable API
classes and the checker semantics we mirror all come from that release, and a different one can
change data or state layouts under us silently. So the version is checked, not assumed.

Importing this package sets ``BFCL_PROJECT_ROOT`` (unless already set) to
``$AGENTRL_CACHE/bfcl`` (default ``<cwd>/.cache/bfcl``) *before* anything imports ``bfcl_eval``:
``bfcl_eval.constants.eval_config`` creates ``result/``, ``score/`` and ``.file_locks/`` under
that root at import time, and the default root is site-packages.

Nothing here is imported by ``import agentrl``: ``agentrl.envs.registry`` imports this package
the first time a task with ``backend == "bfcl"`` needs a backend, and
``agentrl.tasks.io.resolve_task_source`` imports ``agentrl.envs.bfcl.tasks`` for ``bfcl:...``.
"""

from __future__ import annotations

import os
from pathlib import Path

from agentrl.envs.pinned import require_pinned

BFCL_VERSION = "2026.3.23"
INSTALL_COMMAND = f"pip install --no-deps bfcl-eval=={BFCL_VERSION}"


def bfcl_project_root() -> Path:
    """Where bfcl_eval may write (its result/score/lock folders): ``$AGENTRL_CACHE/bfcl``."""
    cache = os.environ.get("AGENTRL_CACHE") or str(Path.cwd().resolve() / ".cache")
    return Path(cache) / "bfcl"


def require_bfcl() -> None:
    """Raise ``RuntimeError`` unless ``bfcl-eval`` is installed at exactly ``BFCL_VERSION``.

    ``--no-deps`` in the install command is deliberate: bfcl-eval's declared dependencies pull
    every model vendor's SDK, and only its data, API classes and checker are used here.
    """
    require_pinned("bfcl-eval", BFCL_VERSION, "agentrl.envs.bfcl", INSTALL_COMMAND)


os.environ.setdefault("BFCL_PROJECT_ROOT", str(bfcl_project_root()))
require_bfcl()

from agentrl.envs.bfcl.backend import BFCLBackend  # noqa: E402  (after the env var and version check)
from agentrl.envs.registry import register_backend  # noqa: E402

register_backend("bfcl", BFCLBackend)

__all__ = ["BFCL_VERSION", "INSTALL_COMMAND", "BFCLBackend", "bfcl_project_root", "require_bfcl"]
