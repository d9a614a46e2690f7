"""The quickstart's promise, checked for real: `make demo`'s command, end to end.

Slow (~20 min on 2 cores): run with `make test-slow`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quickstart_demo_improves_heldout_success(tmp_path):
    env = dict(os.environ, AGENTRL_CACHE=str(REPO / ".cache"))
    out = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", "configs/quickstart.yaml", f"run.output_dir={tmp_path}"],
        cwd=REPO, env=env, check=True, timeout=1800, capture_output=True, text=True,
    ).stdout
    last = out.strip().splitlines()[-1]
    m = re.fullmatch(r"held-out success: (\d\.\d\d) -> (\d\.\d\d)", last)
    assert m, f"unexpected last line: {last!r}"
    start, end = float(m.group(1)), float(m.group(2))
    assert end >= start + 0.15, f"RL did not improve held-out success enough: {start} -> {end}"
