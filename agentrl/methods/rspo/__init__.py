"""RSPO as a method (docs/design.md §4, "RSPO"): an explorer B, derived from the policy A on a
dense process reward, samples part of every group; A is trained on the outcome reward only.

Where it plugs in (``agentrl/methods/base.py``):

* ``rollout_roles``: B's engines (``rspo.explorer_workers``), G_B of every group's episodes;
* ``regroup``: the policy's and the explorer's parts of a task's group become one group
  (``groups.merge_mixed_groups``), with per-policy success metrics; an explorer part whose
  policy part was lost (a quarantined task) is left out;
* ``trained_groups``: A's update reads the outcome side only (``groups.policy_rewards``);
* ``after_update``: every ``rspo.refresh_every`` steps, B is re-derived from the updated A on
  the process-reward batch of A's episodes (``groups.explorer_batch``);
* ``learner_part``: B itself, beside A in the learner (``part.py``, ``explorer.py``).

The config section stays in ``agentrl/config/rspo_schema.py`` (configs validate without this
package's torch parts); the method is on when ``rspo.enabled`` is. ``EXPLORER`` (``groups.py``)
is the name of B's rollout role.
"""

from __future__ import annotations

from typing import Any

from agentrl.api import EpisodeGroup
from agentrl.config.schema import explorer_group_size
from agentrl.methods.base import Method, RolloutRole
from agentrl.methods.registry import register_method
from agentrl.methods.rspo.groups import EXPLORER, explorer_batch, merge_mixed_groups, policy_rewards, success_shares

# the learner's metrics of the IS weights on B's tokens, under RSPO's names
_FOREIGN_NAMES = {"foreign_is_weight_mean": "rspo/is_weight_mean", "foreign_is_clip_frac": "rspo/is_clip_frac",
                  "foreign_tokens_trained": "rspo/explorer_tokens_trained"}


@register_method
class RspoMethod(Method):
    name = "rspo"
    keeps_policy_copy = True  # B: an fp32 copy of A with its own AdamW

    @classmethod
    def enabled(cls, cfg) -> bool:
        return cfg.rspo.enabled

    def rollout_roles(self) -> list[RolloutRole]:
        r = self.cfg.rspo
        bind = {"cpu_threads_bind": r.explorer_cpu_threads_bind} if r.explorer_cpu_threads_bind is not None else {}
        return [RolloutRole(EXPLORER, r.explorer_workers, "rspo.explorer_workers",
                            explorer_group_size(r.explorer_fraction, self.cfg.rollout.group_size),
                            engine_update=bind, feeds_task_stats=r.boundary_from_explorer)]

    def learner_part(self, learner: Any):
        from agentrl.methods.rspo.part import ExplorerPart  # torch, in the learner's process only

        return ExplorerPart(learner, self.cfg.rspo)

    def regroup(self, groups: list[EpisodeGroup]) -> tuple[list[EpisodeGroup], dict[str, float]]:
        merged = merge_mixed_groups(groups)
        # Every task gets both parts; the policy's is missing only after a failure (the task was
        # quarantined: its rollout worker died with it twice; or every one of A's episodes failed
        # its environment after the retries). B's part alone has no episode of A in its baseline,
        # which RSPO's group advantage is defined over: it is left out.
        kept = [g for g in merged if any(e.policy != EXPLORER for e in g.episodes)]
        return kept, {**success_shares(kept), "rspo/explorer_only_groups_dropped": float(len(merged) - len(kept))}

    def trained_groups(self, groups: list[EpisodeGroup]) -> list[EpisodeGroup]:
        r = self.cfg.rspo
        return policy_rewards(groups, self.cfg.algo.reward, r.process_reward, r.swap)

    def after_update(self, learner: Any, groups: list[EpisodeGroup], metrics: dict[str, float]) -> None:
        for key, name in _FOREIGN_NAMES.items():
            if key in metrics:
                metrics[name] = metrics.pop(key)
        r = self.cfg.rspo
        if (learner.version - 1) % r.refresh_every:  # B is kept in between
            metrics["rspo/derived"] = 0.0
            return
        batch = explorer_batch(groups, r.process_reward, self.cfg.algo.eps)
        if batch is None:  # no group with two of A's episodes: nothing to derive B on
            metrics["rspo/derived"] = 0.0
            return
        metrics.update(learner.parts[self.name].derive(batch))
        metrics["rspo/derived"] = 1.0


__all__ = ["EXPLORER", "RspoMethod"]
