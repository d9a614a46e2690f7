"""Checkpoints a run resumes from exactly: ``train.checkpoint_every``, ``agentrl train --resume RUN``.

``RUN/checkpoint-<k>/`` holds the run's state after step k:

* the policy as a Hugging Face model folder with its tokenizer (``agentrl eval --model`` reads it);
* ``learner/``: the learner's whole training state: weights, optimizer, LR schedule, counters,
  critic, RSPO explorer, RNG states (``engines/learner_state.py``);
* ``rods_pool.json`` (rods.enabled): the pool, the seeds waiting for synthesis, its RNG and counters;
* ``replay_buffer.msgpack``: the groups the buffer still holds, payloads included (fetched from
  the object store: their refs die with the run), and its counters;
* ``rollouts.msgpack`` (async rollouts): the next step's rollouts, in flight when the checkpoint
  was taken, waited for and kept with their group payloads;
* ``trainer_state.json``, written last: step, policy version, the task sampler (RNG state, the
  rest of its pass, the fresh-task seed), the start evaluation, the version the engines still
  had to load, the size of ``rods_pool.jsonl`` at the checkpoint, and the learner's state digest.

Writes are atomic: everything goes into ``RUN/.checkpoint-<k>.tmp/``, is fsynced, and the folder
is renamed to ``checkpoint-<k>``; then ``RUN/latest`` (the folder's name) is replaced atomically.
A ``checkpoint-<k>`` folder with ``trainer_state.json`` is complete; a process that dies while
writing leaves only the temporary folder, which a resumed run deletes and never reads. Older
checkpoints are kept. The learner writes its part itself, so the run folder must be on a
filesystem the learner's node shares with the driver's (one node, or a shared mount).

Compact records (the buffer's and the in-flight groups) are msgpack: episodes are long lists of
token ids and logprobs, which msgpack stores as packed ints and float64 (exact) at a fraction of
JSON's size and parse time; the pool stays JSON, the format ``rods.resume_from`` reads.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import ray

from agentrl.api import EpisodeGroup, GroupRef, GroupSummary
from agentrl.config import Config, dump_config
from agentrl.telemetry.metrics import keep_steps_through
from agentrl.telemetry.trajectories import TRAJECTORY_DIR, discard_after

if TYPE_CHECKING:
    from agentrl.runtime.driver import Trainer

FORMAT = 2
PREFIX, LATEST, STATE_FILE = "checkpoint-", "latest", "trainer_state.json"
LEARNER_DIR, POOL_STATE, BUFFER_FILE, ROLLOUTS_FILE = "learner", "rods_pool.json", "replay_buffer.msgpack", "rollouts.msgpack"
POOL_LOG, TASKS_LOG, RESUMES_LOG = "rods_pool.jsonl", "tasks.jsonl", "resumes.jsonl"


@dataclass
class Checkpoint:
    """A complete checkpoint folder and its ``trainer_state.json``."""

    path: Path
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def run_dir(self) -> Path:
        return self.path.parent


# ---------------------------------------------------------------- finding one

def complete_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint in ``run_dir``, oldest first."""
    found = []
    for path in Path(run_dir).glob(f"{PREFIX}*"):
        step = path.name[len(PREFIX):]
        if step.isdigit() and (path / STATE_FILE).is_file():
            found.append((int(step), path))
    return sorted(found)


def find_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint: the one ``latest`` names, or a newer complete one (the
    process died between renaming it and updating ``latest``); None when there is none."""
    found = complete_checkpoints(run_dir)
    return found[-1][1] if found else None


def open_checkpoint(run_dir: str | Path, cfg: Config) -> Checkpoint:
    """The checkpoint ``--resume run_dir`` continues from; exits (the CLI: 2) with the reason when
    there is none or ``train.steps`` ends before it."""
    path = find_checkpoint(run_dir)
    if path is None:
        raise SystemExit(f"error: --resume {run_dir}: no complete checkpoint (a checkpoint-<step>/ folder with "
                         f"{STATE_FILE}); runs write them every train.checkpoint_every steps")
    state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    if state.get("format") != FORMAT:
        raise SystemExit(f"error: --resume {run_dir}: {path / STATE_FILE} has format {state.get('format')!r}; "
                         f"this agentrl reads format {FORMAT}")
    if cfg.train.steps < state["step"]:
        raise SystemExit(f"error: train.steps={cfg.train.steps}: {path.name} is already at step {state['step']}; "
                         "give train.steps >= that to continue the run")
    return Checkpoint(path, state)


# ---------------------------------------------------------------- writing one

def write_checkpoint(trainer: Trainer, step: int, evals: dict) -> Path:
    """Save the run after ``step`` as ``checkpoint-<step>`` (atomically) and point ``latest`` at it."""
    run_dir = trainer.run_dir
    tmp, final = run_dir / f".{PREFIX}{step}.tmp", run_dir / f"{PREFIX}{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    results, due = trainer.scheduler.pending()  # async: waits for the rollouts launched ahead
    hf = trainer.learner.save.remote(str(tmp.resolve()))  # the learner writes while the driver packs
    digest = trainer.learner.save_state.remote(str((tmp / LEARNER_DIR).resolve()))
    entries, counters = ray.get(trainer.buffer.state.remote())
    _write_bytes(tmp / BUFFER_FILE, _pack({"counters": counters, "groups": _pack_groups(entries)}))
    if results:
        _write_bytes(tmp / ROLLOUTS_FILE, _pack([
            {"step": ahead, "calls": [{"summaries": [asdict(s) for s in sums], "groups": _pack_groups(refs)}
                                      for sums, refs in calls]} for ahead, calls in results.items()]))
    if trainer.rods is not None:
        trainer.drain_pool_log()  # the log holds everything up to the saved state
        _write_bytes(tmp / POOL_STATE, json.dumps(ray.get(trainer.rods.state_dict.remote())).encode())
    trainer.trajectories.checkpoint()
    pool_log = run_dir / POOL_LOG
    state = {"format": FORMAT, "step": step, "version": trainer.version, "due": due, "evals": evals,
             "sampler": trainer.sampler.state_dict() if trainer.sampler is not None else None,
             "pool_log_bytes": pool_log.stat().st_size if pool_log.exists() else 0,
             "learner_digest": ray.get(digest), "time": time.time()}
    ray.get(hf)
    _write_bytes(tmp / STATE_FILE, json.dumps(state, indent=1).encode())
    _fsync_tree(tmp)
    if final.exists():  # a complete checkpoint of this step from before a resume: replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(run_dir)
    write_atomic(run_dir / LATEST, f"{final.name}\n".encode())
    prune_checkpoints(run_dir, trainer.cfg.train.keep_checkpoints)
    return final


def prune_checkpoints(run_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (0: keep all); returns the deleted.
    Runs only after the new checkpoint and ``latest`` are in place, so a crash mid-way leaves
    more checkpoints, never fewer than ``keep`` complete ones."""
    found = complete_checkpoints(run_dir)
    old = [path for _, path in found[:-keep]] if keep and len(found) > keep else []
    for path in old:
        shutil.rmtree(path)
    return old


def write_atomic(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` or what it held before, never a part: temp file, fsync, rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    _write_bytes(tmp, data)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_tree(root: Path) -> None:
    """fsync every file and folder under ``root`` (the learner's files were written by another process)."""
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(folder))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- group payloads (msgpack)

def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, default=str)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _pack_groups(refs: list[GroupRef]) -> list[dict]:
    """The groups behind ``refs`` with their versions (payloads fetched from the object store)."""
    groups = ray.get([r.ref for r in refs]) if refs else []
    return [{"version": r.version, "task_id": r.task_id, "group": g.to_dict()} for r, g in zip(refs, groups)]


def _unpack_groups(records: list[dict]) -> list[GroupRef]:
    """Put the groups back into the object store; their new refs, with the saved versions."""
    return [GroupRef(ray.put(EpisodeGroup.from_dict(r["group"])), r["version"], r["task_id"]) for r in records]


# ---------------------------------------------------------------- resuming

def reopen_run_dir(ckpt: Checkpoint, cfg: Config) -> Path:
    """Make the run folder what it was at the checkpoint, before anything starts: the resumed
    config saved, unfinished checkpoints removed, the logs cut back to the checkpoint (task log
    by step, the pool log by its size then; metrics.jsonl is cut by ``MetricsSink``)."""
    run_dir = ckpt.run_dir
    write_atomic(run_dir / "config.yaml", dump_config(cfg).encode())
    for tmp in run_dir.glob(f".{PREFIX}*.tmp"):
        shutil.rmtree(tmp, ignore_errors=True)
    keep_steps_through(run_dir / TASKS_LOG, ckpt.step)
    pool_log = run_dir / POOL_LOG
    if pool_log.exists() and pool_log.stat().st_size > ckpt.state["pool_log_bytes"]:
        os.truncate(pool_log, ckpt.state["pool_log_bytes"])
    if (run_dir / TRAJECTORY_DIR).is_dir():
        discard_after(run_dir / TRAJECTORY_DIR, ckpt.step)
    print(f"agentrl: resuming run {run_dir} from {ckpt.path.name} (step {ckpt.step} of {cfg.train.steps})", flush=True)
    return run_dir


def pool_state(ckpt: Checkpoint) -> dict:
    return json.loads((ckpt.path / POOL_STATE).read_text(encoding="utf-8"))


def restore(trainer: Trainer, ckpt: Checkpoint) -> None:
    """Load the checkpoint into a freshly built ``Trainer``: learner, policy version, task sampler,
    replay buffer, the scheduler's in-flight rollouts and pending version (sync mode: the engines
    load the checkpoint's weights now), the start evaluation. The RODS actor was built from the
    checkpoint's pool. Appends what was restored to ``resumes.jsonl``."""
    state = ckpt.state
    digest = ray.get(trainer.learner.load_state.remote(str((ckpt.path / LEARNER_DIR).resolve())))
    trainer.version = state["version"]
    if trainer.sampler is not None:
        trainer.sampler.load_state_dict(state["sampler"])
    saved = _unpack((ckpt.path / BUFFER_FILE).read_bytes())
    ray.get(trainer.buffer.restore.remote(_unpack_groups(saved["groups"]), saved["counters"]))
    results = {}
    if (ckpt.path / ROLLOUTS_FILE).exists():
        results = {ahead["step"]: [([GroupSummary(**s) for s in call["summaries"]], _unpack_groups(call["groups"]))
                                   for call in ahead["calls"]]
                   for ahead in _unpack((ckpt.path / ROLLOUTS_FILE).read_bytes())}
    trainer.scheduler.restore(results, state["due"] if state["due"] is not None else trainer.version)
    trainer.evals = {k: v for k, v in state["evals"].items() if k != "end"}  # a new end comes with the new last step
    match = digest == state["learner_digest"]
    if not match:
        parts = sorted(k for k in digest if digest[k] != state["learner_digest"].get(k))
        print(f"warning: the restored learner state differs from {ckpt.path.name}'s in: {', '.join(parts)}", flush=True)
    record = {"time": time.time(), "checkpoint": ckpt.path.name, "step": ckpt.step, "version": trainer.version,
              "steps": trainer.cfg.train.steps, "learner_digest_match": match, "learner_digest": digest,
              "buffer_groups": len(saved["groups"]),
              "rollouts_in_flight": sum(len(refs) for calls in results.values() for _, refs in calls)}
    with (trainer.run_dir / RESUMES_LOG).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def engine_seed_rollout_cfg(cfg: Config, step: int):
    """The rollout settings of a run resumed after ``step``: each engine's sampling seed moves on by
    ``1000 * step``. vLLM seeds an engine once, at start, and its sampling stream cannot be saved,
    so a resumed run's engines draw a new stream, one that depends on the checkpoint only (a run
    resumed twice from the same checkpoint seeds its engines alike) and does not replay step 1's
    draws. None when not resuming (the config's own)."""
    if step == 0:
        return None
    engine = cfg.rollout.engine.model_copy(update={"seed": cfg.rollout.engine.seed + 1000 * step})
    return cfg.rollout.model_copy(update={"engine": engine})
