"""A learner step's metrics, summed over its micro-batches (and over the ranks of a learner group).

Every term is a sum of per-micro-batch contributions already normalized by whole-step counts, so
the ranks' partial sums add up to the one-rank value: ``all_reduce`` is a plain SUM.
"""

from __future__ import annotations

import torch
from torch import Tensor


def peak_memory_mib() -> dict[str, float]:
    """The largest peak memory of any rank so far, in MiB: the process's resident high-water mark
    (what a CPU learner holds) and, on CUDA, the device's peak allocation."""
    import resource

    peaks = {"memory/peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}  # Linux: KiB
    if torch.cuda.is_available():
        peaks["memory/peak_device_mib"] = torch.cuda.max_memory_allocated() / 2**20
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        keys = sorted(peaks)
        t = torch.tensor([peaks[k] for k in keys], dtype=torch.float64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        peaks = dict(zip(keys, t.tolist()))
    return peaks


def all_reduce_sums(values: dict[str, float]) -> dict[str, float]:
    """SUM of ``values`` over the ranks of the default process group (as is with one rank)."""
    if not values or not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return dict(zip(keys, t.tolist()))


class StepMetrics:
    """A step's metrics, as token-weighted means over its whole batch.

    Loss terms (``loss``, ``pg_loss``, ``kl``, ``entropy_bonus``) are weighted by each
    mini-batch's share of what the loss averages over (tokens, or sequences under
    ``seq_mean_token_mean``), ``clip_frac`` and ``approx_kl`` by tokens; both are averaged over the
    epochs. pi_old diagnostics (``entropy``, ``is_weight_mean``, ``logprob_mismatch``) come from the
    first epoch."""

    _LOSS_TERMS = ("loss", "pg_loss", "kl", "clip_frac", "approx_kl", "entropy_bonus")
    _PI_OLD = ("is_weight_mean", "logprob_mismatch", "entropy")

    def __init__(self, n_tokens: int, n_sequences: int, loss_agg: str):
        self.n_tokens, self.n_sequences, self.loss_agg = n_tokens, n_sequences, loss_agg
        self.sums = dict.fromkeys(self._LOSS_TERMS, 0.0)
        self.pi_old = dict.fromkeys(self._PI_OLD, 0.0)
        self.foreign = {"weight_sum": 0.0, "clipped": 0.0, "tokens": 0.0}  # IS weights on other policies' tokens
        self.grad_norms: list[float] = []

    def add_loss(self, loss: Tensor, stats: dict[str, Tensor], n_micro: int, n_mini: int, seqs_mini: int) -> None:
        """One micro-batch's ``policy_loss`` (of a mini-batch with n_mini tokens, seqs_mini sequences)."""
        share = n_mini / self.n_tokens if self.loss_agg == "token_mean" else seqs_mini / self.n_sequences
        for key in ("entropy_bonus", "kl"):
            if key in stats:
                self.sums[key] += float(stats[key]) * share
        self.sums["loss"] += float(loss.detach()) * share
        self.sums["pg_loss"] += float(stats["pg_loss"]) * share
        for key in ("clip_frac", "approx_kl"):
            self.sums[key] += float(stats[key]) * float(n_micro) / self.n_tokens

    def add_pi_old(self, stats: dict[str, Tensor]) -> None:
        """One micro-batch's ``rollout_stats``, already normalized by the batch's token count."""
        for key, value in stats.items():
            self.pi_old[key] += float(value)

    def add_foreign(self, sums: dict[str, float]) -> None:
        """One micro-batch's ``is_weight_sums`` over the tokens another policy sampled."""
        for key, value in sums.items():
            self.foreign[key] += value

    def all_reduce(self) -> None:
        """Add up the ranks' partial sums (a learner group; nothing to do with one rank)."""
        for part in (self.sums, self.pi_old, self.foreign):
            part.update(all_reduce_sums(part))

    def result(self, epochs: int, with_rollout: bool, extra: dict[str, float], **fields: float) -> dict[str, float]:
        out = {k: v / float(epochs) for k, v in self.sums.items()}
        if self.foreign["tokens"]:
            n = self.foreign["tokens"]
            out.update({"foreign_is_weight_mean": self.foreign["weight_sum"] / n,
                        "foreign_is_clip_frac": self.foreign["clipped"] / n, "foreign_tokens_trained": n})
        out.update(self.pi_old)
        out.update(extra)
        if not with_rollout:
            out.pop("is_weight_mean"), out.pop("logprob_mismatch")
        out.update(grad_norm=sum(self.grad_norms) / len(self.grad_norms), optimizer_steps=float(len(self.grad_norms)), **fields)
        return out


__all__ = ["StepMetrics", "all_reduce_sums", "peak_memory_mib"]
