"""One episode's environment: a backend session plus the per-turn checker, behind one object.

Rollout workers run these in their own process (``tools.placement: in_process``), or the
tool-pool actors host them (``pool``; one per in-flight episode); the SFT warm start and tests
use them directly. The async methods match ``agentrl.agent.episode.EnvSession``.

Tool exceptions a plugin backend raised (other than the ``ValueError``/``LookupError`` the model
is meant to read) are kept as records, ``{tool, arguments, type, message, where, turn}``, which
the rollout worker copies into ``Episode.tool_errors`` (``tool_errors()``) before closing.

Which check runs: a backend may define its own per-turn check,
``backend.check_turn(turn_index, turn_results, all_results) -> TurnCheck`` (BFCL does: its
official checker compares result strings against the model's results of *all* turns so far, so
the session keeps every turn's (call, observation) pairs for it). Backends without one (the
builtin suite) get ``agentrl.envs.checker.check_turn`` against a gold replay, as before.
"""

from __future__ import annotations

from typing import Any

from agentrl.envs.checker import TurnCheck, check_turn, gold_replay
from agentrl.envs.registry import make_backend
from agentrl.tasks.schema import Task, ToolCall


class LocalEnvSession:
    def __init__(self, task: Task):
        self.task = task
        self.backend = make_backend(task)
        self._gold = None  # gold replay, computed once per episode on first check
        self._all_results: list[tuple[ToolCall, Any]] = []  # every turn's (call, observation), in order
        self.checks: list[TurnCheck] = []
        self._turn = 0  # the turn whose calls run now: every turn before it has been ended
        self._tool_errors: list[dict] = []

    def execute_sync(self, calls: list[ToolCall]) -> list[Any]:
        observations = [self.backend.execute(c) for c in calls]
        crashed = getattr(self.backend, "tool_errors", None)  # PluginSession's records
        if crashed:
            self._tool_errors += [{**e, "turn": self._turn} for e in crashed]
            crashed.clear()
        return observations

    def tool_errors_sync(self) -> list[dict]:
        """Every tool exception of the episode so far, in call order."""
        return list(self._tool_errors)

    async def tool_errors(self) -> list[dict]:
        return self.tool_errors_sync()

    def end_turn_sync(self, turn_index: int, results: list[tuple[ToolCall, Any]]) -> bool:
        self._turn = turn_index + 1
        self._all_results.extend(results)
        backend_check = getattr(self.backend, "check_turn", None)
        if backend_check is not None:
            check = backend_check(turn_index, list(results), list(self._all_results))
        else:
            if self._gold is None:
                self._gold = gold_replay(self.task)
            check = check_turn(self.task, turn_index, self.backend.state(), results, gold=self._gold)
        self.checks.append(check)
        return check.passed

    async def execute(self, calls: list[ToolCall]) -> list[Any]:
        return self.execute_sync(calls)

    async def end_turn(self, turn_index: int, results: list[tuple[ToolCall, Any]]) -> bool:
        return self.end_turn_sync(turn_index, results)

    def close_sync(self) -> None:
        """The backend's ``close()``, for backends that hold resources (plugins may define one)."""
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()

    async def close(self) -> None:
        """Release the backend (the pool's ``RemoteEnvSession.close`` does it on the actor's copy)."""
        self.close_sync()
