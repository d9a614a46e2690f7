"""GAE: the vectorized scan (agentrl.algos.critic.gae) against the position-by-position recursion.

    .venv/bin/python benchmarks/gae_speed.py
"""

from __future__ import annotations

import time

import torch

from agentrl.algos.critic import gae


def gae_loop(r, v, m, gamma, lam):
    adv = torch.zeros_like(r)
    next_v = torch.zeros(r.shape[0])
    next_a = torch.zeros_like(next_v)
    for pos in range(r.shape[1] - 1, -1, -1):
        mt = m[:, pos]
        a_t = r[:, pos] + gamma * next_v - v[:, pos] + gamma * lam * next_a
        adv[:, pos] = torch.where(mt, a_t, torch.zeros_like(a_t))
        next_v = torch.where(mt, v[:, pos], next_v)
        next_a = torch.where(mt, a_t, next_a)
    return adv


def best_of(fn, *args, repeats=5):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return min(times)


if __name__ == "__main__":
    print("| rows × tokens | recursion | vectorized | speed-up |\n|---|---|---|---|")
    for b, t in ((64, 600), (64, 4096), (256, 16384)):
        g = torch.Generator().manual_seed(0)
        r, v = torch.randn(b, t, generator=g), torch.randn(b, t, generator=g)
        m = torch.rand(b, t, generator=g) < 0.7
        slow, fast = best_of(gae_loop, r, v, m, 1.0, 0.95), best_of(gae, r, v, m, 1.0, 0.95)
        print(f"| {b} × {t} | {slow * 1e3:.1f} ms | {fast * 1e3:.1f} ms | {slow / fast:.1f}× |", flush=True)
