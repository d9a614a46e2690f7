"""Process environment defaults: offline model hubs, caches under one folder, CPU DeepSpeed.

No model hub is reachable where agentrl runs, and a cache written to ``~`` outlives the checkout
and can collide between users, so every entry point (the CLI, the driver, tests) calls
``set_default_env()`` before importing transformers/vLLM/DeepSpeed. It only uses
``os.environ.setdefault``: anything the user (or the Makefile) exported wins. The layout mirrors
the Makefile's: ``$AGENTRL_CACHE/{hf,vllm,torch_extensions,triton,matplotlib}``.

``HF_HOME`` is the one a user often has already: an exported ``HF_HOME`` (or ``HF_HUB_CACHE``) is
kept, and a hub id in ``model.path`` is looked up there. When the user set none, agentrl's
``$AGENTRL_CACHE/hf`` keeps anything the HF libraries write inside the checkout, and the hub-id
lookup searches the hub's default cache (``~/.cache/huggingface/hub``) after it, so a model
fetched with a plain ``hf download`` is still found (``models/hub.py``). Downloads stay off
(``HF_HUB_OFFLINE=1``) unless the user exports ``HF_HUB_OFFLINE=0``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# env var -> sub-folder of the cache root
CACHE_DIRS = {
    "HF_HOME": "hf",
    "VLLM_CACHE_ROOT": "vllm",
    "TORCH_EXTENSIONS_DIR": "torch_extensions",
    "TRITON_CACHE_DIR": "triton",
    "MPLCONFIGDIR": "matplotlib",
}


QUIET_DEFAULTS = {
    "VLLM_LOGGING_LEVEL": "WARNING",
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "RAY_DEDUP_LOGS": "1",
}


def cuda_visible() -> bool:
    """Whether a CUDA device may be visible, decided without importing torch (that takes seconds).

    ``CUDA_VISIBLE_DEVICES`` set to empty or ``-1`` hides every device; otherwise a device needs
    the NVIDIA driver, which brings ``nvidia-smi`` and ``/dev/nvidia0``.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return shutil.which("nvidia-smi") is not None or Path("/dev/nvidia0").exists()


def agentrl_default(var: str) -> str:
    """The value ``set_default_env`` gives cache variable ``var`` (``CACHE_DIRS``) when unset."""
    root = os.environ.get("AGENTRL_CACHE") or str(Path.cwd().resolve() / ".cache")
    return str(Path(root) / CACHE_DIRS[var])


def is_agentrl_default(var: str) -> bool:
    """Whether ``var`` holds agentrl's own default (set here or by the Makefile), not a value the user chose."""
    value = os.environ.get(var)
    return value is not None and os.path.abspath(os.path.expanduser(value)) == os.path.abspath(agentrl_default(var))


def set_default_env(cwd: str | os.PathLike[str] | None = None) -> Path:
    """Fill in offline/cache/accelerator defaults; returns the cache root in use.

    The cache root is ``$AGENTRL_CACHE``, else ``<cwd>/.cache`` (also exported as AGENTRL_CACHE so
    Ray workers started from this process see the same one). Folders are not created here: the
    libraries create what they use, and ``agentrl --help`` should leave no trace.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    root = os.environ.get("AGENTRL_CACHE") or str(Path(cwd or os.getcwd()).resolve() / ".cache")
    os.environ.setdefault("AGENTRL_CACHE", root)
    for var, sub in CACHE_DIRS.items():
        os.environ.setdefault(var, str(Path(root) / sub))
    if not cuda_visible():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # The engines log every request and load at INFO level; a training run's console should show
    # its own progress line, warnings and errors. Export the variables to get the chatter back.
    for var, value in QUIET_DEFAULTS.items():
        os.environ.setdefault(var, value)
    return Path(root)
