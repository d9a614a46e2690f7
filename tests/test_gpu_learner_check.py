"""benchmarks/gpu_learner_check.py on CPU (``--device cpu --quick``), as the lent GPU machine runs it.

That machine has CUDA torch, transformers and peft but no Ray and no vLLM (and DeepSpeed only as
carried wheels), so the check must need nothing but the learner's modules. The subprocess here
starts with ``ray`` and ``vllm`` made unimportable before anything else is imported: a None entry in
``sys.modules`` makes ``import ray`` raise ModuleNotFoundError and ``importlib.util.find_spec`` answer
None, exactly what a missing package looks like to both plain imports and optional-dependency probes.
Any module on the learner's path that imports them fails the check here first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_learner_check.py"
VERDICT = "GPU LEARNER CHECK:"

# argv: -c GUARD <script> <args...>; hides ray and vllm, proves it, then runs the script as __main__
GUARD = """
import runpy, sys
for name in ("ray", "vllm"):
    sys.modules[name] = None
for name in ("ray", "vllm"):
    try:
        __import__(name)
    except ImportError:
        continue
    raise SystemExit("import guard failed: " + name + " imports")
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

CHECKS = {"zero0_fp32", "zero1_fp32", "zero2_fp32", "zero3_fp32", "bf16_zero2", "packed_vs_padded", "grad_checkpointing",
          "offload_optimizer", "offload_params", "lora_merged_logprobs", "checkpoint_round_trip", "step_time", "no_ray_vllm"}
MAY_SKIP = {"offload_optimizer", "offload_params"}  # on CPU, DeepSpeed may refuse offload with a client optimizer


def test_gpu_learner_check_passes_on_cpu_without_ray_or_vllm(tmp_path):
    out = tmp_path / "result.json"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))  # the compiled comm op, shared
    proc = subprocess.run([sys.executable, "-c", GUARD, str(SCRIPT), "--device", "cpu", "--quick", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420)
    log = f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    lines = proc.stdout.strip().splitlines()
    verdicts = [line for line in lines if line.startswith(VERDICT)]
    assert proc.returncode == 0, log
    assert len(verdicts) == 1 and lines[-1] == verdicts[0] and verdicts[0].startswith(f"{VERDICT} PASS ("), log
    assert "device cpu" in verdicts[0], log

    result = json.loads(out.read_text())
    status = {c["name"]: c["status"] for c in result["checks"]}
    assert set(status) == CHECKS, status
    assert all(s == "PASS" or (s == "SKIP" and name in MAY_SKIP) for name, s in status.items()), status
    assert result["ok"] and result["verdict"] == verdicts[0]
    for name, s in status.items():  # one line per check, in the documented form
        assert any(line.startswith(f"{name}: {s} ") and line.endswith(" s") for line in lines), (name, log)
    zero = {c["name"]: c for c in result["checks"]}["zero3_fp32"]
    assert zero["measured"]["update_err"] <= zero["tolerance"]["update_err"]


def test_gpu_learner_check_shell_script_parses():
    proc = subprocess.run(["bash", "-n", str(REPO / "benchmarks" / "gpu_learner_check.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
