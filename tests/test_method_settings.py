"""The method settings of docs/benchmarks.md, "Each method where its premise holds".

Each method gets a setting built from its premise: RODS a pool-bound run
(configs/method_rods_poolbound.yaml), RSPO sparse success (configs/method_rspo_sparse.yaml), SLCA
cross-segment credit (configs/method_slca_crosssegment.yaml). These tests check, cheaply and
without Ray, vLLM or a model:

* every arm the benchmark command runs (benchmarks/compare_methods.py: configs/quickstart.yaml plus
  the arm's and the command's overrides) is the setting's config plus the arm's override written
  in its header, and the docs give those overrides;
* the task suites have the properties each premise rests on, played through the real episode
  loop, checker and scorer by the gold policy and by the imperfect teacher (agent/teacher.py),
  whose habits are the warm start's.

The premises themselves need the model. RSPO's and SLCA's were measured once with the shipped
warm start sampled at T = 1, 8 episodes per task (the docs section has the numbers): 7.0 % of 128
bank-sparse groups held any success, and 97 % had a varying process score; 35 % of 1,024
bank-report episodes had one segment right and the other wrong. RODS's premise concerns the static
arm's end, so only that arm measures it (the docs give its gate and the two earlier versions).
"""

from __future__ import annotations

import asyncio
import importlib.util
import random
import re
from pathlib import Path

import pytest

from agentrl.agent.chat import ChatFormatter
from agentrl.agent.episode import EpisodeLimits, run_episode
from agentrl.agent.gold import GoldPolicy
from agentrl.agent.teacher import Habits, demonstration
from agentrl.config import load_config
from agentrl.envs.builtin.generator import builtin_split, looks_up_before_spending
from agentrl.envs.checker import canonical, gold_replay
from agentrl.envs.session import LocalEnvSession
from agentrl.envs.sources import resolve_task_source
from agentrl.rewards.scoring import score_episode
from agentrl.tasks.schema import ToolCall, text_key

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## Each method where its premise holds"

# setting -> its config, the method's arm, the base arms with the override that makes each from
# the config, the benchmark command's steps and its --override values (as in the docs)
SETTINGS = {
    "rods": dict(config="configs/method_rods_poolbound.yaml", arm="rods", steps=26,
                 arms={"static": ["rods.enabled=false"],
                       "shuffled": ["rods.enabled=false", "algo.shuffle_rewards=true"]},
                 overrides=["tasks.train=builtin:bank-pool4", "tasks.fresh_train=false", "rollout.tasks_per_step=4",
                            "rollout.temperature=0.7"]),
    "rspo": dict(config="configs/method_rspo_sparse.yaml", arm="rspo", steps=14,
                 arms={"grpo": ["rspo.enabled=false"], "process_only": ["rspo.swap=false"],
                       "shuffled": ["rspo.enabled=false", "algo.shuffle_rewards=true"]},
                 overrides=["tasks.train=builtin:bank-sparse-train", "tasks.heldout=builtin:bank-sparse-heldout",
                            "tasks.fresh_train=false", "algo.reward=outcome"]),
    "slca": dict(config="configs/method_slca_crosssegment.yaml", arm="slca", steps=12,
                 arms={"grpo": ["algo.advantage=grpo"],
                       "shuffled": ["algo.advantage=grpo", "algo.shuffle_rewards=true"]},
                 overrides=["tasks.train=builtin:bank-report-train", "tasks.heldout=builtin:bank-report-heldout",
                            "tasks.fresh_train=false"]),
}


def _runner():
    spec = importlib.util.spec_from_file_location("compare_methods", ROOT / "benchmarks" / "compare_methods.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _runner_arm(runner, arm: str, setting: dict):
    """The config compare_methods.py trains for ``arm`` with this setting's --steps and --override."""
    steps = setting["steps"]
    fixed = ["train.max_minutes=null", f"train.steps={steps}", f"train.eval_every={steps // 2}"]
    arm_overrides = [o.format(seeds=runner.SEEDS_FILE) for o in runner.ARMS[arm][0]]
    return load_config(QUICKSTART, [*fixed, *arm_overrides, *setting["overrides"]])


def _comparable(cfg) -> dict:
    """The config without what differs per run (name, seeds, output, progress display, whether this
    run measures the shared start) and without the settings of a method that is off."""
    tree = cfg.model_dump(mode="json")
    del tree["run"], tree["rollout"]["engine"]["seed"], tree["telemetry"]["progress"], tree["train"]["eval_at_start"]
    for method in ("rods", "rspo"):
        if not tree[method]["enabled"]:
            del tree[method]
    return tree


def _formatter() -> ChatFormatter:
    from transformers import AutoTokenizer

    from agentrl.models.tiny_model import SHIPPED

    return ChatFormatter(AutoTokenizer.from_pretrained(SHIPPED))


def _play(task, played, formatter) -> dict:
    """The rewards of ``played``'s gold conversation on ``task`` (the checker sees ``task``)."""
    limits = EpisodeLimits(max_new_tokens=10_000, max_assistant_messages_per_turn=16, max_episode_tokens=100_000)
    ep = asyncio.run(run_episode(task, GoldPolicy(played, formatter), LocalEnvSession(task), formatter, limits))
    return score_episode(ep, task)


# ------------------------------------------------------------------------- configs and commands

@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_each_arm_is_the_config_plus_its_override(name):
    setting, runner = SETTINGS[name], _runner()
    config = ROOT / setting["config"]
    assert _comparable(_runner_arm(runner, setting["arm"], setting)) == _comparable(load_config(config))
    for arm, overrides in setting["arms"].items():
        assert _comparable(_runner_arm(runner, arm, setting)) == _comparable(load_config(config, overrides)), arm
    cfg = load_config(config)
    assert cfg.train.max_minutes is None and cfg.train.steps == setting["steps"]
    assert not cfg.tasks.fresh_train  # every setting trains on a fixed task set: no generator


def test_the_docs_give_each_settings_command():
    text = DOCS.read_text(encoding="utf-8")
    assert SECTION in text
    section = text[text.index(SECTION):]
    if "\n## " in section:  # up to the next section, if any
        section = section[: section.index("\n## ")]
    # as the runner reads --arms (family names expand), so a command runs exactly the setting's arms
    commands = {frozenset(_runner().expand_arms(arms)) for arms in re.findall(r"--arms (\S+)", section)}
    for name, setting in SETTINGS.items():
        assert {*setting["arms"], setting["arm"]} in commands, name
        assert f"--steps {setting['steps']}" in section and setting["config"] in section, name
        for override in setting["overrides"]:
            assert f"--override {override}" in section, (name, override)


# ------------------------------------------------------------------------------- RODS: pool-bound

def test_rods_pool_is_four_fixed_seeds_trained_for_26_epochs():
    cfg = load_config(ROOT / SETTINGS["rods"]["config"])
    pool = resolve_task_source(cfg.tasks.train)
    assert len(pool) == 4 and cfg.rods.enabled and cfg.algo.advantage == "grpo" and cfg.algo.reward == "progress"
    # the same tasks as the first 4 of bank-train (the earlier method suite's first seeds), own ids
    assert [text_key(t) for t in pool] == [text_key(t) for t in builtin_split("bank-train")[:4]]
    assert not {text_key(t) for t in pool} & {text_key(t) for t in resolve_task_source(cfg.tasks.heldout)}
    assert cfg.rollout.tasks_per_step == len(pool)  # the whole pool every step: one epoch per step
    assert cfg.train.steps == 26 and cfg.learner.lr == 2e-4 and cfg.rollout.temperature == 0.7
    # the warm start's ask-or-guess decision is in the pool (the habit held-out success rewards), so
    # the static arm can learn it and saturate
    assert sum(t.category == "miss_param" for t in pool) == 2


# ------------------------------------------------------------------------ RSPO: sparse success

@pytest.fixture(scope="module")
def sparse() -> tuple[list, list]:
    return builtin_split("bank-sparse-train"), builtin_split("bank-sparse-heldout")


def test_rspo_tasks_need_both_decisions_in_three_or_four_required_turns(sparse):
    train, held = sparse
    assert (len(train), len(held)) == (400, 200)
    assert not {text_key(t) for t in train} & {text_key(t) for t in held}
    for t in train + held:
        asks = [u for u, turn in enumerate(t.turns) if not turn.gold]
        assert t.category == "miss_param" and len(t.turns) in (3, 4) and len(asks) == 1, t.id
        assert looks_up_before_spending(t), t.id
    cfg = load_config(ROOT / SETTINGS["rspo"]["config"])
    assert cfg.algo.reward == "outcome" and cfg.rspo.enabled and cfg.rspo.process_reward == "process"


def test_rspo_either_habit_fails_the_outcome_while_the_process_score_moves(sparse):
    """The premise's two halves, model-free: each of the warm start's habits alone fails the whole
    episode (outcome 0: success needs both decisions right), while the HierR process score of
    those failures lies between 0 and the gold's, so it still ranks a group's episodes."""
    formatter, rng = _formatter(), random.Random(0)
    failed = {"guess_missing": 0, "skip_lookup": 0}
    for task in sparse[0][:12]:
        gold = _play(task, task, formatter)
        assert gold["outcome"] == 1.0 and gold["process"] == 1.0, task.id
        for habit in failed:
            played, fired = demonstration(task, Habits(**{habit: 1.0}), rng)
            if not fired[habit]:
                continue
            r = _play(task, played, formatter)
            failed[habit] += r["outcome"] == 0.0
            assert 0.5 < r["process"] < gold["process"], (task.id, habit, r["process"])
    assert failed["skip_lookup"] == 12  # every task has a lookup, and skipping it always fails
    assert failed["guess_missing"] >= 9  # a guess the backend rejects changes nothing, and can pass


# ------------------------------------------------------------------ SLCA: cross-segment credit

@pytest.fixture(scope="module")
def report() -> tuple[list, list]:
    return builtin_split("bank-report-train"), builtin_split("bank-report-heldout")


def test_slca_tasks_are_two_turns_of_two_calls_whose_answers_report_results(report):
    train, held = report
    assert (len(train), len(held)) == (400, 200)
    assert not {text_key(t) for t in train} & {text_key(t) for t in held}
    for t in train[:150] + held[:50]:
        assert t.category == "base" and len(t.turns) == 2 and not looks_up_before_spending(t), t.id
        assert [sum(len(s) for s in turn.gold) for turn in t.turns] == [2, 2], t.id
        facts = [len(turn.answer_facts) for turn in t.turns]
        assert min(facts) >= 2 and max(facts) >= 3, t.id
        for u, replay in enumerate(gold_replay(t)):  # every fact is a value a call returned
            assert all(f in canonical(replay.results) for f in t.turns[u].answer_facts), t.id
    cfg = load_config(ROOT / SETTINGS["slca"]["config"])
    assert cfg.algo.advantage == "slca" and cfg.rewards.summary == "rule"


def test_slca_segments_go_wrong_separately(report):
    """Calls right with a wrong answer passes the checker but loses summary reward; a wrong call
    with the gold answer fails the checker but keeps it: each segment has its own reward, which
    SLCA credits to its own tokens and an episode-level reward credits to both."""
    formatter = _formatter()
    for task in report[0][:8]:
        wrong_answer = task.model_copy(deep=True)
        fact = wrong_answer.turns[1].answer_facts[0]
        wrong_answer.turns[1].answer_facts[0] = fact[:-1] + ("1" if fact[-1] != "1" else "2")
        r = _play(task, wrong_answer, formatter)
        assert r["outcome"] == 1.0 and r["process"] == 1.0 and r["summary_score"] < 1.0, task.id

        wrong_call = task.model_copy(deep=True)
        step = wrong_call.turns[1].gold[-1]
        call = step[-1]
        key = "amount" if "amount" in call.arguments else next(iter(call.arguments))
        value = call.arguments[key]
        bad = value + 5 if isinstance(value, int) else value + "x"
        step[-1] = ToolCall(name=call.name, arguments={**call.arguments, key: bad})
        r = _play(task, wrong_call, formatter)
        assert r["outcome"] == 0.0 and r["process"] < 1.0 and r["summary_score"] == 1.0, task.id
