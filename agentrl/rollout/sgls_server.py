"""SGLSServer: one Ray actor that simulates schema-only tools for the whole cluster.

Simulator-pool actors host episodes, and the episodes of one group can land on different actors
(sessions are placed by hashing the session id). The response cache only removes simulator noise
from a group if every episode of the group consults the *same* cache, so the cache — and the LLM
behind it — live here, in one actor, and each episode's ``SGLSBackend`` reaches it through
``RemoteSimulator``: a synchronous adapter that calls ``SGLSServer.simulate`` with ``ray.get``
(backends run inside threaded tool-pool actors, where blocking a thread is the intended
back-pressure). Validation of the call happens in the backend, before anything is sent here.

The LLM is either an in-cluster vLLM engine (``model_path`` + engine config) or any
OpenAI-compatible endpoint. The actor is threaded (``max_concurrency``): concurrent requests from
many episodes are in flight at once and vLLM batches them. The engine runs on a private event
loop thread; request threads submit to it. Its structured outputs use xgrammar with
``disable_any_whitespace`` (``SGLS_STRUCTURED_OUTPUTS``): otherwise a weak model fills
``max_tokens`` with the whitespace the JSON grammar admits between tokens.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import ray

from agentrl.api import EnvError
from agentrl.envs.sgls.backend import ToolSimulator
from agentrl.envs.sgls.cache import SimulationCache
from agentrl.llm.adapters import BackgroundLoop, EngineLLM, OpenAILLM
from agentrl.llm.client import LLMEndpoint
from agentrl.tasks.schema import ToolCall, ToolSpec

SGLS_STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}


def start_engine(loop: BackgroundLoop, model_path: str, engine_cfg, dtype: str, seed: int):
    """Build the engine *on* ``loop``, so vLLM's output handler belongs to the loop that serves it."""
    from agentrl.engines.vllm_engine import VLLMEngine

    async def make():
        return VLLMEngine(model_path, engine_cfg, dtype=dtype, seed=seed, structured_outputs=SGLS_STRUCTURED_OUTPUTS)

    return loop.run(make())


def stop_engine(loop: BackgroundLoop, engine) -> None:
    """Shut the engine down *on* ``loop`` and let its cancelled output handler finish there, so
    no pending task keeps the engine alive until interpreter exit (where vLLM's ``__del__``
    would run against a half-torn-down interpreter)."""

    async def stop():
        engine.shutdown()
        await asyncio.sleep(0)

    loop.run(stop())


@ray.remote(max_concurrency=64)
class SGLSServer:
    """Owns the simulator LLM and the shared ``SimulationCache``.

    Exactly one of ``model_path`` (with ``engine_cfg``: an ``EngineConfig`` or anything with its
    fields) and ``endpoint`` must be given. ``temperature`` / ``max_tokens`` apply to every
    simulated response; ``cache_size`` bounds the cache (entries, LRU); ``max_retries`` is the
    number of extra attempts on invalid output. Give the actor GPUs through ``.options`` when the
    engine should run on one.
    """

    def __init__(self, *, model_path: str | None = None, engine_cfg=None, dtype: str = "float32", engine_seed: int = 0,
                 endpoint: LLMEndpoint | None = None, temperature: float = 0.0, max_tokens: int = 512,
                 cache_size: int = 100_000, max_retries: int = 2, max_state_chars: int = 8000):
        if (model_path is None) == (endpoint is None):
            raise ValueError("SGLSServer needs exactly one of model_path (in-cluster vLLM) and endpoint (OpenAI-compatible)")
        self._loop: BackgroundLoop | None = None
        self.engine = None
        if model_path is not None:
            if engine_cfg is None:
                raise ValueError("SGLSServer: model_path needs engine_cfg (kv_cache_gib, max_model_len, ...)")
            self._loop = BackgroundLoop("sgls-engine")
            self.engine = start_engine(self._loop, str(model_path), engine_cfg, dtype, engine_seed)
            self.llm: Any = EngineLLM(self.engine, self._loop, temperature, max_tokens)
        else:
            self.llm = OpenAILLM(endpoint, temperature, max_tokens)
        self.simulator = ToolSimulator(self.llm, SimulationCache(cache_size), max_retries=max_retries,
                                       max_state_chars=max_state_chars)

    def simulate(self, task_id: str, history: list[dict[str, Any]], call: Mapping[str, Any] | ToolCall,
                 tool_spec: Mapping[str, Any] | ToolSpec, initial_state: Mapping[str, Any] | None = None,
                 seed: int | None = None) -> Any:
        """The observation for a (validated) call; never raises (see ``ToolSimulator``)."""
        return self.simulator.simulate(task_id, history, call, tool_spec, initial_state, seed)

    def stats(self) -> dict[str, float]:
        return self.simulator.stats()

    def shutdown(self) -> None:
        """Stop the engine (its core process) and the loops; the actor is unusable afterwards."""
        if self.engine is not None:
            stop_engine(self._loop, self.engine)
            self.engine = None
        if isinstance(self.llm, OpenAILLM):
            self.llm.close()
        if self._loop is not None:
            self._loop.close()
            self._loop = None


class RemoteSimulator:
    """The simulator an ``SGLSBackend`` uses on a cluster: ``SGLSServer.simulate`` via ``ray.get``.

    Picklable (it holds only the actor handle), so a factory closing over it can be shipped to
    every tool-pool actor. ``timeout_s`` bounds one call; a timeout or a dead server raises
    ``EnvError``, which ends the episode (``ENV_ERROR``: dropped, counted). The server has
    ``max_restarts`` (``runtime.max_actor_restarts``): later calls wait for the restarted one.
    """

    def __init__(self, server, timeout_s: float | None = 300):
        self.server = server
        self.timeout_s = timeout_s

    def simulate(self, task_id: str, history: list[dict[str, Any]], call: ToolCall | Mapping[str, Any],
                 tool_spec: Mapping[str, Any] | ToolSpec, initial_state: Mapping[str, Any] | None = None,
                 seed: int | None = None) -> Any:
        if isinstance(call, ToolCall):
            call = {"name": call.name, "arguments": dict(call.arguments)}
        if isinstance(tool_spec, ToolSpec):
            tool_spec = tool_spec.model_dump()
        ref = self.server.simulate.remote(task_id, history, call, tool_spec, initial_state, seed)
        try:
            return ray.get(ref, timeout=self.timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
            raise EnvError(f"SGLS server unavailable: {type(err).__name__}: {err}") from err

    def stats(self) -> dict[str, float]:
        return ray.get(self.server.stats.remote(), timeout=self.timeout_s)
