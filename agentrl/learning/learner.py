"""LearnerActor: a thin Ray shell around one rank of the DeepSpeed learner.

It resolves the ``GroupRef``s handed over by the driver (payloads come straight from the object
store), turns them into the policy's batch through the run's methods and the configured estimator
(``learning/step.py``), runs one update, lets the methods act on it (``Method.after_update``),
and publishes weights as an object ref. In a learner group (``learning/learner_group.py``) every rank
runs the same calls on the same groups: what they compute from them is deterministic, so each
rank builds the same batch and trains its share of it; rank 0 answers for the group.
"""

from __future__ import annotations

import time

import ray

from agentrl.api import EpisodeGroup, GroupRef
from agentrl.common.plugins import load_plugins
from agentrl.common.process_memory import return_freed_memory
from agentrl.config import Config
from agentrl.config.process_env import set_default_env
from agentrl.learning.step import prepare_step
from agentrl.methods.registry import active_methods

# How a learner group (learning/learner_group.py) routes each call, declared once, on the method:
# ALL_RANKS: every rank runs it, in the same order on each (state changes and collectives: ZeRO-3
# gathers, gradient reductions; get_version too: the first one reports a rank whose start
# failed); the answer is rank 0's ("rank0") or every rank's merged ("digests", "parts").
# RANK0: answered by rank 0's copies alone. RANK0_WITH_GATHERS: rank 0 sends weights to the
# engines (NCCL) while the other ranks walk them with it (``gather_weights``: ZeRO-3 gathers).
ALL_RANKS, RANK0, RANK0_WITH_GATHERS = "all ranks", "rank 0", "rank 0 with gathers"
GROUP_CALLS: dict[str, tuple[str, str]] = {}  # method name -> (route, how answers combine)


def group_call(route: str, combine: str = "rank0"):
    """Method decorator: declare how a learner group routes this call (see above). A call no
    method declares does not exist on the group (AttributeError), rather than going to one rank."""
    if route not in (ALL_RANKS, RANK0, RANK0_WITH_GATHERS) or combine not in ("rank0", "digests", "parts"):
        raise ValueError(f"group_call: unknown route {route!r} or combine {combine!r}")

    def mark(fn):
        GROUP_CALLS[fn.__name__] = (route, combine)
        return fn
    return mark


@ray.remote
class LearnerActor:
    def __init__(self, cfg: Config, model_path: str, rank: int = 0, world_size: int = 1):
        """Rank ``rank`` of a ``world_size``-rank learner for a run with ``cfg``, training the model
        at ``model_path``. The run's plugins are loaded first (estimators and methods a plugin
        registers), then its active methods built here from the config. A 1-rank learner is
        built at once; a rank of a larger group by ``join``, once rank 0 has published its
        rendezvous address (``rendezvous``)."""
        set_default_env()
        load_plugins(cfg.plugins)
        if cfg.learner.threads:  # Ray set OMP_NUM_THREADS from num_cpus; this overrides it
            import torch

            torch.set_num_threads(cfg.learner.threads)

        self.cfg = cfg
        self.algo_cfg = cfg.algo
        self.seed = cfg.run.seed
        self.methods = active_methods(cfg)
        self._published: dict[str, int] = {}  # role -> its part's weights version last handed out
        self.model_path = model_path
        self.rank, self.world_size = rank, world_size
        self._store = None
        self.learner = None
        if world_size == 1:
            self.join(None)

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0 of a group: host the group's rendezvous store; returns its (IP, port)."""
        from agentrl.engines.deepspeed_setup import host_rendezvous_store

        self._store, address = host_rendezvous_store(self.world_size)
        return address

    def join(self, address: tuple[str, int] | None) -> int:
        """Join the group's process group (rank 0 through its own store) and build this rank's
        learner; returns the policy version. Blocks until every rank has joined."""
        from agentrl.engines.deepspeed_learner import DeepSpeedLearner
        from agentrl.engines.deepspeed_setup import init_process_group

        try:
            if self.world_size > 1:
                init_process_group(self.rank, self.world_size, store=self._store, address=tuple(address))
            cfg = self.cfg
            # the learner scores tokens under the tempered distribution the rollouts sampled from
            self.learner = DeepSpeedLearner(self.model_path, cfg.learner, cfg.algo, dtype=cfg.model.dtype,
                                            seed=cfg.run.seed, temperature=cfg.rollout.temperature,
                                            methods=self.methods, lora_cfg=cfg.model.lora,
                                            sampler_dtype=cfg.rollout.engine.dtype or cfg.model.dtype)
        except Exception as err:  # kept for get_version: a group does not wait on its ranks' joins
            self._join_error = f"{type(err).__name__}: {err}"
            raise
        return self.learner.version

    @group_call(ALL_RANKS)
    def get_version(self) -> int:
        if self.learner is None:
            raise RuntimeError(f"learner rank {self.rank} of {self.world_size} was not built: "
                               f"{getattr(self, '_join_error', 'its join has not run')}")
        return self.learner.version

    @group_call(ALL_RANKS)
    def train(self, group_refs: list[GroupRef]) -> dict[str, float]:
        """One update on the groups behind ``group_refs`` (fetched here, from the object store)."""
        t0 = time.perf_counter()
        groups: list[EpisodeGroup] = ray.get([g.ref for g in group_refs])
        step = prepare_step(groups, self.methods, self.algo_cfg, seed=self.seed, version=self.learner.version,
                            rollout_kl=self._rollout_kl)
        metrics = self.learner.train_step(step.batch)
        metrics.update(step.metrics)
        for m in self.methods:
            m.after_update(self.learner, step.groups, metrics)
        metrics["staleness"] = float(sum(self.learner.version - 1 - g.version for g in step.groups) / max(1, len(step.groups)))
        metrics["learn_seconds"] = time.perf_counter() - t0
        return metrics

    @group_call(RANK0)
    def publish_role_weights(self, role: str, again: bool = False) -> list | None:
        """The weights of the learner part whose engines are ``role``'s (wrapped ref) when they changed
        since the last call (or, with ``again``, for a restarted worker of that role: whenever they
        differ from the initial ones at all), else None. Until the part first changes, its engines
        hold the initial policy they loaded at start."""
        part = self._part(role)
        done = part.weights_version()
        if done == 0 or (done == self._published.get(role) and not again):
            return None
        self._published[role] = done
        ref = ray.put(part.weights_blob())
        return_freed_memory()  # the state dict and blob just built: the object store holds the copy now
        return [ref]

    @group_call(RANK0)
    def role_logprobs(self, role: str, input_ids: list[list[int]]) -> list[list[float]]:
        """Token logprobs under ``role``'s learner part (the weight-sync agreement check of its engines)."""
        return self._part(role).logprobs(input_ids)

    def _part(self, role: str):
        for part in self.learner.parts.values():
            if part.role == role:
                return part
        raise ValueError(f"no learner part serves the rollout role {role!r} (parts: {sorted(self.learner.parts)})")

    def _rollout_kl(self, groups: list[EpisodeGroup]) -> list[list[float]]:
        """Per-token KL estimate of the behaviour policy against the reference, for KL in the
        reward: the rollout logprobs are the samples' own (what the reward should charge for)."""
        import torch

        from agentrl.algos.losses import kl_penalty

        episodes = [e for g in groups for e in g.episodes]
        refs = self.learner.reference_logprobs([e.token_ids for e in episodes])
        return [kl_penalty(torch.tensor(e.logprobs), torch.tensor(r), self.algo_cfg.kl_estimator).tolist()
                for e, r in zip(episodes, refs)]

    @group_call(ALL_RANKS)
    def publish_weights(self) -> list | None:
        """The current weights as a safetensors blob in the object store (wrapped ref); ranks > 0
        take part in the ZeRO-3 gathers and return None."""
        if self.rank != 0:
            self.gather_weights()
            return None
        ref = ray.put(self.learner.weights_blob())
        return_freed_memory()
        return [ref]

    def gather_weights(self) -> None:
        """Ranks > 0: walk the weights in step with rank 0's gathers (ZeRO-3; else nothing to do)."""
        if self.learner.learner_cfg.zero_stage == 3:
            for _ in self.learner.inference_weights():
                pass

    # ---- runtime.weight_sync=nccl (see agentrl.weight_sync.nccl; GPU only)
    @group_call(RANK0)
    def nccl_endpoint(self) -> tuple[str, int]:
        """(node IP, free port) for the rendezvous this actor hosts as NCCL rank 0."""
        from agentrl.weight_sync.nccl import NcclSender

        return NcclSender.endpoint()

    @group_call(RANK0_WITH_GATHERS)
    def nccl_init(self, master_address: str, master_port: int, world_size: int, packed: bool = True,
                  buffer_bytes: int | None = None, num_buffers: int | None = None) -> dict:
        """Join the weight-transfer group as rank 0; returns the weight metadata (names, dtypes, shapes)."""
        from agentrl.weight_sync.nccl import NcclSender

        self._nccl = NcclSender(self.learner)
        return self._nccl.init(master_address, master_port, world_size, packed, buffer_bytes, num_buffers)

    @group_call(RANK0_WITH_GATHERS)
    def nccl_broadcast(self) -> float:
        """Broadcast the current weights to every engine worker (which must be receiving)."""
        if getattr(self, "_nccl", None) is None:
            raise RuntimeError("weight sync: nccl_init must run before nccl_broadcast")
        return self._nccl.broadcast()

    @group_call(ALL_RANKS)
    def compute_logprobs(self, input_ids: list[list[int]]) -> list[list[float]]:
        return self.learner.compute_logprobs(input_ids)

    # ---- exact resume (engines/learner_state.py)
    @group_call(ALL_RANKS, combine="digests")
    def save_state(self, out_dir: str) -> dict[str, str]:
        """The whole training state into ``out_dir``; returns its digest."""
        from agentrl.engines.learner_state import save_learner_state

        return save_learner_state(self.learner, out_dir)

    @group_call(ALL_RANKS, combine="digests")
    def load_state(self, in_dir: str) -> dict[str, str]:
        """Restore ``save_state``'s folder; returns the digest of the state now held. The engines of
        the methods' roles get their parts' weights at the next weight sync."""
        from agentrl.engines.learner_state import load_learner_state

        self._published.clear()
        return load_learner_state(self.learner, in_dir)

    @group_call(ALL_RANKS, combine="parts")
    def save_parts(self, stage: str, dest, state: bool = True, keep: str | None = None) -> dict:
        """Write this rank's parts of a checkpoint (``state``) or of ``final/`` into a folder of its
        own on this node, ``<stage>/.rank<r>``: the HF folder (rank 0 writes it; the others join its
        gathers) and, with ``state``, the learner state under ``learner/``. Then put them into
        ``dest`` (a ``runtime.storage.Storage``: moved within a local filesystem, else uploaded)
        and remove the folder, or (rank 0) rename it to ``keep``. Returns ``{"digest", "parts"}``: the
        state digest (None without ``state``) and each part's path, size and sha256, computed
        here, for the manifest the driver writes last."""
        import os
        import shutil
        from pathlib import Path

        own = Path(stage) / f".rank{self.rank}"
        shutil.rmtree(own, ignore_errors=True)
        self.save(str(own))
        digest = self.save_state(str(own / "learner")) if state else None
        keep = keep if self.rank == 0 else None  # final/: rank 0's HF folder (the others write nothing)
        parts = dest.upload(own, move=keep is None)
        if keep is not None:
            shutil.rmtree(keep, ignore_errors=True)
            os.replace(own, keep)
        shutil.rmtree(own, ignore_errors=True)
        try:
            os.rmdir(stage)  # empty once every rank on this node is done (the driver removes its own)
        except OSError:
            pass
        return {"digest": digest, "parts": parts}

    @group_call(ALL_RANKS, combine="digests")
    def load_parts(self, stage: str, src, parts: list[dict]) -> dict[str, str]:
        """``load_state`` from a checkpoint's ``learner/`` parts in ``src`` (a ``Storage``):
        checked (size, sha256) in place when ``src`` is on this node's filesystem, else downloaded
        into ``<stage>/.rank<r>`` and checked first. A corrupt part raises ``ChecksumError``."""
        import shutil
        from pathlib import Path

        if src.local:
            src.verify(parts)
            return self.load_state(src.path("learner"))
        own = Path(stage) / f".rank{self.rank}"
        shutil.rmtree(own, ignore_errors=True)
        try:
            src.download(parts, own)
            return self.load_state(str(own / "learner"))
        finally:
            shutil.rmtree(own, ignore_errors=True)

    @group_call(ALL_RANKS)
    def save(self, out_dir: str) -> str:
        import shutil
        from pathlib import Path

        self.learner.save_pretrained(out_dir)  # every rank gathers; rank 0 writes
        if self.rank != 0:
            return out_dir
        for f in Path(self.model_path).glob("*token*"):
            shutil.copy(f, Path(out_dir) / f.name)
        for f in Path(self.model_path).glob("chat_template*"):
            shutil.copy(f, Path(out_dir) / f.name)
        return out_dir
