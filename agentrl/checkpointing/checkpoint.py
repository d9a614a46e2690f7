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
* ``trainer_state.json``: step, policy version, the task sampler (RNG state, the rest of its
  pass, the fresh-task seed), the start evaluation, the version the engines still had to load,
  the size of ``rods_pool.jsonl`` at the checkpoint, and the learner's state digest;
* ``manifest.json``, written last: every part above (relative path, size, sha256, computed by the
  writer that wrote it). Only the manifest makes a checkpoint complete (``checkpointing/storage.py``).

Every writer stages its files in a folder of its own (each learner rank on its own node) and puts
them into the checkpoint: without ``run.storage`` that is ``RUN/.checkpoint-<k>.tmp/`` (moved
there), which gets the manifest, is fsynced and renamed to ``checkpoint-<k>``, then ``RUN/latest``
is replaced atomically; with ``run.storage`` it is ``<storage>/<run folder name>/checkpoint-<k>/``
(uploaded), plus ``latest`` and the run's logs there. A process that dies while writing leaves no
manifest: the folder is never resumed from, and is replaced or pruned. Restoring checks every part
it reads against the manifest (size, sha256) and the learner's restored state against the saved
digest; a mismatch of either is an error. ``train.keep_checkpoints`` prunes old ones.

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
from typing import Any

import msgpack
import ray

from agentrl.api import EpisodeGroup, GroupRef, GroupSummary
from agentrl.checkpointing.storage import MANIFEST, ChecksumError, Storage
from agentrl.config import Config, dump_config
from agentrl.telemetry.metrics import keep_steps_through
from agentrl.telemetry.trajectories import TRAJECTORY_DIR, discard_after

# the driver's Trainer (driver/trainer.py), a layer above: read through its attributes
Trainer = Any

FORMAT = 2
PREFIX, LATEST, STATE_FILE = "checkpoint-", "latest", "trainer_state.json"
LEARNER_DIR, POOL_STATE, BUFFER_FILE, ROLLOUTS_FILE = "learner", "rods_pool.json", "replay_buffer.msgpack", "rollouts.msgpack"
POOL_LOG, TASKS_LOG, RESUMES_LOG = "rods_pool.jsonl", "tasks.jsonl", "resumes.jsonl"
DRIVER_FILES = (STATE_FILE, BUFFER_FILE, ROLLOUTS_FILE, POOL_STATE)  # the parts the driver writes and reads back
# read back from run.storage on a resume (trackers.json: the tracker runs a resumed run continues)
RUN_LOGS = ("metrics.jsonl", TASKS_LOG, POOL_LOG, RESUMES_LOG, "trackers.json")
RUN_FILES = ("config.yaml", *RUN_LOGS, "evals.json", "report.png")  # put into run.storage at checkpoints and the end


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
        raise SystemExit(f"error: --resume {run_dir}: no complete checkpoint (a checkpoint-<step>/ folder whose "
                         f"{MANIFEST} lists parts that are all there); runs write them every train.checkpoint_every steps")
    state = _read_state(path, cfg)
    source = Storage(path)
    manifest = source.manifest()
    if manifest is None:
        print(f"agentrl: note: {path} has no {MANIFEST} (written by an agentrl before manifests): resuming from it "
              f"as complete by its {STATE_FILE}, its files unchecked", flush=True)
    else:
        _checked(run_dir, lambda: source.verify([p for p in manifest["parts"] if p["path"] in DRIVER_FILES]))
    return Checkpoint(path, state, source, manifest)


def _open_stored(run_dir: Path, store: Storage, cfg: Config) -> Checkpoint:
    steps = store.complete_numbered(PREFIX)
    if not steps:
        raise SystemExit(f"error: --resume {run_dir}: no complete checkpoint in {store} (a checkpoint-<step>/ folder "
                         f"whose {MANIFEST} lists parts that are all there); runs write them every "
                         "train.checkpoint_every steps")
    name = f"{PREFIX}{steps[-1]}"
    source, path = store.child(name), run_dir / name
    manifest = source.complete()
    parts = {p["path"]: p for p in manifest["parts"]}
    shutil.rmtree(path, ignore_errors=True)
    _checked(run_dir, lambda: source.download([parts[STATE_FILE]], path))
    state = _read_state(path, cfg)
    _checked(run_dir, lambda: source.download([parts[n] for n in DRIVER_FILES[1:] if n in parts], path))
    Storage(path).write_bytes(MANIFEST, json.dumps(manifest, indent=1).encode())
    for log in RUN_LOGS:  # the logs as of the checkpoint (a local copy may be another node's, older)
        if (data := store.read_bytes(log)) is not None:
            write_atomic(run_dir / log, data)
    print(f"agentrl: downloaded {name}'s driver files and the run's logs from {store} into {run_dir}", flush=True)
    return Checkpoint(path, state, source, manifest)


def _read_state(path: Path, cfg: Config) -> dict:
    state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    if state.get("format") != FORMAT:
        raise SystemExit(f"error: --resume {path.parent}: {path / STATE_FILE} has format {state.get('format')!r}; "
                         f"this agentrl reads format {FORMAT}")
    if cfg.train.steps < state["step"]:
        raise SystemExit(f"error: train.steps={cfg.train.steps}: {path.name} is already at step {state['step']}; "
                         "give train.steps >= that to continue the run")
    return state


def _checked(run_dir, read):
    """``read()``; a part that is not its manifest's ends the resume (SystemExit naming it)."""
    try:
        return read()
    except ChecksumError as err:
        raise SystemExit(f"error: --resume {run_dir}: {getattr(err, 'cause', err)}") from None


# ---------------------------------------------------------------- writing one

def write_checkpoint(trainer: Trainer, step: int, evals: dict) -> Path | Storage:
    """Save the run after ``step`` as ``checkpoint-<step>``, complete once its manifest is written
    (last), and point ``latest`` at it: in the run folder, or with ``run.storage`` there. Returns
    where it is."""
    run_dir, store, name = trainer.run_dir, trainer.storage, f"{PREFIX}{step}"
    tmp, final = run_dir / f".{name}.tmp", run_dir / name
    own = _fresh_stage(tmp)
    if store is not None:  # an incomplete one, or a complete one of this step from before a resume
        store.delete(name)
    dest = store.child(name) if store is not None else Storage(tmp)
    results, due = trainer.scheduler.pending()  # async: waits for the rollouts launched ahead
    # every learner rank writes its parts on its node and puts them into dest, while the driver packs
    saving = trainer.learner.save_parts.remote(str(tmp.resolve()), dest)
    entries, counters = ray.get(trainer.buffer.state.remote())
    _write_bytes(own / BUFFER_FILE, _pack({"counters": counters, "groups": _pack_groups(entries)}))
    if results:
        _write_bytes(own / ROLLOUTS_FILE, _pack([
            {"step": ahead, "calls": [{"summaries": [asdict(s) for s in sums], "groups": _pack_groups(refs)}
                                      for sums, refs in calls]} for ahead, calls in results.items()]))
    if trainer.rods is not None:
        trainer.drain_pool_log()  # the log holds everything up to the saved state
        _write_bytes(own / POOL_STATE, json.dumps(ray.get(trainer.rods.state_dict.remote())).encode())
    trainer.trajectories.checkpoint()
    pool_log = run_dir / POOL_LOG
    saved = ray.get(saving)
    state = {"format": FORMAT, "step": step, "version": trainer.version, "due": due, "evals": evals,
             "sampler": trainer.sampler.state_dict() if trainer.sampler is not None else None,
             "quarantined": sorted(trainer.scheduler.quarantined),  # tasks that killed their worker twice
             "pool_log_bytes": pool_log.stat().st_size if pool_log.exists() else 0,
             "learner_digest": saved["digest"], "manifest": MANIFEST, "time": time.time()}
    _write_bytes(own / STATE_FILE, json.dumps(state, indent=1).encode())
    dest.write_manifest(saved["parts"] + dest.upload(own, move=store is None), step=step)  # last: now complete
    keep = trainer.cfg.train.keep_checkpoints
    if store is not None:
        shutil.rmtree(tmp)
        store.write_bytes(LATEST, f"{name}\n".encode())
        sync_run_files(store, run_dir)
        store.prune(PREFIX, keep)
        return dest
    os.rmdir(own)
    _fsync_tree(tmp)
    if final.exists():  # a complete checkpoint of this step from before a resume: replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(run_dir)
    write_atomic(run_dir / LATEST, f"{final.name}\n".encode())
    prune_checkpoints(run_dir, keep)
    return final


def write_final(trainer: Trainer, out_dir: Path) -> None:
    """The trained policy as ``out_dir`` (``final/``): rank 0's HF folder, the RODS pool as
    ``rods_pool.json``, and a manifest of them, written last. With ``run.storage`` it is uploaded
    to the run's ``final/`` there too (the local folder is on rank 0's node)."""
    store, stage = trainer.storage, out_dir.with_name(f".{out_dir.name}.tmp")
    own = _fresh_stage(stage)
    if store is not None:
        store.delete(out_dir.name)
        dest = store.child(out_dir.name)
    else:
        shutil.rmtree(out_dir, ignore_errors=True)
        dest = Storage(out_dir)
    keep = str(out_dir.resolve()) if store is not None else None
    saving = trainer.learner.save_parts.remote(str(stage.resolve()), dest, False, keep)
    if trainer.rods is not None:
        trainer.drain_pool_log()  # the log holds everything up to the saved state
        _write_bytes(own / POOL_STATE, json.dumps(ray.get(trainer.rods.state_dict.remote())).encode())
    parts = ray.get(saving)["parts"]
    if store is not None:  # the local copy gets the driver's files too
        out_dir.mkdir(parents=True, exist_ok=True)
        for path in own.iterdir():
            shutil.copyfile(path, out_dir / path.name)
    manifest = dest.write_manifest(parts + dest.upload(own, move=store is None), final=True)
    if store is not None:
        Storage(out_dir).write_bytes(MANIFEST, json.dumps(manifest, indent=1).encode())
    shutil.rmtree(stage, ignore_errors=True)


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
    for tmp in [*run_dir.glob(f".{PREFIX}*.tmp"), run_dir / ".final.tmp"]:
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
    checkpoint's pool. Appends what was restored to ``resumes.jsonl``. Every part read is checked
    against the manifest, and the restored learner against the saved digest (``check_digest``)."""
    state = ckpt.state
    if ckpt.manifest is None:  # a checkpoint written before manifests
        digest = ray.get(trainer.learner.load_state.remote(str((ckpt.path / LEARNER_DIR).resolve())))
    else:  # each rank checks the parts it reads (downloads them first from remote storage)
        stage = trainer.run_dir / ".restore.tmp"
        parts = [p for p in ckpt.manifest["parts"] if p["path"].startswith(f"{LEARNER_DIR}/")]
        try:
            digest = _checked(ckpt.run_dir, lambda: ray.get(trainer.learner.load_parts.remote(
                str(stage.resolve()), ckpt.source, parts)))
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    check_digest(state["learner_digest"], digest, ckpt.path.name)
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
    trainer.scheduler.quarantined = set(state.get("quarantined", []))  # absent before quarantine existed
    trainer.evals = {k: v for k, v in state["evals"].items() if k != "end"}  # a new end comes with the new last step
    record = {"time": time.time(), "checkpoint": ckpt.path.name, "step": ckpt.step, "version": trainer.version,
              "steps": trainer.cfg.train.steps, "learner_digest_match": True, "learner_digest": digest,
              "buffer_groups": len(saved["groups"]),
              "rollouts_in_flight": sum(len(refs) for calls in results.values() for _, refs in calls)}
    with (trainer.run_dir / RESUMES_LOG).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def check_digest(saved: dict[str, str], restored: dict[str, str], name: str) -> None:
    """The restored learner holds what ``name`` saved, bit for bit; else SystemExit naming each part
    that differs, with both digests' values."""
    if restored == saved:
        return
    differ = sorted(k for k in saved.keys() | restored.keys() if saved.get(k) != restored.get(k))
    shown = ", ".join(f"{k} (saved {str(saved.get(k))[:12]}, restored {str(restored.get(k))[:12]})" for k in differ)
    raise SystemExit(f"error: --resume: the learner state restored from {name} is not the one saved: {shown}")


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
