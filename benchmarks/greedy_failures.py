"""Where a policy's greedy held-out failures come from, and whether sampling ever fixes them.

Two measurements on the built-in held-out tasks (docs/benchmarks.md, "why RL does not lift it"):

1. Greedy vs sampled: each task once greedily and ``--samples`` times at ``--temperature``,
   through the real rollout worker (vLLM) and checker. Sampled success on the tasks greedy
   decoding fails bounds what sharpening the sampled policy can do for greedy success.
2. Teacher-forced errors: the gold conversation of each task is scored by the model (HF); every
   policy token where the model's argmax is not the gold token is an error, reported with the
   probability the model gave the gold token and the text around it.

    .venv/bin/python benchmarks/greedy_failures.py --model agentrl/assets/tiny-agent
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections import Counter


def greedy_vs_sampled(model: str, tasks: list, samples: int, temperature: float) -> None:
    import ray

    from agentrl.config import load_config
    from agentrl.driver.cluster import init_ray
    from agentrl.rollout.tool_pool import ToolPool
    from agentrl.rollout.worker import RolloutWorker

    cfg = load_config("configs/quickstart.yaml", [f"model.path={model}"])
    init_ray(cfg)
    try:
        pool = ToolPool.create(1, 0.1, 64)
        worker = RolloutWorker.options(num_cpus=1).remote(model, cfg.rollout, cfg.model.dtype, pool.actors, 0)
        ray.get(worker.start.remote())
        greedy = {r["task_id"]: r["outcome"] for r in ray.get(worker.evaluate.remote(tasks))}
        sampled: dict[str, list[float]] = {}
        for i in range(0, len(tasks), 8):
            summaries = ray.get(worker.rollout.remote(tasks[i : i + 8], samples, temperature, 1.0, i))[0]
            sampled.update({s.task_id: s.outcome for s in summaries})
        ray.get(worker.shutdown.remote())
    finally:
        ray.shutdown()
    fail = [t for t in greedy if greedy[t] == 0]
    solved = [t for t in greedy if greedy[t] == 1]
    print(f"greedy success {len(solved)}/{len(greedy)}; pass@{samples} at T={temperature}: "
          f"{statistics.mean(any(v) for v in sampled.values()):.2f}")
    for name, ids in (("greedy fails", fail), ("greedy solves", solved)):
        if ids:
            print(f"  tasks {name}: {len(ids)}, sampled success {statistics.mean(statistics.mean(sampled[t]) for t in ids):.3f}, "
                  f"with >= 1 success in {samples}: {sum(any(sampled[t]) for t in ids)}")


def teacher_forced_errors(model_path: str, tasks: list, show: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.agent.chat import ChatFormatter
    from agentrl.agent.episode import EpisodeLimits, run_episode
    from agentrl.agent.gold import GoldPolicy
    from agentrl.envs.session import LocalEnvSession

    tok = AutoTokenizer.from_pretrained(model_path)
    formatter = ChatFormatter(tok)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    p_gold, where, episodes_with_error = [], Counter(), 0
    for task in tasks:
        ep = asyncio.run(run_episode(task, GoldPolicy(task, formatter), LocalEnvSession(task), formatter,
                                     EpisodeLimits(max_episode_tokens=1 << 20)))
        with torch.no_grad():
            logp = model(torch.tensor([ep.token_ids])).logits[0, :-1].log_softmax(-1)
        errors = 0
        for pos in range(1, len(ep.token_ids)):
            gold, row = ep.token_ids[pos], logp[pos - 1]
            if ep.response_mask[pos] and int(row.argmax()) != gold:
                errors += 1
                p_gold.append(float(row[gold].exp()))
                where[f"{tok.decode(ep.token_ids[max(0, pos - 6):pos])!r} -> gold {tok.decode([gold])!r}, "
                      f"argmax {tok.decode([int(row.argmax())])!r}"] += 1
        episodes_with_error += errors > 0
    print(f"teacher-forced: {episodes_with_error}/{len(tasks)} gold episodes have an argmax error; {len(p_gold)} errors")
    if p_gold:
        q = statistics.quantiles(p_gold, n=4)
        print(f"  p(gold token) at the errors: median {statistics.median(p_gold):.3f}, quartiles {q[0]:.3f} / {q[2]:.3f}")
        for text, n in where.most_common(show):
            print(f"  {n:3d}  {text}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="agentrl/assets/tiny-agent")
    ap.add_argument("--tasks", type=int, default=96, help="first N held-out tasks for the sampling part")
    ap.add_argument("--gold-tasks", type=int, default=80, help="first N held-out tasks for the teacher-forced part")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--show", type=int, default=15, help="most common error contexts to print")
    args = ap.parse_args()

    from agentrl.config.process_env import set_default_env
    from agentrl.envs.builtin.generator import builtin_split

    set_default_env()
    heldout = builtin_split("heldout")
    greedy_vs_sampled(args.model, heldout[: args.tasks], args.samples, args.temperature)
    teacher_forced_errors(args.model, heldout[: args.gold_tasks], args.show)


if __name__ == "__main__":
    main()
