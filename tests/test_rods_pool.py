"""RODS active pool lifecycle (pure Python, no Ray) and builtin resample synthesis."""

from __future__ import annotations

import json

import pytest

from agentrl.config.schema import RodsConfig
from agentrl.envs.builtin.generator import builtin_split
from agentrl.envs.checker import check_turn, gold_replay
from agentrl.envs.registry import make_backend
from agentrl.rods.pool import ActivePool
from agentrl.rods.resample import BuiltinResampler, ResampleSynthesizer
from agentrl.rods.signature import skill_signature
from agentrl.rods.synthesizer import accept_variant
from agentrl.tasks.schema import text_key


@pytest.fixture(scope="module")
def seeds():
    return builtin_split("train")[:20]


@pytest.fixture(scope="module")
def variants(seeds):
    """Two resampled variants of each of the first 6 seeds (those that got any)."""
    r = BuiltinResampler()
    return {s.id: r.synthesize(s, 2, 7).tasks for s in seeds[:6]}


def _pool(seeds, events=None, **overrides):
    cfg = RodsConfig(enabled=True, **overrides)
    return ActivePool(seeds, cfg, tasks_per_step=4, log=(events.append if events is not None else None))


# ---------------------------------------------------------------------------- resample synthesis
def test_resample_keeps_the_signature_and_changes_the_values(seeds, variants):
    made = [v for vs in variants.values() for v in vs]
    assert len(made) >= 8  # measured: 2 of 2 for most seeds within the draw budget
    for seed in seeds[:6]:
        for v in variants[seed.id]:
            assert skill_signature(v) == skill_signature(seed)
            assert text_key(v) != text_key(seed)
            assert v.initial_state != seed.initial_state or v.turns != seed.turns


def test_every_resampled_task_reexecutes_and_its_gold_trajectory_passes(variants):
    for vs in variants.values():
        for v in vs:
            assert accept_variant(v, set()) is None
            backend, gold = make_backend(v), gold_replay(v)
            for u in range(len(v.turns)):
                results = [(c, backend.execute(c)) for c in v.gold_calls(u)]
                check = check_turn(v, u, backend.state(), results, gold=gold)
                assert check.passed, (v.id, u, check)


def test_resample_is_deterministic_given_the_seed(seeds):
    r = BuiltinResampler()
    a = r.synthesize(seeds[1], 2, 3)
    b = r.synthesize(seeds[1], 2, 3)
    c = r.synthesize(seeds[1], 2, 4)
    assert [t.model_dump() for t in a.tasks] == [t.model_dump() for t in b.tasks]
    assert a.attempts == b.attempts and a.failures == b.failures
    assert [text_key(t) for t in a.tasks] != [text_key(t) for t in c.tasks]


def test_resample_counts_what_it_cannot_do(seeds):
    sgls_seed = seeds[0].model_copy(update={"backend": "sgls"})
    out = ResampleSynthesizer().synthesize(sgls_seed, 2, 0)
    assert out.tasks == [] and out.failures["unsupported_backend"] == 1


# ---------------------------------------------------------------------------- pool lifecycle
def test_gates_reject_duplicates_heldout_text_and_broken_plans(seeds, variants):
    v = next(vs[0] for vs in variants.values() if vs)
    events = []
    shared = seeds[3].turns[0].user  # a held-out turn a seed also has is generic, not a leak
    pool = ActivePool(seeds, RodsConfig(enabled=True), 4, forbidden_texts=frozenset({v.turns[0].user, shared}),
                      log=events.append)
    assert pool.forbidden_texts == {v.turns[0].user}
    assert pool.offer(1, seeds[0], [v], "resample") == 0  # held-out overlap
    pool.forbidden_texts = frozenset()
    assert pool.offer(1, seeds[0], [v, v], "resample") == 1  # the second is a duplicate
    broken = v.model_copy(deep=True)
    call = broken.turns[-1].gold[0][0]
    broken.turns[-1].gold[0][0] = call.model_copy(update={"arguments": {**call.arguments, "zz_unknown": 1}})
    broken.turns[-1].user += " (broken)"
    assert pool.offer(1, seeds[0], [broken], "resample") == 0
    reasons = [e["reason"] for e in events if e["event"] == "reject"]
    assert reasons == ["heldout_overlap", "duplicate", "reexecution_failed"]
    queued = [e for e in events if e["event"] == "queue"]
    assert queued[0]["parent_id"] == seeds[0].id and queued[0]["task_id"] == "rods-000000"
    assert pool.pending[0].provenance.kind == "synth" and pool.pending[0].provenance.parent_id == seeds[0].id


def test_seed_selection_takes_boundary_tasks_and_respects_cooldown(seeds):
    pool = _pool(seeds, quota_per_category=10, cooldown_steps=3)
    means = {seeds[0].id: 0.5, seeds[1].id: 0.1, seeds[2].id: 0.9, seeds[3].id: 0.3}
    pool.observe(1, [(tid, [m] * 4) for tid, m in means.items()])
    chosen = [t.id for t in pool.select(1)]
    assert set(chosen) == {seeds[0].id, seeds[3].id}  # boundary only (0.20 <= r <= 0.85)
    pool.observe(2, [(seeds[0].id, [0.5] * 4)])
    assert pool.select(2) == []  # in cooldown until step 1 + 3
    pool.observe(4, [(seeds[0].id, [0.5] * 4)])
    assert [t.id for t in pool.select(4)] == [seeds[0].id]


def test_injection_is_staged_and_capped(seeds, variants):
    made = [v for vs in variants.values() for v in vs]
    pool = _pool(seeds, inject_fraction=0.2, max_synthesized=5)
    for v in made:
        pool.offer(1, seeds[0], [v], "resample")
    assert len(pool.pending) == len(made)
    injected = pool.inject(2)
    assert len(injected) == 4  # floor(0.2 * 20 seeds)
    injected += pool.inject(3)  # 4 more (0.2 * 24); the cap of 5 synthesized retires the excess
    synth = [e for e in pool.entries.values() if e.kind == "synth"]
    assert len(synth) == 5 and pool.totals["retired:over_cap"] == 3
    m = pool.metrics()
    assert m["pool/epoch"] == 2 and m["pool/epoch_injected"] == 4 and m["pool/epoch_retired"] == 3
    assert sum(e.kind == "seed" for e in pool.entries.values()) == 20  # seeds kept


def test_retirement_rules(seeds, variants):
    made = [v for vs in variants.values() for v in vs][:4]
    events = []
    pool = _pool(seeds, events, inject_fraction=1.0)
    for v in made:
        pool.offer(1, seeds[0], [v], "resample")
    ids = pool.inject(2)
    assert len(ids) == 4
    pool.observe(3, [(ids[0], [0.1] * 4), (ids[1], [0.5] * 4), (ids[2], [0.5] * 4), (ids[3], [0.5] * 4)])
    pool.observe(4, [(ids[1], [1.0] * 4), (ids[2], [0.0] * 4), (ids[3], [0.6] * 4)])
    pool.observe(5, [(seeds[0].id, [1.0] * 4), (seeds[1].id, [0.0] * 4)])  # seeds are kept
    retired = {e["task_id"]: e["reason"] for e in events if e["event"] == "retire"}
    assert retired == {ids[0]: "new_too_hard", ids[1]: "mastered", ids[2]: "too_hard"}
    assert ids[3] in pool.entries and seeds[0].id in pool.entries and seeds[1].id in pool.entries
    pool.observe(6, [(ids[0], [0.5] * 4)])  # a retired task's late group is ignored
    assert ids[0] not in pool.entries


def test_seeds_can_be_retired_when_not_kept(seeds):
    pool = _pool(seeds, keep_seeds=False)
    pool.observe(1, [(seeds[0].id, [1.0] * 4)])
    assert seeds[0].id not in pool.entries


def test_sampling_passes_over_the_pool_and_injects_at_epoch_boundaries(seeds, variants):
    made = [v for vs in variants.values() for v in vs]
    pool = _pool(seeds)  # epoch = one pass over the pool (20 seeds / 4 per step = 5 steps)
    for v in made:
        pool.offer(1, seeds[0], [v], "resample")
    first_pass = [t.id for step in range(1, 6) for t in pool.sample(step, 4)]
    assert sorted(first_pass) == sorted(t.id for t in seeds)
    assert pool.epoch == 0
    pool.sample(6, 4)  # a new pass begins: an epoch boundary
    assert pool.epoch == 1 and len(pool.entries) == 24

    stepped = _pool(seeds, epoch_steps=2)
    for v in made:
        stepped.offer(1, seeds[0], [v], "resample")
    for step in range(1, 6):
        stepped.sample(step, 4)
    assert stepped.epoch == 2  # boundaries before steps 3 and 5


def test_metrics_and_checkpoint_round_trip(seeds, variants):
    made = [v for vs in variants.values() for v in vs]
    cfg = RodsConfig(enabled=True)
    pool = ActivePool(seeds, cfg, 4, rng_seed=5)
    for v in made:
        pool.offer(1, seeds[0], [v], "resample")
    pool.observe(1, [(t.id, [0.25, 0.75, 0.5, 0.5]) for t in pool.sample(1, 4)])
    pool.select(1)
    pool.inject(2)
    pool.observe(2, [(t.id, [0.0, 1.0]) for t in pool.sample(2, 4)])

    m = pool.metrics()
    assert m["pool/size"] == 24 and m["pool/seeds"] == 20 and m["pool/synthesized"] == 4
    assert m["pool/pending"] == len(made) - 4 and m["pool/observed"] == 8
    assert m["pool/region_boundary"] == 1.0
    assert sum(m[f"pool/phi_hist_{b}"] for b in range(5)) == pytest.approx(1.0)

    state = json.loads(json.dumps(pool.state_dict()))  # what a checkpoint stores
    back = ActivePool.from_state(state, cfg, 4)
    assert back.state_dict() == pool.state_dict()
    assert [t.id for t in back.sample(3, 12)] == [t.id for t in pool.sample(3, 12)]


def test_resuming_moves_cooldowns_to_the_new_step_count(seeds):
    pool = _pool(seeds, cooldown_steps=10)
    pool.observe(30, [(seeds[0].id, [0.5] * 4)])
    assert [t.id for t in pool.select(30)] == [seeds[0].id]
    resumed = ActivePool.from_state(pool.state_dict(), RodsConfig(enabled=True, cooldown_steps=10), 4, resume=True)
    resumed.observe(5, [(seeds[0].id, [0.5] * 4)])
    assert resumed.select(5) == []  # 5 steps after being chosen at (old) step 30: still cooling down
    resumed.observe(10, [(seeds[0].id, [0.5] * 4)])
    assert [t.id for t in resumed.select(10)] == [seeds[0].id]


def test_resample_refuses_shapes_the_generator_cannot_draw(seeds):
    from agentrl.rods.resample import generator_can_draw

    assert generator_can_draw("base", (1, 3)) and generator_can_draw("miss_func", (2, 0, 1, 1))
    for category, shape in [("base", (1, 0, 1)), ("miss_param", (0, 2)), ("miss_func", (1, 0)), ("miss_func", (1, 2)),
                            ("long_context", (0, 1)), ("base", ())]:
        assert not generator_can_draw(category, shape), (category, shape)
    odd = seeds[0].model_copy(update={"category": "long_context"})
    out = BuiltinResampler().synthesize(odd, 2, 0)
    assert out.tasks == [] and out.failures == {"unsupported_shape": 1}


def test_a_pool_without_kept_seeds_never_empties(seeds):
    events = []
    pool = _pool(seeds[:8], events, keep_seeds=False)
    for step in range(1, 6):
        pool.observe(step, [(t.id, [0.0] * 4) for t in pool.sample(step, 4)])
    assert len(pool.entries) == 4  # rollout.tasks_per_step: the rest were retired as too hard
    assert any(e["event"] == "retire_skipped" for e in events)
