"""RSPO without Ray: mixed groups, the reward swap, the explorer's batch and IS caps, the explorer's
derivation on a real model, and the config rules (hand-computed cases)."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos.batching import build_batch
from agentrl.algos.losses import PolicyLossConfig, foreign_caps, policy_loss
from agentrl.api import POLICY, Episode, EpisodeGroup
from agentrl.config import ConfigError, load_config
from agentrl.methods.rspo import EXPLORER
from agentrl.methods.rspo.groups import explorer_batch, merge_mixed_groups, policy_rewards, success_shares

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _episode(outcome: float, process: float, policy: str = POLICY, progress: float | None = None) -> Episode:
    """6 tokens: prompt [0, 2), a tool step [2, 4), an observation at 4, a summary token at 5."""
    return Episode("t", [1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 0, 1], [0.0, 0.0, -0.5, -0.5, 0.0, -0.5], [0, 0, 1, 1, 0, 2], 2,
                   [outcome == 1.0], 1, rewards={"outcome": outcome, "progress": outcome if progress is None else progress,
                                                 "process": process, "summary": outcome}, policy=policy,
                   step_spans=[[2, 4], [5, 6]], step_turns=[0, 0], step_states=["s0", "s1"])


def _mixed(process=(0.9, 0.1, 0.5, 0.7)) -> list[EpisodeGroup]:
    """One task: the policy's part (3 episodes, outcome 1, 0, 0) and the explorer's (1, outcome 1)."""
    a = EpisodeGroup("t", "t@v0#0", 0, [_episode(1.0, process[0]), _episode(0.0, process[1]), _episode(0.0, process[2])],
                     mix_key="0/0")
    b = EpisodeGroup("t", "t@v0#1/explorer", 0, [_episode(1.0, process[3], EXPLORER)], policy=EXPLORER, mix_key="0/0")
    return [b, a]  # arrival order does not matter


def _algo(*overrides: str):
    return load_config(None, ["algo.reward=outcome", *overrides]).algo


def test_merge_puts_both_parts_of_a_task_in_one_group_policy_first():
    merged = merge_mixed_groups(_mixed() + [EpisodeGroup("u", "u@v0#0", 0, [_episode(0.0, 0.2)], mix_key="0/1")])
    assert [len(g.episodes) for g in merged] == [4, 1]
    assert [e.policy for e in merged[0].episodes] == [POLICY, POLICY, POLICY, EXPLORER]
    assert merged[0].group_id == "t@v0#0" and merged[0].policy == POLICY
    other = EpisodeGroup("v", "v@v0#0", 0, [_episode(0.0, 0.2)], mix_key="0/0")
    with pytest.raises(ValueError, match="different tasks"):
        merge_mixed_groups(_mixed() + [other])


def test_an_explorer_part_without_its_policy_part_is_left_out():
    """A task whose policy part was lost (quarantined after its worker died twice, or every one of
    A's episodes failed its environment) leaves B's part alone: the method drops it (counted)
    instead of training A on a baseline of B's episodes only. The converse, A's part without B's,
    is kept: A's update needs no episode of B."""
    from agentrl.config import Config
    from agentrl.config.schema import RspoConfig
    from agentrl.methods.rspo import RspoMethod

    lone = EpisodeGroup("u", "u@v0#1/explorer", 0, [_episode(1.0, 0.9, EXPLORER), _episode(0.0, 0.2, EXPLORER)],
                        policy=EXPLORER, mix_key="1/0")
    method = RspoMethod(Config(algo=_algo(), rspo=RspoConfig(enabled=True)))
    policy_only = EpisodeGroup("w", "w@v0#0", 0, [_episode(1.0, 0.9), _episode(0.0, 0.2)], mix_key="2/0")
    groups, metrics = method.regroup([*_mixed(), lone, policy_only])
    assert [g.task_id for g in groups] == ["t", "w"] and [len(g.episodes) for g in groups] == [4, 2]
    assert metrics["rspo/explorer_only_groups_dropped"] == 1.0
    assert metrics["rspo/explorer_success_share"] == pytest.approx(1 / 3)  # the kept groups': 1 of their 3 successes
    assert method.regroup(_mixed())[1]["rspo/explorer_only_groups_dropped"] == 0.0


def test_mixed_group_advantages_with_swapped_rewards_by_hand():
    """GRPO over the union on the outcome: r = (1, 0, 0, 1), mean 1/2, unbiased std sqrt(1/3):
    A = +-(1/2) / sqrt(1/3) = +-0.8660 on every policy token, the explorer's row flagged."""
    groups = policy_rewards(merge_mixed_groups(_mixed()), "outcome", "process", swap=True)
    batch, stats = build_batch(groups, _algo())
    a = math.sqrt(3) / 2
    expected = [[0, 0, s, s, 0, s] for s in (a, -a, -a, a)]
    assert [[round(x, 4) for x in row] for row in batch.advantages] == [[round(x, 4) for x in r] for r in expected]
    assert batch.foreign == [False, False, False, True] and stats["groups_with_signal"] == 1.0


@pytest.mark.parametrize("advantage", ["grpo", "rloo", "slca", "gigpo"])
def test_the_process_reward_never_reaches_the_policy_update(advantage):
    """Same episodes, different process rewards: identical batch (so identical gradient), for
    an estimator that reads the process score (slca) too; the ablation (swap false) differs."""
    algo = _algo(f"algo.advantage={advantage}")
    one = build_batch(policy_rewards(merge_mixed_groups(_mixed((0.9, 0.1, 0.5, 0.7))), "outcome", "process", True), algo)[0]
    two = build_batch(policy_rewards(merge_mixed_groups(_mixed((0.0, 1.0, 0.2, 0.3))), "outcome", "process", True), algo)[0]
    assert one == two
    if advantage in ("grpo", "rloo"):  # swap=false is refused for estimators that read per-turn verdicts
        ab1 = build_batch(policy_rewards(merge_mixed_groups(_mixed((0.9, 0.1, 0.5, 0.7))), "outcome", "process", False), algo)[0]
        ab2 = build_batch(policy_rewards(merge_mixed_groups(_mixed((0.0, 1.0, 0.2, 0.3))), "outcome", "process", False), algo)[0]
        assert ab1 != ab2


def test_policy_gradient_identical_under_changed_process_rewards(tiny_model_dir):
    """The gradient of the real policy loss on the tiny model, from the batches of two process
    rewards: equal with the swap, different without it."""
    from transformers import AutoModelForCausalLM

    from agentrl.engines.hf_policy import token_logprobs
    from agentrl.engines.micro_batch import pad_micro_batch

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()

    def grad(process, swap):
        batch = build_batch(policy_rewards(merge_mixed_groups(_mixed(process)), "outcome", "process", swap), _algo())[0]
        m = pad_micro_batch(batch, list(range(len(batch))), 0)
        model.zero_grad()
        lp = token_logprobs(model, m.input_ids, m.attention_mask)
        loss, _ = policy_loss(lp, lp.detach(), m.advantages, m.response_mask, PolicyLossConfig(foreign_is_cap=1.5),
                              rollout_logprobs=m.rollout_logprobs, foreign_rows=m.foreign_rows)
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    first = grad((0.9, 0.1, 0.5, 0.7), swap=True)
    assert first.abs().sum() > 0
    assert torch.equal(first, grad((0.0, 1.0, 0.2, 0.3), swap=True))
    assert not torch.equal(grad((0.9, 0.1, 0.5, 0.7), swap=False), grad((0.0, 1.0, 0.2, 0.3), swap=False))


def test_is_cap_of_the_explorer_applies_to_its_rows_only():
    """pi_old / pi_rollout = e^1 on every token; advantages 1 and pi = pi_old, so each token's loss
    is -w_t: min(e, tis_cap = 2) on the policy's row, min(e, rspo.is_cap = 1.5) on the explorer's."""
    lp = torch.zeros(2, 3)
    rollout = torch.full((2, 3), -1.0)
    mask = torch.ones(2, 3, dtype=torch.bool)
    rows = torch.tensor([False, True])
    cfg = PolicyLossConfig(tis_cap=2.0, foreign_is_cap=1.5)
    for r, w in ((0, 2.0), (1, 1.5)):
        row_mask = mask.clone()
        row_mask[1 - r] = False
        loss, _ = policy_loss(lp, lp, torch.ones(2, 3), row_mask, cfg, rollout_logprobs=rollout, foreign_rows=rows)
        assert float(loss) == pytest.approx(-w)
    assert foreign_caps(rows, 2.0, 1.5).tolist() == [[2.0], [1.5]]
    # no explorer rows: tis_cap everywhere
    loss, _ = policy_loss(lp, lp, torch.ones(2, 3), mask, cfg, rollout_logprobs=rollout)
    assert float(loss) == pytest.approx(-2.0)


def test_explorer_batch_is_grpo_of_the_process_reward_over_the_policy_episodes():
    """Process (0.9, 0.1, 0.5) over the policy's three episodes: mean 0.5, std 0.4 -> A = 1, -1, 0;
    the explorer's episode is not in it."""
    batch = explorer_batch(merge_mixed_groups(_mixed()), "process")
    assert len(batch) == 3 and batch.foreign is None
    assert [round(row[2], 4) for row in batch.advantages] == [1.0, -1.0, 0.0]
    assert all(row[0] == row[1] == row[4] == 0 for row in batch.advantages)
    lone = [EpisodeGroup("t", "g", 0, [_episode(1.0, 0.2)])]
    assert explorer_batch(lone, "process") is None  # no baseline with one episode


def test_success_shares():
    m = success_shares(merge_mixed_groups(_mixed()))
    assert m["rspo/policy_success"] == pytest.approx(1 / 3) and m["rspo/explorer_success"] == 1.0
    assert m["rspo/explorer_success_share"] == pytest.approx(0.5)
    assert m["rspo/policy_process"] == pytest.approx(0.5) and m["rspo/explorer_process"] == pytest.approx(0.7)


@pytest.mark.parametrize(("overrides", "says"), [
    (["rollout.group_size=2"], "at least 2"),
    (["algo.reward=progress", "rspo.process_reward=progress"], "also algo.reward"),
    (["rspo.swap=false", "algo.advantage=gigpo"], "per-turn verdicts"),
    (["train.async_rollouts=true", "buffer.max_staleness=1"], "async_rollouts"),
    (["learner.zero_stage=3"], "zero_stage"),
])
def test_config_refuses_undefined_combinations(overrides, says):
    with pytest.raises(ConfigError, match=says):
        load_config(None, ["rspo.enabled=true", "algo.reward=outcome", *overrides])
    cfg = load_config(None, ["rspo.enabled=true", "algo.reward=outcome", "rollout.group_size=8"])
    assert cfg.rspo.explorer_fraction == 0.25 and cfg.rspo.swap


def test_derivation_moves_the_explorer_and_leaves_the_policy(tiny_model_dir):
    """The explorer starts as A and moves on a batch with a signal; A's weights are untouched; a
    batch without a signal leaves B = A (AdamW without weight decay and zero gradients)."""
    from transformers import AutoModelForCausalLM

    from agentrl.methods.rspo.explorer import Explorer

    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    explorer = Explorer(lr=1e-2, steps=2, grad_clip=1.0, micro_batch_size=2, temperature=1.0,
                        loss_cfg=PolicyLossConfig(kl_coef=0.0), tied_embeddings=False)
    groups = merge_mixed_groups(_mixed())
    m = explorer.derive(policy, explorer_batch(groups, "process"), pad_id=0, device="cpu")
    assert m["rspo/kl_policy_explorer"] > 0 and m["rspo/explorer_tokens"] == 9
    assert all(torch.equal(v, policy.state_dict()[k]) for k, v in before.items())
    assert any(not torch.equal(v, before[k]) for k, v in explorer.state_dict_for_inference().items())
    flat = merge_mixed_groups(_mixed((0.5, 0.5, 0.5, 0.5)))
    m = explorer.derive(policy, explorer_batch(flat, "process"), pad_id=0, device="cpu")
    assert m["rspo/kl_policy_explorer"] == pytest.approx(0.0, abs=1e-9)
    assert all(torch.equal(v, before[k]) for k, v in explorer.state_dict_for_inference().items())


def test_kl_every_measures_the_kl_on_every_nth_derivation_and_leaves_the_explorer_as_it_is(tiny_model_dir):
    """rspo.kl_every = 2: the KL is reported on derivations 1 and 3, not 2; B's weights are those
    of kl_every = 1 (the KL is a metric, not part of the derivation)."""
    from transformers import AutoModelForCausalLM

    from agentrl.methods.rspo.explorer import Explorer

    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    batch = explorer_batch(merge_mixed_groups(_mixed()), "process")

    def explorer(kl_every: int) -> Explorer:
        return Explorer(lr=1e-2, steps=1, grad_clip=1.0, micro_batch_size=2, temperature=1.0,
                        loss_cfg=PolicyLossConfig(kl_coef=0.0), tied_embeddings=False, kl_every=kl_every)

    sparse, dense = explorer(2), explorer(1)
    measured = ["rspo/kl_policy_explorer" in sparse.derive(policy, batch, pad_id=0, device="cpu") for _ in range(3)]
    assert measured == [True, False, True]
    dense.derive(policy, batch, pad_id=0, device="cpu")
    a, b = sparse.state_dict_for_inference(), dense.state_dict_for_inference()
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert load_config(None, ["rspo.kl_every=4"]).rspo.kl_every == 4
    with pytest.raises(ConfigError, match="rspo.kl_every"):
        load_config(None, ["rspo.kl_every=0"])


def test_the_learner_derives_the_explorer_without_touching_the_policy(tiny_model_dir):
    """On the DeepSpeed learner: A's update weighs B's rows with rspo.is_cap (reported as
    foreign_is_weight_mean); the derivation afterwards leaves A's weights, Adam state and LR
    schedule exactly as they were."""
    from agentrl.config import Config
    from agentrl.config.schema import LearnerConfig, RspoConfig
    from agentrl.engines.deepspeed_learner import DeepSpeedLearner
    from agentrl.methods.rspo import RspoMethod

    rspo = RspoConfig(enabled=True, explorer_lr=1e-2, is_cap=1.5)
    algo = _algo("algo.kl_coef=0.0")
    learner = DeepSpeedLearner(str(tiny_model_dir), LearnerConfig(zero_stage=1, lr=1e-3, micro_batch_size=2),
                               algo, "float32", seed=0, methods=[RspoMethod(Config(algo=algo, rspo=rspo))])
    part = learner.parts["rspo"]
    try:
        groups = policy_rewards(merge_mixed_groups(_mixed()), "outcome", "process", swap=True)
        m = learner.train_step(build_batch(groups, _algo())[0])
        assert 0 < m["foreign_is_weight_mean"] <= 1.5 and m["foreign_tokens_trained"] == 3
        params = {k: v.detach().clone() for k, v in learner.hf_model.state_dict().items()}
        state = learner.engine.basic_optimizer.state  # torch AdamW's own state (ZeRO keeps it per partition)
        adam = {id(p): {k: v.clone() if torch.is_tensor(v) else v for k, v in st.items()} for p, st in state.items()}
        assert adam
        lr = learner.engine.get_lr()
        d = part.derive(explorer_batch(groups, "process"))
        assert d["rspo/kl_policy_explorer"] > 0
        assert all(torch.equal(v, learner.hf_model.state_dict()[k]) for k, v in params.items())
        after = {id(p): st for p, st in learner.engine.basic_optimizer.state.items()}
        assert after.keys() == adam.keys()
        assert all(torch.equal(after[i][k], v) if torch.is_tensor(v) else after[i][k] == v
                   for i, s in adam.items() for k, v in s.items())
        assert learner.engine.get_lr() == lr
        lp_b = part.logprobs([groups[0].episodes[0].token_ids])[0]
        lp_a = learner.compute_logprobs([groups[0].episodes[0].token_ids])[0]
        assert max(abs(a - b) for a, b in zip(lp_a[2:], lp_b[2:])) > 1e-4  # B moved away from A
        from safetensors.torch import load

        assert {t.dtype for t in load(part.weights_blob()).values()} == {torch.float32}
        learner.sampler_dtype = "bfloat16"  # B's engines run at the policy's engines' dtype
        b_bf16 = load(part.weights_blob())
        assert {t.dtype for t in b_bf16.values()} == {torch.bfloat16}
        b_fp32 = part.explorer.state_dict_for_inference()
        assert all(torch.equal(b_bf16[k], v.to(torch.bfloat16)) for k, v in b_fp32.items())
    finally:
        learner.close()


def test_the_explorer_computes_at_the_learners_precision_and_recomputes_its_layers(tiny_model_dir):
    """learner.gradient_checkpointing: B's decoder layers run once more per micro-batch (the
    recompute in backward), also when B is restored from a checkpoint, and B ends where it would
    without; bf16 compute (learner.autocast, else model.dtype): B's decoder matmuls run in bf16, in
    the derivation and in its log-probs, while its weights stay fp32. The learner's part hands B
    the learner's checkpointing and its compute dtype when that is bf16; fp16 (an fp16 model.dtype)
    leaves B in fp32, which has no loss scaler for fp16's range."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM
    from transformers.modeling_layers import GradientCheckpointingLayer

    from agentrl.config.schema import LearnerConfig, RspoConfig
    from agentrl.engines.policy_logprobs import check_autocast_supported
    from agentrl.methods.rspo.explorer import Explorer
    from agentrl.methods.rspo.part import ExplorerPart

    for compute, autocast, ckpt, expected in (("bfloat16", "bfloat16", True, "bfloat16"), ("bfloat16", None, False, "bfloat16"),
                                              ("float32", None, True, None), ("float16", None, False, None)):
        learner = SimpleNamespace(learner_cfg=LearnerConfig(autocast=autocast, gradient_checkpointing=ckpt),
                                  compute_dtype=compute, temperature=1.0, loss_cfg=PolicyLossConfig(),
                                  tied_embeddings=False)
        part = ExplorerPart(learner, RspoConfig(enabled=True))
        assert (part.explorer.autocast, part.explorer.gradient_checkpointing) == (expected, ckpt)

    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    batch = explorer_batch(merge_mixed_groups(_mixed()), "process")
    micro_batches = math.ceil(len(batch) / 2)

    def explorer(**precision) -> Explorer:
        return Explorer(lr=1e-2, steps=1, grad_clip=1.0, micro_batch_size=2, temperature=1.0,
                        loss_cfg=PolicyLossConfig(kl_coef=0.0), tied_embeddings=False, **precision)

    def watch(b: Explorer) -> tuple[list, set]:
        """Calls of B's first decoder layer, and the dtypes B's decoder Linears output (the
        vocabulary head runs through the fused log-prob head, not its module's forward)."""
        layers = [m for m in b.model.modules() if isinstance(m, GradientCheckpointingLayer)]
        calls, dtypes = [0], set()
        # a pre-hook: the recompute in backward stops once it has what backward needs, before a forward hook would run
        layers[0].register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        for m in b.model.modules():
            if isinstance(m, torch.nn.Linear):
                m.register_forward_hook(lambda _m, _i, out: dtypes.add(out.dtype))
        return calls, dtypes

    def derive(**precision) -> tuple[Explorer, int, set]:
        b = explorer(**precision)
        b._build(policy)
        calls, dtypes = watch(b)
        b.derive(policy, batch, pad_id=0, device="cpu")  # the derivation and its KL pass
        return b, calls[0], dtypes

    plain, plain_calls, plain_dtypes = derive()
    ckpt, ckpt_calls, _ = derive(gradient_checkpointing=True)
    assert plain_calls == 2 * micro_batches and ckpt_calls == 3 * micro_batches
    a, b = plain.state_dict_for_inference(), ckpt.state_dict_for_inference()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert plain_dtypes == {torch.float32}
    restored = explorer(gradient_checkpointing=True)
    restored.load_state_dict(ckpt.state_dict(), policy)  # a resumed run's B
    calls, _ = watch(restored)
    restored.derive(policy, batch, pad_id=0, device="cpu")
    assert calls[0] == 3 * micro_batches
    try:
        check_autocast_supported("bfloat16", torch.device("cpu"))
    except ValueError as e:
        pytest.skip(str(e))
    bf16, _, bf16_dtypes = derive(autocast="bfloat16", gradient_checkpointing=True)
    assert bf16_dtypes == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
    _, dtypes = watch(bf16)
    lp = bf16.logprobs([batch.input_ids[0]], pad_id=0, device="cpu")[0]
    assert dtypes == {torch.bfloat16} and len(lp) == len(batch.input_ids[0])
