"""The policy learner: one rank's DeepSpeed engine that runs the PPO-clip / GRPO update.

Lives inside one Ray actor per rank (``learning/learner.py``), on CPU (gloo) or GPU (NCCL). With
``learner.num_ranks`` > 1 every rank gets the whole step and trains its share of each mini-batch
(``engines/learner_shards.py``): the update is the one a single rank would make, with ZeRO
partitioning the model states across the ranks.

Gradient accumulation is done by us, not by DeepSpeed's micro-step counter: a step's batch is
split into however many micro-batches it needs (batch sizes vary with group filtering), every
micro-batch loss is already normalized by its mini-batch's policy-token count (see
``algos.losses.policy_loss``), and DeepSpeed is told ``gradient_accumulation_steps=1`` so it never rescales
the loss. ``engine.set_gradient_accumulation_boundary(is_last_micro_batch)`` before each backward
makes ZeRO 1/2 hold the gradient reduction until the last micro-batch, and the single
``engine.step()`` after it applies exactly one optimizer update (and one LR-scheduler step).
With ``learner.mini_batches`` > 1 that happens once per mini-batch, each normalized by its own
token count.

DeepSpeed only runs its backward bookkeeping (ZeRO hooks, boundary flags) for outputs of
``engine(...)``, so the engine wraps the HF model in ``PolicyLogprobs`` (``engines/policy_logprobs.py``) whose forward *returns
token logprobs*; we never call the inner HF model directly for a gradient pass.

The model is kept in ``eval()`` mode throughout: it only disables dropout, and a stochastic
policy forward would make the PPO ratio (and the engine-vs-learner mismatch metric) noisy.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Any, Iterator, Mapping, Sequence

import torch
from torch import Tensor, nn

from agentrl.algos.critic import gae, whiten
from agentrl.algos.losses import PolicyLossConfig, is_weight_sums, policy_loss, rollout_stats
from agentrl.algos.registry import estimator_for
from agentrl.api import MicroBatch, TrainBatch
from agentrl.engines.deepspeed_setup import (
    adamw,
    build_ds_config,
    enable_layer_checkpointing,
    init_process_group,
    reset_prestepped_optimizer_state,
)
from agentrl.engines.hf_policy import micro_batch_logprobs, pad_batch, token_logprobs
from agentrl.engines.learner_parts import LearnerPart
from agentrl.engines.learner_shards import plan_mini_batch
from agentrl.engines.lora import apply_lora, iter_merged_weights, lora_enabled, unwrap_base
from agentrl.engines.micro_batch import pack_micro_batch, pad_micro_batch, split_micro_batches
from agentrl.engines.policy_logprobs import TORCH_DTYPES, PolicyLogprobs, autocast_context, check_autocast_supported
from agentrl.engines.step_metrics import StepMetrics, all_reduce_sums, peak_memory_mib
from agentrl.weight_sync.object_store import weights_to_blob

# what the learner itself saves and hashes under these names (engines/learner_state.py)
_OWN_STATE_KEYS = frozenset({"version", "world_size", "rng", "module", "optimizer", "lr_scheduler", "counters", "critic"})


@dataclass
class _MiniBatch:
    """This rank's micro-batches of one mini-batch (empty ones included: see learner_shards) and
    the whole mini-batch's counts, which normalize its loss on every rank."""

    micro: list[MicroBatch]
    n_tokens: int
    n_sequences: int


class DeepSpeedLearner:
    """Owns the trainable policy (DeepSpeed engine), the frozen reference, and the update rule.

    Public state: ``version`` (number of ``train_step`` calls so far; the policy version the
    rollout side tags episodes with), ``pad_id`` and ``parts`` (the methods' learner parts).
    """

    def __init__(self, model_path: str, learner_cfg: Any, algo_cfg: Any, dtype: str = "float32", seed: int = 0,
                 temperature: float = 1.0, methods: Sequence[Any] = (), lora_cfg: Any = None,
                 sampler_dtype: str | None = None):
        """``temperature``: the rollouts' sampling temperature. The policy, the reference and the
        PPO ratio are all scored under softmax(logits / temperature), the distribution the
        episodes were drawn from (as verl does); greedy decoding is unchanged by it. ``methods``: the
        run's active methods (``agentrl.methods``); each may add a model of its own beside the policy
        (``Method.learner_part``, held in ``parts`` by method name), whose ``foreign_is_cap`` caps
        the IS weights of the rows its role's engines sampled. ``lora_cfg`` (``model.lora`` with rank > 0): train
        LoRA adapters only (``engines/lora.py``); the engines get merged weights, and the frozen
        reference is the policy with its adapters switched off (no second copy of the model).
        ``sampler_dtype``: the rollout engines' dtype (default ``dtype``); ``learner.old_logprobs:
        auto`` takes pi_old from the rollouts only when it is the learner's compute dtype."""
        import logging

        import deepspeed  # after the env is set: the accelerator is chosen at import

        # DeepSpeed logs its whole config at INFO on every initialize; keep warnings and errors.
        deepspeed.utils.logger.setLevel(logging.WARNING)
        from deepspeed.accelerator import get_accelerator
        from transformers import AutoModelForCausalLM

        self.learner_cfg, self.algo_cfg, self.dtype = learner_cfg, algo_cfg, dtype
        self.loss_cfg = PolicyLossConfig.from_algo(algo_cfg)
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (the rollouts' sampling temperature), got {temperature}")
        self.temperature = temperature
        self.compute_dtype = learner_cfg.autocast or dtype  # the dtype the learner's matmuls run in
        self.sampler_dtype = sampler_dtype or dtype
        self.version = 0
        self._deepspeed = deepspeed
        t0 = time.perf_counter()
        if not torch.distributed.is_initialized():  # a learner group's rank actor has set it up already
            init_process_group()
        deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
        self.rank, self.world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        self.init_distributed_s = time.perf_counter() - t0

        self.seed = seed
        torch.manual_seed(seed)
        # Load in fp32: DeepSpeed casts to bf16/fp16 itself and keeps fp32 master weights.
        attn = {"attn_implementation": learner_cfg.attn_implementation} if learner_cfg.attn_implementation else {}
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, **attn)
        model.eval()  # disables dropout only; see the module docstring
        cfg = model.config
        self.pad_id = next((v for v in (cfg.pad_token_id, cfg.eos_token_id, 0) if isinstance(v, int)), 0)
        self.tied_embeddings = bool(getattr(cfg, "tie_word_embeddings", False))

        if learner_cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.lora = lora_enabled(lora_cfg)
        if self.lora:
            model = apply_lora(model, lora_cfg)
        self.engine = self._build_engine(model)
        self.device = self.engine.device
        check_autocast_supported(learner_cfg.autocast, torch.device(self.device))
        self.ref_model: nn.Module | None = None
        self._ref_engine = None
        if algo_cfg.kl_coef > 0 and not self.lora:
            # frozen: held in the dtype its matmuls run in (learner.autocast's, else the training dtype)
            ref_dtype = TORCH_DTYPES[learner_cfg.autocast or dtype]
            self.ref_model = self._build_reference(AutoModelForCausalLM.from_pretrained(model_path, dtype=ref_dtype, **attn))

        self.critic = None
        if estimator_for(algo_cfg).needs_critic:  # the estimator's row in algos/registry.py
            from agentrl.engines.deepspeed_critic import DeepSpeedCritic

            if algo_cfg.critic is None:
                raise ValueError(f"algo.advantage={algo_cfg.advantage} needs algo.critic")
            self.critic = DeepSpeedCritic(algo_cfg.critic.path or model_path, algo_cfg.critic,
                                          build_ds_config(learner_cfg, dtype), seed=seed,
                                          gradient_checkpointing=learner_cfg.gradient_checkpointing, **attn)
        self.parts = self._build_parts(methods)
        self.init_s = time.perf_counter() - t0

    # ------------------------------------------------------------------ helpers
    def _build_parts(self, methods: Sequence[Any]) -> dict[str, LearnerPart]:
        """The methods' learner parts (built last: a part may copy anything above), and the IS cap
        of the rows their roles sampled. One cap for every such row (``TrainBatch.foreign`` does not
        say which policy sampled a row), so parts that ask for different caps are refused."""
        parts = {m.name: part for m in methods if (part := m.learner_part(self)) is not None}
        keys = [p.state_key for p in parts.values()]  # keys of extra.pt and of the state digest (learner_state.py)
        if len(set(keys)) != len(keys) or set(keys) & _OWN_STATE_KEYS:
            raise ValueError(f"learner parts need state keys of their own (not {sorted(_OWN_STATE_KEYS)}): {keys}")
        caps = {p.foreign_is_cap for p in parts.values() if p.foreign_is_cap is not None}
        if len(caps) > 1:
            raise ValueError(f"the methods {sorted(parts)} ask for different IS caps {sorted(caps)} of the rows other "
                             "policies sampled; the learner applies one")
        if caps:
            self.loss_cfg = replace(self.loss_cfg, foreign_is_cap=caps.pop())
        return parts

    def _build_engine(self, model: nn.Module) -> Any:
        """The DeepSpeed engine around ``PolicyLogprobs(model)``: AdamW, linear LR warm-up over
        ``learner.warmup_steps``, ``build_ds_config``; Adam state as if no step was taken."""
        lcfg = self.learner_cfg
        optimizer = adamw([p for p in model.parameters() if p.requires_grad], lcfg)
        warmup = lcfg.warmup_steps

        def lr_lambda(step: int) -> float:  # step = optimizer steps taken so far
            return 1.0 if warmup <= 0 else min(1.0, (step + 1) / warmup)

        engine, _, _, _ = self._deepspeed.initialize(
            model=PolicyLogprobs(model, entropy_grad=self.algo_cfg.entropy_coef > 0, temperature=self.temperature,
                                  autocast=lcfg.autocast),
            optimizer=optimizer,
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda),
            config=build_ds_config(lcfg, self.dtype),
        )
        engine.eval()
        if lcfg.gradient_checkpointing:
            enable_layer_checkpointing(engine.module)
        reset_prestepped_optimizer_state(engine)
        return engine

    def _build_reference(self, ref: nn.Module) -> nn.Module:
        """The frozen KL reference in the training dtype. Under ZeRO-3 it is partitioned across the
        ranks like the policy (a DeepSpeed engine without an optimizer: its parameters are
        gathered layer by layer in forward), so no rank holds a whole second model."""
        ref = ref.eval().requires_grad_(False)
        if self.learner_cfg.zero_stage != 3:
            return ref.to(self.device)
        self._ref_engine, _, _, _ = self._deepspeed.initialize(model=ref, config=build_ds_config(self.learner_cfg, self.dtype))
        self._ref_engine.eval()
        return self._ref_engine.module

    @property
    def hf_model(self) -> nn.Module:
        return self.engine.module.model

    def _micro_batches(self, n: int, lengths: Sequence[int], subset: Sequence[int] | None = None) -> list[list[int]]:
        """Index lists of ``micro_batch_size`` sequences (of ``subset``, default all), length-sorted
        to minimize padding (the loss does not depend on how a mini-batch is split, thanks to
        its global-token normalization)."""
        order = sorted(range(n) if subset is None else subset, key=lambda i: lengths[i])
        mbs = self.learner_cfg.micro_batch_size
        return [order[i : i + mbs] for i in range(0, len(order), mbs)]

    def _mini_batches(self, n: int) -> list[list[int]]:
        """``learner.mini_batches`` disjoint random index sets covering the batch, one optimizer
        step each. Random, not length-sorted: a mini-batch of only the shortest episodes would
        give a biased update. Seeded by the policy version, so a run is reproducible."""
        k = min(self.learner_cfg.mini_batches, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + self.version)).tolist()
        return [perm[i::k] for i in range(k)]

    # ------------------------------------------------------------------ training
    def train_step(self, batch: TrainBatch | Mapping[str, Any]) -> dict[str, float]:
        """One policy update on a batch of episodes: ``ppo_epochs`` passes over it, each split into
        ``mini_batches`` random mini-batches with one optimizer step each.

        ``batch``: a ``TrainBatch`` (or a mapping of its fields): python lists, one entry per
        sequence: ``input_ids``, ``response_mask`` (1 on policy tokens), ``advantages`` (per token,
        already broadcast) — or, for PPO, ``token_rewards`` from which the critic and GAE make the
        advantages — and optionally ``rollout_logprobs`` (the engine's sampled-token logprobs).
        Every mini-batch loss is normalized by that mini-batch's policy-token count.

        Phases: mini-batches of padded micro-batches -> (PPO) critic values and GAE advantages ->
        reference and pi_old passes -> per epoch and mini-batch, the loss of each micro-batch and
        one optimizer step -> (PPO) the critic's step -> metrics.
        """
        t0 = time.perf_counter()
        batch = batch if isinstance(batch, TrainBatch) else TrainBatch(**batch)
        acfg, lcfg = self.algo_cfg, self.learner_cfg
        use_critic = batch.token_rewards is not None
        if use_critic and self.critic is None:
            raise ValueError("batch has token_rewards but this learner has no critic (the estimator must declare needs_critic)")

        minis = self._build_mini_batches(batch)
        micro = [m for mini in minis for m in mini.micro]
        n_tok = sum(mini.n_tokens for mini in minis)
        self.version += 1
        lr = float(self.engine.get_lr()[0])
        if n_tok == 0:  # nothing to learn from: skip the optimizer step (AdamW would still decay)
            return {"tokens": 0.0, "skipped": 1.0, "lr": lr, "version": float(self.version)}

        critic_stats = self._critic_advantages(micro, n_tok) if use_critic else {}
        # After the first optimizer step the policy has moved: later updates need the logprobs of
        # the policy as it was before this step (PPO's pi_old): from the rollouts, or recomputed.
        separate_old = lcfg.ppo_epochs > 1 or len(minis) > 1
        from_rollout = separate_old and self._old_from_rollout(batch)
        self._reference_and_old_passes(micro, recompute_old=separate_old and not from_rollout)
        metrics = StepMetrics(n_tok, sum(mini.n_sequences for mini in minis), acfg.loss_agg)
        for epoch in range(lcfg.ppo_epochs):
            for k, mini in enumerate(minis):
                # pi_old's diagnostics (entropy, sampler mismatch) come from the first epoch; with
                # rollout log-probs as pi_old, from the forwards before the first optimizer step
                diag_tokens = (minis[0].n_tokens if k == 0 else 0) if from_rollout else n_tok
                self._train_mini_batch(mini, metrics, diag_tokens=diag_tokens if epoch == 0 else 0,
                                       from_rollout=from_rollout)
        if use_critic:
            critic_stats.update(all_reduce_sums(self.critic.train(micro, n_tok, loss_scale=self.world)))
        metrics.all_reduce()
        return metrics.result(
            epochs=lcfg.ppo_epochs, with_rollout=batch.rollout_logprobs is not None, extra={**critic_stats, **peak_memory_mib()},
            lr=lr, tokens=float(n_tok), sequences=float(len(batch)), version=float(self.version),
            step_time_s=time.perf_counter() - t0, old_from_rollout=float(from_rollout),
        )

    def _old_from_rollout(self, batch: TrainBatch) -> bool:
        """Whether pi_old is the sampler's log-probs (``learner.old_logprobs``). ``auto``: when every
        episode was sampled by this learner's current weights (the version before this step's
        update) at its compute dtype, and none by another policy (``batch.foreign``: its log-probs are
        not pi_A's)."""
        mode = self.learner_cfg.old_logprobs
        if mode == "recompute":
            return False
        if batch.rollout_logprobs is None:
            if mode == "rollout":
                raise ValueError("learner.old_logprobs=rollout, but the batch has no rollout log-probs")
            return False
        foreign = batch.foreign is not None and any(batch.foreign)
        if mode == "rollout":
            if foreign:
                raise ValueError("learner.old_logprobs=rollout cannot score episodes another policy sampled (their "
                                 "log-probs are that policy's, not the trained one's); use auto or recompute")
            return True
        on_policy = batch.versions is not None and all(v == self.version - 1 for v in batch.versions)
        return on_policy and not foreign and self.sampler_dtype == self.compute_dtype

    def _build_mini_batches(self, batch: TrainBatch) -> list[_MiniBatch]:
        """The step's random mini-batches (``_mini_batches``), each as this rank's share of its
        length-sorted micro-batches (``learner_shards.plan_mini_batch``; padded, or packed with
        ``learner.packing``), plus the empty micro-batches that keep the ranks in step."""
        lcfg = self.learner_cfg
        lengths = [len(s) for s in batch.input_ids]
        tokens = [sum(1 for x in mask if x > 0) for mask in batch.response_mask]
        make = pack_micro_batch if lcfg.packing else pad_micro_batch

        def split(rows: list[int]) -> list[list[int]]:
            return split_micro_batches(rows, lengths, lcfg.micro_batch_size, lcfg.max_tokens_per_micro_batch,
                                       packed=lcfg.packing)

        minis = []
        for subset in self._mini_batches(len(lengths)):
            plan = plan_mini_batch(subset, lengths, tokens, self.rank, self.world, split)
            micro = [make(batch, rows, self.pad_id, self.device) for rows in plan.rows]
            if plan.n_empty:
                filler = make(batch, [plan.filler_row], self.pad_id, self.device)
                micro += [replace(filler, response_mask=torch.zeros_like(filler.response_mask)) for _ in range(plan.n_empty)]
            minis.append(_MiniBatch(micro, plan.n_tokens, plan.n_sequences))
        return minis

    @torch.no_grad()
    def _reference_and_old_passes(self, micro: list[MicroBatch], recompute_old: bool) -> None:
        """Reference logprobs when the KL is in the loss; pi_old logprobs and entropy up front when
        they are recomputed (else the rollouts' or the first training forward's serve)."""
        acfg = self.algo_cfg
        use_kl = acfg.kl_coef > 0 and acfg.kl_in == "loss"
        for m in micro:
            if use_kl:
                with autocast_context(torch.device(self.device), self.learner_cfg.autocast):
                    m.ref_logprobs = self._reference(micro_batch_logprobs, *m.forward_args(), score_mask=m.score_mask(),
                                                     temperature=self.temperature)
            if recompute_old:
                m.old_logprobs, m.old_entropy = self.engine(*m.forward_args(), score_mask=m.score_mask(), with_entropy=True)

    def _train_mini_batch(self, mini: _MiniBatch, metrics: StepMetrics, diag_tokens: int, from_rollout: bool) -> None:
        """Accumulate the gradient of every micro-batch's loss, then take one optimizer step.
        Each rank's loss is scaled by the number of ranks: DeepSpeed averages the ranks' gradients,
        and the mini-batch's gradient is their sum (see learner_shards). ``diag_tokens`` > 0: add
        pi_old's diagnostics of these micro-batches, normalized by that token count."""
        n_mini, seqs_mini = mini.n_tokens, mini.n_sequences
        if n_mini == 0:
            return
        for k, m in enumerate(mini.micro):
            self.engine.set_gradient_accumulation_boundary(k == len(mini.micro) - 1)
            if from_rollout and m.old_logprobs is None:
                m.old_logprobs = m.rollout_logprobs
            # this forward is pi_old itself (one epoch, one mini-batch) or measures it (rollout pi_old)
            measures_old = m.old_logprobs is None or (from_rollout and diag_tokens > 0)
            loss, stats, lp, ent = self._micro_batch_loss(m, n_mini, seqs_mini, with_entropy=measures_old and diag_tokens > 0)
            self.engine.backward(loss * self.world if self.world > 1 else loss)
            metrics.add_loss(loss, stats, m.n_tokens, n_mini, seqs_mini)
            if diag_tokens > 0:
                scored, entropy = (lp, ent) if from_rollout else (m.old_logprobs, m.old_entropy)
                metrics.add_pi_old(rollout_stats(scored, m.response_mask, rollout_logprobs=m.rollout_logprobs,
                                                 entropy=entropy, tis_cap=self.loss_cfg.tis_cap, n_tokens_global=diag_tokens))
                if m.foreign_rows is not None and m.rollout_logprobs is not None:  # pi_A / pi_B on B's tokens
                    metrics.add_foreign(is_weight_sums(m.old_logprobs, m.rollout_logprobs,
                                                       m.response_mask & m.foreign_rows.unsqueeze(1),
                                                       self.loss_cfg.foreign_is_cap or self.loss_cfg.tis_cap))
        metrics.grad_norms.append(self._optimizer_step())

    def _micro_batch_loss(self, m: MicroBatch, n_mini: int, seqs_mini: int,
                          with_entropy: bool) -> tuple[Tensor, dict[str, Tensor], Tensor, Tensor | None]:
        """Policy forward and ``policy_loss`` of one micro-batch of a mini-batch with ``n_mini``
        policy tokens in ``seqs_mini`` sequences; also the forward's detached logprobs and entropy."""
        lp, ent = self.engine(*m.forward_args(), score_mask=m.score_mask(), with_entropy=with_entropy)
        if m.old_logprobs is None:  # one epoch, one mini-batch: pi_old is this very forward
            m.old_logprobs, m.old_entropy = lp.detach(), (ent.detach() if ent is not None else None)
        loss, stats = policy_loss(
            lp, m.old_logprobs, m.advantages, m.response_mask, self.loss_cfg, rollout_logprobs=m.rollout_logprobs,
            ref_logprobs=m.ref_logprobs, entropy=ent, n_tokens_global=n_mini, n_sequences_global=seqs_mini,
            foreign_rows=m.foreign_rows,
        )
        return loss, stats, lp.detach(), (ent.detach() if ent is not None else None)

    def _optimizer_step(self) -> float:
        """``engine.step()`` (clip, AdamW, LR schedule); returns the gradient norm before clipping."""
        manual_norm = self._param_grad_norm() if self._needs_manual_grad_norm() else float("nan")
        self.engine.step()
        gn = self.engine.get_global_grad_norm()
        return float(gn) if gn is not None else manual_norm

    def _critic_advantages(self, micro: list[MicroBatch], n_tok: int) -> dict[str, float]:
        """PPO: replace each micro-batch's ``advantages`` (holding token rewards) by GAE advantages
        from the critic's values, whitened over the whole batch when configured; keep the old
        values and returns for the critic's update."""
        ccfg = self.algo_cfg.critic
        for m in micro:
            m.old_values = self.critic.values(*m.forward_args())
            m.advantages, m.returns = gae(m.advantages, m.old_values, m.response_mask, ccfg.gamma, ccfg.lam)
        if ccfg.whiten_advantages and n_tok > 1:
            # whiten over the whole step's tokens (every rank's), not per micro-batch
            flat = torch.cat([m.advantages[m.response_mask] for m in micro])
            flat = whiten(flat, torch.ones_like(flat, dtype=torch.bool)) if self.world == 1 else _whiten_across_ranks(flat)
            for m, part in zip(micro, torch.split(flat, [m.n_tokens for m in micro])):
                m.advantages = torch.zeros_like(m.advantages).masked_scatter(m.response_mask, part)
        values = torch.cat([m.old_values[m.response_mask] for m in micro])
        total = all_reduce_sums({"sum": float(values.sum()), "n": float(values.numel())})
        return {"critic/value_mean": total["sum"] / total["n"] if total["n"] else 0.0}

    @torch.no_grad()
    def reference_logprobs(self, input_ids: Sequence[Sequence[int]]) -> list[list[float]]:
        """Frozen-reference token logprobs (for KL in the reward), one list per sequence."""
        if self.algo_cfg.kl_coef <= 0:
            raise ValueError("no reference model: algo.kl_coef is 0")
        out: list[list[float]] = [[] for _ in input_ids]
        for idx in self._micro_batches(len(input_ids), [len(s) for s in input_ids]):
            ids, attn = pad_batch([input_ids[i] for i in idx], self.pad_id, device=self.device)
            lp = self._reference(token_logprobs, ids, attn, temperature=self.temperature)
            for row, i in enumerate(idx):
                out[i] = lp[row, : len(input_ids[i])].float().cpu().tolist()
        return out

    def _reference(self, logprobs_fn, *args, **kwargs) -> Tensor:
        """``logprobs_fn`` (``token_logprobs`` or ``micro_batch_logprobs``) under the frozen
        reference: its own model, or with LoRA the policy with its adapters switched off."""
        if not self.lora:
            return logprobs_fn(self.ref_model, *args, **kwargs)
        with torch.no_grad(), self.hf_model.disable_adapter():
            return logprobs_fn(self.hf_model, *args, **kwargs)

    def _needs_manual_grad_norm(self) -> bool:
        """ZeRO-0 in fp32 clips with a helper whose norm DeepSpeed discards; compute it ourselves."""
        return self.learner_cfg.zero_stage == 0 and self.dtype == "float32"

    def _param_grad_norm(self) -> float:
        grads = [p.grad.detach().float() for p in self.engine.module.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))

    # ------------------------------------------------------------------ inference-side helpers
    @torch.no_grad()
    def compute_logprobs(self, input_ids: Sequence[Sequence[int]]) -> list[list[float]]:
        """Current-policy token logprobs (same alignment as ``token_logprobs``), one list per
        sequence. Used to verify weight sync against the inference engine."""
        out: list[list[float]] = [[] for _ in input_ids]
        for idx in self._micro_batches(len(input_ids), [len(s) for s in input_ids]):
            ids, attn = pad_batch([input_ids[i] for i in idx], self.pad_id, device=self.device)
            lp, _ = self.engine(ids, attn)
            for row, i in enumerate(idx):
                out[i] = lp[row, : len(input_ids[i])].float().cpu().tolist()
        return out

    @torch.no_grad()
    def inference_weights(self) -> Iterator[tuple[str, Tensor]]:
        """(HF name, full weight on CPU in the training dtype), one tensor at a time.

        Under ZeRO-3 each parameter is gathered alone and released before the next, so no rank
        ever holds the whole model twice; every rank of the group must iterate in step (a gather
        is a collective), while only rank 0 uses the tensors. ``lm_head.weight`` is skipped when
        embeddings are tied: it is ``model.embed_tokens.weight``, and inference engines re-tie it
        on load (sending it twice would double the sync payload)."""
        gather = self._deepspeed.zero.GatheredParameters
        if self.lora:  # W + scaling * B @ A per adapted layer, gathered one module at a time
            for name, t in iter_merged_weights(self.hf_model, gather=lambda ps: gather(ps, modifier_rank=None), device="cpu"):
                if not (self.tied_embeddings and name == "lm_head.weight"):
                    yield name, t
            return
        for name, t in self.hf_model.state_dict(keep_vars=True).items():
            if self.tied_embeddings and name == "lm_head.weight":
                continue
            if hasattr(t, "ds_id"):  # a ZeRO-3 partition
                with gather([t], modifier_rank=None):
                    full = t.detach().to("cpu", copy=True)
            else:
                full = t.detach().to("cpu", copy=True)
            yield name, full.contiguous()

    def state_dict_for_inference(self) -> dict[str, Tensor]:
        """``inference_weights`` as one dict (the object-store sync and ``save_pretrained``)."""
        return dict(self.inference_weights())

    def weights_blob(self) -> bytes:
        """``state_dict_for_inference`` as the object-store sync's safetensors blob, in the
        engines' dtype (``sampler_dtype``; ``weights_to_blob``)."""
        return weights_to_blob(self.state_dict_for_inference(), self.sampler_dtype)

    def save_pretrained(self, out_dir: str | os.PathLike) -> None:
        """HF folder (config + safetensors weights) of the current policy; the caller copies the
        tokenizer. Weights keep the training dtype. Every rank of a group calls it (ZeRO-3
        gathers); rank 0 writes."""
        sd = self.state_dict_for_inference()
        if self.rank != 0:
            return
        model = unwrap_base(self.hf_model)  # with LoRA: the plain model's folder, merged weights
        model.config.dtype = next(iter(sd.values())).dtype if sd else torch.float32
        model.save_pretrained(str(out_dir), state_dict=sd)

    def close(self) -> None:
        """Release the engine (hooks, optimizer state); the process group is left alone."""
        destroy = getattr(self.engine, "destroy", None)
        if destroy is not None:
            destroy()
        self.engine = None
        if self._ref_engine is not None:
            self._ref_engine.destroy()
        self._ref_engine = self.ref_model = None
        if self.critic is not None:
            self.critic.close()
            self.critic = None


def _whiten_across_ranks(flat: Tensor, eps: float = 1e-8) -> Tensor:
    """``algos.critic.whiten`` of the tokens of every rank together (population variance, as there)."""
    stats = torch.tensor([float(flat.double().sum()), float(flat.numel())], dtype=torch.float64)
    torch.distributed.all_reduce(stats)
    mean = stats[0] / stats[1].clamp(min=1)
    sq = ((flat.double() - mean) ** 2).sum().reshape(1)
    torch.distributed.all_reduce(sq)
    var = sq[0] / stats[1].clamp(min=1)
    return ((flat.double() - mean) * torch.rsqrt(var + eps)).to(flat.dtype)


__all__ = ["DeepSpeedLearner", "build_ds_config"]
