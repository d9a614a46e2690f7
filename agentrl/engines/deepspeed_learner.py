"""The policy learner: a single-process DeepSpeed engine that runs the PPO-clip / GRPO update.

Designed to live inside one Ray actor (world size 1 per learner), on CPU (gloo) or GPU (nccl).

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
``engine(...)``, so the engine wraps the HF model in ``_PolicyLogprobs`` whose forward *returns
token logprobs*; we never call the inner HF model directly for a gradient pass.

The model is kept in ``eval()`` mode throughout: it only disables dropout, and a stochastic
policy forward would make the PPO ratio (and the engine-vs-learner mismatch metric) noisy.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor, nn

from agentrl.algos.critic import gae, whiten
from agentrl.algos.losses import PolicyLossConfig, is_weight_sums, policy_loss, rollout_stats
from agentrl.algos.registry import estimator_for
from agentrl.api import MicroBatch, TrainBatch
from agentrl.engines.deepspeed_setup import build_ds_config, reset_prestepped_optimizer_state, setup_single_process_env
from agentrl.engines.explorer import Explorer
from agentrl.engines.hf_policy import pad_batch, token_logprobs
from agentrl.engines.micro_batch import pad_micro_batch
from agentrl.weight_sync.object_store import weights_to_blob

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class _PolicyLogprobs(nn.Module):
    """nn.Module handed to DeepSpeed: forward(input_ids, attention_mask) -> (logprobs, entropy).

    The entropy carries a gradient only when an entropy bonus is configured (it costs memory).
    Logprobs are of the tempered policy softmax(logits / temperature) the rollouts sampled from."""

    def __init__(self, model: nn.Module, entropy_grad: bool = False, temperature: float = 1.0):
        super().__init__()
        self.model = model
        self.entropy_grad = entropy_grad
        self.temperature = temperature

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        return token_logprobs(self.model, input_ids, attention_mask, with_entropy=True, entropy_grad=self.entropy_grad,
                              temperature=self.temperature)


class _StepMetrics:
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
        self.explorer = {"weight_sum": 0.0, "clipped": 0.0, "tokens": 0.0}  # RSPO: IS weights on B's tokens
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

    def add_explorer(self, sums: dict[str, float]) -> None:
        """One micro-batch's ``is_weight_sums`` over the explorer's tokens."""
        for key, value in sums.items():
            self.explorer[key] += value

    def result(self, epochs: int, with_rollout: bool, extra: dict[str, float], **fields: float) -> dict[str, float]:
        out = {k: v / float(epochs) for k, v in self.sums.items()}
        if self.explorer["tokens"]:
            n = self.explorer["tokens"]
            out.update({"rspo/is_weight_mean": self.explorer["weight_sum"] / n,
                        "rspo/is_clip_frac": self.explorer["clipped"] / n, "rspo/explorer_tokens_trained": n})
        out.update(self.pi_old)
        out.update(extra)
        if not with_rollout:
            out.pop("is_weight_mean"), out.pop("logprob_mismatch")
        out.update(grad_norm=sum(self.grad_norms) / len(self.grad_norms), optimizer_steps=float(len(self.grad_norms)), **fields)
        return out


class DeepSpeedLearner:
    """Owns the trainable policy (DeepSpeed engine), the frozen reference, and the update rule.

    Public state: ``version`` (number of ``train_step`` calls so far; the policy version the
    rollout side tags episodes with) and ``pad_id``.
    """

    def __init__(self, model_path: str, learner_cfg: Any, algo_cfg: Any, dtype: str = "float32", seed: int = 0,
                 temperature: float = 1.0, rspo_cfg: Any = None):
        """``temperature``: the rollouts' sampling temperature. The policy, the reference and the
        PPO ratio are all scored under softmax(logits / temperature), the distribution the
        episodes were drawn from (as verl does); greedy decoding is unchanged by it. ``rspo_cfg``
        (an enabled ``RspoConfig``): build RSPO's explorer (``engines/explorer.py``) and cap the IS
        weights of its rows at ``rspo.is_cap``."""
        setup_single_process_env()
        import logging

        import deepspeed  # after the env is set: the accelerator is chosen at import

        # DeepSpeed logs its whole config at INFO on every initialize; keep warnings and errors.
        deepspeed.utils.logger.setLevel(logging.WARNING)
        from deepspeed.accelerator import get_accelerator
        from transformers import AutoModelForCausalLM

        self.learner_cfg, self.algo_cfg, self.dtype = learner_cfg, algo_cfg, dtype
        self.loss_cfg = PolicyLossConfig.from_algo(algo_cfg)
        if rspo_cfg is not None:
            self.loss_cfg = replace(self.loss_cfg, explorer_is_cap=rspo_cfg.is_cap)
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (the rollouts' sampling temperature), got {temperature}")
        self.temperature = temperature
        self.version = 0
        self._deepspeed = deepspeed
        t0 = time.perf_counter()
        if not torch.distributed.is_initialized():
            deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
        self.init_distributed_s = time.perf_counter() - t0

        self.seed = seed
        torch.manual_seed(seed)
        # Load in fp32: DeepSpeed casts to bf16/fp16 itself and keeps fp32 master weights.
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        model.eval()  # disables dropout only; see the module docstring
        cfg = model.config
        self.pad_id = next((v for v in (cfg.pad_token_id, cfg.eos_token_id, 0) if isinstance(v, int)), 0)
        self.tied_embeddings = bool(getattr(cfg, "tie_word_embeddings", False))

        self.engine = self._build_engine(model)
        self.device = self.engine.device
        self.ref_model: nn.Module | None = None
        if algo_cfg.kl_coef > 0:
            ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=_TORCH_DTYPES[dtype])
            self.ref_model = ref.to(self.device).eval().requires_grad_(False)

        self.critic = None
        if estimator_for(algo_cfg).needs_critic:  # the estimator's row in algos/registry.py (plugins imported here)
            from agentrl.engines.deepspeed_critic import DeepSpeedCritic

            if algo_cfg.critic is None:
                raise ValueError(f"algo.advantage={algo_cfg.advantage} needs algo.critic")
            self.critic = DeepSpeedCritic(algo_cfg.critic.path or model_path, algo_cfg.critic,
                                          build_ds_config(learner_cfg, dtype), seed=seed)
        self.explorer: Explorer | None = None
        if rspo_cfg is not None:
            self.explorer = Explorer(rspo_cfg.explorer_lr or learner_cfg.lr, rspo_cfg.explorer_steps, rspo_cfg.grad_clip,
                                     learner_cfg.micro_batch_size, temperature, self.loss_cfg, self.tied_embeddings)
        self.init_s = time.perf_counter() - t0

    # ------------------------------------------------------------------ helpers
    def _build_engine(self, model: nn.Module) -> Any:
        """The DeepSpeed engine around ``_PolicyLogprobs(model)``: AdamW, linear LR warm-up over
        ``learner.warmup_steps``, ``build_ds_config``; Adam state as if no step was taken."""
        lcfg = self.learner_cfg
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=lcfg.lr,
            betas=tuple(lcfg.betas),
            eps=lcfg.adam_eps,
            weight_decay=lcfg.weight_decay,
        )
        warmup = lcfg.warmup_steps

        def lr_lambda(step: int) -> float:  # step = optimizer steps taken so far
            return 1.0 if warmup <= 0 else min(1.0, (step + 1) / warmup)

        engine, _, _, _ = self._deepspeed.initialize(
            model=_PolicyLogprobs(model, entropy_grad=self.algo_cfg.entropy_coef > 0, temperature=self.temperature),
            optimizer=optimizer,
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda),
            config=build_ds_config(lcfg, self.dtype),
        )
        engine.eval()
        reset_prestepped_optimizer_state(engine)
        return engine

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
        micro = [m for mini in minis for m in mini]
        n_tok = sum(m.n_tokens for m in micro)
        self.version += 1
        lr = float(self.engine.get_lr()[0])
        if n_tok == 0:  # nothing to learn from: skip the optimizer step (AdamW would still decay)
            return {"tokens": 0.0, "skipped": 1.0, "lr": lr, "version": float(self.version)}

        critic_stats = self._critic_advantages(micro, n_tok) if use_critic else {}
        # After the first optimizer step the policy has moved: later updates need the logprobs of
        # the policy as it was before this step (PPO's pi_old), computed up front.
        precompute_old = lcfg.ppo_epochs > 1 or len(minis) > 1
        self._reference_and_old_passes(micro, precompute_old)
        metrics = _StepMetrics(n_tok, sum(m.n_sequences for m in micro), acfg.loss_agg)
        for epoch in range(lcfg.ppo_epochs):
            for mini in minis:
                self._train_mini_batch(mini, metrics, first_epoch=epoch == 0)
        if use_critic:
            critic_stats.update(self.critic.train(micro, n_tok))
        return metrics.result(
            epochs=lcfg.ppo_epochs, with_rollout=batch.rollout_logprobs is not None, extra=critic_stats,
            lr=lr, tokens=float(n_tok), sequences=float(len(batch)), version=float(self.version),
            step_time_s=time.perf_counter() - t0,
        )

    def _build_mini_batches(self, batch: TrainBatch) -> list[list[MicroBatch]]:
        """The step's random mini-batches (``_mini_batches``), each as length-sorted padded
        micro-batches (``_micro_batches``)."""
        lengths = [len(s) for s in batch.input_ids]
        n = len(lengths)
        return [[pad_micro_batch(batch, rows, self.pad_id, self.device) for rows in self._micro_batches(n, lengths, subset)]
                for subset in self._mini_batches(n)]

    @torch.no_grad()
    def _reference_and_old_passes(self, micro: list[MicroBatch], precompute_old: bool) -> None:
        """Reference logprobs when the KL is in the loss; pi_old logprobs and entropy up front when
        the policy moves within the step (else the first training forward gives them)."""
        acfg = self.algo_cfg
        use_kl = self.ref_model is not None and acfg.kl_coef > 0 and acfg.kl_in == "loss"
        for m in micro:
            if use_kl:
                m.ref_logprobs = token_logprobs(self.ref_model, m.input_ids, m.attention_mask, temperature=self.temperature)
            if precompute_old:
                m.old_logprobs, m.old_entropy = self.engine(m.input_ids, m.attention_mask)

    def _train_mini_batch(self, mini: list[MicroBatch], metrics: _StepMetrics, first_epoch: bool) -> None:
        """Accumulate the gradient of every micro-batch's loss, then take one optimizer step."""
        n_mini, seqs_mini = sum(m.n_tokens for m in mini), sum(m.n_sequences for m in mini)
        if n_mini == 0:
            return
        for k, m in enumerate(mini):
            self.engine.set_gradient_accumulation_boundary(k == len(mini) - 1)
            loss, stats = self._micro_batch_loss(m, n_mini, seqs_mini)
            self.engine.backward(loss)
            metrics.add_loss(loss, stats, m.n_tokens, n_mini, seqs_mini)
            if first_epoch:
                metrics.add_pi_old(rollout_stats(m.old_logprobs, m.response_mask, rollout_logprobs=m.rollout_logprobs,
                                                 entropy=m.old_entropy, tis_cap=self.loss_cfg.tis_cap,
                                                 n_tokens_global=metrics.n_tokens))
                if m.explorer_rows is not None and m.rollout_logprobs is not None:  # RSPO: pi_A / pi_B on B's tokens
                    metrics.add_explorer(is_weight_sums(m.old_logprobs, m.rollout_logprobs,
                                                        m.response_mask & m.explorer_rows.unsqueeze(1),
                                                        self.loss_cfg.explorer_is_cap or self.loss_cfg.tis_cap))
        metrics.grad_norms.append(self._optimizer_step())

    def _micro_batch_loss(self, m: MicroBatch, n_mini: int, seqs_mini: int) -> tuple[Tensor, dict[str, Tensor]]:
        """Policy forward and ``policy_loss`` of one micro-batch of a mini-batch with ``n_mini``
        policy tokens in ``seqs_mini`` sequences."""
        lp, ent = self.engine(m.input_ids, m.attention_mask)
        if m.old_logprobs is None:  # one epoch, one mini-batch: pi_old is this very forward
            m.old_logprobs, m.old_entropy = lp.detach(), ent.detach()
        return policy_loss(
            lp, m.old_logprobs, m.advantages, m.response_mask, self.loss_cfg, rollout_logprobs=m.rollout_logprobs,
            ref_logprobs=m.ref_logprobs, entropy=ent, n_tokens_global=n_mini, n_sequences_global=seqs_mini,
            explorer_rows=m.explorer_rows,
        )

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
            m.old_values = self.critic.values(m.input_ids, m.attention_mask)
            m.advantages, m.returns = gae(m.advantages, m.old_values, m.response_mask, ccfg.gamma, ccfg.lam)
        if ccfg.whiten_advantages and n_tok > 1:
            # whiten over the whole step's tokens, not per micro-batch
            flat = whiten(torch.cat([m.advantages[m.response_mask] for m in micro]), torch.ones(n_tok, dtype=torch.bool))
            for m, part in zip(micro, torch.split(flat, [m.n_tokens for m in micro])):
                m.advantages = torch.zeros_like(m.advantages).masked_scatter(m.response_mask, part)
        values = torch.cat([m.old_values[m.response_mask] for m in micro])
        return {"critic/value_mean": float(values.mean()) if values.numel() else 0.0}

    @torch.no_grad()
    def reference_logprobs(self, input_ids: Sequence[Sequence[int]]) -> list[list[float]]:
        """Frozen-reference token logprobs (for KL in the reward), one list per sequence."""
        if self.ref_model is None:
            raise ValueError("no reference model: algo.kl_coef is 0")
        out: list[list[float]] = [[] for _ in input_ids]
        for idx in self._micro_batches(len(input_ids), [len(s) for s in input_ids]):
            ids, attn = pad_batch([input_ids[i] for i in idx], self.pad_id, device=self.device)
            lp = token_logprobs(self.ref_model, ids, attn, temperature=self.temperature)
            for row, i in enumerate(idx):
                out[i] = lp[row, : len(input_ids[i])].float().cpu().tolist()
        return out

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
    def state_dict_for_inference(self) -> dict[str, Tensor]:
        """Full (unpartitioned) weights on CPU in the training dtype, HF key names.

        Under ZeRO-3 parameters are gathered first. ``lm_head.weight`` is dropped when embeddings
        are tied: it is the same tensor as ``model.embed_tokens.weight`` and inference engines
        re-tie it on load (sending it twice would double the sync payload)."""
        model = self.hf_model

        def collect() -> dict[str, Tensor]:
            return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()}

        if self.learner_cfg.zero_stage == 3:
            with self._deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
                sd = collect()
        else:
            sd = collect()
        if self.tied_embeddings:
            sd.pop("lm_head.weight", None)
        return sd

    def weights_blob(self) -> bytes:
        """``state_dict_for_inference`` as the object-store sync's safetensors blob."""
        return weights_to_blob(self.state_dict_for_inference())

    def derive_explorer(self, batch: TrainBatch) -> dict[str, float]:
        """RSPO: re-derive the explorer B from the current policy A on ``batch`` (process-reward
        advantages of A's episodes, ``algos.rspo.explorer_batch``); A is not touched."""
        if self.explorer is None:
            raise ValueError("this learner has no explorer (rspo is not enabled)")
        return self.explorer.derive(self.hf_model, batch, self.pad_id, self.device)

    def explorer_logprobs(self, input_ids: Sequence[Sequence[int]]) -> list[list[float]]:
        """Token logprobs under the explorer (None derived yet: raises)."""
        if self.explorer is None or self.explorer.model is None:
            raise ValueError("no explorer has been derived")
        return self.explorer.logprobs([list(s) for s in input_ids], self.pad_id, self.device)

    def explorer_weights_blob(self) -> bytes:
        """The explorer's weights as the object-store sync's safetensors blob."""
        return weights_to_blob(self.explorer.state_dict_for_inference())

    def save_pretrained(self, out_dir: str | os.PathLike) -> None:
        """HF folder (config + safetensors weights) of the current policy; the caller copies the
        tokenizer. Weights keep the training dtype."""
        sd = self.state_dict_for_inference()
        model = self.hf_model
        model.config.dtype = next(iter(sd.values())).dtype if sd else torch.float32
        model.save_pretrained(str(out_dir), state_dict=sd)

    def close(self) -> None:
        """Release the engine (hooks, optimizer state); the process group is left alone."""
        destroy = getattr(self.engine, "destroy", None)
        if destroy is not None:
            destroy()
        self.engine = None
        self.ref_model = None
        if self.critic is not None:
            self.critic.close()
            self.critic = None


__all__ = ["DeepSpeedLearner", "build_ds_config"]
