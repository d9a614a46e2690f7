"""The config of a resumed run (``agentrl train --resume RUN [KEY=VALUE ...]``, docs/operating.md).

A resumed run is the run of ``RUN/config.yaml``, the resolved config the run saved when it
started: its ``model.path`` stays the KL reference and the initial weights every actor is built
from, whatever the checkpoint holds. Overrides may change only what leaves the run's math alone
(``RESUMABLE``): how long it runs, how often it evaluates and checkpoints, telemetry, and where
and how big its actors are. Anything else would make the continuation a different run than the
one the checkpoint belongs to, so it is refused with the key and the override that set it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.config.loader import ConfigError, load_config
from agentrl.config.schema import Config

CONFIG_FILE = "config.yaml"

# Keys (or whole sections) a resumed run may change: none of them changes what is trained on,
# how it is scored or how the policy is updated.
RESUMABLE = (
    "train.steps", "train.eval_every", "train.eval_at_end", "train.checkpoint_every", "train.keep_checkpoints",
    "train.max_minutes", "telemetry", "tasks.heldout_size",
    "runtime.ray_address", "runtime.num_cpus", "runtime.rollout_worker_cpus", "runtime.learner_cpus",
    "runtime.tool_actor_cpus", "runtime.rollout_worker_resources", "runtime.rollout_worker_gpus",
    "runtime.learner_gpus", "runtime.max_actor_restarts", "runtime.rollout_timeout_s", "runtime.learner_timeout_s",
    "runtime.tool_call_timeout_s",
    # the engines' size, layout and number: the same sampling distribution on other devices, or
    # spread over fewer or more engines (a run that lost a node goes on with what is left); the
    # tasks of a step and the in-flight rollouts a checkpoint keeps do not depend on how many there are
    "rollout.engine.kv_cache_gib", "rollout.engine.gpu_memory_utilization", "rollout.engine.cpu_threads_bind",
    "rollout.engine.tensor_parallel_size", "rollout.num_workers",
    # the learner's memory levers: the loss is normalized over the whole mini-batch, so splitting
    # it into other micro-batches gives the same update up to rounding (a run near its memory
    # limit resumes with smaller ones)
    "learner.micro_batch_size", "learner.max_tokens_per_micro_batch",
    # where the compute threads run: the same math, other cores (a run moved to other hardware
    # rebalances the engine's and the learner's cores)
    "learner.threads", "rspo.explorer_cpu_threads_bind",
)


def load_resume_config(run_dir: str | Path, overrides: Sequence[str] = ()) -> Config:
    """``run_dir/config.yaml`` with ``overrides`` applied; a ``ConfigError`` naming the key and the
    override when one changes anything outside ``RESUMABLE``."""
    file = Path(run_dir) / CONFIG_FILE
    if not Path(run_dir).is_dir():
        raise ConfigError(f"--resume {run_dir}: no such run folder", file=str(file))
    if not file.exists():
        raise ConfigError(f"--resume {run_dir}: {CONFIG_FILE} is missing (not a run folder of agentrl train)",
                          file=str(file))
    saved = load_config(file)
    resumed = load_config(file, overrides)
    for key in changed_keys(saved, resumed):
        if key == "learner.num_ranks":
            raise ConfigError(_num_ranks_message(file, saved, resumed, overrides), key=key, file=str(file))
        if not resumable(key):
            text = next((o for o in overrides if _related(o.partition("=")[0].strip(), key)), None)
            tail = f"; set by override '{text}'" if text is not None else ""
            raise ConfigError(f"{file}: {key}: cannot change on --resume: it would change the run's math "
                              f"(the checkpoint belongs to the run as configured){tail}. --resume accepts "
                              f"overrides of: {', '.join(RESUMABLE)}", key=key, file=str(file))
    return resumed


def _num_ranks_message(file: Path, saved: Config, resumed: Config, overrides: Sequence[str]) -> str:
    """Why ``learner.num_ranks`` cannot change on a resume, and what to do instead."""
    old, new = saved.learner.num_ranks, resumed.learner.num_ranks
    text = next((o for o in overrides if _related(o.partition("=")[0].strip(), "learner.num_ranks")), None)
    tail = f" (set by override '{text}')" if text is not None else ""
    return (f"{file}: learner.num_ranks: cannot change on --resume from {old} to {new}{tail}: the checkpoint's "
            f"learner state is DeepSpeed's checkpoint of {old} rank(s), the optimizer state partitioned one part per rank, "
            "and agentrl loads it on as many ranks only (DeepSpeed's universal checkpoints, which re-partition a ZeRO "
            f"checkpoint for another number of ranks, are not used). To continue on {new} rank(s), start a new run from "
            f"the checkpoint's policy: agentrl train CONFIG model.path=RUN/checkpoint-K learner.num_ranks={new} (AdamW's "
            "state and the LR schedule start again; docs/operating.md, \"Resuming on different capacity\"). Other "
            "capacity changes a resume accepts: rollout.num_workers, runtime.*_cpus, runtime.*_gpus, "
            "rollout.engine.tensor_parallel_size")


def resumable(key: str) -> bool:
    """``key`` is in ``RESUMABLE`` or inside a section listed there."""
    return any(key == allowed or key.startswith(allowed + ".") for allowed in RESUMABLE)


def changed_keys(a: Config, b: Config) -> list[str]:
    """Dotted keys whose value differs between ``a`` and ``b`` (leaves; a section set on one side
    and null on the other counts as its own key)."""
    flat_a, flat_b = _flatten(a.model_dump(mode="json")), _flatten(b.model_dump(mode="json"))
    return sorted(k for k in flat_a.keys() | flat_b.keys() if flat_a.get(k, _MISSING) != flat_b.get(k, _MISSING))


_MISSING = object()


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _related(a: str, b: str) -> bool:
    """One dotted key is the other or a section above it."""
    return a == b or b.startswith(a + ".") or a.startswith(b + ".")
