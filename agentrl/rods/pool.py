"""The RODS active task pool (docs/design.md §5): seeds plus synthesized variants, moving with the policy.

Plain Python, no Ray: the synthesis actor holds one ``ActivePool`` and calls it from the driver's
RPCs; tests drive it directly. Life of a task:

    seed selected (boundary, not in cooldown)  ->  variants synthesized  ->  ``offer``: gated
    (re-execution, duplicates, held-out text) and queued  ->  ``inject`` at an epoch boundary
    (at most beta of the pool per epoch)  ->  sampled for training, observed every time its group
    is trained on  ->  retired when its group mean leaves the useful range, or when the
    synthesized part is over its cap (lowest phi first).

Rules (RODS paper defaults in ``RodsConfig``):

* a new variant whose *first* group mean r̄ < retire_new_below (0.20) is retired;
* a synthesized task whose r̄ later drifts above retire_above (0.95) or below retire_below (0.20)
  is retired; seeds are kept unless ``keep_seeds`` is false (then the drift rules apply to them);
* synthesized tasks are capped at max_synthesized (P_max; default = number of seeds): after an
  injection, the lowest-φ synthesized tasks are retired until the cap holds (a task not yet
  observed ranks as φ = 1: it came from a boundary seed and has not had its chance yet).

Epochs: every ``epoch_steps`` steps, or (null) each time the sampler starts a new pass over the
pool. Every change is reported to ``log`` as one JSON-able event (the actor appends them to the
run's ``rods_pool.jsonl``), so a run can be audited task by task; ``state_dict`` /
``from_state`` round-trip the whole pool for checkpoints.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from agentrl.rods.boundary import REGIONS, GroupStat, group_stat, select_seeds
from agentrl.rods.synthesizer import accept_variant, mark_synthesized
from agentrl.tasks.schema import Task, text_key

PHI_BINS = 5  # φ histogram bins over [0, 1]


@dataclass
class PoolEntry:
    task: Task
    kind: str  # "seed" | "synth"
    added_step: int
    n_obs: int = 0
    first_mean: float | None = None
    stat: GroupStat | None = None  # latest observation

    def to_dict(self) -> dict:
        return {"task": self.task.model_dump(mode="json"), "kind": self.kind, "added_step": self.added_step,
                "n_obs": self.n_obs, "first_mean": self.first_mean, "stat": asdict(self.stat) if self.stat else None}

    @classmethod
    def from_dict(cls, d: dict) -> "PoolEntry":
        return cls(task=Task.model_validate(d["task"]), kind=d["kind"], added_step=d["added_step"], n_obs=d["n_obs"],
                   first_mean=d["first_mean"], stat=GroupStat(**d["stat"]) if d["stat"] else None)


class ActivePool:
    """Seeds + synthesized tasks; ``cfg`` is a ``RodsConfig`` (or anything with its fields)."""

    def __init__(self, seeds: Sequence[Task], cfg, tasks_per_step: int, forbidden_texts: frozenset[str] = frozenset(),
                 rng_seed: int = 0, log: Callable[[dict], None] | None = None):
        if not seeds:
            raise ValueError("RODS needs at least one seed task (tasks.train is empty)")
        ids = [t.id for t in seeds]
        if len(set(ids)) != len(ids):
            raise ValueError(f"RODS seeds need unique task ids; duplicated: {sorted({i for i in ids if ids.count(i) > 1})[:5]}")
        self.cfg = cfg
        self.tasks_per_step = tasks_per_step
        # Held-out user turns no variant may contain — except turns the seeds themselves contain:
        # those are generic (BFCL's fixed "the functions are back" message in every miss_func task,
        # a builtin follow-up like "The amount is 40.") and training already sees them.
        self.forbidden_texts = frozenset(forbidden_texts) - {t.user for s in seeds for t in s.turns}
        self.log = log or (lambda event: None)
        self.entries: dict[str, PoolEntry] = {t.id: PoolEntry(t, "seed", 0) for t in seeds}
        self.max_synth = cfg.max_synthesized or len(seeds)
        self.pending: list[Task] = []
        self.known_keys: set[tuple[str, ...]] = {text_key(t) for t in seeds}
        self.cooldown: dict[str, int] = {}
        self.recent: list[GroupStat] = []  # observations since the last seed selection
        self.order: list[str] = []  # the rest of the current pass, popped from the end
        self.rng = random.Random(f"agentrl-rods-pool:{rng_seed}")
        self.next_id = 0
        self.epoch = 0
        self.step = 0  # last step observed
        self.last_epoch = {"injected": 0, "retired": 0}  # the most recent closed epoch
        self._retired_at_epoch_start = 0
        self.totals: Counter = Counter()  # injected, retired[:reason], offered, queued, rejected[:reason]

    # ------------------------------------------------------------------ observation and retirement
    def observe(self, step: int, groups: Sequence[tuple[str, Sequence[float]]]) -> list[GroupStat]:
        """Record the group rewards (task id, progress rewards) of one training batch; applies the
        retirement rules. Tasks no longer in the pool (retired meanwhile) are ignored."""
        stats = []
        self.step = max(self.step, step)
        for task_id, rewards in groups:
            entry = self.entries.get(task_id)
            if entry is None:
                continue
            s = group_stat(task_id, entry.task.category, rewards, self.cfg.low, self.cfg.high)
            first = entry.n_obs == 0
            entry.n_obs += 1
            entry.stat = s
            if first:
                entry.first_mean = s.mean
            stats.append(s)
            self.log({"step": step, "event": "stat", "task_id": task_id, "kind": entry.kind, "mean": s.mean,
                      "phi": s.phi, "variance": s.variance, "n": s.n, "region": s.region})
            if entry.kind == "synth" or not self.cfg.keep_seeds:
                if first and entry.kind == "synth" and s.mean < self.cfg.retire_new_below:
                    self._retire(step, task_id, "new_too_hard")
                elif s.mean > self.cfg.retire_above:
                    self._retire(step, task_id, "mastered")
                elif s.mean < self.cfg.retire_below:
                    self._retire(step, task_id, "too_hard")
        self.recent.extend(stats)
        return stats

    def _retire(self, step: int, task_id: str, reason: str) -> None:
        if len(self.entries) <= self.tasks_per_step:  # keep enough tasks to fill a step
            self.log({"step": step, "event": "retire_skipped", "task_id": task_id, "reason": reason,
                      "why": f"the pool is down to {len(self.entries)} tasks (rollout.tasks_per_step)"})
            return
        entry = self.entries.pop(task_id)
        self.totals["retired"] += 1
        self.totals[f"retired:{reason}"] += 1
        self.log({"step": step, "event": "retire", "task_id": task_id, "kind": entry.kind, "reason": reason,
                  "mean": entry.stat.mean if entry.stat else None})

    # ------------------------------------------------------------------ seeds and variants
    def select(self, step: int) -> list[Task]:
        """Seeds for synthesis from the observations since the last call (boundary, not in
        cooldown, top-φ per category up to the quota); puts them in cooldown."""
        live = [s for s in self.recent if s.task_id in self.entries]
        self.recent = []
        chosen = select_seeds(live, self.cooldown, step, self.cfg.quota_per_category, self.cfg.cooldown_steps)
        for s in chosen:
            self.cooldown[s.task_id] = step
            self.log({"step": step, "event": "seed", "task_id": s.task_id, "mean": s.mean, "phi": s.phi})
        return [self.entries[s.task_id].task for s in chosen]

    def offer(self, step: int, parent: Task, candidates: Sequence[Task], synthesizer: str,
              replayed: Sequence[bool] | None = None) -> int:
        """Gate ``candidates`` (variants of ``parent``) and queue the accepted ones for injection;
        returns how many were queued. ``replayed``: per candidate, ``reexecutes`` already computed
        (None = replay here). Beyond max_backlog queued tasks, offers are dropped (the synthesis
        actor pauses before that happens)."""
        queued = 0
        for k, cand in enumerate(candidates):
            self.totals["offered"] += 1
            reason = accept_variant(cand, self.known_keys, self.forbidden_texts, replayed[k] if replayed else None)
            if reason is None and len(self.pending) >= self.cfg.max_backlog:
                reason = "backlog_full"
            if reason is not None:
                self.totals["rejected"] += 1
                self.totals[f"rejected:{reason}"] += 1
                self.log({"step": step, "event": "reject", "parent_id": parent.id, "reason": reason})
                continue
            task = mark_synthesized(cand, f"rods-{self.next_id:06d}", parent, step, synthesizer)
            self.next_id += 1
            self.known_keys.add(text_key(task))
            self.pending.append(task)
            self.totals["queued"] += 1
            queued += 1
            self.log({"step": step, "event": "queue", "task_id": task.id, "parent_id": parent.id,
                      "synthesizer": synthesizer, "task": task.model_dump(mode="json")})
        return queued

    def inject(self, step: int) -> list[str]:
        """Epoch boundary: move up to max(1, floor(beta * |pool|)) queued variants into the pool
        (oldest first), then enforce the cap on synthesized tasks. Returns the injected ids."""
        self.epoch += 1
        # what the epoch that just closed did: retired during it, injected at its end (below)
        self.last_epoch = {"retired": self.totals["retired"] - self._retired_at_epoch_start}
        budget = max(1, math.floor(self.cfg.inject_fraction * len(self.entries)))
        batch, self.pending = self.pending[:budget], self.pending[budget:]
        for task in batch:
            self.entries[task.id] = PoolEntry(task, "synth", step)
            self.totals["injected"] += 1
            self.log({"step": step, "event": "inject", "task_id": task.id, "epoch": self.epoch})
        synth = [e for e in self.entries.values() if e.kind == "synth"]
        retired_before_cap = self.totals["retired"]
        over = len(synth) - self.max_synth
        if over > 0:
            ranked = sorted(synth, key=lambda e: (e.stat.phi if e.stat else 1.0, e.added_step, e.task.id))
            for e in ranked[:over]:
                self._retire(step, e.task.id, "over_cap")
        self.last_epoch["injected"] = len(batch)
        self.last_epoch["retired"] += self.totals["retired"] - retired_before_cap
        self._retired_at_epoch_start = self.totals["retired"]
        return [t.id for t in batch if t.id in self.entries]

    # ------------------------------------------------------------------ sampling
    def sample(self, step: int, n: int) -> list[Task]:
        """``n`` training tasks: shuffled passes over the pool. An epoch boundary (injection)
        comes every epoch_steps steps, or at the start of each pass when epoch_steps is null."""
        every = self.cfg.epoch_steps
        if every and step > 1 and (step - 1) % every == 0:
            new = self.inject(step)
            self.order = self.order + new
            self.rng.shuffle(self.order)
        out: list[Task] = []
        while len(out) < n:
            if not self.order:
                if not every and step > 1:
                    self.inject(step)
                if not self.entries:
                    raise RuntimeError("the RODS pool is empty (every task was retired)")
                self.order = sorted(self.entries)
                self.rng.shuffle(self.order)
            task_id = self.order.pop()
            if task_id in self.entries:  # skip tasks retired during this pass
                out.append(self.entries[task_id].task)
        return out

    # ------------------------------------------------------------------ telemetry and checkpoints
    def metrics(self) -> dict[str, float]:
        entries = list(self.entries.values())
        n_synth = sum(e.kind == "synth" for e in entries)
        observed = [e.stat for e in entries if e.stat is not None]
        m = {"pool/size": float(len(entries)), "pool/seeds": float(len(entries) - n_synth),
             "pool/synthesized": float(n_synth), "pool/pending": float(len(self.pending)),
             "pool/epoch": float(self.epoch), "pool/observed": float(len(observed)),
             # per epoch: injected at the last epoch boundary, retired during that epoch (+ over the cap)
             "pool/epoch_injected": float(self.last_epoch["injected"]),
             "pool/epoch_retired": float(self.last_epoch["retired"])}
        for r in REGIONS:
            m[f"pool/region_{r}"] = sum(s.region == r for s in observed) / max(1, len(observed))
        for b in range(PHI_BINS):  # fraction of observed tasks with φ in [b/5, (b+1)/5) (last bin closed)
            m[f"pool/phi_hist_{b}"] = sum(min(int(s.phi * PHI_BINS), PHI_BINS - 1) == b for s in observed) / max(1, len(observed))
        for key, value in self.totals.items():
            m[f"pool/total_{key.replace(':', '_')}"] = float(value)
        return m

    def state_dict(self) -> dict:
        return {"entries": [e.to_dict() for e in self.entries.values()],
                "pending": [t.model_dump(mode="json") for t in self.pending],
                "known_keys": sorted(list(k) for k in self.known_keys), "cooldown": dict(self.cooldown),
                "recent": [asdict(s) for s in self.recent], "order": list(self.order),
                "rng": _jsonable(self.rng.getstate()), "next_id": self.next_id, "epoch": self.epoch, "step": self.step,
                "last_epoch": dict(self.last_epoch), "retired_at_epoch_start": self._retired_at_epoch_start,
                "max_synth": self.max_synth, "totals": dict(self.totals)}

    @classmethod
    def from_state(cls, state: dict, cfg, tasks_per_step: int, forbidden_texts: frozenset[str] = frozenset(),
                   log: Callable[[dict], None] | None = None, resume: bool = False) -> "ActivePool":
        """The pool ``state_dict`` describes. ``resume``: for a new run continuing from it (steps
        restart at 1), so cooldowns are moved to the new step count."""
        entries = [PoolEntry.from_dict(d) for d in state["entries"]]
        seeds = [e.task for e in entries if e.kind == "seed"] or [entries[0].task]
        pool = cls(seeds, cfg, tasks_per_step, forbidden_texts, log=log)
        pool.entries = {e.task.id: e for e in entries}
        pool.pending = [Task.model_validate(t) for t in state["pending"]]
        pool.known_keys = {tuple(k) for k in state["known_keys"]}
        pool.cooldown = dict(state["cooldown"])
        pool.step = state.get("step", 0)
        if resume:  # a resumed run counts steps from 1 again: keep cooldowns and ages relative
            pool.cooldown = {k: v - pool.step for k, v in pool.cooldown.items()}
            for e in pool.entries.values():
                e.added_step -= pool.step
            pool.step = 0
        pool.recent = [GroupStat(**s) for s in state["recent"]]
        pool.order = list(state["order"])
        pool.rng.setstate(_tupled(state["rng"]))
        pool.next_id, pool.epoch = state["next_id"], state["epoch"]
        pool.last_epoch = dict(state.get("last_epoch", pool.last_epoch))
        pool._retired_at_epoch_start = state.get("retired_at_epoch_start", 0)
        # the cap: this run's rods.max_synthesized when set, else the one the pool was built with
        pool.max_synth = cfg.max_synthesized or state["max_synth"]
        pool.totals = Counter(state["totals"])
        return pool


def _jsonable(x):
    return [_jsonable(v) for v in x] if isinstance(x, tuple) else x


def _tupled(x):
    return tuple(_tupled(v) for v in x) if isinstance(x, list) else x
