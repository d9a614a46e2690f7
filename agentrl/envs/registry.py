"""Which backend executes a task: ``task.backend`` names a factory here.

``builtin`` is registered here; the BFCL adapter and the LLM simulator register themselves with
``register_backend`` so this module never has to import their heavy dependencies. Backends that
ship with agentrl but need optional packages are listed in ``_LAZY``: the first task naming one
imports its module (which registers it), so ``import agentrl`` stays light and a missing optional
package is reported only to the runs that use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable

from agentrl.envs.base import ToolBackend
from agentrl.envs.builtin import BUILTIN_CLASSES
from agentrl.envs.executable import ExecutableBackend
from agentrl.envs.toolspec import function_spec
from agentrl.tasks.schema import Task, ToolSpec

_FACTORIES: dict[str, Callable[[Task], ToolBackend]] = {"builtin": ExecutableBackend}
# backend name -> module whose import registers it (see the module docstring)
_LAZY: dict[str, str] = {"bfcl": "agentrl.envs.bfcl"}


def register_backend(name: str, factory: Callable[[Task], ToolBackend]) -> None:
    """Make ``task.backend == name`` resolve to ``factory`` (later registrations win)."""
    _FACTORIES[name] = factory


def make_backend(task: Task) -> ToolBackend:
    """A fresh session for ``task``, starting from its ``initial_state``."""
    factory = _FACTORIES.get(task.backend)
    if factory is None and task.backend in _LAZY:
        importlib.import_module(_LAZY[task.backend])  # registers the backend (or explains what is missing)
        factory = _FACTORIES.get(task.backend)
    if factory is None:
        known = sorted(set(_FACTORIES) | set(_LAZY))
        raise ValueError(f"task {task.id!r}: unknown backend {task.backend!r}; known: {known}")
    return factory(task)


def builtin_tool_specs(class_names: Iterable[str]) -> list[ToolSpec]:
    """The ToolSpecs of every tool of the named builtin classes, in class then definition order."""
    specs: list[ToolSpec] = []
    for cname in class_names:
        cls = BUILTIN_CLASSES.get(cname)
        if cls is None:
            raise ValueError(f"unknown builtin domain class {cname!r}; known: {sorted(BUILTIN_CLASSES)}")
        specs.extend(function_spec(getattr(cls, t), t) for t in cls.tool_names())
    return specs
