"""Engine-vs-learner logprob agreement for any model: vLLM's sampled-token logprobs against the
DeepSpeed learner's recomputation of the same tokens, at the run's dtype.

    .venv/bin/python benchmarks/logprob_agreement.py --config configs/smollm2_bank.yaml \
        --model .cache/models/smollm2-warm --tasks 8 --samples 2

It builds the run's real pieces on a local Ray cluster: one ``RolloutWorker`` (the vLLM engine, the
episode loop and the bank tools, with the config's ``rollout`` and ``agent`` sections) and one
``LearnerActor`` (DeepSpeed, ``learner``/``algo`` sections), both loading ``--model``. Both hold the
same weights (no update runs), so every gap is numerics: vLLM's CPU kernels and KV-cache reuse
across an episode's messages vs one HF forward over the whole episode. Each episode is sampled at
T = 1 (top-p 1) on a held-out task; only policy tokens (what the model wrote) are compared.
Prints and writes (``--out``) the number of tokens, the largest and mean |gap|, and quantiles.
The training run's ``learner/logprob_mismatch`` is the same mean over each step's batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/smollm2_bank.yaml")
    ap.add_argument("--model", help="model folder (default: the config's model.path)")
    ap.add_argument("--split", default="bank-heldout", help="builtin split the tasks come from")
    ap.add_argument("--tasks", type=int, default=8, help="tasks (the split's first N)")
    ap.add_argument("--samples", type=int, default=2, help="sampled episodes per task")
    ap.add_argument("--out", default=".cache/benchmarks/logprob_agreement.json")
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = ap.parse_args()

    import ray

    from agentrl.config import load_config
    from agentrl.driver.cluster import init_ray
    from agentrl.envs.builtin.generator import builtin_split
    from agentrl.learning.learner import LearnerActor
    from agentrl.rollout.tool_pool import ToolPool
    from agentrl.rollout.worker import RolloutWorker

    cfg = load_config(args.config, [*([f"model.path={args.model}"] if args.model else []), *args.overrides])
    model, dtype = str(cfg.model.path), cfg.model.dtype
    init_ray(cfg)
    started = time.time()
    pool = ToolPool.create(1, cfg.runtime.tool_actor_cpus, cfg.tools.max_concurrency)
    worker = RolloutWorker.options(num_cpus=1).remote(model, cfg.rollout, dtype, pool.actors, 0, agent_cfg=cfg.agent)
    learner = LearnerActor.options(num_cpus=1).remote(cfg, model)
    ray.get(worker.start.remote())
    print(f"engine and learner up ({time.time() - started:.0f} s): {model}, {dtype}", flush=True)

    gaps, episodes = [], 0
    for task in builtin_split(args.split)[: args.tasks]:
        for sample in range(args.samples):
            episode = ray.get(worker.sample_one.remote(task, sample))
            learner_lp = ray.get(learner.compute_logprobs.remote([episode.token_ids]))[0]
            policy = [i for i, m in enumerate(episode.response_mask) if m]
            gaps += [abs(learner_lp[i] - episode.logprobs[i]) for i in policy]
            episodes += 1
            print(f"  {task.id} #{sample}: {len(episode.token_ids)} tokens, {len(policy)} policy, "
                  f"max gap {max((abs(learner_lp[i] - episode.logprobs[i]) for i in policy), default=0):.2e}",
                  flush=True)
    if not gaps:
        raise SystemExit("logprob_agreement: no policy tokens were sampled; nothing to compare")
    ranked = sorted(gaps)
    result = {
        "model": model, "dtype": dtype, "split": args.split, "episodes": episodes, "policy_tokens": len(gaps),
        "max_gap": ranked[-1], "mean_gap": statistics.fmean(gaps),
        "p50_gap": ranked[len(ranked) // 2], "p99_gap": ranked[int(0.99 * (len(ranked) - 1))],
        "seconds": round(time.time() - started, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    ray.get(worker.shutdown.remote())
    ray.shutdown()


if __name__ == "__main__":
    main()
