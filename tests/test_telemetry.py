"""Telemetry: sinks survive failures; progress line, tables and report render anywhere."""

from __future__ import annotations

import io
import json
import logging
import sys
import types

import pytest

from agentrl.api import GroupSummary
from agentrl.config.process_env import CACHE_DIRS, set_default_env
from agentrl.telemetry.metrics import MetricsSink, pick, ray_metric_name
from agentrl.telemetry.progress import ProgressLine, eval_table, format_step
from agentrl.telemetry.report import read_metrics, write_report
from agentrl.telemetry.summaries import eval_metrics, step_metrics, summarize

STEP = {"train/success": 0.41, "train/progress": 0.55, "train/reward_std": 0.32,
        "perf/tokens_per_s": 1234.0, "time/generate": 5.1, "time/learn": 2.0, "time/sync": 0.1,
        "train/policy_lag": 0}


def tb_scalars(path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(path))
    acc.Reload()
    out = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    # tensorboard.summary.Writer writes new-style summaries: tensors tagged with the scalars plugin
    for tag in acc.Tags()["tensors"]:
        assert acc.SummaryMetadata(tag).plugin_data.plugin_name == "scalars"
        out[tag] = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                    for e in acc.Tensors(tag)]
    return out


def test_sink_writes_jsonl_and_tensorboard(tmp_path):
    with MetricsSink(tmp_path, None, "r") as sink:
        sink.log(1, {"train/success": 0.25, "n": 3, "flag": True, "note": "text",
                     "x": float("nan")})
        sink.log(2, {"train/success": 0.5})
    lines = [json.loads(t) for t in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]
    assert lines[0]["train/success"] == 0.25 and lines[0]["n"] == 3.0 and lines[0]["flag"] == 1.0
    assert "note" not in lines[0] and lines[0]["x"] is None  # strings dropped, NaN -> null
    assert all(isinstance(r["time"], float) and r["elapsed_s"] >= 0 for r in lines)
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert tb_scalars(tmp_path / "tb")["train/success"] == [(1, 0.25), (2, 0.5)]


def test_sink_appends_and_respects_config(tmp_path):
    cfg = types.SimpleNamespace(jsonl=True, tensorboard=False, ray_metrics=False)
    for step in (1, 2):
        with MetricsSink(tmp_path, cfg, "r") as sink:
            sink.log(step, {"a": step})
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    assert not (tmp_path / "tb").exists()


def test_sink_falls_back_to_tensorboard_writer(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now fails
    with MetricsSink(tmp_path, None, "r") as sink:
        assert type(sink._tb).__module__.startswith("tensorboard.summary")
        sink.log(3, {"loss": 1.5})
    assert tb_scalars(tmp_path / "tb")["loss"] == [(3, 1.5)]


def test_failing_sink_warns_once_and_others_continue(tmp_path, caplog):
    class Broken:
        def add_scalar(self, *a):
            raise OSError("disk full")

        def flush(self):
            pass

        def close(self):
            raise OSError("disk full")

    sink = MetricsSink(tmp_path, None, "r")
    sink._tb.close()
    sink._tb = Broken()
    with caplog.at_level(logging.WARNING, logger="agentrl.telemetry.metrics"):
        for step in range(3):
            sink.log(step, {"a": 1.0})
        sink.close()
    warnings = [r for r in caplog.records if "tensorboard" in r.getMessage()]
    assert len(warnings) == 1 and "disk full" in warnings[0].getMessage()
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 3


@pytest.mark.integration
def test_ray_gauges_created_lazily_with_run_tag(tmp_path, ray_cluster):
    """Real Ray: one gauge per metric name, tagged with the run, created on first use."""
    cfg = types.SimpleNamespace(jsonl=False, tensorboard=False, ray_metrics=True)
    with MetricsSink(tmp_path, cfg, "run-1") as sink:
        sink.log(1, {"train/success": 0.5, "time/gen-s": 2.0})
        sink.log(2, {"train/success": 0.75})
        gauges = dict(sink._gauges)
    assert sorted(gauges) == ["agentrl_time_gen_s", "agentrl_train_success"]
    assert type(gauges["agentrl_train_success"]).__name__ == "Gauge"
    assert gauges["agentrl_train_success"].info["tag_keys"] == ("run",)


def test_ray_metric_name():
    assert ray_metric_name("eval/success@start") == "agentrl_eval_success_start"


def test_progress_line_plain_prints_one_line_per_step():
    out = io.StringIO()
    with ProgressLine(3, file=out) as line:
        assert not line.live
        for step in (1, 2, 3):
            line.update(step, STEP)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[0].startswith("step 1/3 | ")
    assert lines[2] == ("step 3/3 | success 0.41 | progress 0.55 | reward std 0.32 | 1.2k tok/s | "
                        "gen 5.1s learn 2.0s sync 0.1s | lag 0")


def test_format_step_leaves_out_missing_fields():
    assert format_step(2, 20, {"success": 0.5}) == "step 2/20 | success 0.50"
    assert format_step(7, None, {}) == "step 7"
    assert pick({"progress": "bad"}, "progress") is None


def test_eval_table_plain():
    out = io.StringIO()
    text = eval_table("held-out eval", {
        "start": {"success": 0.125, "progress": 0.4, "mean calls": 2.5, "episodes": 32},
        "end": {"success": 0.5, "progress": 0.75, "episodes": 32},
    }, file=out)
    assert out.getvalue().strip() == text
    rows = text.splitlines()
    assert rows[0] == "held-out eval"
    assert rows[1].split() == ["success", "progress", "mean", "calls", "episodes"]
    assert rows[2].split() == ["start", "0.125", "0.400", "2.500", "32"]
    assert rows[3].split() == ["end", "0.500", "0.750", "-", "32"]


def test_report_from_metrics(tmp_path):
    with MetricsSink(tmp_path, types.SimpleNamespace(jsonl=True, tensorboard=False,
                                                     ray_metrics=False), "r") as sink:
        for step in range(1, 6):
            sink.log(step, {**STEP, "train/success": step / 10})
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 6, "train/succ')  # torn last line
    path = write_report(tmp_path)
    assert path == tmp_path / "report.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_draws_rods_panels_when_the_run_used_rods(tmp_path):
    import struct

    def height(run_dir):  # PNG IHDR: width, height at bytes 16..24
        return struct.unpack(">II", (run_dir / "report.png").read_bytes()[16:24])[1]

    plain, rods = tmp_path / "plain", tmp_path / "rods"
    for run_dir, extra in ((plain, {}), (rods, {"pool/size": 70.0, "pool/seeds": 64.0, "pool/synthesized": 6.0,
                                                "pool/region_boundary": 0.5, "train/groups_with_variance": 0.75})):
        run_dir.mkdir()
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, **STEP, **extra}) + "\n" for s in (1, 2)))
        write_report(run_dir)
    assert height(rods) == height(plain) * 4 // 3  # one more row of panels (3 -> 4)


def test_report_panels_show_the_behaviours_and_categories_a_run_logged():
    from agentrl.telemetry.report import PANELS, report_panels

    plugin = report_panels([{"step": 0, "eval/success": 0.5, "eval/behaviour/listed_first": 1.0}])
    assert plugin["held-out behaviour rates"] == [("eval/behaviour/listed_first", "listed_first")]
    assert plugin["held-out success by category"] == PANELS["held-out success by category"]  # none logged: no data
    bank = report_panels([{"step": 0, "eval/success/base": 1.0, "eval/behaviour/miss_param_ask": 0.5}])
    assert bank["held-out success by category"] == [("eval/success/base", "base")]


@pytest.mark.parametrize("content", [None, "", "not json\n[1,2]\n"])
def test_report_without_data(tmp_path, content):
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content)
    assert write_report(tmp_path).stat().st_size > 0


def test_set_default_env(tmp_path, monkeypatch):
    for var in ["AGENTRL_CACHE", "HF_HUB_OFFLINE", "DS_ACCELERATOR", *CACHE_DIRS]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", "/elsewhere/hf")  # what the user set wins
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU visible -> CPU DeepSpeed
    root = set_default_env(tmp_path)
    import os

    assert root == tmp_path.resolve() / ".cache"
    assert os.environ["AGENTRL_CACHE"] == str(root)
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert os.environ["HF_HOME"] == "/elsewhere/hf"
    assert os.environ["VLLM_CACHE_ROOT"] == str(root / "vllm")
    assert os.environ["MPLCONFIGDIR"] == str(root / "matplotlib")
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    assert not root.exists()  # nothing created just by setting defaults


def test_progress_line_live_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    with ProgressLine(2, file=out) as line:
        assert line.live
        line.update(1, STEP)
        line.update(2, {"success": 1.0})
    assert "step 2/2 | success 1.00" in out.getvalue()
    out = Terminal()
    with ProgressLine(2, file=out, live=False) as line:  # telemetry.progress: false
        line.update(1, {})
    assert out.getvalue() == "step 1/2\n"


# ------------------------------------------------------------------ step and evaluation metrics

def _group(version, outcome, progress, rewards, tokens, calls, valid, redundant, wall):
    return GroupSummary(f"t{version}", version, outcome, progress, rewards, policy_tokens=tokens, calls=calls,
                        valid_calls=valid, redundant_calls=redundant, gen_seconds=0.0, env_seconds=0.0, wall_seconds=wall)


def test_step_metrics_from_hand_made_summaries():
    summaries = [
        _group(3, [1.0, 0.0, 1.0, 0.0], [1.0, 0.5, 1.0, 0.5], {"process": 0.5, "summary": 1.0}, 100, 8, 6, 3, 2.0),
        _group(2, [0.0] * 4, [0.0] * 4, {"process": 0.1, "summary": 0.0}, 60, 4, 4, 0, 4.0),
    ]
    timings = {"rollout_wait": 1.5, "learn": 3.0, "sync": 0.25, "step": 5.0}
    m = step_metrics(summaries, timings, {"loss": 0.5, "tokens": 7}, version=4)
    assert m == pytest.approx({
        "train/success": 2 / 8, "train/progress": 3 / 8,
        "train/reward_std": 0.125,  # pstdev 0.25 and 0
        "train/groups_with_variance": 0.5, "train/episodes": 8.0, "train/policy_tokens": 160.0,
        "perf/tokens_per_s": 40.0,  # over the slowest group's wall time
        "train/calls_per_episode": 1.5, "train/valid_call_fraction": 10 / 12, "train/redundant_call_fraction": 0.3,
        "time/generate": 4.0, "time/rollout_wait": 1.5, "time/learn": 3.0, "time/sync": 0.25, "time/step": 5.0,
        "train/policy_version": 4.0, "train/policy_lag": 1.0,  # oldest group on v2, learner trained v3 into v4
        "reward/process": 0.3, "reward/summary": 0.5, "learner/loss": 0.5, "learner/tokens": 7.0,
        "train/env_failures": 0.0, "recovery/dropped_episodes": 0.0, "recovery/env_reruns": 0.0,  # every environment answered
        "train/tool_errors": 0.0,  # no plugin tool raised
    })
    assert all(isinstance(v, float) for v in m.values())
    assert pick(m, "success") == 0.25 and format_step(1, 2, m).startswith("step 1/2 | success 0.25 | progress 0.38")


def test_step_metrics_without_groups_or_update():
    m = step_metrics([], {"rollout_wait": 0.0, "learn": 0.0, "sync": 0.0, "step": 0.1}, {}, version=0)
    assert m["train/episodes"] == 0 and m["train/success"] == 0 and m["perf/tokens_per_s"] == 0
    assert m["train/policy_lag"] == 0 and m["time/generate"] == 0
    assert not [k for k in m if k.startswith(("reward/", "learner/"))]


def test_eval_metrics_from_hand_made_results():
    def result(category, outcome, progress, calls, valid, redundant, behaviours, omission=0.0, summary=None):
        return {"category": category, "outcome": outcome, "progress": progress, "calls": calls, "valid_calls": valid,
                "redundant_calls": redundant, "behaviours": behaviours, "omission": omission, "summary_score": summary}

    results = [
        result("base", 1.0, 1.0, 2, 2, 0, {"balance_lookup": [1, 1]}, summary=1.0),
        result("base", 0.0, 0.5, 4, 3, 1, {"balance_lookup": [0, 1], "transfer_swap": [1, 2]}, summary=0.5),
        result("miss_param", 1.0, 1.0, 0, 0, 0, {"miss_param_ask": [1, 1]}),  # no summary score (judge runs)
        result("miss_param", 0.0, 0.0, 2, 1, 1, {"miss_param_ask": [0, 1]}, omission=1.0, summary=0.0),
    ]
    assert eval_metrics(results, seconds=12.0) == pytest.approx({
        "success": 0.5, "progress": 0.625, "mean_calls": 2.0, "redundant_call_rate": 2 / 6, "episodes": 4.0,
        "seconds": 12.0, "omission_rate": 0.25, "summary_score": 0.5, "success/base": 0.5, "success/miss_param": 0.5,
        "behaviour/miss_param_ask": 0.5, "behaviour/balance_lookup": 0.5, "behaviour/transfer_swap": 0.5,
        "tool_errors": 0.0,
    })
    assert summarize(results) == {"base": (2, 0.5), "miss_param": (2, 0.5), "overall": (4, 0.5)}
    empty = eval_metrics([], seconds=0.0)
    assert empty["success"] == 0 and empty["episodes"] == 0 and not [k for k in empty if "/" in k]
    assert "summary_score" not in empty


def test_eval_metrics_of_a_plugin_evaluation_carry_only_its_own_keys():
    """A reward-scored task without category, answer_facts or gold plan: no category, no summary
    score, no omission, only the behaviours its plugin counts; tool errors are counted."""
    error = {"tool": "book", "arguments": {}, "type": "KeyError", "message": "room", "where": "env.py:3", "turn": 0}
    results = [{"category": None, "outcome": 1.0, "progress": 1.0, "calls": 2, "valid_calls": 2, "redundant_calls": 0,
                "behaviours": {"double_booking": [0, 1]}, "omission": None, "summary_score": None, "tool_errors": []},
               {"category": None, "outcome": 0.0, "progress": 0.5, "calls": 1, "valid_calls": 1, "redundant_calls": 0,
                "behaviours": {}, "omission": None, "summary_score": None, "tool_errors": [error, error]}]
    assert eval_metrics(results, seconds=1.0) == pytest.approx({
        "success": 0.5, "progress": 0.75, "mean_calls": 1.5, "redundant_call_rate": 0.0, "episodes": 2.0,
        "seconds": 1.0, "tool_errors": 2.0, "behaviour/double_booking": 0.0})
    assert summarize(results) == {"overall": (2, 0.5)}
