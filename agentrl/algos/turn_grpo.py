"""Turn-level GRPO: credit each user turn with its own group-relative advantage.

For multi-turn tasks whose checker is cumulative (BFCL style, ``envs.checker``: a turn passes when
the world state after it equals the gold state), an episode-level advantage blames every turn of
a failed episode, including the turns it got right, and credits nothing in particular in a
successful one. Most tokens of an episode (call syntax, the turns every sample solves) are then
pushed up and down at random, which for a small policy is mostly noise.

Anchor set. Episodes of one group that passed every turn before u start turn u from the same
world state (the gold state after turn u-1), so their turn-u actions are directly comparable —
the same idea as GiGPO's anchor states (``algos.gigpo``), with the world state instead of the
observation history as the key:

    S_u  = { i : episode i reached turn u and passed turns 0..u-1 }
    r_iu = 1 if episode i passed turn u else 0          (a turn cut off by a limit did not pass)
    A_iu = (r_iu - mean_{j in S_u} r_ju) / (std_{j in S_u} r_ju + eps)   for i in S_u
    A_iu = 0                                            for i not in S_u, or |S_u| < 2

Turns after an episode's first failure get 0: the state has diverged, the checker cannot judge
them, and they carry no information about the policy's choice at turn u. ``std`` is the unbiased
sample std, as in ``advantages.grpo``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.algos.advantages import grpo


def turns_reached(turn_passed: list[bool], step_turns: list[int]) -> int:
    """Turns the episode worked on: the checked ones, plus one cut off mid-turn (it has steps)."""
    return max(len(turn_passed), (max(step_turns) + 1) if step_turns else 0)


def turn_grpo(turn_passed: list[list[bool]], reached: list[int], eps: float = 1e-6) -> list[Tensor]:
    """Per-episode turn advantages [reached_i] for one group (see the module docstring).

    ``turn_passed[i]``: the checker's verdict for each turn episode i finished; ``reached[i]``
    (>= len(turn_passed[i])): turns it worked on, a turn beyond the checked ones counting as
    failed.
    """
    if any(r < len(p) for p, r in zip(turn_passed, reached)):
        raise ValueError("reached[i] must be >= len(turn_passed[i])")
    out = [torch.zeros(r, dtype=torch.float32) for r in reached]
    for u in range(max(reached, default=0)):
        anchor = [i for i, (p, r) in enumerate(zip(turn_passed, reached)) if r > u and all(p[:u])]
        if len(anchor) < 2:
            continue
        r_u = torch.tensor([1.0 if u < len(turn_passed[i]) and turn_passed[i][u] else 0.0 for i in anchor])
        for i, a in zip(anchor, grpo(r_u, eps=eps)):
            out[i][u] = a
    return out


def turns_to_steps(turn_adv: Tensor, step_turns: list[int]) -> Tensor:
    """Each step (assistant message) gets the advantage of the user turn it belongs to."""
    return torch.stack([turn_adv[t] for t in step_turns]) if step_turns else torch.zeros(0)
