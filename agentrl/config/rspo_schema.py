"""Config section of RSPO (``rspo``): an explorer policy trained on a dense process reward widens
exploration; the policy itself is optimized on the outcome reward only (docs/design.md §4,
"RSPO"). Part of the tree in ``config/schema.py``; field comments here are the configuration
reference too.

RSPO's full text is not public; these keys are the open choices of our reconstruction from its
abstract, with the defaults we chose.
"""

from __future__ import annotations

from typing import Literal

from agentrl.config.types import Bool, NonEmptyStr, NonNegFloat, OpenUnit, PosFloat, PosInt, Section


class RspoConfig(Section):
    # Mix episodes of an explorer policy B into every group; the policy A is trained on them.
    enabled: Bool = False
    # Optimizer steps that derive B from A (after A's update) on the process reward of the
    # episodes A produced this step; no extra rollouts.
    explorer_steps: PosInt = 1
    # Learning rate of those steps (AdamW, fresh each derivation); null = learner.lr.
    explorer_lr: PosFloat | None = None
    # Share of each group's episodes sampled by B (G_B = round(fraction * rollout.group_size), at
    # least 1; G_A = the rest, at least 2 for a group baseline). B's episodes count in the budget.
    explorer_fraction: OpenUnit = 0.25
    # The dense reward B is trained on: "process" (the HierR process score R_tool) or "progress"
    # (the share of user turns passed).
    process_reward: Literal["process", "progress"] = "process"
    # Cap C of the truncated importance weight min(pi_A / pi_B, C) on B's tokens in A's update.
    is_cap: PosFloat = 2.0
    # Re-derive B from A every this many learner steps (B is kept in between).
    refresh_every: PosInt = 1
    # true: A's update reads only algo.reward (the outcome side); false: the ablation that trains
    # A on rspo.process_reward instead (the misaligned baseline RSPO argues against).
    swap: Bool = True
    # Rollout workers (one vLLM engine each) that serve B; they get the runtime.rollout_worker_* resources.
    explorer_workers: PosInt = 1
    # CPU cores of B's vLLM engines (as rollout.engine.cpu_threads_bind); null = the policy's
    # setting. On a CPU node both engines otherwise bind to the same cores and take turns on them:
    # on 2 cores, e.g. "1" here and rollout.engine.cpu_threads_bind "0".
    explorer_cpu_threads_bind: NonEmptyStr | None = None
    # Feed RODS's boundary statistics from B's episodes too (default: A's episodes only).
    boundary_from_explorer: Bool = False
    # Measure KL(A || B) (metric rspo/kl_policy_explorer: one more forward pass of B over the
    # batch, ~1/4 of a derivation's time) on every this many derivations, from the first; the
    # other steps report no KL. A metric only: B and A's updates are the same for any value.
    kl_every: PosInt = 1
    # Gradient-norm clip of the derivation steps.
    grad_clip: NonNegFloat = 1.0
