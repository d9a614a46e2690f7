"""Benchmark data packages are pinned to one version: their data and checkers define the scores,
so a different version must fail loudly, naming the package, the version and the fix."""

from __future__ import annotations

import importlib.metadata


def require_pinned(package: str, version: str, needed_by: str, install_command: str) -> None:
    """Raise ``RuntimeError`` unless ``package`` is installed at exactly ``version``."""
    try:
        found = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        found = None
    if found != version:
        have = "it is not installed" if found is None else f"version {found} is installed"
        raise RuntimeError(f"{needed_by} needs the package {package}=={version} ({have}); install it with: {install_command}")
