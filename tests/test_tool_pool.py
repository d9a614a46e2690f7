"""Tool-session placement (``tools.placement``): in the rollout worker's process or on the pool.

The placement must change where calls run, never what an episode sees: the same scripted
episodes (gold, omitting, and erroring policies; builtin and BFCL tasks) give identical episodes
either way. Tasks with backend "sgls" reach the SGLS server through the pool actors under both.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util

import pytest

from agentrl.agent.chat import ChatFormatter
from agentrl.agent.episode import EpisodeLimits, Generation, run_episode
from agentrl.agent.gold import GoldPolicy, gold_assistant_texts
from agentrl.agent.parser import format_tool_calls
from agentrl.envs.builtin.generator import builtin_split
from agentrl.envs.session import LocalEnvSession
from agentrl.rewards.scoring import score_episode
from agentrl.rollout.tool_pool import RemoteEnvSession, ToolPool
from agentrl.tasks.schema import Task, ToolCall, ToolSpec

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SGLS_TOOL = ToolSpec.model_validate({"function": {
    "name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}})


def _sgls_task() -> Task:
    return Task(id="s1", domain="d", tools=[SGLS_TOOL], backend="sgls", initial_state={}, turns=[{"user": "look"}])


class Script:
    """Replays fixed assistant texts in order (the last one repeats)."""

    def __init__(self, formatter: ChatFormatter, texts: list[str]):
        self.formatter, self.texts, self.i = formatter, texts, 0

    async def generate(self, prompt_ids, max_tokens):
        text = self.texts[min(self.i, len(self.texts) - 1)]
        self.i += 1
        ids = self.formatter.render_assistant_ids(text)
        return Generation(ids, [-0.5] * len(ids), "stop")


def _policies(task: Task, formatter: ChatFormatter) -> dict:
    first = task.turns[0].gold[0][0] if task.turns[0].gold else ToolCall(name="nothing", arguments={})
    errors = [format_tool_calls([ToolCall(name="no_such_tool", arguments={})]),  # unknown tool
              format_tool_calls([ToolCall(name=first.name, arguments={"bogus": 1})])]  # bad arguments
    return {"gold": GoldPolicy(task, formatter), "omit": Script(formatter, ["Done: 5."]),
            "errors": Script(formatter, errors + gold_assistant_texts(task))}


def _tasks() -> list[Task]:
    heldout = builtin_split("heldout")
    tasks = [next(t for t in heldout if t.category == c and len(t.turns) >= 2) for c in ("base", "miss_param", "miss_func")]
    if importlib.util.find_spec("bfcl_eval") is not None:  # BFCL checks turns on every turn's results so far
        from agentrl.envs.bfcl.tasks import bfcl_tasks

        tasks += bfcl_tasks("base")[:2]
    return tasks


def _comparable(ep) -> dict:
    d = dataclasses.asdict(ep)
    for timing in ("gen_seconds", "env_seconds"):
        d.pop(timing)
    return d


def test_placement_chooses_where_sessions_open():
    in_proc = ToolPool.create(3, 0.1, 8)  # in_process, no SGLS server: starts no actor (no Ray needed)
    assert in_proc.actors == [] and in_proc.placement == "in_process"
    task = builtin_split("heldout")[0]
    assert isinstance(asyncio.run(in_proc.open("a", task)), LocalEnvSession)
    with pytest.raises(ValueError, match="tools.sgls"):
        asyncio.run(in_proc.open("b", _sgls_task()))
    with pytest.raises(ValueError, match="placement"):
        ToolPool([], "remote")
    with pytest.raises(ValueError, match="at least one actor"):
        ToolPool([], "pool")


def test_scripted_episodes_are_identical_in_process_and_on_the_pool(formatter, ray_cluster):
    pool = ToolPool.create(2, 0.1, 8, placement="pool")
    in_proc = ToolPool([], "in_process")
    limits = EpisodeLimits(max_episode_tokens=2048)

    async def episode(tools: ToolPool, task: Task, name: str, sid: str):
        session = await tools.open(sid, task)
        try:
            ep = await run_episode(task, _policies(task, formatter)[name], session, formatter, limits)
        finally:
            await session.close()
        score_episode(ep, task)
        return ep, session

    n = 0
    for task in _tasks():
        for name in ("gold", "omit", "errors"):
            local, ls = asyncio.run(episode(in_proc, task, name, f"{task.id}/{name}/l"))
            remote, rs = asyncio.run(episode(pool, task, name, f"{task.id}/{name}/r"))
            assert isinstance(ls, LocalEnvSession) and isinstance(rs, RemoteEnvSession)
            assert _comparable(local) == _comparable(remote), (task.id, name)
            n += sum(len(t) for t in local.calls)
        assert local.n_call_blocks > 0  # the erroring policy did call tools
    stats = ray_cluster.get([a.stats.remote() for a in pool.actors])
    assert sum(s["calls"] for s in stats) == n  # every call of the pool episodes ran on an actor...
    assert sum(s["open_sessions"] for s in stats) == 0  # ...and close() released every session


def test_sgls_tasks_stay_on_the_pool_under_in_process(ray_cluster):
    """Under ``in_process`` a builtin task runs locally, an "sgls" one on a pool actor, which
    reaches the (here stub) SGLS server: the server sees exactly the SGLS call."""

    @ray_cluster.remote
    class StubSGLSServer:
        def __init__(self):
            self.calls = []

        def simulate(self, task_id, history, call, tool_spec, initial_state=None, seed=None):
            self.calls.append((task_id, call["name"]))
            return {"hits": 3}

        def seen(self):
            return self.calls

    server = StubSGLSServer.remote()
    tools = ToolPool.create(2, 0.1, 8, sgls_server=server)  # placement defaults to in_process
    assert tools.placement == "in_process" and len(tools.actors) == 2

    async def run():
        builtin, sgls = next(t for t in builtin_split("heldout") if t.turns[0].gold), _sgls_task()
        local = await tools.open("b", builtin)
        remote = await tools.open("s", sgls)
        assert isinstance(local, LocalEnvSession) and isinstance(remote, RemoteEnvSession)
        await local.execute(list(builtin.turns[0].gold[0]))
        obs = await remote.execute([ToolCall(name="lookup", arguments={"q": "x"})])
        await remote.close()
        return obs

    assert asyncio.run(run()) == [{"hits": 3}]
    assert ray_cluster.get(server.seen.remote()) == [("s1", "lookup")]
    assert sum(s["calls"] for s in ray_cluster.get([a.stats.remote() for a in tools.actors])) == 1
