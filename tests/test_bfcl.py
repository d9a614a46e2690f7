"""BFCL multi-turn integration: task import, the backend, and verdict parity with the official
``multi_turn_checker`` (the oracle; used only here, with a unique model name per check and its
global instance cache purged afterwards, because it reuses instances across calls otherwise).
"""

from __future__ import annotations

import asyncio
import copy
import importlib.metadata
import json
import random
import time
import uuid

import jsonschema
import pytest

pytest.importorskip("bfcl_eval", reason="optional dependency bfcl-eval is not installed")

import agentrl.envs.bfcl as bfcl  # noqa: E402
from agentrl.agent.chat import ChatFormatter  # noqa: E402
from agentrl.agent.chat_template import CHAT_TEMPLATE  # noqa: E402
from agentrl.agent.episode import EpisodeLimits, run_episode, tool_announcement  # noqa: E402
from agentrl.agent.gold import GoldPolicy  # noqa: E402
from agentrl.envs.base import is_error  # noqa: E402
from agentrl.envs.bfcl.backend import BFCLBackend, result_text  # noqa: E402
from agentrl.envs.bfcl.tasks import CATEGORIES, RESTORE_MESSAGE, SPLIT_SEED, _jsonl, bfcl_tasks  # noqa: E402
from agentrl.envs.registry import make_backend  # noqa: E402
from agentrl.envs.session import LocalEnvSession  # noqa: E402
from agentrl.envs.sources import resolve_task_source  # noqa: E402
from agentrl.tasks.schema import Task, ToolCall  # noqa: E402

PARITY_SEED = 1234
PERTURBATIONS_PER_ENTRY = 5  # x 800 entries


# --- import -------------------------------------------------------------------------------------
def test_counts_split_and_determinism():
    full, train, ev = bfcl_tasks("all", "full"), bfcl_tasks("all", "train"), bfcl_tasks("all", "eval")
    assert (len(full), len(train), len(ev)) == (800, 400, 400)
    assert {t.id for t in train}.isdisjoint({t.id for t in ev})
    assert {t.id for t in train} | {t.id for t in ev} == {t.id for t in full}
    for cat in CATEGORIES:
        assert len(bfcl_tasks(cat, "train")) == len(bfcl_tasks(cat, "eval")) == 100
        assert all(t.category == cat and t.domain == "bfcl" and t.backend == "bfcl" for t in bfcl_tasks(cat, "full"))
    # one index permutation for every category: variant i of an entry never crosses sides
    idx = {c: {int(t.id.rsplit("_", 1)[1]) for t in bfcl_tasks(c, "train")} for c in CATEGORIES}
    assert len({frozenset(v) for v in idx.values()}) == 1
    rng_order = list(range(200))
    random.Random(SPLIT_SEED).shuffle(rng_order)
    assert idx["base"] == set(rng_order[:100])
    assert sorted(idx["base"])[:10] == [0, 1, 3, 7, 8, 9, 10, 12, 15, 16]  # pinned: the split must never move
    assert [t.id for t in resolve_task_source("bfcl:miss_func")] == [t.id for t in bfcl_tasks("miss_func", "eval")]
    assert len(resolve_task_source("bfcl:all:train")) == 400
    for task in full:  # every task survives a JSON round trip through the schema
        assert Task.model_validate_json(task.model_dump_json()) == task


def test_resolve_task_source_errors():
    for bad in ["bfcl:", "bfcl:nope", "bfcl:base:test", "bfcl:base:eval:x"]:
        with pytest.raises(ValueError, match=r"bfcl:<category>:<split>.*miss_func.*train"):
            resolve_task_source(bad)


def test_tool_schemas_are_json_schema():
    seen = {}
    for task in bfcl_tasks("all", "full"):
        for tool in task.tools:
            seen[tool.name] = tool.function.parameters
    for name, params in seen.items():
        jsonschema.Draft202012Validator.check_schema(params)
        assert params["type"] == "object", name
        text = json.dumps(params)
        for bfcl_type in ('"dict"', '"float"', '"tuple"', '"any"'):
            assert f'"type": {bfcl_type}' not in text, (name, bfcl_type)


def test_miss_func_withholding_and_restoration():
    raw = {e["id"]: e for e in _jsonl(bfcl.tasks.PROMPT_PATH / "BFCL_v4_multi_turn_miss_func.json")}
    for task in bfcl_tasks("miss_func", "full"):
        ((k, names),) = raw[task.id]["missed_function"].items()
        k = int(k)
        # BFCL's ground truth of miss_func_49 calls the missed `tail` before it is restored: kept visible
        hidden = sorted(set(names) - ({"tail"} if task.id == "multi_turn_miss_func_49" else set()))
        for u, turn in enumerate(task.turns):
            assert turn.withheld_tools == (hidden if u < k else []), (task.id, u)
            assert not {c.name for c in task.gold_calls(u)} & set(turn.withheld_tools), (task.id, u)
        assert task.turns[k].user == RESTORE_MESSAGE
        assert not task.turns[k - 1].gold and task.turns[k].gold
    for cat in ("base", "miss_param", "long_context"):
        assert not any(turn.withheld_tools for t in bfcl_tasks(cat, "full") for turn in t.turns)


def test_long_context_flag_only_there():
    for task in bfcl_tasks("all", "full"):
        assert task.initial_state["long_context"] is (task.category == "long_context")
        assert task.initial_state["bfcl_id"] == task.id
    # otherwise long_context entries are base-like: the flag is what makes outputs long
    lc_task, base_task = next(
        (t, b) for t, b in zip(bfcl_tasks("long_context", "full"), bfcl_tasks("base", "full"))
        if "GorillaFileSystem" in t.initial_state["involved_classes"]
        and t.initial_state["initial_config"] == b.initial_state["initial_config"])
    lc, base = make_backend(lc_task), make_backend(base_task)
    assert lc.instances["GorillaFileSystem"].long_context and not base.instances["GorillaFileSystem"].long_context
    assert len(json.dumps(lc.state())) > len(json.dumps(base.state()))


# --- backend ------------------------------------------------------------------------------------
def test_gold_plans_replay_without_errors_and_backend_never_raises():
    for task in bfcl_tasks("all", "full"):
        backend = make_backend(task)
        assert isinstance(backend, BFCLBackend)
        for u in range(len(task.turns)):
            for call in task.gold_calls(u):
                obs = backend.execute(call)
                assert not is_error(obs), (task.id, u, call, obs)
                json.dumps(obs)
    backend = make_backend(bfcl_tasks("base")[0])
    assert backend.execute(ToolCall(name="nope", arguments={})) == {"error": "Error during execution: name 'nope' is not defined"}
    obs = backend.execute(ToolCall(name="cd", arguments={"nope": 1}))
    assert is_error(obs) and "unexpected keyword argument 'nope'" in obs["error"]
    assert result_text(obs) == obs["error"]
    state = backend.state()
    json.dumps(state)
    assert "root" in state["GorillaFileSystem"]


def test_backends_share_no_state():
    from agentrl.envs.checker import canonical

    for cat in CATEGORIES:
        for task in bfcl_tasks(cat, "full")[:25]:
            fresh = canonical(make_backend(task).state())
            used = make_backend(task)
            for u in range(len(task.turns)):
                for call in task.gold_calls(u):
                    used.execute(call)
            assert canonical(make_backend(task).state()) == fresh, task.id


def test_lazy_registration_and_project_root(tmp_path):
    import subprocess
    import sys

    task = bfcl_tasks("base")[0]
    (tmp_path / "t.json").write_text(task.model_dump_json())
    code = (
        "import sys, os; from pathlib import Path\n"
        "from agentrl.tasks.schema import Task; import agentrl.envs.registry as r, agentrl.envs.session, agentrl.tasks.io\n"
        "assert 'bfcl_eval' not in sys.modules and 'agentrl.envs.bfcl' not in sys.modules\n"
        f"b = r.make_backend(Task.model_validate_json(Path({str(tmp_path / 't.json')!r}).read_text()))\n"
        "import agentrl.envs.bfcl.tasks  # imports bfcl_eval's eval_config, which makes its folders\n"
        "print(type(b).__name__, os.environ['BFCL_PROJECT_ROOT'])\n"
    )
    env = {**__import__("os").environ, "AGENTRL_CACHE": str(tmp_path / "cache")}
    env.pop("BFCL_PROJECT_ROOT", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout.split()
    assert out == ["BFCLBackend", str(tmp_path / "cache" / "bfcl")]
    assert (tmp_path / "cache" / "bfcl" / "result").is_dir()


# --- gold replay through the episode loop -------------------------------------------------------
def _formatter() -> ChatFormatter:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [t.user for task in bfcl_tasks("base", "train")[:30] for t in task.turns]
    tok.train_from_iterator(corpus, trainer)
    t = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                additional_special_tokens=specials[:2])
    t.chat_template = CHAT_TEMPLATE
    return ChatFormatter(t)


def test_gold_episodes_pass_every_turn():
    formatter = _formatter()
    limits = EpisodeLimits(max_new_tokens=100_000, max_assistant_messages_per_turn=64, max_episode_tokens=10_000_000)
    tasks = bfcl_tasks("all", "full")

    async def run_all():
        return [await run_episode(t, GoldPolicy(t, formatter), LocalEnvSession(t), formatter, limits) for t in tasks]

    for task, ep in zip(tasks, asyncio.run(run_all())):
        assert ep.termination == "done" and ep.turn_passed == [True] * len(task.turns), (task.id, ep.turn_passed)
        if task.category == "miss_func":  # the restored tools were announced at the holdout turn
            k = next(u for u, t in enumerate(task.turns) if not t.withheld_tools)
            restored = [t for t in task.tools if t.name in task.turns[k - 1].withheld_tools]
            text = formatter.tokenizer.decode(ep.token_ids)
            assert tool_announcement(restored) + RESTORE_MESSAGE in text


# --- parity with the official checker -----------------------------------------------------------
def _call_text(call: ToolCall) -> str:
    """As bfcl_eval's convert_to_function_call writes a decoded FC call."""
    return f"{call.name}({','.join(f'{k}={v!r}' for k, v in call.arguments.items())})"


def _changed(value):
    if isinstance(value, (bool, int, float)):
        return (not value) if isinstance(value, bool) else value + 1
    if isinstance(value, str):
        return value + "_x"
    return value[:-1] if isinstance(value, list) and value else ["x"] if isinstance(value, list) else {}


def _with_arg(call: ToolCall, key: str, value) -> ToolCall:
    return ToolCall(name=call.name, arguments={**call.arguments, key: value})


def _perturb(rng: random.Random, task: Task) -> tuple[str, list[list[ToolCall]]]:
    """One seeded mistake in the gold trajectory (turns of calls; each call is one step)."""
    traj = [list(task.gold_calls(u)) for u in range(len(task.turns))]
    u = rng.choice([u for u, t in enumerate(traj) if t])
    turn = traj[u]
    args = [(i, k) for i, c in enumerate(turn) for k in sorted(c.arguments)]
    # 5 <-> 5.0: equal in Python state (the official state check), different in result text
    numbers = [(i, k) for i, k in args if type(turn[i].arguments[k]) in (int, float) and float(turn[i].arguments[k]).is_integer()]
    kinds = ["drop", "add_dup", "add_other", "stop"] + ["change"] * bool(args) + ["retype"] * bool(numbers)
    kinds += ["swap"] * (len(turn) > 1) + ["early"] * (u > 0)  # early: first call made at the end of turn u-1
    kind = rng.choice(kinds)
    i = rng.randrange(len(turn))
    if kind == "drop":
        turn.pop(i)
    elif kind in ("change", "retype"):
        i, key = rng.choice(args if kind == "change" else numbers)
        v = turn[i].arguments[key]
        turn[i] = _with_arg(turn[i], key, _changed(v) if kind == "change" else (int(v) if isinstance(v, float) else float(v)))
    elif kind == "add_dup":
        turn.insert(i + 1, turn[i])
    elif kind == "add_other":
        turn.insert(i, rng.choice([c for t in traj for c in t]))
    elif kind == "swap":
        i, j = rng.sample(range(len(turn)), 2)
        turn[i], turn[j] = turn[j], turn[i]
    elif kind == "early":
        traj[u - 1].append(turn.pop(0))
    else:  # stop: the episode ends before some turn (the official checker gets empty turns)
        traj = traj[: rng.randrange(len(traj))]
    return kind, traj


def _ours(task: Task, traj: list[list[ToolCall]]) -> bool:
    session = LocalEnvSession(task)
    passed = []
    for u in range(len(task.turns)):
        results = []
        for call in traj[u] if u < len(traj) else []:  # one call per step, as the gold plans
            results += zip([call], session.execute_sync([call]))
        passed.append(session.end_turn_sync(u, results))
    return all(passed)


def _official(entry: dict, gt: list[list[str]], traj: list[list[ToolCall]]) -> str:
    """The official verdict: "valid" or the error_type."""
    import bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils as mtu
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    decoded = [[[_call_text(c)] for c in turn] for turn in traj] + [[] for _ in range(len(gt) - len(traj))]
    tag = "m" + uuid.uuid4().hex[:12]
    try:
        verdict = multi_turn_checker(decoded, gt, entry, entry["id"].rsplit("_", 1)[0], tag)
        return "valid" if verdict["valid"] else verdict["error_type"]
    finally:
        for key in [k for k in vars(mtu) if k.startswith(tag) and k.endswith("_instance")]:
            del vars(mtu)[key]


def test_verdict_parity_with_official_checker():
    t0 = time.perf_counter()
    rng = random.Random(PARITY_SEED)
    gts = {}
    for cat in CATEGORIES:
        answers = _jsonl(bfcl.tasks.POSSIBLE_ANSWER_PATH / f"BFCL_v4_multi_turn_{cat}.json")
        gts.update({a["id"]: a["ground_truth"] for a in answers})
    counts = {"agree": 0, "disagree": 0, "valid": 0, "invalid": 0}
    kinds: dict[str, list[int]] = {}
    errors: dict[str, int] = {}
    disagreements = []
    n = 0
    for task in bfcl_tasks("all", "full"):
        st = task.initial_state
        entry = {"id": st["bfcl_id"], "initial_config": copy.deepcopy(st["initial_config"]),
                 "involved_classes": st["involved_classes"]}
        gt = gts[task.id]
        trajs = [("gold", [list(task.gold_calls(u)) for u in range(len(task.turns))])]
        trajs += [_perturb(rng, task) for _ in range(PERTURBATIONS_PER_ENTRY)]
        for kind, traj in trajs:
            n += 1
            ours, verdict = _ours(task, traj), _official(entry, gt, traj)
            official = verdict == "valid"
            errors[verdict] = errors.get(verdict, 0) + 1
            counts["agree" if ours == official else "disagree"] += 1
            counts["valid" if official else "invalid"] += 1
            kinds.setdefault(kind, [0, 0])[official] += 1
            if ours != official:
                disagreements.append((task.id, kind, ours, official))
            if kind == "gold":
                assert official and ours, task.id
    seconds = time.perf_counter() - t0
    summary = (f"{n} trajectories (800 gold + {n - 800} perturbed): {counts}; official [invalid, valid] per kind: "
               f"{kinds}; official verdicts {errors}; {seconds:.1f}s; first disagreements: {disagreements[:5]}")
    print(summary)
    assert not disagreements, summary
    assert counts["valid"] > 800 and counts["invalid"] > 0, summary
    assert {"multi_turn:instance_state_mismatch", "multi_turn:execution_response_mismatch",
            "multi_turn:empty_turn_model_response"} <= set(errors), summary


# --- the optional dependency --------------------------------------------------------------------
def test_require_bfcl_message(monkeypatch):
    bfcl.require_bfcl()  # the installed one is right
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2025.1.1")
    with pytest.raises(RuntimeError) as err:
        bfcl.require_bfcl()
    msg = str(err.value)
    assert "bfcl-eval==2026.3.23" in msg and "2025.1.1" in msg and "pip install --no-deps bfcl-eval==2026.3.23" in msg

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(RuntimeError, match="not installed.*pip install --no-deps bfcl-eval==2026.3.23"):
        bfcl.require_bfcl()
