"""Debugging a plugin environment (docs/own_tools.md, "When something is wrong"): a tool that
raises is data (the episode record, the metrics, `agentrl eval`'s summary, `agentrl show`),
an evaluation reads as transcripts, a plugin's bad value ends `eval` and `train` with one message
and exit 2 (no run folder left), and a plugin's evaluation speaks its own language (no bank
behaviours, categories or summary scores it never defined).

The plugin is written into a temporary folder, as a user's would be: a meeting-room service whose
``book`` tool has a bug (it adds a string to an int for rooms whose floor is a number).
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from agentrl.api import Episode, EpisodeGroup
from agentrl.cli import main
from agentrl.common import plugins
from agentrl.envs.session import LocalEnvSession
from agentrl.rollout.worker import eval_row, group_summary
from agentrl.tasks.io import load_tasks
from agentrl.tasks.schema import ToolCall
from agentrl.telemetry.summaries import step_metrics

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = '''
from agentrl.envs.registry import register_backend
from agentrl.envs.behaviours import register_behaviour
from agentrl.rewards.registry import Score, final_backend, register_reward


class Rooms:
    TOOLS = ("list_rooms", "book")

    def __init__(self, task):
        self.rooms = dict(task.initial_state["rooms"])
        self.booked = []

    def list_rooms(self) -> dict:
        """List the rooms."""
        return {"rooms": sorted(self.rooms)}

    def book(self, room: str) -> dict:
        """Book a room.

        Args:
            room: The room's name.
        """
        if room not in self.rooms:
            raise LookupError(f"no room {room!r}")  # a mistake the model should read
        where = "floor " + self.rooms[room]["floor"]  # BUG_LINE
        self.booked.append(room)
        return {"booked": room, "where": where}

    def call(self, name, arguments):
        return getattr(self, name)(**arguments)


def rooms_goal(episode, task) -> Score:
    booked = final_backend(episode, task).booked
    return Score(outcome=float(booked == [task.metadata["room"]]), process=float(bool(booked)))


def rooms_text(episode, task):
    return "success"  # TEXT_LINE


def listed_first(episode, task):
    calls = [c for turn in episode.calls for c in turn]
    return (int(bool(calls) and calls[0]["name"] == "list_rooms"), 1)


register_backend("dbg-rooms", Rooms, tools=[getattr(Rooms, n) for n in Rooms.TOOLS], reward="dbg-rooms-goal")
register_reward("dbg-rooms-goal", rooms_goal)
register_reward("dbg-rooms-text", rooms_text)
register_behaviour("listed_first", listed_first, backend="dbg-rooms")
'''


def _task(tid: str, room: str, reward: str | None = None) -> dict:
    data = {"id": tid, "domain": "rooms", "backend": "dbg-rooms",
            "initial_state": {"rooms": {"Atlas": {"floor": "2"}, "Bolt": {"floor": 3}}},
            "turns": [{"user": f"Book {room}.", "gold": [[{"name": "list_rooms", "arguments": {}}],
                                                         [{"name": "book", "arguments": {"room": room}}]]}],
            "metadata": {"room": room}}
    return {**data, "reward": reward} if reward else data


@pytest.fixture(scope="module")
def plugin_folder(tmp_path_factory) -> Path:
    """The plugin file (one path for the module: a plugin registers its names once per process),
    its held-out tasks (rb-02 books Bolt: the bug) and a task whose reward returns a string."""
    folder = tmp_path_factory.mktemp("rooms")
    (folder / "env.py").write_text(PLUGIN, encoding="utf-8")
    (folder / "heldout.jsonl").write_text("\n".join(json.dumps(t) for t in [_task("rb-01", "Atlas"), _task("rb-02", "Bolt")]))
    (folder / "text.jsonl").write_text(json.dumps(_task("rb-text", "Atlas", reward="dbg-rooms-text")))
    return folder


@pytest.fixture
def env(plugin_folder, monkeypatch):
    """The plugin imported, from the repository root; the process's plugin record restored afterwards."""
    monkeypatch.setattr(plugins, "_LOADED", dict(plugins._LOADED))
    monkeypatch.chdir(ROOT)
    plugins.load_plugins([str(plugin_folder / "env.py")])
    return plugin_folder


def _line(folder: Path, marker: str) -> int:
    return next(n for n, line in enumerate((folder / "env.py").read_text().splitlines(), 1) if marker in line)


# ------------------------------------------------------------------ without Ray

def test_a_raising_tool_is_recorded_with_its_turn_and_place(env):
    task = load_tasks(env / "heldout.jsonl")[1]
    session = LocalEnvSession(task)
    obs = session.execute_sync([ToolCall(name="book", arguments={"room": "Nowhere"})])
    assert obs == [{"error": "no room 'Nowhere'"}] and session.tool_errors_sync() == []  # meant for the model
    session.end_turn_sync(0, [])
    obs = session.execute_sync([ToolCall(name="book", arguments={"room": "Bolt"})])
    assert obs[0]["error"].startswith("book failed: TypeError")  # the model reads it too
    [error] = session.tool_errors_sync()
    assert error["tool"] == "book" and error["arguments"] == {"room": "Bolt"} and error["type"] == "TypeError"
    assert "concatenate" in error["message"] and error["turn"] == 1
    assert error["where"].endswith(f"env.py:{_line(env, 'BUG_LINE')}")


def test_tool_errors_reach_the_step_metrics_and_a_plugin_row_has_only_its_keys(env):
    task = load_tasks(env / "heldout.jsonl")[1]
    error = {"tool": "book", "arguments": {"room": "Bolt"}, "type": "TypeError", "message": "m", "where": "", "turn": 0}
    ep = Episode(task.id, [], [], [], [], 0, [True], 1, calls=[[{"name": "book", "arguments": {"room": "Bolt"},
                                                                  "observation": {"error": "x"}, "step": 0}]],
                 answers=["Done."], tool_errors=[error, error], rewards={"outcome": 0.0, "progress": 1.0})
    summary = group_summary(EpisodeGroup(task.id, "g", 0, [ep, ep]))
    assert summary.tool_errors == 4
    m = step_metrics([summary], {"rollout_wait": 0, "learn": 0, "sync": 0, "step": 0}, {}, version=1)
    assert m["train/tool_errors"] == 4.0
    row = eval_row(ep, task, 0)
    assert row["category"] is None and row["summary_score"] is None and row["omission"] is None
    assert row["behaviours"] == {"listed_first": [0, 1]} and row["tool_errors"] == [error, error]


# ------------------------------------------------------------------ through the real runtime

@pytest.mark.integration
@pytest.mark.parametrize("placement", ["in_process", "pool"])
def test_eval_reports_a_raising_tool_and_show_opens_the_evaluation(placement, env, tiny_model_dir, ray_cluster,
                                                                    tmp_path, capsys):
    out = tmp_path / "eval" / "results.jsonl"
    code = main(["eval", "--tasks", str(env / "heldout.jsonl"), "--policy", "gold", "--model", str(tiny_model_dir),
                 "--out", str(out), f"envs.plugins=[{env / 'env.py'}]", f"tools.placement={placement}"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    rows = {r["task_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    [error] = rows["rb-02"]["tool_errors"]
    assert (error["tool"], error["type"], error["turn"]) == ("book", "TypeError", 0)
    assert error["where"].endswith(f"env.py:{_line(env, 'BUG_LINE')}") and rows["rb-01"]["tool_errors"] == []
    # the plugin's language: no category, no bank behaviours, no summary score or omission it never defined
    for r in rows.values():
        assert r["category"] is None and r["summary_score"] is None and r["omission"] is None
        assert r["behaviours"] == {"listed_first": [1, 1]}
    assert "tool errors: 1 in 1 episode(s)" in printed
    assert re.search(r"task 'rb-02' turn 1: book\(\{\"room\": \"Bolt\"\}\) raised TypeError: .*env\.py:\d+", printed)
    assert "behaviour listed_first: 1.0000" in printed
    assert not re.search(r"^(category|base) ", printed, flags=re.M)  # no category table
    for absent in ("miss_param_ask", "balance_lookup", "summary"):
        assert absent not in printed, absent
    assert f"transcripts: agentrl show {out.parent}" in printed

    assert main(["show", str(out.parent), "--task", "rb-02"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("eval | task rb-02 |") and "1 tool error(s)" in shown
    assert re.search(r"tool error +turn 1: book\(\{\"room\": \"Bolt\"\}\) raised TypeError: .*env\.py:\d+", shown)
    assert main(["show", str(out.parent), "--failed"]) == 0
    failed = capsys.readouterr().out
    assert "task rb-02" in failed and "task rb-01" not in failed  # the bug cost rb-02 its booking
    assert main(["show", str(out.parent), "--category", "base"]) == 0
    assert capsys.readouterr().out.strip() == "no episodes"


@pytest.mark.integration
def test_eval_writes_under_run_output_dir_without_out(env, tiny_model_dir, ray_cluster, tmp_path, capsys):
    code = main(["eval", "--tasks", str(env / "heldout.jsonl"), "--policy", "gold", "--model", str(tiny_model_dir),
                 f"envs.plugins=[{env / 'env.py'}]", f"run.output_dir={tmp_path / 'elsewhere'}"])
    assert code == 0
    assert f"per-entry results: {tmp_path / 'elsewhere' / 'eval' / 'results.jsonl'}" in capsys.readouterr().out
    assert len((tmp_path / "elsewhere" / "eval" / "results.jsonl").read_text().splitlines()) == 2
    assert list((tmp_path / "elsewhere" / "eval" / "trajectories").glob("steps-*.parquet"))


@pytest.mark.integration
def test_on_tool_error_fail_stops_the_evaluation_with_one_message(env, tiny_model_dir, ray_cluster, tmp_path, capsys):
    code = main(["eval", "--tasks", str(env / "heldout.jsonl"), "--policy", "gold", "--model", str(tiny_model_dir),
                 "--out", str(tmp_path / "r.jsonl"), f"envs.plugins=[{env / 'env.py'}]", "rollout.on_tool_error=fail"])
    captured = capsys.readouterr()
    assert code == 2
    [message] = captured.err.strip().splitlines()
    assert message.startswith("error: task 'rb-02' turn 1: book({\"room\": \"Bolt\"}) raised TypeError")
    assert f"env.py:{_line(env, 'BUG_LINE')}" in message and "rollout.on_tool_error=fail" in message
    assert "Traceback" not in captured.out + captured.err and not (tmp_path / "r.jsonl").exists()


@pytest.mark.integration
def test_a_reward_returning_text_ends_eval_with_one_message(env, tiny_model_dir, ray_cluster, tmp_path, capsys):
    code = main(["eval", "--tasks", str(env / "text.jsonl"), "--policy", "gold", "--model", str(tiny_model_dir),
                 "--out", str(tmp_path / "r.jsonl"), f"envs.plugins=[{env / 'env.py'}]"])
    captured = capsys.readouterr()
    assert code == 2
    [message] = captured.err.strip().splitlines()
    assert message.startswith("error: reward 'dbg-rooms-text' returned outcome 'success' for task 'rb-text'; "
                              "expected a number in [0, 1]")
    assert re.search(rf"rooms_text, \S*env\.py:{_line(env, 'def rooms_text')}\)$", message)
    assert "Traceback" not in captured.out + captured.err


@pytest.mark.integration
def test_a_reward_returning_text_ends_train_with_exit_2_and_no_run_folder(env, ray_cluster, tmp_path, capsys):
    """The example's config on the text-reward task: the held-out evaluation at the start scores
    the first episode, which stops the run before any step; nothing is left under output_dir."""
    runs = tmp_path / "runs"
    code = main(["train", "examples/own_tools/config.yaml", f"envs.plugins=[{env / 'env.py'}]",
                 f"tasks.train={env / 'text.jsonl'}", f"tasks.heldout={env / 'text.jsonl'}", f"run.output_dir={runs}",
                 "telemetry.progress=false", "telemetry.tensorboard=false", "telemetry.trace=false"])
    captured = capsys.readouterr()
    assert code == 2, captured.out[-2000:] + captured.err[-2000:]
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "reward 'dbg-rooms-text' returned outcome 'success' for task 'rb-text'" in errors[0]
    assert "Traceback" not in captured.out + captured.err and "the run failed" not in captured.out
    assert not runs.exists() or not any(runs.iterdir())


def test_a_plugin_that_fails_at_registration_names_its_line(tmp_path, monkeypatch):
    from agentrl.config import ConfigError, load_config

    monkeypatch.setattr(plugins, "_LOADED", dict(plugins._LOADED))
    bad = tmp_path / "bad_env.py"
    bad.write_text(textwrap.dedent('''
        from agentrl.envs.registry import register_backend

        def book(room: object) -> dict:
            """Book a room."""

        register_backend("dbg-bad", object, tools=[book])
    '''), encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"envs.plugins=[{bad}]"])
    assert re.search(r"cannot import plugin '.*bad_env\.py' \(.*bad_env\.py:7\): ", str(err.value)), str(err.value)


def test_the_docs_idle_check_runs_as_written_on_the_example(monkeypatch):
    """docs/own_tools.md's idle-episode check (``idle_episode``, a named constructor), on the example."""
    monkeypatch.setattr(plugins, "_LOADED", dict(plugins._LOADED))
    monkeypatch.chdir(ROOT)
    page = (ROOT / "docs" / "own_tools.md").read_text(encoding="utf-8")
    [snippet] = [b for b in re.findall(r"^```python\n(.*?)^```", page, flags=re.S | re.M) if "idle_episode" in b]
    exec(compile(snippet.replace("my_tools/config.yaml", "examples/own_tools/config.yaml"), "own_tools.md", "exec"), {})


def test_records_written_before_tool_errors_existed_still_read(tmp_path):
    """A run recorded before ``tool_errors`` and ``category`` were columns: read as having none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from agentrl.telemetry.trajectories import TRAJECTORY_DIR, _schema, file_name, read_trajectories

    row = {"step": 1, "task_id": "t", "group_id": "g", "index": 0, "policy_version": 0, "outcome": 0.0, "progress": 0.0,
           "termination": "done", "n_turns": 1, "turn_passed": [False], "tokens": 3, "policy_tokens": 1,
           "prompt_tokens": 2, "call_blocks": 0, "valid_calls": 0, "gen_seconds": 0.0, "env_seconds": 0.0,
           "rewards": "{}", "calls": "[[]]", "messages": [{"role": "prompt", "turn": 0, "text": "hi"}]}
    old = pa.schema([f for f in _schema() if f.name not in ("tool_errors", "category")])
    (tmp_path / TRAJECTORY_DIR).mkdir()
    pq.write_table(pa.Table.from_pylist([row], schema=old), tmp_path / TRAJECTORY_DIR / file_name(1, 1))
    [read] = read_trajectories(tmp_path, failed=True)
    assert read["tool_errors"] == [] and read["category"] is None
    assert read_trajectories(tmp_path, category="base") == []


def test_a_builtin_style_domain_bug_is_recorded_too():
    """``ExecutableBackend`` (the builtin suite's) records an exception other than its ToolError
    the same way: a bug of the domain, not a mistake of the model."""
    from agentrl.envs.builtin.base import Domain
    from agentrl.envs.executable import ExecutableBackend

    class Clock(Domain):
        def tick(self, n: int) -> dict:
            """Advance the clock.

            Args:
                n: Ticks.
            """
            return {"ratio": 1 / n}

    backend = ExecutableBackend.for_classes({}, ["Clock"], classes={"Clock": Clock})
    assert backend.execute(ToolCall(name="tick", arguments={"n": 2})) == {"ratio": 0.5}
    assert backend.execute(ToolCall(name="tick", arguments={"n": 0}))["error"].startswith("tick failed: ZeroDivisionError")
    [error] = backend.tool_errors
    assert (error["tool"], error["arguments"], error["type"]) == ("tick", {"n": 0}, "ZeroDivisionError")
