"""LearnerActor: a thin Ray shell around the DeepSpeed learner.

It resolves the group refs handed over by the driver (payloads come straight from the object
store), turns group rewards into per-token advantages with the configured estimator (pure
functions in ``agentrl.algos``), runs one update, and publishes weights as an object ref.
"""

from __future__ import annotations

import time

import ray
import torch

from agentrl.algos.advantages import get_advantage


def build_batch(groups: list[dict], advantage: str, reward_key: str, eps: float) -> tuple[dict, dict]:
    """Flatten groups into the learner's batch; the advantage is broadcast to policy tokens."""
    fn = get_advantage(advantage)
    kwargs = {"eps": eps} if advantage == "grpo" else {}
    batch = {"input_ids": [], "response_mask": [], "rollout_logprobs": [], "advantages": []}
    nonzero = 0
    for g in groups:
        rewards = torch.tensor([e["rewards"][reward_key] for e in g["episodes"]], dtype=torch.float32)
        adv = fn(rewards, **kwargs)
        nonzero += int(bool((rewards != rewards[0]).any()))
        for e, a in zip(g["episodes"], adv.tolist()):
            batch["input_ids"].append(e["token_ids"])
            batch["response_mask"].append(e["response_mask"])
            batch["rollout_logprobs"].append(e["logprobs"])
            batch["advantages"].append([a * m for m in e["response_mask"]])
    return batch, {"groups_with_signal": nonzero / max(1, len(groups))}


@ray.remote
class LearnerActor:
    def __init__(self, model_path: str, learner_cfg, algo_cfg, dtype: str, seed: int):
        from agentrl.runtime.env import set_default_env

        set_default_env()
        from agentrl.engines.deepspeed_learner import DeepSpeedLearner

        self.algo_cfg = algo_cfg
        self.learner = DeepSpeedLearner(model_path, learner_cfg, algo_cfg, dtype=dtype, seed=seed)
        self.model_path = model_path

    def get_version(self) -> int:
        return self.learner.version

    def train(self, group_boxes: list[list]) -> dict[str, float]:
        t0 = time.perf_counter()
        groups = ray.get([box[0] for box in group_boxes])
        batch, extra = build_batch(groups, self.algo_cfg.advantage, self.algo_cfg.reward, self.algo_cfg.eps)
        metrics = self.learner.train_step(batch)
        metrics.update(extra)
        metrics["staleness"] = float(sum(self.learner.version - 1 - g["version"] for g in groups) / max(1, len(groups)))
        metrics["learn_seconds"] = time.perf_counter() - t0
        return metrics

    def publish_weights(self) -> list:
        """The current weights as a safetensors blob in the object store (wrapped ref)."""
        return [ray.put(self.learner.weights_blob())]

    # ---- runtime.weight_sync=nccl (see agentrl.runtime.weight_sync_nccl; GPU only)
    def nccl_endpoint(self) -> tuple[str, int]:
        """(node IP, free port) for the rendezvous this actor hosts as NCCL rank 0."""
        from agentrl.runtime.weight_sync_nccl import NcclSender

        return NcclSender.endpoint()

    def nccl_init(self, master_address: str, master_port: int, world_size: int, packed: bool = True,
                  buffer_bytes: int | None = None, num_buffers: int | None = None) -> dict:
        """Join the weight-transfer group as rank 0; returns the weight metadata (names, dtypes, shapes)."""
        from agentrl.runtime.weight_sync_nccl import NcclSender

        self._nccl = NcclSender(self.learner)
        return self._nccl.init(master_address, master_port, world_size, packed, buffer_bytes, num_buffers)

    def nccl_broadcast(self) -> float:
        """Broadcast the current weights to every engine worker (which must be receiving)."""
        if getattr(self, "_nccl", None) is None:
            raise RuntimeError("weight sync: nccl_init must run before nccl_broadcast")
        return self._nccl.broadcast()

    def compute_logprobs(self, input_ids: list[list[int]]) -> list[list[float]]:
        return self.learner.compute_logprobs(input_ids)

    def save(self, out_dir: str) -> str:
        import shutil
        from pathlib import Path

        self.learner.save_pretrained(out_dir)
        for f in Path(self.model_path).glob("*token*"):
            shutil.copy(f, Path(out_dir) / f.name)
        for f in Path(self.model_path).glob("chat_template*"):
            shutil.copy(f, Path(out_dir) / f.name)
        return out_dir
