"""Checkpoints a run resumes from exactly: ``train.checkpoint_every``, ``agentrl train --resume RUN``.

The driver hands a checkpoint a ``RunParts`` (``driver/trainer.py``: ``Trainer.run_parts``): the
learner, which writes and reads its own files on every rank, and the driver's stateful
components, each a ``Stateful`` (``state_dict`` / ``load_state_dict``, ``records.py``) saved in a
file of its own. This module knows the files, never the components behind them.
``RUN/checkpoint-<k>/`` holds the run's state after step k:

* the policy as a Hugging Face model folder with its tokenizer (``agentrl eval --model`` reads it);
* ``learner/``: the learner's whole training state: weights, optimizer, LR schedule, counters,
  critic, a method's learner parts, RNG states (``engines/learner_state.py``);
* one file per driver part: ``trainer.json`` (policy version, start evaluation), ``sampler.json``
  (the task sampler's RNG, the rest of its pass, the fresh-task seed), ``scheduler.msgpack`` (the
  version the engines must load, quarantined tasks, and in async mode the next step's rollouts,
  in flight at the checkpoint, waited for and kept with their groups), ``replay_buffer.msgpack``
  (the groups the buffer holds, payloads included: their refs die with the run, and its
  counters), ``rods_pool.json`` (rods.enabled: the pool, the seeds waiting for synthesis, its RNG
  and counters; the format ``rods.resume_from`` reads);
* ``trainer_state.json``: the format, the step, the learner's state digest and the sizes of the
  run's append-only logs at the checkpoint (``rods_pool.jsonl``);
* ``manifest.json``, written last: every part above (relative path, size, sha256, computed by the
  writer that wrote it). Only the manifest makes a checkpoint complete (``checkpointing/storage.py``).

Every writer stages its files in a folder of its own (each learner rank on its own node) and puts
them into the checkpoint: without ``run.storage`` that is ``RUN/.checkpoint-<k>.tmp/`` (moved
there), which gets the manifest, is fsynced and renamed to ``checkpoint-<k>``, then ``RUN/latest``
is replaced atomically; with ``run.storage`` it is ``<storage>/<run folder name>/checkpoint-<k>/``
(uploaded), plus ``latest`` and the run's logs there. A process that dies while writing leaves no
manifest: the folder is never resumed from, and is replaced or pruned. Restoring checks every part
it reads against the manifest (size, sha256) and the learner's restored state against the saved
digest; a mismatch of either is an error. ``train.keep_checkpoints`` prunes old ones. Format 2
checkpoints (the driver's state in ``trainer_state.json`` and ``rollouts.msgpack``) are read too.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from agentrl.checkpointing.records import Stateful, pack, unpack
from agentrl.checkpointing.storage import MANIFEST, ChecksumError, Storage
from agentrl.common.files import atomic_write, fsync_path
from agentrl.common.log import get_logger
from agentrl.config import Config, InputError, dump_config
from agentrl.telemetry.metrics import keep_steps_through
from agentrl.telemetry.trajectories import TRAJECTORY_DIR, discard_after

log = get_logger(__name__)

FORMAT, READS = 3, (2, 3)  # written, read
PREFIX, LATEST, STATE_FILE = "checkpoint-", "latest", "trainer_state.json"
LEARNER_DIR = "learner"
# the driver's parts (Trainer.run_parts), one file each
TRAINER_PART, SAMPLER_PART, SCHEDULER_PART = "trainer.json", "sampler.json", "scheduler.msgpack"
BUFFER_FILE, POOL_STATE = "replay_buffer.msgpack", "rods_pool.json"
ROLLOUTS_FILE = "rollouts.msgpack"  # format 2: the scheduler's rollouts launched ahead
POOL_LOG, TASKS_LOG, RESUMES_LOG = "rods_pool.jsonl", "tasks.jsonl", "resumes.jsonl"
APPEND_LOGS = (POOL_LOG,)  # cut back to their size at the checkpoint when resuming (tasks.jsonl: by step)
# read back from run.storage on a resume (trackers.json: the tracker runs a resumed run continues)
RUN_LOGS = ("metrics.jsonl", TASKS_LOG, POOL_LOG, RESUMES_LOG, "trackers.json")
RUN_FILES = ("config.yaml", *RUN_LOGS, "evals.json", "report.png")  # put into run.storage at checkpoints and the end


@dataclass
class RunParts:
    """What a checkpoint saves of a run, handed in by the driver: where the run lives, the learner
    (its ``save_parts`` / ``load_parts`` write and read its files on every rank), and the driver's
    parts by file name, saved and restored in this order. ``final``: the parts the trained
    policy's folder (``final/``) keeps too."""

    run_dir: Path
    storage: Storage | None
    keep_checkpoints: int
    learner: Any
    parts: dict[str, Stateful]
    final: tuple[str, ...] = field(default=())


@dataclass
class Checkpoint:
    """A complete checkpoint: ``path``, the local folder holding its driver files (the checkpoint
    itself, or with ``run.storage`` the files downloaded from it); its ``trainer_state.json``;
    ``source``, where its parts are; ``manifest`` (None: written before manifests)."""

    path: Path
    state: dict[str, Any]
    source: Storage | None = None
    manifest: dict | None = None

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def run_dir(self) -> Path:
        return self.path.parent

    def part_state(self, name: str) -> Any:
        """The saved state of the driver part ``name`` (a file name), or None when it has none."""
        if self.state["format"] == 2 and name in (TRAINER_PART, SAMPLER_PART, SCHEDULER_PART):
            return _format2_part(self, name)
        path = self.path / name
        if not path.is_file():
            return None
        return json.loads(path.read_text(encoding="utf-8")) if name.endswith(".json") else unpack(path.read_bytes())


def _format2_part(ckpt: Checkpoint, name: str) -> Any:
    """A format-2 checkpoint's driver state as the part ``name`` saves it now."""
    state = ckpt.state
    if name == TRAINER_PART:
        return {"version": state["version"], "evals": state["evals"]}
    if name == SAMPLER_PART:
        return state["sampler"]
    ahead = unpack((ckpt.path / ROLLOUTS_FILE).read_bytes()) if (ckpt.path / ROLLOUTS_FILE).exists() else []
    return {"due": state["due"] if state["due"] is not None else state["version"],
            "quarantined": state.get("quarantined", []), "ahead": ahead}


def _driver_files(state: dict, manifest: dict) -> list[dict]:
    """The manifest's entries for the files the driver reads back: ``trainer_state.json`` and the
    parts it lists (format 2: its fixed set)."""
    names = {STATE_FILE, *(state["parts"] if state["format"] >= 3 else (BUFFER_FILE, ROLLOUTS_FILE, POOL_STATE))}
    return [p for p in manifest["parts"] if p["path"] in names]


# ---------------------------------------------------------------- finding one

def run_storage(cfg: Config, run_dir: str | Path) -> Storage | None:
    """The run's folder in ``run.storage`` (named as its local folder), or None without storage."""
    return Storage(cfg.run.storage).child(Path(run_dir).resolve().name) if cfg.run.storage else None


def complete_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint in the local ``run_dir``, oldest first: its
    manifest lists parts that are all there with their sizes, or it is a checkpoint written before
    manifests (``_legacy``)."""
    found = []
    for path in Path(run_dir).glob(f"{PREFIX}*"):
        step = path.name[len(PREFIX):]
        if step.isdigit() and path.is_dir() and (_legacy(path) or Storage(path).complete() is not None):
            found.append((int(step), path))
    return sorted(found)


def _legacy(path: Path) -> bool:
    """A checkpoint folder of an agentrl before manifests: no manifest, and a ``trainer_state.json``
    that does not name one (every checkpoint written since does). Accepted, unchecked."""
    if (path / MANIFEST).exists() or not (path / STATE_FILE).is_file():
        return False
    try:
        return "manifest" not in json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    except ValueError:
        return False


def find_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint: the one ``latest`` names, or a newer complete one (the
    process died between renaming it and updating ``latest``); None when there is none."""
    found = complete_checkpoints(run_dir)
    return found[-1][1] if found else None


def open_checkpoint(run_dir: str | Path, cfg: Config) -> Checkpoint:
    """The checkpoint ``--resume run_dir`` continues from: the newest complete one in ``run_dir``,
    or with ``run.storage`` in the run's folder there (its driver files and the run's logs are
    downloaded into ``run_dir`` first). Exits (the CLI: 2) with the reason when there is none,
    ``train.steps`` ends before it, or a part it read is not its manifest's."""
    store = run_storage(cfg, run_dir)
    if store is not None:
        return _open_stored(Path(run_dir), store, cfg)
    path = find_checkpoint(run_dir)
    if path is None:
        raise InputError(f"--resume {run_dir}: no complete checkpoint (a checkpoint-<step>/ folder whose "
                         f"{MANIFEST} lists parts that are all there); runs write them every train.checkpoint_every steps")
    state = _read_state(path, cfg)
    source = Storage(path)
    manifest = source.manifest()
    if manifest is None:
        log.info(f"agentrl: note: {path} has no {MANIFEST} (written by an agentrl before manifests): resuming from it "
                 f"as complete by its {STATE_FILE}, its files unchecked")
    else:
        _checked(run_dir, lambda: source.verify(_driver_files(state, manifest)))
    return Checkpoint(path, state, source, manifest)


def _open_stored(run_dir: Path, store: Storage, cfg: Config) -> Checkpoint:
    steps = store.complete_numbered(PREFIX)
    if not steps:
        raise InputError(f"--resume {run_dir}: no complete checkpoint in {store} (a checkpoint-<step>/ folder "
                         f"whose {MANIFEST} lists parts that are all there); runs write them every "
                         "train.checkpoint_every steps")
    name = f"{PREFIX}{steps[-1]}"
    source, path = store.child(name), run_dir / name
    manifest = source.complete()
    parts = {p["path"]: p for p in manifest["parts"]}
    shutil.rmtree(path, ignore_errors=True)
    _checked(run_dir, lambda: source.download([parts[STATE_FILE]], path))
    state = _read_state(path, cfg)
    _checked(run_dir, lambda: source.download([p for p in _driver_files(state, manifest) if p["path"] != STATE_FILE], path))
    Storage(path).write_bytes(MANIFEST, json.dumps(manifest, indent=1).encode())
    for name in RUN_LOGS:  # the logs as of the checkpoint (a local copy may be another node's, older)
        if (data := store.read_bytes(name)) is not None:
            atomic_write(run_dir / name, data)
    log.info(f"agentrl: downloaded {path.name}'s driver files and the run's logs from {store} into {run_dir}")
    return Checkpoint(path, state, source, manifest)


def _read_state(path: Path, cfg: Config) -> dict:
    state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    if state.get("format") not in READS:
        raise InputError(f"--resume {path.parent}: {path / STATE_FILE} has format {state.get('format')!r}; "
                         f"this agentrl reads formats {', '.join(map(str, READS))}")
    if cfg.train.steps < state["step"]:
        raise InputError(f"train.steps={cfg.train.steps}: {path.name} is already at step {state['step']}; "
                         "give train.steps >= that to continue the run")
    return state


def _checked(run_dir, read):
    """``read()``; a part that is not its manifest's ends the resume (``InputError`` naming it)."""
    try:
        return read()
    except ChecksumError as err:
        raise InputError(f"--resume {run_dir}: {getattr(err, 'cause', err)}") from None


# ---------------------------------------------------------------- writing one

def write_checkpoint(run: RunParts, step: int) -> Path | Storage:
    """Save the run after ``step`` as ``checkpoint-<step>``, complete once its manifest is written
    (last), and point ``latest`` at it: in the run folder, or with ``run.storage`` there. Returns
    where it is."""
    run_dir, store, name = run.run_dir, run.storage, f"{PREFIX}{step}"
    tmp, final = run_dir / f".{name}.tmp", run_dir / name
    own = _fresh_stage(tmp)
    if store is not None:  # an incomplete one, or a complete one of this step from before a resume
        store.delete(name)
    dest = store.child(name) if store is not None else Storage(tmp)
    # every learner rank writes its parts on its node and puts them into dest, while the driver's parts save
    saving = run.learner.save_parts.remote(str(tmp.resolve()), dest)
    _write_parts(run.parts, own)
    saved = ray.get(saving)
    logs = {log: (run_dir / log).stat().st_size if (run_dir / log).exists() else 0 for log in APPEND_LOGS}
    state = {"format": FORMAT, "step": step, "parts": list(run.parts), "logs": logs,
             "learner_digest": saved["digest"], "manifest": MANIFEST, "time": time.time()}
    atomic_write(own / STATE_FILE, json.dumps(state, indent=1))
    dest.write_manifest(saved["parts"] + dest.upload(own, move=store is None), step=step)  # last: now complete
    if store is not None:
        shutil.rmtree(tmp)
        store.write_bytes(LATEST, f"{name}\n".encode())
        sync_run_files(store, run_dir)
        store.prune(PREFIX, run.keep_checkpoints)
        return dest
    os.rmdir(own)
    _fsync_tree(tmp)
    if final.exists():  # a complete checkpoint of this step from before a resume: replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_path(run_dir)
    atomic_write(run_dir / LATEST, f"{final.name}\n".encode())
    prune_checkpoints(run_dir, run.keep_checkpoints)
    return final


def write_final(run: RunParts, out_dir: Path) -> None:
    """The trained policy as ``out_dir`` (``final/``): rank 0's HF folder, the parts in
    ``run.final`` (the RODS pool as ``rods_pool.json``), and a manifest of them, written last.
    With ``run.storage`` it is uploaded to the run's ``final/`` there too (the local folder is on
    rank 0's node)."""
    store, stage = run.storage, out_dir.with_name(f".{out_dir.name}.tmp")
    own = _fresh_stage(stage)
    if store is not None:
        store.delete(out_dir.name)
        dest = store.child(out_dir.name)
    else:
        shutil.rmtree(out_dir, ignore_errors=True)
        dest = Storage(out_dir)
    keep = str(out_dir.resolve()) if store is not None else None
    saving = run.learner.save_parts.remote(str(stage.resolve()), dest, False, keep)
    _write_parts({name: run.parts[name] for name in run.final}, own)
    parts = ray.get(saving)["parts"]
    if store is not None:  # the local copy gets the driver's files too
        out_dir.mkdir(parents=True, exist_ok=True)
        for path in own.iterdir():
            shutil.copyfile(path, out_dir / path.name)
    manifest = dest.write_manifest(parts + dest.upload(own, move=store is None), final=True)
    if store is not None:
        Storage(out_dir).write_bytes(MANIFEST, json.dumps(manifest, indent=1).encode())
    shutil.rmtree(stage, ignore_errors=True)


def _write_parts(parts: dict[str, Stateful], folder: Path) -> None:
    """Each part's ``state_dict()`` into its file: JSON for ``.json``, else msgpack."""
    for name, part in parts.items():
        state = part.state_dict()
        atomic_write(folder / name, json.dumps(state) if name.endswith(".json") else pack(state))


def _fresh_stage(stage: Path) -> Path:
    """An empty ``stage`` folder with the driver's own staging folder in it (returned)."""
    shutil.rmtree(stage, ignore_errors=True)
    (stage / ".driver").mkdir(parents=True)
    return stage / ".driver"


def sync_run_files(store: Storage, run_dir: Path) -> None:
    """Put the run's config, logs and results (``RUN_FILES``, those that exist) into ``store``."""
    for name in RUN_FILES:
        if (run_dir / name).is_file():
            store.put_file(run_dir / name, name)


def prune_checkpoints(run_dir: Path, keep: int) -> list[int]:
    """Delete all but the newest ``keep`` complete checkpoints in the local ``run_dir`` (0: keep them
    all), and incomplete checkpoint folders older than the newest; returns the deleted steps. Runs only after the
    new checkpoint and ``latest`` are in place, so a crash mid-way leaves more checkpoints, never
    fewer than ``keep`` complete ones. (``Storage.prune`` does the same in ``run.storage``.)"""
    return Storage(run_dir).prune(PREFIX, keep, complete=[step for step, _ in complete_checkpoints(run_dir)])


def _fsync_tree(root: Path) -> None:
    """fsync every file and folder under ``root`` (the learner's files were written by another process)."""
    for folder, _, files in os.walk(root):
        for name in files:
            fsync_path(os.path.join(folder, name))
        fsync_path(folder)


# ---------------------------------------------------------------- resuming

def reopen_run_dir(ckpt: Checkpoint, cfg: Config) -> Path:
    """Make the run folder what it was at the checkpoint, before anything starts: the resumed
    config saved, unfinished checkpoints removed, the logs cut back to the checkpoint (task log
    by step, the pool log by its size then; metrics.jsonl is cut by ``MetricsSink``)."""
    run_dir = ckpt.run_dir
    atomic_write(run_dir / "config.yaml", dump_config(cfg))
    for tmp in [*run_dir.glob(f".{PREFIX}*.tmp"), run_dir / ".final.tmp"]:
        shutil.rmtree(tmp, ignore_errors=True)
    keep_steps_through(run_dir / TASKS_LOG, ckpt.step)
    sizes = ckpt.state["logs"] if ckpt.state["format"] >= 3 else {POOL_LOG: ckpt.state["pool_log_bytes"]}
    for name, size in sizes.items():
        if (run_dir / name).exists() and (run_dir / name).stat().st_size > size:
            os.truncate(run_dir / name, size)
    if (run_dir / TRAJECTORY_DIR).is_dir():
        discard_after(run_dir / TRAJECTORY_DIR, ckpt.step)
    log.info(f"agentrl: resuming run {run_dir} from {ckpt.path.name} (step {ckpt.step} of {cfg.train.steps})")
    return run_dir


def pool_state(ckpt: Checkpoint) -> dict:
    return json.loads((ckpt.path / POOL_STATE).read_text(encoding="utf-8"))


def restore(run: RunParts, ckpt: Checkpoint) -> dict[str, str]:
    """Load the checkpoint into a freshly built run: the learner (each rank checks the parts it
    reads against the manifest, downloading them first from remote storage; the restored state
    must match the saved digest, ``check_digest``), then every driver part in ``run.parts``'s
    order. Returns the learner's digest."""
    if ckpt.manifest is None:  # a checkpoint written before manifests
        digest = ray.get(run.learner.load_state.remote(str((ckpt.path / LEARNER_DIR).resolve())))
    else:
        stage = run.run_dir / ".restore.tmp"
        parts = [p for p in ckpt.manifest["parts"] if p["path"].startswith(f"{LEARNER_DIR}/")]
        try:
            digest = _checked(ckpt.run_dir, lambda: ray.get(run.learner.load_parts.remote(
                str(stage.resolve()), ckpt.source, parts)))
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    check_digest(ckpt.state["learner_digest"], digest, ckpt.path.name)
    for name, part in run.parts.items():
        state = ckpt.part_state(name)
        if state is not None:
            part.load_state_dict(state)
    return digest


def check_digest(saved: dict[str, str], restored: dict[str, str], name: str) -> None:
    """The restored learner holds what ``name`` saved, bit for bit; else ``InputError`` naming each part
    that differs, with both digests' values."""
    if restored == saved:
        return
    differ = sorted(k for k in saved.keys() | restored.keys() if saved.get(k) != restored.get(k))
    shown = ", ".join(f"{k} (saved {str(saved.get(k))[:12]}, restored {str(restored.get(k))[:12]})" for k in differ)
    raise InputError(f"--resume: the learner state restored from {name} is not the one saved: {shown}")


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
