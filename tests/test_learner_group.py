"""The learner group: N DeepSpeed ranks (gloo, Ray actors) compute the update one rank would.

Every check trains a group of 2 ranks and a group of 1 rank on the same step (the same group
refs) and compares what they return and hold: the step's metrics (loss, gradient norm) and the
updated weights, within fp32 tolerance (the ranks' gradients are summed in another order than
one rank's accumulation). The step has 2 mini-batches of uneven micro-batches, so the ranks run
empty micro-batches to stay in step. A 2-rank ZeRO-3 run is saved and restored into a new
group: every rank's shard restores (digests equal) and the next step is the same.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from agentrl.api import Episode, EpisodeGroup, GroupRef
from agentrl.config import Config
from agentrl.config.schema import AlgoConfig, CriticConfig, LearnerConfig, ModelConfig, RspoConfig
from agentrl.methods.rspo import EXPLORER

pytestmark = pytest.mark.integration

VOCAB, TOL = 300, 2e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, tie_word_embeddings=True, max_position_embeddings=128)
    path = tmp_path_factory.mktemp("group_qwen2")
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return str(path)


def _groups(n_groups: int = 3, size: int = 4, explorer: int = 0) -> list[EpisodeGroup]:
    """Random episodes of 10-40 tokens (4 prompt tokens), rewards that vary within each group;
    with ``explorer`` > 0 each task also has an explorer part of that many episodes (RSPO)."""
    rng = random.Random(7)
    groups = []
    for g in range(n_groups):
        for who, n in (("policy", size), (EXPLORER, explorer)):
            eps = []
            for k in range(n):
                length = rng.randint(10, 40)
                ids = [rng.randrange(VOCAB) for _ in range(length)]
                mask = [0] * 4 + [1] * (length - 4)
                eps.append(Episode(task_id=f"t{g}", token_ids=ids, response_mask=mask,
                                   logprobs=[-5.5 * m for m in mask], segments=[2 * m for m in mask], prompt_len=4,
                                   turn_passed=[bool(k % 2)], n_turns=1, policy=who,
                                   rewards={"outcome": float(k % 2), "progress": float(k % 2), "process": rng.random()}))
            if eps:
                groups.append(EpisodeGroup(f"t{g}", f"g{g}{who}", 0, eps, policy=who, mix_key=f"t{g}" if explorer else ""))
    return groups


def _refs(groups):
    import ray

    return [GroupRef(ray.put(g), g.version) for g in groups]


def _start(model_dir, lcfg, algo, ranks: int, rspo=None):
    from agentrl.learning.learner_group import LearnerGroup
    from agentrl.methods.rspo import RspoMethod

    cfg = Config(learner=lcfg.model_copy(update={"num_ranks": ranks}), algo=algo, **({"rspo": rspo} if rspo else {}))
    assert RspoMethod.enabled(cfg) == (rspo is not None)  # the learner builds the run's methods from its config
    group = LearnerGroup.create(cfg, model_dir)
    import ray

    assert ray.get(group.get_version.remote()) == 0
    return group


def _weights(group) -> dict[str, torch.Tensor]:
    import ray

    from agentrl.weight_sync.object_store import blob_to_state_dict

    return blob_to_state_dict(ray.get(ray.get(group.publish_weights.remote())[0]))


def _assert_same(a: dict, b: dict, keys=("loss", "pg_loss", "grad_norm", "tokens", "optimizer_steps")) -> None:
    for k in keys:
        assert a[k] == pytest.approx(b[k], rel=TOL, abs=1e-6), (k, a[k], b[k])


def _assert_same_weights(wa: dict, wb: dict, start: dict) -> None:
    """Per tensor, the two updates from ``start`` differ by < 1e-3 of the update's size. (Not
    element by element: AdamW divides each gradient by its own running scale, so an entry whose
    gradient is ~0 turns summation-order noise into a visible move. Gradient scale errors, which
    Adam would hide, show in the compared grad_norm.)"""
    assert wa.keys() == wb.keys() == start.keys()
    moved = 0.0
    for k in wa:
        step = (wb[k] - start[k]).norm()
        gap = (wa[k] - wb[k]).norm()
        assert gap <= 1e-3 * step + 1e-7, (k, float(gap), float(step))
        moved += float(step)
    assert moved > 0, "the step did not move the weights: the comparison would mean nothing"


LCFG = LearnerConfig(lr=1e-2, adam_eps=1e-4, micro_batch_size=3, mini_batches=2, zero_stage=1)


def test_the_group_has_exactly_the_calls_the_learner_declares():
    """Routing is declared once, on the LearnerActor method (``@group_call``): the group builds its
    calls from that table, and a name nobody declared is an AttributeError, not a call that
    silently reaches one rank."""
    from agentrl.learning.learner import ALL_RANKS, GROUP_CALLS, RANK0, RANK0_WITH_GATHERS, LearnerActor, group_call
    from agentrl.learning.learner_group import LearnerGroup

    group = LearnerGroup([])
    assert (group.train.route, group.train.combine) == (ALL_RANKS, "rank0")
    assert (group.save_parts.route, group.save_parts.combine) == (ALL_RANKS, "parts")
    assert group.nccl_endpoint.route == RANK0 and group.nccl_broadcast.route == RANK0_WITH_GATHERS
    with pytest.raises(AttributeError, match="no call 'trian'.*train"):
        group.trian  # noqa: B018 - the lookup is the test
    assert not hasattr(group, "rendezvous")  # one rank's start-up step, not a group call
    assert set(GROUP_CALLS) <= {m for m in dir(LearnerActor) if not m.startswith("_")}
    with pytest.raises(ValueError, match="unknown route"):
        group_call("every rank")



@pytest.fixture(scope="module")
def one_rank_step(model_dir, ray_cluster):
    """The reference: one rank, ZeRO-1 (equal to plain torch: tests/test_learner.py)."""
    import ray

    group = _start(model_dir, LCFG, AlgoConfig(kl_coef=0.01), 1)
    before = _weights(group)
    metrics = ray.get(group.train.remote(_refs(_groups())))
    after = _weights(group)
    group.kill()
    return before, metrics, after


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_two_ranks_make_the_one_rank_update(model_dir, ray_cluster, one_rank_step, stage):
    import ray

    before, metrics, after = one_rank_step
    group = _start(model_dir, LCFG.model_copy(update={"zero_stage": stage}), AlgoConfig(kl_coef=0.01), 2)
    try:
        m2 = ray.get(group.train.remote(_refs(_groups())))
        _assert_same(m2, metrics, keys=("loss", "pg_loss", "kl", "grad_norm", "tokens", "optimizer_steps", "clip_frac"))
        _assert_same_weights(_weights(group), after, before)
    finally:
        group.kill()


def test_two_ranks_with_packing_and_a_token_budget_make_the_one_rank_update(model_dir, ray_cluster, one_rank_step):
    """Packed micro-batches under a token budget (uneven counts per rank) change nothing either."""
    import ray

    before, metrics, after = one_rank_step
    lcfg = LCFG.model_copy(update={"zero_stage": 2, "packing": True, "max_tokens_per_micro_batch": 50,
                                   "gradient_checkpointing": True})
    group = _start(model_dir, lcfg, AlgoConfig(kl_coef=0.01), 2)
    try:
        _assert_same(ray.get(group.train.remote(_refs(_groups()))), metrics)
        _assert_same_weights(_weights(group), after, before)
    finally:
        group.kill()


def test_the_critic_and_the_explorer_train_across_ranks_as_on_one(model_dir, ray_cluster):
    """PPO (critic, GAE whitened over every rank's tokens) with RSPO's explorer derived on top:
    policy metrics and weights, critic metrics and the explorer's weights equal one rank's."""
    import ray

    from agentrl.weight_sync.object_store import blob_to_state_dict

    algo = AlgoConfig(advantage="ppo", kl_coef=0.0, critic=CriticConfig(lr=1e-3))
    rspo = RspoConfig(enabled=True, explorer_steps=2)
    lcfg = LCFG.model_copy(update={"mini_batches": 1})
    results = []
    for ranks in (1, 2):
        group = _start(model_dir, lcfg, algo, ranks, rspo=rspo)
        try:
            m = ray.get(group.train.remote(_refs(_groups(explorer=2))))
            explorer = blob_to_state_dict(ray.get(ray.get(group.publish_role_weights.remote(EXPLORER))[0]))
            results.append((m, _weights(group), explorer))
        finally:
            group.kill()
    (m1, w1, e1), (m2, w2, e2) = results
    _assert_same(m2, m1, keys=("loss", "grad_norm", "critic/loss", "critic/value_mean",
                               "rspo/kl_policy_explorer", "rspo/explorer_loss", "rspo/explorer_tokens"))
    from safetensors.torch import load_file

    _assert_same_weights(w2, w1, load_file(str(Path(model_dir) / "model.safetensors")))
    _assert_same_weights(e2, e1, w1)  # B is derived from the updated policy


def test_a_two_rank_zero3_checkpoint_restores_every_shard(model_dir, ray_cluster, tmp_path):
    """Save after one step, restore into a new 2-rank group: the merged digest (rank 0's state and
    each rank's optimizer partition and RNG) is equal, and the next step matches the original's.
    A group of another size is refused with both sizes named."""
    import ray

    lcfg = LCFG.model_copy(update={"zero_stage": 3})
    algo = AlgoConfig(kl_coef=0.0)
    ckpt = str(tmp_path / "learner")
    first = _start(model_dir, lcfg, algo, 2)
    try:
        ray.get(first.train.remote(_refs(_groups())))
        saved = ray.get(first.save_state.remote(ckpt))
        assert {"optimizer@rank1", "rng@rank1"} <= saved.keys()
        assert any("rank_1" in f for f in os.listdir(Path(ckpt) / "policy")), os.listdir(Path(ckpt) / "policy")
        w_saved = _weights(first)
        next_step = _refs(_groups(n_groups=2))
        m_first = ray.get(first.train.remote(next_step))
        w_first = _weights(first)
    finally:
        first.kill()
    second = _start(model_dir, lcfg, algo, 2)
    try:
        assert ray.get(second.load_state.remote(ckpt)) == saved
        _assert_same(ray.get(second.train.remote(next_step)), m_first)
        _assert_same_weights(_weights(second), w_first, w_saved)
    finally:
        second.kill()
    single = _start(model_dir, lcfg, algo, 1)
    try:
        with pytest.raises(Exception, match="learner.num_ranks=2"):
            ray.get(single.load_state.remote(ckpt))
    finally:
        single.kill()


def test_lora_trains_adapters_only_and_two_ranks_make_the_one_rank_update(model_dir, ray_cluster, tmp_path):
    """LoRA under ZeRO-3: the engines' (merged) weights move, two ranks make one rank's update
    (the KL reference is the policy with its adapters off), and the optimizer state a checkpoint
    holds is the adapters' alone."""
    import ray

    from agentrl.config.schema import LoraConfig

    lora = LoraConfig(rank=4, alpha=8.0)
    lcfg = LCFG.model_copy(update={"zero_stage": 3})
    from safetensors.torch import load_file

    start = load_file(str(Path(model_dir) / "model.safetensors"))
    results = []
    for ranks in (1, 2):
        from agentrl.learning.learner_group import LearnerGroup

        cfg = Config(model=ModelConfig(lora=lora), learner=lcfg.model_copy(update={"num_ranks": ranks}),
                     algo=AlgoConfig(kl_coef=0.01))
        group = LearnerGroup.create(cfg, model_dir)
        try:
            results.append((ray.get(group.train.remote(_refs(_groups()))), _weights(group)))
            if ranks == 2:
                ray.get(group.save_state.remote(str(tmp_path / "lora")))
        finally:
            group.kill()
    (m1, w1), (m2, w2) = results
    assert m1["kl"] > 0  # the adapters moved the policy away from the reference
    _assert_same(m2, m1, keys=("loss", "kl", "grad_norm", "tokens"))
    _assert_same_weights(w2, w1, start)
    # the ranks' fp32 partitions (and so Adam's state) hold the adapters: 2 x r x (in + out) per
    # adapted linear, here 4 x 2 layers x (q, k, v, o, gate, up, down), nothing of the base
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model_dir)
    kv = c.num_key_value_heads * c.hidden_size // c.num_attention_heads
    dims = [(c.hidden_size, c.hidden_size), (c.hidden_size, kv), (c.hidden_size, kv), (c.hidden_size, c.hidden_size),
            (c.hidden_size, c.intermediate_size), (c.hidden_size, c.intermediate_size), (c.intermediate_size, c.hidden_size)]
    adapters = c.num_hidden_layers * sum(lora.rank * (i + o) for i, o in dims)
    flat = sum(t.numel() for part in (tmp_path / "lora" / "policy").glob("*optim_states.pt")
               for t in torch.load(part, weights_only=False)["optimizer_state_dict"]["fp32_flat_groups"])
    assert adapters <= flat < adapters + 2 * 64, (flat, adapters)  # ZeRO pads each rank's partition
