"""examples/sqlite_notes: an in-memory SQLite notes database as an environment plugin
(docs/own_tools.md), checked the way that page says: reference solutions score 1 and doing
nothing does not, `agentrl eval --policy gold` scores 1.0000 on both task files, and the config
trains the shipped tiny model for 2 steps through the real stack (slow).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "sqlite_notes"
CONFIG = EXAMPLE / "config.yaml"
TASK_FILES = [EXAMPLE / "tasks.jsonl", EXAMPLE / "heldout.jsonl"]


@pytest.fixture(scope="module")
def env():
    """The plugin module, imported from its file as `envs.plugins` names it."""
    name = "sqlite_notes_env_under_test"
    spec = importlib.util.spec_from_file_location(name, EXAMPLE / "env.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(name, None)


def _tasks() -> list[dict]:
    return [json.loads(line) for path in TASK_FILES for line in path.read_text().splitlines() if line.strip()]


def _episode(env, task, turns: list[list[dict]], termination: str = "done", session=None):
    """What a reward function reads of an episode: per turn the calls with their observations
    (made on ``session``, a fresh database by default)."""
    session = session or env.NotesDB(task)
    calls = [[{**c, "observation": session.call(c["name"], c["arguments"]), "step": 0} for c in turn] for turn in turns]
    return SimpleNamespace(task_id=task.id, calls=calls, termination=termination, answers=["Done."] * len(turns))


def test_task_files_load_and_name_the_plugin(env):
    from agentrl.tasks.io import load_tasks

    for path, size in zip(TASK_FILES, (8, 4)):
        tasks = load_tasks(path)
        assert len(tasks) == size and {t.backend for t in tasks} == {"sqlite_notes"}
        # the catalogue is filled in from the registered functions
        assert {t.function.name for t in tasks[0].tools} == set(env.NotesDB.TOOLS)
    assert len({t["id"] for t in _tasks()}) == 12


def test_reference_solutions_score_one_and_doing_nothing_does_not(env):
    from agentrl.tasks.io import load_tasks

    for task in load_tasks(TASK_FILES[0]) + load_tasks(TASK_FILES[1]):
        gold = [[c.model_dump() for step in turn.gold for c in step] for turn in task.turns]
        assert gold and all(gold), task.id
        done = env.notes_goal(_episode(env, task, gold), task)
        assert (done.outcome, done.process) == (1.0, 1.0), task.id
        idle = env.notes_goal(_episode(env, task, [[] for _ in task.turns]), task)
        assert idle.outcome == 0.0 and 0.0 < idle.process < 1.0, task.id
        cut = env.notes_goal(_episode(env, task, gold, termination="length"), task)
        assert cut.outcome == 0.0 and cut.process < 1.0, task.id


def test_the_live_reward_reads_the_episodes_database_and_agrees_with_the_replay(env):
    """``notes_goal_live`` (the backend's default) scores the database the calls ran on, still
    open; ``notes_goal`` replays them into a fresh one: the same scores."""
    from agentrl.envs.registry import default_reward
    from agentrl.rewards.registry import reads_live_session
    from agentrl.tasks.io import load_tasks

    assert default_reward("sqlite_notes") == "notes_goal_live" and reads_live_session("notes_goal_live")
    assert not reads_live_session("notes_goal")
    for task in load_tasks(TASK_FILES[0]) + load_tasks(TASK_FILES[1]):
        gold = [[c.model_dump() for step in turn.gold for c in step] for turn in task.turns]
        for turns in (gold, [[] for _ in task.turns]):
            db = env.NotesDB(task)
            episode = _episode(env, task, turns, session=db)
            assert env.notes_goal_live(episode, task, db) == env.notes_goal(episode, task), task.id
            db.close()


def test_tool_mistakes_are_errors_the_model_reads(env):
    db = env.NotesDB(SimpleNamespace(initial_state={"notes": [{"title": "A", "body": "a", "tags": ["X"]}]}))
    assert db.call("search_notes", {"tag": "x"}) == {"notes": [{"note_id": 1, "title": "A", "tags": ["x"]}]}
    assert db.call("add_note", {"title": "B", "body": "b", "tags": []}) == {"note_id": 2}
    assert db.call("count_notes", {}) == {"count": 2}
    with pytest.raises(LookupError):
        db.call("delete_note", {"note_id": 7})
    with pytest.raises(ValueError):
        db.call("add_note", {"title": " ", "body": "b", "tags": []})
    assert db.call("delete_note", {"note_id": 1}) == {"deleted": 1}
    assert db.snapshot() == [{"title": "B", "body": "b", "tags": []}]


@pytest.mark.integration
@pytest.mark.parametrize("task_file", TASK_FILES, ids=lambda p: p.name)
def test_gold_policy_scores_one(ray_cluster, task_file, tmp_path, monkeypatch, capsys):
    from agentrl.cli import main

    monkeypatch.chdir(ROOT)
    args = ["eval", "--config", str(CONFIG.relative_to(ROOT)), "--tasks", str(task_file.relative_to(ROOT)),
            "--policy", "gold", "--out", str(tmp_path / "results.jsonl")]
    assert main(args) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "overall accuracy: 1.0000"
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(rows) == (8 if task_file.name == "tasks.jsonl" else 4)
    assert all(r["outcome"] == 1.0 and r["termination"] == "done" for r in rows)


@pytest.mark.slow
@pytest.mark.integration
def test_the_config_trains_two_steps(ray_cluster, tmp_path, monkeypatch):
    from agentrl.cli import main

    monkeypatch.chdir(ROOT)
    assert main(["train", str(CONFIG.relative_to(ROOT)), f"run.output_dir={tmp_path}", "telemetry.progress=false",
                 "telemetry.tensorboard=false", "telemetry.trace=false"]) == 0
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/success" in r]
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert s["train/episodes"] == 16  # 4 tasks x 4 episodes
        assert s["recovery/dropped_episodes"] == 0 and s["train/env_failures"] == 0
        assert s["buffer/dropped_stale"] == 0 and s["learner/tokens"] > 0
        assert 0.0 <= s["train/success"] <= 1.0 and 0.0 <= s["reward/process"] <= 1.0
    assert sum("eval/success" in r for r in rows) == 2  # held-out, before and after
