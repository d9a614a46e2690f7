"""Config sections of the update: ``algo`` (estimator, loss, KL, GiGPO / SLCA / critic settings)
and ``learner`` (optimizer, batching, DeepSpeed). Part of the tree in ``config/schema.py``; field
comments here are the configuration reference too.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, Strict, field_validator, model_validator

from agentrl.algos import registry
from agentrl.common.plugins import config_plugins
from agentrl.config.types import Beta, Bool, NonEmptyStr, NonNegFloat, NonNegInt, OpenUnit, PosFloat, PosInt, Section, Unit


class GiGPOConfig(Section):
    # Weight omega of the step-level advantage: A = A_episode + omega * A_step (GiGPO paper; docs/design.md §4).
    omega: NonNegFloat = 1.0
    # Discount gamma of the step returns inside an episode (GiGPO paper; docs/design.md §4).
    gamma: Unit = 0.95


class SLCAConfig(Section):
    # Weight of the tool-segment advantage, applied after z-scoring R_tool (SLCA-GRPO; docs/design.md §4).
    lam_tool: NonNegFloat = 1.0
    # Weight of the summary-segment advantage, applied after z-scoring R_sum.
    lam_sum: NonNegFloat = 1.0


class CriticConfig(Section):
    # Initial weights of the value model (a causal LM with a scalar head); null = model.path.
    path: NonEmptyStr | None = None
    # AdamW learning rate of the critic (its own DeepSpeed engine in the learner actor).
    lr: NonNegFloat = 1e-5
    # GAE discount over the policy tokens of an episode.
    gamma: Unit = 1.0
    # GAE lambda. 1.0 (verl's default): the critic is only a baseline, A_t = returns - V_t. At 0.95 a
    # token keeps 0.95^k of a reward k policy tokens later, and PPO did not learn on the quickstart
    # in 10 steps (held-out 0.39 +- 0.18 vs 0.63 +- 0.03 at 1.0, 3 seeds; docs/benchmarks.md).
    lam: Unit = 1.0
    # Value clipping range around the old value; null = no clipping.
    value_clip: PosFloat | None = 0.2
    # Normalize advantages over the batch's policy tokens (mean 0, std 1).
    whiten_advantages: Bool = True


class AlgoConfig(Section):
    # Reward the advantages are computed from: "progress" (turns passed / turns, docs/design.md §3; denser,
    # as RODS uses) or "outcome" (1 only when every turn passes). SLCA uses rewards.* instead.
    reward: Literal["progress", "outcome"] = "progress"
    # Estimator and method plugins: Python modules (dotted names) or .py file paths (made absolute)
    # whose @register_estimator classes add advantage estimators (docs/design.md §9) and whose
    # @register_method classes add research methods (agentrl/methods/). Imported when the config is
    # validated and in the learner's process, so they must exist wherever the learner runs.
    plugins: list[NonEmptyStr] = Field(default_factory=list)
    # Advantage estimator, by name: a built-in one (listed below this table, with what each needs)
    # or one registered by algo.plugins.
    advantage: NonEmptyStr = "grpo"
    # Added to the group std before dividing (docs/design.md §4).
    eps: PosFloat = 1e-6
    # PPO ratio clip below 1: ratio >= 1 - clip_low.
    clip_low: OpenUnit = 0.2
    # PPO ratio clip above 1: ratio <= 1 + clip_high (DAPO clip-higher).
    clip_high: OpenUnit = 0.28
    # Dual-clip bound c > 1 for negative advantages (Ye et al. 2020); null = off.
    dual_clip: Annotated[float, Strict(), Field(gt=1, allow_inf_nan=False)] | None = None
    # Weight of the KL-to-reference term; 0 = no KL and no reference model.
    kl_coef: NonNegFloat = 0.001
    # KL estimator: k1 (log-ratio) or k3 (low-variance, always >= 0).
    kl_estimator: Literal["k1", "k3"] = "k3"
    # Where the KL goes: "loss" (a loss term) or "reward" (subtracted from the reward the
    # advantages are computed from; per token for ppo, summed per episode otherwise).
    kl_in: Literal["loss", "reward"] = "loss"
    # Weight of the entropy bonus (loss -= coef * mean token entropy); 0 = off.
    entropy_coef: NonNegFloat = 0.0
    # Cap C of the truncated importance weight min(pi_old / pi_rollout, C).
    tis_cap: PosFloat = 2.0
    # How token losses are averaged (verl's loss_agg_mode): "token_mean" (every policy token of
    # the mini-batch weighs the same; DAPO) or "seq_mean_token_mean" (mean over each episode's
    # tokens, then over episodes; GRPO paper). With token_mean, long episodes weigh more: when
    # failures are the long ones (retry loops), the tokens every episode shares (call syntax) get
    # a net negative push.
    loss_agg: Literal["token_mean", "seq_mean_token_mean"] = "token_mean"
    # Control arm: permute the step's episode rewards across its episodes before any advantage is
    # computed (everything else identical). A run that still "improves" with this on is drift,
    # not learning. Needs an estimator that reads only the reward values (not per-turn verdicts).
    shuffle_rewards: Bool = False
    # GiGPO settings (used when advantage = gigpo).
    gigpo: GiGPOConfig = Field(default_factory=GiGPOConfig)
    # SLCA settings (used when advantage = slca).
    slca: SLCAConfig = Field(default_factory=SLCAConfig)
    # Critic (value model) of an estimator that needs one (advantage = ppo); null = no critic.
    critic: CriticConfig | None = None

    @field_validator("plugins")
    @classmethod
    def _import_plugins(cls, value: list[str]) -> list[str]:
        return config_plugins(value)  # before algo.advantage is checked: fields validate in order

    @field_validator("advantage")
    @classmethod
    def _known_advantage(cls, value: str) -> str:
        if value not in registry.estimator_names():
            raise ValueError(registry.unknown_estimator_message(value))
        return value

    @model_validator(mode="after")
    def _estimator_needs(self) -> "AlgoConfig":
        # what the estimator needs comes from its row in the registry (agentrl/algos/registry.py)
        est, name = registry.get_estimator(self.advantage), self.advantage
        if est.needs_critic and self.critic is None:
            raise ValueError(f"algo.advantage={name} needs a critic: set algo.critic (e.g. algo.critic.lr=1e-5)")
        if not est.allows_kl_in_reward and self.kl_in == "reward":
            where = f"{type(est).__module__}.{type(est).__qualname__}"
            raise ValueError(f"algo.kl_in=reward is not defined for algo.advantage={name} ({where} declares "
                             "allows_kl_in_reward=False: its advantages do not come from one shaped episode reward); "
                             "use kl_in=loss")
        if self.shuffle_rewards and est.reads_turn_verdicts:
            fine = [n for n in registry.estimator_names() if not registry.get_estimator(n).reads_turn_verdicts]
            listed = ", ".join(fine[:-1]) + f" or {fine[-1]}" if len(fine) > 1 else ", ".join(fine)
            raise ValueError(f"algo.shuffle_rewards is not defined for algo.advantage={name}: it also reads the "
                             "per-turn verdicts, which a reward permutation would leave attached; use " + listed)
        return self


class LearnerConfig(Section):
    # DeepSpeed ZeRO stage (0-3).
    zero_stage: Annotated[int, Strict(), Field(ge=0, le=3)] = 1
    # AdamW learning rate.
    lr: NonNegFloat = 1e-5
    # AdamW weight decay.
    weight_decay: NonNegFloat = 0.0
    # AdamW betas (beta1, beta2).
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    # AdamW epsilon. Larger values (RL practice, e.g. 1.5e-4 in Rainbow DQN) damp the update of
    # parameters whose gradients are far smaller than eps instead of scaling every one to ~lr.
    adam_eps: PosFloat = 1e-8
    # Gradient-norm clip; 0 disables clipping.
    grad_clip: NonNegFloat = 1.0
    # Episodes per forward/backward pass.
    micro_batch_size: PosInt = 8
    # Passes over each step's batch.
    ppo_epochs: PosInt = 1
    # Optimizer steps per pass: the batch is split into this many random mini-batches (PPO
    # mini-batches, as OpenRLHF/verl's mini-batch size); more updates from the same rollouts.
    mini_batches: PosInt = 1
    # torch threads for the learner's update; null = what Ray gives an actor of runtime.learner_cpus
    # (one thread per CPU). In synchronous mode the rollout engines idle during the update, so on a
    # single machine the learner can use every core (2 threads on 2 cores: ~2x faster updates).
    threads: PosInt | None = None
    # Linear learning-rate warm-up, in optimizer steps.
    warmup_steps: NonNegInt = 0
    # DeepSpeed ranks in the learner group, one Ray actor each (NCCL on GPUs, gloo on CPU). Every
    # rank reads the whole step and trains its share of each mini-batch; the update equals one
    # rank's. ZeRO partitions model states across them (stage 3: parameters too).
    num_ranks: PosInt = 1
    # Recompute the policy's (and critic's) decoder activations in backward instead of keeping
    # them: less activation memory for ~1/3 more compute (HF gradient checkpointing).
    gradient_checkpointing: Bool = False
    # Keep AdamW's state and fp32 master weights in host memory (DeepSpeed ZeRO-Offload; ZeRO 1-3).
    offload_optimizer: Bool = False
    # Keep partitioned parameters in host memory between uses (ZeRO-Infinity; needs zero_stage 3).
    offload_params: Bool = False
    # Pack a micro-batch's episodes end to end in one row (positions and attention restart per
    # episode) instead of padding each to the longest: no compute on padding.
    packing: Bool = False
    # Token budget per micro-batch: episodes are added (length-sorted) until the next would pass
    # it; replaces micro_batch_size as the limit. null = micro_batch_size episodes per micro-batch.
    max_tokens_per_micro_batch: PosInt | None = None
    # Attention kernel of the learner's models (transformers' attn_implementation); null = its
    # default (sdpa). flash_attention_2 (GPU, needs the flash-attn package) keeps no T x T mask,
    # which long packed rows need.
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] | None = None
    # Mixed precision of the learner's forward and backward passes (policy, reference, pi_old):
    # "bfloat16" runs them under torch.autocast (matmuls in bf16, softmax and log-probs in fp32)
    # while the weights, gradients and AdamW state stay in model.dtype (fp32 master weights).
    # Needs bf16 units: a GPU, or a CPU with AMX or AVX512-BF16 (checked where the learner runs).
    # null = compute in model.dtype.
    autocast: Literal["bfloat16"] | None = None
    # Where PPO's pi_old log-probs come from when an update needs them apart from its own forward
    # (learner.mini_batches > 1 or ppo_epochs > 1): "recompute" = a separate forward of the learner
    # before the first optimizer step; "rollout" = the sampler's log-probs (no extra pass; the IS
    # correction between sampler and learner is then 1); "auto" = "rollout" when every episode was
    # sampled by the learner's current weights at the learner's compute dtype and no episode comes
    # from RSPO's explorer (synchronous runs), else "recompute". The step's metric
    # learner/old_from_rollout says which was used.
    old_logprobs: Literal["recompute", "rollout", "auto"] = "auto"

    @model_validator(mode="after")
    def _offload_needs_zero(self) -> "LearnerConfig":
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("learner.offload_optimizer=true needs learner.zero_stage 1-3 (ZeRO-Offload moves the "
                             "partitioned optimizer state)")
        if self.offload_params and self.zero_stage != 3:
            raise ValueError(f"learner.offload_params=true needs learner.zero_stage=3 (got {self.zero_stage}): only "
                             "ZeRO-3 partitions the parameters it would offload")
        return self
