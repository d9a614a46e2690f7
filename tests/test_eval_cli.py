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


# ------------------------------------------------------------------ a training run's own settings

@pytest.fixture
def run_folder(tiny_model_dir, tmp_path):
    """A training run's folder as `agentrl train` leaves it: the resolved config (rollout sizes far
    from the defaults of 96 tokens per message, 4 messages per turn, 1024 per episode) and the
    models in final/ and checkpoint-3/ (links to the tiny test model)."""
    from agentrl.config import dump_config, load_config

    run = tmp_path / "run-20250101-000000"
    run.mkdir()
    cfg = load_config(None, [f"model.path={tiny_model_dir}", "rollout.max_new_tokens=4",
                             "rollout.max_assistant_messages_per_turn=1", "rollout.max_episode_tokens=333"])
    (run / "config.yaml").write_text(dump_config(cfg))
    (run / "final").symlink_to(tiny_model_dir, target_is_directory=True)
    (run / "checkpoint-3").symlink_to(tiny_model_dir, target_is_directory=True)
    return run


def test_eval_of_a_runs_model_uses_the_runs_config_and_overrides_win(run_folder, ray_cluster, tmp_path, capsys):
    """The policy through vLLM: the run's 4 tokens per message and 1 message per turn bound every
    episode (the defaults would let the tiny model write its whole tool call), and the override of
    max_episode_tokens replaces the run's 333."""
    out = tmp_path / "model.jsonl"
    code = main(["eval", "--tasks", "builtin:heldout", "--limit", "1", "--model", str(run_folder / "final"),
                 "--out", str(out), "rollout.max_episode_tokens=555"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert (f"agentrl eval: config {run_folder / 'config.yaml'} (the run's resolved config), "
            "overrides rollout.max_episode_tokens=555") in printed
    assert ("agentrl eval: max_new_tokens=4 max_episode_tokens=555 max_assistant_messages_per_turn=1 "
            "model.dtype=float32") in printed
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 3
    assert all(0 < r["policy_tokens"] <= 4 * r["n_turns"] for r in rows), rows


@pytest.mark.parametrize(("model", "extra", "config"), [
    ("{run}", [], "{run}/config.yaml (the run's resolved config)"),  # a run folder: its final/
    ("{run}/final", [], "{run}/config.yaml (the run's resolved config)"),
    ("{run}/checkpoint-3", ["rollout.max_new_tokens=8"],
     "{run}/config.yaml (the run's resolved config), overrides rollout.max_new_tokens=8"),
    ("{run}/checkpoint-3", ["--config", "configs/quickstart.yaml"], "configs/quickstart.yaml"),
    ("{tiny}", [], "defaults (no --config, and the model is not a run's)"),
])
def test_eval_says_which_config_it_uses(model, extra, config, run_folder, tiny_model_dir, tmp_path, capsys):
    """Which config is printed first (then the unknown task source stops eval, before Ray starts)."""
    fill = {"run": run_folder, "tiny": tiny_model_dir}
    code = main(["eval", "--tasks", "builtin:nope", "--model", model.format(**fill), "--out", str(tmp_path / "r.jsonl"),
                 *extra])
    captured = capsys.readouterr()
    assert code == 2 and "unknown task source 'builtin:nope'" in captured.err
    assert captured.out.splitlines()[0] == f"agentrl eval: config {config.format(**fill)}"


def test_a_bad_override_of_a_runs_config_names_the_run_config(run_folder, tmp_path, capsys):
    code = main(["eval", "--tasks", "builtin:heldout", "--model", str(run_folder / "final"), "--out", str(tmp_path / "r.jsonl"),
                 "rollout.group_size=1"])
    assert code == 2
    assert "rollout.group_size" in capsys.readouterr().err


def test_eval_help_lists_every_task_source(capsys):
    from agentrl.envs.builtin.generator import SPLIT_SIZES
    from agentrl.envs.sources import _BFCL_CATEGORIES, _BFCL_SPLITS, TASK_SOURCES

    with pytest.raises(SystemExit) as done:
        main(["eval", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    sources = text[text.index("task sources (--tasks):"):]
    for name in [*(f"{p}:" for p in TASK_SOURCES), *SPLIT_SIZES, *_BFCL_CATEGORIES, *_BFCL_SPLITS, "airline", "retail",
                 ".jsonl", ".parquet", "RUN/final", "RUN/checkpoint-N"]:
        assert name in (sources if ":" in name or name.startswith(".") or name in SPLIT_SIZES else text), name
