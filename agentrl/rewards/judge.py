"""LLM-judge summary reward (docs/design.md §3): a 1–5 rating of the final answer mapped to [0, 1].

    R_sum = (r − 1) / 4,   r ∈ {1, 2, 3, 4, 5}

Decoding is constrained to the five digits (vLLM structured outputs, see ``agentrl.llm.client``).
An answer that is not one of them raises ``ValueError``; the caller decides the fallback (usually
``rewards.summary.rule_summary_score``).
"""

from __future__ import annotations

from agentrl.llm.client import ChatClient

RATINGS = ["1", "2", "3", "4", "5"]

JUDGE_SYSTEM = (
    "You grade the final answer of a tool-using assistant. Judge only what the tool observations "
    "support: an answer that states values not found in the observations is wrong, however fluent."
)

JUDGE_TEMPLATE = """User request:
{question}

Tool observations the assistant saw:
{observations}

Assistant's final answer:
{answer}

Rate the final answer from 1 to 5:
5 = answers the request completely and correctly, every value backed by the observations, concise
4 = correct and supported, with a minor omission or some verbosity
3 = partly answers the request, or includes one unsupported detail
2 = mostly wrong, missing, or unsupported
1 = wrong, invented, or does not address the request
Reply with the single digit only."""


def judge_messages(question: str, observations: str, answer: str) -> list[dict[str, str]]:
    """The chat messages sent to the judge."""
    user = JUDGE_TEMPLATE.format(
        question=question.strip() or "(empty)",
        observations=observations.strip() or "(none)",
        answer=answer.strip() or "(empty)",
    )
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def parse_rating(text: str) -> int:
    """The rating in the judge's reply: exactly one digit 1–5 (surrounding space or a final '.'
    allowed). Anything else raises ``ValueError`` quoting the reply."""
    cleaned = text.strip().rstrip(".").strip()
    if cleaned not in RATINGS:
        raise ValueError(f"judge reply is not a rating in 1-5: {text[:200]!r}")
    return int(cleaned)


def rating_to_reward(r: int) -> float:
    """(r − 1) / 4: 1 → 0.0, 3 → 0.5, 5 → 1.0."""
    if r not in range(1, 6):
        raise ValueError(f"rating must be in 1..5, got {r}")
    return (r - 1) / 4


async def judge_summary(client: ChatClient, question: str, observations: str, answer: str) -> float:
    """R_sum from the judge at temperature 0, decoding constrained to ``RATINGS``.

    Raises ``ValueError`` on an unparseable reply and ``LLMEndpointError`` when the endpoint fails.
    """
    reply = await client.complete(
        judge_messages(question, observations, answer), temperature=0.0, max_tokens=4, choices=RATINGS
    )
    return rating_to_reward(parse_rating(reply))
