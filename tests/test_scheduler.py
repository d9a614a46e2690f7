"""RolloutScheduler (driver/scheduler.py) with a stand-in for Ray: which weights each step's
rollouts run on, and no weight load while a rollout call is running. No cluster needed."""

from __future__ import annotations

import pytest

from agentrl.driver import scheduler as scheduler_mod
from agentrl.driver.scheduler import NO_LOAD_IN_FLIGHT, RolloutScheduler


class Call:
    """A rollout call: finishes when waited for (``ray.get`` / a blocking ``ray.wait``)."""

    def __init__(self, step: int, engine_version: int):
        self.step, self.engine_version, self.done = step, engine_version, False
        self.ref, self.result = self, None  # as cluster.RolloutCall: the pending ref, the fetched result

    def fetch(self, timeout=None):
        return FakeRay.get(self)


class Stored:
    """``ray.put``'s object: a result already there."""

    def __init__(self, value):
        self.value, self.done = value, True


class FakeRay:
    class exceptions:
        class RayActorError(Exception):
            pass

    @staticmethod
    def get(calls):
        if isinstance(calls, Call):
            calls.done = True
            return (calls.step, calls.engine_version)
        for c in calls:
            c.done = True
        return [c.value if isinstance(c, Stored) else (c.step, c.engine_version) for c in calls]

    @staticmethod
    def put(value):
        return Stored(value)

    @staticmethod
    def wait(calls, num_returns=1, timeout=None, fetch_local=True):
        if timeout is None:
            for c in calls:
                c.done = True
        return [c for c in calls if c.done], [c for c in calls if not c.done]


class Engines:
    """The rollout workers' weights and the weight sync (records every load)."""

    def __init__(self):
        self.version = 0
        self.loads: list[int] = []

    def sync(self, version: int) -> None:
        self.loads.append(version)
        self.version = version


@pytest.fixture
def engines(monkeypatch):
    monkeypatch.setattr(scheduler_mod, "ray", FakeRay)
    return Engines()


def make(engines: Engines, async_rollouts: bool, max_lag: int = 1) -> RolloutScheduler:
    return RolloutScheduler(lambda step: [Call(step, engines.version), Call(step, engines.version)], engines,
                            async_rollouts, max_lag=max_lag)


def run_steps(s: RolloutScheduler, n: int, stop_after: int | None = None) -> list[tuple[int, int]]:
    """The driver's use: take, catch_up, (train), prefetch, updated; returns (step, rollout version) per step."""
    seen, version = [], 0
    for step in range(1, n + 1):
        results = s.take(step)
        s.catch_up()
        assert {r[0] for r in results} == {step}
        seen.append((step, results[0][1]))
        version += 1  # the learner trains on the batch
        stop = step == n or (stop_after is not None and step >= stop_after)
        s.prefetch(step + 1, until=step if stop else n)
        s.updated(version)
    return seen


def test_sync_mode_rolls_out_every_step_on_the_newest_weights(engines):
    s = make(engines, async_rollouts=False)
    assert run_steps(s, 3) == [(1, 0), (2, 1), (3, 2)]
    assert engines.loads == [1, 2, 3] and not s.sync_due and not s.in_flight


def test_async_mode_is_one_version_behind_and_the_update_waits_for_the_rollouts(engines):
    s = make(engines, async_rollouts=True)
    assert run_steps(s, 3) == [(1, 0), (2, 0), (3, 1)]  # step k+1 ran on the weights before update k
    assert engines.loads == [1, 2] and s.sync_due  # v3 is held back: nothing rolls out after the last step
    s.sync(discard_in_flight=True)
    assert engines.loads == [1, 2, 3] and not s.sync_due


def test_async_mode_launches_nothing_when_not_allowed_then_rolls_out_on_the_newest(engines):
    s = make(engines, async_rollouts=True)
    # only step 1 launches ahead; steps 3 and 4 find nothing in flight and roll out on the newest weights
    assert run_steps(s, 4, stop_after=2) == [(1, 0), (2, 0), (3, 2), (4, 3)]


def test_sync_waits_for_rollouts_in_flight_and_keeps_them_for_their_step(engines):
    s = make(engines, async_rollouts=True)
    s.take(1)
    s.prefetch(2, until=5)
    s.updated(1)
    assert s.running() and engines.loads == []
    s.sync()  # an evaluation: the step-2 rollouts finish first, then v1 loads
    assert not s.running() and engines.loads == [1]
    assert s.take(2) == [(2, 0), (2, 0)]  # their results, sampled on v0, still belong to step 2


def test_weights_never_load_while_a_rollout_call_runs(engines):
    s = make(engines, async_rollouts=True)
    s.take(1)
    s.prefetch(2, until=5)
    s._due = 1  # even called directly, the load refuses while step 2's calls run
    with pytest.raises(RuntimeError, match=NO_LOAD_IN_FLIGHT):
        s._load_weights(1)
    s.catch_up()  # waits for nothing: step 2's calls still run on v0
    assert engines.loads == [] and s.sync_due
    s.prefetch(3, until=5)  # step 3 on v0 would be trained by v2 at most: 2 versions behind, over the bound
    assert sorted(s.ahead) == [2]


def test_sync_mode_prefetches_nothing(engines):
    s = make(engines, async_rollouts=False)
    s.prefetch(2, until=5)
    assert s.in_flight == []


def test_max_lag_2_launches_two_steps_ahead_and_loads_every_second_step(engines):
    """buffer.max_staleness=2: step 1's update overlaps steps 2 and 3's rollouts (one batch on v0);
    v1 cannot load while step 3's run, so step 3 is two versions behind; then v2 loads, and so on."""
    s = make(engines, async_rollouts=True, max_lag=2)
    seen = run_steps(s, 6)
    assert seen == [(1, 0), (2, 0), (3, 0), (4, 2), (5, 2), (6, 4)]
    assert [(step - 1) - v for step, v in seen] == [0, 1, 2, 1, 2, 1]  # learner version - rollout version
    assert engines.loads == [2, 4, 5] and s.sync_due and not s.ahead  # nothing launched past the last step


def test_max_lag_3_with_a_time_limit(engines):
    s = make(engines, async_rollouts=True, max_lag=3)
    assert run_steps(s, 5, stop_after=2) == [(1, 0), (2, 0), (3, 0), (4, 0), (5, 4)]
    # steps 2-4 were launched at step 1 (before the limit); step 5 found nothing launched: newest weights
    assert engines.loads == [3, 4]  # v3 once step 4 was taken (nothing ahead), v4 before step 5 launched


@pytest.mark.parametrize("async_rollouts", [True, False])
def test_a_checkpoint_keeps_the_rollouts_in_flight_and_the_version_due(engines, async_rollouts):
    """``pending`` after step 2 and ``restore`` in a new scheduler (a resumed run): async mode
    takes step 3's saved rollouts (made on v1) without launching, then loads v2; sync mode has
    nothing in flight, and loads the checkpoint's version at once."""
    s = make(engines, async_rollouts)
    run_steps(s, 2)
    s.prefetch(3, until=5)
    results, due = s.pending()
    assert (results, due) == (({3: [(3, 1), (3, 1)]}, 2) if async_rollouts else ({}, None))
    fresh, launched = Engines(), []
    resumed = RolloutScheduler(lambda step: launched.append(step) or [Call(step, fresh.version)], fresh, async_rollouts)
    resumed.restore(results, due if due is not None else 2)
    assert fresh.loads == ([] if async_rollouts else [2])
    assert resumed.take(3) == (results[3] if async_rollouts else [(3, 2)])
    resumed.catch_up()
    assert fresh.loads == [2] and launched == ([] if async_rollouts else [3])
