"""Shared fixtures: offline/cached environment, a tiny SFT'd model, and one embedded Ray cluster.

Caches live in the repo's ignored ``.cache/`` (HF, vLLM, torch extensions) so repeated runs reuse
the compiled DeepSpeed comm op; nothing touches the network (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("AGENTRL_CACHE", str(REPO / ".cache"))

from agentrl.config.process_env import set_default_env  # noqa: E402

set_default_env()


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """A briefly fine-tuned tiny model (format only, not competence): enough to exercise the stack.

    Cached under .cache/agentrl-tests keyed by its recipe, so only the first run pays ~1 min.
    """
    from agentrl.models.tiny_model import TinyModelRecipe, make_model

    recipe = TinyModelRecipe(sft_steps=40, sft_tasks=0, sft_batch=8, habit_steps=0)
    return make_model(REPO / ".cache" / "agentrl-tests" / "tiny-model", recipe=recipe, log=lambda *a: None)


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    import ray

    ray.init(num_cpus=4, include_dashboard=False, _temp_dir=os.environ.get("RAY_TMPDIR", "/tmp/agentrl-ray"), log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def formatter(tiny_model_dir):
    """The chat formatter over the tiny test model's tokenizer, as the runtime loads it."""
    from transformers import AutoTokenizer

    from agentrl.agent.chat import ChatFormatter

    return ChatFormatter(AutoTokenizer.from_pretrained(tiny_model_dir))
