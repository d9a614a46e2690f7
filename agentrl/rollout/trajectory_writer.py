"""The actor that records every training episode into the run folder (``telemetry/trajectories.py``).

Why an actor, and why on the driver's node: the driver never fetches an episode (on a cluster the
groups live in the object stores of the rollout workers' nodes), but the run folder is the
driver's. So a 0-CPU actor pinned to the driver's node (hard node affinity) fetches the groups
itself and writes there. The driver hands it each step's ``GroupRef`` list, nested, so Ray passes
the refs through unresolved and the payloads never touch the driver; the call is not awaited.
Calls from one caller run in order, so ``flush`` at the end runs after every step's ``add``.

The actor decodes with the tokenizer at the model path: the driver has resolved and checked that
path on its own node, which is this actor's node.

Telemetry must never be why a run dies: a failing step costs that step's records (one warning),
and ``Trajectories.close`` turns any error into a warning.
"""

from __future__ import annotations

import logging
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from agentrl.api import GroupRef
from agentrl.telemetry.trajectories import TRAJECTORY_DIR, TrajectoryLog, episode_records

log = logging.getLogger(__name__)


@ray.remote(num_cpus=0)
class TrajectoryWriter:
    def __init__(self, out_dir: str, model_path: str, every: int):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
        self.log = TrajectoryLog(out_dir, every)
        self.failures = 0

    def add(self, step: int, refs: list[GroupRef]) -> int:
        """Record step ``step``'s groups; returns how many episodes were recorded."""
        try:
            groups = ray.get([r.ref for r in refs])
            rows = [row for g in groups for row in episode_records(g, step, self.decode)]
            self.log.add(step, rows)
            return len(rows)
        except Exception as err:
            self.failures += 1
            if self.failures == 1:
                log.warning("trajectory records of step %d not written (further failures not reported): %r", step, err)
            return 0

    def flush(self) -> list[str]:
        """Finish the open file; returns every file written."""
        self.log.close()
        return [str(p) for p in self.log.files]


class Trajectories:
    """The driver's side: ``add`` per step (not awaited), ``close`` at the end (awaited).
    ``every`` = 0 (``telemetry.trajectories_every``) records nothing and starts no actor."""

    def __init__(self, run_dir: Path, model_path: str, every: int):
        self.actor = None
        if every:
            here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
            self.actor = TrajectoryWriter.options(scheduling_strategy=here).remote(
                str(Path(run_dir).resolve() / TRAJECTORY_DIR), model_path, every)

    def add(self, step: int, refs: list[GroupRef]) -> None:
        if self.actor is not None:
            self.actor.add.remote(step, list(refs))

    def checkpoint(self) -> None:
        """At a checkpoint: wait for every step's records so far and close the open file, so
        no file holds steps on both sides of a checkpoint (a resumed run drops later files)."""
        if self.actor is not None:
            try:
                ray.get(self.actor.flush.remote())
            except Exception as err:
                log.warning("trajectory records not flushed at the checkpoint: %r", err)

    def close(self) -> list[str]:
        """Wait for every step's records and finish the last file; returns the files written."""
        if self.actor is None:
            return []
        try:
            return ray.get(self.actor.flush.remote())
        except Exception as err:  # e.g. the actor died: the run's own results still count
            log.warning("trajectory records not finished: %r", err)
            return []
        finally:
            ray.kill(self.actor)
            self.actor = None
