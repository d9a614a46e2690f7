"""Yield of the ``resample`` synthesizer: variants per seed, attempts, failure reasons, time.

For each source, asks ``--variants`` variants of each of the first ``--seeds`` tasks (per BFCL
category) and gates every candidate the way the pool does (re-execution on a fresh backend,
duplicates, held-out text). No model involved; CPU only.

    .venv/bin/python benchmarks/rods_synthesis_yield.py
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from agentrl.envs.sources import resolve_task_sources
from agentrl.rods.resample import ResampleSynthesizer
from agentrl.rods.synthesizer import accept_variant
from agentrl.tasks.schema import text_key

SOURCES = {"builtin:train": "builtin:heldout", "bfcl:base:train": "bfcl:all", "bfcl:miss_func:train": "bfcl:all",
           "bfcl:miss_param:train": "bfcl:all", "bfcl:long_context:train": "bfcl:all"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=60, help="seed tasks per source")
    p.add_argument("--variants", type=int, default=2, help="variants asked per seed")
    args = p.parse_args()
    synth = ResampleSynthesizer()
    print("| seeds | variants asked | accepted (gated) | seeds with ≥1 | attempts | top failure reasons | ms / accepted |")
    print("|---|---|---|---|---|---|---|")
    for source, heldout in SOURCES.items():
        seeds = resolve_task_sources(source)[: args.seeds]
        # as the pool does: held-out turns, minus generic turns the seeds share
        forbidden = (frozenset(t.user for task in resolve_task_sources(heldout) for t in task.turns)
                     - {t.user for s in seeds for t in s.turns})
        known = {text_key(s) for s in seeds}
        accepted = attempts = covered = 0
        fails: Counter = Counter()
        t0 = time.perf_counter()
        for k, seed in enumerate(seeds):
            out = synth.synthesize(seed, args.variants, k)
            attempts += out.attempts
            fails.update(out.failures)
            ok = 0
            for v in out.tasks:
                reason = accept_variant(v, known, forbidden)
                if reason is None:
                    known.add(text_key(v))
                    ok += 1
                else:
                    fails[f"gate:{reason}"] += 1
            accepted += ok
            covered += ok > 0
        ms = (time.perf_counter() - t0) * 1000 / max(1, accepted)
        top = ", ".join(f"{r} {n}" for r, n in fails.most_common(3))
        print(f"| {source} ({len(seeds)}) | {len(seeds) * args.variants} | {accepted} | {covered} | {attempts} | {top} "
              f"| {ms:.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
