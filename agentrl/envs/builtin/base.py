"""What every builtin domain shares: the error type, the id sequence, and the state discipline.

A domain is a small stateful class whose public methods are the tools. Its whole state is a plain
JSON dict so a task's ``initial_state`` can seed it and two sessions can be compared by value.
"""

from __future__ import annotations

import copy
from typing import Any

from agentrl.envs.toolspec import public_methods

# Ids come from a full-period linear congruential sequence over 9000 four-digit numbers instead of
# a plain counter: consecutive ids (A1001, A1002, ...) would let a model *guess* the next id, and
# the point of these domains is that ids must be copied from earlier results.
_ID_SPACE = 9000
_ID_MUL = 61  # a-1 divisible by 2, 3, 5 and 4: Hull-Dobell full period for m = 9000
_ID_INC = 2357  # prime, coprime with 9000


class ToolError(Exception):
    """A domain-level failure (unknown id, insufficient funds, ...).

    The backend turns it into an ``{"error": message}`` observation, so messages are written for
    the model to read: short and stating what was wrong.
    """


class Domain:
    """Base class: holds ``seq`` and hands out fresh ids; subclasses own the rest of the state."""

    #: One-letter id prefix, e.g. "A" for accounts.
    id_prefix = "X"
    #: The dict key in the state that maps ids to records (used to avoid id collisions).
    records_key = "items"

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        state = copy.deepcopy(state or {})
        seq = state.get("seq", 0)
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise ValueError(f"{type(self).__name__} state: seq must be an integer, got {seq!r}")
        self.seq = seq % _ID_SPACE
        records = state.get(self.records_key, {})
        if not isinstance(records, dict):
            raise ValueError(f"{type(self).__name__} state: {self.records_key} must be an object")
        self.records: dict[str, dict[str, Any]] = records

    def snapshot(self) -> dict[str, Any]:
        """The full state as JSON data; feeding it back to ``__init__`` restores the domain."""
        return {"seq": self.seq, self.records_key: copy.deepcopy(self.records)}

    @classmethod
    def tool_names(cls) -> list[str]:
        return public_methods(cls, exclude=set(public_methods(Domain)))

    # -- helpers for subclasses -------------------------------------------------------------
    def _new_id(self) -> str:
        for _ in range(_ID_SPACE):
            self.seq = (_ID_MUL * self.seq + _ID_INC) % _ID_SPACE
            new = f"{self.id_prefix}{1000 + self.seq}"
            if new not in self.records:
                return new
        raise ToolError("no free ids left")

    def _get(self, record_id: str, what: str) -> dict[str, Any]:
        record = self.records.get(record_id)
        if record is None:
            raise ToolError(f"unknown {what} {record_id!r}")
        return record


def check_positive(amount: int) -> None:
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise ToolError(f"amount must be a positive integer, got {amount!r}")


def check_text(value: str, what: str, max_len: int = 200) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ToolError(f"{what} must be a non-empty string")
    if len(value) > max_len:
        raise ToolError(f"{what} is longer than {max_len} characters")
