"""``agentrl eval`` through the real runtime (Ray actors, tool pool, per-turn checker)."""

from __future__ import annotations

import json

import pytest

from agentrl.cli import main

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("placement", ["in_process", "pool"])  # tool sessions in the rollout worker, or on pool actors
def test_gold_replay_scores_one_on_builtin_heldout(placement, tiny_model_dir, ray_cluster, tmp_path, capsys):
    out = tmp_path / "gold.jsonl"
    code = main(["eval", "--tasks", "builtin:heldout", "--policy", "gold", "--limit", "4", "--model", str(tiny_model_dir),
                 "--out", str(out), f"tools.placement={placement}"])
    printed = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    assert printed[-1] == "overall accuracy: 1.0000"
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 12 and {r["category"] for r in rows} == {"base", "miss_func", "miss_param"}
    assert all(r["outcome"] == 1.0 and all(r["turn_passed"]) and len(r["turn_passed"]) == r["n_turns"] for r in rows)
    for cat in ("base", "miss_func", "miss_param"):
        assert any(line.split() == [cat, "4", "1.0000"] for line in printed)


@pytest.mark.parametrize(("argv", "says"), [
    (["--tasks", "builtin:nope"], "unknown task source 'builtin:nope'"),
    (["--tasks", "builtin:heldout", "--limit", "0"], "--limit must be >= 1"),
    (["--tasks", "builtin:heldout", "rollout.group_size=1"], "rollout.group_size"),
])
def test_bad_input_exits_2_naming_it(argv, says, tiny_model_dir, tmp_path, capsys):
    assert main(["eval", "--model", str(tiny_model_dir), "--out", str(tmp_path / "r.jsonl"), *argv]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()
