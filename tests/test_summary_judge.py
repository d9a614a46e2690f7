"""Rule-based summary scorer, omission, and the LLM client / judge against a real local HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket

import pytest
from aiohttp import web

from agentrl.agent.gold import ASK_TEXT, REFUSE_TEXT, gold_answer
from agentrl.llm import ChatClient, LLMEndpoint, LLMEndpointError
from agentrl.rewards.judge import RATINGS, judge_summary, parse_rating, rating_to_reward
from agentrl.rewards.summary import (
    OMISSION_REWARD,
    episode_summary_reward,
    is_omission,
    rule_summary_score,
    tokens,
)
from agentrl.tasks.schema import Turn

CONTEXT = "Book the cheapest room. [get_rooms] {'rooms': [{'id': 'A4100', 'price': 55}, {'id': 'A4200', 'price': 550}]}"


# ---------------------------------------------------------------------------------- rule scorer


def test_all_facts_present_scores_one():
    assert rule_summary_score("Done: A4100, 55.", ["A4100", "55"], CONTEXT) == 1.0
    turn = Turn(user="x", gold=[[{"name": "f", "arguments": {}}]], answer_facts=["A4100", "55"])
    assert rule_summary_score(gold_answer(turn), turn.answer_facts, CONTEXT) == 1.0


def test_missing_fact_halves_the_score():
    assert rule_summary_score("Done: A4100.", ["A4100", "55"], CONTEXT) == pytest.approx(0.5)
    assert rule_summary_score("Done.", ["A4100", "55"], CONTEXT) == 0.0


def test_number_matches_whole_tokens_only():
    # 550 is in the context, so it is not invented; it just is not the fact 55.
    assert rule_summary_score("The room costs 550.", ["55"], CONTEXT) == 0.0
    assert rule_summary_score("The room costs 55.", ["550"], CONTEXT) == 0.0
    assert rule_summary_score("Room A41000 booked.", ["A4100"], CONTEXT + " A41000") == 0.0
    assert rule_summary_score("It costs 55.00 (room a4100)", ["55", "A4100"], CONTEXT) == 1.0


def test_multi_word_fact_needs_contiguous_tokens():
    assert rule_summary_score("Flying to New York.", ["new york"], "") == 1.0
    assert rule_summary_score("York, then New Haven.", ["New York"], "") == 0.0


def test_invented_values_are_penalised():
    assert rule_summary_score("Done: A4100, 55, also B7777.", ["A4100", "55"], CONTEXT) == pytest.approx(0.75)
    assert rule_summary_score("Done: A4100, 55, 99 and 12.5.", ["A4100", "55"], CONTEXT) == pytest.approx(0.5)
    # A value the model saw in an observation is not invented.
    assert rule_summary_score("Done: A4100, 55 (A4200 was 550).", ["A4100", "55"], CONTEXT) == 1.0
    # A value from the facts is not invented even if no observation showed it.
    assert rule_summary_score("Done: 42.", ["42"], "") == 1.0


def test_no_facts_non_empty_answer_scores_one_unless_invented():
    assert rule_summary_score(ASK_TEXT, [], "Book a room.") == 1.0
    assert rule_summary_score(REFUSE_TEXT, [], "") == 1.0
    assert rule_summary_score("Booked room Z9.", [], "") == pytest.approx(0.75)


def test_length_penalty_beyond_max_chars():
    answer = "Done: A4100, 55. " + "x" * 583  # 600 chars
    assert len(answer) == 600
    assert rule_summary_score(answer, ["A4100", "55"], CONTEXT) == pytest.approx(1 - 0.5 * 200 / 400)
    assert rule_summary_score(answer, ["A4100", "55"], CONTEXT, max_chars=600) == 1.0
    assert rule_summary_score(answer + "x" * 1000, ["A4100", "55"], CONTEXT) == pytest.approx(0.5)


def test_unanswered_or_empty_scores_zero():
    assert rule_summary_score(None, ["A4100"], CONTEXT) == 0.0
    assert rule_summary_score(None, [], CONTEXT) == 0.0
    assert rule_summary_score("  ", [], CONTEXT) == 0.0


def test_tokens():
    assert tokens("Done: A4100, 55.") == ["done", "a4100", "55"]
    assert tokens("12.50 and 3.0") == ["12.5", "and", "3"]


def test_episode_summary_reward_averages_over_expected_turns():
    facts = [["A4100"], ["55"], []]
    assert episode_summary_reward(["Done: A4100.", "Done: 55.", "Ok."], facts, CONTEXT, 3) == 1.0
    assert episode_summary_reward(["Done: A4100.", None], facts, CONTEXT, 3) == pytest.approx(1 / 3)
    assert episode_summary_reward(["Done: A4100."], facts, CONTEXT, 3) == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        episode_summary_reward(["a", "b", "c", "d"], facts, CONTEXT, 3)
    with pytest.raises(ValueError):
        episode_summary_reward(["a"], facts[:2], CONTEXT, 3)


# ------------------------------------------------------------------------------------- omission

CALL = {"name": "get_rooms", "arguments": {}}


def test_omission():
    assert OMISSION_REWARD == -0.5
    gold = [[[CALL]], [], [[CALL], [CALL]]]
    assert is_omission([[], [], [[CALL]]], gold)  # turn 1 needed a call, none made
    assert is_omission([[[CALL]], [], []], gold)  # turn 3 answered without calling
    assert not is_omission([[[CALL]], [], [[CALL]]], gold)  # incomplete plan is not omission
    assert not is_omission([[[CALL]]], gold)  # stopped before turn 3: truncation, not omission
    assert not is_omission([[[CALL]], [[CALL]]], gold)  # calling in an ask turn is not omission
    assert is_omission([[[]]], gold)  # only malformed blocks: no valid call
    with pytest.raises(ValueError):
        is_omission([[], [], [], []], gold)


# ------------------------------------------------------------------- client and judge over HTTP


def _completion(model: str, text: str) -> dict:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


@contextlib.asynccontextmanager
async def fake_server(reply: str = "4", status: int = 200, delay_s: float = 0.0):
    """A real OpenAI-style HTTP server on 127.0.0.1 that records every request it gets."""
    seen: list[dict] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append({"body": body, "headers": dict(request.headers)})
        if delay_s:
            await asyncio.sleep(delay_s)
        if status != 200:
            return web.json_response({"error": {"message": "boom", "type": "server_error"}}, status=status)
        return web.json_response(_completion(body.get("model", ""), reply))

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1", seen
    finally:
        await runner.cleanup()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_client_sends_model_messages_and_structured_choice():
    messages = [{"role": "user", "content": "Pick one."}]

    async def main():
        async with fake_server(reply="yes") as (url, seen):
            async with ChatClient(LLMEndpoint(url, "judge-model", max_retries=0)) as client:
                text = await client.complete(messages, temperature=0.3, max_tokens=8, seed=7, choices=["yes", "no"])
        return text, seen

    text, seen = asyncio.run(main())
    assert text == "yes"
    assert len(seen) == 1
    body = seen[0]["body"]
    assert body["model"] == "judge-model"
    assert body["messages"] == messages
    assert body["temperature"] == 0.3
    assert body["max_completion_tokens"] == 8
    assert body["seed"] == 7
    assert body["structured_outputs"] == {"choice": ["yes", "no"]}
    assert not any(k.startswith("guided_") for k in body)
    assert seen[0]["headers"]["Authorization"] == "Bearer EMPTY"


def test_client_sends_json_schema_and_key_from_env(monkeypatch):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    monkeypatch.setenv("AGENTRL_TEST_LLM_KEY", "sekrit")

    async def main():
        async with fake_server(reply='{"ok": true}') as (url, seen):
            client = ChatClient(LLMEndpoint(url, "m", api_key_env="AGENTRL_TEST_LLM_KEY", max_retries=0))
            text = await client.complete([{"role": "user", "content": "?"}], json_schema=schema)
            await client.aclose()
        return text, seen

    text, seen = asyncio.run(main())
    assert json.loads(text) == {"ok": True}
    body = seen[0]["body"]
    assert body["structured_outputs"] == {"json": schema}
    assert body["temperature"] == 0.0 and body["max_completion_tokens"] == 256 and "seed" not in body
    assert seen[0]["headers"]["Authorization"] == "Bearer sekrit"


def test_client_argument_and_key_errors(monkeypatch):
    monkeypatch.delenv("AGENTRL_TEST_MISSING_KEY", raising=False)
    client = ChatClient(LLMEndpoint("http://127.0.0.1:1/v1", "m", api_key_env="AGENTRL_TEST_MISSING_KEY"))
    with pytest.raises(ValueError, match="at most one"):
        asyncio.run(client.complete([], choices=["a"], json_schema={}))
    with pytest.raises(LLMEndpointError, match="AGENTRL_TEST_MISSING_KEY"):
        asyncio.run(client.complete([{"role": "user", "content": "?"}]))


def test_judge_maps_rating_and_constrains_decoding():
    async def main():
        async with fake_server(reply="4") as (url, seen):
            async with ChatClient(LLMEndpoint(url, "judge", max_retries=0)) as client:
                score = await judge_summary(client, "Book the cheapest room.", CONTEXT, "Done: A4100, 55.")
        return score, seen

    score, seen = asyncio.run(main())
    assert score == 0.75
    body = seen[0]["body"]
    assert body["model"] == "judge"
    assert body["temperature"] == 0.0
    assert body["structured_outputs"] == {"choice": ["1", "2", "3", "4", "5"]}
    prompt = body["messages"][-1]["content"]
    assert "Book the cheapest room." in prompt and "A4200" in prompt and "Done: A4100, 55." in prompt


def test_judge_rejects_unparseable_reply():
    async def main():
        async with fake_server(reply="a solid answer") as (url, _):
            async with ChatClient(LLMEndpoint(url, "judge", max_retries=0)) as client:
                await judge_summary(client, "q", "obs", "a")

    with pytest.raises(ValueError, match="a solid answer"):
        asyncio.run(main())


def test_rating_helpers():
    assert [rating_to_reward(parse_rating(r)) for r in RATINGS] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert parse_rating(" 5.\n") == 5
    for bad in ["0", "6", "4/5", "", "four"]:
        with pytest.raises(ValueError):
            parse_rating(bad)


def test_unreachable_endpoint_names_the_url():
    url = f"http://127.0.0.1:{_free_port()}/v1"
    client = ChatClient(LLMEndpoint(url, "m", timeout_s=5, max_retries=0))
    with pytest.raises(LLMEndpointError, match="could not connect") as info:
        asyncio.run(client.complete([{"role": "user", "content": "?"}]))
    assert url in str(info.value)


def test_http_error_and_timeout_name_the_url():
    async def main(**server):
        async with fake_server(**server) as (url, _):
            client = ChatClient(LLMEndpoint(url, "m", timeout_s=0.3, max_retries=0))
            try:
                await client.complete([{"role": "user", "content": "?"}])
            except LLMEndpointError as exc:
                return url, str(exc)
            finally:
                await client.aclose()
        raise AssertionError("no error raised")

    url, msg = asyncio.run(main(status=500))
    assert url in msg and "HTTP 500" in msg
    url, msg = asyncio.run(main(delay_s=1.0))
    assert url in msg and "timed out" in msg


def test_client_survives_a_new_event_loop():
    async def main(client, close=False):
        try:
            return await client.complete([{"role": "user", "content": "?"}], choices=RATINGS)
        finally:
            if close:
                await client.aclose()

    async def run_twice():
        async with fake_server(reply="3") as (url, seen):
            client = ChatClient(LLMEndpoint(url, "m", max_retries=0))
            first = await main(client)
            # Reuse from another loop: a worker thread with its own asyncio.run.
            second = await asyncio.to_thread(asyncio.run, main(client, close=True))
            await asyncio.sleep(0.05)  # let the first loop close its own client
            return first, second, len(seen)

    assert asyncio.run(run_twice()) == ("3", "3", 2)


def test_request_body_is_what_vllm_reads_as_structured_outputs():
    """The body the client really sends parses into vLLM's own request model with the constraint set."""
    protocol = pytest.importorskip("vllm.entrypoints.openai.chat_completion.protocol")

    async def main():
        async with fake_server(reply="2") as (url, seen):
            async with ChatClient(LLMEndpoint(url, "judge", max_retries=0)) as client:
                await judge_summary(client, "q", "obs", "a")
                await client.complete([{"role": "user", "content": "?"}], json_schema={"type": "object"})
        return [s["body"] for s in seen]

    choice_body, json_body = asyncio.run(main())
    assert protocol.ChatCompletionRequest(**choice_body).structured_outputs.choice == RATINGS
    assert protocol.ChatCompletionRequest(**json_body).structured_outputs.json == {"type": "object"}
