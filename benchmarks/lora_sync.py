"""LoRA to the engines: merged weights (what agentrl does) vs vLLM's LoRA adapters, measured.

One vLLM engine with LoRA enabled serves the base model plus a trained-looking adapter (random
B, as after some steps); a second, plain engine gets the *merged* weights (W + (alpha/r) B A, from
``engines/lora.py``) through the same worker call agentrl's object-store sync uses. Both run the
same greedy prompts; reported: generation tokens/s of each (median of repeats, after a warm-up),
the time to hand a new update to the engine (merged: load the full weights; adapter: load the
adapter folder as a new LoRA id), the payload sizes, and how far the two engines' sampled-token
logprobs are apart (they compute the same function; fp32).

    .venv/bin/python benchmarks/lora_sync.py [--rank 16] [--prompts 32] [--tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

MODEL = Path(__file__).resolve().parents[1] / "agentrl" / "assets" / "tiny-agent"


def _generate(llm, prompts, sp, lora=None):
    t0 = time.perf_counter()
    out = llm.generate(prompts, sp, lora_request=lora, use_tqdm=False)
    seconds = time.perf_counter() - t0
    return out, sum(len(o.outputs[0].token_ids) for o in out) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    from agentrl.config.schema import LoraConfig
    from agentrl.engines.lora import apply_lora, merged_weights, save_adapter
    from agentrl.weight_sync.object_store import weights_to_blob

    tmp = Path(tempfile.mkdtemp(prefix="lora-sync-"))
    torch.manual_seed(0)
    peft = apply_lora(AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval(),
                      LoraConfig(rank=args.rank, alpha=2.0 * args.rank))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    save_adapter(peft, tmp / "adapter")
    merged = merged_weights(peft, drop_keys={"lm_head.weight"} if peft.config.tie_word_embeddings else ())
    blob = weights_to_blob(merged)
    adapter_bytes = sum(f.stat().st_size for f in (tmp / "adapter").iterdir())

    # agentrl's worker extension on both: the same (non-prepacked) CPU linear kernels, and its weight loading
    common = dict(dtype="float32", enforce_eager=True, max_model_len=1024, seed=0,
                  worker_extension_cls="agentrl.engines.vllm_worker_ext.AgentRLWorkerExtension")
    prompts = [f"user request {i}: " + "check the balance " * (i % 5 + 1) for i in range(args.prompts)]
    sp = SamplingParams(max_tokens=args.tokens, min_tokens=args.tokens, temperature=0.0, logprobs=0)
    rows = {}
    lora_llm = LLM(str(MODEL), enable_lora=True, max_lora_rank=max(16, args.rank), max_loras=1, **common)
    t0 = time.perf_counter()
    request = LoRARequest("update-1", 1, str(tmp / "adapter"))
    _generate(lora_llm, prompts[:1], sp, request)  # loads the adapter
    rows["adapter: hand over an update (s)"] = time.perf_counter() - t0
    _generate(lora_llm, prompts, sp, request)  # warm-up
    out_adapter, _ = _generate(lora_llm, prompts, sp, request)
    rows["adapter: tokens/s"] = statistics.median(_generate(lora_llm, prompts, sp, request)[1] for _ in range(args.repeats))
    rows["base model on the LoRA engine: tokens/s"] = statistics.median(
        _generate(lora_llm, prompts, sp)[1] for _ in range(args.repeats))
    del lora_llm

    plain = LLM(str(MODEL), **common)
    t0 = time.perf_counter()
    _load_merged(plain, blob)
    rows["merged: hand over an update (s)"] = time.perf_counter() - t0
    _generate(plain, prompts, sp)  # warm-up
    out_merged, _ = _generate(plain, prompts, sp)
    rows["merged: tokens/s"] = statistics.median(_generate(plain, prompts, sp)[1] for _ in range(args.repeats))
    same = sum(a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(out_adapter, out_merged))
    gaps = [abs(list(la.values())[0].logprob - list(lb.values())[0].logprob)
            for a, b in zip(out_adapter, out_merged) if a.outputs[0].token_ids == b.outputs[0].token_ids
            for la, lb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs)]
    rows["greedy outputs identical (of prompts)"] = f"{same}/{len(prompts)}"
    rows["max |logprob gap| adapter vs merged"] = max(gaps) if gaps else float("nan")
    rows["payload: merged weights (MB)"] = len(blob) / 1e6
    rows["payload: adapter (MB)"] = adapter_bytes / 1e6
    rows["tokens/s ratio adapter / merged"] = rows["adapter: tokens/s"] / rows["merged: tokens/s"]
    print("| measurement | value |\n|---|---|")
    for k, v in rows.items():
        print(f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |")


def _load_merged(llm, blob: bytes) -> None:
    """The merged weights into the engine, through the worker call agentrl's object-store sync uses."""
    llm.collective_rpc("agentrl_load_weights", args=(blob,))


if __name__ == "__main__":
    main()
