"""RolloutScheduler: which weights each step's rollouts run on, and when new weights may load.

The rule it enforces: **never load weights while an episode is in flight.** An episode whose
tokens came from two policies belongs to neither; its logprobs would match no learner version.
So ``sync`` first waits for every rollout call in flight, and the load itself
(``_load_weights``) raises if any call is still running; no caller can get around it.

Two modes (``train.async_rollouts``):

* off (default): ``take(k)`` launches step k's rollouts on the newest weights and waits for
  them; after the update, ``updated(v)`` loads version v at once. Every batch is on-policy.
* on: while the learner trains on step k, ``prefetch(k + 1, until)`` launches step k+1's rollouts
  on the engines' current weights. ``updated(v)`` only records that v is due; it is loaded by the
  ``catch_up`` after a ``take``, and only when no rollout is in flight. The truncated importance
  weights (``algo.tis_cap``) correct for the lag.

  How far behind the learner a batch may be is ``max_lag`` (``buffer.max_staleness``): the batch
  of step j is trained by learner version j - 1 at most, so it may be launched on engine version
  e only if (j - 1) - e <= max_lag. With 1 (the default) every batch after the first is exactly
  one version behind and weights load every step. With N > 1, ``prefetch`` launches up to N steps
  ahead on the same weights (one larger generation batch) and weights load once the engines are
  idle: lags cycle 1, 2, ..., N and the engines load every N steps. ``prefetch`` launches nothing
  past ``until`` (the last step, or the current one past ``train.max_minutes``).

Before an evaluation or the end of a run, ``sync`` brings the engines to the learner's latest
weights; rollouts in flight are waited for first, and kept for their step unless
``discard_in_flight`` (no step will use them).

**A worker that dies** (``RayActorError``) loses the groups of its call, and only those: each
pending call remembers the tasks it was given (``cluster.RolloutCall``). When fetching a call
finds its worker dead, ``recover`` (given by the driver) waits for Ray to restart the actor
(``runtime.max_actor_restarts``), rebuilds its engine, and the scheduler loads the weights the
engines should have into it, before the call's tasks are re-issued to it (``collect``). Every
other call's groups are kept as delivered, so each task of a step is trained once. A worker
out of restarts raises its ``RayActorError`` and ends the run.

After a death, the call's tasks are re-issued **one at a time** (each alone on the worker): a
task whose worker dies again while it runs alone has killed it twice and is **quarantined** (left
out of this step and of every later one, printed and counted in ``recovery/quarantined_tasks``)
instead of being retried until Ray's restart budget is gone. A task only present in a call that
died is never blamed. A call that does not return within
``runtime.rollout_timeout_s`` is an error naming the worker (a hung engine or tool; the run
stops, resumable from its last checkpoint).

A checkpoint keeps what ``pending`` returns (the in-flight rollouts' results by step, the version
due) and a resumed run hands it back to ``restore``, so async mode resumes exactly where it
stopped; the resumed engines hold unknown weights until their first load, so nothing launches on
them before it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict

import ray

from agentrl.api import POLICY, EngineNotStarted, GroupSummary
from agentrl.checkpointing.preemption import ResumableFailure
from agentrl.checkpointing.records import pack_groups, unpack_groups
from agentrl.common.log import get_logger

log = get_logger(__name__)

NO_LOAD_IN_FLIGHT = "never load weights while an episode is in flight"


class RolloutTimeout(ResumableFailure):
    """A rollout call did not return within ``runtime.rollout_timeout_s``."""


def collect(calls: list, fetch: Callable, recover: Callable, dead: tuple[type[BaseException], ...]) -> list:
    """Every call's result, in order. A call whose ``fetch(call)`` raises one of ``dead`` (its worker
    died) is replaced by ``recover(call, error)`` (the same tasks, re-issued) and fetched again; the
    other calls' results are kept. ``calls`` is updated in place, so a caller sees the re-issued calls.
    Each call's ``result`` is kept on it: a call fetched once is never fetched (or re-issued) again."""
    out = []
    for i in range(len(calls)):
        while calls[i].result is None:
            try:
                calls[i].result = fetch(calls[i])
            except dead as err:
                calls[i] = recover(calls[i], err)
        out.append(calls[i].result)
    return out


def task_key(task) -> str:
    """The id a task is blamed and quarantined by."""
    return getattr(task, "id", task)


def _actor_id(handle) -> str:
    try:
        return handle._actor_id.hex()[:12]
    except AttributeError:
        return str(handle)


class Finished:
    """A rollout call restored from a checkpoint: its result is there, nothing to wait for."""

    ref = None

    def __init__(self, result):
        self.result = result


class RolloutScheduler:
    """Owns the rollout calls in flight and the learner version the engines still have to load.

    ``launch(step)``: start step ``step``'s rollouts, returning the pending calls
    (``cluster.RolloutCall``: ``ref``, ``result``, ``tasks``, ``worker``, ``role``).
    ``weight_sync``: an object with ``sync(version)`` and ``load_into(worker, role, version)``
    (``weight_sync/``). ``revive(worker)``: wait until a dead worker is restarted and rebuild its
    engine; ``reissue(call)``: the call's tasks launched again on its worker (both
    ``cluster.RolloutSide``; without them a dead worker's error ends the run). ``max_lag``: the
    staleness bound of async mode (``buffer.max_staleness``).
    """

    def __init__(self, launch: Callable[[int], list], weight_sync, async_rollouts: bool,
                 revive: Callable | None = None, reissue: Callable | None = None, max_lag: int = 1,
                 revive_restarted: Callable[[], int] | None = None, timeout_s: float | None = None):
        self._launch = launch
        self._weight_sync = weight_sync
        self.async_rollouts = async_rollouts
        self.max_lag = max_lag
        self._revive, self._reissue = revive, reissue
        self._revive_restarted = revive_restarted  # workers restarted while idle (cluster.RolloutSide)
        self.timeout_s = timeout_s  # runtime.rollout_timeout_s
        self.quarantined: set[str] = set()  # task ids never launched again (kept in checkpoints)
        self.ahead: dict[int, list] = {}  # step -> its rollout calls, launched and not yet taken
        self._due: int | None = None  # a learner version the engines have not loaded yet
        self.version: int | None = 0  # the version the engines hold (None: unknown, load before launching)
        self.recoveries: Counter = Counter()  # worker_restarts, reissued_groups, quarantined_tasks

    @property
    def in_flight(self) -> list:
        """Every rollout call launched and not yet taken by its step."""
        return [c for calls in self.ahead.values() for c in calls]

    @property
    def sync_due(self) -> bool:
        """The engines are behind the learner (async mode between an update and its load)."""
        return self._due is not None

    def take(self, step: int) -> list:
        """Step ``step``'s rollout results: the calls launched ahead for it (async mode) or, when
        none were, calls launched now on the newest weights."""
        if step not in self.ahead:
            self.sync()
            self.ahead[step] = self._launch(step)
        return self._collect(self.ahead.pop(step))

    def catch_up(self) -> None:
        """Async mode, after a ``take``: load the version due unless rollouts launched ahead are
        still running on the current weights (with ``max_lag`` 1 none are: it loads every step)."""
        if self._due is not None and not self.ahead:
            self._load_weights(self._due)
            self._due = None

    def prefetch(self, step: int, until: int) -> None:
        """Async mode: launch the rollouts of steps ``step``, ``step + 1``, ... (at most ``until``)
        now, on the engines' current weights, as far as the staleness bound allows; they run while
        the learner trains. Nothing in sync mode."""
        if not self.async_rollouts:
            return
        for j in range(step, min(until, step + self.max_lag - 1) + 1):
            if self.version is None or (j - 1) - self.version > self.max_lag:
                break  # trained by learner version j - 1 at most: too far behind it
            if j not in self.ahead:
                self.ahead[j] = self._launch(j)

    def updated(self, version: int) -> None:
        """The learner has produced ``version``. Sync mode loads it now; async mode holds it back
        while rollouts on the previous weights run (``catch_up``)."""
        self._due = version
        if not self.async_rollouts:
            self.sync()

    def sync(self, discard_in_flight: bool = False) -> None:
        """Bring the engines to the learner's latest weights, after every in-flight rollout is done.

        The waited-for results stay for their steps, unless ``discard_in_flight``."""
        for calls in self.ahead.values():
            # a dead worker is revived here too: the load below needs its engine
            self._collect(calls, reissue=not discard_in_flight)
        if discard_in_flight:
            self.ahead = {}
        if self._due is not None:
            self._load_weights(self._due)
            self._due = None

    # ---- checkpoints (checkpointing/checkpoint.py)
    def state_dict(self) -> dict:
        """What a checkpoint keeps of the scheduler: the version the engines must hold after a
        resume, the quarantined tasks, and (async mode) the rollouts launched ahead, waited for,
        with their summaries and groups (payloads fetched: their refs die with the run)."""
        results, due = self.pending()
        return {"due": due if due is not None else self.version, "quarantined": sorted(self.quarantined),
                "ahead": [{"step": step, "calls": [{"summaries": [asdict(s) for s in sums], "groups": pack_groups(refs)}
                                                   for sums, refs in calls]} for step, calls in results.items()]}

    def load_state_dict(self, state: dict) -> None:
        """Back to ``state_dict``'s state (the groups put into the object store again), then
        ``restore``: sync mode loads the saved version into the engines at once."""
        results = {ahead["step"]: [([GroupSummary(**s) for s in call["summaries"]], unpack_groups(call["groups"]))
                                   for call in ahead["calls"]] for ahead in state["ahead"]}
        self.quarantined = set(state["quarantined"])
        self.restore(results, state["due"])

    def pending(self) -> tuple[dict[int, list], int | None]:
        """({step: results of its rollout calls}, waited for but left for their steps; the version
        due to load, or None): what a checkpoint must keep of the scheduler. Only async mode has
        either: rollouts launched ahead on the weights before the latest update(s), and that update."""
        return {step: self._collect(calls) for step, calls in self.ahead.items()}, self._due

    def restore(self, results: dict[int, list], due: int | None) -> None:
        """Back to ``pending``'s state; each step's ``results`` (one per rollout call) are taken by
        its ``take`` as if their calls had just finished. The engines' weights are unknown until
        ``due`` loads: sync mode loads it at once, async mode before anything is launched."""
        self.ahead = {step: [Finished(r) for r in rs] for step, rs in results.items()}
        self._due = due
        self.version = None
        if not self.async_rollouts and due is not None:
            self.sync()

    def running(self) -> list:
        """The in-flight rollout calls that have not finished."""
        # fetch_local=False: a call counts as done when it has finished, wherever its result is
        refs = [c.ref for c in self.in_flight if c.result is None]
        if not refs:
            return []
        _, not_ready = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        return not_ready

    def pop_recoveries(self) -> dict[str, float]:
        """``recovery/worker_restarts``, ``recovery/reissued_groups`` and
        ``recovery/quarantined_tasks`` since the last call."""
        out = {f"recovery/{k}": float(self.recoveries[k]) for k in ("worker_restarts", "reissued_groups", "quarantined_tasks")}
        self.recoveries.clear()
        return out

    def _fetch(self, call):
        """A call's result, or a ``RolloutTimeout`` that names its worker."""
        try:
            return call.fetch(self.timeout_s)
        except ray.exceptions.GetTimeoutError as err:
            raise RolloutTimeout(f"rollout worker {call.worker_index} ({call.role}, actor {_actor_id(call.worker)}) did "
                                 f"not return its {len(call.tasks)} group(s) within runtime.rollout_timeout_s="
                                 f"{self.timeout_s:g}s (a hung engine or in-process tool call)") from err

    def _collect(self, calls: list, reissue: bool = True) -> list:
        """The calls' results; a dead worker's call is recovered (``_recover``)."""
        dead = (ray.exceptions.RayActorError, EngineNotStarted)
        if self._revive is None:  # nothing can be revived (runtime.weight_sync=nccl): the run stops resumably
            return collect(calls, self._fetch, _unrecoverable, dead)
        return collect(calls, self._fetch, lambda c, err: self._recover(c, err, reissue), dead)

    def _restart(self, call) -> None:
        """A dead worker back: restarted by Ray, its engine rebuilt, the weights the engines should have loaded."""
        log.warning(f"recovery: rollout worker {call.worker_index} died with {len(call.tasks)} group(s) undelivered; "
                    f"waiting for its restart")
        seconds = self._revive(call.worker)  # a worker already revived (another of its calls) is left as it is
        version = self._due if self._due is not None else self.version  # the learner's weights
        self._weight_sync.load_into(call.worker, call.role, version)
        self.recoveries["worker_restarts"] += 1
        log.info(f"recovery: rollout worker {call.worker_index} back ({seconds:.0f}s, weights v{version})")

    def _recover(self, call, err: BaseException, reissue: bool = True):
        """A dead worker restarted (``_restart``); then its call's tasks re-issued one at a time
        (``_alone``); or, ``reissue=False``, the call marked done empty. A worker that was restarted
        while idle (``EngineNotStarted``: nothing of this call ran) gets the call back whole."""
        self._restart(call)
        if not reissue:
            call.result = call.merge([])
            return call
        self.recoveries["reissued_groups"] += len(call.tasks)
        if isinstance(err, EngineNotStarted):
            return self._reissue(call)
        return Finished(call.merge([self._alone(call.part(i)) for i in range(len(call.tasks))]))

    def _alone(self, part):
        """A one-task call run by itself. The task was in a call whose worker died; if its worker dies
        again while it runs alone, it has killed it twice: it is quarantined and returns nothing."""
        key = task_key(part.tasks[0])
        while key not in self.quarantined:
            try:
                return self._fetch(self._reissue(part))
            except EngineNotStarted:
                self._restart(part)  # restarted while idle before this call ran: not the task's doing
            except ray.exceptions.RayActorError:
                self._restart(part)
                self.quarantined.add(key)
                self.recoveries["quarantined_tasks"] += 1
                log.warning(f"recovery: task {key} quarantined: its rollout worker died with it in a call, then again with it "
                            "alone; it is not rolled out again in this run")
        return part.merge([])

    def _load_weights(self, version: int) -> None:
        running = self.running()
        if running:
            raise RuntimeError(f"{NO_LOAD_IN_FLIGHT}: {len(running)} rollout call(s) still running")
        try:
            self._weight_sync.sync(version)
        except (ray.exceptions.RayActorError, EngineNotStarted) as err:
            # a worker died between calls (no call of its was pending): Ray restarted it without an
            # engine. Rebuild it, then load into every worker again.
            revived = self._revive_restarted() if self._revive_restarted is not None else []
            if not revived:  # every rollout worker is there: the learner itself is lost
                raise ResumableFailure(f"the weight load of v{version} failed ({type(err).__name__}: {err}) with every "
                                       "rollout worker alive: the learner is lost") from err
            self.recoveries["worker_restarts"] += len(revived)
            try:
                self._weight_sync.sync(version)
                for worker, role in revived:
                    if role != POLICY:  # a method's role: its weights travel only when they change; give them now
                        self._weight_sync.load_into(worker, role, version)
            except (ray.exceptions.RayActorError, EngineNotStarted) as again:
                # died again while its engine was rebuilt (seen: Ray's memory monitor killing it twice
                # while the learner held its peak): what killed it is still there, so stop resumably
                raise ResumableFailure(f"the weight load of v{version} failed again after {len(revived)} rollout "
                                       f"worker(s) were rebuilt ({type(again).__name__}: {again}): a worker keeps "
                                       "dying (out of memory? `ray logs raylet.out` says)") from again
        self.version = version


def _unrecoverable(call, err: BaseException):
    raise ResumableFailure(f"rollout worker {call.worker_index} died ({type(err).__name__}) and cannot be re-admitted "
                           "here (runtime.weight_sync=nccl: a restarted engine cannot rejoin the NCCL group)") from err
