"""Where a run's tasks come from: the task sets it loads before starting, and each step's draw.

``load_task_sources`` reads ``tasks.heldout`` and ``tasks.train`` once, before the run folder and
Ray exist (a bad file is a located error, not a traceback mid-start); ``TaskSampler`` draws each
step's tasks (shuffled passes over the train set, or fresh generated ones) and checkpoints its
draws; with RODS the synthesis actor (``start_synthesis_actor``) draws them from its pool instead.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from agentrl.config import Config, InputError
from agentrl.envs.sources import generate_fresh_tasks


class TaskSampler:
    """Training tasks per step: shuffled passes over the train set, or fresh generated tasks."""

    def __init__(self, cfg: Config, train_tasks: list, heldout_keys: set[tuple[str, ...]]):
        self.cfg = cfg
        self.rng = random.Random(cfg.run.seed)
        self.heldout_keys = heldout_keys  # held-out tasks as their tuples of user turns
        self.tasks = [] if cfg.tasks.fresh_train else list(train_tasks)
        self.order: list = []
        self.fresh_seed = 1_000_000 + cfg.run.seed * 10_000

    def next(self, n: int) -> list:
        if self.cfg.tasks.fresh_train:
            self.fresh_seed += 1
            return generate_fresh_tasks(self.cfg.tasks.fresh_suite, n, self.fresh_seed, f"fresh{self.fresh_seed}",
                                        self.heldout_keys)
        out = []
        while len(out) < n:
            if not self.order:
                self.order = list(self.tasks)
                self.rng.shuffle(self.order)
            out.append(self.order.pop())
        return out

    def state_dict(self) -> dict:
        """Everything ``next`` depends on: the RNG, the rest of the current pass (as indices into
        the train set, checked against its task ids on load) and the fresh-task seed."""
        index = {id(t): i for i, t in enumerate(self.tasks)}
        return {"rng": _jsonable(self.rng.getstate()), "order": [index[id(t)] for t in self.order],
                "fresh_seed": self.fresh_seed, "task_ids": [t.id for t in self.tasks]}

    def load_state_dict(self, state: dict) -> None:
        if state["task_ids"] != [t.id for t in self.tasks]:
            raise InputError("tasks.train: the training tasks are not the ones the checkpoint was drawn from "
                             f"({len(state['task_ids'])} tasks then, {len(self.tasks)} now, or in another order)")
        self.rng.setstate(_tupled(state["rng"]))
        self.order = [self.tasks[i] for i in state["order"]]
        self.fresh_seed = state["fresh_seed"]


def _jsonable(x):
    return [_jsonable(v) for v in x] if isinstance(x, tuple) else x


def _tupled(x):
    return tuple(_tupled(v) for v in x) if isinstance(x, list) else x


def load_task_sources(cfg: Config, resuming: bool = False) -> dict[str, list]:
    """tasks.heldout and (unless fresh_train) tasks.train, loaded once, before the run folder and
    Ray exist: a bad path, a malformed file or a missing/wrong benchmark package is reported with
    its key, not as a traceback mid-start. The RODS pool state: ``rods.resume_from``'s, unless
    ``resuming`` a run (its checkpoint's pool is restored into the synthesis actor instead)."""
    from agentrl.envs.sources import resolve_task_sources
    from agentrl.tasks.io import TaskFileError

    keys = ["heldout"] + ([] if cfg.tasks.fresh_train else ["train"])
    loaded: dict[str, list] = {"train": []}
    for key in keys:
        try:
            tasks = loaded[key] = resolve_task_sources(getattr(cfg.tasks, key))
        except (TaskFileError, ValueError, RuntimeError) as err:
            raise InputError(f"tasks.{key}: {err}") from None
        n_sgls = sum(t.backend == "sgls" for t in tasks)
        if n_sgls and cfg.tools.sgls is None:
            raise InputError(f"tasks.{key}: {n_sgls} tasks use backend 'sgls' (LLM-simulated tools) but "
                             "tools.sgls is not set (give it model_path or endpoint)")
    if cfg.rods.enabled and cfg.rods.resume_from and not resuming:
        try:
            loaded["rods_state"] = json.loads(Path(cfg.rods.resume_from).read_text())
        except (OSError, ValueError) as err:
            raise InputError(f"rods.resume_from: cannot read the pool state {cfg.rods.resume_from}: {err}") from None
    return loaded


def start_synthesis_actor(cfg: Config, tasks: dict[str, list], heldout: list, resuming: bool = False):
    """The RODS synthesis actor: its pool replaces the task sampler; seeds = tasks.train, and no
    synthesized task may repeat a held-out user turn. A pool state from ``rods.resume_from``
    starts a new run (steps from 1); a resumed run's pool is restored into it (``load_state_dict``),
    so ``resuming`` needs no seeds."""
    from agentrl.driver.synthesis_actor import SynthesisActor

    if not tasks["train"] and "rods_state" not in tasks and not resuming:
        raise InputError("rods.enabled: RODS needs seed tasks: tasks.train is empty and rods.resume_from "
                         "names no saved pool")
    heldout_texts = frozenset(turn.user for t in heldout for turn in t.turns)
    return SynthesisActor.options(num_cpus=cfg.rods.num_cpus, num_gpus=cfg.rods.num_gpus).remote(
        tasks["train"], cfg.rods, cfg.rollout.tasks_per_step, heldout_texts, cfg.run.seed, cfg.model.dtype,
        state=tasks.get("rods_state"), resume=True, plugins=cfg.plugins)
