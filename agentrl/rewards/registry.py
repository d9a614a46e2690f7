"""Reward functions: score a finished episode of a task that has no gold plan (docs/own_tools.md).

A reward function is registered under a name, ``register_reward(name, fn)``, usually by the same
plugin module that registers its backend (``envs.plugins`` / ``rewards.plugins``,
agentrl/common/plugins.py). A task is scored by one when it names it (``task.reward``) or when its
backend registered it as the default (``register_backend(..., reward=name)``); every other task
keeps the per-turn checks against its gold plans (docs/design.md §3).

``fn(episode, task)`` gets the finished ``agentrl.api.Episode`` (``calls``: per turn the calls
with their observations; ``answers``: the message that closed each turn; ``termination``; and so
on, docs/design.md §2) and the ``Task`` (its ``metadata`` holds whatever the function needs, e.g.
the expected end state). It returns the outcome in [0, 1] (a float or bool) or a ``Score`` with
an optional process score in [0, 1] for partial credit.

Two ways to read the backend's end state:

* replay: ``final_backend(episode, task)`` replays the episode's calls into a fresh session. The
  reward runs on the rollout worker after the episode's session closed; the backend must be
  deterministic (checked), and every call runs twice;
* live session: ``register_reward(name, fn, live_session=True)`` makes the call
  ``fn(episode, task, session)`` with the plugin's own object the episode's calls ran against,
  before it is closed, where it lives (``rollout.tool_pool.score_live``: a thread of the
  rollout worker under ``tools.placement: in_process``, the tool-pool actor under ``pool``). For
  a backend in front of a real service, or one whose answers carry ids or timestamps.

``rewards/scoring.py: score_episode`` dispatches here. This module also checks, when task files
are loaded, that every reward a task names (itself or through its backend) is registered.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import AfterValidator

from agentrl.common.plugins import PluginError, config_plugins, plugin_where, plugins_hint
from agentrl.common.registry import Registry, where
from agentrl.envs.checker import canonical
from agentrl.envs.registry import PluginSession, default_reward, make_backend
from agentrl.tasks.io import register_task_hook
from agentrl.tasks.schema import Task, ToolCall


@dataclass(frozen=True)
class Score:
    """What a reward function may return instead of a bare outcome.

    ``outcome``: success in [0, 1] (``rewards["outcome"]``, ``train/success``); ``process``:
    partial credit in [0, 1], or None for "same as the outcome". It becomes ``rewards["progress"]``
    (what ``algo.reward: progress``, the default, trains on) and ``rewards["process"]`` (what SLCA
    reads on tool-call tokens)."""

    outcome: float
    process: float | None = None


RewardFn = Callable[..., "float | bool | Score"]  # (episode, task), or (episode, task, session) when live
_REWARDS: Registry[RewardFn] = Registry("reward")
_LIVE_SESSION: set[str] = set()  # the rewards registered with live_session=True


def register_reward(name: str, fn: RewardFn, live_session: bool = False) -> RewardFn:
    """Make ``task.reward == name`` (or a backend's ``reward=name``) score with ``fn``; returns
    ``fn``. ``live_session``: ``fn(episode, task, session)`` reads the session the episode ran in
    (module docstring); otherwise ``fn(episode, task)``. A different function under a taken name
    is an error; the same function again (its module imported a second time, e.g. once per
    config validation) replaces the entry."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"register_reward: name must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise TypeError(f"register_reward({name!r}): fn must be callable (episode, task{', session' * live_session}) "
                        "-> outcome or Score")
    if not isinstance(live_session, bool):
        raise TypeError(f"register_reward({name!r}): live_session must be True or False, got {live_session!r}")
    _REWARDS.add(name, fn, owner=where(fn))
    if live_session:
        _LIVE_SESSION.add(name)
    else:
        _LIVE_SESSION.discard(name)
    return fn


def _name(fn: Any) -> str:
    """The function's own name (a file plugin's module has a generated name; its path follows)."""
    return getattr(fn, "__qualname__", repr(fn))


def reward_names() -> list[str]:
    return sorted(_REWARDS.names())


def get_reward(name: str, task_id: Any = None) -> RewardFn:
    """The reward function called ``name``; ValueError naming the task (and the plugins this
    process loaded) when nothing registered it."""
    fn = _REWARDS.get(name)
    if fn is None:
        known = ", ".join(reward_names()) or "none"
        raise ValueError(f"unknown reward {name!r} for task {task_id!r}; registered: {known} ({plugins_hint()})")
    return fn


def reward_name(task: Task) -> str | None:
    """The reward function that scores ``task``: its own ``reward``, else its backend's default;
    None = the per-turn checks on the gold plans."""
    return task.reward or default_reward(task.backend, task.id)


def reads_live_session(name: str, task_id: Any = None) -> bool:
    """Whether reward ``name`` was registered with ``live_session=True``."""
    get_reward(name, task_id)  # an unknown name is an error, not False
    return name in _LIVE_SESSION


def run_reward(name: str, episode: Any, task: Task, session: Any = None) -> tuple[float, float]:
    """(outcome, process) of ``episode`` by reward function ``name``, checked to be numbers in
    [0, 1]. A function that raises, or returns anything else, stops the rollout with a
    ``PluginError`` naming the reward, the task and the plugin's file and line (the CLI prints it
    and exits 2): training on a score that was never computed would be worse.

    ``session``: the episode's own session (what ``make_backend`` returned, not yet closed), for a
    ``live_session`` reward. Without one (the idle check of docs/own_tools.md, a test) such a
    reward reads ``final_backend``'s replay, closed afterwards; a reward that replays ignores it."""
    fn = get_reward(name, task.id)
    replayed = None
    try:
        if name not in _LIVE_SESSION:
            result = fn(episode, task)
        elif session is None:
            replayed = final_backend(episode, task)
            result = fn(episode, task, replayed)
        else:  # the plugin's own object, as final_backend returns it
            result = fn(episode, task, session.backend if isinstance(session, PluginSession) else session)
    except Exception as err:
        raise PluginError(f"reward {name!r} ({_name(fn)}, {plugin_where(err, fn)}) failed on task {task.id!r}: "
                          f"{type(err).__name__}: {err}") from err
    finally:
        close = getattr(replayed, "close", None)  # the replayed copy is ours to close
        if close is not None:
            close()
    outcome, process = (result.outcome, result.process) if isinstance(result, Score) else (result, None)
    outcome = _unit(outcome, name, fn, task, "outcome")
    return outcome, outcome if process is None else _unit(process, name, fn, task, "process")


def _unit(value: Any, name: str, fn: RewardFn, task: Task, what: str) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise PluginError(f"reward {name!r} returned {what} {value!r} for task {task.id!r}; expected a number in "
                          f"[0, 1] (the reward function {_name(fn)}, {plugin_where(fn=fn)})")
    return float(value)


def idle_episode(task: Task, answer: str = "Done.") -> Any:
    """An episode of ``task`` that answers every turn with ``answer`` without calling anything:
    the reward check of docs/own_tools.md (doing nothing must not succeed)."""
    from agentrl.api import Episode

    n = len(task.turns)
    return Episode(task_id=task.id, token_ids=[], response_mask=[], logprobs=[], segments=[], prompt_len=0,
                   turn_passed=[], n_turns=n, calls=[[] for _ in range(n)], answers=[answer] * n)


def final_backend(episode: Any, task: Task) -> Any:
    """The backend as the episode left it: a fresh session from the task's ``initial_state`` with
    every call of the episode executed again, in order. Returns the plugin's own object (for the
    ``call`` contract; the session itself otherwise). The backend must be deterministic (the same
    calls give the same observations), which is checked: a replay that sees another observation
    than the episode did raises, since the state it reached is not the episode's. A backend that
    is not deterministic (a real service, ids or timestamps in its answers) is scored by a reward
    registered with ``live_session=True`` instead (module docstring)."""
    session = make_backend(task)
    for u, turn in enumerate(episode.calls):
        for i, logged in enumerate(turn):
            seen = session.execute(ToolCall(name=logged["name"], arguments=logged["arguments"]))
            if canonical(seen) != canonical(logged.get("observation")):
                raise ValueError(f"task {task.id!r}: backend {task.backend!r} is not deterministic: replaying call {i} "
                                 f"of turn {u} ({logged['name']}) returned {canonical(seen)[:120]}, the episode saw "
                                 f"{canonical(logged.get('observation'))[:120]}; a reward registered with "
                                 "live_session=True reads the episode's own session instead of a replay")
    return getattr(session, "backend", session)


def _task_hook(data: dict[str, Any]) -> dict[str, Any]:
    """Task files: the reward a task names, itself or through its backend, must be registered."""
    own, backend = data.get("reward"), data.get("backend")
    if isinstance(own, str) and own:
        try:
            get_reward(own, data.get("id"))
        except ValueError as err:
            raise ValueError(f"reward: {err}") from None
    elif isinstance(backend, str):
        default = default_reward(backend, data.get("id"))
        if default is not None:
            try:
                get_reward(default, data.get("id"))
            except ValueError as err:
                raise ValueError(f"backend: {backend!r} scores its tasks with reward {default!r}, which is not "
                                 f"registered: {err}") from None
    return data


register_task_hook("rewards.reward", _task_hook)

# The validator of envs.plugins and rewards.plugins (``Annotated[list[...], AS_PLUGINS]``): the
# plugins imported when the config is validated, file paths made absolute. It
# lives here so that the config, by importing it, also registers the reward check on task files.
AS_PLUGINS = AfterValidator(config_plugins)

__all__ = ["AS_PLUGINS", "Score", "final_backend", "get_reward", "idle_episode", "reads_live_session",
           "register_reward", "reward_name", "reward_names", "run_reward"]
