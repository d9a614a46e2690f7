"""Trajectory records on real episodes: rendering, the windowed Parquet log, reading, `agentrl show`.

Episodes come from the real episode loop with scripted policies (gold replays, and a policy that
answers without calling, so omits every call) and the tiny model's tokenizer, as in
test_batching.py. The Ray side (the writer actor in a real training run) is covered by
tests/test_integration.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from agentrl.agent.chat import ChatFormatter
from agentrl.agent.episode import EpisodeLimits, Generation, run_episode
from agentrl.agent.gold import GoldPolicy
from agentrl.api import EpisodeGroup
from agentrl.cli import main
from agentrl.envs.builtin.generator import builtin_split
from agentrl.envs.session import LocalEnvSession
from agentrl.rewards.scoring import score_episode
from agentrl.telemetry.trajectories import (
    TRAJECTORY_DIR,
    TrajectoryError,
    TrajectoryLog,
    episode_records,
    read_trajectories,
    render_messages,
)
from agentrl.telemetry.transcript import episode_lines, split_messages


class Say:
    """Answers ``text`` without a tool call."""

    def __init__(self, formatter: ChatFormatter, text: str = "Done: 5."):
        self.formatter, self.text = formatter, text

    async def generate(self, prompt_ids, max_tokens):
        ids = self.formatter.render_assistant_ids(self.text)
        return Generation(ids, [-0.5] * len(ids), "stop")


@pytest.fixture(scope="module")
def decode(formatter):
    return lambda ids: formatter.tokenizer.decode(ids, skip_special_tokens=False)


def _episode(task, policy, formatter, max_tokens=2048):
    ep = asyncio.run(run_episode(task, policy, LocalEnvSession(task), formatter, EpisodeLimits(max_episode_tokens=max_tokens)))
    score_episode(ep, task)
    return ep


@pytest.fixture(scope="module")
def groups(formatter):
    """Two groups of two multi-turn tasks: gold, gold, omit, omit (versions 3 and 4)."""
    tasks = [t for t in builtin_split("train") if t.category == "base" and len(t.turns) >= 2
             and all(turn.gold for turn in t.turns)][:2]
    out = []
    for k, task in enumerate(tasks):
        episodes = [_episode(task, GoldPolicy(task, formatter), formatter) for _ in range(2)]
        episodes += [_episode(task, Say(formatter), formatter) for _ in range(2)]
        out.append(EpisodeGroup(task.id, f"g{k}", 3 + k, episodes))
    return out


def test_messages_are_the_token_stream_in_chunks(groups, formatter, decode):
    for e in (groups[0].episodes[0], groups[0].episodes[2]):
        chunks = render_messages(e, decode)
        assert "".join(c["text"] for c in chunks) == decode(e.token_ids)
        assert chunks[0]["role"] == "prompt" and chunks[0]["text"] == decode(e.token_ids[: e.prompt_len])
        assistant = [c for c in chunks if c["role"] == "assistant"]
        assert [c["text"] for c in assistant] == [decode(e.token_ids[a:b]) for a, b in e.step_spans]
        assert [c["turn"] for c in assistant] == e.step_turns
        assert all(c["role"] != chunks[i + 1]["role"] for i, c in enumerate(chunks[:-1]))  # sources alternate
    gold = render_messages(groups[0].episodes[0], decode)
    calls = groups[0].episodes[0].calls
    first_call = calls[0][0]
    assert first_call["name"] in gold[1]["text"] and gold[1]["role"] == "assistant"
    assert json.dumps(first_call["observation"], sort_keys=True) in gold[2]["text"]  # its tool result
    # a user message opens the next turn: the environment chunk after the turn's closing answer
    second_turn = [c for c in gold if c["turn"] == 1]
    assert second_turn[0]["role"] == "environment" and "<tool_response>" not in second_turn[0]["text"]


def test_a_cut_episode_ends_with_the_unanswered_environment_chunk(groups, formatter, decode):
    """The first turn answered, the second turn's user message appended, then no budget left."""
    task = next(t for t in builtin_split("train") if len(t.turns) >= 2)
    prompt = formatter.prompt_ids(None, task.visible_tools(0), task.turns[0].user)
    answer = formatter.render_assistant_ids("Done: 5.")
    short = _episode(task, Say(formatter), formatter, max_tokens=len(prompt) + len(answer) + 1)
    assert short.termination == "max_tokens" and len(short.step_spans) == 1
    chunks = render_messages(short, decode)
    assert "".join(c["text"] for c in chunks) == decode(short.token_ids)
    assert [(c["role"], c["turn"]) for c in chunks] == [("prompt", 0), ("assistant", 0), ("environment", 1)]


def test_records_carry_step_version_rewards_and_calls(groups, decode):
    rows = episode_records(groups[1], 7, decode)
    assert len(rows) == 4 and [r["index"] for r in rows] == [0, 1, 2, 3]
    e = groups[1].episodes[0]
    r = rows[0]
    assert (r["step"], r["task_id"], r["group_id"], r["policy_version"]) == (7, groups[1].task_id, "g1", 4)
    assert (r["outcome"], r["progress"]) == (e.rewards["outcome"], e.rewards["progress"]) == (1.0, 1.0)
    assert json.loads(r["rewards"]) == e.rewards and json.loads(r["calls"]) == e.calls
    assert (r["tokens"], r["policy_tokens"], r["prompt_tokens"]) == (len(e.token_ids), e.n_policy_tokens, e.prompt_len)
    assert r["turn_passed"] == e.turn_passed and r["termination"] == e.termination
    assert rows[2]["outcome"] == 0.0 and json.loads(rows[2]["calls"]) == [[] for _ in e.turn_passed]  # omits every call


@pytest.fixture(scope="module")
def run_dir(groups, decode, tmp_path_factory):
    """Steps 1-5 in windows of 2: files 1-2, 3-4 and (closed early, as at the end of a run) 5."""
    run = tmp_path_factory.mktemp("run")
    log = TrajectoryLog(run / TRAJECTORY_DIR, every=2)
    for step in range(1, 6):
        log.add(step, [row for g in groups for row in episode_records(g, step, decode)])
        if step == 2:
            assert [p.name for p in log.files] == []  # step 3 closes the window
    log.close()
    assert log.close() is None
    assert [p.name for p in log.files] == ["steps-000001-000002.parquet", "steps-000003-000004.parquet",
                                           "steps-000005-000005.parquet"]
    assert sorted(p.name for p in (run / TRAJECTORY_DIR).iterdir()) == [p.name for p in log.files]  # no partial left
    return run


def test_read_back_every_episode_and_filter(run_dir, groups):
    rows = read_trajectories(run_dir)
    assert len(rows) == 5 * 2 * 4
    assert [(r["step"], r["group_id"], r["index"]) for r in rows] == [
        (s, g.group_id, i) for s in range(1, 6) for g in groups for i in range(4)]
    assert isinstance(rows[0]["rewards"], dict) and isinstance(rows[0]["calls"], list)
    assert rows[0]["messages"][0]["role"] == "prompt"
    assert {r["step"] for r in read_trajectories(run_dir, step=4)} == {4}
    failed = read_trajectories(run_dir, step=3, failed=True)
    assert len(failed) == 4 and all(r["outcome"] < 1 for r in failed) and {r["index"] for r in failed} == {2, 3}
    one = read_trajectories(run_dir, task_id=groups[1].task_id, limit=3)
    assert len(one) == 3 and {r["task_id"] for r in one} == {groups[1].task_id}
    with pytest.raises(TrajectoryError, match="no step 9 recorded.*steps 1-2, steps 3-4, step 5"):
        read_trajectories(run_dir, step=9)


def test_read_errors_name_the_place(tmp_path):
    with pytest.raises(TrajectoryError, match="no such run folder"):
        read_trajectories(tmp_path / "nope")
    with pytest.raises(TrajectoryError, match=f"{TRAJECTORY_DIR}: no trajectory files"):
        read_trajectories(tmp_path)


def test_transcript_splits_chatml_and_shows_tool_results(run_dir):
    assert split_messages("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n") == [
        ("system", "S"), ("user", "U")]
    row = read_trajectories(run_dir, step=1, limit=1)[0]
    lines = [text for text, _ in episode_lines(row)]
    assert lines[0].startswith(f"step 1 | task {row['task_id']} | v3 | group g0 #0 | outcome 1 progress 1 |")
    labels = [line.split(" ", 1)[0] for line in lines[1:]]
    assert {"rewards", "system", "user", "assistant", "tool", "calls"} <= set(labels)
    assert not any("<|im_" in line for line in lines)
    raw = [text for text, _ in episode_lines(row, raw=True)]
    assert any("<|im_start|>" in line for line in raw)


def test_show_cli(run_dir, groups, capsys, tmp_path):
    assert main(["show", str(run_dir), "--step", "2", "--failed"]) == 0
    out = capsys.readouterr().out
    assert out.count("\nstep 2 | ") + out.startswith("step 2 | ") == 4 and "outcome 1 " not in out
    assert "Done: 5." in out

    assert main(["show", str(run_dir), "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("step 1 | task") == 3 and "first 3 episodes" in out

    assert main(["show", str(run_dir), "--task", groups[0].task_id, "--limit", "0"]) == 0
    assert capsys.readouterr().out.count(f"task {groups[0].task_id} |") == 5 * 4

    for args, message in ([str(tmp_path / "missing")], "no such run folder"), ([str(tmp_path)], "no trajectory files"), \
            ([str(run_dir), "--step", "6"], "no step 6"), ([str(run_dir), "--task", "nope"], "no episodes of task 'nope'"):
        assert main(["show", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err, err


def test_terminal_output_is_the_plain_text(run_dir):
    """On a terminal rich styles the lines; the text is the same."""
    import io

    from agentrl.telemetry.transcript import print_episodes

    rows = read_trajectories(run_dir, step=1, limit=2)
    plain, styled = io.StringIO(), io.StringIO()
    print_episodes(rows, file=plain, live=False)
    print_episodes(rows, file=styled, live=True)
    assert styled.getvalue() == plain.getvalue()
