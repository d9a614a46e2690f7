"""``LearnerPart``: a model a method keeps beside the policy in the learner (an exploration policy).

``Method.learner_part`` (``agentrl/methods/base.py``) builds one at the end of
``DeepSpeedLearner.__init__``; the learner holds it in ``learner.parts`` under the method's name.
The generic code reads only what this protocol names: the checkpoint code its state
(``learner_state.py``, under ``state_key``), the learner's loss the IS cap of the rows its
role's engines sampled, and the learner actor its weights for those engines. ``engines`` sits
below ``methods``, so the learner takes parts duck-typed against this protocol.
"""

from __future__ import annotations

from typing import Any, Protocol


class LearnerPart(Protocol):
    # its entry in a checkpoint's extra.pt and in the state digest; not one of the learner's own
    # (version, world_size, rng, ...): kept across releases, or old checkpoints lose it
    state_key: str
    # the rollout role (``RolloutRole.name``) whose engines load its weights
    role: str
    # IS cap of the rows that role sampled in the policy's loss (None: the policy's tis_cap)
    foreign_is_cap: float | None

    def weights_version(self) -> int:
        """Changes whenever its weights change; 0 while the engines hold their initial weights."""

    def weights_blob(self) -> bytes:
        """Its weights as the object-store sync's safetensors blob, in its engines' dtype."""

    def logprobs(self, input_ids: list[list[int]]) -> list[list[float]]:
        """Token log-probs under it (the agreement check of its engines)."""

    def state_dict(self) -> Any:
        """Everything a restore needs, as torch-saveable objects."""

    def load_state_dict(self, state: Any) -> None:
        """Restore ``state_dict``."""


__all__ = ["LearnerPart"]
