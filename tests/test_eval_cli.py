"""``agentrl eval`` through the real runtime (Ray actors, tool pool, per-turn checker)."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_a_long_evaluation_reports_its_progress(tiny_model_dir, ray_cluster):
    """While episodes run, the driver polls the workers' tallies (the gold replay, polled every
    millisecond): counts only grow, never pass the total, and the worker's tally ends equal to what
    ``evaluate`` returned."""
    import ray

    from agentrl.config import load_config
    from agentrl.driver.cluster import RolloutSide
    from agentrl.driver.evaluate import GOLD_LIMITS
    from agentrl.envs.builtin.generator import builtin_split

    cfg = load_config(None, [f"model.path={tiny_model_dir}"])
    side = RolloutSide.create(cfg, str(tiny_model_dir), rollout_cfg=cfg.rollout.model_copy(update=GOLD_LIMITS),
                              engine=False)
    try:
        side.start()
        tasks = [t for t in builtin_split("heldout") if t.turns[0].gold][:6]
        seen = []
        results = side.evaluate(tasks, gold=True, progress=lambda *p: seen.append(p), progress_every_s=0.001)
        assert len(results) == 6 and all(r["outcome"] == 1.0 for r in results)
        assert ray.get(side.workers[0].eval_progress.remote()) == (6, 6.0)
        assert seen and all(total == 6 and 0 <= done <= 6 for done, total, _ in seen)
        assert [done for done, _, _ in seen] == sorted(done for done, _, _ in seen)
    finally:
        side.shutdown_workers()


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


@pytest.mark.heavy  # kept out of make test's 30 minutes (pyproject.toml: markers)
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


# ------------------------------------------------------------------ sampled evaluation (--samples, --temperature)

SHIPPED_MODEL = str(Path(__file__).resolve().parents[1] / "agentrl" / "assets" / "tiny-agent")


@pytest.mark.parametrize(("argv", "says"), [
    (["--samples", "3"], "--samples 3 with --temperature 0 (greedy): greedy samples are identical"),
    (["--samples", "2", "--temperature", "0.0"], "--samples 2 with --temperature 0 (greedy)"),
    (["--samples", "0", "--temperature", "1.0"], "--samples must be >= 1, got 0"),
    (["--samples", "-2", "--temperature", "1.0"], "--samples must be >= 1, got -2"),
    (["--temperature", "-0.5"], "--temperature must be >= 0, got -0.5"),
    (["--policy", "gold", "--samples", "2", "--temperature", "1.0"], "--policy gold with --samples 2"),
    (["--policy", "gold", "--samples", "4"], "--policy gold with --samples 4"),
    (["--policy", "gold", "--temperature", "0.7"], "--policy gold with --temperature 0.7"),
])
def test_bad_sampling_flags_exit_2_before_ray(argv, says, tmp_path, capsys, monkeypatch):
    """Refused before tasks are loaded or Ray starts (init_ray here would fail the test)."""
    import agentrl.driver.evaluate as evaluate

    def no_ray(cfg):
        raise AssertionError("Ray would start")

    monkeypatch.setattr(evaluate, "init_ray", no_ray)
    out = tmp_path / "r.jsonl"
    assert main(["eval", "--tasks", "builtin:heldout", "--model", SHIPPED_MODEL, "--out", str(out), *argv]) == 2
    assert says in capsys.readouterr().err
    assert not out.exists()


def test_sampling_defaults_are_greedy_once():
    from agentrl.cli import build_parser
    from agentrl.driver.evaluate import check_sampling

    args = build_parser().parse_args(["eval", "--tasks", "builtin:heldout"])
    assert (args.samples, args.temperature) == (1, 0.0)
    for samples, temperature, gold in [(1, 0.0, False), (1, 0.0, True), (1, 0.7, False), (5, 1.0, False)]:
        check_sampling(samples, temperature, gold)  # accepted


def test_pass_at_n_and_settings_line():
    from agentrl.config import load_config
    from agentrl.driver.evaluate import pass_at_n, rollout_settings

    rows = [{"task_id": t, "category": c, "outcome": o}
            for t, c, o in [("a", "x", 0.0), ("a", "x", 1.0), ("b", "x", 0.0), ("b", "x", 0.0), ("c", "y", 1.0), ("c", "y", 1.0)]]
    assert pass_at_n(rows) == {"x": (2, 0.5), "y": (1, 1.0), "overall": (3, 2 / 3)}
    rollout = load_config(None, []).rollout
    assert rollout_settings(rollout, "float32", False).endswith(
        "model.dtype=float32 temperature=0.0 (greedy; top_p unused) samples=1")
    assert rollout_settings(rollout, "float32", False, 3, 1.0).endswith(
        "model.dtype=float32 temperature=1.0 top_p=1.0 samples=3")


def test_sampled_eval_writes_every_episode_and_reports_pass_at_n(tiny_model_dir, ray_cluster, tmp_path, capsys):
    """--samples 3 --temperature 1.0 through vLLM on one task per builtin category: three JSONL
    lines per task (samples 0, 1, 2), the printed accuracy is the mean over those episodes and
    pass@3 the share of tasks with at least one success."""
    out = tmp_path / "sampled.jsonl"
    code = main(["eval", "--tasks", "builtin:heldout", "--limit", "1", "--model", str(tiny_model_dir),
                 "--samples", "3", "--temperature", "1.0", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    lines = printed.strip().splitlines()
    assert "temperature=1.0 top_p=1.0 samples=3" in printed
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    tasks = list(dict.fromkeys(r["task_id"] for r in rows))
    assert len(tasks) == 3 and len(rows) == 9
    for t in tasks:
        assert [r["sample"] for r in rows if r["task_id"] == t] == [0, 1, 2]
    # sampled, not one greedy episode written three times: some task's samples differ
    assert any(len({(r["policy_tokens"], r["calls"], r["outcome"]) for r in rows if r["task_id"] == t}) > 1 for t in tasks)
    mean = sum(r["outcome"] for r in rows) / len(rows)
    assert lines[-1] == f"overall accuracy: {mean:.4f}"
    solved = sum(any(r["outcome"] == 1.0 for r in rows if r["task_id"] == t) for t in tasks) / len(tasks)
    assert f"overall pass@3: {solved:.4f} (3 tasks)" in lines
