"""The built-in advantage estimators (docs/design.md §4), registered by name (``algos.registry``).

Each class is one ``algo.advantage`` value: its class attributes are its row in the name table
the config validates against, and its ``compute`` maps the ``Episode`` records of ONE group onto the
pure tensor functions of ``agentrl.algos`` (formulas in their docstrings), returning one
per-token tensor per episode and whether the group carries a signal. ``runtime.batching``
applies KL in the reward, flattens the groups into the learner's batch and keeps the statistics.

``agentrl.config`` imports this module to know the names, and must not import torch, so torch
and the math modules are imported inside the methods. Adding an estimator: one class here (or in
a plugin module, ``algo.plugins``) plus its test; docs/design.md §9.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrl.algos.registry import Estimator, GroupAdvantages, register_estimator
from agentrl.rewards.scoring import step_rewards

if TYPE_CHECKING:
    from torch import Tensor

    from agentrl.api import Episode


# ------------------------------------------------------------------ helpers (also for plugins)

def episode_rewards(episodes: list[Episode], algo: Any, kl_penalty: list[float] | None = None) -> Tensor:
    """r_i = rewards[algo.reward] of episode i, less its KL charge when given: float32 [G]."""
    import torch

    if kl_penalty is None:
        values = [e.rewards[algo.reward] for e in episodes]
    else:
        values = [e.rewards[algo.reward] - k for e, k in zip(episodes, kl_penalty)]
    return torch.tensor(values, dtype=torch.float32)


def broadcast(adv: Tensor, episodes: list[dict]) -> GroupAdvantages:
    """One advantage per episode on every policy token of it; signal = any advantage != 0."""
    import torch

    per_token = [a * torch.tensor(e.response_mask, dtype=torch.float32) for a, e in zip(adv, episodes)]
    return GroupAdvantages(per_token, bool((adv != 0).any()))


def steps_on_tokens(step_values: list[Tensor], episodes: list[dict]) -> list[Tensor]:
    """Each step's value on that step's tokens (``gigpo.steps_to_tokens``), one tensor per episode."""
    from agentrl.algos.gigpo import steps_to_tokens

    return [steps_to_tokens(v, [tuple(sp) for sp in e.step_spans], len(e.token_ids)) for v, e in zip(step_values, episodes)]


def _state_ids(groups_states: list[list[str]]) -> list[Tensor]:
    """Hash strings -> small ints shared across the group (torch.unique needs numbers)."""
    import torch

    index: dict[str, int] = {}
    return [torch.tensor([index.setdefault(s, len(index)) for s in states], dtype=torch.long) for states in groups_states]


def _step_rewards(episodes: list[dict], algo: Any) -> list[list[float]]:
    """Per-step rewards of each episode: a turn's credit on its last step (``rewards.scoring``)."""

    return [step_rewards(e.turn_passed, e.n_turns, e.step_turns, algo.reward) for e in episodes]


# ------------------------------------------------------------------ episode level (algos/advantages.py)

@register_estimator
class GRPO(Estimator):
    """A_i = (r_i - mean(r)) / (std(r) + eps) on every policy token (``advantages.grpo``)."""

    name = "grpo"
    description = "(r - mean r) / (std r + eps) within the group, one scalar per episode (GRPO)"

    def compute(self, episodes, algo, kl_penalty=None):
        from agentrl.algos.advantages import grpo

        return broadcast(grpo(episode_rewards(episodes, algo, kl_penalty), eps=algo.eps), episodes)


@register_estimator
class DrGRPO(Estimator):
    """A_i = r_i - mean(r) on every policy token (``advantages.dr_grpo``)."""

    name = "dr_grpo"
    description = "r - mean r within the group, no std division (Dr.GRPO)"

    def compute(self, episodes, algo, kl_penalty=None):
        from agentrl.algos.advantages import dr_grpo

        return broadcast(dr_grpo(episode_rewards(episodes, algo, kl_penalty)), episodes)


@register_estimator
class RLOO(Estimator):
    """A_i = r_i - (sum_j r_j - r_i) / (G - 1) on every policy token (``advantages.rloo``)."""

    name = "rloo"
    description = "r minus the mean reward of the other G-1 episodes (REINFORCE leave-one-out)"

    def compute(self, episodes, algo, kl_penalty=None):
        from agentrl.algos.advantages import rloo

        return broadcast(rloo(episode_rewards(episodes, algo, kl_penalty)), episodes)


@register_estimator
class RAFT(Estimator):
    """A_i = 1 if r_i = max(r) > 0 else 0 on every policy token (``advantages.raft``).

    No ``kl_in=reward``: the estimator imitates the group's best episodes by their task reward; a
    KL charge would pick the "best" by divergence among equally good episodes.
    """

    name = "raft"
    description = "1 on the group's best episodes when the best reward is > 0, else 0 (RAFT / RAFT++)"
    allows_kl_in_reward = False

    def compute(self, episodes, algo, kl_penalty=None):
        from agentrl.algos.advantages import raft

        return broadcast(raft(episode_rewards(episodes, algo, kl_penalty)), episodes)


# ------------------------------------------------------------------ step and turn level

@register_estimator
class GiGPO(Estimator):
    """A[i, k] = grpo(r)_i + omega * A_step[i, k] on the tokens of step k (``gigpo.gigpo``).

    A_step z-scores the discounted step returns (gamma = ``algo.gigpo.gamma``) over the steps of the
    group that start from the same environment state (``step_states``). Step rewards put each
    turn's credit on its last step, so it reads the turn verdicts. KL in the reward is charged to
    the episode reward and to its last step's reward.
    """

    name = "gigpo"
    description = "episode GRPO + omega * step advantage, steps grouped by the environment state they start from (GiGPO)"
    reads_turn_verdicts = True

    def compute(self, episodes, algo, kl_penalty=None):
        import torch

        from agentrl.algos.gigpo import gigpo

        rewards = episode_rewards(episodes, algo, kl_penalty)
        srs = [torch.tensor(s, dtype=torch.float32) for s in _step_rewards(episodes, algo)]
        if kl_penalty is not None:  # KL-in-reward: charged at the episode's last step
            for sr, k in zip(srs, kl_penalty):
                if sr.numel():
                    sr[-1] -= k
        state_ids = _state_ids([e.step_states for e in episodes])
        step_adv = gigpo(rewards, srs, state_ids, algo.gigpo.omega, algo.gigpo.gamma, algo.eps)
        return GroupAdvantages(steps_on_tokens(step_adv, episodes), bool((rewards != rewards[0]).any()))


@register_estimator
class TurnGRPO(Estimator):
    """A_iu = GRPO of the pass/fail of turn u among the episodes that passed turns 0..u-1, on the
    tokens of turn u (``turn_grpo.turn_grpo``). ``algo.reward`` is not read: the checker's
    verdicts are the reward, so there is no shaped reward to charge KL to."""

    name = "turn_grpo"
    description = "each user turn's own pass/fail GRPO advantage, among the episodes that passed every earlier turn"
    reads_turn_verdicts = True
    allows_kl_in_reward = False

    def compute(self, episodes, algo, kl_penalty=None):
        from agentrl.algos.turn_grpo import turn_grpo, turns_reached, turns_to_steps

        reached = [turns_reached(e.turn_passed, e.step_turns) for e in episodes]
        turn_adv = turn_grpo([e.turn_passed for e in episodes], reached, algo.eps)
        steps = [turns_to_steps(a, e.step_turns) for a, e in zip(turn_adv, episodes)]
        return GroupAdvantages(steps_on_tokens(steps, episodes), any(bool((a != 0).any()) for a in turn_adv))


@register_estimator
class PPO(Estimator):
    """Per-token rewards for the learner's critic and GAE (``critic.gae``): each step's reward
    (``rewards.scoring.step_rewards``) on the step's last token. With ``kl_in=reward``,
    ``build_batch`` subtracts kl_coef * KL_t on every policy token; the signal flag compares the
    KL-charged episode rewards."""

    name = "ppo"
    description = "GAE advantages from a learned critic over per-token rewards (each step's reward on its last token)"
    needs_critic = True
    reads_turn_verdicts = True

    def compute(self, episodes, algo, kl_penalty=None):
        import torch

        per_token = []
        for e, srs in zip(episodes, _step_rewards(episodes, algo)):
            tr = torch.zeros(len(e.token_ids))
            for (start, end), r in zip(e.step_spans, srs):
                if end > start:
                    tr[end - 1] += r
            per_token.append(tr)
        rewards = episode_rewards(episodes, algo, kl_penalty)
        return GroupAdvantages(per_token, bool((rewards != rewards[0]).any()))


# ------------------------------------------------------------------ segment level (algos/slca.py)

@register_estimator
class SLCA(Estimator):
    """A_tool (z-scored R_tool = ``process``) on tool-segment tokens, A_sum (z-scored R_sum =
    ``summary``) on summary-segment tokens, each over the group's episodes that have the segment
    (``slca.slca``, ``slca.route_segments``). Two rewards, so no single one to charge KL to."""

    name = "slca"
    description = "segment-locked: z-scored R_tool on tool-call tokens, z-scored R_sum on summary tokens (SLCA-GRPO)"
    needs_summary_reward = True
    reads_process_reward = True
    allows_kl_in_reward = False

    def compute(self, episodes, algo, kl_penalty=None):
        import torch

        from agentrl.algos.slca import SEG_SUMMARY, SEG_TOOL, route_segments, slca

        segs = [torch.tensor(e.segments) for e in episodes]
        has_tool = torch.tensor([bool((s == SEG_TOOL).any()) for s in segs])
        has_sum = torch.tensor([bool((s == SEG_SUMMARY).any()) for s in segs])
        r_tool = torch.tensor([e.rewards["process"] for e in episodes], dtype=torch.float32)
        r_sum = torch.tensor([e.rewards["summary"] for e in episodes], dtype=torch.float32)
        a_tool, a_sum = slca(r_tool, r_sum, has_tool, has_sum, algo.slca.lam_tool, algo.slca.lam_sum, algo.eps)
        per_token = [route_segments(a_tool[i : i + 1], a_sum[i : i + 1], s.unsqueeze(0))[0] for i, s in enumerate(segs)]
        return GroupAdvantages(per_token, bool((a_tool != 0).any() or (a_sum != 0).any()))


__all__ = ["DrGRPO", "GRPO", "GiGPO", "PPO", "RAFT", "RLOO", "SLCA", "TurnGRPO", "broadcast", "episode_rewards",
           "steps_on_tokens"]
