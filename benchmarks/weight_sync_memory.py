"""Host memory of a CPU rollout engine across object-store weight syncs (docs/benchmarks.md,
"Weight sync memory").

One vLLM engine (``agentrl.engines.vllm_engine.VLLMEngine``, the config's ``rollout.engine``)
in this process, which plays the rollout worker's part: it holds the blob and hands it to the
engine by ``collective_rpc``, as ``RolloutWorker.load_weights`` does. The blob is the model's fp32
weights as the learner publishes them, in ``--blob-dtype``. Prints the resident memory (RSS) of
this process, vLLM's EngineCore and its Worker, at start and after each sync, and writes them as
JSON (``--out``).

    .venv/bin/python benchmarks/weight_sync_memory.py --model .cache/models/smollm2-warm \\
        --blob-dtype bfloat16 --syncs 4 --label "after"

To measure code from before a change in the same session, run the script from that commit's
worktree (``PYTHONPATH=<worktree>``) with ``--blob-dtype float32`` (older code has no cast).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

GiB = 1024**3


def rss_by_role() -> dict[str, float]:
    """GiB resident in this process, vLLM's EngineCore and its Worker (children, by their title)."""
    import psutil

    me = psutil.Process()
    out = {"rollout_worker (this process)": me.memory_info().rss / GiB, "EngineCore": 0.0, "Worker": 0.0}
    for child in me.children(recursive=True):
        try:
            title = " ".join(child.cmdline()) or child.name()
            rss = child.memory_info().rss / GiB
        except psutil.Error:
            continue
        for role in ("EngineCore", "Worker"):
            if f"VLLM::{role}" in title:
                out[role] += rss
    out["total"] = sum(out.values())
    return out


async def measure(args) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.config import load_config
    from agentrl.engines.vllm_engine import VLLMEngine
    from agentrl.weight_sync.object_store import weights_to_blob

    cfg = load_config(args.config, [f"model.path={args.model}", *args.overrides])
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    state = {k: v for k, v in model.state_dict().items() if not (model.config.tie_word_embeddings and k == "lm_head.weight")}
    del model
    blob = weights_to_blob(state) if args.blob_dtype == "float32" else weights_to_blob(state, args.blob_dtype)
    del state
    print(f"blob: {len(blob) / GiB:.3f} GiB ({args.blob_dtype}); engine dtype "
          f"{cfg.rollout.engine.dtype or cfg.model.dtype}, kv_cache_gib {cfg.rollout.engine.kv_cache_gib}", flush=True)
    engine = VLLMEngine(args.model, cfg.rollout.engine, dtype=cfg.model.dtype, seed=0)
    rows = []
    try:
        time.sleep(2)
        rows.append({"after": "start", **rss_by_role()})
        for i in range(1, args.syncs + 1):
            t0 = time.perf_counter()
            await engine.load_weights(blob)
            rows.append({"after": f"sync {i}", "seconds": time.perf_counter() - t0, **rss_by_role()})
        for r in rows:
            print("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()), flush=True)
    finally:
        engine.engine.shutdown()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/smollm2_bank.yaml")
    ap.add_argument("--model", default=".cache/models/smollm2-warm")
    ap.add_argument("--blob-dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--syncs", type=int, default=4)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=".cache/benchmarks/weight_sync_memory.json")
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = ap.parse_args()
    from agentrl.config.process_env import set_default_env

    set_default_env()
    rows = asyncio.run(measure(args))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = json.loads(out.read_text()) if out.is_file() else []
    runs.append({"label": args.label, "blob_dtype": args.blob_dtype, "rows": rows})
    out.write_text(json.dumps(runs, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
