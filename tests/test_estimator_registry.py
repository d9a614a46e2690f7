"""The advantage-estimator registry (agentrl/algos/registry.py, docs/design.md §9).

* the name table and the implementations agree, and the table stays importable without torch;
* the config's prerequisites come from the table's flags (one case per flag, on toy estimators);
* an estimator registered in THIS file reaches the learner's Ray actor through ``algo.plugins``
  (the file's path) and trains a step through the real stack.

This module is itself the plugin of the last test: importing it registers ``sign``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.algos import estimators, registry
from agentrl.algos.batching import build_batch
from agentrl.algos.registry import Estimator, register_estimator
from agentrl.api import Episode, EpisodeGroup
from agentrl.common.plugins import load_plugins
from agentrl.config import ConfigError, load_config
from agentrl.config.schema import KNOWN_ADVANTAGES

ROOT = Path(__file__).resolve().parents[1]
HERE = str(Path(__file__).resolve())


@register_estimator
class Sign(Estimator):
    """A_i = +1 if r_i > mean(r), -1 if r_i < mean(r), 0 if equal, on every policy token."""

    name = "sign"
    description = "+1 above the group's mean reward, -1 below, 0 at it (a toy, tests/test_estimator_registry.py)"

    def compute(self, episodes, algo, kl_penalty=None):
        r = estimators.episode_rewards(episodes, algo, kl_penalty)
        return estimators.broadcast(torch.sign(r - r.mean()), episodes)


# ------------------------------------------------------------------ a hand-made group

def _episode(passed: bool, process: float, summary: float, state: str) -> Episode:
    """8 tokens: prompt [0, 2), a tool step [2, 5), an observation at 5, a summary step [6, 8)."""
    return Episode(**{"task_id": "t", "prompt_len": 2,
        "token_ids": list(range(8)), "response_mask": [0, 0, 1, 1, 1, 0, 1, 1], "logprobs": [0.0, 0.0] + [-0.5] * 6,
        "segments": [0, 0, 1, 1, 1, 0, 2, 2], "step_spans": [[2, 5], [6, 8]], "step_turns": [0, 0],
        "step_states": ["s0", state], "turn_passed": [passed], "n_turns": 1,
        "rewards": {"progress": float(passed), "outcome": float(passed), "process": process, "summary": summary},
    })


GROUP = EpisodeGroup("t", "g", 0, [
    _episode(True, 1.0, 1.0, "a"), _episode(False, 0.5, -0.5, "b"), _episode(True, 0.8, 0.5, "a"), _episode(False, 0.2, 0.0, "c"),
])


def _config(*overrides: str):
    return load_config(None, list(overrides))


# ------------------------------------------------------------------ (a) table <-> implementations

def _needed(name: str) -> list[str]:
    est = registry.get_estimator(name)
    return ["algo.critic.lr=1e-5"] if est.needs_critic else []


def test_every_name_in_the_table_has_an_implementation_and_vice_versa():
    builtins = registry.builtin_estimator_names()
    assert set(builtins) == KNOWN_ADVANTAGES == {"grpo", "dr_grpo", "rloo", "raft", "gigpo", "turn_grpo", "ppo", "slca"}
    # every Estimator class of the built-in module is in the table, under its own name
    classes = {c for c in vars(estimators).values() if isinstance(c, type) and issubclass(c, Estimator) and c is not Estimator}
    assert {c.name for c in classes} == set(builtins)
    for name in registry.estimator_names():  # built-ins and this file's toy
        est = registry.get_estimator(name)
        assert est.name == name and type(est).compute is not Estimator.compute
        assert all(isinstance(getattr(est, flag), bool) for flag in registry.FLAGS)
        # ... and it runs: one per-token tensor per episode, of the episode's length
        cfg = _config(f"algo.advantage={name}", *_needed(name))
        per_token, signal = est.compute(GROUP.episodes, cfg.algo)
        assert [t.shape for t in per_token] == [(8,)] * 4 and signal, name
        batch, stats = build_batch([GROUP], cfg.algo)
        assert len(batch.token_rewards if est.needs_critic else batch.advantages) == 4 and stats["groups_with_signal"] == 1.0


def test_the_configuration_reference_lists_every_builtin_with_its_description():
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    for name in registry.builtin_estimator_names():
        assert f"* `{name}`: {registry.get_estimator(name).description}" in text
    assert "`sign`" not in text  # plugins are not part of the reference


def test_the_table_and_config_validation_import_no_torch():
    code = ("import sys; from agentrl.config import load_config; import agentrl.algos.estimators; "
            "load_config(None, ['algo.advantage=gigpo']); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    assert out.strip() == "False"


def test_sign_estimator_by_hand():
    per_token, signal = registry.get_estimator("sign").compute(GROUP.episodes, _config().algo)
    # progress rewards 1, 0, 1, 0: mean 0.5
    assert [t.tolist() for t in per_token][:2] == [[0, 0, 1, 1, 1, 0, 1, 1], [0, 0, -1, -1, -1, 0, -1, -1]]
    flat = registry.get_estimator("sign").compute([_episode(True, 0, 0, "a")] * 3, _config().algo)
    assert not flat.has_signal and all(not t.any() for t in flat.per_token)


def test_registration_is_checked():
    with pytest.raises(ValueError, match="already registered by agentrl.algos.estimators.GRPO"):
        register_estimator(type("Other", (Sign,), {"name": "grpo"}))
    with pytest.raises(TypeError, match="implement compute"):
        register_estimator(type("NoCompute", (Estimator,), {"name": "nocompute", "description": "x"}))
    with pytest.raises(TypeError, match="needs_critic must be a bool"):
        register_estimator(type("BadFlag", (Sign,), {"name": "badflag", "needs_critic": 1}))
    with pytest.raises(ValueError, match="description must be one non-empty line"):
        register_estimator(type("NoDesc", (Sign,), {"name": "nodesc", "description": ""}))
    assert {"nocompute", "badflag", "nodesc"}.isdisjoint(registry.estimator_names())
    assert register_estimator(Sign) is Sign  # the same class again (a re-import) is fine


# ------------------------------------------------------------------ (b) the config reads the flags

@pytest.fixture
def flagged(monkeypatch):
    """Register a variant of ``sign`` with one flag changed, for this test only."""
    monkeypatch.setattr(registry, "_REGISTRY", registry._REGISTRY.copy())

    def make(flag: str, value: bool) -> str:
        name = f"sign_{flag}"
        register_estimator(type(f"Sign_{flag}", (Sign,), {"name": name, flag: value}))
        return name

    return make


@pytest.mark.parametrize(("flag", "value", "bad", "good", "key", "says"), [
    ("needs_critic", True, [], ["algo.critic.lr=1e-5"], "algo.advantage", "needs a critic"),
    ("needs_summary_reward", True, ["rewards.summary=none"], ["rewards.summary=rule"], "algo.advantage", "needs summary scoring"),
    ("reads_turn_verdicts", True, ["algo.shuffle_rewards=true"], [], "algo", "shuffle_rewards is not defined"),
    ("allows_kl_in_reward", False, ["algo.kl_in=reward"], ["algo.kl_in=loss"], "algo.kl_in", "allows_kl_in_reward=False"),
])
def test_config_refuses_what_the_flags_rule_out(flagged, flag, value, bad, good, key, says):
    name = flagged(flag, value)
    for extra in (bad, good):  # the plain toy accepts both
        assert _config("algo.advantage=sign", *extra).algo.advantage == "sign"
    with pytest.raises(ConfigError) as err:
        _config(f"algo.advantage={name}", *bad)
    assert err.value.key == key and says in str(err.value) and f"algo.advantage={name}" in str(err.value)
    assert _config(f"algo.advantage={name}", *good).algo.advantage == name


def test_build_batch_follows_the_flags(flagged):
    critic = _config(f"algo.advantage={flagged('needs_critic', True)}", "algo.critic.lr=1e-5").algo
    batch, stats = build_batch([GROUP], critic)
    assert batch.advantages is None and len(batch.token_rewards) == 4 and "episodes_with_summary" not in stats
    summary = _config(f"algo.advantage={flagged('needs_summary_reward', True)}").algo
    assert build_batch([GROUP], summary)[1]["episodes_with_summary"] == 1.0


# ------------------------------------------------------------------ (c) plugins across processes

def test_unknown_plugins_and_names_are_config_errors():
    with pytest.raises(ConfigError) as err:
        _config("algo.plugins=[no_such_module_xyz]")
    assert err.value.key == "algo.plugins" and "No module named 'no_such_module_xyz'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        _config(f"algo.plugins=[{ROOT / 'missing.py'}]")
    assert err.value.key == "algo.plugins" and "no such file" in str(err.value)
    with pytest.raises(ConfigError, match="unknown advantage estimator 'sing' \\(did you mean 'sign'"):
        _config("algo.advantage=sing")


def test_plugin_files_become_absolute_paths(monkeypatch):
    monkeypatch.chdir(ROOT)
    algo = _config("algo.plugins=[tests/test_estimator_registry.py, agentrl.algos.estimators]", "algo.advantage=sign").algo
    assert algo.plugins == [HERE, "agentrl.algos.estimators"]


def test_a_plugin_file_already_imported_is_not_imported_again():
    load_plugins([HERE])  # pytest imported this file as a module: no second copy
    assert type(registry.get_estimator("sign")) is Sign


def test_a_fresh_process_finds_the_plugin_once_it_loads_the_configs_list():
    """What the learner actor does: a config validated elsewhere arrives unpickled (no validation,
    no import); the actor loads ``cfg.plugins`` first, then the estimator is found."""
    import pickle

    cfg = _config(f"algo.plugins=[{HERE}]", "algo.advantage=sign")
    code = ("import pickle, sys; from agentrl.algos.batching import build_batch; "
            "from agentrl.algos.registry import estimator_names; from agentrl.common.plugins import load_plugins; "
            "cfg, group = pickle.loads(sys.stdin.buffer.read()); print('sign' in estimator_names()); "
            "load_plugins(cfg.plugins); "
            "batch, stats = build_batch([group], cfg.algo); print(batch.advantages[1][2], stats['groups_with_signal'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True,
                         input=pickle.dumps((cfg, GROUP))).stdout
    assert out.decode().split() == ["False", "-1.0", "1.0"]


@pytest.mark.integration
@pytest.mark.heavy  # kept out of make test's 30 minutes (pyproject.toml: markers)
def test_a_plugin_estimator_trains_one_step_through_the_real_stack(tiny_model_dir, ray_cluster, tmp_path):
    """``algo.plugins`` names this file: the driver validates ``algo.advantage=sign`` and the
    learner actor (another process) imports the file to build its batch."""
    from agentrl.driver.run import train

    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path / 'runs'}", "run.name=sign",
        "rollout.group_size=4", "rollout.tasks_per_step=2", "rollout.max_new_tokens=48",
        "learner.micro_batch_size=4", "learner.lr=1e-4", "train.steps=1", "train.eval_at_start=false",
        "train.eval_at_end=false", "telemetry.progress=false", f"algo.plugins=[{HERE}]", "algo.advantage=sign",
    ])
    train(cfg, config_path=None)
    run_dir = next((tmp_path / "runs").iterdir())
    steps = [x for x in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "train/success" in x]
    assert [x["step"] for x in steps] == [1]
    m = steps[0]
    assert m["learner/tokens"] > 0 and "learner/groups_with_signal" in m and m["train/policy_version"] == 1
