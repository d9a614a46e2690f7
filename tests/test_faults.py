"""Fault handling without a cluster: which rollout calls are re-issued when a worker dies, the
scheduler's recovery steps, episodes whose environment failed, and their counts in the metrics.
The real thing (a worker and a tool actor killed mid-run) is in test_integration.py."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.api import ENV_ERROR, EnvError, GroupSummary
from agentrl.driver import scheduler as scheduler_mod
from agentrl.driver.scheduler import RolloutScheduler, collect


class Dead(Exception):
    """Stands in for ray.exceptions.RayActorError."""


class Call:
    """A pending rollout call with its tasks (as cluster.RolloutCall); ``dies``: times fetching it
    fails; ``killers``: tasks that kill any call they are in, every time."""

    def __init__(self, worker_index: int, tasks: list[str], dies: int = 0, killers: frozenset = frozenset()):
        self.worker_index, self.worker, self.role, self.tasks, self.dies = worker_index, f"w{worker_index}", "policy", tasks, dies
        self.killers = killers
        self.ref, self.result, self.launches = self, None, 1

    def fetch(self, timeout=None):
        return fetch(self)

    def part(self, i: int) -> "Call":
        one = Call(self.worker_index, self.tasks[i:i + 1], killers=self.killers)
        one.launches = self.launches
        return one

    @staticmethod
    def merge(results: list) -> list:
        return [x for r in results for x in r]


def fetch(call: Call):
    if call.dies or set(call.tasks) & call.killers:
        call.dies = max(0, call.dies - 1)
        raise Dead
    return [f"{t}@launch{call.launches}" for t in call.tasks]


def relaunch(call: Call) -> Call:
    call.launches += 1
    return call


def test_collect_reissues_exactly_the_dead_workers_calls():
    calls = [Call(0, ["a", "c"]), Call(1, ["b", "d"], dies=1), Call(2, ["e"], dies=2)]
    reissued = []
    results = collect(calls, fetch, lambda c, err: reissued.append(c.worker_index) or relaunch(c), (Dead,))
    # every task delivered once, from the call that finished; only the dead calls went out again
    assert results == [["a@launch1", "c@launch1"], ["b@launch2", "d@launch2"], ["e@launch3"]]
    assert reissued == [1, 2, 2]
    assert collect(calls, fetch, lambda c, err: relaunch(c), (Dead,)) == results  # fetched once: never re-issued again


def test_collect_without_recovery_lets_the_error_through():
    with pytest.raises(Dead):
        collect([Call(0, ["a"], dies=1)], fetch, lambda c, err: relaunch(c), ())


class TimedOut(Exception):
    """Stands in for ray.exceptions.GetTimeoutError."""


class FakeRay:
    class exceptions:
        RayActorError = Dead
        GetTimeoutError = TimedOut

    @staticmethod
    def get(ref):
        return fetch(ref)

    @staticmethod
    def wait(refs, num_returns=1, timeout=None, fetch_local=True):
        return refs, []


class Engines:
    def __init__(self):
        self.loads, self.into = [], []

    def sync(self, version):
        self.loads.append(version)

    def load_into(self, worker, role, version):
        self.into.append((worker, role, version))


@pytest.mark.parametrize("async_rollouts", [False, True])
def test_a_dead_worker_is_revived_given_the_learners_weights_and_its_tasks_reissued(monkeypatch, async_rollouts):
    monkeypatch.setattr(scheduler_mod, "ray", FakeRay)
    engines, revived = Engines(), []
    launches = {1: [Call(0, ["a"]), Call(1, ["b"])], 2: [Call(0, ["c"]), Call(1, ["d"], dies=1)]}
    s = RolloutScheduler(launches.get, engines, async_rollouts, revive=lambda w: revived.append(w) or 1.0,
                         reissue=relaunch)
    assert s.take(1) == [["a@launch1"], ["b@launch1"]]
    s.prefetch(2, until=3)
    s.updated(1)  # sync mode loads v1 now; async mode holds it back until step 2's rollouts are in
    assert s.take(2) == [["c@launch1"], ["d@launch2"]]
    assert revived == ["w1"] and engines.into == [("w1", "policy", 1)]  # the learner's newest weights
    assert s.pop_recoveries() == {"recovery/worker_restarts": 1.0, "recovery/reissued_groups": 1.0,
                                  "recovery/quarantined_tasks": 0.0}
    assert s.pop_recoveries() == {"recovery/worker_restarts": 0.0, "recovery/reissued_groups": 0.0,
                                  "recovery/quarantined_tasks": 0.0}


def test_a_task_that_kills_its_worker_twice_is_quarantined_and_the_others_delivered(monkeypatch):
    """The call [a, bad, c] dies; its tasks are re-issued one at a time; ``bad`` kills its worker
    again alone, so it is quarantined (never launched again); ``a`` and ``c`` are delivered once."""
    monkeypatch.setattr(scheduler_mod, "ray", FakeRay)
    engines, revived = Engines(), []
    launches = {1: [Call(0, ["a", "bad", "c"], killers=frozenset({"bad"})), Call(1, ["d"])]}
    s = RolloutScheduler(launches.get, engines, False, revive=lambda w: revived.append(w) or 1.0, reissue=relaunch)
    assert s.take(1) == [["a@launch2", "c@launch2"], ["d@launch1"]]
    assert s.quarantined == {"bad"}
    assert revived == ["w0", "w0"]  # the call's death, then bad's own
    assert s.pop_recoveries() == {"recovery/worker_restarts": 2.0, "recovery/reissued_groups": 3.0,
                                  "recovery/quarantined_tasks": 1.0}


def test_a_task_only_present_in_dead_calls_is_never_quarantined(monkeypatch):
    """``a`` is in two calls whose workers died for other reasons (each dies once, whatever it
    holds): re-run alone each time, it is delivered both times and never blamed."""
    monkeypatch.setattr(scheduler_mod, "ray", FakeRay)
    launches = {1: [Call(0, ["a", "x"], dies=1)], 2: [Call(0, ["a", "a", "y"], dies=1)]}
    s = RolloutScheduler(launches.get, Engines(), False, revive=lambda w: 1.0, reissue=relaunch)
    assert s.take(1) == [["a@launch2", "x@launch2"]]
    assert s.take(2) == [["a@launch2", "a@launch2", "y@launch2"]]  # a task drawn twice in one step: both delivered
    assert s.quarantined == set() and s.pop_recoveries()["recovery/quarantined_tasks"] == 0.0


def test_a_rollout_call_past_its_timeout_is_an_error_naming_the_worker(monkeypatch):
    class Hung(Call):
        def fetch(self, timeout=None):
            assert timeout == 5.0
            raise TimedOut

    monkeypatch.setattr(scheduler_mod, "ray", FakeRay)
    s = RolloutScheduler({1: [Hung(3, ["a"])]}.get, Engines(), False, revive=lambda w: 1.0, reissue=relaunch, timeout_s=5.0)
    with pytest.raises(scheduler_mod.RolloutTimeout, match=r"rollout worker 3 \(policy, actor w3\).*rollout_timeout_s=5s"):
        s.take(1)


def test_discarded_rollouts_of_a_dead_worker_are_not_reissued_but_its_engine_is_rebuilt(monkeypatch):
    monkeypatch.setattr(scheduler_mod, "ray", FakeRay)
    engines, revived = Engines(), []
    launches = {1: [Call(0, ["a"])], 2: [Call(0, ["b"], dies=1)]}
    s = RolloutScheduler(launches.get, engines, True, revive=lambda w: revived.append(w) or 1.0, reissue=relaunch)
    s.take(1)
    s.prefetch(2, until=3)
    s.updated(1)
    s.sync(discard_in_flight=True)  # the end of the run: the weight load needs the revived engine
    assert revived == ["w0"] and engines.loads == [1] and not s.in_flight
    assert s.pop_recoveries() == {"recovery/worker_restarts": 1.0, "recovery/reissued_groups": 0.0,
                                  "recovery/quarantined_tasks": 0.0}


def test_a_worker_restarted_while_idle_is_revived_before_the_weights_load(monkeypatch):
    """It died after returning its groups: no call of its is pending, so only the load finds it."""
    from agentrl.api import EngineNotStarted

    class FirstLoadFails(Engines):
        def sync(self, version):
            if not self.loads:
                self.loads.append("failed")
                raise EngineNotStarted("restarted")
            super().sync(version)

    monkeypatch.setattr(scheduler_mod, "ray", FakeRay)
    engines = FirstLoadFails()
    s = RolloutScheduler({1: [Call(0, ["a"])]}.get, engines, False, revive=lambda w: 1.0, reissue=relaunch,
                         revive_restarted=lambda: [("w0", "policy")])
    s.take(1)
    s.updated(1)
    assert engines.loads == ["failed", 1] and s.version == 1
    assert s.pop_recoveries()["recovery/worker_restarts"] == 1.0


def test_a_worker_that_dies_again_while_rebuilt_stops_the_run_resumably(monkeypatch):
    """The load fails, the restarted worker is rebuilt, and the load fails again (Ray's memory
    monitor killed it twice in a row on a SmolLM2 run): not an unexplained crash but
    ``ResumableFailure`` (exit 75, ``--resume auto``), naming the version and the error."""
    from agentrl.api import EngineNotStarted
    from agentrl.checkpointing.preemption import ResumableFailure

    class EveryLoadFails(Engines):
        def sync(self, version):
            self.loads.append("failed")
            raise EngineNotStarted("restarted") if len(self.loads) == 1 else Dead("killed again")

    monkeypatch.setattr(scheduler_mod, "ray", FakeRay)
    engines = EveryLoadFails()
    s = RolloutScheduler({1: [Call(0, ["a"])]}.get, engines, False, revive=lambda w: 1.0, reissue=relaunch,
                         revive_restarted=lambda: [("w0", "policy")])
    s.take(1)
    with pytest.raises(ResumableFailure, match=r"weight load of v1 failed again after 1 rollout worker\(s\) were "
                                               r"rebuilt \(Dead: killed again\)"):
        s.updated(1)
    assert engines.loads == ["failed", "failed"] and s.version == 0


def _summary(outcomes: list[float], failures: int = 0) -> GroupSummary:
    return GroupSummary("t", 0, outcomes, outcomes, {"process": 0.5} if outcomes else {}, 10 * len(outcomes), 0, 0, 0,
                        1.0, 0.0, 1.0, env_failures=failures)


def test_dropped_episodes_are_counted_and_in_no_other_number():
    from agentrl.rollout.worker import dropped_summary
    from agentrl.telemetry.summaries import step_metrics

    timings = {k: 0.0 for k in ("rollout_wait", "sync", "learn", "step")}
    m = step_metrics([_summary([1.0, 0.0, 1.0], failures=1), dropped_summary("u", 0, 4, "policy")], timings, {}, 1)
    assert m["train/env_failures"] == m["recovery/dropped_episodes"] == 5
    assert m["train/episodes"] == 3 and m["train/success"] == pytest.approx(2 / 3) and m["reward/process"] == 0.5


@pytest.mark.integration
def test_a_step_with_no_group_to_learn_from_says_so(ray_cluster, tiny_model_dir, capsys):
    """Every episode of a step dropped (or every group too stale): phase 3 finds the real replay
    buffer empty, runs no update, keeps the version, and prints why (the step line alone would
    look like any other)."""
    from types import SimpleNamespace

    from agentrl.config import load_config
    from agentrl.driver.replay_buffer import ReplayBuffer
    from agentrl.driver.trainer import Trainer

    cfg = load_config(None, [f"model.path={tiny_model_dir}"])
    prefetched = []
    host = SimpleNamespace(cfg=cfg, buffer=ReplayBuffer.remote(8, 1), version=3, deadline=None,
                           scheduler=SimpleNamespace(prefetch=lambda step, until: prefetched.append((step, until))))
    assert Trainer._learn(host, 5, 0, False, {}) == ({}, False)
    assert host.version == 3 and prefetched == [(6, cfg.train.steps)]
    assert "step 5: no group to learn from" in capsys.readouterr().out


def test_keep_trainable_drops_failed_environments():
    from types import SimpleNamespace

    from agentrl.rollout.worker import keep_trainable

    eps = [SimpleNamespace(termination=t) for t in ("done", ENV_ERROR, "length")] + [None]
    assert [e.termination for e in keep_trainable(eps)] == ["done", "length"]


def test_an_environment_that_fails_ends_the_episode_with_env_error(formatter):
    from agentrl.agent.episode import EpisodeLimits, run_episode
    from agentrl.agent.gold import GoldPolicy
    from agentrl.envs.builtin.generator import builtin_split
    from agentrl.envs.session import LocalEnvSession

    task = next(t for t in builtin_split("train") if t.gold_calls(0))

    class Failing(LocalEnvSession):
        def __init__(self, task, where):
            super().__init__(task)
            self.where = where

        async def execute(self, calls):
            if self.where == "execute":
                raise EnvError("tool actor died")
            return await super().execute(calls)

        async def end_turn(self, turn_index, results):
            raise EnvError("tool actor died")

    for where in ("execute", "end_turn"):
        ep = asyncio.run(run_episode(task, GoldPolicy(task, formatter), Failing(task, where), formatter, EpisodeLimits()))
        assert ep.termination == ENV_ERROR and ep.turn_passed == []
    ok = asyncio.run(run_episode(task, GoldPolicy(task, formatter), LocalEnvSession(task), formatter, EpisodeLimits()))
    assert ok.termination == "done"


def test_a_dead_sgls_server_or_tool_actor_is_an_environment_error(monkeypatch):
    import ray

    from agentrl.rollout import sgls_server, tool_pool
    from agentrl.tasks.schema import ToolCall

    class Server:
        class simulate:
            @staticmethod
            def remote(*args):
                return "ref"

    def dead(*args, **kwargs):
        raise ray.exceptions.RayActorError()

    monkeypatch.setattr(sgls_server.ray, "get", dead)
    with pytest.raises(EnvError, match="SGLS server unavailable"):
        sgls_server.RemoteSimulator(Server()).simulate("t", [], ToolCall(name="f", arguments={}), {})

    async def dead_call():
        raise ray.exceptions.RayActorError()

    class Actor:
        class execute:
            @staticmethod
            def remote(*args):
                return dead_call()

        class close:
            @staticmethod
            def remote(*args):
                return dead_call()

    session = tool_pool.RemoteEnvSession(Actor(), "s")
    with pytest.raises(EnvError, match="tool actor .* died"):
        asyncio.run(session.execute([]))
    asyncio.run(session.close())  # a dead actor has nothing to free: no error
    lost = tool_pool.ToolBackendActor.__ray_metadata__.modified_class()
    with pytest.raises(EnvError, match="restarted"):
        lost.execute("gone", [])


def test_a_hung_tool_call_times_out_with_an_error_naming_the_actor(ray_cluster):
    """A real actor that never answers: the session's call ends within runtime.tool_call_timeout_s
    as an environment error (the episode ends with ENV_ERROR, its group is rolled out again)."""
    import ray

    from agentrl.rollout.tool_pool import RemoteEnvSession
    from agentrl.tasks.schema import ToolCall

    @ray.remote(num_cpus=0)
    class HungTools:
        def execute(self, session_id, calls):
            import time

            time.sleep(60)

        def close(self, session_id):
            return None

    actor = HungTools.remote()
    session = RemoteEnvSession(actor, "ep-1", timeout_s=0.5)
    with pytest.raises(EnvError, match=r"tool actor .*HungTools\([0-9a-f]+\) did not answer lookup \(session ep-1\) "
                                       r"within runtime.tool_call_timeout_s=0.5s"):
        asyncio.run(session.execute([ToolCall(name="lookup", arguments={})]))
    ray.kill(actor)


def test_shutdown_runs_every_part_and_masks_no_error(tmp_path, capsys):
    from types import SimpleNamespace

    from agentrl.driver.run import _write_results
    from agentrl.driver.trainer import Trainer

    done = []

    def part(name, fails=False):
        def run():
            done.append(name)
            if fails:
                raise RuntimeError(f"{name} broke")
        return run

    trainer = SimpleNamespace(trajectories=SimpleNamespace(close=part("trajectories")), write_trace=part("trace"),
                              _stop_rods=part("rods"), rollout_side=SimpleNamespace(shutdown=part("workers", fails=True)),
                              learner=SimpleNamespace(kill=part("learner")), metrics=SimpleNamespace(close=part("metrics")))
    Trainer.shutdown(trainer, raise_errors=False)  # a run's error is propagating: logged only
    assert done == ["trajectories", "trace", "rods", "workers", "learner", "metrics"]
    assert "shutdown: rollout side failed: RuntimeError: workers broke" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="workers broke"):  # a run that succeeded: raised, after every part ran
        Trainer.shutdown(trainer)
    assert done[6:] == ["trajectories", "trace", "rods", "workers", "learner", "metrics"]

    def no_report(run_dir):
        raise ValueError("no metrics")

    _write_results(tmp_path, {"start": {"success": 0.5}}, no_report, strict=False)
    assert (tmp_path / "evals.json").exists() and "report.png not written" in capsys.readouterr().out
    with pytest.raises(ValueError):
        _write_results(tmp_path, {}, no_report)


def test_rollout_call_owns_one_object_per_group_and_splits_into_parts(ray_cluster):
    """``RolloutCall`` against a real actor with ``RolloutWorker.rollout``'s return layout: one
    object per task (an emptied group is None and gets no ref), only the summaries fetched; a
    part is one task of the call, relaunched alone, and parts merge back in order."""
    import ray

    from agentrl.api import GroupRef
    from agentrl.driver.cluster import RolloutCall

    @ray.remote(num_cpus=0)
    class Worker:
        def rollout(self, tasks, group_size, temperature, top_p, tag, keys, env_retries):
            summaries = [GroupSummary(t, 0, [] if t == "empty" else [1.0], [1.0], {}, 1, 0, 0, 0, 0.0, 0.0, 0.0)
                         for t in tasks]
            return (summaries, *[None if t == "empty" else {"group": t, "tag": tag} for t in tasks])

    worker = Worker.remote()
    call = RolloutCall(worker, 0, "policy", ["a", "empty", "b"], ["k0", "k1", "k2"], 2, 1.0, 1.0, 7).launch()
    summaries, refs = call.fetch(timeout=60)
    assert [s.task_id for s in summaries] == ["a", "empty", "b"]
    assert all(isinstance(r, GroupRef) for r in refs) and [r.task_id for r in refs] == ["a", "b"]
    assert ray.get([r.ref for r in refs]) == [{"group": "a", "tag": 7}, {"group": "b", "tag": 7}]
    part = call.part(2)
    assert (part.tasks, part.keys, part.ref, part.result) == (["b"], ["k2"], None, None)
    merged = RolloutCall.merge([part.launch().fetch(timeout=60), call.part(0).launch().fetch(timeout=60)])
    assert [s.task_id for s in merged[0]] == ["b", "a"] and [r.task_id for r in merged[1]] == ["b", "a"]
    ray.kill(worker)
