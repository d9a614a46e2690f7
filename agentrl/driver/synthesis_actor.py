"""SynthesisActor: the RODS active pool and its synthesizer, as one Ray actor (docs/design.md §5).

The driver talks to it three times a step, all cheap: ``sample`` (training tasks from the pool),
``observe`` (the group rewards of the batch just rolled out; fire-and-forget) and ``report``
(metrics plus the pool events since the last report, which the driver appends to the run's
``rods_pool.jsonl``). RPCs run one at a time, in submission order, so an observation always
lands before the next sample.

Synthesis runs on a background thread of the actor: seeds chosen by ``observe`` go to a queue,
the thread makes variants and offers them to the pool under a lock. Training never waits for
it — a slow LLM only makes the backlog grow (``synth/seed_backlog``); queued seeds beyond four
selections' worth (4 × quota × categories) are dropped oldest-first and counted. Synthesis
pauses while ``rods.max_backlog`` variants wait for injection. A synthesizer that raises (an
unreachable endpoint, a bug on an odd seed) costs that seed only: the error is counted and
logged, the thread carries on.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Sequence

import ray

from agentrl.common.plugins import load_plugins
from agentrl.rods.llm_synth import LLMSynthesizer
from agentrl.rods.pool import ActivePool
from agentrl.rods.resample import ResampleSynthesizer
from agentrl.rods.synthesizer import reexecutes
from agentrl.tasks.schema import Task


def build_synthesizer(rods_cfg, dtype: str = "float32"):
    """The configured synthesizer and a close() for whatever LLM it owns."""
    if rods_cfg.synthesizer == "resample":

        return ResampleSynthesizer(), lambda: None

    # The planner and rewriter sample at llm.temperature; the judge decodes greedily.
    llm_cfg = rods_cfg.llm
    if llm_cfg.endpoint is not None:
        from agentrl.llm.adapters import OpenAILLM
        from agentrl.llm.client import LLMEndpoint

        endpoint = LLMEndpoint.from_config(llm_cfg.endpoint)
        llm = OpenAILLM(endpoint, llm_cfg.temperature, llm_cfg.max_tokens)
        judge = OpenAILLM(endpoint, 0.0, llm_cfg.max_tokens)

        def close_endpoint():
            llm.close()
            judge.close()

        return LLMSynthesizer(llm, llm_cfg, judge_llm=judge), close_endpoint
    from agentrl.llm.adapters import BackgroundLoop, EngineLLM
    from agentrl.rollout.sgls_server import start_engine, stop_engine

    loop = BackgroundLoop("rods-engine")
    engine = start_engine(loop, llm_cfg.model_path, llm_cfg.engine, dtype, rods_cfg.seed)
    llm = EngineLLM(engine, loop, llm_cfg.temperature, llm_cfg.max_tokens)
    judge = EngineLLM(engine, loop, 0.0, llm_cfg.max_tokens)

    def close_engine():
        stop_engine(loop, engine)
        loop.close()

    return LLMSynthesizer(llm, llm_cfg, judge_llm=judge), close_engine


def restore_queue(state: dict, renumber: bool = False) -> list[tuple[int, Task]]:
    """The seeds ``SynthesisActor.state_dict`` saved as waiting, as (step, task). ``renumber``: for
    a new run continuing the pool (``rods.resume_from``), steps relative to its restart, as
    ``ActivePool.from_state`` moves cooldowns."""
    shift = state.get("step", 0) if renumber else 0
    return [(d["step"] - shift, Task.model_validate(d["task"])) for d in state.get("synthesis_queue", [])]


@ray.remote
class SynthesisActor:
    def __init__(self, seeds: list, rods_cfg, tasks_per_step: int, forbidden_texts: frozenset[str], run_seed: int = 0,
                 dtype: str = "float32", state: dict | None = None, resume: bool = False, plugins: Sequence[str] = ()):
        load_plugins(plugins)  # the run's (Config.plugins): synthesis replays seed tasks on their backends
        self.cfg = rods_cfg
        self.lock = threading.Lock()
        self.events: list[dict] = []
        self.tasks_per_step, self.forbidden_texts = tasks_per_step, forbidden_texts  # a restored pool needs them
        # a saved pool replaces it (below, or load_state_dict: a resumed run, which may have no seeds)
        self.pool = ActivePool(seeds, rods_cfg, tasks_per_step, forbidden_texts, rng_seed=run_seed,
                               log=self.events.append) if seeds and state is None else None
        self.synth, self._close_llm = build_synthesizer(rods_cfg, dtype)
        self.base_seed = run_seed * 1_000_003 + rods_cfg.seed
        self.jobs = 0  # jobs started; with base_seed it seeds each job
        # (step, seed task) waiting for synthesis; a checkpoint keeps them (and the job that was running)
        self.queue: deque = deque()
        # Seeds waiting for synthesis: four selections' worth; older ones are stale by then.
        self.max_queue = 4 * rods_cfg.quota_per_category * len({t.category for t in seeds})
        self.busy = False
        self.running: tuple | None = None  # (step, seed) of the job in progress
        # jobs, attempts, candidates, queued, dropped_seeds, errors, failures:*
        self.counts: Counter = Counter()
        self.busy_seconds = 0.0
        if state is not None:  # rods.resume_from: a new run from a saved pool
            self._load(state, resume)
        self.wake = threading.Condition(self.lock)
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="rods-synthesis", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ driver RPCs
    def sample(self, step: int, n: int) -> list:
        with self.lock:
            tasks = self.pool.sample(step, n)
            self.wake.notify_all()  # an injection may have made room in the backlog
            return tasks

    def observe(self, step: int, groups: list[tuple[str, list[float]]]) -> None:
        with self.lock:
            self.pool.observe(step, groups)
            if step % self.cfg.select_every == 0:
                for task in self.pool.select(step):
                    self.queue.append((step, task))
                while len(self.queue) > self.max_queue:
                    _, dropped = self.queue.popleft()
                    self.counts["dropped_seeds"] += 1
                    self.events.append({"step": step, "event": "drop_seed", "task_id": dropped.id})
                self.wake.notify_all()

    def report(self) -> tuple[dict[str, float], list[dict]]:
        """Metrics now, and the pool events since the last report (the caller persists them)."""
        with self.lock:
            m = self.pool.metrics()
            c = self.counts
            m.update({
                "synth/jobs": float(c["jobs"]), "synth/attempts": float(c["attempts"]),
                "synth/candidates": float(c["candidates"]), "synth/queued": float(c["queued"]),
                # queued / generation attempts (for resample: shaped draws; for llm: plans tried)
                "synth/acceptance_rate": c["queued"] / max(1, c["attempts"]),
                # queued / candidates the synthesizer returned (the pool's gates: re-execution, duplicates)
                "synth/gate_pass_rate": c["queued"] / max(1, c["candidates"]),
                "synth/seed_backlog": float(len(self.queue) + self.busy),
                "synth/dropped_seeds": float(c["dropped_seeds"]), "synth/errors": float(c["errors"]),
                "synth/busy_seconds": self.busy_seconds,
                "synth/variants_per_busy_s": c["queued"] / max(self.busy_seconds, 1e-9),
            })
            for key, value in c.items():
                if key.startswith("failures:"):
                    m[f"synth/fail_{key.split(':', 1)[1]}"] = float(value)
            events, self.events[:] = list(self.events), []
            return m, events

    def state_dict(self) -> dict:
        """The pool, plus the synthesis side: the job counter (with ``base_seed`` it seeds each
        job), the seeds waiting for synthesis and the counters. A job still running is saved as
        waiting, first in line, with its index: a resumed actor redoes it with the same seed."""
        with self.lock:
            waiting = ([self.running] if self.running else []) + list(self.queue)
            return {**self.pool.state_dict(), "synthesis_jobs": self.jobs - (self.running is not None),
                    "synthesis_queue": [{"step": step, "task": task.model_dump(mode="json")} for step, task in waiting],
                    "synthesis_counts": dict(self.counts), "synthesis_busy_seconds": self.busy_seconds}

    def load_state_dict(self, state: dict) -> None:
        """Back to ``state_dict``'s state (a resumed run, its steps kept), before any work starts."""
        with self.lock:
            if self.running or self.queue or self.jobs:
                raise RuntimeError("SynthesisActor.load_state_dict: the actor has started synthesis work; "
                                   "restore a checkpoint into a fresh actor")
            self._load(state, renumber=False)

    def _load(self, state: dict, renumber: bool) -> None:
        """The pool and the synthesis side from a saved state; ``renumber``: a new run's steps
        start from 1 (``ActivePool.from_state`` moves cooldowns)."""
        self.pool = ActivePool.from_state(state, self.cfg, self.tasks_per_step, self.forbidden_texts,
                                          log=self.events.append, resume=renumber)
        self.events.append({"step": self.pool.step, "event": "restore", "pool": len(self.pool.entries), "resume": renumber})
        self.jobs = state.get("synthesis_jobs", 0)
        self.queue = deque(restore_queue(state, renumber=renumber))
        self.counts = Counter(state.get("synthesis_counts", {}))
        self.busy_seconds = float(state.get("synthesis_busy_seconds", 0.0))

    def wait_idle(self, timeout_s: float = 600.0) -> bool:
        """Block until the seed queue is empty and no job runs (tests, and a final drain)."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while (self.queue or self.busy) and time.monotonic() < deadline:
                self.wake.wait(timeout=0.2)
            return not (self.queue or self.busy)

    def shutdown(self) -> None:
        with self.lock:
            self.stopping = True
            self.wake.notify_all()
        self.thread.join(timeout=30)
        self._close_llm()

    # ------------------------------------------------------------------ synthesis thread
    def _next_job(self):
        """Under the lock: wait for a seed (and for room in the backlog); None when stopping."""
        while not self.stopping and (not self.queue or len(self.pool.pending) >= self.cfg.max_backlog):
            self.wake.wait(timeout=1.0)
        if self.stopping:
            return None
        step, seed = self.queue.popleft()
        self.busy = True
        self.running = (step, seed)
        self.jobs += 1
        return step, seed, self.jobs - 1

    def _run(self) -> None:
        while True:
            with self.lock:
                job = self._next_job()
            if job is None:
                return
            step, seed, index = job
            t0 = time.perf_counter()
            try:
                # synthesis and the re-execution gate run outside the lock: the driver's RPCs
                # (sample, observe, report) never wait for them
                result = self.synth.synthesize(seed, self.cfg.variants_per_seed, self.base_seed + index)
                # Synthesizers replay their own candidates too; the pool re-checks every one on a
                # fresh backend anyway, because its guarantee must not depend on the synthesizer
                # (a replay costs milliseconds, off the driver's path).
                replayed = [reexecutes(t) for t in result.tasks]
                with self.lock:
                    self._record(step, seed, result, replayed)
            except Exception as exc:  # noqa: BLE001 - a synthesizer bug costs this seed, not synthesis
                with self.lock:
                    self.counts["errors"] += 1
                    self.events.append({"step": step, "event": "synth_error", "parent_id": seed.id,
                                        "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=5)})
            finally:
                with self.lock:
                    self.busy_seconds += time.perf_counter() - t0
                    self.counts["jobs"] += 1
                    self.busy = False
                    self.running = None
                    self.wake.notify_all()

    def _record(self, step: int, seed, result, replayed: list[bool]) -> None:
        self.counts["attempts"] += result.attempts
        self.counts["candidates"] += len(result.tasks)
        for reason, n in result.failures.items():
            self.counts[f"failures:{reason}"] += n
        self.counts["queued"] += self.pool.offer(step, seed, result.tasks, self.synth.name, replayed)
        self.events.append({"step": step, "event": "synthesized", "parent_id": seed.id, "attempts": result.attempts,
                            "candidates": len(result.tasks), "failures": dict(result.failures)})
