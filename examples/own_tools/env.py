"""A key-value cache with expiring entries, as an agentrl environment plugin (docs/own_tools.md).

The config names this file in ``envs.plugins``; importing it registers

* the backend ``kvstore``: ``KVStore`` (one instance per episode, built from the task's
  ``initial_state``), its five tools (their schemas come from the methods' signatures and
  docstrings), and ``kvstore_goal`` as the reward of every task that names none;
* the reward function ``kvstore_goal``: it reads the task's ``metadata`` (what the store should
  hold at the end, which keys the agent must have read) and scores the finished episode.

Tasks therefore need no gold plan. ``examples/own_tools/tasks.jsonl`` still gives one per task
(``gold``): a reference solution that ``agentrl eval --policy gold`` replays, which must score
1.0 and so checks the tasks, the backend and the reward function together.
"""

from __future__ import annotations

from typing import Any

from agentrl.envs.registry import register_backend
from agentrl.rewards.registry import Score, final_backend, register_reward


class KVStore:
    """One episode's cache. ``initial_state``: ``{"now": seconds, "entries": {key: {"value": str,
    "expires_at": seconds or null}}}``. The clock does not move during an episode (so a replay of
    the same calls reaches the same state): an entry is live while ``expires_at`` is null or
    later than ``now``; expired entries are gone from the start."""

    TOOLS = ("get", "put", "delete", "expire", "list_keys")

    def __init__(self, task: Any):
        state = task.initial_state
        self.now = int(state.get("now", 0))
        self.entries = {k: dict(v) for k, v in state.get("entries", {}).items()
                        if v.get("expires_at") is None or v["expires_at"] > self.now}

    # ---- the tools: the model sees these signatures and the first line of each docstring

    def get(self, key: str) -> dict:
        """Read the value stored under a key and the seconds it has left (null = never expires).

        Args:
            key: The key to read.
        """
        entry = self._entry(key)
        return {"key": key, "value": entry["value"], "ttl": self.ttl(entry)}

    def put(self, key: str, value: str, ttl: int | None = None) -> dict:
        """Store a value under a key, replacing what it held.

        Args:
            key: The key to write.
            value: The value to store.
            ttl: Seconds until the entry expires; leave it out to keep the entry forever.
        """
        if ttl is not None and ttl <= 0:
            raise ValueError("ttl must be a positive number of seconds")
        self.entries[key] = {"value": value, "expires_at": None if ttl is None else self.now + ttl}
        return {"key": key, "stored": value, "ttl": ttl}

    def delete(self, key: str) -> dict:
        """Delete a key and its value.

        Args:
            key: The key to delete.
        """
        self._entry(key)
        del self.entries[key]
        return {"key": key, "deleted": True}

    def expire(self, key: str, ttl: int) -> dict:
        """Set the seconds a stored key has left before it expires.

        Args:
            key: The key to change.
            ttl: Seconds from now until the entry expires.
        """
        if ttl <= 0:
            raise ValueError("ttl must be a positive number of seconds")
        self._entry(key)["expires_at"] = self.now + ttl
        return {"key": key, "ttl": ttl}

    def list_keys(self, prefix: str = "") -> dict:
        """List the stored keys, or only those that start with a prefix.

        Args:
            prefix: Only keys starting with this text.
        """
        return {"keys": sorted(k for k in self.entries if k.startswith(prefix))}

    # ---- the plugin contract

    def call(self, name: str, arguments: dict) -> Any:
        """Run one tool call. agentrl has checked the name (a tool of the task) and the arguments
        (its JSON schema); a ValueError or LookupError becomes an ``{"error": ...}`` observation."""
        if name not in self.TOOLS:
            raise LookupError(f"unknown tool {name!r}")
        return getattr(self, name)(**arguments)

    def state(self) -> dict:
        """A JSON snapshot (only needed by the gold-plan checker; the reward reads the object)."""
        return {"now": self.now, "entries": self.entries}

    def ttl(self, entry: dict) -> int | None:
        return None if entry["expires_at"] is None else entry["expires_at"] - self.now

    def _entry(self, key: str) -> dict:
        if key not in self.entries:
            raise LookupError(f"no live entry for key {key!r}")
        return self.entries[key]


def kvstore_goal(episode: Any, task: Any) -> Score:
    """Score an episode against ``task.metadata``:

    * ``expect``: ``{key: null}`` (the key must be gone) or ``{key: {"value": v}}``, optionally
      with ``"ttl": seconds`` (``null`` = never expires), checked on the store the episode left;
    * ``must_call``: calls the agent must have made successfully, ``{"name": tool, "arguments":
      {...}}`` (the arguments given must match; others may be there too), e.g. the ``get`` of
      the key a question is about: the answer has to come from the store;
    * and every turn must have been closed with an answer (``termination == "done"``).

    Outcome 1 when every check holds; the process score (partial credit) is the fraction that do.
    The answer's wording is left to ``rewards.summary`` (the task's ``answer_facts``)."""
    store = final_backend(episode, task)  # a fresh KVStore with the episode's calls replayed
    checks = []
    for key, want in task.metadata.get("expect", {}).items():
        entry = store.entries.get(key)
        if want is None:
            checks.append(entry is None)
        else:
            ok = entry is not None and entry["value"] == want["value"]
            checks.append(ok and ("ttl" not in want or store.ttl(entry) == want["ttl"]))
    made = [c for turn in episode.calls for c in turn
            if not (isinstance(c["observation"], dict) and "error" in c["observation"])]
    for want in task.metadata.get("must_call", []):
        checks.append(any(c["name"] == want["name"] and want.get("arguments", {}).items() <= c["arguments"].items()
                          for c in made))
    checks.append(episode.termination == "done")
    return Score(outcome=float(all(checks)), process=sum(checks) / len(checks))


register_backend("kvstore", KVStore, tools=[getattr(KVStore, name) for name in KVStore.TOOLS], reward="kvstore_goal")
register_reward("kvstore_goal", kvstore_goal)
