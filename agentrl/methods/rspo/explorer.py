"""RSPO's explorer B: a copy of the policy A, moved by a few optimizer steps on the process reward.

Lives in the learner actor next to A's DeepSpeed engine and never touches it: B is a plain torch
module with its own AdamW, created fresh for every derivation, so A's weights, optimizer state
and LR schedule are exactly what they would be without RSPO. Each derivation

    B <- A (weights copied);  then ``steps`` times:  B <- AdamW step on policy_loss(B; A^B)

where A^B are the process-reward advantages of ``groups.explorer_batch`` (A's episodes of
this step), pi_old is B before its first step (= A), and the truncated IS weights use the
episodes' behaviour logprobs, as in A's own update. It reports KL(A || B) on A's tokens after
the steps (k3 estimator), the size of the exploration B adds, on every ``kl_every``-th derivation
(it costs one more forward pass of B).

Plain torch rather than DeepSpeed: one small extra model on the learner's device, and B's update
needs none of ZeRO's partitioning (``rspo`` refuses ``learner.zero_stage=3``). B computes as A
does: its weights fp32, its matmuls in A's compute dtype (``learner.autocast``, else
``model.dtype``), its decoder layers recomputed in backward under
``learner.gradient_checkpointing``. Before, a real model's derivation ran fp32 matmuls with every
activation kept, where A ran bf16 with checkpointing (on SmolLM2 the learner's forward and
backward took 1.8x as long in fp32 as under bf16 autocast, and checkpointing took its peak from
10.1 to 6.7 GiB: docs/benchmarks.md, "A real model's step").
"""

from __future__ import annotations

import time

import torch
from torch import nn

from agentrl.algos.losses import PolicyLossConfig, aggregate_tokens, kl_penalty, policy_loss
from agentrl.api import TrainBatch
from agentrl.engines.deepspeed_setup import enable_layer_checkpointing
from agentrl.engines.hf_policy import pad_batch, token_logprobs
from agentrl.engines.learner_shards import rank_rows
from agentrl.engines.lora import is_peft_model, merged_weights
from agentrl.engines.micro_batch import pad_micro_batch
from agentrl.engines.policy_logprobs import autocast_context
from agentrl.engines.step_metrics import all_reduce_sums


class Explorer:
    """B's model and its derivation from A. ``state_dict_for_inference`` gives B's weights in the
    same form as the learner's (tied ``lm_head`` dropped), for the explorer's rollout engines."""

    def __init__(self, lr: float, steps: int, grad_clip: float, micro_batch_size: int, temperature: float,
                 loss_cfg: PolicyLossConfig, tied_embeddings: bool, kl_every: int = 1, autocast: str | None = None,
                 gradient_checkpointing: bool = False):
        self.lr, self.steps, self.grad_clip, self.kl_every = lr, steps, grad_clip, kl_every
        # the learner's bf16 compute dtype (ExplorerPart) and learner.gradient_checkpointing: B computes as A does
        self.autocast, self.gradient_checkpointing = autocast, gradient_checkpointing
        self.micro_batch_size, self.temperature = micro_batch_size, temperature
        self.loss_cfg, self.tied_embeddings = loss_cfg, tied_embeddings
        self.model: nn.Module | None = None
        self.derivations = 0

    def derive(self, policy: nn.Module, batch: TrainBatch, pad_id: int, device, rank: int = 0,
               world: int = 1) -> dict[str, float]:
        """B := ``policy`` (A) plus ``steps`` AdamW steps on ``batch``; returns ``rspo/*`` metrics.

        In a learner group every rank derives B from the same batch: each computes the gradient
        of its share of the rows (``learner_shards.rank_rows``), normalized by the whole batch's
        token count, and the ranks' gradients are summed before each step, so every rank holds
        the same B that one rank would derive."""
        t0 = time.perf_counter()
        self._copy_from(policy)
        lengths = [len(ids) for ids in batch.input_ids]
        order = rank_rows(range(len(batch)), lengths, rank, world)
        micro = [pad_micro_batch(batch, order[i : i + self.micro_batch_size], pad_id, device)
                 for i in range(0, len(order), self.micro_batch_size)]
        n_tok = sum(1 for mask in batch.response_mask for x in mask if x > 0)
        if n_tok == 0:
            return {"rspo/explorer_tokens": 0.0}
        if self.steps > 1:  # pi_old of the derivation = B before its first step = A, needed up front
            with torch.no_grad():
                for m in micro:
                    m.old_logprobs = self._logprobs(m.input_ids, m.attention_mask, m.response_mask)
        opt = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=0.0)
        losses = []
        for _ in range(self.steps):
            total = 0.0
            for m in micro:
                lp = self._logprobs(m.input_ids, m.attention_mask, m.response_mask)
                if m.old_logprobs is None:  # one step: pi_old is this very forward (B = A)
                    m.old_logprobs = lp.detach()
                loss, _ = policy_loss(lp, m.old_logprobs, m.advantages, m.response_mask, self.loss_cfg,
                                      rollout_logprobs=m.rollout_logprobs, n_tokens_global=n_tok)
                loss.backward()
                total += float(loss.detach())
            if world > 1:
                total = _sum_gradients_across_ranks(self.model, total)
            if self.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(total)
        self.derivations += 1
        out = {"rspo/explorer_loss": losses[-1], "rspo/explorer_tokens": float(n_tok)}
        # every rank counts the same derivations, so all of them join this all_reduce or none does
        if (self.derivations - 1) % self.kl_every == 0:
            out["rspo/kl_policy_explorer"] = all_reduce_sums({"kl": self._kl_from_policy(micro, n_tok)})["kl"]
        out["rspo/derive_seconds"] = time.perf_counter() - t0
        return out

    def _copy_from(self, policy: nn.Module) -> None:
        """B's weights := A's. B is built from A's config, not deep-copied: A's parameters carry
        DeepSpeed's hooks, which a copy must not inherit."""
        self._build(policy)
        weights = merged_weights(policy, device=None) if is_peft_model(policy) else policy.state_dict()
        self.model.load_state_dict({k: v.float() for k, v in weights.items()})
        self.model.requires_grad_(True)

    def _build(self, policy: nn.Module) -> None:
        if self.model is None:
            from transformers import AutoModelForCausalLM

            device = next(policy.parameters()).device
            self.model = AutoModelForCausalLM.from_config(policy.config).to(device=device, dtype=torch.float32).eval()
            if self.gradient_checkpointing:  # as the learner does A's (deepspeed_setup.enable_layer_checkpointing)
                self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                enable_layer_checkpointing(self.model)

    def _logprobs(self, input_ids, attention_mask, score_mask=None):
        """``token_logprobs`` of B at the learner's precision (fp32 weights, autocast matmuls)."""
        with autocast_context(torch.device(input_ids.device), self.autocast):
            return token_logprobs(self.model, input_ids, attention_mask, score_mask=score_mask,
                                  temperature=self.temperature)

    # ---- checkpoints (engines/learner_state.py). B's optimizer is made fresh by every derivation,
    # so B's weights and the derivation count are its whole state.
    def state_dict(self) -> dict:
        weights = None if self.model is None else {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        return {"derivations": self.derivations, "model": weights}

    def load_state_dict(self, state: dict, policy: nn.Module) -> None:
        """Restore ``state_dict``; ``policy`` (A) gives B's architecture."""
        self.derivations = int(state["derivations"])
        if state["model"] is not None:
            self._build(policy)
            self.model.load_state_dict(state["model"])
            self.model.requires_grad_(True)

    @torch.no_grad()
    def _kl_from_policy(self, micro, n_tok: int) -> float:
        """KL(A || B) per policy token, k3 estimate on the batch's tokens with A's logprobs
        (``old_logprobs``) as the sampling side."""
        total = 0.0
        for m in micro:
            lp_b = self._logprobs(m.input_ids, m.attention_mask, m.response_mask)
            total += float(aggregate_tokens(kl_penalty(m.old_logprobs, lp_b, "k3"), m.response_mask, n_tok))
        return total

    @torch.no_grad()
    def logprobs(self, input_ids: list[list[int]], pad_id: int, device) -> list[list[float]]:
        """B's token logprobs (``hf_policy.token_logprobs`` alignment), one list per sequence."""
        out = []
        for seq in input_ids:
            ids, attn = pad_batch([seq], pad_id, device=device)
            out.append(self._logprobs(ids, attn)[0].float().cpu().tolist())
        return out

    @torch.no_grad()
    def state_dict_for_inference(self) -> dict[str, torch.Tensor]:
        sd = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in self.model.state_dict().items()}
        if self.tied_embeddings:
            sd.pop("lm_head.weight", None)
        return sd


def _sum_gradients_across_ranks(model: nn.Module, loss: float) -> float:
    """SUM the ranks' gradients of ``model`` in place (a parameter no rank's rows reached gets
    zeros); returns the summed loss."""
    for p in model.parameters():
        if p.requires_grad:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            torch.distributed.all_reduce(p.grad)
    return all_reduce_sums({"loss": loss})["loss"]
