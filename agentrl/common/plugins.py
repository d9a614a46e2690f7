"""Plugins: modules whose import registers tool backends, reward functions, advantage estimators
or methods, and the one routine that imports them.

A config names its plugins in ``envs.plugins``, ``rewards.plugins`` and ``algo.plugins``
(dotted module names, or ``.py`` file paths made absolute: Ray actors run in other working
directories); ``Config.plugins`` is all of them. Importing one runs its ``register_*`` calls.

A Ray actor is a process of its own: a backend registered only in the driver is unknown to the
rollout workers and tool-pool actors that open its sessions and score its episodes. So every
process that needs them calls ``load_plugins`` with the list the config gives it, and nothing
else does: the config validators in the driver (and ``agentrl eval``), and each actor's
constructor (rollout worker, tool-pool actor, learner, RODS synthesis actor), which receives
``cfg.plugins`` as an argument. Their other arguments are plain data (configs, tasks, method
names), so unpickling them needs no plugin. Commands without a config take ``--plugin``. A name
no plugin registered is an error that says which plugins this process imported.

One process-wide record of what was imported: one module (``examples/own_tools/env.py``)
usually registers a backend and its reward together, and a file is imported once.

This module imports nothing of agentrl: every layer may use it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import threading
import traceback
from collections.abc import Iterable

_LOADED: dict[str, None] = {}  # every plugin imported in this process (an ordered set)
_LOCK = threading.RLock()  # re-entrant: a plugin may import another through the registries
_FILES: dict[str, str] = {}  # resolved .py path -> the module name it was imported under


class PluginError(ValueError):
    """A plugin did something agentrl cannot go on from (a reward returned a non-number, a tool
    raised under ``rollout.on_tool_error: fail``, an import or registration failed): bad input,
    so the CLI prints this one message, without a traceback, and exits 2. The message names the
    plugin function, the task and, where Python knows it, the plugin's file and line."""


_AGENTRL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def plugin_where(err: BaseException | None = None, fn=None) -> str:
    """``file:line`` in the plugin where ``err`` was raised (the innermost frame of its traceback
    outside agentrl and the standard library), else where ``fn`` is defined; "" when neither is
    known. What a developer opens first."""
    if err is not None and err.__traceback__ is not None:
        for frame in reversed(traceback.extract_tb(err.__traceback__)):
            if frame.filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
                continue
            path = os.path.abspath(frame.filename)
            if not path.startswith(_AGENTRL_DIR + os.sep) and "site-packages" not in path and \
                    not path.startswith(os.path.dirname(os.__file__) + os.sep):
                return f"{_short(path)}:{frame.lineno}"
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is not None:
        return f"{_short(code.co_filename)}:{code.co_firstlineno}"
    return ""


def _short(path: str) -> str:
    """``path`` relative to the working directory when it lies below it (as a user typed it)."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def find_plugin_error(err: BaseException | None) -> PluginError | None:
    """The ``PluginError`` behind ``err``: itself, the cause it was raised from, or the error a Ray
    actor raised (``ray.exceptions.RayTaskError.cause``; the wrapper's text carries the remote
    traceback, the cause only the message). None when there is none."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        cause = getattr(err, "cause", None)
        if isinstance(cause, BaseException):  # a Ray wrapper (which may itself pass for a PluginError)
            err = cause
            continue
        if isinstance(err, PluginError):
            return err
        err = err.__cause__
    return None


def is_plugin_file(plugin: str) -> bool:
    """A plugin given as a file path (ends in ``.py`` or contains a path separator), not a module name."""
    return plugin.endswith(".py") or os.sep in plugin or bool(os.altsep and os.altsep in plugin)


def absolute_plugins(plugins: Iterable[str]) -> list[str]:
    """File plugins as absolute paths (Ray actors run in other working directories); module names unchanged."""
    return [os.path.abspath(p) if is_plugin_file(p) else p for p in plugins]


def loaded_plugins() -> list[str]:
    """Every plugin imported in this process so far, in import order."""
    return list(_LOADED)


def load_plugins(plugins: Iterable[str]) -> None:
    """Import each plugin once in this process (a file already imported as a module, e.g. a test
    file under pytest, is not imported again) and record it. Any failure becomes a PluginError
    naming the plugin: its traceback may point deep inside it."""
    with _LOCK:  # threaded tool-pool actors may load on two threads at once
        for plugin in absolute_plugins(plugins):
            if plugin in _LOADED:
                continue
            import_plugin(plugin)
            _LOADED[plugin] = None


def import_plugin(plugin: str, kind: str = "plugin") -> None:
    """Import one plugin of any kind (also ``algo.plugins``' loader): a dotted module name, or the
    path of a ``.py`` file (``is_plugin_file``, imported once per process by ``import_file``).
    Any failure becomes a ValueError naming the plugin (``kind`` says what it is, e.g. "estimator
    plugin"): its traceback may point deep inside it."""
    try:
        if is_plugin_file(plugin):
            import_file(plugin)
        else:
            importlib.import_module(plugin)
    except Exception as err:  # ImportError, SyntaxError, a registration error, ...
        where = plugin_where(err)
        if isinstance(err, SyntaxError) and err.filename:
            where = f"{_short(err.filename)}:{err.lineno}"
        raise PluginError(f"cannot import {kind} {plugin!r}{f' ({where})' if where else ''}: "
                          f"{type(err).__name__}: {err}") from err


def plugins_hint() -> str:
    """Where plugins come from, for 'unknown name' errors."""
    loaded = ", ".join(_LOADED) or "none"
    return (f"plugins imported in this process: {loaded}; a run names its plugins in envs.plugins / "
            f"rewards.plugins / algo.plugins, a command without a config takes --plugin")


def import_file(path: str) -> None:
    """Import the ``.py`` file at ``path`` once per process."""
    resolved = os.path.realpath(path)
    if resolved in _FILES:
        return
    if not os.path.isfile(resolved):
        raise FileNotFoundError(f"no such file: {resolved}")
    for module in list(sys.modules.values()):  # already imported under another name (a test module, algo.plugins)
        file = getattr(module, "__file__", None)
        if file and os.path.realpath(file) == resolved:
            _FILES[resolved] = module.__name__
            return
    stem = os.path.splitext(os.path.basename(resolved))[0]
    name = f"agentrl_plugin_{stem}_{hashlib.sha1(resolved.encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {resolved} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    _FILES[resolved] = name


def config_plugins(value: Iterable[str]) -> list[str]:
    """What the config's plugin validators keep: the plugins, file paths made absolute, imported
    here (so task files may name what they register, and ``algo.advantage`` may name a plugin's
    estimator: fields validate in order)."""
    value = absolute_plugins(value)
    load_plugins(value)
    return value


__all__ = ["PluginError", "absolute_plugins", "config_plugins", "find_plugin_error", "import_file", "import_plugin",
           "is_plugin_file", "load_plugins", "loaded_plugins", "plugin_where", "plugins_hint"]
