"""`agentrl plan` and the placement it checks (agentrl/planning/placement.py, plan.py, cluster_shape.py).

* the roles and bundles a config asks Ray for, the config rules on GPUs and tensor parallelism,
  and the vLLM arguments of a tensor-parallel engine;
* the check against declared clusters: capacity, custom resources, GPUs asked of a cluster with
  or without GPUs, the learner's memory per rank, the engines' KV cache, a shared GPU;
* every recipe that states its cluster (`# agentrl-plan-shape:` in configs/, deploy/, cluster/,
  docker/) loads with the real config loader and passes on that cluster, and a variant of it that
  needs more GPUs or memory than the cluster has fails with the reason;
* the CLI (`agentrl plan`, and `agentrl train`'s pre-flight check) without Ray;
* a local Ray cluster started with declared GPUs (`ray start --head --num-gpus 2`, no CUDA):
  `agentrl plan --address` passes a 2-GPU run and refuses a 4-GPU one, the plan's placement groups
  are placed there (`--reserve`), the runtime's own engine placement group gets a TP engine its 2
  GPUs, and `agentrl train` stops before starting anything when the run cannot be placed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import types
from collections import Counter
from pathlib import Path

import pytest
import yaml
from ray_nodes import free_ports, stop_node

from agentrl.config import ConfigError, load_config
from agentrl.engines.vllm_engine import parallel_args
from agentrl.planning import plan as plan_module
from agentrl.planning.cluster_shape import parse_shape
from agentrl.planning.placement import learner_bundles, plan_roles
from agentrl.planning.plan import check_plan

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
BFCL = str(ROOT / "configs" / "bfcl_qwen3_4b_8gpu.yaml")
TINY = ROOT / "agentrl" / "assets" / "tiny-agent"
GPU = ["runtime.rollout_worker_gpus=1", "runtime.learner_gpus=1"]
# Qwen3-4B's config.json dimensions (the model card's; tests/test_memory_estimate.py checks the count)
QWEN3_4B = dict(model_type="qwen3", hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True)
SHAPE_LINE = re.compile(r"^#\s*agentrl-plan-shape:\s*(\S+)\s*$", re.M)
RUN_LINE = re.compile(r"^#\s*agentrl-plan-run:\s*(.+?)\s*$", re.M)


@pytest.fixture(scope="module")
def qwen3_4b(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("Qwen3-4B-Instruct-2507")
    (folder / "config.json").write_text(json.dumps(QWEN3_4B))
    return folder


def plan(overrides=(), shape="nodes=1,gpus_per_node=8,cpus_per_node=64,gpu_gib=80", config=QUICKSTART, **kw):
    return check_plan(load_config(config, list(overrides)), parse_shape(shape), **kw)


# ------------------------------------------------------------------------------------ the roles
def test_quickstart_roles_are_todays_plain_actors():
    roles = {r.name: r for r in plan_roles(load_config(QUICKSTART))}
    assert list(roles) == ["rollout[0]", "buffer", "learner"]  # tools in process: no tool-pool actor
    assert roles["rollout[0]"].bundles == ({"CPU": 1.0},) and not roles["rollout[0]"].group  # the CPU path: no group
    assert roles["learner"].bundles == ({"CPU": 1.0},) and roles["learner"].strategy == "actor"
    assert roles["buffer"].bundles == ({},)


def test_gpu_roles_groups_and_bundles():
    cfg = load_config(QUICKSTART, [*GPU, "rollout.num_workers=2", "learner.num_ranks=2", "tools.placement=pool",
                                   "tools.num_actors=2", "runtime.rollout_worker_resources={rollout: 1}"])
    roles = {r.name: r for r in plan_roles(cfg)}
    assert [n for n in roles if n.startswith("tool_pool")] == ["tool_pool[0]", "tool_pool[1]"]
    assert roles["rollout[1]"].bundles == ({"CPU": 1.0, "GPU": 1.0, "rollout": 1.0},)
    assert roles["rollout[1]"].strategy == "STRICT_PACK" and roles["rollout[1]"].group
    assert roles["learner"].bundles == ({"CPU": 1.0, "GPU": 1.0},) * 2 and roles["learner"].strategy == "PACK"
    tp = {r.name: r for r in plan_roles(load_config(QUICKSTART, ["rollout.engine.tensor_parallel_size=4",
                                                                  "runtime.rollout_worker_gpus=4"]))}
    assert tp["rollout[0]"].bundles == ({"CPU": 1.0, "GPU": 4.0},)  # the engine's TP GPUs in one bundle: one node
    rspo = {r.name for r in plan_roles(load_config(QUICKSTART, ["rspo.enabled=true", "rspo.explorer_workers=2"]))}
    assert {"explorer[0]", "explorer[1]"} <= rspo


def test_learner_bundles_are_what_the_group_places():
    assert learner_bundles(1, 1.0, 0.0) == ([{"CPU": 1.0}], False)
    assert learner_bundles(3, 2.0, 1.0) == ([{"CPU": 2.0, "GPU": 1.0}] * 3, True)
    assert learner_bundles(2, 0.0, 0.0) == ([{}, {}], False)  # nothing to reserve: no group


def test_tensor_parallel_engine_args():
    engine = load_config(QUICKSTART).rollout.engine
    assert parallel_args(engine) == {}
    engine = load_config(QUICKSTART, ["rollout.engine.tensor_parallel_size=2", "runtime.rollout_worker_gpus=2"]).rollout.engine
    assert parallel_args(engine) == {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}


@pytest.mark.parametrize("overrides, says", [
    (["rollout.engine.tensor_parallel_size=2", "runtime.rollout_worker_gpus=1"],
     "rollout.engine.tensor_parallel_size=2 needs runtime.rollout_worker_gpus >= 2"),
    (["rollout.engine.tensor_parallel_size=2"], "rollout.engine.tensor_parallel_size=2 needs runtime.rollout_worker_gpus"),
    (["runtime.learner_gpus=2"], "runtime.learner_gpus=2: a learner rank is one process on one device"),
    (["runtime.rollout_worker_gpus=1.5"], "runtime.rollout_worker_gpus=1.5: Ray gives"),
    (["tools.sgls.model_path=m", "tools.sgls.engine.tensor_parallel_size=2", "tools.sgls.num_gpus=1"],
     "tools.sgls.engine.tensor_parallel_size=2 needs tools.sgls.num_gpus >= 2"),
])
def test_gpu_config_rules_are_located_errors(overrides, says):
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, overrides)
    assert says in str(err.value) and "set by override" in str(err.value), err.value
    assert str(err.value).startswith(f"{QUICKSTART}: ")


# ------------------------------------------------------------------------------------ shapes
def test_parse_shape():
    c = parse_shape("nodes=2,gpus_per_node=8,cpus_per_node=64,gpu_gib=80")
    assert [(n.name, n.cpus, n.gpus, n.gpu_gib, n.host_gib) for n in c.nodes] == [
        ("node0", 64, 8, 80, None), ("node1", 64, 8, 80, None)]
    c = parse_shape("nodes=1,cpus_per_node=2+nodes=2,gpus_per_node=1,cpus_per_node=8,gpu_gib=24,host_gib=32,resource.rollout=1")
    assert [(n.gpus, n.resources) for n in c.nodes] == [(0, {}), (1, {"rollout": 1.0}), (1, {"rollout": 1.0})]
    for bad, says in [("nodes=2", "cpus_per_node is required"), ("cpus_per_node=4,gpus=8", "unknown key 'gpus'"),
                      ("cpus_per_node=x", "not a number"), ("cpus_per_node=4,nodes=1.5", "whole number"),
                      ("cpus_per_node", "expected KEY=VALUE")]:
        with pytest.raises(ValueError, match=re.escape(says)):
            parse_shape(bad)


# ------------------------------------------------------------------------------------ the check
def test_fits_and_places_on_declared_nodes():
    r = plan([*GPU, "rollout.num_workers=3", "learner.num_ranks=2"], model_config=TINY)
    assert r.ok, r.render()
    assert r.where["learner"] == ["node0", "node0"] and r.where["rollout[2]"] == ["node0"]
    text = r.render()
    assert "plan: OK" in text and "rollout[0..2]" in text and "STRICT_PACK each" in text
    assert "KV cache" in text and "learner device:" in text and "fits" in text


def test_more_gpus_than_the_cluster_fails_with_the_reason():
    r = plan([*GPU, "rollout.num_workers=8"], model_config=TINY)
    assert not r.ok and r.only_capacity
    (reason,) = r.reasons
    assert "does not fit next to the roles placed before it" in reason and "0/8 GPU free" in reason, reason
    assert "runtime.rollout_worker_gpus" in reason or "runtime.learner_gpus" in reason
    assert "the plan asks for 9 GPU" in r.render() and "plan: cannot run:" in r.render()
    # a TP engine wants its GPUs on one node: 2 nodes of 4 hold 8 GPUs, but not one engine of 8
    r = plan(["rollout.engine.tensor_parallel_size=8", "runtime.rollout_worker_gpus=8", "runtime.learner_gpus=1"],
             shape="nodes=2,gpus_per_node=4,cpus_per_node=16,gpu_gib=80", model_config=TINY)
    assert any("rollout[0]: bundle {CPU: 1, GPU: 8} fits on no node of this cluster, even an empty one" in x for x in r.reasons)


def test_spread_over_nodes_and_custom_resources():
    shape = "nodes=1,cpus_per_node=2+nodes=2,gpus_per_node=1,cpus_per_node=8,gpu_gib=24,resource.rollout=1"
    r = plan([*GPU, "runtime.rollout_worker_cpus=6", "runtime.learner_cpus=6", "runtime.rollout_worker_resources={rollout: 1}"],
             shape=shape, model_config=TINY)
    assert r.ok, r.render()
    assert sorted(r.where["rollout[0]"] + r.where["learner"]) == ["node1", "node2"]  # not on the GPU-less head
    r = plan(["runtime.rollout_worker_resources={rollout: 1}"], shape="nodes=1,cpus_per_node=8", model_config=TINY)
    assert any("needs the custom resource rollout: 1; no node has it" in x for x in r.reasons), r.reasons


def test_cpu_actors_on_a_gpu_cluster_and_gpus_on_a_cpu_cluster():
    r = plan([], model_config=TINY)  # the quickstart asks for no GPUs
    assert not r.ok and not r.only_capacity
    assert any(x.startswith("runtime.learner_gpus=0 on a cluster with GPUs") and "set runtime.learner_gpus=1" in x
               for x in r.reasons), r.reasons
    assert any(x.startswith("runtime.rollout_worker_gpus=0 on a cluster with GPUs") and "--allow-cpu" in x for x in r.reasons)
    assert plan([], model_config=TINY, allow_cpu=True).ok
    r = plan(GPU, shape="nodes=1,cpus_per_node=8", model_config=TINY)
    assert "runtime.learner_gpus=1 but the cluster has no GPUs" in r.reasons and r.only_capacity


def test_learner_memory_and_kv_cache(qwen3_4b):
    r = plan([*GPU, "learner.zero_stage=3"], shape="nodes=1,gpus_per_node=2,cpus_per_node=16,gpu_gib=24", model_config=qwen3_4b)
    assert any(x.startswith("learner: ") and "does not fit 0.9 x 24 GiB of its GPU" in x for x in r.reasons), r.reasons
    assert "learner memory per rank (estimate, 4.02B parameters" in r.render()
    r = plan([*GPU, "rollout.engine.gpu_memory_utilization=0.1"], model_config=qwen3_4b)
    assert any("rollout engines: the weights" in x and "no room for a KV cache" in x for x in r.reasons), r.reasons
    # float32 weights 15 GiB of 0.25 x 80: ~18k tokens of KV cache
    r = plan([*GPU, "rollout.engine.gpu_memory_utilization=0.25", "rollout.engine.max_model_len=32768"], model_config=qwen3_4b)
    assert any("fewer than rollout.engine.max_model_len=32768" in x for x in r.reasons), r.reasons
    r = plan(["rollout.engine.max_model_len=200000"], shape="nodes=1,cpus_per_node=4", model_config=TINY)
    assert any("raise rollout.engine.kv_cache_gib" in x for x in r.reasons), r.reasons  # a CPU engine: kv_cache_gib
    r = plan([], shape="nodes=1,cpus_per_node=4,host_gib=2", model_config=TINY)
    assert any("of host memory" in x for x in r.reasons), r.reasons  # learner on CPU + CPU engine > 2 GiB


def test_cpu_engines_count_their_processes_against_rays_memory_monitor(qwen3_4b):
    """Each CPU engine needs its KV cache, its weights in rollout.engine.dtype and its processes
    (CPU_ENGINE_PROCESSES_GIB); the limit is the share of the host above which Ray's memory monitor
    kills workers, not the whole host (an RSPO run that plan called OK at 11.5 of 23.5 GiB had
    rollout workers killed at every weight sync)."""
    from agentrl.engines.memory_estimate import ModelDims
    from agentrl.planning.plan import CPU_ENGINE_PROCESSES_GIB, RAY_MEMORY_USAGE_THRESHOLD

    def need(r) -> float:
        line = next(x for x in r.host_lines if x.startswith("host memory of"))
        return float(re.search(r": ([\d.]+) GiB for its", line)[1])

    one, two = (plan([f"rollout.num_workers={n}", "rollout.engine.kv_cache_gib=1"], shape="nodes=1,cpus_per_node=8,host_gib=64",
                     model_config=TINY) for n in (1, 2))
    assert two.ok and need(two) - need(one) == pytest.approx(1 + CPU_ENGINE_PROCESSES_GIB, abs=0.1)  # TINY's weights ~0
    assert f"{RAY_MEMORY_USAGE_THRESHOLD:g} x 64.0" in one.render()
    host = need(one) / ((1 + RAY_MEMORY_USAGE_THRESHOLD) / 2)  # the need lies between the limit and the whole host
    r = plan(["rollout.engine.kv_cache_gib=1"], shape=f"nodes=1,cpus_per_node=8,host_gib={host:.2f}", model_config=TINY)
    assert any("Ray's memory monitor" in x for x in r.reasons), r.render()
    # a CPU engine's weights and KV cache are in the engine's dtype (rollout.engine.dtype), not model.dtype
    cpu = ["model.dtype=float32", "rollout.engine.kv_cache_gib=4"]
    fp32, bf16 = (plan([*cpu, *extra], shape="nodes=1,cpus_per_node=8,host_gib=512", model_config=qwen3_4b)
                  for extra in ([], ["rollout.engine.dtype=bfloat16"]))
    assert need(fp32) - need(bf16) == pytest.approx(ModelDims.from_pretrained_dir(qwen3_4b).n_params * 2 / 2**30, abs=0.1)
    tokens = [int(re.search(r"= ([\d,]+) tokens", r.render())[1].replace(",", "")) for r in (fp32, bf16)]
    assert tokens[1] == pytest.approx(2 * tokens[0], abs=1)


def test_a_shared_gpu_must_hold_both(qwen3_4b):
    share = ["runtime.rollout_worker_gpus=0.5", "runtime.learner_gpus=0.5"]
    r = plan(share, shape="nodes=1,gpus_per_node=1,cpus_per_node=8,gpu_gib=16", model_config=TINY)
    assert r.ok and r.where["learner"] == r.where["rollout[0]"], r.render()
    r = plan([*share, "rollout.engine.gpu_memory_utilization=0.9"], shape="nodes=1,gpus_per_node=1,cpus_per_node=8,gpu_gib=16",
             model_config=TINY)
    assert any("share one GPU" in x for x in r.reasons), r.reasons


def test_flash_attention_is_checked_not_assumed():
    from importlib.util import find_spec

    r = plan(["learner.attn_implementation=flash_attention_2"], shape="nodes=1,cpus_per_node=8", model_config=TINY)
    assert any(x.startswith("learner.attn_implementation=flash_attention_2 needs a GPU learner") for x in r.reasons), r.reasons
    r = plan([*GPU, "learner.attn_implementation=flash_attention_2"], model_config=TINY)
    missing = [w for w in r.warnings if "the flash-attn package is not installed here" in w]
    assert r.ok and len(missing) == (find_spec("flash_attn") is None), r.render()
    assert not any("flash" in w for w in plan(GPU, model_config=TINY).warnings)


def test_unknown_model_skips_memory_with_a_note():
    cfg = load_config(QUICKSTART, [*GPU, "model.path=/nowhere/model"])
    r = check_plan(cfg, parse_shape("nodes=1,gpus_per_node=2,cpus_per_node=8"))
    assert r.ok and r.estimate is None
    assert any("model dimensions unknown" in n and "--model-config" in n for n in r.notes)


# ------------------------------------------------------------------------------------ recipes
def recipes() -> list[Path]:
    files = [*(ROOT / "configs").glob("*.yaml"), *(ROOT / "deploy").glob("*.yaml"), *(ROOT / "cluster").glob("*.yaml"),
             *(ROOT / "docker").glob("Dockerfile*")]
    return sorted(p for p in files if SHAPE_LINE.search(p.read_text()))


def recipe_run(path: Path) -> tuple[str, list[str]]:
    """(config file in this repo, overrides) of the `agentrl train` run a recipe is written for."""
    text = path.read_text()
    if path.parent.name == "configs":
        return str(path), []
    if (line := RUN_LINE.search(text)) is not None:
        argv = shlex.split(line.group(1))
    elif path.name.startswith("Dockerfile"):
        argv = json.loads(re.search(r"^CMD (\[.*\])\s*$", text, re.M).group(1))
    else:
        argv = shlex.split(yaml.safe_load(text)["spec"]["entrypoint"])
    start = argv.index("agentrl")
    assert argv[start + 1] == "train", argv
    if argv[start + 2] == "--resume":  # `train --resume auto CONFIG ...`: what a restarted job runs
        assert argv[start + 3] == "auto", argv
        del argv[start + 2:start + 4]
    config = argv[start + 2]
    local = ROOT / (config.removeprefix("/app/") if config.startswith("/app/") else config)
    assert local.is_file(), f"{path.name}: {config} is not a config in this repo"
    return str(local), argv[start + 3:]


def local_model(model_path: str, qwen3_4b: Path) -> Path:
    """Where this machine has the dimensions of the model a recipe names (the clusters' paths are not here)."""
    if Path(model_path).name == "tiny-agent":
        return TINY
    if "Qwen3-4B" in model_path:
        return qwen3_4b
    raise AssertionError(f"no local config.json for model.path={model_path}: add it to local_model()")


def test_every_gpu_recipe_states_its_cluster():
    names = {str(p.relative_to(ROOT)) for p in recipes()}
    assert {"configs/bfcl_qwen3_4b_8gpu.yaml", "deploy/rayjob.yaml", "deploy/raycluster.yaml", "deploy/rayjob-2x8.yaml",
            "deploy/raycluster-2x8.yaml", "cluster/aws-gpu.yaml", "docker/Dockerfile.gpu"} <= names, names


@pytest.mark.parametrize("path", recipes(), ids=lambda p: str(p.relative_to(ROOT)))
def test_recipe_runs_on_its_cluster_and_not_on_less(path, qwen3_4b):
    shape = SHAPE_LINE.search(path.read_text()).group(1)
    config, overrides = recipe_run(path)
    cfg = load_config(config, overrides)  # the real loader: unknown keys, bad values, the GPU rules
    model = local_model(cfg.model.path, qwen3_4b)
    assert cfg.runtime.rollout_worker_gpus >= cfg.rollout.engine.tensor_parallel_size >= 1
    assert cfg.runtime.learner_gpus == 1, "one GPU per learner rank"
    report = check_plan(cfg, parse_shape(shape), model_config=model)
    assert report.ok, report.render()
    assert report.estimate is not None and any("KV cache" in x for x in report.engine_lines)

    # more GPUs than the shape has: one more engine than it has GPUs
    gpus = int(parse_shape(shape).gpus)
    more = load_config(config, [*overrides, f"rollout.num_workers={gpus + 1}"])
    more = check_plan(more, parse_shape(shape), model_config=model)
    assert not more.ok and any("does not fit" in x or "fits on no node" in x for x in more.reasons), more.render()
    # more memory than its GPUs have: the learner of Qwen3-4B on one rank
    bigger = load_config(config, [*overrides, "learner.num_ranks=1"])
    heavy = check_plan(bigger, parse_shape(shape), model_config=qwen3_4b)
    assert not heavy.ok and any(x.startswith("learner: ") and "does not fit" in x for x in heavy.reasons), heavy.render()


def _agentrl_train_commands(markdown: Path) -> list[list[str]]:
    """`agentrl train ...` argv of every (continued) shell line in the file's code blocks."""
    text = markdown.read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if "agentrl train" in line:
                argv = shlex.split(line.split(" #", 1)[0])
                out.append(argv[argv.index("agentrl"):])
    return out


@pytest.mark.parametrize("recipe, readme", [("deploy/raycluster.yaml", "deploy/README.md"),
                                            ("deploy/raycluster-2x8.yaml", "deploy/README.md"),
                                            ("cluster/aws-gpu.yaml", "cluster/README.md")])
def test_readme_submits_the_run_the_recipe_is_checked_with(recipe, readme):
    argv = shlex.split(RUN_LINE.search((ROOT / recipe).read_text()).group(1))
    assert argv in _agentrl_train_commands(ROOT / readme), f"{readme} does not submit `{shlex.join(argv)}`"


def test_the_2x8_recipe_spreads_as_ray_places_and_uses_both_nodes(qwen3_4b):
    """deploy/*-2x8.yaml: the run's engines spread over both GPU nodes, the learner's ranks on one
    node, nothing on the head but the buffer, the memory checked with the gpu_gib the pods
    advertise, and no node idle; the same run's manifests agree on the cluster and the command."""
    job, cluster = (ROOT / "deploy" / "rayjob-2x8.yaml").read_text(), (ROOT / "deploy" / "raycluster-2x8.yaml").read_text()
    shape = SHAPE_LINE.search(job).group(1)
    assert shape == SHAPE_LINE.search(cluster).group(1)
    config, overrides = recipe_run(ROOT / "deploy" / "rayjob-2x8.yaml")
    assert (config, overrides) == recipe_run(ROOT / "deploy" / "raycluster-2x8.yaml")
    r = check_plan(load_config(config, overrides), parse_shape(shape), model_config=qwen3_4b)
    assert r.ok and not r.warnings, r.render()
    engines = [n for role, nodes in r.where.items() if role.startswith("rollout[") for n in nodes]
    assert sorted(engines.count(n) for n in ("node1", "node2")) == [6, 7] and "node0" not in engines
    assert len(set(r.where["learner"])) == 1 and r.where["learner"][0] != "node0"
    assert r.where["buffer"] == ["node0"]
    assert any(line.startswith("learner device:") and line.endswith(": fits") for line in r.memory_lines), r.render()
    # every pod advertises gpu_gib, has the storage secret and the same grace period; the head is on-demand
    for text in (job, cluster):
        spec = yaml.safe_load(text)["spec"]
        spec = spec.get("rayClusterSpec", spec)
        pods = [spec["headGroupSpec"]["template"]["spec"], *(g["template"]["spec"] for g in spec["workerGroupSpecs"])]
        assert {p["terminationGracePeriodSeconds"] for p in pods} == {300}
        assert all(c["envFrom"] == [{"secretRef": {"name": "agentrl-s3"}}] for p in pods for c in p["containers"])
        assert all('\\"gpu_gib\\": 80' in g["rayStartParams"]["resources"] for g in spec["workerGroupSpecs"])
        assert "ON_DEMAND" in str(pods[0]["nodeSelector"])
        assert all(any("spot" in str(t).lower() for t in p["tolerations"]) for p in pods[1:])


def test_a_node_the_run_leaves_idle_is_warned_about():
    # the quickstart's engine and learner on two 8-GPU nodes: the learner (one rank, a plain actor)
    # stays on the driver's node with the engine; the second node gets nothing
    r = plan(GPU, shape="nodes=2,gpus_per_node=8,cpus_per_node=64,gpu_gib=80", model_config=TINY)
    assert r.ok, r.render()
    assert r.where["rollout[0]"] == r.where["learner"] == ["node0"]
    (warning,) = r.warnings
    assert warning.startswith("node1 (8 GPU) gets none of the run's actors") and "rollout.num_workers" in warning
    assert "warning: node1 (8 GPU)" in r.render() and "plan: OK" in r.render()
    # two engines spread: one per node, no warning
    assert not plan([*GPU, "rollout.num_workers=2"], shape="nodes=2,gpus_per_node=8,cpus_per_node=64,gpu_gib=80",
                    model_config=TINY).warnings
    # a CPU head is the driver's node: not idle even when every actor is on the GPU nodes
    r = plan(GPU, shape="nodes=1,cpus_per_node=2+nodes=2,gpus_per_node=1,cpus_per_node=8", model_config=TINY)
    assert r.ok and not r.warnings, r.render()


def test_placement_groups_go_to_the_emptiest_node_and_plain_actors_avoid_gpu_nodes():
    shape = "nodes=1,cpus_per_node=4+nodes=3,gpus_per_node=4,cpus_per_node=32,gpu_gib=80"
    r = plan([*GPU, "rollout.num_workers=5", "learner.num_ranks=3", "tools.placement=pool", "tools.num_actors=2"],
             shape=shape, model_config=TINY)
    assert r.ok, r.render()
    assert [r.where[f"rollout[{i}]"][0] for i in range(5)] == ["node1", "node2", "node3", "node1", "node2"]
    # PACK: the best node for the first rank (node3: 3 GPUs free), as many ranks as fit there
    assert r.where["learner"] == ["node3", "node3", "node3"]
    assert r.where["tool_pool[0]"] == r.where["tool_pool[1]"] == ["node0"]  # CPU actors: the GPU-less head
    # a group that does not fit anywhere whole is not placed at all (Ray's groups are atomic)
    r = plan([*GPU, "rollout.num_workers=10", "learner.num_ranks=4"], shape=shape, model_config=TINY)
    assert r.where["learner"] == [None] * 4 and not r.ok, r.render()


# ------------------------------------------------------------------------------------ the CLI
@pytest.fixture
def fake_driver(monkeypatch):
    calls = []
    module = types.ModuleType("agentrl.driver.run")
    module.train = lambda config, config_path: calls.append(config)
    monkeypatch.setitem(sys.modules, "agentrl.driver.run", module)
    return calls


def test_plan_cli_declared(capsys, qwen3_4b):
    from agentrl.cli import main

    shape = "nodes=1,gpus_per_node=8,cpus_per_node=64,gpu_gib=80"
    assert main(["plan", BFCL, "--cluster", shape, "--model-config", str(qwen3_4b)]) == 0
    out = capsys.readouterr().out
    assert "plan: OK" in out and re.search(r"^learner\s+2 x \{CPU: 8, GPU: 1\}\s+PACK\s+node0 x2$", out, re.M), out
    assert re.search(r"^rollout\[0\.\.5\]\s+\{CPU: 4, GPU: 1\}\s+STRICT_PACK each\s+node0 x6$", out, re.M), out
    assert main(["plan", BFCL, "learner.num_ranks=1", "rollout.num_workers=7", "--cluster", shape,
                 "--model-config", str(qwen3_4b)]) == 2
    captured = capsys.readouterr()
    assert "plan: cannot run:" in captured.out and "learner: " in captured.out and "DOES NOT FIT" in captured.out
    assert captured.err.startswith("error: the run cannot start as configured")
    assert main(["plan", BFCL, "rollout.bogus=1"]) == 2 and "rollout.bogus" in capsys.readouterr().err  # the loader's error
    assert main(["plan", QUICKSTART, "--cluster", "nodes=2"]) == 2
    assert "--cluster nodes=2: node group 1" in capsys.readouterr().err


def test_train_runs_the_plan_check_first(monkeypatch, fake_driver, capsys):
    from agentrl.cli import main

    monkeypatch.setattr(plan_module, "cluster_for_run", lambda cfg: parse_shape("nodes=1,cpus_per_node=4"))
    assert main(["train", QUICKSTART, *GPU]) == 2 and fake_driver == []  # no GPUs here: stopped before the driver
    err = capsys.readouterr().err
    assert "runtime.learner_gpus=1 but the cluster has no GPUs" in err and "--no-plan skips this check" in err
    assert main(["train", QUICKSTART, *GPU, "--no-plan"]) == 0 and len(fake_driver) == 1
    assert main(["train", QUICKSTART]) == 0 and len(fake_driver) == 2
    assert capsys.readouterr().out.startswith("plan: OK (")
    monkeypatch.setattr(plan_module, "cluster_for_run", lambda cfg: parse_shape("nodes=1,cpus_per_node=4,gpus_per_node=2"))
    assert main(["train", QUICKSTART]) == 2  # a GPU machine: CPU actors refused...
    assert main(["train", QUICKSTART, "--allow-cpu"]) == 0 and len(fake_driver) == 3  # ...unless allowed


# ------------------------------------------------------------------------------- a real Ray cluster
@pytest.fixture(scope="module")
def gpu_cluster():
    """A one-node Ray cluster declaring 2 GPUs (and 80 GiB each, as a gpu_gib resource) on loopback,
    in a temp folder of its own, without auth (loopback only); stopped by its own pid, never `ray stop`."""
    tmp = Path(tempfile.mkdtemp(prefix="arp-", dir="/tmp"))  # short: Ray's socket paths must fit AF_UNIX
    gcs, agent, client, dashboard = free_ports(4)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update(RAY_AUTH_MODE="disabled", AGENTRL_PLAN_WAIT_S="0")
    ray_bin = str(Path(sys.executable).parent / "ray")
    proc = subprocess.Popen(
        [ray_bin, "start", "--head", "--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1",
         "--port", str(gcs), "--num-cpus", "4", "--num-gpus", "2", "--resources", '{"gpu_gib": 80}',
         "--include-dashboard", "false", "--dashboard-port", str(dashboard), "--dashboard-agent-listen-port", str(agent),
         "--ray-client-server-port", str(client), "--temp-dir", str(tmp)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    address = f"127.0.0.1:{gcs}"
    try:
        deadline = time.monotonic() + 90
        while True:
            up = subprocess.run([ray_bin, "status", "--address", address], env=env, capture_output=True, text=True, timeout=60)
            if up.returncode == 0 and "GPU" in up.stdout:
                break
            assert proc.poll() is None and time.monotonic() < deadline, f"Ray did not start: {up.stdout}{up.stderr}"
            time.sleep(1)
        yield env, address
    finally:
        stop_node(proc, [str(tmp), f":{gcs}"])
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


def _agentrl(env: dict, *argv: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.integration
def test_plan_on_a_ray_cluster_with_declared_gpus(gpu_cluster):
    env, address = gpu_cluster
    ok = _agentrl(env, "plan", QUICKSTART, *GPU, "--address", address, "--reserve")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "Ray cluster at 127.0.0.1" in ok.stdout and "2 GPU x 80 GiB" in ok.stdout and "plan: OK" in ok.stdout
    assert "reserve: Ray placed every placement group of the plan" in ok.stdout

    four = _agentrl(env, "plan", QUICKSTART, *GPU, "rollout.num_workers=3", "--address", address)
    assert four.returncode == 2, four.stdout + four.stderr
    assert "plan: cannot run:" in four.stdout and "the plan asks for 4 GPU" in four.stdout
    assert "does not fit next to the roles placed before it" in four.stdout

    # `agentrl train` stops before a run folder or an actor exists (AGENTRL_PLAN_WAIT_S=0: no waiting for nodes)
    train = _agentrl(env | {"RAY_ADDRESS": address}, "train", QUICKSTART, *GPU, "rollout.num_workers=3",
                     "run.output_dir=/nonexistent/runs")
    assert train.returncode == 2 and "the run cannot start as configured" in train.stderr, train.stdout + train.stderr
    assert "does not fit next to the roles placed before it" in train.stderr


@pytest.mark.integration
def test_runtime_engine_group_gives_a_tp_engine_its_gpus(gpu_cluster):
    """RolloutSide's own placement group for a TP-2 engine, on the declared GPUs: the actor in it
    sees both (Ray counts declared GPUs; no CUDA needed)."""
    env, address = gpu_cluster
    code = f"""
import ray
from agentrl.config import load_config
from agentrl.driver.cluster import _engine_group_options
cfg = load_config({QUICKSTART!r}, ["rollout.engine.tensor_parallel_size=2", "runtime.rollout_worker_gpus=2"])
ray.init(address={address!r}, log_to_driver=False)
@ray.remote
class Engine:
    def gpus(self):
        return ray.get_gpu_ids()
opts = _engine_group_options(cfg, {{"num_cpus": 1, "num_gpus": 2}})
print("GPUS", sorted(ray.get(Engine.options(**opts).remote().gpus.remote(), timeout=60)))
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0 and "GPUS [0, 1]" in res.stdout, res.stdout + res.stderr


@pytest.fixture(scope="module")
def two_gpu_nodes():
    """A 3-node Ray cluster on loopback, shaped like deploy/*-2x8.yaml: a head with 8 CPUs and no
    GPUs, two nodes declaring 96 CPUs, 8 GPUs and gpu_gib 80 (no CUDA needed: Ray counts declared
    GPUs) and ~256 GiB of host memory (Ray's logical `memory`, which `agentrl plan` counts). Stopped
    by its own pids, never `ray stop`."""
    tmp = Path(tempfile.mkdtemp(prefix="arp2-", dir="/tmp"))
    gcs, client, dashboard, *agents = free_ports(6)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update(RAY_AUTH_MODE="disabled", AGENTRL_PLAN_WAIT_S="0")
    ray_bin = str(Path(sys.executable).parent / "ray")
    address = f"127.0.0.1:{gcs}"
    common = ["start", "--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]
    procs = [subprocess.Popen(
        [ray_bin, *common, "--head", "--port", str(gcs), "--num-cpus", "8", "--num-gpus", "0", "--memory", str(24 * 2**30),
         "--include-dashboard",
         "false", "--dashboard-port", str(dashboard), "--dashboard-agent-listen-port", str(agents[0]),
         "--ray-client-server-port", str(client), "--temp-dir", str(tmp)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)]
    try:
        _wait_for(ray_bin, env, address, procs, lambda out: "CPU" in out)
        for k in (1, 2):
            procs.append(subprocess.Popen(
                [ray_bin, *common, "--address", address, "--num-cpus", "96", "--num-gpus", "8", "--memory", str(240 * 2**30),
                 "--resources", '{"gpu_gib": 80}', "--dashboard-agent-listen-port", str(agents[k]),
                 "--temp-dir", str(tmp / f"worker{k}")],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True))
        _wait_for(ray_bin, env, address, procs, lambda out: "16.0 GPU" in out)
        yield env, address
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                stop_node(proc, [str(tmp), f":{gcs}"])
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


def _wait_for(ray_bin: str, env: dict, address: str, procs: list, ready, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        up = subprocess.run([ray_bin, "status", "--address", address], env=env, capture_output=True, text=True, timeout=60)
        if up.returncode == 0 and ready(up.stdout):
            return
        dead = [p.stdout.read() for p in procs if p.poll() is not None]
        assert not dead and time.monotonic() < deadline, f"Ray: {up.stdout}{up.stderr}{dead}"
        time.sleep(1)


@pytest.mark.integration
def test_plan_places_as_ray_does_on_two_gpu_nodes(two_gpu_nodes, qwen3_4b):
    """The 2x8 recipe planned against a running Ray cluster of that shape (read by
    ``connected_cluster``: the gpu_gib resource, the head first) and its placement groups created
    there in the driver's order: Ray puts every engine and learner rank on a node the plan's layout
    matches (node names up to swapping the two identical GPU nodes), both GPU nodes used. Run in a
    fresh process: this one may be connected to the session's embedded cluster already."""
    import multiprocessing

    child = multiprocessing.get_context("spawn").Process(target=_places_as_ray_does, args=(two_gpu_nodes[1], str(qwen3_4b)))
    child.start()
    child.join(timeout=600)
    assert child.exitcode == 0, "the placement check failed in its process (its traceback is in the captured stderr)"


def _places_as_ray_does(address: str, qwen3_4b: str) -> None:
    import ray

    from agentrl.planning.cluster_shape import connected_cluster
    from agentrl.planning.plan import reserve_where

    config, overrides = recipe_run(ROOT / "deploy" / "rayjob-2x8.yaml")
    cfg = load_config(config, overrides)
    old = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    try:
        cluster = connected_cluster(address)
        assert [n.gpus for n in cluster.nodes] == [0, 8, 8] and cluster.nodes[1].gpu_gib == 80
        report = check_plan(cfg, cluster, model_config=qwen3_4b)
        assert report.ok and not report.warnings, report.render()
        ray.init(address=address, log_to_driver=False)
        try:
            ids = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
            by_ray = reserve_where(report, timeout_s=60)
        finally:
            ray.shutdown()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    name_of = {node_id: next(n.name for n in cluster.nodes if node_id[:8] in n.name) for node_id in ids}
    grouped = [r.name for r in report.roles if r.group]
    assert grouped and all(None not in by_ray[name] for name in grouped), by_ray

    def layout(where: dict) -> list:
        """Per GPU node, the roles on it: comparable across a swap of the two GPU nodes."""
        nodes = {}
        for name in grouped:
            for node in where[name]:
                nodes.setdefault(node, []).append(name.split("[")[0])
        return sorted(sorted(Counter(v).items()) for v in nodes.values())

    ours = layout(report.where)
    theirs = layout({name: [name_of[i] for i in by_ray[name]] for name in grouped})
    assert ours == theirs, (ours, theirs)
    assert ours == [[("learner", 2), ("rollout", 6)], [("rollout", 7)]], ours
