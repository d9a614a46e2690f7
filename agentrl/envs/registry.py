"""Which backend executes a task: ``task.backend`` names a registered factory (docs/own_tools.md).

``builtin`` is registered here; the BFCL adapter and the LLM simulator register themselves with
``register_backend`` so this module never has to import their heavy dependencies. Backends that
ship with agentrl but need optional packages are listed in ``_LAZY``: the first task naming one
imports its module (which registers it), so ``import agentrl`` stays light and a missing optional
package is reported only to the runs that use it.

Plugins (``envs.plugins``, agentrl/common/plugins.py) register their own backends with the plugin
form, ``register_backend(name, factory, tools=[...], reward="name")``:

* ``factory(task)`` returns one episode's session: an object with ``call(name, arguments)`` that
  returns a JSON-serializable observation (raising ``ValueError``/``LookupError`` for a failure
  the model should read), and optionally ``state()`` (a JSON snapshot, for the gold-plan checker)
  and ``check_turn(turn_index, turn_results, all_results) -> TurnCheck`` (its own per-turn
  verdicts). An object with the older ``execute(ToolCall)`` contract (``base.ToolBackend``) works
  too;
* ``tools``: the backend's tool catalogue, as OpenAI function schemas (dicts, e.g. from
  ``transformers.utils.get_json_schema``), ``ToolSpec``s, or plain Python functions (their
  signature and Google docstring become the schema, ``toolspec.function_spec``). A task file may
  leave out ``tools``: loading fills in the whole catalogue;
* ``reward``: the name of the reward function (agentrl/rewards/registry.py) that scores tasks
  which name none themselves.

``make_backend`` wraps such a session in a ``PluginSession``: arguments are validated against the
schema the model was shown, exceptions become ``{"error": ...}`` observations, results are
detached as JSON, and a task scored by a reward function gets a per-turn verdict even without gold
plans (the turn passes when the model closed it; the backend's ``check_turn`` overrides that).
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

from agentrl.common.log import get_logger
from agentrl.common.plugins import plugins_hint
from agentrl.common.registry import Registry, where
from agentrl.envs.base import ToolBackend
from agentrl.envs.builtin import BUILTIN_CLASSES
from agentrl.envs.builtin import behaviours as _builtin_behaviours  # noqa: F401 - registers the quickstart's, like any env's
from agentrl.envs.executable import ArgChecks, ExecutableBackend, checked_call, tool_error
from agentrl.envs.toolspec import function_spec
from agentrl.tasks.io import register_task_hook
from agentrl.tasks.schema import FunctionSpec, Task, ToolCall, ToolSpec

log = get_logger(__name__)


@dataclass(frozen=True)
class BackendInfo:
    """One registered backend: its session factory, its tool catalogue (plugin form only) and the
    reward function that scores its tasks by default (None: per-turn checks on the gold plans)."""

    factory: Callable[[Task], Any]
    tools: tuple[ToolSpec, ...] | None = None
    reward: str | None = None
    plugin: bool = False  # registered in the plugin form (tools and/or reward)


_BACKENDS: Registry[BackendInfo] = Registry("backend", {"builtin": BackendInfo(ExecutableBackend)})
# backend name -> module whose import registers it (see the module docstring)
_LAZY: dict[str, str] = {"bfcl": "agentrl.envs.bfcl"}
# names a task file may use whose factory only some processes register: the tool-pool actors
# register "sgls" (they alone reach the SGLS server), so the driver cannot build one but may load its tasks
_ELSEWHERE: frozenset[str] = frozenset({"sgls"})
RESERVED: frozenset[str] = frozenset({"builtin", *_LAZY, *_ELSEWHERE})


def register_backend(name: str, factory: Callable[[Task], Any], tools: Iterable[Any] | None = None,
                     reward: str | None = None) -> None:
    """Make ``task.backend == name`` resolve to ``factory`` (later registrations win: the
    tool-pool actors re-register ``sgls`` with their server). With ``tools`` or ``reward`` this
    is the plugin form (module docstring): it may not take a name agentrl uses, nor one another
    plugin's factory holds (the same factory again, its module imported twice, replaces it)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"register_backend: name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise TypeError(f"register_backend({name!r}): factory must be callable (task -> session), got {factory!r}")
    plugin = tools is not None or reward is not None
    if plugin and name in RESERVED:
        raise ValueError(f"register_backend({name!r}): {sorted(RESERVED)} are agentrl's own backends; pick another name")
    if reward is not None and (not isinstance(reward, str) or not reward):
        raise ValueError(f"register_backend({name!r}): reward must be a reward function's name, got {reward!r}")
    specs = None
    if tools is not None:
        specs = tuple(as_tool_spec(t, f"register_backend({name!r})") for t in tools)
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"register_backend({name!r}): duplicate tool names {sorted(names)}")
    # only the plugin form claims its name: agentrl's own re-registrations (sgls) replace freely
    _BACKENDS.add(name, BackendInfo(factory, specs, reward, plugin), owner=where(factory) if plugin else None)


def as_tool_spec(tool: Any, where: str = "tool") -> ToolSpec:
    """A ``ToolSpec`` from a ToolSpec, an OpenAI function schema (``{"type": "function", "function":
    {...}}`` or the bare ``{name, description, parameters}``), or a Python function."""
    if isinstance(tool, ToolSpec):
        return tool.model_copy(deep=True)
    if isinstance(tool, dict):
        fn = dict(tool.get("function", tool)) if tool.get("type", "function") == "function" else None
        if fn is None:
            raise ValueError(f"{where}: only function tools are supported, got type {tool.get('type')!r}")
        if "return" in fn:  # transformers' get_json_schema names the result schema "return"
            fn["returns"] = fn.pop("return")
        return ToolSpec(function=FunctionSpec.model_validate(fn))
    if callable(tool):
        return function_spec(tool)
    raise TypeError(f"{where}: a tool is a ToolSpec, an OpenAI function schema (dict) or a function, got {tool!r}")


def backend_info(name: str) -> BackendInfo | None:
    """The registered backend ``name`` (importing its optional module when it is not registered
    yet); None when nothing registers it (a plugin this process has not loaded, among others)."""
    info = _BACKENDS.get(name)
    if info is None and name in _LAZY:
        importlib.import_module(_LAZY[name])  # registers the backend (or explains what is missing)
        info = _BACKENDS.get(name)
    return info


def backend_tools(name: str) -> list[ToolSpec]:
    """The tool catalogue plugin backend ``name`` registered (for tasks built in Python)."""
    info = backend_info(name)
    if info is None or info.tools is None:
        raise ValueError(f"backend {name!r} registered no tools")
    return [t.model_copy(deep=True) for t in info.tools]


def default_reward(name: str, task_id: Any = None) -> str | None:
    """The reward function backend ``name`` registered for its tasks; None when it has none
    (agentrl's own backends never do, and are not imported to find out). A backend this process
    does not know is an error, not "no reward": scoring its tasks by gold plans they may not have
    would be silently wrong."""
    if name in RESERVED and name not in _BACKENDS:
        return None
    info = backend_info(name)
    if info is None:
        raise ValueError(_unknown(name, task_id))
    return info.reward


def known_backends() -> list[str]:
    return sorted(set(_BACKENDS.names()) | set(_LAZY) | _ELSEWHERE)


def _unknown(name: str, task_id: Any) -> str:
    return f"unknown backend {name!r} for task {task_id!r}; known: {', '.join(known_backends())} ({plugins_hint()})"


def make_backend(task: Task) -> ToolBackend:
    """A fresh session for ``task``, starting from its ``initial_state``."""
    info = backend_info(task.backend)
    if info is None:
        raise ValueError(_unknown(task.backend, task.id))
    session = info.factory(task)
    reward = task.reward or info.reward
    if not hasattr(session, "call") and not hasattr(session, "execute"):
        raise TypeError(f"backend {task.backend!r}: its factory returned {type(session).__name__}, which has neither "
                        "call(name, arguments) nor execute(call)")
    if hasattr(session, "call") or (reward is not None and not hasattr(session, "check_turn")):
        return PluginSession(session, task, reward)
    return session


@functools.lru_cache(maxsize=1024)
def _validator(parameters: str) -> ArgChecks:
    """The argument checks of one parameters schema (its canonical JSON, so it is cached across
    episodes); any argument is allowed unless the schema lists its properties and no others."""
    schema = json.loads(parameters)
    props = schema.get("properties", {})
    closed = "properties" in schema and schema.get("additionalProperties", False) is False
    ints = frozenset(k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "integer")
    return jsonschema.Draft202012Validator(schema), (frozenset(props) if closed else None), ints


def _message(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        return exc.args[0]  # str(KeyError("x")) would be "'x'"
    return str(exc) or type(exc).__name__


class PluginSession:
    """A plugin backend's session behind the ``ToolBackend`` contract (module docstring).

    ``backend`` is the plugin's own object (a reward function replays an episode into a fresh one
    and reads it). Only the task's tools are callable, validated against the schemas the model
    was shown; like ``ExecutableBackend``, ``execute`` never raises.
    """

    def __init__(self, backend: Any, task: Task, reward: str | None = None):
        self.backend = backend
        self.task = task
        # tool exceptions other than ValueError/LookupError, as data (``tool_error``); the
        # session that hosts this one drains them (``envs.session.LocalEnvSession``)
        self.tool_errors: list[dict] = []
        self._schemas = {t.name: json.dumps(t.function.parameters, sort_keys=True) for t in task.tools}
        check = getattr(backend, "check_turn", None)
        if check is not None:
            self.check_turn = check
        elif reward is not None:  # scored at the end by the reward function; no gold replay to compare with
            self.check_turn = self._closed_turn_passes

    def execute(self, call: ToolCall) -> Any:
        if not hasattr(self.backend, "call"):  # the execute(ToolCall) contract: the backend validates
            return self.backend.execute(call)
        if call.name not in self._schemas:
            return {"error": f"unknown tool {call.name!r}"}
        # ValueError/LookupError: the plugin contract's way to say what the model got wrong
        return checked_call(call, _validator(self._schemas[call.name]), functools.partial(self.backend.call, call.name),
                            (ValueError, LookupError), _message, self._record_crash)

    def _record_crash(self, call: ToolCall, exc: Exception) -> None:
        self.tool_errors.append(tool_error(call, exc))

    def state(self) -> Any:
        state = getattr(self.backend, "state", None)
        if state is None:
            raise TypeError(f"task {self.task.id!r}: backend {self.task.backend!r} has no state(), which the gold-plan "
                            "checker compares; name a reward function (task `reward`, or register_backend(..., "
                            "reward=...)) or give the backend a state() method")
        return state()

    def close(self) -> None:
        """The plugin's own ``close()``, if it has one (a connection, a subprocess, a container to
        release), when the episode ends. Its failure is printed, not raised: the episode is over."""
        close = getattr(self.backend, "close", None)
        if close is None:
            return
        try:
            close()
        except Exception as err:  # noqa: BLE001 - reported; the episode's result stands
            log.warning(f"task {self.task.id!r}: backend {self.task.backend!r} close() failed: {type(err).__name__}: {err}")

    def _closed_turn_passes(self, turn_index: int, turn_results: Sequence, all_results: Sequence) -> "ClosedTurn":
        return ClosedTurn()


@dataclass(frozen=True)
class ClosedTurn:
    """The verdict on a closed turn of a task scored by a reward function, shaped like
    ``checker.TurnCheck`` (which cannot be imported here: the checker imports ``make_backend``)."""

    passed: bool = True
    state_match: bool = True
    results_match: bool = True
    reason: str = "closed; the episode is scored by its reward function"


def _task_hook(data: dict[str, Any]) -> dict[str, Any]:
    """Task files: the backend must be known (``sgls`` and the lazily imported ones count), and a
    plugin backend's task gets its tool catalogue when it lists none, or may list only tools of it."""
    backend = data.get("backend")
    if not isinstance(backend, str):
        return data  # the schema reports it
    info = None if backend in _LAZY or backend in _ELSEWHERE else backend_info(backend)
    if info is None and not (backend in _LAZY or backend in _ELSEWHERE):
        raise ValueError(f"backend: {_unknown(backend, data.get('id'))}")
    if info is None or info.tools is None:
        if "tools" not in data:  # only a plugin's catalogue can stand in for them
            raise ValueError(f"tools: Field required (backend {backend!r} registered no tools to fill in)")
        return data
    if "tools" not in data:
        return {**data, "tools": [t.model_dump(exclude_none=True) for t in info.tools]}
    catalogue = {t.name for t in info.tools}
    listed = [t.get("function", {}).get("name") for t in data["tools"] if isinstance(t, dict)] if isinstance(
        data["tools"], list) else []
    foreign = [n for n in listed if isinstance(n, str) and n not in catalogue]
    if foreign:
        raise ValueError(f"tools: backend {backend!r} has no tool {foreign[0]!r} (task {data.get('id')!r}); its tools: "
                         f"{', '.join(sorted(catalogue))}")
    return data


register_task_hook("envs.backend", _task_hook)


def builtin_tool_specs(class_names: Iterable[str]) -> list[ToolSpec]:
    """The ToolSpecs of every tool of the named builtin classes, in class then definition order."""
    specs: list[ToolSpec] = []
    for cname in class_names:
        cls = BUILTIN_CLASSES.get(cname)
        if cls is None:
            raise ValueError(f"unknown builtin domain class {cname!r}; known: {sorted(BUILTIN_CLASSES)}")
        specs.extend(function_spec(getattr(cls, t), t) for t in cls.tool_names())
    return specs
