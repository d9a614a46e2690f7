"""`agentrl make-model --pretrained DIR`: stage 2 (the imperfect teacher) on any pretrained HF folder.

The shipped tiny model stands in for "a pretrained model", so the end-to-end test costs about a
minute (most of it listing the held-out tasks stage 2 leaves out), not a SmolLM2 build."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.models.tiny_model import SHIPPED, STAMP

REPO = Path(__file__).resolve().parents[1]
SMOLLM2 = REPO / ".cache" / "models" / "smollm2-135m-instruct"


def _without_pad_token(src: Path, dst: Path) -> Path:
    """A copy of the model folder whose tokenizer sets no pad token (as many pretrained ones do)."""
    import shutil

    from transformers import AutoTokenizer

    shutil.copytree(src, dst)
    tok = AutoTokenizer.from_pretrained(src)
    tok.pad_token = None
    tok.save_pretrained(dst)
    return dst


def test_pretrained_stage2_end_to_end(tmp_path, capsys):
    """Also the no-pad-token path: the source is the shipped model with its pad token removed, so
    stage 2 must pad with the end token (padding is masked: tests/test_sft.py shows any id pads)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = _without_pad_token(SHIPPED, tmp_path / "source")
    assert AutoTokenizer.from_pretrained(source).pad_token_id is None
    out = tmp_path / "warm"
    args = ["make-model", "--pretrained", str(source), "--out", str(out), "--habit-steps", "2", "--habit-tasks", "8",
            "--sft-batch", "2", "agent.system_prompt=You are a careful bank assistant."]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "habits fired" in printed and "sft step 2/2" in printed

    model = AutoModelForCausalLM.from_pretrained(out)
    tok, src_tok = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(source)
    assert model.config.vocab_size == len(tok)
    # a pretrained model keeps its own tokenizer and chat template
    assert tok.get_vocab() == src_tok.get_vocab() and tok.chat_template == src_tok.chat_template
    before, after = load_file(source / "model.safetensors"), load_file(out / "model.safetensors")
    assert before.keys() == after.keys() and any(not before[k].equal(after[k]) for k in before)

    stamp = json.loads((out / STAMP).read_text())
    recipe = stamp["recipe"]
    assert recipe["pretrained"] == str(source.resolve()) and recipe["max_tokens"] == 2048
    assert (recipe["habit_steps"], recipe["habit_tasks"], recipe["sft_batch"]) == (2, 8, 2)
    assert recipe["habit_lr"] == 2e-5 and "sft_steps" not in recipe  # the pretrained default; no stage 1
    assert math.isfinite(stamp["final_sft_loss"]) and stamp["seconds"] > 0
    # the override is the agent config the demonstrations were rendered with, recorded in the stamp
    assert recipe["agent"]["system_prompt"] == "You are a careful bank assistant."

    assert main(args) == 0  # same source and recipe: reused, not retrained
    assert "reusing" in capsys.readouterr().out


def test_pretrained_errors_exit_2_naming_the_flag_before_torch(tmp_path):
    no_config = tmp_path / "empty"
    no_config.mkdir()
    out = str(tmp_path / "out")
    cases = [
        (["--pretrained", str(tmp_path / "missing"), "--out", out], "--pretrained: no HF model folder"),
        (["--pretrained", str(no_config), "--out", out], "--pretrained: no HF model folder"),
        (["--pretrained", str(SHIPPED), "--out", out, "--base", str(SHIPPED)], "--pretrained and --base"),
        (["--pretrained", str(SHIPPED), "--out", out, "--sft-steps", "3"], "--sft-steps"),
        (["--pretrained", str(SHIPPED)], "--pretrained needs --out"),
        (["--pretrained", str(SHIPPED), "--out", str(SHIPPED)], "shipped with agentrl"),
        (["--pretrained", str(SHIPPED), "--out", out, "--habit-steps", "0"], "--habit-steps"),
        (["--pretrained", str(SHIPPED), "--out", out, "--sft-batch", "0"], "--sft-batch"),
        (["--pretrained", str(SHIPPED), "--out", out, "--skip-lookup", "2"], "--skip-lookup"),
        (["--pretrained", str(SHIPPED), "--out", out, "agent.nope=1"], "agent.nope"),
    ]
    # one subprocess for all cases: the errors must come before torch is imported
    code = ("import json, sys; from agentrl.cli import main\n"
            "for args in json.loads(sys.argv[1]):\n"
            "    print(main(['make-model', *args]), file=sys.stderr)\n"
            "print('torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code, json.dumps([a for a, _ in cases])], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "False", res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 2 * len(cases), res.stderr  # an error line, then the exit code
    for (args, expected), (error, rc) in zip(cases, zip(lines[::2], lines[1::2]), strict=True):
        assert rc == "2" and error.startswith("error: "), (args, error, rc)
        assert expected is None or expected in error, (args, error)
    assert not (tmp_path / "out").exists()


def test_pretrained_source_equal_to_out_is_refused(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    assert main(["make-model", "--pretrained", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert "is the --pretrained folder" in capsys.readouterr().err


@pytest.mark.skipif(not (SMOLLM2 / "tokenizer.json").exists(), reason="SmolLM2 not materialized in .cache/models")
def test_stage2_demonstrations_render_with_smollm2s_tokenizer():
    """Stage 2's sequences in another tokenizer (49k vocabulary; the tokenizer only, no model)."""
    from transformers import AutoTokenizer

    from agentrl.agent.chat import formatter_for
    from agentrl.agent.teacher import Habits
    from agentrl.envs.builtin.generator import generate_tasks
    from agentrl.models.sft import sft_sequences

    tok = AutoTokenizer.from_pretrained(SMOLLM2)
    formatter = formatter_for(tok, None)
    tasks = generate_tasks(6, seed=20_000, id_prefix="habit", suite="bank")
    sequences = sft_sequences(tasks, formatter, 2048, habits=Habits(guess_missing=1.0, skip_lookup=1.0), log=lambda *a: None)
    assert len(sequences) == len(tasks)
    for ids, mask in sequences:
        assert len(ids) == len(mask) and max(ids) < len(tok) and 0 < sum(mask) < len(ids)
        policy = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
        assert "<tool_call>" in policy and policy.count("<|im_end|>") >= 1
    assert any(t >= 640 for ids, _ in sequences for t in ids)  # not the tiny model's 640-token vocabulary
