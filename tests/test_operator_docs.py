"""The cluster operator's docs hold against the code and the manifests (issue 40).

* every key `--resume` accepts (`agentrl/config/resume.py`, `RESUMABLE`) is in docs/operating.md's
  list, and the list names nothing else;
* every pod of every KubeRay manifest has the same termination grace, a preStop hook that passes
  the pod's SIGTERM on to the run and waits less than the grace, and a RayJob's
  `RAY_JOB_STOP_WAIT_TIME_S` (how long `ray job stop` waits before its SIGKILL) fits inside it;
* the task id each `agentrl show --task` example of README.md and docs/ names is one the
  quickstart trains on;
* the statements issue 40 found false stay gone (a README statement from the docs pages too, where
  the README's detail moved).

Static checks only: no Ray, torch or network.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from agentrl.config import load_config
from agentrl.config.resume import RESUMABLE

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((ROOT / "deploy").glob("*.yaml"))


def _section(text: str, start: str, end: str) -> str:
    return text[text.index(start):text.index(end, text.index(start))]


def test_operating_md_lists_exactly_the_keys_resume_accepts():
    text = (ROOT / "docs" / "operating.md").read_text()
    overrides = _section(text, "**Overrides.**", "Any other change")
    named = set(re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)(?:\.\*)?`", overrides))
    named |= {m for m in re.findall(r"`([a-z_]+)\.\*`", overrides)}  # a whole section (`telemetry.*`)
    assert named == set(RESUMABLE), (sorted(set(RESUMABLE) - named), sorted(named - set(RESUMABLE)))


def _pods(manifest: dict) -> list[dict]:
    spec = manifest["spec"]
    spec = spec.get("rayClusterSpec", spec)
    return [spec["headGroupSpec"]["template"]["spec"], *(g["template"]["spec"] for g in spec["workerGroupSpecs"])]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_pod_has_the_same_grace_and_ray_job_stop_waits_within_it(path):
    manifest = yaml.safe_load(path.read_text())
    graces = {pod.get("terminationGracePeriodSeconds") for pod in _pods(manifest)}
    assert len(graces) == 1 and None not in graces, f"{path.name}: {graces}"
    grace = graces.pop()
    if manifest["kind"] == "RayJob":
        env = yaml.safe_load(manifest["spec"]["runtimeEnvYAML"])["env_vars"]
        assert 0 < int(env["RAY_JOB_STOP_WAIT_TIME_S"]) < grace, path.name
    # the storage secret on every container (the driver and every learner rank write to run.storage)
    for pod in _pods(manifest):
        for container in pod["containers"]:
            assert any(e.get("secretRef", {}).get("name") == "agentrl-s3" for e in container.get("envFrom", [])), path.name
    # GPU workers advertise the GPU memory their `# agentrl-plan-shape:` line declares (the plan check reads it)
    spec = manifest["spec"].get("rayClusterSpec", manifest["spec"])
    shape = re.search(r"^#\s*agentrl-plan-shape:\s*(\S+)", path.read_text(), re.M).group(1)
    declared = {float(g) for g in re.findall(r"gpu_gib=([\d.]+)", shape)}
    advertised = {json.loads(json.loads(g["rayStartParams"]["resources"]))["gpu_gib"] for g in spec["workerGroupSpecs"]}
    assert advertised == declared, (path.name, advertised, declared)
    # every container passes the pod's SIGTERM on to the run first (agentrl/checkpointing/prestop.py), within the grace
    for pod in _pods(manifest):
        for container in pod["containers"]:
            command = container["lifecycle"]["preStop"]["exec"]["command"]
            assert command[:3] == ["python", "-m", "agentrl.checkpointing.prestop"], (path.name, command)
            assert 0 < float(command[command.index("--timeout") + 1]) < grace, (path.name, command)


@pytest.mark.parametrize("doc", ["README.md", "docs/quickstart.md", "docs/monitoring.md"])
def test_show_example_names_a_task_the_quickstart_trains_on(doc):
    from agentrl.driver.task_sources import TaskSampler

    text = (ROOT / doc).read_text()
    lines = [x for x in text.splitlines() if x.startswith("agentrl show") and "--task" in x]
    assert lines, f"{doc} has no `agentrl show ... --task` example"
    cfg = load_config(str(ROOT / "configs" / "quickstart.yaml"))
    for line in lines:
        argv = shlex.split(line.split(" #", 1)[0])
        task = argv[argv.index("--task") + 1]
        step = int(re.search(r"fresh\d{3}(\d{4})-", task).group(1))  # the fresh-task seed counts the steps
        sampler = TaskSampler(cfg, [], set())
        batches = [sampler.next(cfg.rollout.tasks_per_step) for _ in range(step)]
        assert step <= cfg.train.steps and task in {t.id for t in batches[-1]}, [t.id for t in batches[-1]]
        # recorded by then: trajectories are written every telemetry.trajectories_every steps
        assert step % cfg.telemetry.trajectories_every == 0 or step == cfg.train.steps, (doc, step)


@pytest.mark.parametrize("path, false_statement", [
    ("docs/design.md", "does not yet use placement groups"),
    ("docs/gpu.md", "and multi-rank learners."),
    ("docs/operating.md", "the only part built so far"),
    ("docs/operating.md", "first-fit decreasing"),
    ("README.md", "builtin-train-00005"),
    ("README.md", "A SIGTERM (spot reclaim, `kubectl delete`, `ray job stop`) lets the step"),
    ("README.md", "vLLM 0.33.0"),
    ("docker/Dockerfile.gpu", "vllm==0.33.0"),
    ("docs/gpu.md", "learner.attn_implementation=flash_attention_2 \\\n"),
    ("README.md", "pip install 'agentrl[trackers]'"),
    ("docs/configuration.md", "pip install 'agentrl[trackers]'"),
    ("README.md", "as a gauge named `agentrl_*`"),
    ("docs/operating.md", "Only the driver handles SIGTERM"),
])
def test_statements_found_false_stay_gone(path, false_statement):
    paths = [ROOT / path] + (sorted((ROOT / "docs").glob("*.md")) if path == "README.md" else [])
    for doc in paths:
        assert false_statement not in doc.read_text(), doc
