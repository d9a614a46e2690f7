"""Which backend executes a task: ``task.backend`` names a factory here.

Only ``builtin`` exists now; the BFCL adapter and the LLM simulator register themselves with
``register_backend`` so this module never has to import their heavy dependencies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from agentrl.envs.base import ToolBackend
from agentrl.envs.builtin import BUILTIN_CLASSES
from agentrl.envs.executable import ExecutableBackend
from agentrl.envs.toolspec import function_spec
from agentrl.tasks.schema import Task, ToolSpec

_FACTORIES: dict[str, Callable[[Task], ToolBackend]] = {"builtin": ExecutableBackend}


def register_backend(name: str, factory: Callable[[Task], ToolBackend]) -> None:
    """Make ``task.backend == name`` resolve to ``factory`` (later registrations win)."""
    _FACTORIES[name] = factory


def make_backend(task: Task) -> ToolBackend:
    """A fresh session for ``task``, starting from its ``initial_state``."""
    factory = _FACTORIES.get(task.backend)
    if factory is None:
        raise ValueError(f"task {task.id!r}: unknown backend {task.backend!r}; known: {sorted(_FACTORIES)}")
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
