"""The synthesizer interface and the gates every synthesized task passes (docs/design.md §5).

A synthesizer turns one boundary *seed* task into candidate variants. Whatever produced them
(``resample`` without an LLM, ``llm`` with one), a candidate enters the pool only through
``accept_variant``:

* it is a valid ``Task`` whose gold plan re-executes without error on a fresh backend
  (``gold_replay`` — the same replay the checker scores against, so the gold trajectory of an
  accepted task scores 1.0);
* it is not a duplicate: its user turns (the text key) are not those of any task already known
  (seeds, earlier variants, and every held-out task, so synthesis can never leak the evaluation
  set into training).

Synthesizers never raise on bad luck or bad LLM output: they return what they made and count
what they threw away by reason (``SynthesisResult.failures``); the synthesis actor turns those
counts into metrics and pool-log events.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from agentrl.envs.checker import gold_replay
from agentrl.tasks.schema import Provenance, Task, text_key


@dataclass
class SynthesisResult:
    """What one ``synthesize`` call produced: candidates (not yet gated) and discarded attempts."""

    tasks: list[Task] = field(default_factory=list)
    # Candidate generations tried (accepted or not).
    attempts: int = 0
    # Reason -> count of attempts that produced no candidate (e.g. "signature_mismatch",
    # "llm_unreachable", "invalid_json", "judge_rejected").
    failures: Counter = field(default_factory=Counter)


class Synthesizer(Protocol):
    """Makes up to ``n`` variants of ``seed``; deterministic given ``rng_seed`` (for an LLM
    synthesizer: given the LLM's own determinism)."""

    name: str

    def synthesize(self, seed: Task, n: int, rng_seed: int) -> SynthesisResult: ...


def reexecutes(task: Task) -> bool:
    """True when the task's gold plan replays without error on a fresh backend built from its own
    ``initial_state`` (the replay the checker scores against)."""
    try:
        gold_replay(task)
    except Exception:  # noqa: BLE001 - any failure of the gold plan means the task is broken
        return False
    return True


def accept_variant(task: Task, known_keys: set[tuple[str, ...]], known_texts: frozenset[str] = frozenset(),
                   replayed: bool | None = None) -> str | None:
    """``None`` if ``task`` may enter the pool, else the reason it may not.

    ``known_keys`` holds the text keys of every task already known; ``known_texts`` holds single
    user utterances that no variant may contain (held-out turns). ``replayed`` is the result of
    ``reexecutes(task)`` when the caller already has it (the synthesis actor replays outside its
    lock); None = replay here.
    """
    key = text_key(task)
    if key in known_keys:
        return "duplicate"
    if any(t.user in known_texts for t in task.turns):
        return "heldout_overlap"
    if not any(task.gold_calls(u) for u in range(len(task.turns))):
        return "no_gold_calls"
    if not (reexecutes(task) if replayed is None else replayed):
        return "reexecution_failed"
    return None


def mark_synthesized(task: Task, task_id: str, parent: Task, step: int, synthesizer: str) -> Task:
    """A copy of ``task`` with its pool id and provenance (parent, creation step, synthesizer)."""
    return task.model_copy(update={
        "id": task_id,
        "provenance": Provenance(kind="synth", parent_id=parent.id, created_step=step, synthesizer=synthesizer),
    })
