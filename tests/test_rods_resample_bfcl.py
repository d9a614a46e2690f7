"""The BFCL ``resample`` synthesizer (agentrl.rods.resample_bfcl) on real BFCL tasks and backends.

Every variant must be an acceptable pool task (fresh gold re-execution, new text key), keep the
seed's skill signature, change the stated values consistently everywhere, and its gold
trajectory must pass every turn under both per-turn checks (agentrl.envs.checker's and BFCL's).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter

import pytest

pytest.importorskip("bfcl_eval", reason="optional dependency bfcl-eval is not installed")

from agentrl.envs.bfcl.tasks import CATEGORIES, bfcl_tasks  # noqa: E402
from agentrl.envs.builtin.generator import builtin_split  # noqa: E402
from agentrl.envs.checker import canonical, check_turn, gold_replay  # noqa: E402
from agentrl.envs.registry import make_backend  # noqa: E402
from agentrl.envs.session import LocalEnvSession  # noqa: E402
from agentrl.rods.resample_bfcl import BFCLResampler, _leaves, _token  # noqa: E402
from agentrl.rods.signature import skill_signature  # noqa: E402
from agentrl.rods.synthesizer import accept_variant  # noqa: E402
from agentrl.tasks.schema import (
    Task,  # noqa: E402
    text_key,
)


@pytest.fixture(scope="module")
def resampler() -> BFCLResampler:
    return BFCLResampler()


@pytest.fixture(scope="module")
def tasks() -> dict[str, Task]:
    return {t.id: t for t in bfcl_tasks("all", "full")}


@pytest.fixture(scope="module")
def sample(resampler) -> list[tuple[Task, list[Task]]]:
    """(seed, variants) for the first 10 train tasks of every category, 2 variants each."""
    return [(s, resampler.synthesize(s, 2, rng_seed=7).tasks) for c in CATEGORIES for s in bfcl_tasks(c, "train")[:10]]


def _dump(result) -> str:
    return json.dumps([[t.model_dump() for t in result.tasks], result.attempts, sorted(result.failures.items())])


def _fs_names(node) -> set[str]:
    """Every file and directory name of a GorillaFileSystem scenario tree."""
    names = set()
    for name, sub in (node or {}).items():
        names.add(name)
        if isinstance(sub, dict) and sub.get("type") == "directory":
            names |= _fs_names(sub.get("contents"))
    return names


# ------------------------------------------------------------------ determinism
def test_deterministic_given_seed(resampler, tasks):
    seed = tasks["multi_turn_base_0"]
    before = seed.model_dump_json()
    a, b = resampler.synthesize(seed, 3, rng_seed=11), resampler.synthesize(seed, 3, rng_seed=11)
    assert seed.model_dump_json() == before  # the cached, shared seed is not touched
    assert len(a.tasks) == 3 and _dump(a) == _dump(b)
    assert _dump(BFCLResampler().synthesize(seed, 3, rng_seed=11)) == _dump(a)  # a fresh instance too
    c = resampler.synthesize(seed, 3, rng_seed=12)
    assert {text_key(t) for t in c.tasks} != {text_key(t) for t in a.tasks}


def test_deterministic_across_processes(resampler, tasks):
    """No hidden dependence on set order: string hashing differs between these processes."""
    code = ("import hashlib, json; from agentrl.envs.bfcl.tasks import bfcl_tasks\n"
            "from agentrl.rods.resample_bfcl import BFCLResampler\n"
            "r = BFCLResampler(); out = [r.synthesize(t, 2, 5) for t in bfcl_tasks('miss_param', 'train')[:8]]\n"
            "print(hashlib.sha256(json.dumps([[v.model_dump() for v in x.tasks] for x in out]).encode()).hexdigest())\n")
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": str(h)}).stdout.strip() for h in (1, 2)}
    assert len(digests) == 1


# ------------------------------------------------------------------ the gates hold
def test_variants_are_acceptable_with_the_seed_signature(sample):
    assert sum(len(v) for _, v in sample) >= 0.6 * 2 * len(sample)
    for seed, variants in sample:
        keys = {text_key(seed)}
        for v in variants:
            assert v.id == "pending" and v.backend == "bfcl" and v.category == seed.category, seed.id
            assert Task.model_validate_json(v.model_dump_json()) == v  # survives storage in the pool
            assert accept_variant(v, {text_key(seed)}) is None, seed.id
            assert skill_signature(v) == skill_signature(seed), seed.id
            assert text_key(v) not in keys, seed.id  # distinct from the seed and from each other
            keys.add(text_key(v))
            assert [t.model_dump() for t in v.tools] == [t.model_dump() for t in seed.tools]
            assert [t.withheld_tools for t in v.turns] == [t.withheld_tools for t in seed.turns]
            args = lambda t: [c.arguments for u in range(len(t.turns)) for c in t.gold_calls(u)]  # noqa: E731
            assert args(v) != args(seed), seed.id
            assert {k: v.initial_state[k] for k in ("bfcl_id", "involved_classes", "long_context")} == \
                {k: seed.initial_state[k] for k in ("bfcl_id", "involved_classes", "long_context")}


def test_gold_trajectory_of_every_variant_passes_both_checks(sample):
    n = 0
    for _, variants in sample:
        for v in variants:
            gold = gold_replay(v)
            backend, session = make_backend(v), LocalEnvSession(v)
            for u in range(len(v.turns)):
                results = [(c, backend.execute(c)) for c in v.gold_calls(u)]
                check = check_turn(v, u, backend.state(), results, gold=gold)
                assert check.passed, (v.turns[0].user[:60], u, check.reason)
                calls = v.gold_calls(u)  # BFCL's own per-turn verdict, as an episode computes it
                assert session.end_turn_sync(u, list(zip(calls, session.execute_sync(calls)))), (u, session.checks[-1])
                n += 1
    assert n > 0


def test_substitution_is_consistent_and_injective(resampler, sample):
    """Each stated literal maps to one new value everywhere, no two to the same, none seen before."""
    for seed, variants in sample:
        lits = resampler.literals(seed)
        said = "\n".join(t.user for t in seed.turns)
        for v in variants:
            mapping: dict[str, set[str]] = {}
            for u in range(len(seed.turns)):
                for sc, vc in zip(seed.gold_calls(u), v.gold_calls(u)):
                    assert sc.name == vc.name
                    for (_, a), (_, b) in zip(_leaves(sc.arguments), _leaves(vc.arguments)):
                        render = next((r for r in lits if canonical(a) in {canonical(x) for _, x in lits[r]["values"]}), None)
                        if render is not None and a != b:
                            mapping.setdefault(render, set()).add(str(b) if not isinstance(b, float) else repr(b))
            assert mapping, seed.id
            assert all(len(new) == 1 for new in mapping.values()), (seed.id, mapping)
            news = [next(iter(new)) for new in mapping.values()]
            assert len(set(news)) == len(news), (seed.id, mapping)
            text = "\n".join(t.user for t in v.turns)
            for new in sorted(news, key=len, reverse=True):  # what is left once the new values are cut out
                text = re.sub(_token(new), " ", text)
            for old, (new,) in mapping.items():
                if not re.fullmatch(r"-?[\d.]+", new):  # stated strings: gone from the text, the new one there
                    assert not re.search(_token(new), said), (seed.id, new)
                    assert any(re.search(_token(new), t.user) for t in v.turns), (seed.id, old, new)
                    assert not re.search(_token(old), text), (seed.id, old)


def test_file_names_change_in_text_state_and_calls(resampler, tasks):
    seed = tasks["multi_turn_base_0"]  # moves final_report.pdf from document/ to a new temp/ directory
    result = resampler.synthesize(seed, 3, rng_seed=0)
    assert len(result.tasks) == 3
    for v in result.tasks:
        mv = v.gold_calls(0)[-1]
        assert mv.name == "mv"
        new_file, new_dir = mv.arguments["source"], mv.arguments["destination"]
        assert new_file != "final_report.pdf" and new_file.endswith(".pdf") and new_dir != "temp"
        names = _fs_names(v.initial_state["initial_config"]["GorillaFileSystem"]["root"])
        assert new_file in names and "final_report.pdf" not in names and new_dir not in names  # mkdir makes it
        assert f"'{new_file}'" in v.turns[0].user and f"'{new_dir}'" in v.turns[0].user
        assert new_file in v.turns[2].user and "final_report.pdf" not in " ".join(t.user for t in v.turns)
        assert {c.arguments.get("file_name") for c in v.gold_calls(2)} == {new_file}  # sort(file_name=...)
        grep = v.gold_calls(1)[-1]  # the grep pattern moved into the file's content with the text
        content = json.dumps(v.initial_state["initial_config"]["GorillaFileSystem"])
        assert grep.arguments["pattern"] in v.turns[1].user and grep.arguments["pattern"] in content
        assert gold_replay(v)[1].results[-1]["matching_lines"]  # so the search still finds the line


def test_result_derived_arguments_follow_the_new_results(resampler):
    """Unstated arguments copied from an earlier result (zipcodes from city names) are re-derived."""
    seeds = [s for s in bfcl_tasks("base", "train")
             if {"get_zipcode_based_on_city", "estimate_distance"}
             <= {c.name for u in range(len(s.turns)) for c in s.gold_calls(u)}]
    checked = 0
    for seed in seeds:
        for v in resampler.synthesize(seed, 2, rng_seed=3).tasks:
            calls = [c for u in range(len(v.turns)) for c in v.gold_calls(u)]
            results = [r for g in gold_replay(v) for r in g.results]
            zips = [r["zipcode"] for c, r in zip(calls, results) if c.name == "get_zipcode_based_on_city"]
            cities = [c.arguments["city"] for c in calls if c.name == "get_zipcode_based_on_city"]
            seed_cities = [c.arguments["city"] for u in range(len(seed.turns)) for c in seed.gold_calls(u)
                           if c.name == "get_zipcode_based_on_city"]
            if cities == seed_cities:
                continue
            for c in calls:
                if c.name == "estimate_distance":
                    assert {c.arguments["cityA"], c.arguments["cityB"]} <= set(zips), (seed.id, c, zips)
            checked += 1
    assert checked > 0


# ------------------------------------------------------------------ what it cannot vary
def test_non_bfcl_seed_and_nothing_to_vary(resampler, tasks):
    builtin = builtin_split("train")[0]
    result = resampler.synthesize(builtin, 2, rng_seed=0)
    assert result.tasks == [] and result.attempts == 0 and result.failures == Counter(unsupported_backend=1)
    bare = tasks["multi_turn_base_26"]  # no argument value is stated by the user
    assert resampler.literals(bare) == {}
    result = resampler.synthesize(bare, 2, rng_seed=0)
    assert result.tasks == [] and result.failures == Counter(no_substitutable_values=1)
    assert resampler.synthesize(tasks["multi_turn_base_0"], 0, rng_seed=0).tasks == []


def test_corpus_limits_the_string_pools(tasks):
    """With the seed alone as corpus every stated string's alternatives are taken: only numbers move."""
    seed = tasks["multi_turn_base_1"]  # file and folder names, a grep pattern, and "the last 20 lines"
    result = BFCLResampler(corpus=[seed], max_attempts_per_variant=3).synthesize(seed, 2, rng_seed=0)
    assert result.tasks
    for v in result.tasks:
        changed = [(a, b) for u in range(len(seed.turns)) for sc, vc in zip(seed.gold_calls(u), v.gold_calls(u))
                   for (_, a), (_, b) in zip(_leaves(sc.arguments), _leaves(vc.arguments)) if a != b]
        assert changed and all(isinstance(a, int) and isinstance(b, int) for a, b in changed), changed


# ------------------------------------------------------------------ acceptance rate (measured)
def test_acceptance_rate_over_train_tasks(resampler):
    t0 = time.perf_counter()
    lines, made, asked = [], 0, 0
    for cat in CATEGORIES:
        seeds = bfcl_tasks(cat, "train")[:40]
        results = [resampler.synthesize(s, 2, rng_seed=0) for s in seeds]
        got = sum(len(r.tasks) for r in results)
        failures = sum((r.failures for r in results), Counter())
        lines.append(f"{cat}: {got}/{2 * len(seeds)} variants ({got / (2 * len(seeds)):.0%}), "
                     f"{sum(1 for r in results if r.tasks)}/{len(seeds)} seeds with >= 1, "
                     f"{sum(r.attempts for r in results)} attempts, failures {dict(sorted(failures.items()))}")
        made, asked = made + got, asked + 2 * len(seeds)
    print("\n" + "\n".join(lines) + f"\noverall {made}/{asked} ({made / asked:.0%}) in {time.perf_counter() - t0:.1f}s")
    assert made > 0
