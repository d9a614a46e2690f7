"""CLI: bad configs exit 2 before anything exists; subcommands wire to their implementations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.config.process_env import CACHE_DIRS

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")


def run_cli(args: list[str], cwd: Path, module: str = "agentrl.cli", env: dict | None = None):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, env=env)


@pytest.mark.parametrize("module", ["agentrl.cli", "agentrl"])
def test_help(tmp_path, module):
    res = run_cli(["--help"], tmp_path, module)
    assert res.returncode == 0, res.stderr
    for command in ("train", "make-model", "show", "tasks"):
        assert command in res.stdout
    res = run_cli(["tasks", "export", "--help"], tmp_path, module)
    assert res.returncode == 0 and "SOURCE" in res.stdout


def test_no_command_is_a_usage_error(tmp_path):
    assert run_cli([], tmp_path).returncode == 2


@pytest.mark.parametrize("override, key", [("rollout.bogus=1", "rollout.bogus"),
                                           ("train.steps=abc", "train.steps")])
def test_train_bad_override_exits_2_before_anything(tmp_path, override, key):
    res = run_cli(["train", QUICKSTART, override], tmp_path)
    assert res.returncode == 2
    assert res.stderr.startswith("error: ") and key in res.stderr and QUICKSTART in res.stderr
    assert res.stdout == ""
    assert list(tmp_path.iterdir()) == []  # no runs/, no .cache/


def test_train_bad_file_value_names_file_line_key(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("run:\n  name: x\nrollout:\n  group_size: -3\n")
    res = run_cli(["train", str(config)], tmp_path)
    assert res.returncode == 2
    assert f"{config}:4: rollout.group_size" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_config_error_path_imports_no_torch_or_ray(tmp_path):
    code = ("import sys; from agentrl.cli import main; rc = main(['train', sys.argv[1], 'x.y=1']); "
            "heavy = [m for m in ('torch', 'ray', 'vllm', 'deepspeed') if m in sys.modules]; "
            "print(rc, heavy)")
    res = subprocess.run([sys.executable, "-c", code, QUICKSTART], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "2 []", res.stderr


def test_import_changes_no_environment_and_main_sets_the_defaults(tmp_path):
    """Importing agentrl.cli leaves os.environ alone (a library user's process is not changed
    behind its back); running a command fills in the offline and cache defaults first."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"AGENTRL_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", *CACHE_DIRS}}
    env["TRITON_CACHE_DIR"] = "/custom/triton"
    code = ("import json, os, agentrl.cli as cli; before = dict(os.environ); rc = cli.main(['train']); "
            "print(json.dumps([rc, before, dict(os.environ)]))")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    rc, before, seen = json.loads(res.stdout)
    assert before == env and rc == 2  # `agentrl train` without a config: bad input
    cache = tmp_path.resolve() / ".cache"
    assert seen["HF_HUB_OFFLINE"] == "1" and seen["TRANSFORMERS_OFFLINE"] == "1"
    assert seen["HF_HOME"] == str(cache / "hf")
    assert seen["TORCH_EXTENSIONS_DIR"] == str(cache / "torch_extensions")
    assert seen["TRITON_CACHE_DIR"] == "/custom/triton"


@pytest.fixture
def fake_module(monkeypatch):
    """Install a stand-in module (the real driver/model builder are heavy or not written yet)."""

    def install(name: str, **attrs) -> types.ModuleType:
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
        return module

    return install


def test_train_calls_driver(fake_module, tmp_path):
    calls = []
    fake_module("agentrl.driver.run", train=lambda config, config_path: calls.append(
        (config, config_path)))
    assert main(["train", QUICKSTART, "train.steps=3"]) == 0
    (config, path), = calls
    assert config.train.steps == 3 and path == QUICKSTART


def test_train_interrupted_exits_130(fake_module, capsys):
    def train(config, config_path):
        raise KeyboardInterrupt

    fake_module("agentrl.driver.run", train=train)
    assert main(["train", QUICKSTART]) == 130


def test_make_model_wiring(fake_module, tmp_path, capsys):
    from agentrl.models.tiny_model import SHIPPED, TinyModelRecipe  # the real recipe; only the build is faked

    calls = []
    fake_module("agentrl.models.tiny_model", TinyModelRecipe=TinyModelRecipe, SHIPPED=SHIPPED,
                make_model=lambda out_dir, seed, force, recipe, base: calls.append((out_dir, seed, force, recipe, base)))
    assert main(["make-model", "--out", str(tmp_path / "m"), "--seed", "7", "--force"]) == 0
    assert main(["make-model", "model.path=elsewhere/model"]) == 0
    assert main(["make-model"]) == 0
    assert [c[:3] for c in calls] == [(str(tmp_path / "m"), 7, True), ("elsewhere/model", 0, False),
                                      (".cache/models/tiny-agent", 0, False)]
    assert calls[0][3] == TinyModelRecipe(seed=7) and calls[2][3] == TinyModelRecipe() and calls[2][4] is None
    assert main(["make-model", "model.nope=1"]) == 2
    assert "model.nope" in capsys.readouterr().err
    # the quickstart trains the shipped model in place: make-model must not rebuild it there
    assert main(["make-model", "--config", QUICKSTART, "--force"]) == 2
    assert "shipped with agentrl" in capsys.readouterr().err and len(calls) == 3

    # the recipe's options: stage 2 from a saved stage-1 folder, habit rates, located errors
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    assert main(["make-model", "--guess-missing", "0.5", "--skip-lookup", "0", "--habit-steps", "10", "--base", str(base)]) == 0
    assert calls[-1][3] == TinyModelRecipe(guess_missing=0.5, skip_lookup=0.0, habit_steps=10) and calls[-1][4] == str(base)
    assert main(["make-model", "--sft-batch", "8", "--habit-tasks", "100"]) == 0
    assert calls[-1][3] == TinyModelRecipe(sft_batch=8, habit_tasks=100)
    assert main(["make-model", "--guess-missing", "1.5"]) == 2
    assert "--guess-missing" in capsys.readouterr().err
    assert main(["make-model", "--habit-suite", "nope"]) == 2
    assert "--habit-suite" in capsys.readouterr().err
    assert main(["make-model", "--base", str(tmp_path / "missing")]) == 2
    assert "--base: no model" in capsys.readouterr().err


def test_tasks_export(tmp_path, capsys):
    """The real export: a named source to a file that loads back; a bad source exits 2, naming it."""
    from agentrl.tasks.io import load_tasks

    out = tmp_path / "out.jsonl"
    assert main(["tasks", "export", "builtin:bank-heldout", str(out)]) == 0
    assert "200 tasks" in capsys.readouterr().out
    assert [t.id for t in load_tasks(out)][:1] == ["builtin-bank-heldout-00000"]
    assert main(["tasks", "export", str(tmp_path / "missing.jsonl"), str(out)]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


def test_tasks_export_real(tmp_path):
    out = tmp_path / "heldout.jsonl"
    res = run_cli(["tasks", "export", "builtin:heldout", str(out)], tmp_path)
    assert res.returncode == 0, res.stderr
    assert len(out.read_text().splitlines()) > 0
    res = run_cli(["tasks", "export", str(tmp_path / "nope.jsonl"), str(out)], tmp_path)
    assert res.returncode == 2 and res.stderr.startswith("error: ")


def test_missing_model_fails_before_run_folder_and_ray(tmp_path):
    """The real `agentrl train` (no fakes): a missing model is reported before anything starts."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", QUICKSTART, f"model.path={tmp_path / 'nope'}",
         f"run.output_dir={tmp_path / 'runs'}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert f"model.path: no model at {tmp_path / 'nope'}" in proc.stderr
    assert not (tmp_path / "runs").exists()
    assert "Started a local Ray instance" not in proc.stderr


def test_bad_task_source_fails_before_run_folder_and_ray(tmp_path, tiny_model_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", QUICKSTART, f"model.path={tiny_model_dir}",
         "tasks.heldout=bfcl:nope", f"run.output_dir={tmp_path / 'runs'}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "tasks.heldout: unknown task source 'bfcl:nope'" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "runs").exists()


def test_rods_config_errors_fail_before_run_folder_and_ray(tmp_path, tiny_model_dir):
    base = [sys.executable, "-m", "agentrl.cli", "train", QUICKSTART, f"model.path={tiny_model_dir}",
            f"run.output_dir={tmp_path / 'runs'}", "rods.enabled=true"]
    # the quickstart draws fresh tasks each step; RODS needs a fixed seed set
    proc = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "rods.enabled" in proc.stderr and "tasks.fresh_train=false" in proc.stderr, proc.stderr
    proc = subprocess.run(base + ["tasks.fresh_train=false", f"rods.resume_from={tmp_path / 'nope.json'}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"rods.resume_from: cannot read the pool state {tmp_path / 'nope.json'}" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "runs").exists()



SHIPPED_MODEL = str(ROOT / "agentrl" / "assets" / "tiny-agent")
BAD_INPUTS = {  # case -> (model, task source or None, what stderr says); {tmp} is the test's folder
    "missing model": ("{tmp}/nope", None, "model.path: no model at {tmp}/nope"),
    "missing task file": (SHIPPED_MODEL, "{tmp}/nope.jsonl", "unknown task source '{tmp}/nope.jsonl'"),
    "malformed task file": (SHIPPED_MODEL, "{tmp}/bad.jsonl", "{tmp}/bad.jsonl:1: invalid JSON"),
}


@pytest.mark.parametrize("command", ["train", "eval"])
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_from_train_and_eval(tmp_path, command, case):
    """Every bad input is exit 2 with a located message, from `train` as from `eval`, before a run
    folder, an eval output or Ray exists."""
    (tmp_path / "bad.jsonl").write_text('{"id": \n')
    model, tasks, says = (x and x.format(tmp=tmp_path) for x in BAD_INPUTS[case])
    if command == "train":
        argv = ["train", QUICKSTART, f"model.path={model}", *([f"tasks.heldout={tasks}"] if tasks else [])]
        says = f"tasks.heldout: {says}" if tasks else says
    else:
        argv = ["eval", "--model", model, "--tasks", tasks or "builtin:heldout"]
    res = run_cli(argv, tmp_path, module="agentrl")
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.startswith("error: ") and says in res.stderr, res.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]  # no runs/, .cache/ or eval output
    assert "Started a local Ray instance" not in res.stderr
