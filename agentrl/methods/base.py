"""What a research method plugs into: the ``Method`` hooks and the ``RolloutRole`` it may ask for.

A method (one package under ``agentrl/methods/``, or a plugin) changes a run at a few fixed
points, and the generic code calls it there without naming it:

* the rollout side: ``rollout_roles``, extra engines that sample part of every group under a
  policy of the method's own (planned, started, fed weights and rolled out like the policy's);
* the learner actor, on a step's groups: ``regroup`` (before the reward shuffle of
  ``algo.shuffle_rewards``), ``trained_groups`` (what the policy's update reads), and
  ``after_update`` (after the policy's update, on the regrouped groups);
* the DeepSpeed learner: ``learner_part``, a model of the method's own that lives beside the
  policy (its weights feed the method's role; its state is checkpointed with the learner's).

Two group hooks, not one: a method may merge the parts of a group its role and the policy
sampled before the reward shuffle, hide a reward from the policy after it, and still act after
the update on the shuffled groups as they were before the hiding. Metrics come back from
``regroup`` and ``after_update`` under the method's ``name`` ("<name>/..."), which the step's
metrics keep out of ``learner/``.

This module imports neither torch nor Ray: the planner and the config checks read the roles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from agentrl.api import POLICY, EpisodeGroup
from agentrl.engines.learner_parts import LearnerPart

if TYPE_CHECKING:
    from agentrl.config import Config


@dataclass(frozen=True)
class RolloutRole:
    """Engines a method runs beside the policy's (planning, the rollout side, the weight sync)."""

    # Episode.policy / EpisodeGroup.policy of its episodes, and the plan's role name ("<name>[i]")
    name: str
    # rollout workers (one engine each); they get the runtime.rollout_worker_* resources
    workers: int
    # the config key plan messages name for ``workers`` ("<section>.<key>")
    workers_key: str
    # episodes of each group it samples, taken out of rollout.group_size (the policy keeps the rest)
    episodes_per_group: int
    # rollout.engine fields its engines override ({"cpu_threads_bind": "1"}: cores of their own)
    engine_update: dict = field(default_factory=dict)
    # its episodes' summaries feed RODS's boundary statistics (by default only the policy's do)
    feeds_task_stats: bool = False

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name in (POLICY, "rollout"):
            raise ValueError(f"rollout role name {self.name!r}: an identifier other than {POLICY!r} and 'rollout' "
                             "(the policy's episodes and engines carry those)")
        if self.workers < 1 or self.episodes_per_group < 1:
            raise ValueError(f"rollout role {self.name!r} needs at least one worker and one episode per group, got "
                             f"{self.workers} and {self.episodes_per_group}")
        if "dtype" in self.engine_update:  # the learner casts every role's weights to the policy engines' dtype
            raise ValueError(f"rollout role {self.name!r}: engine_update may not set dtype (its engines take weights "
                             "published in rollout.engine.dtype)")


class Method:
    """Base class of a method; subclass it, set ``name``, implement ``enabled`` and the hooks it
    needs, decorate with ``@register_method`` (``agentrl.methods.registry``). An instance holds the
    run's ``Config``; each process builds its own from the config (the learner actor loads the
    config's plugins, then asks the registry), so instances never cross a process boundary."""

    # registry key and metric namespace: the step's "<name>/..." metrics are not put under learner/
    name: ClassVar[str] = ""
    # the learner holds a full fp32 copy of the policy with an AdamW of its own (memory estimate)
    keeps_policy_copy: ClassVar[bool] = False

    def __init__(self, cfg: Config):
        self.cfg = cfg

    @classmethod
    def enabled(cls, cfg: Config) -> bool:
        """Whether a run with ``cfg`` uses this method (read from the method's own config keys)."""
        raise NotImplementedError

    def rollout_roles(self) -> list[RolloutRole]:
        return []

    def learner_part(self, learner: Any) -> LearnerPart | None:
        """A model of the method's own, built at the end of ``DeepSpeedLearner.__init__``; the
        learner keeps it in ``learner.parts[self.name]``."""
        return None

    def regroup(self, groups: list[EpisodeGroup]) -> tuple[list[EpisodeGroup], dict[str, float]]:
        """A step's groups as the learner should see them, and metrics about them."""
        return groups, {}

    def trained_groups(self, groups: list[EpisodeGroup]) -> list[EpisodeGroup]:
        """The groups the policy's batch is built from (``build_batch``)."""
        return groups

    def after_update(self, learner: Any, groups: list[EpisodeGroup], metrics: dict[str, float]) -> None:
        """After the policy's update (``learner``: the DeepSpeed learner); may add to ``metrics``."""

    def __repr__(self) -> str:
        return f"<method {self.name!r} ({type(self).__module__}.{type(self).__qualname__})>"


__all__ = ["Method", "RolloutRole"]
