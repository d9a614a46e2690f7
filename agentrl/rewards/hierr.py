"""HierR process score R_tool (SLCA-GRPO hierarchical rewards; docs/design.md §3), gold-matched, in [0, 1].

    R_tool = 0.10·format + 0.25·name_f1 + 0.15·key_jaccard + 0.20·value_match + 0.30·parallel

Inputs are plain data so the scorer runs anywhere (rollout worker, learner, tests): an episode is a
list of turns, a turn a list of steps, a step a list of calls ``{"name": str, "arguments": dict}``
(``ToolCall`` objects are accepted too). For the model, a step is the valid calls of one assistant
message that tried to call tools; for the gold, ``Turn.gold``.

The model's list may be shorter than the gold's (the episode stopped early); missing turns count
as turns with no calls, so a cut-off episode cannot score like a finished one.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

Call = Any  # Mapping {"name", "arguments"} or an object with .name / .arguments (ToolCall)
Step = Sequence[Call]
TurnSteps = Sequence[Step]

COMPONENTS = ("format", "name_f1", "key_jaccard", "value_match", "parallel")


@dataclass(frozen=True)
class HierRWeights:
    """Weights of the HierR components.

    The components are SLCA-GRPO's hierarchical reward; the default weights are this project's
    choice (docs/design.md §3). They sum to 1, so R_tool stays in [0, 1]; custom weights are
    normalised by their sum in ``process_reward``.
    """

    format: float = 0.10  # valid call blocks / call blocks
    name_f1: float = 0.25  # multiset F1 of called vs gold tool names
    key_jaccard: float = 0.15  # argument-name overlap, per gold call
    value_match: float = 0.20  # loosely equal argument values, per gold call
    parallel: float = 0.30  # the first step batches as many calls as the gold's

    def __post_init__(self) -> None:
        values = [getattr(self, f.name) for f in fields(self)]
        if any(not math.isfinite(v) or v < 0 for v in values) or sum(values) <= 0:
            raise ValueError(f"HierR weights must be finite, >= 0 and not all zero: {self}")


# ---------------------------------------------------------------------------------- loose equality

_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def _as_number(x: Any) -> float | None:
    """A real number (not bool) as float, or a plain decimal string as float; else None."""
    if isinstance(x, bool):
        return None
    try:
        if isinstance(x, (int, float)):
            return float(x)
        if isinstance(x, str) and _NUMBER_RE.fullmatch(x.strip()):
            return float(x.strip())
    except OverflowError:  # an int too large for a float
        return None
    return None


def loosely_equal(a: Any, b: Any) -> bool:
    """Argument-value equality that forgives JSON typing and formatting slips.

    * None equals only None; a bool equals only the same bool (``True`` is not ``1``).
    * When either side is a number, both must read as the same float: ``20 == 20.0 == "20"``
      (decimal strings only, compared with ``math.isclose(rel_tol=1e-9)``). Two strings are compared
      as strings, so ids such as ``"007"`` and ``"7"`` stay different.
    * Strings: equal after ``strip()`` and ``casefold()``.
    * Lists/tuples: same length and pairwise loosely equal, in order. Dicts: same keys, values
      loosely equal. Anything else: ``==``.
    """
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, (int, float)) or isinstance(b, (int, float)):
        x, y = _as_number(a), _as_number(b)
        return x is not None and y is not None and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().casefold() == b.strip().casefold()
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(loosely_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(loosely_equal(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:
        return False


# -------------------------------------------------------------------------------------- components


def _name_args(call: Call) -> tuple[str, Mapping[str, Any]]:
    if isinstance(call, Mapping):
        return str(call.get("name", "")), call.get("arguments") or {}
    return str(call.name), call.arguments or {}


def turn_calls(turn: TurnSteps) -> list[tuple[str, Mapping[str, Any]]]:
    """Every call of a turn as (name, arguments), steps flattened in order."""
    return [_name_args(c) for step in turn for c in step]


def multiset_f1(pred: Sequence[str], gold: Sequence[str]) -> float:
    """F1 of two multisets: 2·|P ∩ G| / (|P| + |G|) with multiset intersection; both empty → 1."""
    if not pred and not gold:
        return 1.0
    common = sum((Counter(pred) & Counter(gold)).values())
    return 2.0 * common / (len(pred) + len(gold))


def key_jaccard(pred_args: Mapping[str, Any], gold_args: Mapping[str, Any]) -> float:
    """|K_pred ∩ K_gold| / |K_pred ∪ K_gold| over argument names; both empty → 1."""
    kp, kg = set(pred_args), set(gold_args)
    return len(kp & kg) / len(kp | kg) if kp | kg else 1.0


def value_match(pred_args: Mapping[str, Any], gold_args: Mapping[str, Any]) -> float:
    """Fraction of gold arguments present in the prediction with a loosely equal value; gold empty → 1."""
    if not gold_args:
        return 1.0
    hits = sum(1 for k, v in gold_args.items() if k in pred_args and loosely_equal(pred_args[k], v))
    return hits / len(gold_args)


def _argument_scores(pred_turns: Sequence[TurnSteps], gold_turns: Sequence[TurnSteps]) -> tuple[float, float]:
    """Mean (key_jaccard, value_match) over every gold call with arguments in the episode.

    Per turn, gold calls are matched greedily in plan order: each takes the unused predicted call
    of the same name in the same turn with the highest key_jaccard + value_match (first on ties);
    with no candidate it scores 0 on both. No gold call with arguments → (1, 1).
    """
    kj_scores: list[float] = []
    vm_scores: list[float] = []
    for u, gold_turn in enumerate(gold_turns):
        pred = turn_calls(pred_turns[u]) if u < len(pred_turns) else []
        used = [False] * len(pred)
        for name, gold_args in turn_calls(gold_turn):
            if not gold_args:
                continue
            best, best_pair = -1, (0.0, 0.0)
            for i, (p_name, p_args) in enumerate(pred):
                if used[i] or p_name != name:
                    continue
                pair = (key_jaccard(p_args, gold_args), value_match(p_args, gold_args))
                if best < 0 or sum(pair) > sum(best_pair):
                    best, best_pair = i, pair
            if best >= 0:
                used[best] = True
            kj_scores.append(best_pair[0])
            vm_scores.append(best_pair[1])
    if not kj_scores:
        return 1.0, 1.0
    return sum(kj_scores) / len(kj_scores), sum(vm_scores) / len(vm_scores)


def _parallel_score(pred_turns: Sequence[TurnSteps], gold_turns: Sequence[TurnSteps]) -> float:
    """Mean over turns whose gold has calls of [len(model's first step) == len(gold's first step)].

    A turn the model never reached, or reached without any step, scores 0. No such turns → 1.
    """
    hits: list[float] = []
    for u, gold_turn in enumerate(gold_turns):
        if not turn_calls(gold_turn):
            continue
        pred_turn = pred_turns[u] if u < len(pred_turns) else []
        ok = len(pred_turn) > 0 and len(pred_turn[0]) == len(gold_turn[0])
        hits.append(1.0 if ok else 0.0)
    return sum(hits) / len(hits) if hits else 1.0


def process_components(
    pred_turns: Sequence[TurnSteps], gold_turns: Sequence[TurnSteps], n_blocks: int, n_valid: int
) -> dict[str, float]:
    """The five HierR components of one episode, each in [0, 1].

    * ``format`` = n_valid / n_blocks over the episode's ``<tool_call>`` blocks; no blocks at all →
      1 when the gold has no calls either, else 0 (silence is not perfect formatting).
    * ``name_f1`` = multiset F1 of every called name vs every gold name over the episode.
    * ``key_jaccard`` / ``value_match``: see ``_argument_scores`` (matching within each turn).
    * ``parallel``: see ``_parallel_score`` (does the first step batch as many calls as the gold's).
    """
    if len(pred_turns) > len(gold_turns):
        raise ValueError(f"{len(pred_turns)} predicted turns for a task of {len(gold_turns)} turns")
    if not 0 <= n_valid <= n_blocks:
        raise ValueError(f"need 0 <= n_valid <= n_blocks, got n_valid={n_valid}, n_blocks={n_blocks}")
    gold_names = [n for t in gold_turns for n, _ in turn_calls(t)]
    pred_names = [n for t in pred_turns for n, _ in turn_calls(t)]
    if n_blocks:
        fmt = n_valid / n_blocks
    else:
        fmt = 0.0 if gold_names else 1.0
    kj, vm = _argument_scores(pred_turns, gold_turns)
    return {
        "format": fmt,
        "name_f1": multiset_f1(pred_names, gold_names),
        "key_jaccard": kj,
        "value_match": vm,
        "parallel": _parallel_score(pred_turns, gold_turns),
    }


def process_reward(components: Mapping[str, float], weights: HierRWeights = HierRWeights()) -> float:
    """R_tool = Σ_c w_c · component_c / Σ_c w_c (the divisor is 1 for the paper's weights)."""
    missing = [c for c in COMPONENTS if c not in components]
    if missing:
        raise ValueError(f"missing HierR components: {missing}")
    total = sum(getattr(weights, c) for c in COMPONENTS)
    value = sum(getattr(weights, c) * float(components[c]) for c in COMPONENTS) / total
    return min(1.0, max(0.0, value))
