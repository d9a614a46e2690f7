"""The SGLS response cache: the same call after the same history gets the same answer.

The original SGLS is stateless: every episode of a group re-samples the simulated server, so two
episodes that made identical calls can see different responses and the group's reward spread
mixes policy differences with simulator noise. Keying answers by (task, the episode's earlier
calls with their responses, the call) removes that noise for every prefix the episodes share,
while episodes that diverged still get answers consistent with their own history.

Keys are canonical: JSON with sorted keys and no whitespace, so argument order never matters,
then SHA-256 so a long history costs 64 bytes per entry. Values are stored as JSON text and
parsed on every hit, so no caller can mutate what another caller will receive. The cache is an
LRU bounded by entry count, guarded by one lock: tool-pool actors serve calls from many threads.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from agentrl.tasks.schema import ToolCall


def _call_dict(call: ToolCall | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(call, ToolCall):
        return {"name": call.name, "arguments": dict(call.arguments)}
    return {"name": call["name"], "arguments": dict(call.get("arguments") or {})}


def canonical_json(value: Any) -> str:
    """Deterministic JSON text: sorted keys, compact separators, non-ASCII kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def history_entry(call: ToolCall | Mapping[str, Any], response: Any) -> dict[str, Any]:
    """One earlier exchange of an episode, in the form keys, prompts and ``state()`` use."""
    return {"call": _call_dict(call), "response": response}


def cache_key(task_id: str, history: Iterable[Mapping[str, Any]], call: ToolCall | Mapping[str, Any]) -> str:
    """The key of ``call`` made after ``history`` (a list of ``history_entry`` dicts) in an
    episode of task ``task_id``."""
    payload = {
        "task": task_id,
        "history": [history_entry(h["call"], h["response"]) for h in history],
        "call": _call_dict(call),
    }
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


class SimulationCache:
    """Thread-safe LRU map from ``cache_key`` to a simulated response, with hit/miss counters."""

    def __init__(self, max_entries: int = 100_000):
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._data: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    key = staticmethod(cache_key)

    def lookup(self, key: str) -> tuple[bool, Any]:
        """``(True, response)`` on a hit (the entry becomes most recent), ``(False, None)`` on a
        miss. A tuple, not ``None``-for-miss: ``null`` is a response a server may send."""
        with self._lock:
            text = self._data.get(key)
            if text is None:
                self.misses += 1
                return False, None
            self._data.move_to_end(key)
            self.hits += 1
        return True, json.loads(text)

    def put(self, key: str, response: Any) -> None:
        """Store ``response`` (must be JSON-serializable), evicting least recently used entries."""
        text = canonical_json(response)
        with self._lock:
            self._data[key] = text
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)
                self.evictions += 1

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._data

    @property
    def hit_rate(self) -> float:
        """Hits over lookups so far (0.0 before the first lookup)."""
        with self._lock:
            total = self.hits + self.misses
            return self.hits / total if total else 0.0

    def stats(self) -> dict[str, float]:
        with self._lock:
            total = self.hits + self.misses
            return {
                "cache_hits": self.hits,
                "cache_misses": self.misses,
                "hit_rate": self.hits / total if total else 0.0,
                "cache_entries": len(self._data),
                "cache_evictions": self.evictions,
            }
