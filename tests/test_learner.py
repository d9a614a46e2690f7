"""DeepSpeed learner and logprob helpers on a tiny random Qwen2 (CPU, gloo, world size 1).

The key check compares one DeepSpeed step (2 micro-batches, manual accumulation) under every ZeRO
stage with a plain-torch AdamW step on the whole batch: equal results mean the accumulation,
global-token normalization, clipping and the LR schedule are all wired as intended.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(__file__).resolve().parents[1] / ".cache" / "torch_extensions"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from plain_logprobs import plain_token_logprobs  # noqa: E402

from agentrl.algos.losses import ppo_clip_loss, truncated_is_weights  # noqa: E402
from agentrl.config.schema import AlgoConfig, LearnerConfig  # noqa: E402
from agentrl.engines.hf_policy import pad_batch, token_logprobs  # noqa: E402

pytestmark = pytest.mark.integration

LR, CAP = 1e-3, 2.0
ADV = [1.0, -1.0, 1.0, -1.0]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, tie_word_embeddings=True, max_position_embeddings=128,
    )
    path = tmp_path_factory.mktemp("tiny_qwen2")
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return str(path)


def _load(model_dir: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def batch(model_dir) -> dict:
    """4 sequences of different lengths; 4 prompt tokens, the rest policy tokens; rollout
    logprobs = true logprobs - 0.1 so the truncated IS weights (e^0.1) are not trivially 1."""
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (12, 9, 15, 7)]
    mask = [[0] * 4 + [1] * (len(s) - 4) for s in seqs]
    ids, attn = pad_batch(seqs, 0)
    with torch.no_grad():
        lp0 = token_logprobs(_load(model_dir), ids, attn)
    roll = [[(float(lp0[i, t]) - 0.1) * m for t, m in enumerate(mk)] for i, mk in enumerate(mask)]
    adv = [[a * m for m in mk] for a, mk in zip(ADV, mask)]
    return {"input_ids": seqs, "response_mask": mask, "rollout_logprobs": roll, "advantages": adv}


def _padded(batch: dict) -> tuple[torch.Tensor, ...]:
    """(ids, attn, bool mask, rollout logprobs, advantages) of the batch, right-padded."""
    ids, attn, mask, roll, adv = pad_batch(
        batch["input_ids"], 0, batch["response_mask"], batch["rollout_logprobs"], batch["advantages"]
    )
    return ids, attn, mask.bool(), roll, adv


def _adamw_step(model, opt, loss: torch.Tensor) -> None:
    """One plain-torch step as the learner takes it: clip the gradient norm at 1, AdamW."""
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def _assert_logprobs_equal(after: list[list[float]], expect: torch.Tensor) -> None:
    for i, lp in enumerate(after):
        torch.testing.assert_close(torch.tensor(lp), expect[i, : len(lp)], atol=2e-4, rtol=0)


@pytest.fixture(scope="module")
def reference_after_step(model_dir, batch) -> torch.Tensor:
    """Token logprobs after one plain-torch AdamW step on the whole batch (no DeepSpeed)."""
    model = _load(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    ids, attn, mask, roll, adv = _padded(batch)
    lp, _ = plain_token_logprobs(model, ids, attn)  # full logits, plain autograd
    w = truncated_is_weights(lp.detach(), roll, CAP)
    loss, _ = ppo_clip_loss(lp, lp.detach(), adv, mask, is_weights=w, n_tokens_global=mask.sum())
    _adamw_step(model, opt, loss)  # KL to the (identical) reference has zero gradient on the first step
    with torch.no_grad():
        return plain_token_logprobs(model, ids, attn)[0]


def _summed(lps, masks) -> list[float]:
    return [sum(x * m for x, m in zip(lp, mk)) for lp, mk in zip(lps, masks)]


def test_token_logprobs_match_naive(model_dir):
    model = _load(model_dir)
    seqs = [[5, 17, 42, 7, 99, 3], [8, 250, 1], [4, 4, 4, 4, 4, 4, 4, 4]]
    ids, attn = pad_batch(seqs, 0)
    with torch.no_grad():
        got = token_logprobs(model, ids, attn)
        chunked, ent = token_logprobs(model, ids, attn, with_entropy=True, max_logit_elements=300 * 3 * 2)
        for i, s in enumerate(seqs):
            assert got[i, 0] == 0 and torch.all(got[i, len(s):] == 0)
            logits = model(torch.tensor([s])).logits[0].float().log_softmax(-1)
            for t in range(1, len(s)):
                assert got[i, t].item() == pytest.approx(logits[t - 1, s[t]].item(), abs=1e-5)
                expect_ent = -(logits[t - 1].exp() * logits[t - 1]).sum().item()
                assert ent[i, t].item() == pytest.approx(expect_ent, abs=1e-4)
    torch.testing.assert_close(chunked, got)


def test_chunked_logprobs_gradients_match(model_dir):
    """Chunking + activation checkpointing must not change gradients."""
    seqs = [[5, 17, 42, 7, 99, 3], [8, 250, 1]]
    ids, attn = pad_batch(seqs, 0)
    grads = []
    for max_el in (1 << 26, 300 * 2 * 2):
        model = _load(model_dir)
        token_logprobs(model, ids, attn, max_logit_elements=max_el).sum().backward()
        grads.append(model.model.embed_tokens.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_pad_batch_rejects_misaligned_lists():
    ids, attn, m = pad_batch([[1, 2, 3], [4]], 9, [[0, 1, 1], [1]])
    assert ids.tolist() == [[1, 2, 3], [4, 9, 9]] and attn.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert m.dtype == torch.float32 and m.tolist() == [[0, 1, 1], [1, 0, 0]]
    with pytest.raises(ValueError):
        pad_batch([[1, 2, 3]], 0, [[1, 1]])


@pytest.fixture(scope="module", params=[0, 1, 2, 3], ids=lambda s: f"zero{s}")
def learner(request, model_dir):
    from agentrl.engines.deepspeed_learner import DeepSpeedLearner

    lcfg = LearnerConfig(zero_stage=request.param, lr=LR, micro_batch_size=2, grad_clip=1.0)
    learner = DeepSpeedLearner(model_dir, lcfg, AlgoConfig(kl_coef=0.01, tis_cap=CAP), "float32", seed=0)
    yield learner
    learner.close()


def test_train_step_matches_plain_torch(learner, batch, reference_after_step):
    before = learner.compute_logprobs(batch["input_ids"])
    metrics = learner.train_step(batch)
    after = learner.compute_logprobs(batch["input_ids"])

    for key in ("loss", "pg_loss", "kl", "grad_norm", "lr", "logprob_mismatch", "is_weight_mean"):
        assert torch.isfinite(torch.tensor(metrics[key])), (key, metrics)
    assert metrics["tokens"] == sum(map(sum, batch["response_mask"]))
    assert metrics["logprob_mismatch"] == pytest.approx(0.1, abs=1e-4)
    assert metrics["is_weight_mean"] == pytest.approx(torch.exp(torch.tensor(0.1)).item(), abs=1e-4)
    assert metrics["lr"] == LR and learner.version == 1 and metrics["grad_norm"] > 1.0  # clipping active

    deltas = [a - b for a, b in zip(_summed(after, batch["response_mask"]), _summed(before, batch["response_mask"]))]
    assert all(d > 0 if a > 0 else d < 0 for d, a in zip(deltas, ADV)), deltas
    _assert_logprobs_equal(after, reference_after_step)


def test_tempered_learner_scores_the_sampling_distribution(model_dir, batch):
    """temperature=0.5: policy logprobs (and so the PPO ratio) are of softmax(logits / 0.5)."""
    from agentrl.engines.deepspeed_learner import DeepSpeedLearner

    learner = DeepSpeedLearner(model_dir, LearnerConfig(zero_stage=0, lr=LR, adam_eps=1e-4), AlgoConfig(kl_coef=0.0), "float32",
                               seed=0, temperature=0.5)
    try:
        assert learner.engine.basic_optimizer.param_groups[0]["eps"] == 1e-4  # learner.adam_eps reaches AdamW
        got = learner.compute_logprobs(batch["input_ids"])
    finally:
        learner.close()
    ids, attn = pad_batch(batch["input_ids"], 0)
    with torch.no_grad():
        logits = _load(model_dir)(ids, attention_mask=attn).logits[:, :-1].float()
        half = (logits / 0.5).log_softmax(-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        one = token_logprobs(_load(model_dir), ids, attn)
    for i, lp in enumerate(got):
        n = len(lp)
        torch.testing.assert_close(torch.tensor(lp[1:]), half[i, : n - 1], atol=1e-5, rtol=0)
        assert (torch.tensor(lp[1:]) - one[i, 1:n]).abs().max() > 1e-2
    with pytest.raises(ValueError, match="temperature must be > 0"):
        DeepSpeedLearner(model_dir, LearnerConfig(zero_stage=0), AlgoConfig(kl_coef=0.0), "float32", temperature=0.0)


def test_weights_blob_round_trip(learner, model_dir, batch):
    from safetensors.torch import load

    sd = load(learner.weights_blob())
    assert "lm_head.weight" not in sd and "model.embed_tokens.weight" in sd
    fresh = _load(model_dir)
    missing, unexpected = fresh.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    fresh.tie_weights()
    ids, attn = pad_batch(batch["input_ids"], 0)
    with torch.no_grad():
        expect = token_logprobs(fresh, ids, attn)
    got = learner.compute_logprobs(batch["input_ids"])
    for i, lp in enumerate(got):
        torch.testing.assert_close(torch.tensor(lp), expect[i, : len(lp)], atol=1e-5, rtol=0)


def test_the_weights_blob_is_in_the_engines_dtype(learner, monkeypatch):
    """bf16 engines (rollout.engine.dtype) get bf16 weights: the blob every engine process holds a
    copy of is half the size, and each weight is what the engine's own cast on load would give
    (copy_ into its bf16 parameter); non-float tensors keep their dtype."""
    from safetensors.torch import load

    from agentrl.weight_sync.object_store import weights_to_blob

    fp32 = learner.state_dict_for_inference()
    monkeypatch.setattr(learner, "sampler_dtype", "bfloat16")
    bf16 = load(learner.weights_blob())
    assert set(bf16) == set(fp32) and all(t.dtype == torch.bfloat16 for t in bf16.values())
    for k, t in fp32.items():
        engine_param = torch.empty_like(t, dtype=torch.bfloat16)
        engine_param.copy_(t)  # what vLLM's weight loaders do with an fp32 checkpoint tensor
        assert torch.equal(bf16[k], engine_param), k
    assert len(learner.weights_blob()) < 0.55 * len(weights_to_blob(fp32))
    mixed = load(weights_to_blob({"w": torch.ones(2), "ids": torch.arange(3)}, "bfloat16"))
    assert mixed["w"].dtype == torch.bfloat16 and mixed["ids"].dtype == torch.int64
    assert load(weights_to_blob({"w": torch.ones(2)}))["w"].dtype == torch.float32  # None: as it is


def test_ppo_epochs_bf16_and_save(model_dir, batch, tmp_path):
    """Two PPO epochs (pre-computed old logprobs, ratio moves off 1), bf16 weights, save.

    ZeRO-0 + bf16 uses DeepSpeed's FP16_UnfusedOptimizer, which takes a zero-gradient Adam step
    at init; the learner must undo it (Adam's step count = optimizer steps actually taken)."""
    from transformers import AutoModelForCausalLM

    from agentrl.engines.deepspeed_learner import DeepSpeedLearner

    lcfg = LearnerConfig(zero_stage=0, lr=LR, micro_batch_size=3, ppo_epochs=2, warmup_steps=4)
    learner = DeepSpeedLearner(model_dir, lcfg, AlgoConfig(kl_coef=0.0), "bfloat16", seed=0)
    try:
        m = learner.train_step(batch)
        assert m["lr"] == pytest.approx(LR / 4) and m["approx_kl"] > 0 and m["loss"] == m["pg_loss"]
        adam_steps = {float(st["step"]) for st in learner.engine.basic_optimizer.state.values()}
        assert adam_steps == {2.0}
        assert learner.train_step(batch)["lr"] == pytest.approx(LR * 3 / 4)  # 2 optimizer steps taken
        sd = learner.state_dict_for_inference()
        assert {t.dtype for t in sd.values()} == {torch.bfloat16}
        learner.save_pretrained(tmp_path / "ckpt")
        saved = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.bfloat16)
        torch.testing.assert_close(saved.model.embed_tokens.weight, sd["model.embed_tokens.weight"])
        empty = {k: [[0] * len(s) for s in batch["input_ids"]] if k != "input_ids" else v for k, v in batch.items()}
        assert learner.train_step(empty)["skipped"] == 1.0
    finally:
        learner.close()


def test_mini_batches_match_sequential_plain_torch_steps(model_dir, batch):
    """learner.mini_batches=2: two AdamW steps per train_step, each on a random half of the batch,
    normalized by that half's tokens; the second half's ratio uses the logprobs from before the
    first step (PPO's pi_old), not the moved policy. Equal to the same two steps in plain torch."""
    from agentrl.engines.deepspeed_learner import DeepSpeedLearner

    lcfg = LearnerConfig(zero_stage=1, lr=LR, micro_batch_size=1, mini_batches=2, grad_clip=1.0)
    learner = DeepSpeedLearner(model_dir, lcfg, AlgoConfig(kl_coef=0.0, tis_cap=CAP), "float32", seed=0)
    try:
        parts = learner._mini_batches(4)
        assert sorted(i for p in parts for i in p) == [0, 1, 2, 3] and all(len(p) == 2 for p in parts)
        assert parts == learner._mini_batches(4)  # seeded: a rerun splits the same way
        m = learner.train_step(batch)
        after = learner.compute_logprobs(batch["input_ids"])
        assert m["optimizer_steps"] == 2.0 and m["approx_kl"] > 0  # the 2nd half saw a moved policy
        assert {float(st["step"]) for st in learner.engine.basic_optimizer.state.values()} == {2.0}
    finally:
        learner.close()

    model = _load(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    ids, attn, mask, roll, adv = _padded(batch)
    with torch.no_grad():
        old = token_logprobs(model, ids, attn)
    for part in parts:
        lp = token_logprobs(model, ids[part], attn[part])
        w = truncated_is_weights(old[part], roll[part], CAP)
        loss, _ = ppo_clip_loss(lp, old[part], adv[part], mask[part], is_weights=w, n_tokens_global=mask[part].sum())
        _adamw_step(model, opt, loss)
    with torch.no_grad():
        _assert_logprobs_equal(after, token_logprobs(model, ids, attn))


def test_seq_mean_loss_matches_plain_torch(model_dir, batch):
    """algo.loss_agg=seq_mean_token_mean across micro-batches of 2: one step equals plain torch on
    the loss mean_i (1 / L_i) sum_t l_it."""
    from agentrl.engines.deepspeed_learner import DeepSpeedLearner

    lcfg = LearnerConfig(zero_stage=1, lr=LR, micro_batch_size=2, grad_clip=1.0)
    algo = AlgoConfig(kl_coef=0.0, tis_cap=CAP, loss_agg="seq_mean_token_mean")
    learner = DeepSpeedLearner(model_dir, lcfg, algo, "float32", seed=0)
    try:
        learner.train_step(batch)
        after = learner.compute_logprobs(batch["input_ids"])
    finally:
        learner.close()
    model = _load(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    ids, attn, mask, roll, adv = _padded(batch)
    lp = token_logprobs(model, ids, attn)
    w = truncated_is_weights(lp.detach(), roll, CAP)
    per_seq = [ppo_clip_loss(lp[i:i + 1], lp[i:i + 1].detach(), adv[i:i + 1], mask[i:i + 1], is_weights=w[i:i + 1])[0]
               for i in range(len(ids))]
    _adamw_step(model, opt, sum(per_seq) / len(per_seq))
    with torch.no_grad():
        _assert_logprobs_equal(after, token_logprobs(model, ids, attn))


def test_ppo_critic_learns_values_and_drives_the_policy(model_dir, batch):
    """advantage=ppo: token rewards -> critic values -> GAE -> policy step, and the critic's own
    DeepSpeed engine takes a step on the clipped value loss (its loss falls on a repeated batch)."""
    from agentrl.algos.critic import gae
    from agentrl.config.schema import CriticConfig
    from agentrl.engines.deepspeed_learner import DeepSpeedLearner

    algo = AlgoConfig(advantage="ppo", kl_coef=0.0, critic=CriticConfig(lr=1e-2, gamma=1.0, lam=1.0, whiten_advantages=False))
    learner = DeepSpeedLearner(model_dir, LearnerConfig(zero_stage=1, lr=LR, micro_batch_size=2), algo, "float32", seed=0)
    try:
        # reward +1 on the last token of sequences 0 and 2, -1 on 1 and 3 (like ADV)
        rewards = [[0.0] * (len(s) - 1) + [a] for s, a in zip(batch["input_ids"], ADV)]
        ppo_batch = {k: v for k, v in batch.items() if k != "advantages"} | {"token_rewards": rewards}
        ids, attn, mask, tr = pad_batch(batch["input_ids"], 0, batch["response_mask"], rewards)
        v0 = learner.critic.values(ids, attn)
        adv0, _ = gae(tr, v0, mask.bool(), 1.0, 1.0)
        before = learner.compute_logprobs(batch["input_ids"])
        first = learner.train_step(ppo_batch)
        after = learner.compute_logprobs(batch["input_ids"])
        assert {"critic/loss", "critic/value_mean", "critic/explained_var"} <= set(first)
        assert not torch.equal(learner.critic.values(ids, attn), v0)  # the critic stepped
        deltas = [a - b for a, b in zip(_summed(after, batch["response_mask"]), _summed(before, batch["response_mask"]))]
        # the policy follows the sign of the GAE advantage of each sequence's tokens
        signs = [float(adv0[i][mask[i].bool()].mean()) for i in range(len(ADV))]
        assert all(d > 0 if s > 0 else d < 0 for d, s in zip(deltas, signs)), (deltas, signs)
        losses = [first["critic/loss"]] + [learner.train_step(ppo_batch)["critic/loss"] for _ in range(3)]
        assert losses[-1] < losses[0], losses
    finally:
        learner.close()


def test_entropy_bonus_raises_entropy_with_zero_advantages(model_dir, batch):
    from agentrl.engines.deepspeed_learner import DeepSpeedLearner

    zero_adv = batch | {"advantages": [[0.0] * len(s) for s in batch["input_ids"]]}
    algo = AlgoConfig(kl_coef=0.0, entropy_coef=1.0)
    learner = DeepSpeedLearner(model_dir, LearnerConfig(zero_stage=0, lr=1e-2, micro_batch_size=4), algo, "float32", seed=0)
    try:
        m1 = learner.train_step(zero_adv)
        m2 = learner.train_step(zero_adv)
        assert m1["pg_loss"] == 0.0 and m1["entropy_bonus"] > 0
        assert m2["entropy"] > m1["entropy"]  # only the bonus moved the policy
    finally:
        learner.close()


def test_reference_logprobs_are_the_initial_policy(model_dir, batch):
    from agentrl.engines.deepspeed_learner import DeepSpeedLearner

    learner = DeepSpeedLearner(model_dir, LearnerConfig(zero_stage=0, lr=1e-2, micro_batch_size=4),
                               AlgoConfig(kl_coef=0.01, kl_in="reward"), "float32", seed=0)
    try:
        ref = learner.reference_logprobs(batch["input_ids"])
        for a, b in zip(ref, learner.compute_logprobs(batch["input_ids"])):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
        m = learner.train_step(batch)
        assert m["kl"] == 0.0  # KL is in the reward, not in the loss
        moved = learner.compute_logprobs(batch["input_ids"])
        assert learner.reference_logprobs(batch["input_ids"]) == ref and moved != ref
    finally:
        learner.close()


def test_a_single_rank_group_needs_no_port():
    """A 1-rank learner's process group rendezvouses in process (HashStore): with MASTER_PORT
    pointing at a port that is listening (as a parent's own group would be), it starts, and binds
    no chosen port (gloo's own listener takes whatever port the OS hands it). Run in a fresh
    interpreter: this one may hold a process group already."""
    import socket
    import subprocess
    import sys

    code = (
        "import torch, psutil, os\n"
        "from agentrl.engines.deepspeed_setup import init_process_group\n"
        "init_process_group()\n"
        "ports = {c.laddr.port for c in psutil.Process().net_connections() if c.status == 'LISTEN'}\n"
        "assert torch.distributed.get_world_size() == 1 and int(os.environ['BUSY']) not in ports\n"
        "print('ok')\n"
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        env = {**os.environ, "MASTER_PORT": str(busy.getsockname()[1]), "BUSY": str(busy.getsockname()[1])}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def _exact_rollout(model_dir, batch) -> dict:
    """``batch`` with rollout log-probs equal to the learner's own (a sampler at its weights and
    dtype), sampled by policy version 0."""
    ids, attn = pad_batch(batch["input_ids"], 0)
    with torch.no_grad():
        lp0 = plain_token_logprobs(_load(model_dir), ids, attn)[0]
    roll = [[float(lp0[i, t]) * m for t, m in enumerate(mk)] for i, mk in enumerate(batch["response_mask"])]
    return batch | {"rollout_logprobs": roll, "versions": [0] * len(roll)}


def test_old_logprobs_from_the_rollout_skip_the_pi_old_pass(model_dir, batch):
    """learner.old_logprobs: with two mini-batches, "auto" takes pi_old from a synchronous
    sampler's log-probs (one forward per micro-batch instead of two) and makes the update that
    "recompute" makes; it recomputes for stale episodes, explorer episodes or another dtype."""
    from agentrl.engines.deepspeed_learner import DeepSpeedLearner

    exact = _exact_rollout(model_dir, batch)
    results = {}
    for mode in ("recompute", "auto"):
        lcfg = LearnerConfig(zero_stage=1, lr=LR, micro_batch_size=2, mini_batches=2, old_logprobs=mode)
        learner = DeepSpeedLearner(model_dir, lcfg, AlgoConfig(kl_coef=0.0, tis_cap=CAP), "float32", seed=0)
        calls = []
        inner = learner.engine.module.forward
        learner.engine.module.forward = lambda *a, _calls=calls, _inner=inner, **k: _calls.append(1) or _inner(*a, **k)
        try:
            m = learner.train_step(exact)
            results[mode] = (m, len(calls), learner.compute_logprobs(batch["input_ids"]))
        finally:
            learner.close()
    (m_re, n_re, after_re), (m_auto, n_auto, after_auto) = results["recompute"], results["auto"]
    assert m_re["old_from_rollout"] == 0.0 and m_auto["old_from_rollout"] == 1.0
    assert (n_re, n_auto) == (4, 2)  # 2 micro-batches: pi_old pass + training forward, or the training forward alone
    assert m_auto["logprob_mismatch"] < 1e-5 and m_auto["entropy"] == pytest.approx(m_re["entropy"], rel=0.2)
    for a, b in zip(after_auto, after_re):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=2e-5, rtol=0)

    lcfg = LearnerConfig(zero_stage=0, lr=LR, micro_batch_size=2, mini_batches=2)
    learner = DeepSpeedLearner(model_dir, lcfg, AlgoConfig(kl_coef=0.0), "float32", seed=0, sampler_dtype="bfloat16")
    try:
        assert learner.train_step(exact)["old_from_rollout"] == 0.0  # the engines sample at another dtype
    finally:
        learner.close()
    learner = DeepSpeedLearner(model_dir, lcfg, AlgoConfig(kl_coef=0.0), "float32", seed=0)
    try:
        assert learner.train_step(exact | {"versions": [0, 0, 1, 0]})["old_from_rollout"] == 0.0  # one stale episode
        explorer = exact | {"versions": [1] * 4, "foreign": [False, True, False, False]}
        assert learner.train_step(explorer)["old_from_rollout"] == 0.0  # the explorer's log-probs are not pi_A's
        learner.learner_cfg = lcfg.model_copy(update={"old_logprobs": "rollout"})
        with pytest.raises(ValueError, match="learner.old_logprobs=rollout cannot score episodes another policy"):
            learner.train_step(explorer | {"versions": [2] * 4})
    finally:
        learner.close()
