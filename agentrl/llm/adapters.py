"""The LLM adapters behind one protocol, ``JsonLLM``: ``simulate(messages, json_schema, seed) -> str``.

Callers that run on plain threads (the SGLS tool simulator inside threaded Ray actors, the RODS
LLM synthesizer and its judge) block on one chat completion constrained to a JSON Schema. Two
adapters implement it:

* ``OpenAILLM``: any OpenAI-compatible endpoint, through ``ChatClient`` (``llm/client.py``, also
  the transport of the LLM judge);
* ``EngineLLM``: an in-process vLLM engine (``engines.vllm_engine.VLLMEngine.generate_json``) that
  batches every thread's requests.

Both run their coroutines on a ``BackgroundLoop``: one event loop on a daemon thread, since an
async client's connection pool (or vLLM's output handler) belongs to the loop that made it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Protocol

from agentrl.llm.client import ChatClient, LLMEndpoint


class JsonLLM(Protocol):
    def simulate(self, messages: list[dict[str, str]], json_schema: dict | None, seed: int | None) -> str: ...


class BackgroundLoop:
    """An asyncio loop on a daemon thread, so synchronous callers on any thread can run
    coroutines of one async client (whose connection pool is tied to that loop)."""

    def __init__(self, name: str = "sgls-loop"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


class OpenAILLM:
    """``JsonLLM`` over any OpenAI-compatible endpoint through the shared ``ChatClient``. Thread-safe:
    every thread's request runs on one private loop, so concurrent calls share its pool."""

    def __init__(self, endpoint: LLMEndpoint, temperature: float = 0.0, max_tokens: int = 512):
        self.endpoint = endpoint
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.client = ChatClient(endpoint)
        self._loop = BackgroundLoop("llm-openai")

    def simulate(self, messages: list[dict[str, str]], json_schema: dict | None, seed: int | None) -> str:
        return self._loop.run(self.client.complete(messages, temperature=self.temperature, max_tokens=self.max_tokens,
                                                   seed=seed, json_schema=json_schema))

    def close(self) -> None:
        self._loop.run(self.client.aclose())
        self._loop.close()


class EngineLLM:
    """``JsonLLM`` over a ``VLLMEngine`` living on ``loop``: ``simulate`` blocks the calling thread
    until the engine (which batches all threads' requests) has decoded this one."""

    def __init__(self, engine, loop: BackgroundLoop, temperature: float = 0.0, max_tokens: int = 512):
        self.engine = engine
        self.loop = loop
        self.temperature = temperature
        self.max_tokens = max_tokens

    def simulate(self, messages: list[dict[str, str]], json_schema: dict | None, seed: int | None) -> str:
        return self.loop.run(self.engine.generate_json(messages, json_schema, self.max_tokens, self.temperature, seed))
