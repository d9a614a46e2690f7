"""The Task data contract (docs/design.md §2): one training sample, validated on load.

A task is a multi-turn conversation script: the user turns the agent will see, the tools it may
call, the backend that executes them from ``initial_state``, and per turn the gold plan (a list of
steps; a step is a list of calls that may run in parallel). A task of a plugin environment may
instead name a reward function (``reward``) that scores the finished episode from free-form
``metadata``; it then needs no gold plan (docs/own_tools.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Category = Literal["base", "miss_func", "miss_param", "long_context"]


class ToolCall(BaseModel):
    """One function call: ``{"name": ..., "arguments": {...}}`` (Hermes / OpenAI style)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    # Optional JSON Schema of the result (used by the LLM simulator to constrain its output).
    returns: dict[str, Any] | None = None


class ToolSpec(BaseModel):
    """An OpenAI function-tool schema."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function"] = "function"
    function: FunctionSpec

    @property
    def name(self) -> str:
        return self.function.name


class Turn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str
    # Gold plan: steps in order; the calls inside one step are independent (may be parallel).
    # An empty plan means the right behaviour is to ask or refuse without changing state.
    gold: list[list[ToolCall]] = Field(default_factory=list)
    # Tools hidden from the agent during this turn (miss_func). A tool withheld in turn k is
    # withheld in every earlier turn too; it becomes visible from the first turn not listing it.
    withheld_tools: list[str] = Field(default_factory=list)
    # Values the final answer of this turn should state (used by summary scoring).
    answer_facts: list[str] = Field(default_factory=list)


class Provenance(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["seed", "synth"] = "seed"
    parent_id: str | None = None
    created_step: int | None = None
    synthesizer: str | None = None


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    domain: str
    category: Category = "base"
    # The tools the agent is offered. A task file may leave them out when its backend registered
    # its tools (a plugin, agentrl/envs/registry.py): loading fills in all of them.
    tools: list[ToolSpec] = Field(default_factory=list)
    backend: str
    initial_state: dict[str, Any] = Field(default_factory=dict)
    turns: list[Turn] = Field(min_length=1)
    provenance: Provenance = Field(default_factory=Provenance)
    # Reward function that scores the finished episode, by its registered name
    # (agentrl/rewards/registry.py); None = the backend's default one, else the per-turn checks
    # against the gold plans (docs/design.md §3). A task scored by a function needs no gold plan.
    reward: str | None = Field(default=None, min_length=1)
    # Free-form JSON for the reward function (e.g. the expected end state); agentrl never reads it.
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_references(self) -> "Task":
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate tool names in tools: {sorted(names)}")
        known = set(names)
        for i, turn in enumerate(self.turns):
            for w in turn.withheld_tools:
                if w not in known:
                    raise ValueError(f"turns[{i}].withheld_tools names unknown tool {w!r}")
                if i > 0 and w not in self.turns[i - 1].withheld_tools:
                    raise ValueError(
                        f"turns[{i}].withheld_tools: {w!r} is withheld after being visible in turn {i - 1}"
                    )
            for s, step in enumerate(turn.gold):
                for call in step:
                    if call.name not in known:
                        raise ValueError(f"turns[{i}].gold[{s}] calls unknown tool {call.name!r}")
        return self

    def visible_tools(self, turn_index: int) -> list[ToolSpec]:
        hidden = set(self.turns[turn_index].withheld_tools)
        return [t for t in self.tools if t.name not in hidden]

    def gold_calls(self, turn_index: int) -> list[ToolCall]:
        return [c for step in self.turns[turn_index].gold for c in step]


def text_key(task: Task) -> tuple[str, ...]:
    """A task's identity by what the user says: its user turns, in order. Tasks with one key are
    duplicates (the generators' and RODS's gates), and a training task with a held-out task's key
    would leak it into training."""
    return tuple(t.user for t in task.turns)
