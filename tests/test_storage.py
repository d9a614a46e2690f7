"""run.storage: checkpoints and results in a shared or remote folder (agentrl/checkpointing/storage.py,
docs/operating.md "Storage").

The storage module against a local directory and against a real S3-compatible server (moto's
server mode, started here on 127.0.0.1): upload and download, the manifest rule (a folder is
complete only when its manifest exists and every part it lists is there with its size; a wrong
sha256 fails the read, naming the part), pruning. The local run folder's rules (manifest, or a
checkpoint written before manifests), and the restored digest's check. End to end: a tiny run
with ``run.storage=s3://...`` checkpoints into the server, and ``--resume auto`` from another,
empty output folder downloads its checkpoint and finishes. Every connection goes to 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import uuid
from pathlib import Path

import pytest

from agentrl.checkpointing.storage import MANIFEST, ChecksumError, Storage
from agentrl.config import InputError

CREDENTIALS = "testing:testing"  # moto accepts any; given in the URI, so no AWS SDK lookup leaves the host


@pytest.fixture(scope="module")
def s3_endpoint():
    """host:port of a moto S3 server on the loopback interface."""
    pytest.importorskip("moto.server")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"{host}:{port}"
    server.stop()


def _bucket(endpoint: str) -> str:
    import boto3

    name = f"agentrl-{uuid.uuid4().hex[:12]}"
    key, secret = CREDENTIALS.split(":")
    boto3.client("s3", endpoint_url=f"http://{endpoint}", aws_access_key_id=key, aws_secret_access_key=secret,
                 region_name="us-east-1").create_bucket(Bucket=name)
    return name


def _s3_uri(endpoint: str, bucket: str, prefix: str) -> str:
    return f"s3://{CREDENTIALS}@{bucket}/{prefix}?scheme=http&endpoint_override={endpoint}&region=us-east-1"


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path, monkeypatch) -> Storage:
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    if request.param == "local":
        return Storage(tmp_path / "store")
    endpoint = request.getfixturevalue("s3_endpoint")
    return Storage(_s3_uri(endpoint, _bucket(endpoint), "runs"))


def _files(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _checkpoint(store: Storage, name: str, tmp_path: Path, complete: bool = True) -> Storage:
    folder = store.child(name)
    parts = folder.upload(_files(tmp_path / f"src-{name}", {"a.bin": b"a" * 10, "sub/b.bin": b"b" * 20}))
    if complete:
        folder.write_manifest(parts)
    return folder


# ------------------------------------------------------------------ the storage module

def test_upload_download_round_trip(store, tmp_path):
    src = _files(tmp_path / "src", {"x.bin": b"x" * 1000, "policy/zero_pp_rank_0.pt": b"\0" * 5000})
    ckpt = store.child("checkpoint-1")
    parts = ckpt.upload(src, sub="learner")
    assert parts == [{"path": f"learner/{rel}", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                     for rel, data in [("policy/zero_pp_rank_0.pt", b"\0" * 5000), ("x.bin", b"x" * 1000)]]
    assert ckpt.complete() is None  # no manifest yet
    manifest = ckpt.write_manifest(parts, step=1)
    assert ckpt.complete() == manifest and manifest["step"] == 1 and ckpt.manifest() == manifest
    ckpt.download(parts, tmp_path / "dst")
    assert (tmp_path / "dst" / "learner" / "x.bin").read_bytes() == b"x" * 1000
    again = pickle.loads(pickle.dumps(ckpt))  # how Ray actors get it: rebuilt from its URI
    assert again.complete() == manifest and again.sizes() == ckpt.sizes()
    assert store.numbered("checkpoint-") == [1] and store.complete_numbered("checkpoint-") == [1]
    assert "testing" not in str(store)  # credentials in the URI are not printed
    with pytest.raises(RuntimeError, match="parts written by more than one writer: learner/x.bin"):
        ckpt.write_manifest(parts + parts[1:])


def test_a_folder_is_complete_only_by_a_manifest_whose_parts_are_all_there(store, tmp_path):
    ckpt = _checkpoint(store, "checkpoint-2", tmp_path, complete=False)
    parts = {p["path"]: p for p in ckpt.upload(tmp_path / "src-checkpoint-2")}
    assert ckpt.complete() is None  # every part there, but no manifest
    ghost = {"path": "learner/extra_rank1.pt", "size": 3, "sha256": "0" * 64}
    with pytest.raises(RuntimeError, match="not in place .*learner/extra_rank1.pt"):
        ckpt.write_manifest([*parts.values(), ghost])  # a part a writer put on its own node's disk
    ckpt.write_bytes(MANIFEST, json.dumps({"parts": [*parts.values(), ghost]}).encode())
    assert ckpt.complete() is None  # lists a missing part
    ckpt.write_manifest(list(parts.values()))
    assert ckpt.complete() is not None
    ckpt.write_bytes("sub/b.bin", b"b" * 19)  # a short part
    assert ckpt.complete() is None
    ckpt.write_bytes("sub/b.bin", b"c" * 20)  # the right size, the wrong bytes: complete, but unreadable
    assert ckpt.complete() is not None
    with pytest.raises(ChecksumError, match=r"checkpoint-2/sub/b.bin: 20 bytes with sha256 .* the part is corrupt"):
        ckpt.download(list(parts.values()), tmp_path / "dst")
    if ckpt.local:
        with pytest.raises(ChecksumError, match="sub/b.bin"):
            ckpt.verify(list(parts.values()))
    ckpt.write_bytes(MANIFEST, b"{not json")
    assert ckpt.complete() is None


def test_prune_keeps_the_newest_complete_and_drops_what_is_older(store, tmp_path):
    for k in (1, 2, 3, 4, 5, 6):
        _checkpoint(store, f"checkpoint-{k}", tmp_path, complete=k not in (3, 6))
    store.write_bytes("metrics.jsonl", b"{}\n")
    assert store.numbered("checkpoint-") == [1, 2, 3, 4, 5, 6]
    assert store.complete_numbered("checkpoint-") == [1, 2, 4, 5]
    assert store.prune("checkpoint-", 0) == [3]  # 0 = keep every complete one; 3 was left by a dead writer
    assert store.prune("checkpoint-", 2) == [1, 2]  # 6 is newer than the newest complete one: being written
    assert store.numbered("checkpoint-") == [4, 5, 6] and store.complete_numbered("checkpoint-") == [4, 5]
    assert store.read_bytes("metrics.jsonl") == b"{}\n"
    store.delete("checkpoint-5")
    assert store.numbered("checkpoint-") == [4, 6] and store.read_bytes("checkpoint-5/a.bin") is None


# ------------------------------------------------------------------ the local run folder

def test_local_run_folder_needs_a_manifest_or_is_an_old_checkpoint(tmp_path, capsys):
    from agentrl.checkpointing.checkpoint import FORMAT, STATE_FILE, complete_checkpoints, open_checkpoint
    from agentrl.config import load_config

    cfg = load_config(None, ["train.steps=10"])
    run = tmp_path / "run"

    def checkpoint(step: int, manifest: bool, marked: bool) -> Path:
        path = _files(run / f"checkpoint-{step}", {"replay_buffer.msgpack": b"\x90", "learner/extra.pt": b"e" * 8})
        state = {"format": FORMAT, "step": step, "parts": ["replay_buffer.msgpack"],
                 **({"manifest": MANIFEST} if marked else {})}
        (path / STATE_FILE).write_text(json.dumps(state))
        if manifest:
            Storage(path).write_manifest([{"path": p.relative_to(path).as_posix(), "size": p.stat().st_size,
                                           "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                                          for p in sorted(path.rglob("*")) if p.is_file()])
        return path

    checkpoint(2, manifest=False, marked=False)  # written before manifests: accepted
    checkpoint(4, manifest=True, marked=True)
    checkpoint(6, manifest=False, marked=True)  # names a manifest it does not have: never complete
    assert [s for s, _ in complete_checkpoints(run)] == [2, 4]
    ckpt = open_checkpoint(run, cfg)
    assert ckpt.step == 4 and ckpt.manifest is not None and ckpt.source.local
    (run / "checkpoint-4" / "learner" / "extra.pt").unlink()  # a part gone: no longer complete
    assert [s for s, _ in complete_checkpoints(run)] == [2]
    ckpt = open_checkpoint(run, cfg)
    assert ckpt.step == 2 and ckpt.manifest is None and "has no manifest.json" in capsys.readouterr().out
    (run / "checkpoint-4" / "learner" / "extra.pt").write_bytes(b"e" * 8)
    (run / "checkpoint-4" / "replay_buffer.msgpack").write_bytes(b"\x91")  # same size, other bytes
    with pytest.raises(InputError, match=r"--resume .*checkpoint-4/replay_buffer.msgpack: 1 bytes"):
        open_checkpoint(run, cfg)


def test_a_restored_digest_that_differs_is_an_error():
    from agentrl.checkpointing.checkpoint import check_digest

    saved = {"module": "a" * 64, "optimizer": "b" * 64, "rng@rank1": "c" * 64}
    check_digest(saved, dict(saved), "checkpoint-2")
    with pytest.raises(InputError) as err:
        check_digest(saved, {**saved, "optimizer": "d" * 64, "rng@rank1": "e" * 64}, "checkpoint-2")
    text = str(err.value)
    assert text.startswith("--resume: the learner state restored from checkpoint-2 is not the one saved")
    assert "optimizer (saved bbbbbbbbbbbb, restored dddddddddddd)" in text and "rng@rank1 (saved cccc" in text
    assert "module" not in text


# ------------------------------------------------------------------ learner ranks on S3

@pytest.mark.integration
@pytest.mark.timeout(600)
def test_two_learner_ranks_put_their_own_parts_into_s3_and_read_them_back(ray_cluster, tmp_path, s3_endpoint):
    """A 2-rank ZeRO-3 group (each rank its own optimizer and weight partition): every rank stages
    its parts in a folder of its own, as on separate nodes, and uploads them; the manifest lists
    both ranks' files, with the sizes and hashes the ranks computed. A new 2-rank group downloads
    them, each rank for itself, and restores the same state (merged digest)."""
    import ray
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentrl.config.schema import AlgoConfig, Config, LearnerConfig
    from agentrl.learning.learner_group import LearnerGroup

    torch.manual_seed(0)
    model = tmp_path / "model"
    Qwen2ForCausalLM(Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1, vocab_size=100, max_position_embeddings=64)).save_pretrained(model)
    lcfg = LearnerConfig(lr=1e-2, micro_batch_size=2, zero_stage=3, num_ranks=2)
    ckpt = Storage(_s3_uri(s3_endpoint, _bucket(s3_endpoint), "runs")).child("job").child("checkpoint-1")

    def start() -> LearnerGroup:
        group = LearnerGroup.create(Config(learner=lcfg, algo=AlgoConfig(kl_coef=0.0)), str(model))
        assert ray.get(group.get_version.remote()) == 0
        return group

    group = start()
    try:
        saved = ray.get(group.save_parts.remote(str(tmp_path / "stage-a"), ckpt))
    finally:
        group.kill()
    names = {p["path"] for p in saved["parts"]}
    assert {"config.json", "model.safetensors", "learner/extra.pt", "learner/extra_rank1.pt"} <= names
    assert {f"learner/policy/zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt" for r in (0, 1) for kind in ("model", "optim")
            } <= names  # each rank's partitions, from its own folder
    assert {"optimizer@rank1", "rng@rank1"} <= saved["digest"].keys()
    manifest = ckpt.write_manifest(saved["parts"], step=1)
    assert not list((tmp_path / "stage-a").rglob("*"))  # the ranks removed their staging folders
    learner = [p for p in manifest["parts"] if p["path"].startswith("learner/")]
    group = start()
    try:
        assert ray.get(group.load_parts.remote(str(tmp_path / "stage-b"), ckpt, learner)) == saved["digest"]
    finally:
        group.kill()
    assert not list((tmp_path / "stage-b").rglob("*"))


# ------------------------------------------------------------------ end to end on S3

def _jsonl(data: bytes | None) -> list[dict]:
    return [json.loads(x) for x in data.decode().splitlines()] if data else []


@pytest.mark.integration
@pytest.mark.timeout(900)
@pytest.mark.heavy
def test_a_run_checkpoints_into_s3_and_resume_auto_continues_it_elsewhere(tiny_model_dir, ray_cluster, tmp_path,
                                                                        s3_endpoint, monkeypatch):
    """Run A (output folder A) checkpoints steps 2 and 3 into S3 and uploads final/ and its logs;
    checkpoint-3's manifest is then deleted (as if A had died writing it). ``--resume auto`` with
    train.steps=4 from output folder B, empty, finds checkpoint-2 in S3 as the newest complete one:
    it downloads it (the learner rank its parts, itself), restores the learner bit for bit, runs
    steps 3-4 and puts checkpoint-4, final/ and the logs into S3, pruning the incomplete checkpoint-3."""
    from agentrl.checkpointing.checkpoint import STATE_FILE
    from agentrl.cli import main
    from agentrl.config import dump_config, load_config

    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    uri = _s3_uri(s3_endpoint, _bucket(s3_endpoint), "runs")
    job = Storage(uri).child("job")

    def config(out: str) -> Path:
        path = tmp_path / f"{out}.yaml"
        path.write_text(dump_config(load_config(None, [
            f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path / out}", "run.name=job", f"run.storage={uri}",
            "tasks.heldout_size=2", "rollout.group_size=2", "rollout.tasks_per_step=2", "rollout.max_new_tokens=32",
            "learner.micro_batch_size=4", "learner.lr=1e-3", "train.steps=3", "train.checkpoint_every=2",
            "train.keep_checkpoints=2", "train.eval_at_start=false", "train.eval_at_end=false",
            "telemetry.progress=false", "telemetry.trajectories_every=0", "telemetry.ray_metrics=false",
            "telemetry.tensorboard=false"])))
        return path

    assert main(["train", str(config("a")), "--resume", "auto"]) == 0
    a = tmp_path / "a" / "job"
    assert job.complete_numbered("checkpoint-") == [2, 3] and not list(a.glob("checkpoint-*"))
    assert any(p["path"] == "learner/extra.pt" for p in job.child("checkpoint-2").complete()["parts"])
    assert job.child("final").complete() is not None and (a / "final" / "model.safetensors").exists()
    assert [r["step"] for r in _jsonl(job.read_bytes("metrics.jsonl"))] == [1, 2, 3]
    assert job.read_bytes("config.yaml") and job.read_bytes("latest") == b"checkpoint-3\n"
    job.fs.delete_file(job.child("checkpoint-3").path(MANIFEST))  # A died writing checkpoint-3
    assert job.complete_numbered("checkpoint-") == [2]

    assert main(["train", str(config("b")), "train.steps=4", "--resume", "auto"]) == 0
    b = tmp_path / "b" / "job"
    (resumed,) = _jsonl((b / "resumes.jsonl").read_bytes())
    saved = json.loads((b / "checkpoint-2" / STATE_FILE).read_text())  # its driver files, downloaded
    assert resumed["checkpoint"] == "checkpoint-2" and resumed["step"] == 2 and resumed["learner_digest_match"]
    assert resumed["learner_digest"] == saved["learner_digest"]
    assert not (b / "checkpoint-2" / "learner").exists() and not list(b.glob(".*.tmp"))  # the rank's copy is gone
    rows = _jsonl((b / "metrics.jsonl").read_bytes())  # A's rows through step 2, from S3, then B's
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["train/policy_version"] for r in rows] == [1, 2, 3, 4]
    # step 4 is the only checkpoint after the resume; the dead checkpoint-3 was pruned
    assert job.complete_numbered("checkpoint-") == [2, 4] and job.numbered("checkpoint-") == [2, 4]
    assert json.loads(job.read_bytes("checkpoint-4/trainer_state.json"))["step"] == 4
    assert [r["step"] for r in _jsonl(job.read_bytes("metrics.jsonl"))] == [1, 2, 3, 4]
    assert len(_jsonl(job.read_bytes("resumes.jsonl"))) == 1 and job.read_bytes("evals.json") is not None
    final = job.child("final").complete()
    assert {"model.safetensors", "config.json"} <= {p["path"] for p in final["parts"]}
    assert (b / "final" / MANIFEST).exists() and Storage(b / "final").complete() is not None
