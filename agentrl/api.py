"""What crosses a stage boundary, as typed records: one module every layer may import.

    rollout worker --EpisodeGroup (return object)--> replay buffer (GroupRef) --> learner
          |                                                                      |
          +--GroupSummary--> driver (metrics, RODS)          TrainBatch --> MicroBatch

* ``Generation``: one sampled continuation from an engine (tokens, their logprobs).
* ``Episode``: one rollout of one task: the token stream with its masks and segments, per-step
  spans and environment states, per-turn verdicts, rewards, and who produced it.
* ``EpisodeGroup``: the G episodes of one task sampled together, with the behaviour-policy version
  that produced them; group-relative estimators need the whole group. Each is a return object of
  its worker's ``rollout`` call, so the driver owns it (it outlives the worker).
* ``GroupSummary``: the few numbers of a group the driver needs (metrics, RODS statistics) without
  fetching its payload.
* ``GroupRef``: the object ref of an ``EpisodeGroup`` plus its version. Ray resolves an ObjectRef
  passed as a top-level argument but passes one nested inside another object as is, so a list of
  ``GroupRef`` travels driver -> buffer -> learner without the payloads touching the driver.
* ``TrainBatch``: flat per-sequence lists the learner trains on (``runtime.batching.build_batch``).
* ``MicroBatch``: one padded [B, T] micro-batch of a learner step (``engines.micro_batch``).
* ``EnvError``: an episode's environment could not answer (its tool-pool actor or the SGLS
  server died); the episode ends with termination ``ENV_ERROR`` and is never trained on.

Only the standard library is imported here (``MicroBatch`` names torch tensors in annotations
only), so every package, the config included, can use these types.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

# Episode.policy of the policy being trained; a method's rollout role names its own
# (agentrl/methods/base.py: RolloutRole)
POLICY = "policy"
# Episode.termination of an episode whose environment failed: dropped from its group, counted
ENV_ERROR = "env_error"


class EnvError(RuntimeError):
    """The environment failed, not the model: a tool-pool actor or the SGLS server died or did
    not answer. Raised by the session; the episode loop ends the episode with ``ENV_ERROR``."""


class EngineNotStarted(RuntimeError):
    """A rollout worker asked to load weights has no engine: Ray restarted the actor since its
    ``start`` (the scheduler revives it and loads again)."""


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (ended with an end-of-message token) or "length"
    cached_tokens: int = 0  # prompt tokens the engine's prefix cache served (not prefilled again)


@dataclass
class Episode:
    task_id: str
    token_ids: list[int]
    response_mask: list[int]
    logprobs: list[float]  # engine logprob for policy tokens, 0.0 elsewhere
    segments: list[int]
    prompt_len: int
    turn_passed: list[bool]
    n_turns: int
    calls: list[list[dict]] = field(default_factory=list)  # per turn: [{name, arguments, observation}]
    n_call_blocks: int = 0
    n_valid_calls: int = 0
    termination: str = "done"  # done | length | max_messages | max_tokens | env_error (ENV_ERROR)
    rewards: dict[str, float] = field(default_factory=dict)
    policy_version: int = 0
    group_id: str = ""
    policy: str = POLICY  # which policy sampled it: POLICY (the one trained) or a method's rollout role
    gen_seconds: float = 0.0
    env_seconds: float = 0.0
    # One entry per assistant message ("step"): its policy-token range [start, end), the user turn
    # it belongs to, and the environment state it started from (a hash of every token the
    # environment injected so far: prompt, observations, user turns). GiGPO groups steps by it.
    step_spans: list[list[int]] = field(default_factory=list)
    step_turns: list[int] = field(default_factory=list)
    step_states: list[str] = field(default_factory=list)
    # Per turn reached: the text of the message that closed it without a call (None if it never
    # closed). The summary reward scores these.
    answers: list[str | None] = field(default_factory=list)
    # Exceptions a plugin tool raised (other than the ValueError/LookupError the model is meant to
    # read), as data: {tool, arguments, type, message, where (file:line), turn}. The model read
    # each as an {"error": ...} observation; these are for the developer (docs/own_tools.md).
    tool_errors: list[dict] = field(default_factory=list)

    @property
    def n_policy_tokens(self) -> int:
        return sum(self.response_mask)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Episode":
        return cls(**d)


@dataclass
class EpisodeGroup:
    """The episodes of one task sampled together by one policy version (``version``)."""

    task_id: str
    group_id: str
    version: int  # policy version of the weights that sampled every episode of the group
    episodes: list[Episode]
    wall_seconds: float = 0.0  # from the rollout call's start to this group's end
    policy: str = POLICY  # the policy that sampled every episode of the group
    # Groups with the same mix_key were rolled out on the same task in the same step (the policy's
    # part and the parts of the methods' rollout roles); a method's regroup may merge them.
    mix_key: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "EpisodeGroup":
        return cls(**{**d, "episodes": [Episode.from_dict(e) for e in d["episodes"]]})


@dataclass
class GroupSummary:
    """A group's numbers for the driver: per-episode outcome and progress, mean other rewards,
    token and call counts, and where its time went."""

    task_id: str
    version: int
    outcome: list[float]
    progress: list[float]
    rewards: dict[str, float]  # every other reward (HierR components, summary, ...), group mean
    policy_tokens: int
    calls: int
    valid_calls: int
    redundant_calls: int
    gen_seconds: float
    env_seconds: float
    wall_seconds: float
    policy: str = POLICY
    env_failures: int = 0  # episodes dropped because their environment failed (ENV_ERROR)
    env_reruns: int = 0  # times the group was rolled out again because an episode's environment failed
    tool_errors: int = 0  # tool exceptions in the group's episodes (Episode.tool_errors)


@dataclass(frozen=True)
class GroupRef:
    """An ``EpisodeGroup`` in the object store, with the version that produced it (the replay
    buffer's staleness bound reads it without fetching the group)."""

    ref: Any  # ray.ObjectRef of an EpisodeGroup
    version: int
    task_id: str = ""


@dataclass
class TrainBatch:
    """One learner step's sequences, flattened from groups (one entry per episode).

    Exactly one of ``advantages`` (per-token, 0 off the policy tokens) and ``token_rewards`` (for
    an estimator with a critic: the learner's GAE makes the advantages) is set."""

    input_ids: list[list[int]]
    response_mask: list[list[int]]  # 1 on policy tokens
    advantages: list[list[float]] | None = None
    token_rewards: list[list[float]] | None = None
    rollout_logprobs: list[list[float]] | None = None  # the sampler's logprobs, 0 off the policy tokens
    # per sequence: sampled by another policy than the one trained (a method's rollout role, e.g.
    # an exploration policy): never pi_old, and its own IS cap applies (PolicyLossConfig.foreign_is_cap)
    foreign: list[bool] | None = None
    versions: list[int] | None = None  # per sequence: the policy version whose weights sampled it

    def __post_init__(self) -> None:
        if (self.advantages is None) == (self.token_rewards is None):
            raise ValueError("TrainBatch needs exactly one of advantages and token_rewards")
        n = len(self.input_ids)
        per_token = self.advantages if self.advantages is not None else self.token_rewards
        rollout = self.rollout_logprobs if self.rollout_logprobs is not None else per_token
        if not len(self.response_mask) == len(rollout) == len(per_token) == n:
            raise ValueError("TrainBatch fields must have one entry per sequence")

    @property
    def per_token(self) -> list[list[float]]:
        """``advantages``, or ``token_rewards`` for a critic estimator."""
        return self.advantages if self.advantages is not None else self.token_rewards

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class MicroBatch:
    """[B, T] tensors of one micro-batch, token-aligned like ``hf_policy.token_logprobs``."""

    input_ids: Tensor  # long, right-padded with the learner's pad id
    attention_mask: Tensor  # long, 1 on real tokens
    response_mask: Tensor  # bool, the policy tokens: batch response_mask > 0 on real tokens
    # float32 per-token advantages; for PPO the token rewards, until the critic phase replaces them
    # with (whitened) GAE advantages
    advantages: Tensor
    rollout_logprobs: Tensor | None = None  # the sampler's logprobs, when the batch has them
    foreign_rows: Tensor | None = None  # bool [B]: rows another policy sampled (TrainBatch.foreign), when any
    # filled in by the learner's phases
    ref_logprobs: Tensor | None = None  # frozen reference (KL in the loss)
    old_logprobs: Tensor | None = None  # pi_old
    old_entropy: Tensor | None = None  # entropy of pi_old
    old_values: Tensor | None = None  # critic values before its update (PPO)
    returns: Tensor | None = None  # GAE returns, the critic's targets (PPO)
    # Packed layout (``learner.packing``, ``engines.micro_batch.pack_micro_batch``): the model runs
    # on the rows end to end in one row; its output is unpacked back to [B, T].
    packed_ids: Tensor | None = None  # long [1, N], N = the micro-batch's real tokens
    packed_positions: Tensor | None = None  # long [1, N], restarting at 0 at each row's first token
    unpack_index: Tensor | None = None  # long [B, T]: where token t of row b sits in the packed row, -1 on padding
    n_tokens: int = field(init=False)  # policy tokens
    n_sequences: int = field(init=False)  # rows with at least one policy token

    def __post_init__(self) -> None:
        self.n_tokens = int(self.response_mask.sum())
        self.n_sequences = int((self.response_mask.sum(dim=1) > 0).sum())

    @property
    def packed(self) -> bool:
        return self.packed_ids is not None

    def forward_args(self) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
        """(input_ids, attention_mask, position_ids, unpack_index) of the model forward: the padded
        batch with None, None, or the packed row with no mask (transformers derives the per-row
        mask from the position ids) and the index that unpacks its output. Positional, for
        ``engine(*m.forward_args())``; ``hf_policy.micro_batch_logprobs`` / ``micro_batch_values``
        take them and answer in the padded [B, T] layout either way."""
        if self.packed_ids is None:
            return self.input_ids, self.attention_mask, None, None
        return self.packed_ids, None, self.packed_positions, self.unpack_index

    def score_mask(self) -> Tensor:
        """The policy tokens in the layout the model runs on (``forward_args``): the positions
        whose log-prob the loss reads, where the learner's log-prob head runs."""
        if self.packed_ids is None:
            return self.response_mask
        flat = self.packed_ids.new_zeros(self.packed_ids.numel()).bool()
        flat[self.unpack_index[self.response_mask]] = True
        return flat.view_as(self.packed_ids)
