"""ExecutableBackend: runs tool calls against real Python domain objects.

The agent loop must be able to feed it anything a model emits — misspelled tools, strings where
integers belong, extra arguments — and always get an observation back. So ``execute`` never
raises: every failure becomes ``{"error": message}``, with a message that tells the model what to
fix. Arguments are validated against the same schema the model was shown (derived from the
method), so "what the prompt promised" and "what the backend accepts" cannot disagree.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jsonschema

from agentrl.common.plugins import plugin_where
from agentrl.envs.builtin import BUILTIN_CLASSES, Domain, ToolError
from agentrl.envs.toolspec import function_spec
from agentrl.tasks.schema import Task, ToolCall

# (validator, allowed argument names or None for any, integer argument names) of one tool's schema
ArgChecks = tuple[jsonschema.protocols.Validator, frozenset[str] | None, frozenset[str]]


def tool_error(call: ToolCall, exc: BaseException) -> dict[str, Any]:
    """One tool exception as a record (``Episode.tool_errors``): the tool, its arguments, the
    exception's type and message, and where in a plugin it was raised (``file:line``, "" when it
    was not in a plugin). The session adds the turn (``envs.session.LocalEnvSession``)."""
    return {"tool": call.name, "arguments": json.loads(json.dumps(call.arguments, default=str)),
            "type": type(exc).__name__, "message": str(exc), "where": plugin_where(exc)}


def checked_call(call: ToolCall, checks: ArgChecks, run: Callable[[dict[str, Any]], Any],
                 expected: tuple[type[Exception], ...], message: Callable[[Exception], str] = str,
                 on_crash: Callable[[ToolCall, Exception], None] | None = None) -> Any:
    """``run(arguments)`` under the never-raise contract, shared with the plugin backends'
    ``PluginSession``: arguments checked against ``checks``, integral floats given to integer
    parameters as ints, the result detached as JSON. An ``expected`` exception is the backend's
    way to tell the model what it got wrong (``message`` words it); anything else is a crash,
    which the model reads too and ``on_crash(call, exc)`` records for the developer."""
    validator, known, ints = checks
    args = dict(call.arguments)
    extra = sorted(set(args) - known) if known is not None else []
    if extra:
        return {"error": f"invalid arguments for {call.name}: unexpected argument {extra[0]!r}"}
    errors = sorted(validator.iter_errors(args), key=lambda e: (list(e.absolute_path), e.message))
    if errors:
        where = ".".join(str(p) for p in errors[0].absolute_path)
        return {"error": f"invalid arguments for {call.name}: {where + ': ' if where else ''}{errors[0].message}"}
    for k in ints & set(args):  # JSON Schema accepts 3.0 as an integer; the backend should not see a float
        if isinstance(args[k], float):
            args[k] = int(args[k])
    try:
        result = run(args)
    except expected as exc:
        return {"error": message(exc)}
    except Exception as exc:  # noqa: BLE001 - the contract is "never raises"
        if on_crash is not None:
            on_crash(call, exc)
        return {"error": f"{call.name} failed: {type(exc).__name__}: {exc}"}
    try:  # detach from live state and guarantee the observation is JSON
        return json.loads(json.dumps(result))
    except (TypeError, ValueError) as exc:
        if on_crash is not None:  # a backend bug as much as an exception is
            on_crash(call, exc)
        return {"error": f"{call.name} returned a non-JSON result: {exc}"}


@functools.lru_cache(maxsize=None)
def _tool_entry(cls: type, name: str) -> ArgChecks:
    """The argument checks of one method (every parameter named, so none besides is allowed);
    cached because building validators dominates the cost of a call otherwise."""
    params = function_spec(getattr(cls, name), name).function.parameters
    validator = jsonschema.Draft202012Validator(params)
    props = params.get("properties", {})
    ints = frozenset(k for k, v in props.items() if v.get("type") == "integer")
    return validator, frozenset(props), ints


class ExecutableBackend:
    """One episode's session over several domain instances (``{ClassName: instance}``).

    ``initial_state`` is ``{ClassName: class_state}``; the classes used are those keys plus the
    owners of the task's tools (a domain may start empty). Only the task's tools are callable:
    a tool of the suite the task did not offer is as unknown to the model as a made-up one.
    Hiding withheld tools per turn is the agent loop's job, not the backend's.
    """

    def __init__(self, task: Task, classes: Mapping[str, type[Domain]] | None = None) -> None:
        self._init(task.initial_state, [t.name for t in task.tools], classes or BUILTIN_CLASSES)

    @classmethod
    def for_classes(
        cls,
        initial_state: Mapping[str, Any],
        class_names: Iterable[str] = (),
        classes: Mapping[str, type[Domain]] | None = None,
    ) -> "ExecutableBackend":
        """A session exposing every tool of the named classes (used by the task generator,
        which has no Task yet)."""
        classes = classes or BUILTIN_CLASSES
        names = list(dict.fromkeys([*initial_state, *class_names]))
        for n in names:
            if n not in classes:
                raise ValueError(f"unknown domain class {n!r}; known: {sorted(classes)}")
        tools = [t for n in names for t in classes[n].tool_names()]
        self = cls.__new__(cls)
        self._init(dict(initial_state), tools, classes)
        return self

    def _init(self, initial_state: Mapping[str, Any], tools: list[str], classes: Mapping[str, type[Domain]]) -> None:
        owners = {t: cname for cname, c in classes.items() for t in c.tool_names()}
        for cname in initial_state:
            if cname not in classes:
                raise ValueError(f"initial_state names unknown domain class {cname!r}; known: {sorted(classes)}")
        missing = [t for t in tools if t not in owners]
        if missing:
            raise ValueError(f"no domain class provides tools {missing}")
        used = list(dict.fromkeys([*initial_state, *(owners[t] for t in tools)]))
        self.instances: dict[str, Domain] = {
            cname: classes[cname](copy.deepcopy(initial_state.get(cname) or {})) for cname in used
        }
        self._tools = {t: self.instances[owners[t]] for t in tools}
        self.tool_errors: list[dict] = []  # exceptions other than ToolError: bugs of a domain (``tool_error``)

    @property
    def tool_names(self) -> list[str]:
        return list(self._tools)

    def execute(self, call: ToolCall) -> Any:
        """Run one call; failures (unknown tool, bad arguments, domain errors) are observations."""
        instance = self._tools.get(call.name)
        if instance is None:
            return {"error": f"unknown tool {call.name!r}"}
        method = getattr(instance, call.name)
        return checked_call(call, _tool_entry(type(instance), call.name), lambda args: method(**args), (ToolError,),
                            on_crash=lambda c, exc: self.tool_errors.append(tool_error(c, exc)))

    def state(self) -> dict[str, Any]:
        return {cname: inst.snapshot() for cname, inst in self.instances.items()}
