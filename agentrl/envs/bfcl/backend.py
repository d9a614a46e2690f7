"""BFCLBackend: one BFCL multi-turn entry's API instances, plus BFCL's per-turn check.

Why not ``bfcl_eval``'s own executor (``multi_turn_utils.execute_multi_turn_func_call``): it keeps
the instances in its module globals under ``(model_name, entry id)`` and never frees them (two
episodes of one entry share state unless every caller invents a unique name), and it runs calls
by ``eval`` of strings with method names regex-prefixed, even inside string literals. Here each
backend owns fresh instances and calls the method directly; everything observable (result text,
instance state) matches the official executor (``tests/test_bfcl.py`` checks verdict parity
against the official ``multi_turn_checker``).

Task ``initial_state`` layout for ``backend == "bfcl"`` (written by ``agentrl.envs.bfcl.tasks``)::

    {"bfcl_id": "multi_turn_base_0",          # the BFCL entry id (informational)
     "involved_classes": ["GorillaFileSystem", "TwitterAPI"],   # BFCL class names, in order
     "initial_config": {"GorillaFileSystem": {...}, ...},       # BFCL's per-class scenario
     "long_context": false}                   # True only for the long_context category

Observations. BFCL turns every result into a string (a ``str`` as is, a ``dict`` through
``json.dumps``, anything else through ``str``, an exception into ``"Error during execution: ..."``)
and its checker compares those strings. Our observations are JSON values instead: a ``dict``
result is returned as the dict (JSON round-tripped, so key order is kept), a ``str`` or other
result as BFCL's string, and an exception as ``{"error": "Error during execution: <msg>"}`` (the
agentrl error shape). ``result_text`` maps an observation back to BFCL's exact string, which is
what ``check_turn`` compares, so the agent sees structured JSON and the checker sees BFCL's text.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
from collections import Counter
from typing import Any

from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

from agentrl.envs.base import is_error
from agentrl.envs.checker import TurnCheck
from agentrl.tasks.schema import Task, ToolCall

EXEC_ERROR_PREFIX = "Error during execution: "
# Names bfcl_eval refuses to run (multi_turn_utils.execute_multi_turn_func_call).
_BLOCKED = frozenset({"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"})
STATE_KEYS = ("bfcl_id", "involved_classes", "initial_config", "long_context")
_MISSING = object()


def bfcl_class(name: str) -> type:
    """The executable class of a BFCL class name (e.g. ``GorillaFileSystem``)."""
    module = CLASS_FILE_PATH_MAPPING.get(name)
    if module is None:
        raise ValueError(f"unknown BFCL class {name!r}; known: {sorted(CLASS_FILE_PATH_MAPPING)}")
    return getattr(importlib.import_module(module), name)


def public_methods(instance: Any) -> list[str]:
    """The callable API of an instance, as bfcl_eval maps it (public bound methods)."""
    return [m for m, _ in inspect.getmembers(instance, predicate=inspect.ismethod) if not m.startswith("_")]


def to_observation(result: Any) -> Any:
    """A method's return value as an observation (BFCL's string rules, dicts kept as JSON)."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.loads(json.dumps(result))
        except Exception:  # noqa: BLE001 - bfcl_eval falls back to str() on any failure too
            return str(result)
    return str(result)


def result_text(observation: Any) -> str:
    """The string bfcl_eval's executor would have returned for the call behind ``observation``."""
    if isinstance(observation, str):
        return observation
    if is_error(observation) and isinstance(observation["error"], str) and observation["error"].startswith(EXEC_ERROR_PREFIX):
        return observation["error"]
    return json.dumps(observation)


def _jsonable(value: Any, path: tuple[int, ...] = ()) -> Any:
    """A JSON view of instance state (objects become their public attributes; back-references to
    an enclosing object, like a Directory's ``parent``, are left out)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if id(value) in path:
        return None
    path = (*path, id(value))
    if isinstance(value, dict):
        return {str(k): _jsonable(v, path) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v, path) for v in value]
    if hasattr(value, "__dict__"):
        return {k: _jsonable(v, path) for k, v in vars(value).items()
                if not k.startswith("_") and id(v) not in path}
    return str(value)


def _parse_initial_state(task: Task) -> tuple[list[str], dict[str, Any], bool]:
    st = task.initial_state
    missing = [k for k in STATE_KEYS if k not in st]
    if missing:
        raise ValueError(f"task {task.id!r}: initial_state is missing {missing} (BFCL layout: {list(STATE_KEYS)})")
    classes, config, long_context = st["involved_classes"], st["initial_config"], st["long_context"]
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        raise ValueError(f"task {task.id!r}: initial_state.involved_classes must be a non-empty list of class names")
    if not isinstance(config, dict):
        raise ValueError(f"task {task.id!r}: initial_state.initial_config must be an object")
    if not isinstance(long_context, bool):
        raise ValueError(f"task {task.id!r}: initial_state.long_context must be true or false")
    return classes, config, long_context


class _Instances:
    """Fresh instances of the involved classes and the method-name -> instance map."""

    def __init__(self, classes: list[str], config: dict[str, Any], long_context: bool):
        self.instances: dict[str, Any] = {}
        self.owner: dict[str, Any] = {}
        for cname in classes:
            obj = bfcl_class(cname)()
            if cname not in STATELESS_CLASSES:
                obj._load_scenario(copy.deepcopy(config.get(cname, {})), long_context=long_context)
            self.instances[cname] = obj
            for m in public_methods(obj):
                self.owner[m] = obj  # a later class wins a clash, as in bfcl_eval (none occur)

    def execute(self, call: ToolCall) -> Any:
        name = call.name
        if name in _BLOCKED:
            return {"error": f"{EXEC_ERROR_PREFIX}Function call {name} is not allowed."}
        obj = self.owner.get(name)
        if obj is None:
            return {"error": f"{EXEC_ERROR_PREFIX}name {name!r} is not defined"}
        try:  # copy: a method may keep or mutate its argument, which must not alias the task's gold
            result = getattr(obj, name)(**copy.deepcopy(dict(call.arguments)))
        except Exception as exc:  # noqa: BLE001 - the contract is "never raises", like bfcl_eval
            return {"error": f"{EXEC_ERROR_PREFIX}{exc}"}
        return to_observation(result)


def state_differences(model: dict[str, Any], gold: dict[str, Any]) -> list[str]:
    """``Class.attr`` of every public attribute that differs, compared with ``!=`` on the live
    objects as bfcl_eval's ``_compare_instances`` does (so 5 == 5.0 and File/Directory ``__eq__``
    apply; a JSON comparison would disagree with the official checker)."""
    diffs = []
    for cname, gold_obj in gold.items():
        model_obj = model[cname]
        for attr in vars(gold_obj):
            if not attr.startswith("_") and getattr(model_obj, attr, _MISSING) != getattr(gold_obj, attr):
                diffs.append(f"{cname}.{attr}")
    return diffs


class BFCLBackend:
    """One episode of one BFCL entry. ``execute`` never raises (failures are observations)."""

    def __init__(self, task: Task):
        self.task = task
        self._setup = _parse_initial_state(task)
        self._live = _Instances(*self._setup)
        self._gold: _Instances | None = None  # gold replay, advanced turn by turn by check_turn
        self._gold_results: list[list[str]] = []

    @property
    def instances(self) -> dict[str, Any]:
        return self._live.instances

    def execute(self, call: ToolCall) -> Any:
        return self._live.execute(call)

    def state(self) -> dict[str, Any]:
        """Public attributes of every instance (what the official checker compares), as JSON."""
        return {c: {k: _jsonable(v) for k, v in vars(o).items() if not k.startswith("_")} for c, o in self.instances.items()}

    def _replay_gold(self, turn_index: int) -> None:
        if self._gold is None:
            self._gold = _Instances(*self._setup)
        if turn_index < len(self._gold_results) - 1:
            raise ValueError(f"task {self.task.id!r}: turns must be checked in order "
                             f"(turn {turn_index} after turn {len(self._gold_results) - 1})")
        while len(self._gold_results) <= turn_index:
            u = len(self._gold_results)
            texts = []
            for call in self.task.gold_calls(u):
                obs = self._gold.execute(call)
                if is_error(obs):
                    raise ValueError(f"task {self.task.id!r}: gold call {call.name} in turn {u} failed: {obs['error']}")
                texts.append(result_text(obs))
            self._gold_results.append(texts)

    def check_turn(self, turn_index: int, turn_results: list[tuple[ToolCall, Any]],
                   all_results: list[tuple[ToolCall, Any]]) -> TurnCheck:
        """BFCL's per-turn verdict (``multi_turn_checker``), after the model's turn ``turn_index``.

        ``turn_results``: this turn's (call, observation) pairs; ``all_results``: those of every
        turn so far, this one included. A turn with empty gold is not checked (passes). Otherwise
        it fails if the model made no call in it; else it passes when every instance's public
        state equals the gold replay's and this turn's gold result strings form a sub-multiset of
        the result strings of ``all_results`` (extra or earlier calls are fine).
        """
        if not 0 <= turn_index < len(self.task.turns):
            raise IndexError(f"task {self.task.id!r} has {len(self.task.turns)} turns; no turn {turn_index}")
        self._replay_gold(turn_index)
        if not self.task.gold_calls(turn_index):
            return TurnCheck(True, True, True, "empty gold turn: not checked")
        diffs = state_differences(self.instances, self._gold.instances)
        available = Counter(result_text(obs) for _, obs in all_results)
        missing = []
        for text in self._gold_results[turn_index]:
            if available[text] > 0:
                available[text] -= 1
            else:
                missing.append(text)
        reasons = []
        if not turn_results:
            reasons.append("no call in a turn whose gold is not empty")
        if diffs:
            reasons.append("state differs: " + ", ".join(diffs))
        if missing:
            reasons.append(f"{len(missing)} gold result(s) not observed, e.g. {missing[0][:120]}")
        passed = bool(turn_results) and not diffs and not missing
        return TurnCheck(passed, not diffs, not missing, "; ".join(reasons))
