"""Exact resume (``agentrl train --resume RUN``, docs/operating.md).

Without Ray: which overrides a resumed run accepts, which checkpoint it picks (never one being
written), how the logs are cut back to the checkpoint, the task sampler's and the RODS queue's
state. With DeepSpeed in-process: the learner's state round trip is bitwise (weights, AdamW,
LR schedule, counters, critic, explorer, RNG) and the restored learner's next step equals the
uninterrupted one's, for ZeRO 0-3 and bf16. End to end: a real `agentrl train` subprocess is
SIGKILLed after a checkpoint and resumed through the CLI.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from agentrl.api import Episode, EpisodeGroup
from agentrl.cli import main
from agentrl.config import ConfigError, InputError, dump_config, load_config
from agentrl.config.resume import changed_keys, load_resume_config, resumable
from agentrl.telemetry.metrics import METRICS_FILE, MetricsSink, keep_steps_through

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_MODEL = ROOT / "agentrl" / "assets" / "tiny-agent"


def _run_dir(tmp_path: Path, *overrides: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    cfg = load_config(None, [f"model.path={SHIPPED_MODEL}", "learner.lr=1e-4", *overrides])
    (run / "config.yaml").write_text(dump_config(cfg))
    return run


# ------------------------------------------------------------------ the resumed config

def test_resume_accepts_only_overrides_that_leave_the_math_alone(tmp_path):
    run = _run_dir(tmp_path)
    cfg = load_resume_config(run, ["train.steps=40", "telemetry.tensorboard=false", "train.eval_every=5",
                                   "runtime.num_cpus=8", "learner.lr=1e-4",  # the same lr: no change
                                   "learner.micro_batch_size=1"])  # a memory lever: the same update
    assert cfg.train.steps == 40 and not cfg.telemetry.tensorboard and cfg.learner.lr == 1e-4
    assert cfg.learner.micro_batch_size == 1
    assert cfg.model.path == str(SHIPPED_MODEL)  # the original model stays the reference
    for override, key in [("learner.lr=1e-3", "learner.lr"), (f"model.path={tmp_path}", "model.path"),
                          ("rollout.group_size=2", "rollout.group_size"), ("run.seed=3", "run.seed"),
                          ("learner={lr: 0.5}", "learner.lr")]:
        with pytest.raises(ConfigError) as err:
            load_resume_config(run, ["train.steps=40", override])
        text = str(err.value)
        assert text.startswith(f"{run / 'config.yaml'}: {key}: cannot change on --resume"), text
        assert f"set by override '{override}'" in text and "train.steps" in text
    with pytest.raises(ConfigError, match="no such run folder"):
        load_resume_config(tmp_path / "nope")
    with pytest.raises(ConfigError, match="rollout.group_size: Input should be greater"):
        load_resume_config(run, ["rollout.group_size=1"])  # invalid values are reported as usual


def test_resumable_keys_and_changed_keys():
    assert resumable("telemetry.jsonl") and resumable("train.steps") and resumable("runtime.rollout_worker_resources.x")
    assert not resumable("train.async_rollouts") and not resumable("train") and not resumable("telemetryx")
    # a job moved to GPUs, or given other timeouts, continues the same run
    assert resumable("runtime.learner_gpus") and resumable("rollout.engine.tensor_parallel_size")
    assert resumable("runtime.rollout_timeout_s") and not resumable("run.storage")
    a, b = load_config(None), load_config(None, ["tools.sgls={endpoint: {base_url: http://x, model: m}}", "train.steps=3"])
    assert "train.steps" in changed_keys(a, b) and "tools.sgls" in changed_keys(a, b)


def test_cli_resume_errors_exit_2_before_ray(tmp_path, capsys):
    run = _run_dir(tmp_path)
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --resume {run}: no complete checkpoint"), err
    assert main(["train", "--resume", str(run), "learner.lr=0.5"]) == 2
    assert "learner.lr: cannot change on --resume" in capsys.readouterr().err
    assert main(["train", "--resume", str(run), str(ROOT / "configs" / "quickstart.yaml")]) == 2
    assert "give no CONFIG" in capsys.readouterr().err
    assert main(["train"]) == 2 and "--resume RUN" in capsys.readouterr().err
    _fake_checkpoint(run, 3)
    assert main(["train", "--resume", str(run), "train.steps=2"]) == 2
    assert "train.steps=2: checkpoint-3 is already at step 3" in capsys.readouterr().err
    assert not (run / "tasks.jsonl").exists() and sorted(p.name for p in run.iterdir()) == ["checkpoint-3", "config.yaml"]


def test_a_format_2_checkpoint_reads_as_the_parts_of_today(tmp_path):
    """Checkpoints written before the driver's parts had files of their own (format 2: the driver's
    state in trainer_state.json, the rollouts launched ahead in rollouts.msgpack) resume: each
    part's state reads as that part saves it now."""
    from agentrl.checkpointing.checkpoint import (
        BUFFER_FILE,
        ROLLOUTS_FILE,
        SAMPLER_PART,
        SCHEDULER_PART,
        STATE_FILE,
        TRAINER_PART,
        Checkpoint,
    )
    from agentrl.checkpointing.records import pack

    path = tmp_path / "checkpoint-4"
    path.mkdir()
    state = {"format": 2, "step": 4, "version": 4, "due": None, "evals": {"start": {"success": 0.5}},
             "sampler": {"seed": 7}, "quarantined": ["t9"], "pool_log_bytes": 0}
    (path / STATE_FILE).write_text(json.dumps(state))
    (path / BUFFER_FILE).write_bytes(pack({"counters": {"added": 3}, "groups": []}))
    ckpt = Checkpoint(path, state)
    assert ckpt.part_state(TRAINER_PART) == {"version": 4, "evals": {"start": {"success": 0.5}}}
    assert ckpt.part_state(SAMPLER_PART) == {"seed": 7}
    # no rollouts launched ahead (sync mode): the engines load the checkpoint's version
    assert ckpt.part_state(SCHEDULER_PART) == {"due": 4, "quarantined": ["t9"], "ahead": []}
    assert ckpt.part_state(BUFFER_FILE) == {"counters": {"added": 3}, "groups": []}  # the same file then and now
    ahead = [{"step": 5, "calls": [{"summaries": [], "groups": []}]}]
    (path / ROLLOUTS_FILE).write_bytes(pack(ahead))
    ckpt.state["due"] = 5
    assert ckpt.part_state(SCHEDULER_PART) == {"due": 5, "quarantined": ["t9"], "ahead": ahead}


# ------------------------------------------------------------------ checkpoint folders

def _fake_checkpoint(run: Path, step: int, complete: bool = True) -> Path:
    from agentrl.checkpointing.checkpoint import FORMAT, STATE_FILE

    path = run / f"checkpoint-{step}"
    path.mkdir()
    if complete:
        (path / STATE_FILE).write_text(json.dumps({"format": FORMAT, "step": step}))
    return path


def test_resume_picks_the_newest_complete_checkpoint_never_one_being_written(tmp_path):
    from agentrl.checkpointing.checkpoint import LATEST, find_checkpoint
    from agentrl.common.files import atomic_write

    assert find_checkpoint(tmp_path) is None
    _fake_checkpoint(tmp_path, 2)
    atomic_write(tmp_path / LATEST, b"checkpoint-2\n")
    assert find_checkpoint(tmp_path).name == "checkpoint-2"
    (tmp_path / ".checkpoint-4.tmp").mkdir()  # the process died writing it
    (tmp_path / ".checkpoint-4.tmp" / "model.safetensors").write_bytes(b"partial")
    _fake_checkpoint(tmp_path, 6, complete=False)  # no trainer_state.json: never resumed from
    assert find_checkpoint(tmp_path).name == "checkpoint-2"
    _fake_checkpoint(tmp_path, 10)  # renamed, but the process died before `latest` named it
    assert find_checkpoint(tmp_path).name == "checkpoint-10"
    assert (tmp_path / LATEST).read_text() == "checkpoint-2\n" and not list(tmp_path.glob(".latest*.tmp"))


def test_logs_are_cut_back_to_the_checkpoint(tmp_path):
    path = tmp_path / METRICS_FILE
    rows = [{"step": 0, "eval/success": 0.1}, {"step": 1, "elapsed_s": 5.0}, {"step": 2, "elapsed_s": 9.0},
            {"step": 2, "eval/success": 0.3}, {"step": 3, "elapsed_s": 14.0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "elap')  # torn last line
    assert keep_steps_through(path, 2) == rows[:4]
    assert [json.loads(x) for x in path.read_text().splitlines()] == rows[:4]
    assert keep_steps_through(tmp_path / "nope.jsonl", 2) == []

    sink = MetricsSink(tmp_path, None, resume_after=1)  # resumed after step 1: rows of 2 go, elapsed goes on
    sink.log(2, {"train/success": 0.5})
    sink.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2] and lines[-1]["elapsed_s"] >= 5.0
    assert any((tmp_path / "tb").iterdir())


def test_reopening_a_run_folder_cuts_its_logs_and_says_so(tmp_path, capsys):
    """What ``agentrl train --resume`` does first, without Ray: the config saved, half-written
    checkpoints removed, each log cut back to its size at the checkpoint, one line said."""
    from agentrl.checkpointing.checkpoint import FORMAT, POOL_LOG, Checkpoint, reopen_run_dir
    from agentrl.config import load_config

    path = _fake_checkpoint(tmp_path, 2)
    (tmp_path / POOL_LOG).write_text("0123456789")
    (tmp_path / ".checkpoint-4.tmp").mkdir()
    cfg = load_config(None, ["train.steps=5"])
    assert reopen_run_dir(Checkpoint(path, {"format": FORMAT, "step": 2, "logs": {POOL_LOG: 4}}), cfg) == tmp_path
    assert (tmp_path / POOL_LOG).read_text() == "0123" and not (tmp_path / ".checkpoint-4.tmp").exists()
    assert (tmp_path / "config.yaml").is_file()
    assert capsys.readouterr().out == f"agentrl: resuming run {tmp_path} from checkpoint-2 (step 2 of 5)\n"


def _rows(step: int) -> list[dict]:
    return [{"step": step, "task_id": f"t{step}", "group_id": "g", "index": 0, "policy_version": step - 1, "outcome": 1.0,
             "progress": 1.0, "termination": "done", "n_turns": 1, "turn_passed": [True], "tokens": 3, "policy_tokens": 1,
             "prompt_tokens": 1, "call_blocks": 0, "valid_calls": 0, "gen_seconds": 0.0, "env_seconds": 0.0,
             "rewards": "{}", "calls": "[]", "messages": [{"role": "prompt", "turn": 0, "text": "x"}]}]


def test_trajectory_files_after_the_checkpoint_are_dropped(tmp_path):
    from agentrl.telemetry.trajectories import TrajectoryLog, discard_after, read_trajectories

    out = tmp_path / "trajectories"
    log = TrajectoryLog(out, every=2)
    for step in range(1, 6):
        log.add(step, _rows(step))  # steps 1-2 and 3-4 complete, 5 in a partial file
    names = sorted(p.name for p in out.iterdir())
    assert names == [".steps-000005.partial", "steps-000001-000002.parquet", "steps-000003-000004.parquet"]
    discard_after(out, 3)
    assert sorted(p.name for p in out.iterdir()) == ["steps-000001-000002.parquet", "steps-000003-000003.parquet"]
    assert [r["step"] for r in read_trajectories(tmp_path)] == [1, 2, 3]


# ------------------------------------------------------------------ driver state

def _tasks(n: int) -> list:
    from agentrl.envs.builtin.generator import generate_tasks

    return generate_tasks(n, seed=7, id_prefix="t")


@pytest.mark.parametrize("fresh", [False, True])
def test_task_sampler_resumes_its_draws(fresh):
    from agentrl.driver.task_sources import TaskSampler

    cfg = load_config(None, [f"tasks.fresh_train={str(fresh).lower()}", "run.seed=3"])
    tasks = _tasks(5)
    a = TaskSampler(cfg, tasks, set())
    for _ in range(3):
        a.next(2)  # mid-pass: 6 of a 5-task pass drawn
    state = json.loads(json.dumps(a.state_dict()))
    b = TaskSampler(cfg, tasks, set())
    b.load_state_dict(state)
    assert [[t.id for t in a.next(2)] for _ in range(4)] == [[t.id for t in b.next(2)] for _ in range(4)]
    if not fresh:
        with pytest.raises(InputError, match="tasks.train: the training tasks are not the ones"):
            TaskSampler(cfg, _tasks(4), set()).load_state_dict(state)


def test_rods_queue_and_running_job_survive(tmp_path):
    from agentrl.driver.synthesis_actor import restore_queue

    t1, t2 = _tasks(2)
    state = {"step": 30, "synthesis_queue": [{"step": 28, "task": t1.model_dump(mode="json")},
                                             {"step": 30, "task": t2.model_dump(mode="json")}]}
    assert restore_queue(state) == [(28, t1), (30, t2)]
    assert restore_queue(state, renumber=True) == [(-2, t1), (0, t2)]  # rods.resume_from: a new run's steps
    assert restore_queue({"step": 3}) == []  # a pool saved before the queue was


def test_group_payloads_round_trip_through_msgpack():
    from agentrl.checkpointing.records import pack, unpack

    ep = Episode("t", [1, 2, 3], [0, 1, 1], [0.0, -0.123456789012345, -1e-300], [0, 1, 1], 1, [True, False], 2,
                 calls=[[{"name": "f", "arguments": {"a": [1, None, "x"], "2": {}}, "observation": "ok"}]],
                 rewards={"outcome": 0.5, "progress": 1 / 3}, step_spans=[[1, 3]], step_turns=[0], step_states=["s"],
                 answers=[None, "done"])
    group = EpisodeGroup("t", "t@v2#7", 2, [ep, ep], wall_seconds=1.5, mix_key="7/0")
    assert EpisodeGroup.from_dict(unpack(pack(group.to_dict()))) == group


# ------------------------------------------------------------------ the learner (DeepSpeed in-process)

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=300, tie_word_embeddings=True, max_position_embeddings=128)
    path = tmp_path_factory.mktemp("tiny_qwen2")
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return str(path)


def _batch(kind: str) -> dict:
    import torch

    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (12, 9, 15, 7)]
    mask = [[0] * 4 + [1] * (len(s) - 4) for s in seqs]
    per_token = [[a * m for m in mk] for a, mk in zip([1.0, -1.0, 1.0, -1.0], mask)]
    return {"input_ids": seqs, "response_mask": mask, ("token_rewards" if kind == "ppo" else "advantages"): per_token}


@pytest.mark.integration
@pytest.mark.parametrize("zero, dtype, kind", [(0, "float32", "grpo"), (1, "float32", "ppo"), (2, "bfloat16", "grpo"),
                                               (3, "float32", "grpo"), (0, "float32", "rspo"), (0, "bfloat16", "grpo")])
def test_learner_state_round_trip_is_bitwise(model_dir, tmp_path, zero, dtype, kind):
    """Save after two steps (mid warm-up), restore into a learner built from the original model,
    and the restored one holds the same weights, AdamW state, LR-schedule position, counters,
    critic, explorer and RNG, bit for bit; its next step equals the uninterrupted learner's."""
    import torch

    from agentrl.api import TrainBatch
    from agentrl.config import Config
    from agentrl.config.schema import AlgoConfig, CriticConfig, LearnerConfig, RspoConfig
    from agentrl.engines.deepspeed_learner import DeepSpeedLearner
    from agentrl.engines.learner_state import load_learner_state, save_learner_state, state_digest
    from agentrl.methods.rspo import RspoMethod

    algo = AlgoConfig(kl_coef=0.01)
    if kind == "ppo":
        algo = AlgoConfig(advantage="ppo", kl_coef=0.0, critic=CriticConfig(lr=1e-2))
    rspo = RspoConfig(enabled=True, explorer_lr=1e-2, refresh_every=2) if kind == "rspo" else None
    lcfg = LearnerConfig(zero_stage=zero, lr=1e-3, micro_batch_size=2, warmup_steps=4)
    batch = _batch(kind)

    def build():
        methods = [RspoMethod(Config(algo=algo, rspo=rspo))] if rspo is not None else ()
        return DeepSpeedLearner(model_dir, lcfg, algo, dtype, seed=0, methods=methods)

    a, b = build(), build()
    try:
        fresh = state_digest(b)
        for _ in range(2):
            a.train_step(batch)
            if rspo is not None:
                a.parts["rspo"].derive(TrainBatch(**batch))
        saved = save_learner_state(a, tmp_path / "learner")
        changed = {"module", "optimizer", "lr_scheduler", "counters"} | ({"critic"} if kind == "ppo" else set())
        assert {k for k in saved if saved[k] != fresh[k]} >= changed  # the digest sees what two steps changed
        torch.manual_seed(123)  # the restore must set the RNG, not inherit it
        assert load_learner_state(b, tmp_path / "learner") == saved
        assert b.version == 2 and b.engine.get_lr() == a.engine.get_lr() == [1e-3 * 3 / 4]
        if rspo is not None:
            explorer = b.parts["rspo"].explorer
            assert explorer.derivations == 2 and explorer.model is not None
        ma, mb = a.train_step(batch), b.train_step(batch)
        assert ma["loss"] == mb["loss"] and ma["lr"] == mb["lr"] == 1e-3 * 3 / 4  # the third step of the warm-up
        assert state_digest(a) == state_digest(b) != saved
    finally:
        a.close()
        b.close()


# ------------------------------------------------------------------ end to end: SIGKILL, then --resume

def _wait_for(predicate, proc, timeout_s: float, what: str, log: Path | None = None):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:]) if log and log.exists() else ""
            pytest.fail(f"the training process ended (rc {proc.returncode}) before {what}; its output ended:\n{tail}")
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _kill_process_group(proc, ray_dir: str) -> list[int]:
    """SIGKILL the training process's group (the driver, its embedded Ray and the engines it
    started). Processes of that Ray cluster still alive 30 s later (outside the group, or not dead
    yet) are killed by pid and returned: none are expected."""
    import signal
    import time

    import psutil

    def ours() -> list:
        found = []
        for p in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if p.info["status"] != psutil.STATUS_ZOMBIE and p.pid != os.getpid() and (
                        os.getpgid(p.pid) == proc.pid or ray_dir in " ".join(p.info["cmdline"] or [])):
                    found.append(p)
            except (psutil.Error, ProcessLookupError):
                continue
        return found

    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while (left := ours()) and time.monotonic() < deadline:
        time.sleep(0.5)
    for p in left:
        p.kill()
    return [p.pid for p in left]


@pytest.mark.integration
@pytest.mark.timeout(2400)
@pytest.mark.heavy
def test_a_sigkilled_run_resumes_exactly(tiny_model_dir, ray_cluster, tmp_path):
    """`agentrl train` (a subprocess, checkpoints every 2 steps) is SIGKILLed, with its Ray and
    engines, once step 3 is logged: the newest complete checkpoint is step 2, and step 3 was
    rolled out, trained and logged past it. `agentrl train --resume RUN` then runs steps 3-4.

    * step 3 of the resumed run trains on the very tasks the killed (so far uninterrupted) run drew
      for step 3; every step's tasks are logged once;
    * the learner state the resumed run loaded is the one checkpoint-2 saved, bit for bit (the
      digest of the live state at the save and after the load: weights, AdamW, LR schedule,
      counters, RNG), and Adam goes on counting: 2 steps in checkpoint-2, 4 in checkpoint-4;
    * metrics.jsonl has exactly one row per step, trajectories one set of episodes per step."""
    import subprocess
    import sys
    import tempfile
    import time

    import torch

    from agentrl.checkpointing.checkpoint import LATEST, STATE_FILE
    from agentrl.telemetry.trajectories import read_trajectories

    config = tmp_path / "run.yaml"
    config.write_text(dump_config(load_config(None, [
        f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path / 'runs'}", "run.name=res", "tasks.heldout_size=2",
        "rollout.group_size=2", "rollout.tasks_per_step=2", "rollout.max_new_tokens=48", "learner.micro_batch_size=4",
        "learner.lr=1e-3", "learner.warmup_steps=3", "train.steps=4", "train.checkpoint_every=2",
        "train.eval_at_start=false", "train.eval_at_end=false", "telemetry.progress=false",
        "telemetry.trajectories_every=1", "telemetry.ray_metrics=false"])))
    ray_dir = tempfile.mkdtemp(prefix="arl-kill-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "RAY_TMPDIR": ray_dir}
    env.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "agentrl", "train", str(config)], cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        run = _wait_for(lambda: next((tmp_path / "runs").glob("res-*"), None), proc, 300, "the run folder",
                        tmp_path / "killed.log")
        _wait_for(lambda: any(r.get("step") == 3 for r in _jsonl(run / METRICS_FILE)), proc, 1800, "step 3's metrics",
                  tmp_path / "killed.log")
    finally:
        strays = _kill_process_group(proc, ray_dir)
        shutil.rmtree(ray_dir, ignore_errors=True)
    t_killed = time.monotonic() - t0
    assert (run / LATEST).read_text().strip() == "checkpoint-2"
    assert [r["step"] for r in _jsonl(run / METRICS_FILE)] == [1, 2, 3]  # step 3 is past the checkpoint
    killed_tasks = {r["step"]: r["task_ids"] for r in _jsonl(run / "tasks.jsonl")}
    assert sorted(killed_tasks) == [1, 2, 3]
    (run / ".checkpoint-3.tmp").mkdir()  # as if the process had died writing a checkpoint
    (run / ".checkpoint-3.tmp" / "model.safetensors").write_bytes(b"torn")

    t1 = time.monotonic()
    assert main(["train", "--resume", str(run), "telemetry.progress=false"]) == 0
    t_resumed = time.monotonic() - t1
    print(f"killed run: {t_killed:.0f}s (strays after killpg: {strays}); resumed run: {t_resumed:.0f}s")

    (resumed,) = _jsonl(run / "resumes.jsonl")
    saved = json.loads((run / "checkpoint-2" / STATE_FILE).read_text())
    assert resumed["checkpoint"] == "checkpoint-2" and resumed["step"] == 2 and resumed["version"] == 2
    assert resumed["learner_digest_match"] and resumed["learner_digest"] == saved["learner_digest"]
    tasks = _jsonl(run / "tasks.jsonl")
    assert [r["step"] for r in tasks] == [1, 2, 3, 4]
    assert {r["step"]: r["task_ids"] for r in tasks if r["step"] <= 3} == killed_tasks  # step 3 drew the same tasks
    rows = _jsonl(run / METRICS_FILE)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["train/policy_version"] for r in rows] == [1, 2, 3, 4]
    # the resumed engines got the checkpoint's weights before step 3: on-policy, logprobs agree with the learner
    assert all(r["train/policy_lag"] == 0 and r["learner/logprob_mismatch"] < 1e-3 for r in rows), rows
    assert [r["learner/lr"] for r in rows] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3])  # warm-up went on
    assert sorted(r["step"] for r in read_trajectories(run)) == [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4
    assert (run / LATEST).read_text().strip() == "checkpoint-4" and not list(run.glob(".checkpoint-*"))
    for step, adam_steps in ((2, 2), (4, 4)):  # learner.zero_stage=1 (default): Adam's state is in ZeRO's file
        policy = run / f"checkpoint-{step}" / "learner" / "policy"
        optim = torch.load(policy / "zero_pp_rank_0_mp_rank_00_optim_states.pt", weights_only=False)
        adam = optim["optimizer_state_dict"]["base_optimizer_state"]["state"]
        assert {float(s["step"]) for s in adam.values()} == {adam_steps}
        assert torch.load(policy / "mp_rank_00_model_states.pt", weights_only=False)["lr_scheduler"]["last_epoch"] == adam_steps
    assert strays == []  # the process group took the embedded Ray and the engines with it
    assert (run / "final" / "model.safetensors").exists()


@pytest.mark.integration
@pytest.mark.timeout(2400)
@pytest.mark.heavy
def test_async_rods_run_resumed_from_a_checkpoint_continues_bit_for_bit(tiny_model_dir, ray_cluster, tmp_path):
    """train.async_rollouts with RODS: the checkpoint after step 2 holds step 3's rollouts (in
    flight, on the weights before step 2's update) and the pool. A run resumed from it trains step
    3 on those very episodes, so its learner after step 3 equals, bit for bit, the learner of the
    run that went on without stopping, and step 4 draws the same tasks from the restored pool."""
    import ray

    from agentrl.checkpointing.checkpoint import SCHEDULER_PART, open_checkpoint, reopen_run_dir
    from agentrl.driver.task_sources import load_task_sources
    from agentrl.driver.trainer import Trainer

    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path}", "tasks.heldout_size=2", "rollout.group_size=2",
        "rollout.tasks_per_step=2", "rollout.max_new_tokens=48", "learner.micro_batch_size=4", "learner.lr=1e-3",
        "algo.entropy_coef=0.01", "train.async_rollouts=true", "rods.enabled=true", "train.steps=4",
        "train.checkpoint_every=2", "telemetry.progress=false", "telemetry.trajectories_every=0",
        "telemetry.tensorboard=false", "telemetry.ray_metrics=false"])
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(cfg))

    def go_on(trainer, first: int) -> tuple[dict, dict, list]:
        """Steps ``first``..3; the learner's digest after step 3 and step 4's tasks (in flight by then)."""
        for step in range(first, 4):
            m = trainer.step(step)
            trainer.metrics.log(step, m)
            if step == 2:
                trainer.checkpoint(2)
        digest = ray.get(trainer.learner.save_state.remote(str(tmp_path / f"after3-{first}")))
        results, _ = trainer.scheduler.pending()
        assert list(results) == [4]  # step 4's rollouts, launched ahead
        return m, digest, [s.task_id for sums, _ in results[4] for s in sums]

    a = Trainer(cfg, run, load_task_sources(cfg))
    try:
        m_a, digest_a, next_a = go_on(a, 1)
    finally:
        a.shutdown()  # and end its actors, as the driver's death would: their CPUs are the resumed run's
        for actor in [*a.learner.ranks, a.buffer, a.rods, *a.workers, *a.rollout_side.pool.actors]:
            ray.kill(actor)
    ckpt = open_checkpoint(run, cfg)
    scheduler = ckpt.part_state(SCHEDULER_PART)  # the version due and step 3's rollouts, launched ahead
    assert ckpt.step == 2 and scheduler["due"] == 2 and [a["step"] for a in scheduler["ahead"]] == [3]
    reopen_run_dir(ckpt, cfg)
    b = Trainer(cfg, run, load_task_sources(cfg, resuming=True), resume=ckpt)
    try:
        m_b, digest_b, next_b = go_on(b, 3)
    finally:
        b.shutdown()
    assert digest_b == digest_a  # weights, AdamW, LR schedule, counters, RNG after step 3
    for key in ("learner/loss", "learner/pg_loss", "learner/entropy", "learner/grad_norm", "learner/lr",
                "train/policy_tokens", "train/policy_lag", "pool/size", "pool/observed"):
        assert key in m_a and m_b[key] == m_a[key], key
    assert next_b == next_a and len(next_a) == 2
    assert [r["step"] for r in _jsonl(run / METRICS_FILE)] == [1, 2, 3]
    assert [r["step"] for r in _jsonl(run / "tasks.jsonl")] == [1, 2, 3]
