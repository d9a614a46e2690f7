"""Offline summary reward R_sum in [0, 1] and the omission rule (docs/design.md §3).

The preferred R_sum is an LLM judge (``rewards/judge.py``); this rule-based scorer is the offline
stand-in and the judge's fallback:

    R_sum = clamp( facts_present / facts_required
                   − invented_penalty · (distinct invented values)
                   − length_penalty_max · min(1, (len − max_chars) / max_chars)⁺ , 0, 1 )

Matching is on tokens, not substrings: ``"55"`` does not match ``"550"``, and ``"A4100"`` does
not match ``"A41000"``. A *value* is a number or an id-like token (letters and digits mixed, e.g.
``A4100``); it is *invented* when it appears neither in what the model saw (user text and tool
observations, ``context``) nor in the required facts.

Omission: a turn whose gold needs a call but where the model made none (it answered from thin
air). SLCA-GRPO sets the whole summary reward of such an episode to ``OMISSION_REWARD``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from agentrl.rewards.hierr import TurnSteps, turn_calls

OMISSION_REWARD = -0.5  # SLCA-GRPO: total summary reward of an omitting episode (docs/design.md §3)


@dataclass(frozen=True)
class SummaryRuleWeights:
    """Penalties of the rule-based scorer (our choice: the paper scores summaries with a judge)."""

    invented_penalty: float = 0.25  # per distinct invented value
    length_penalty_max: float = 0.5  # reached at 2 × max_chars, linear from max_chars


# A decimal number ("12.5") or a run of word characters ("A4100", "Oslo", "55"). Sentence
# punctuation is never part of a token, so "55." → "55".
_TOKEN_RE = re.compile(r"\d+(?:\.\d+)+|\w+")
_DECIMAL_RE = re.compile(r"\d+\.\d+")


def tokens(text: str) -> list[str]:
    """Case-folded tokens; decimals lose trailing fractional zeros ("55.50" → "55.5", "55.0" → "55")."""
    out = []
    for tok in _TOKEN_RE.findall(text.casefold()):
        if _DECIMAL_RE.fullmatch(tok):
            tok = tok.rstrip("0").rstrip(".")
        out.append(tok)
    return out


def is_value(token: str) -> bool:
    """A number, or an id-like token mixing letters and digits (``a4100``, ``ord_77``)."""
    has_digit = any(c.isdigit() for c in token)
    return has_digit and (token.replace(".", "").isdigit() or any(c.isalpha() for c in token))


def _contains(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def fact_present(answer: str, fact: str) -> bool:
    """The fact's tokens appear contiguously in the answer's tokens (substring if it has none)."""
    needle = tokens(fact)
    if not needle:
        return fact.strip().casefold() in answer.casefold()
    return _contains(tokens(answer), needle)


def invented_values(answer: str, facts: Sequence[str], context: str) -> set[str]:
    """Values in the answer found neither in the context's tokens nor in the facts' tokens."""
    known = set(tokens(context))
    for f in facts:
        known.update(tokens(f))
    return {t for t in tokens(answer) if is_value(t) and t not in known}


def rule_summary_score(
    answer: str | None,
    facts: Sequence[str],
    context: str,
    max_chars: int = 400,
    weights: SummaryRuleWeights = SummaryRuleWeights(),
) -> float:
    """R_sum of one turn's final answer (formula in the module docstring).

    ``None`` (the turn was never answered) and an empty answer score 0. With no required facts
    the coverage term is 1, so a non-empty answer with nothing invented scores 1.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    if answer is None or not answer.strip():
        return 0.0
    coverage = sum(fact_present(answer, f) for f in facts) / len(facts) if facts else 1.0
    invented = len(invented_values(answer, facts, context))
    over = max(0, len(answer.strip()) - max_chars) / max_chars
    score = coverage - weights.invented_penalty * invented - weights.length_penalty_max * min(1.0, over)
    return min(1.0, max(0.0, score))


def episode_summary_reward(
    answers: Sequence[str | None],
    facts_per_turn: Sequence[Sequence[str]],
    context: str,
    n_turns: int,
    max_chars: int = 400,
) -> float:
    """Mean ``rule_summary_score`` over the task's ``n_turns`` expected turns.

    ``answers`` may be shorter than ``n_turns`` (the episode stopped early): missing answers score
    0. ``facts_per_turn`` must give one list per expected turn.
    """
    if n_turns < 1:
        raise ValueError(f"n_turns must be >= 1, got {n_turns}")
    if len(answers) > n_turns:
        raise ValueError(f"{len(answers)} answers for a task of {n_turns} turns")
    if len(facts_per_turn) != n_turns:
        raise ValueError(f"facts_per_turn has {len(facts_per_turn)} entries for {n_turns} turns")
    padded = list(answers) + [None] * (n_turns - len(answers))
    return sum(rule_summary_score(a, f, context, max_chars) for a, f in zip(padded, facts_per_turn)) / n_turns


def is_omission(pred_turns: Sequence[TurnSteps], gold_turns: Sequence[TurnSteps]) -> bool:
    """True when some turn the model reached (each entry of ``pred_turns``) has gold calls but
    not one valid model call. Malformed blocks do not count as calls: a garbage ``<tool_call>``
    must not buy its way out of the omission penalty. Turns never reached are not omissions
    (truncation is priced by progress and R_sum)."""
    if len(pred_turns) > len(gold_turns):
        raise ValueError(f"{len(pred_turns)} predicted turns for a task of {len(gold_turns)} turns")
    return any(turn_calls(g) and not turn_calls(p) for p, g in zip(pred_turns, gold_turns))
