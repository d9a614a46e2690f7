"""Gold conversations: what a perfect agent says for a task, as chat messages and as a policy.

Used for the SFT warm start (the tiny model learns the format from these), for the tokenizer's
training corpus, and as ``--policy gold`` (replaying the ground truth must score 1.0 end to end,
which checks the task, the backend, the checker and the episode loop together).
"""

from __future__ import annotations

from agentrl.agent.chat import ChatFormatter
from agentrl.agent.episode import Generation, observation_text, tool_announcement
from agentrl.agent.tool_formats import ToolFormat, get_format
from agentrl.envs.registry import make_backend
from agentrl.tasks.schema import Task, Turn

ASK_TEXT = "Please tell me the missing details."
REFUSE_TEXT = "I cannot do that with the tools I have."


def gold_answer(turn: Turn) -> str:
    """The final message of a turn: the facts it must state, an ask, or a refusal."""
    if not turn.gold:
        return REFUSE_TEXT if turn.withheld_tools else ASK_TEXT
    if turn.answer_facts:
        return "Done: " + ", ".join(turn.answer_facts) + "."
    return "Done."


def gold_messages(task: Task, tool_format: str | ToolFormat = "hermes") -> list[dict]:
    """The whole gold conversation (user, assistant, tool messages), executed on a fresh backend;
    calls written as text in ``tool_format`` (``agent.tool_format``)."""
    render = get_format(tool_format).render
    backend = make_backend(task)
    messages: list[dict] = []
    for u, turn in enumerate(task.turns):
        text = turn.user
        if u > 0:
            restored = [t for t in task.visible_tools(u) if t.name in set(task.turns[u - 1].withheld_tools)]
            if restored:
                text = tool_announcement(restored) + text
        messages.append({"role": "user", "content": text})
        for step in turn.gold:
            messages.append({"role": "assistant", "content": render(step)})
            for call in step:
                messages.append({"role": "tool", "content": observation_text(backend.execute(call))})
        messages.append({"role": "assistant", "content": gold_answer(turn)})
    return messages


def gold_assistant_texts(task: Task, tool_format: str | ToolFormat = "hermes") -> list[str]:
    """The gold conversation's assistant messages only. They depend on the plan alone, not on
    tool results, so no backend runs (an LLM-simulated backend may not even be reachable here)."""
    render = get_format(tool_format).render
    return [text for turn in task.turns for text in [*(render(step) for step in turn.gold), gold_answer(turn)]]


class GoldPolicy:
    """A scripted policy that replays a task's gold assistant messages through the episode loop,
    calls written in the formatter's tool format (the one the loop parses)."""

    def __init__(self, task: Task, formatter: ChatFormatter):
        self._texts = gold_assistant_texts(task, formatter.tool_format)
        self._formatter = formatter
        self._next = 0

    async def generate(self, prompt_ids: list[int], max_tokens: int) -> Generation:
        text = self._texts[self._next] if self._next < len(self._texts) else gold_answer(Turn(user=""))
        self._next += 1
        ids = self._formatter.render_assistant_ids(text)
        if len(ids) > max_tokens:
            return Generation(ids[:max_tokens], [0.0] * max_tokens, "length")
        return Generation(ids, [0.0] * len(ids), "stop")
