"""Cross-check: our GRPO advantages and clipped policy loss equal TRL's ``GRPOTrainer`` (TRL 1.16.0).

The reference numbers come from TRL's own code, run on the same random inputs, not from a re-typed
copy of its formulas. All line numbers below are for ``trl==1.16.0`` (``trl/trainer/...`` inside the
installed package):

* Advantages: ``GRPOTrainer._generate_and_score_completions`` (trl/trainer/grpo_trainer.py:2324-2936),
  the ``multi_objective_aggregation == "sum_then_normalize"`` branch at lines 2761-2788 plus the
  ``nan_to_num`` at line 2810, with the Bessel-corrected ``nanstd`` of trl/trainer/utils.py:1021-1054.
  The method is called for real; only generation is replaced, through TRL's own ``rollout_func``
  hook (``GRPOTrainer._generate``, grpo_trainer.py:2200-2217), by a function returning fixed token
  ids, and a reward function that returns our fixed random rewards. TRL has no standalone
  advantage function in 1.16.0; the computation is inline in that method.
* Policy loss: ``GRPOTrainer._compute_loss`` (grpo_trainer.py:3020-3290), called for real on the
  batch above plus a perturbed ``old_per_token_logps``: token log-probs through
  ``_get_per_token_logps_and_entropies`` (1419-1508, TRL's fused LM head, trl/trainer/utils.py
  ``add_fused_lm_head``), ratio at 3083-3095, clipping at 3112-3119 (``epsilon_low``/``epsilon_high``
  set at 945-946, two-sided ``delta`` clamp at 3115-3116), aggregation for ``loss_type="bnpo"`` at
  3158-3162 and ``"dapo"`` at 3168-3174, and the ``clip_ratio/region_mean`` metric at 3273-3279.
  ``GRPOTrainer.loss_is_scaled_for_ga = True`` (line 285): Trainer backprops each micro-batch loss
  as returned, so summing micro-batch losses is the step objective. ``beta=0`` (no KL term),
  ``temperature=1``, ``bf16=False`` (GRPOConfig defaults to bf16 autocast, even on CPU).

Correspondence (and the definitional differences found):

* ``advantages.grpo(r, eps)`` == TRL ``scale_rewards="group"``: both ``(r - mean) / (std + eps)``
  with the unbiased (G-1) std and eps added to the std, but TRL's eps is fixed at ``1e-4``
  (grpo_trainer.py:2787) while ours defaults to ``1e-6``; the test passes ``eps=1e-4``.
  ``advantages.dr_grpo`` == TRL ``scale_rewards="none"`` (no eps involved).
* ``ppo_clip_loss(..., n_tokens_global=None)`` (sum over masked tokens / tokens of this call) ==
  TRL ``loss_type="bnpo"``. ``ppo_clip_loss(..., n_tokens_global=N)`` with N the policy tokens of
  the whole optimizer step == TRL ``loss_type="dapo"`` (normalizer ``num_items_in_batch`` = tokens
  of the generation batch, grpo_trainer.py:2498, rescaled by grad-accum / steps_per_generation);
  checked with the batch split into two micro-batches; "dapo" is TRL 1.16.0's default loss_type.
  TRL's ``loss_type="grpo"`` (per-sequence mean, then mean over sequences) is NOT our aggregation
  and is not compared (``"dr_grpo"``, normalizer B * max_completion_length, is not compared either).
* Our ``dual_clip=c`` (Ye et al.: for A<0, loss = min(loss, -c*A)) and TRL's ``delta=c``
  (INTELLECT-2 two-sided clipping: ratio clamped at c inside the unclipped branch) are written
  differently but give the same loss and gradient whenever ``c >= 1 + clip_high`` (TRL only
  recommends ``delta > 1 + epsilon``): for A<0 both are |A|*max(min(r, c), clip(r)); for A>0 the
  clamp never binds. With 1 + epsilon < delta < 1 + epsilon_high the two would differ.
* Ours clamps the log-ratio to +-20 before ``exp`` and zeroes it off-mask; TRL does neither (it
  multiplies by the mask afterwards). The inputs here stay far inside +-20, where both agree.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is flagged experimental

import trl  # noqa: E402  (hard dependency: the test must fail, not skip, without TRL)
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from agentrl.algos.advantages import dr_grpo, grouped, grpo  # noqa: E402
from agentrl.algos.losses import ppo_clip_loss  # noqa: E402
from agentrl.engines.hf_policy import token_logprobs  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = REPO / "agentrl" / "assets" / "tiny-agent"
CITED_TRL_VERSION = "1.16.0"  # the line numbers above refer to this version

N_GROUPS, G = 4, 4  # 16 episodes
CLIP_LOW, CLIP_HIGH = 0.2, 0.28
TRL_ADV_EPS = 1e-4  # hard-coded in TRL (grpo_trainer.py:2787)
TOL = dict(rtol=1e-6, atol=1e-6)


def _rewards() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    r = torch.rand(N_GROUPS, G, generator=gen)
    r[1] = 0.5  # a group with all-equal rewards -> zero advantage (TRL: std 0, 0 / 1e-4)
    r[2] = torch.tensor([1.0, 0.0, 0.0, 1.0])  # binary pass/fail group
    return r.flatten()


def _token_ids(vocab: int):
    """Prompts of different lengths (TRL left-pads them) and completions of different lengths
    (right-padded: masks with padding), random non-special token ids."""
    gen = torch.Generator().manual_seed(2)
    prompt_lens = [3, 5, 4, 6]
    prompts, completions = [], []
    for g in range(N_GROUPS):
        p = torch.randint(3, vocab, (prompt_lens[g],), generator=gen).tolist()
        for _ in range(G):
            n = int(torch.randint(2, 9, (1,), generator=gen))
            prompts.append(p)
            completions.append(torch.randint(3, vocab, (n,), generator=gen).tolist())
    return prompts, completions


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True,
    )
    m = Qwen2ForCausalLM(cfg).float()
    m.train()  # TRL's _compute_loss takes the "train" normalization path; dropout is 0 in Qwen2
    return m


def _make_trainer(model, tokenizer, tmp_path, *, loss_type="bnpo", delta=None, scale_rewards="group", grad_accum=1):
    rewards = _rewards().tolist()
    prompts_ids, completion_ids = _token_ids(len(tokenizer))

    def rollout_func(prompts, trainer):  # replaces generation (GRPOTrainer._generate, grpo_trainer.py:2200)
        assert len(prompts) == len(completion_ids)
        return {"prompt_ids": prompts_ids, "completion_ids": completion_ids, "logprobs": None}

    def fixed_reward(prompts, completions, reward, **kwargs):  # the dataset column "reward"
        return list(reward)

    dataset = Dataset.from_dict({"prompt": [f"task {i // G}" for i in range(N_GROUPS * G)], "reward": rewards})
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=N_GROUPS * G // grad_accum,
        gradient_accumulation_steps=grad_accum,  # steps_per_generation defaults to this
        num_generations=G,
        max_completion_length=8,
        loss_type=loss_type,
        epsilon=CLIP_LOW,
        epsilon_high=CLIP_HIGH,
        delta=delta,
        beta=0.0,
        temperature=1.0,
        scale_rewards=scale_rewards,
        mask_truncated_completions=False,
        use_cpu=True,
        bf16=False,  # GRPOConfig defaults to bf16=True, i.e. bf16 autocast even on CPU; compare in fp32
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=fixed_reward, args=args, train_dataset=dataset,
        processing_class=tokenizer, rollout_func=rollout_func,
    )
    trainer.current_gradient_accumulation_steps = grad_accum  # set by Trainer's training loop normally
    batch = trainer._generate_and_score_completions(list(dataset))
    return trainer, batch, torch.tensor(rewards)


def test_trl_version_matches_cited():
    """The file:line citations in this module are for TRL 1.16.0; re-check them after an upgrade."""
    assert trl.__version__ == CITED_TRL_VERSION


@pytest.mark.parametrize(("scale_rewards", "ours"), [("group", lambda r: grpo(r, eps=TRL_ADV_EPS)), ("none", dr_grpo)])
def test_advantages_match_trl(model, tokenizer, tmp_path, scale_rewards, ours):
    _, batch, rewards = _make_trainer(model, tokenizer, tmp_path, scale_rewards=scale_rewards)
    group_ids = torch.arange(N_GROUPS).repeat_interleave(G)  # TRL groups are contiguous blocks of G
    expected = batch["advantages"]
    got = grouped(ours, rewards, group_ids)
    torch.testing.assert_close(got, expected, **TOL)
    assert torch.all(got[G : 2 * G] == 0)  # the all-equal group


def _old_logprobs(lp: torch.Tensor) -> torch.Tensor:
    """pi_old = pi_theta shifted by U(-0.7, 0.7) per token (ratio in [0.50, 2.01]); garbage on padding."""
    gen = torch.Generator().manual_seed(3)
    return (lp.detach() - (torch.rand(lp.shape, generator=gen) * 1.4 - 0.7)).float()


def _grads(model) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("delta", [None, 1.6])
@pytest.mark.parametrize("loss_type", ["bnpo", "dapo"])
def test_clipped_loss_matches_trl(model, tokenizer, tmp_path, loss_type, delta):
    grad_accum = 2 if loss_type == "dapo" else 1  # dapo: two micro-batches share the global token count
    trainer, batch, _ = _make_trainer(
        model, tokenizer, tmp_path, loss_type=loss_type, delta=delta, grad_accum=grad_accum
    )
    assert "old_per_token_logps" not in batch  # on-policy by default; we set a perturbed pi_old below

    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    n_prompt, n_comp = batch["prompt_ids"].shape[1], batch["completion_ids"].shape[1]
    mask = batch["completion_mask"]
    assert (mask == 0).any()  # padding present
    n_tokens_global = mask.sum()
    assert batch["num_items_in_batch"] == n_tokens_global

    with torch.no_grad():
        trl_lp, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attn, n_comp)
        our_lp = token_logprobs(model, input_ids, attn)[:, n_prompt:]
    m = mask.bool()
    torch.testing.assert_close(our_lp[m], trl_lp[m], **TOL)  # same pi_theta token log-probs
    old = _old_logprobs(our_lp)
    old[~m] = torch.randn(int((~m).sum()))  # padding values must not matter

    adv = batch["advantages"]
    ratio = torch.exp(our_lp - old)
    a = adv.unsqueeze(1).expand_as(ratio)
    assert ((ratio < 1 - CLIP_LOW) & (a < 0) & m).any() and ((ratio > 1 + CLIP_HIGH) & (a > 0) & m).any()
    assert ((ratio < 1 - CLIP_LOW) & (a > 0) & m).any() and ((ratio > 1 + CLIP_HIGH) & (a < 0) & m).any()
    if delta is not None:
        assert ((ratio > delta) & (a < 0) & m).any()  # the dual/two-sided clip binds somewhere

    micro = torch.arange(input_ids.shape[0]).chunk(grad_accum)
    trl_losses, our_losses = [], []

    # TRL: one _compute_loss per micro-batch, summed (loss_is_scaled_for_ga=True: Trainer backprops each as-is)
    model.zero_grad(set_to_none=False)
    for idx in micro:
        inputs = {k: (v[idx] if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in batch.items()}
        inputs["old_per_token_logps"] = old[idx]
        loss = trainer._compute_loss(model, inputs)
        loss.backward()
        trl_losses.append(loss.detach())
    trl_grads = _grads(model)
    trl_clip_frac = trainer._metrics["train"]["clip_ratio/region_mean"]

    model.zero_grad(set_to_none=False)
    our_clip_frac = []
    for idx in micro:
        lp = token_logprobs(model, input_ids[idx], attn[idx])[:, n_prompt:]
        loss, stats = ppo_clip_loss(
            lp, old[idx], adv[idx], mask[idx], clip_low=CLIP_LOW, clip_high=CLIP_HIGH, dual_clip=delta,
            n_tokens_global=n_tokens_global if loss_type == "dapo" else None,
        )
        loss.backward()
        our_losses.append(loss.detach())
        our_clip_frac.append(stats["clip_frac"].item())
    our_grads = _grads(model)
    model.zero_grad(set_to_none=True)

    torch.testing.assert_close(torch.stack(our_losses), torch.stack(trl_losses), **TOL)
    torch.testing.assert_close(sum(our_losses), sum(trl_losses), **TOL)
    assert our_clip_frac == pytest.approx(trl_clip_frac, abs=1e-6)
    for ours, ref in zip(our_grads, trl_grads):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
