"""The ``resample`` synthesizer (RODS offline default, docs/design.md §5): same skill signature, new
plan and values, no LLM.

Builtin tasks: the seeded generator draws tasks of the seed's shape (category, domain classes,
calls per turn — ``generator.draw_shaped``), executing each plan while it writes it, so ids,
results and answer facts are real; a draw is kept only when its full skill signature (including
the data-flow graph between calls and its depth) equals the seed's. Operations differ from draw
to draw, so a variant exercises the same skills through new functions of the same classes, new
entities, values and wording.

BFCL tasks: see ``agentrl.rods.resample_bfcl`` (same plan, values substituted consistently in the
user turns, arguments and initial state, re-executed).

Deterministic given (seed task id, ``rng_seed``).
"""

from __future__ import annotations

import random

from agentrl.envs.builtin.generator import CATEGORIES, Shape, draw_shaped
from agentrl.envs.builtin.ops import Reject
from agentrl.rods.resample_bfcl import BFCLResampler
from agentrl.rods.signature import skill_signature
from agentrl.rods.synthesizer import SynthesisResult
from agentrl.tasks.schema import Task, text_key


def generator_can_draw(category: str, calls_per_turn: tuple[int, ...]) -> bool:
    """Whether the builtin generator makes tasks of this shape at all (a hand-written or imported
    builtin task may have another): 1–3 calls in every turn of a base task; in a miss_* task one
    empty-gold turn followed by its single-call follow-up, every other turn 1–3 calls."""
    if category not in dict(CATEGORIES) or not calls_per_turn or any(not 0 <= c <= 3 for c in calls_per_turn):
        return False
    empty = [i for i, c in enumerate(calls_per_turn) if c == 0]
    if category == "base":
        return not empty
    return len(empty) == 1 and empty[0] + 1 < len(calls_per_turn) and calls_per_turn[empty[0] + 1] == 1


class BuiltinResampler:
    """Variants of builtin seeds by shaped generation and signature matching."""

    name = "resample"

    def __init__(self, max_draws_per_variant: int = 200):
        # Measured on the 400 train seeds: see tests/test_rods_resample.py and docs/benchmarks.md.
        self.max_draws_per_variant = max_draws_per_variant

    def synthesize(self, seed: Task, n: int, rng_seed: int) -> SynthesisResult:
        out = SynthesisResult()
        if seed.backend != "builtin":
            out.failures["unsupported_backend"] += 1
            return out
        target = skill_signature(seed)
        if not generator_can_draw(seed.category, target.calls_per_turn):
            out.failures["unsupported_shape"] += 1
            return out
        shape = Shape(seed.category, target.classes, target.calls_per_turn)
        rng = random.Random(f"agentrl-rods-resample:{seed.id}:{rng_seed}")
        seen = {text_key(seed)}
        for _ in range(n * self.max_draws_per_variant):
            if len(out.tasks) == n:
                break
            out.attempts += 1
            try:
                task = draw_shaped(rng, shape)
            except Reject:
                out.failures["draw_rejected"] += 1
                continue
            if skill_signature(task) != target:
                out.failures["signature_mismatch"] += 1
                continue
            if text_key(task) in seen:
                out.failures["duplicate"] += 1
                continue
            seen.add(text_key(task))
            out.tasks.append(task)
        return out


class ResampleSynthesizer:
    """``resample`` for every executable backend: builtin by shaped generation, BFCL by value
    substitution; other backends (e.g. LLM-simulated ``sgls``) cannot be resampled."""

    name = "resample"

    def __init__(self) -> None:
        self.builtin = BuiltinResampler()
        self._bfcl = None  # built on first BFCL seed: importing bfcl-eval and its corpus is slow

    def synthesize(self, seed: Task, n: int, rng_seed: int) -> SynthesisResult:
        if seed.backend == "builtin":
            return self.builtin.synthesize(seed, n, rng_seed)
        if seed.backend == "bfcl":
            if self._bfcl is None:

                self._bfcl = BFCLResampler()
            return self._bfcl.synthesize(seed, n, rng_seed)
        out = SynthesisResult()
        out.failures["unsupported_backend"] += 1
        return out
