"""The tool-backend contract shared by every simulator (executable suites, BFCL, SGLS).

A backend session executes one episode's calls against its own state. Observations are JSON
values the agent loop serializes into tool messages; a failed call is an observation too
(``{"error": ...}``), never an exception escaping into the episode.
"""

from __future__ import annotations

from typing import Any, Protocol

from agentrl.tasks.schema import Task, ToolCall


class ToolBackend(Protocol):
    """One episode's tool environment, created fresh from a task's ``initial_state``."""

    def execute(self, call: ToolCall) -> Any:
        """Run one call; return a JSON-serializable result or ``{"error": "..."}``."""

    def state(self) -> Any:
        """A JSON-serializable snapshot that two sessions can compare for equality."""


class BackendFactory(Protocol):
    def __call__(self, task: Task) -> ToolBackend: ...


def is_error(observation: Any) -> bool:
    return isinstance(observation, dict) and set(observation) == {"error"}
