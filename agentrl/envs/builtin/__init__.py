"""Builtin executable domains: small deterministic classes whose public methods are the tools.

``BUILTIN_CLASSES`` maps the class name (the key used in a task's ``initial_state``) to the class.
Tool names are unique across the whole suite, so a call can be dispatched by name alone.
"""

from agentrl.envs.builtin.bank import Bank
from agentrl.envs.builtin.base import Domain, ToolError
from agentrl.envs.builtin.calendar import DAYS, Calendar
from agentrl.envs.builtin.filestore import FileStore

BUILTIN_CLASSES: dict[str, type[Domain]] = {"Bank": Bank, "Calendar": Calendar, "FileStore": FileStore}


def _owners() -> dict[str, str]:
    owners: dict[str, str] = {}
    for cname, cls in BUILTIN_CLASSES.items():
        for tool in cls.tool_names():
            if tool in owners:
                raise RuntimeError(f"tool {tool!r} defined by both {owners[tool]} and {cname}")
            owners[tool] = cname
    return owners


#: tool name -> class name owning it.
TOOL_OWNERS: dict[str, str] = _owners()

__all__ = ["BUILTIN_CLASSES", "DAYS", "TOOL_OWNERS", "Bank", "Calendar", "Domain", "FileStore", "ToolError"]
