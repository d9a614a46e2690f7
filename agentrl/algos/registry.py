"""The advantage-estimator registry: every ``algo.advantage`` name, what it needs, and its code.

An estimator is a class registered with ``@register_estimator``: its class attributes are its
row in the name table (``name``, a one-line ``description`` for the configuration reference, and
four flags the config and the learner read), and its one method ``compute`` turns the episodes
of ONE group into per-token advantages (per-token rewards for a critic estimator) plus a
"has signal" flag. ``runtime.batching.build_batch`` looks the configured name up here and does
the shared rest: KL in the reward, flattening into the learner's batch, the statistics.

The built-in estimators live in ``agentrl/algos/estimators.py`` (loaded on first use); a run can
add its own with ``algo.plugins``: Python modules, or paths of ``.py`` files, imported (once per
process, ``agentrl.common.plugins.load_plugins``) when the config is validated and by every actor
that receives the config (the learner's Ray actor is a process of its own).
See docs/design.md §9.

This module imports neither torch nor Ray: ``agentrl.config`` validates ``algo.advantage`` and
its prerequisites against this table on machines without either. Modules that register
estimators and are imported during validation (the built-in one, plugins meant to validate
without torch) import torch inside ``compute``.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from agentrl.api import Episode
from agentrl.common.registry import Registry
from agentrl.common.registry import where as definition

if TYPE_CHECKING:
    from torch import Tensor

FLAGS = ("needs_critic", "needs_summary_reward", "reads_process_reward", "reads_turn_verdicts", "allows_kl_in_reward")


class GroupAdvantages(NamedTuple):
    """What ``Estimator.compute`` returns for one group."""

    # One 1-D float tensor per episode, of the episode's length (len(token_ids)): the advantage
    # of each token (the reward of each token for a critic estimator). Values off the policy
    # tokens are ignored (the batch keeps only response_mask = 1 positions).
    per_token: list[Tensor]
    # Whether the group carries a learning signal (its advantages are not all 0); counted into the
    # ``groups_with_signal`` statistic.
    has_signal: bool


class Estimator:
    """Base class of an advantage estimator; subclass it, set the class attributes, implement
    ``compute``, decorate with ``@register_estimator``.

    Class attributes (the estimator's row in the name table):

    * ``name``: the ``algo.advantage`` value that selects it;
    * ``description``: one line for the configuration reference;
    * ``needs_critic``: ``compute`` returns per-token *rewards*; the learner builds a critic
      (``algo.critic`` must be set) and turns them into advantages with GAE (docs/design.md §4);
    * ``needs_summary_reward``: reads the summary reward R_sum (``rewards.summary`` must not be
      ``none``); ``build_batch`` then reports ``episodes_with_summary``;
    * ``reads_process_reward``: reads the HierR process score (``rewards["process"]``); a method
      that hides the process score from the policy gives it the outcome-side ``algo.reward``
      instead (docs/design.md §4);
    * ``reads_turn_verdicts``: reads the checker's per-turn verdicts (``turn_passed``), which
      ``algo.shuffle_rewards`` would leave attached to their episodes, so the config refuses it;
    * ``allows_kl_in_reward``: ``algo.kl_in=reward`` is meaningful for it (it builds advantages
      from the episode reward ``episode_rewards`` gives, less the ``kl_penalty``); when False
      the config refuses ``kl_in=reward``.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    needs_critic: ClassVar[bool] = False
    needs_summary_reward: ClassVar[bool] = False
    reads_process_reward: ClassVar[bool] = False
    reads_turn_verdicts: ClassVar[bool] = False
    allows_kl_in_reward: ClassVar[bool] = True

    def compute(self, episodes: list[Episode], algo: Any, kl_penalty: list[float] | None = None) -> GroupAdvantages:
        """Per-token advantages of ONE group.

        ``episodes``: the group's ``agentrl.api.Episode`` records (docs/design.md §2), in
        group order; ``algo``: the ``AlgoConfig``; ``kl_penalty``: with ``algo.kl_in=reward``,
        the KL charge of each episode (``algo.kl_coef`` times the sum of its per-token KL
        estimates over its policy tokens) to subtract from the episode's reward, else None. A
        critic estimator may ignore it for its token rewards: ``build_batch`` subtracts the
        per-token KL from those itself.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<estimator {self.name!r} ({type(self).__module__}.{type(self).__qualname__})>"


_REGISTRY: Registry[Estimator] = Registry("advantage estimator")
_BUILTINS = "agentrl.algos.estimators"


def register_estimator(cls: type[Estimator]) -> type[Estimator]:
    """Class decorator: add an ``Estimator`` subclass to the table under ``cls.name``.

    The row is checked here (a name, a one-line description, boolean flags, a ``compute`` of its
    own), so a broken estimator fails when its module is imported, not in the middle of a run.
    Registering a different class under a taken name is an error; the same class again (its
    module imported a second time) replaces the entry.
    """
    if not (isinstance(cls, type) and issubclass(cls, Estimator)):
        raise TypeError(f"@register_estimator needs an Estimator subclass, got {cls!r}")
    where = definition(cls)
    name = cls.name
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"estimator {where}: name must be an identifier-like string, got {name!r}")
    desc = cls.description
    if not isinstance(desc, str) or not desc.strip() or "\n" in desc:
        raise ValueError(f"estimator {where}: description must be one non-empty line, got {desc!r}")
    for flag in FLAGS:
        if not isinstance(getattr(cls, flag), bool):
            raise TypeError(f"estimator {where}: {flag} must be a bool, got {getattr(cls, flag)!r}")
    if cls.compute is Estimator.compute:
        raise TypeError(f"estimator {where}: implement compute(episodes, algo, kl_penalty)")
    _load_builtins()  # a plugin registered first must still clash with a built-in name
    _REGISTRY.add(name, cls(), owner=where)
    return cls


def _load_builtins() -> None:
    if _BUILTINS not in sys.modules:
        importlib.import_module(_BUILTINS)


def estimator_names() -> list[str]:
    """Every registered name, built-ins first, in registration order."""
    _load_builtins()
    return _REGISTRY.names()


def builtin_estimator_names() -> list[str]:
    """The names registered by agentrl itself (``agentrl/algos/estimators.py``), in order."""
    _load_builtins()
    return [name for name, est in _REGISTRY.items() if type(est).__module__ == _BUILTINS]


def get_estimator(name: str) -> Estimator:
    """The registered estimator called ``name``; KeyError with a hint and the known names."""
    _load_builtins()
    estimator = _REGISTRY.get(name)
    if estimator is None:
        raise KeyError(unknown_estimator_message(name))
    return estimator


def unknown_estimator_message(name: str) -> str:
    return _REGISTRY.unknown(name)


def estimator_for(algo: Any) -> Estimator:
    """The estimator an ``AlgoConfig`` selects (its ``algo.plugins`` were loaded in this process:
    by the config's validation, or by the actor that received the config)."""
    return get_estimator(algo.advantage)


__all__ = ["FLAGS", "Estimator", "GroupAdvantages", "builtin_estimator_names", "estimator_for", "estimator_names",
           "get_estimator", "register_estimator", "unknown_estimator_message"]
