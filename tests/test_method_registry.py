"""The method registry (agentrl/methods/registry.py): registration is checked, a method turns
itself on from the config, a registered method travels to another process by name, and a
method registered from this one file changes a step's groups end to end (``prepare_step``
without Ray; the learner actor through Ray).

This module is itself a method plugin (``algo.plugins`` names this file): importing it
registers ``flip_outcome``, which is on only for runs named "flip-outcome".
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from agentrl.api import Episode, EpisodeGroup
from agentrl.config import load_config
from agentrl.learning.step import prepare_step
from agentrl.methods import registry
from agentrl.methods.base import Method, RolloutRole
from agentrl.methods.registry import active_methods, extra_roles, register_method

ROOT = Path(__file__).resolve().parents[1]
HERE = str(Path(__file__).resolve())


@register_method
class FlipOutcome(Method):
    """Test method: the policy trains on 1 - outcome; counts its groups after the update."""

    name = "flip_outcome"

    @classmethod
    def enabled(cls, cfg):
        return cfg.run.name == "flip-outcome"  # off for every other test's config

    def trained_groups(self, groups):
        return [replace(g, episodes=[replace(e, rewards={**e.rewards, "outcome": 1.0 - e.rewards["outcome"]})
                                     for e in g.episodes]) for g in groups]

    def after_update(self, learner, groups, metrics):
        metrics["flip_outcome/groups"] = float(len(groups))


def _cfg(*more: str):
    return load_config(None, [f"algo.plugins=[{HERE}]", "algo.reward=outcome", *more])


def _episode(outcome: float) -> Episode:
    """6 tokens (ids the tiny model knows), 3 of them the policy's."""
    return Episode("t", [1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 0, 1], [0.0, 0.0, -0.5, -0.5, 0.0, -0.5], [0, 0, 1, 1, 0, 1], 2,
                   [outcome == 1.0], 1, rewards={"outcome": outcome, "progress": outcome})


def _group() -> EpisodeGroup:
    return EpisodeGroup("t", "g", 0, [_episode(1.0), _episode(0.0), _episode(0.0)])


@pytest.fixture
def scratch(monkeypatch):
    """Registrations made by the test are gone after it."""
    monkeypatch.setattr(registry, "_REGISTRY", registry._REGISTRY.copy())


def test_registration_is_checked(scratch):
    with pytest.raises(TypeError, match="needs a Method subclass"):
        register_method(type("NotAMethod", (), {"name": "x"}))
    with pytest.raises(ValueError, match="name must be an identifier"):
        register_method(type("BadName", (FlipOutcome,), {"name": "flip-outcome"}))
    with pytest.raises(TypeError, match="implement the classmethod enabled"):
        register_method(type("NoSwitch", (Method,), {"name": "no_switch"}))
    with pytest.raises(TypeError, match="keeps_policy_copy must be a bool"):
        register_method(type("BadFlag", (FlipOutcome,), {"name": "bad_flag", "keeps_policy_copy": 1}))
    with pytest.raises(ValueError, match="already registered by .*FlipOutcome"):
        register_method(type("Other", (FlipOutcome,), {"name": "flip_outcome"}))
    assert register_method(FlipOutcome) is FlipOutcome  # its module imported again: replaced, no clash


def test_a_method_turns_itself_on_from_the_config():
    on, off = _cfg("run.name=flip-outcome"), _cfg()
    assert [m.name for m in active_methods(on)] == ["flip_outcome"] and active_methods(off) == []
    assert "flip_outcome" in registry.method_names()


def test_rollout_roles_are_checked(scratch):
    with pytest.raises(ValueError, match="other than 'policy'"):
        RolloutRole("policy", 1, "x.workers", 1)
    with pytest.raises(ValueError, match="at least one worker"):
        RolloutRole("scout", 0, "x.workers", 1)
    with pytest.raises(ValueError, match="may not set dtype"):
        RolloutRole("scout", 1, "x.workers", 1, engine_update={"dtype": "float32"})

    def with_role(name: str):
        role = RolloutRole("scout", 1, f"{name}.workers", 1)
        return type(name, (FlipOutcome,), {"name": name, "rollout_roles": lambda self: [role]})

    register_method(with_role("first"))
    assert [r.workers_key for r in extra_roles(_cfg("run.name=flip-outcome"))] == ["first.workers"]
    register_method(with_role("second"))
    with pytest.raises(ValueError, match="same name"):
        extra_roles(_cfg("run.name=flip-outcome"))


def test_a_fresh_process_builds_the_method_once_it_loads_the_configs_plugins():
    """What the learner actor does with the config it is handed: nothing arrives pickled but the
    config, so the method is unknown there until ``load_plugins(cfg.plugins)`` imports this file."""
    cfg = _cfg("run.name=flip-outcome")
    code = ("import pickle, sys; from agentrl.common.plugins import load_plugins; "
            "from agentrl.methods.registry import active_methods; cfg = pickle.loads(sys.stdin.buffer.read()); "
            "print(len(active_methods(cfg))); load_plugins(cfg.plugins); "
            "[m] = active_methods(cfg); print(m.name, type(m).__name__, m.cfg.run.name)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True,
                         input=pickle.dumps(cfg)).stdout
    assert out.decode().split() == ["0", "flip_outcome", "FlipOutcome", "flip-outcome"]


def test_the_method_flips_the_advantages_of_a_step():
    """GRPO on outcomes (1, 0, 0) and, flipped by the method, (0, 1, 1): the same deviations from
    the group mean with the sign turned, over the same std, so every advantage is negated."""
    on, off = _cfg("run.name=flip-outcome"), _cfg()
    flipped = prepare_step([_group()], active_methods(on), on.algo, seed=0, version=0).batch.advantages
    plain = prepare_step([_group()], active_methods(off), off.algo, seed=0, version=0).batch.advantages
    assert any(any(row) for row in plain)
    assert flipped == [pytest.approx([-a for a in row]) for row in plain]


@pytest.mark.integration
def test_the_method_reaches_the_learner_actor(tiny_model_dir, ray_cluster):
    """Handed the config, the learner actor (another process, which never imported this file)
    loads its plugins and builds the method from it; its hooks run there; the step's metrics keep its
    namespace out of learner/."""
    import ray

    from agentrl.api import GroupRef
    from agentrl.learning.learner import LearnerActor
    from agentrl.telemetry.summaries import STEP_TIMINGS, step_metrics

    cfg = _cfg("run.name=flip-outcome", "algo.kl_coef=0.0")
    learner = LearnerActor.options(num_cpus=1).remote(cfg, str(tiny_model_dir))
    try:
        m = ray.get(learner.train.remote([GroupRef(ray.put(_group()), 0)]))
    finally:
        ray.kill(learner)
    assert m["flip_outcome/groups"] == 1.0 and m["tokens"] == 9
    out = step_metrics([], dict.fromkeys(STEP_TIMINGS, 0.0), m, 1, namespaces=("flip_outcome/",))
    assert "flip_outcome/groups" in out and "learner/flip_outcome/groups" not in out and "learner/tokens" in out
