"""``Registry``: the name table behind every ``register_*`` of agentrl (estimators, methods,
backends, rewards, behaviours).

What the tables share, written once: a name taken by one definition cannot be taken by another
(a plugin must not silently replace a built-in, or another plugin), while the same definition
registered again replaces its entry (its module imported a second time: once per config
validation, a test file imported as a plugin); and an unknown name is reported with the close
match and the known names. Each ``register_*`` keeps its own checks of what it registers.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def where(obj: Any) -> str:
    """``module.qualname`` of a class or function: what identifies a definition across imports."""
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


class Registry(Generic[T]):
    """Name -> entry, in registration order. ``kind`` names the entries in messages ("reward")."""

    def __init__(self, kind: str, entries: dict[str, T] | None = None, owners: dict[str, str] | None = None):
        self.kind = kind
        self._entries: dict[str, T] = dict(entries or {})
        self._owners: dict[str, str] = dict(owners or {})  # name -> where() of what registered it

    def add(self, name: str, entry: T, owner: str | None = None) -> None:
        """Register ``entry`` under ``name``. ``owner`` (``where`` of its definition): another owner
        under a taken name is a ValueError naming both; None: no claim (later registrations win,
        as agentrl's own re-registrations do)."""
        old = self._owners.get(name)
        if owner is not None and old is not None and old != owner:
            raise ValueError(f"{self.kind} {name!r} is already registered by {old}; pick another name for {owner}")
        self._entries[name] = entry
        if owner is not None:
            self._owners[name] = owner
        else:
            self._owners.pop(name, None)

    def get(self, name: str) -> T | None:
        return self._entries.get(name)

    def unknown(self, name: str) -> str:
        """The message for a name nothing registered: the close match, if any, and the known names."""
        known = sorted(self._entries)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return f"unknown {self.kind} '{name}' ({hint}known: {', '.join(known) or 'none'})"

    def names(self) -> list[str]:
        return list(self._entries)

    def items(self) -> list[tuple[str, T]]:
        return list(self._entries.items())

    def copy(self) -> Registry[T]:
        """An independent table with the same entries (a test's scratch registry)."""
        return Registry(self.kind, self._entries, self._owners)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))


__all__ = ["Registry", "where"]
