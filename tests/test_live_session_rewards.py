"""Rewards that score the live session (``register_reward(..., live_session=True)``,
docs/own_tools.md "The reward function"): the reward gets the very session the episode's calls
ran against, before it closes, wherever it lives, so a service behind the backend sees each call
once; a backend whose answers carry fresh ids works with it and still stops the replay
(``final_backend``) with its "not deterministic" error.

The plugin is written into a temporary folder, as a user's would be: a ticket service that gives
every ticket a uuid. Its "service" is a folder named by the task (``initial_state.service``):
every call, reward and close appends an event there, whichever process runs it, so the test
counts what the service saw.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.common import plugins
from agentrl.envs.session import LocalEnvSession
from agentrl.rewards.registry import idle_episode, reads_live_session, register_reward, run_reward
from agentrl.rewards.scoring import score_episode
from agentrl.rollout.tool_pool import score_on_session
from agentrl.tasks.io import load_tasks
from agentrl.tasks.schema import ToolCall

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = '''
import json
import os
import uuid
from pathlib import Path

from agentrl.envs.registry import register_backend
from agentrl.rewards.registry import Score, final_backend, register_reward


class Tickets:
    """One episode's session with the ticket service: every ticket gets a new uuid."""

    TOOLS = ("open_ticket", "list_tickets")

    def __init__(self, task):
        self.service = Path(task.initial_state["service"])
        self.session = uuid.uuid4().hex
        self.tickets = {}  # id -> title
        self.closed = False

    def log(self, event, **extra):
        with open(self.service / "events.jsonl", "a") as f:
            f.write(json.dumps({"event": event, "session": self.session, "pid": os.getpid(), **extra}) + "\\n")

    def open_ticket(self, title: str) -> dict:
        """Open a ticket.

        Args:
            title: What the ticket is about.
        """
        ticket = uuid.uuid4().hex
        self.tickets[ticket] = title
        self.log("call", tool="open_ticket")
        return {"ticket_id": ticket}

    def list_tickets(self) -> dict:
        """List the open tickets."""
        self.log("call", tool="list_tickets")
        return {"tickets": [{"ticket_id": k, "title": v} for k, v in self.tickets.items()]}

    def call(self, name, arguments):
        return getattr(self, name)(**arguments)

    def close(self):
        self.closed = True
        self.log("close")


def tickets_live(episode, task, tickets) -> Score:
    seen = [c["observation"]["ticket_id"] for turn in episode.calls for c in turn if c["name"] == "open_ticket"]
    tickets.log("reward", open=not tickets.closed, same_ids=seen == list(tickets.tickets))
    return Score(outcome=float(sorted(tickets.tickets.values()) == task.metadata["titles"]), process=0.5)


def tickets_replay(episode, task) -> Score:
    return float(sorted(final_backend(episode, task).tickets.values()) == task.metadata["titles"])


def tickets_live_text(episode, task, tickets):
    return "yes"


register_backend("live-tickets", Tickets, tools=[getattr(Tickets, n) for n in Tickets.TOOLS], reward="live-tickets")
register_reward("live-tickets", tickets_live, live_session=True)
register_reward("live-tickets-replay", tickets_replay)
register_reward("live-tickets-text", tickets_live_text, live_session=True)
'''


def _task(tid: str, service: Path, titles: list[str], reward: str | None = None) -> dict:
    gold = [[{"name": "open_ticket", "arguments": {"title": t}} for t in titles], [{"name": "list_tickets", "arguments": {}}]]
    data = {"id": tid, "domain": "tickets", "backend": "live-tickets", "initial_state": {"service": str(service)},
            "turns": [{"user": f"Open tickets for {', '.join(titles)}.", "gold": gold}],
            "metadata": {"titles": sorted(titles)}}
    return {**data, "reward": reward} if reward else data


@pytest.fixture(scope="module")
def plugin_file(tmp_path_factory) -> Path:
    """One path for the module: a plugin registers its names once per process."""
    path = tmp_path_factory.mktemp("tickets") / "env.py"
    path.write_text(PLUGIN, encoding="utf-8")
    return path


@pytest.fixture
def env(plugin_file, monkeypatch):
    """The plugin imported, from the repository root; the process's plugin record restored afterwards."""
    monkeypatch.setattr(plugins, "_LOADED", dict(plugins._LOADED))
    monkeypatch.chdir(ROOT)
    plugins.load_plugins([str(plugin_file)])
    return plugin_file


def _task_file(folder: Path, reward: str | None = None) -> Path:
    """Two tasks whose service is ``folder``, in a file of their own."""
    (folder / "service").mkdir(parents=True)
    path = folder / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(_task(f"t{i}", folder / "service", titles, reward))
                              for i, titles in enumerate([["printer"], ["vpn", "email"]])))
    return path


def _events(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "service" / "events.jsonl").read_text().splitlines()]


def _eval(env: Path, tasks: Path, tiny_model_dir, placement: str, out: Path) -> int:
    return main(["eval", "--tasks", str(tasks), "--policy", "gold", "--model", str(tiny_model_dir), "--out", str(out),
                 f"envs.plugins=[{env}]", f"tools.placement={placement}"])


# ------------------------------------------------------------------ without Ray

def test_a_live_reward_scores_the_session_it_is_given(env, tmp_path):
    [task] = load_tasks(_task_file(tmp_path))[:1]
    assert reads_live_session("live-tickets") and not reads_live_session("live-tickets-replay")
    session = LocalEnvSession(task)
    [obs] = session.execute_sync([ToolCall(name="open_ticket", arguments={"title": "printer"})])
    episode = idle_episode(task)
    episode.calls = [[{"name": "open_ticket", "arguments": {"title": "printer"}, "observation": obs, "step": 0}]]
    assert score_on_session(session, episode) == (1.0, 0.5)
    session.close_sync()
    assert [e["event"] for e in _events(tmp_path)] == ["call", "reward", "close"]  # the call ran once
    reward = _events(tmp_path)[1]
    assert reward["open"] and reward["same_ids"] and reward["session"] == _events(tmp_path)[0]["session"]
    # score_episode takes the score the live reward gave where the session was
    assert score_episode(episode, task, function_score=(1.0, 0.5))["outcome"] == 1.0


def test_without_a_session_a_live_reward_reads_a_replay_it_closes(env, tmp_path):
    """The idle check of docs/own_tools.md: no session at hand, no call made; the replayed copy
    is a fresh session, closed after the reward read it."""
    [task] = load_tasks(_task_file(tmp_path))[:1]
    assert run_reward("live-tickets", idle_episode(task), task) == (0.0, 0.5)
    assert [e["event"] for e in _events(tmp_path)] == ["reward", "close"]
    # with a call, the replay meets a new uuid: the replay's own error
    session = LocalEnvSession(task)
    episode = idle_episode(task)
    [obs] = session.execute_sync([ToolCall(name="open_ticket", arguments={"title": "printer"})])
    episode.calls = [[{"name": "open_ticket", "arguments": {"title": "printer"}, "observation": obs, "step": 0}]]
    with pytest.raises(ValueError, match="not deterministic.*live_session=True"):
        run_reward("live-tickets-replay", episode, task)


def test_live_session_must_be_a_bool():
    with pytest.raises(TypeError, match="live_session must be True or False"):
        register_reward("live-tickets-bad", lambda episode, task, session: 1.0, live_session="yes")


# ------------------------------------------------------------------ through the real runtime

@pytest.mark.integration
@pytest.mark.parametrize("placement", ["in_process", "pool"])
def test_the_live_reward_reads_the_episodes_own_session_once_per_call(placement, env, tiny_model_dir, ray_cluster,
                                                                      tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    code = _eval(env, _task_file(tmp_path), tiny_model_dir, placement, out)
    printed = capsys.readouterr().out
    assert code == 0, printed[-3000:]
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["outcome"], r["progress"], r["termination"]) for r in rows] == [(1.0, 0.5, "done")] * 2
    events = _events(tmp_path)
    sessions = {e["session"] for e in events}
    assert len(sessions) == 2
    for session in sessions:
        mine = [e for e in events if e["session"] == session]
        # every call once (the gold plan's calls, no replay), then the reward on this open session, then close
        assert [e["event"] for e in mine] in (["call", "call", "reward", "close"], ["call"] * 3 + ["reward", "close"])
        reward = next(e for e in mine if e["event"] == "reward")
        assert reward["open"] and reward["same_ids"]
        assert len({e["pid"] for e in mine}) == 1  # the reward ran in the process that held the session
    if placement == "pool":
        assert {e["pid"] for e in events}.isdisjoint({os.getpid()})


@pytest.mark.integration
def test_the_replay_of_a_backend_with_fresh_ids_stops_with_not_deterministic(env, tiny_model_dir, ray_cluster,
                                                                             tmp_path, capsys):
    code = _eval(env, _task_file(tmp_path, reward="live-tickets-replay"), tiny_model_dir, "in_process",
                 tmp_path / "r.jsonl")
    captured = capsys.readouterr()
    assert code == 2
    [message] = captured.err.strip().splitlines()
    assert message.startswith("error: reward 'live-tickets-replay'") and "is not deterministic" in message
    assert "live_session=True" in message and "Traceback" not in captured.out + captured.err


@pytest.mark.integration
def test_a_live_reward_returning_text_on_the_pool_ends_eval_with_one_message(env, tiny_model_dir, ray_cluster,
                                                                            tmp_path, capsys):
    code = _eval(env, _task_file(tmp_path, reward="live-tickets-text"), tiny_model_dir, "pool", tmp_path / "r.jsonl")
    captured = capsys.readouterr()
    assert code == 2
    [message] = captured.err.strip().splitlines()
    assert message.startswith("error: reward 'live-tickets-text' returned outcome 'yes' for task 't")
    assert "Traceback" not in captured.out + captured.err
