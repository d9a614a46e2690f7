"""The method registry: every research method a run may turn on, by name.

A method is a ``Method`` subclass (``agentrl/methods/base.py``) registered with
``@register_method``, like an advantage estimator (``agentrl/algos/registry.py``). The built-in
ones, the subpackages of ``agentrl/methods/``, are imported on first use; a run adds its own through
``algo.plugins`` (modules or ``.py`` files), loaded by the config's validation in the driver and
by the learner actor, which receives the config and builds its own methods (``active_methods``):
methods never travel pickled. A method decides from the config whether it is on
(``Method.enabled``); there is no list of methods to configure.

Imports neither torch nor Ray: the planner reads the rollout roles (``extra_roles``) and the
learner's memory estimate (``keeps_policy_copy``) on machines without them.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import TYPE_CHECKING

from agentrl.common.registry import Registry
from agentrl.common.registry import where as definition
from agentrl.methods.base import Method, RolloutRole

if TYPE_CHECKING:
    from agentrl.config import Config

_REGISTRY: Registry[type[Method]] = Registry("method")
# one subpackage per built-in method: found, not listed, so this module names none of them
_BUILTINS = tuple(f"{__package__}.{m.name}" for m in pkgutil.iter_modules(sys.modules[__package__].__path__) if m.ispkg)


def register_method(cls: type[Method]) -> type[Method]:
    """Class decorator: add a ``Method`` subclass to the table under ``cls.name``.

    Checked here, so a broken method fails when its module is imported, not in the middle of a
    run: a name that is an identifier (it is the metric namespace), an ``enabled`` of its own, a
    boolean ``keeps_policy_copy``. Registering a different class under a taken name is an error;
    the same class again (its module imported a second time) replaces the entry."""
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise TypeError(f"@register_method needs a Method subclass, got {cls!r}")
    where = definition(cls)
    if not isinstance(cls.name, str) or not cls.name.isidentifier():
        raise ValueError(f"method {where}: name must be an identifier, got {cls.name!r}")
    if cls.enabled.__func__ is Method.enabled.__func__:
        raise TypeError(f"method {where}: implement the classmethod enabled(cfg) (when a run uses it)")
    if not isinstance(cls.keeps_policy_copy, bool):
        raise TypeError(f"method {where}: keeps_policy_copy must be a bool, got {cls.keeps_policy_copy!r}")
    _load_builtins()  # a plugin registered first must still clash with a built-in name
    _REGISTRY.add(cls.name, cls, owner=where)
    return cls


def _load_builtins() -> None:
    for module in _BUILTINS:
        if module not in sys.modules:
            importlib.import_module(module)


def method_names() -> list[str]:
    """Every registered name, built-ins first, in registration order."""
    _load_builtins()
    return _REGISTRY.names()


def active_methods(cfg: Config) -> list[Method]:
    """The methods a run with ``cfg`` uses, in registration order (built-ins first)."""
    _load_builtins()
    return [cls(cfg) for _, cls in _REGISTRY.items() if cls.enabled(cfg)]


def extra_roles(cfg: Config) -> list[RolloutRole]:
    """The rollout roles of every active method: engines beside the policy's."""
    roles = [r for m in active_methods(cfg) for r in m.rollout_roles()]
    names = [r.name for r in roles]
    if len(set(names)) != len(names):
        raise ValueError(f"two active methods ask for rollout roles of the same name: {names}")
    return roles


def keeps_policy_copy(cfg: Config) -> bool:
    """Whether an active method makes the learner hold an fp32 copy of the policy (memory)."""
    return any(m.keeps_policy_copy for m in active_methods(cfg))


__all__ = ["Method", "RolloutRole", "active_methods", "extra_roles", "keeps_policy_copy",
           "method_names", "register_method"]
