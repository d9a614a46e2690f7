"""The step timeline's own spans and file (the Ray part is checked in tests/test_integration.py)."""

from __future__ import annotations

import json
import time

from agentrl.telemetry.timeline import TRACE_FILE, Timeline


def test_spans_nest_and_the_trace_file_merges_ray_events(tmp_path):
    timeline = Timeline()
    with timeline.span("outer", step=1):
        with timeline.span("inner"):
            time.sleep(0.01)
    try:
        with timeline.span("failing"):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    inner, outer, failing = timeline.events
    assert (inner["name"], outer["name"], failing["name"]) == ("inner", "outer", "failing")  # closing order
    assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1
    assert inner["dur"] >= 10_000 and outer["args"] == {"step": 1} and outer["ph"] == "X"
    ray_event = {"name": "rollout", "ph": "X", "ts": 1.0, "dur": 2.0, "pid": "node", "tid": "worker"}
    path = timeline.write(tmp_path, [ray_event])
    assert path == tmp_path / TRACE_FILE and [p.name for p in tmp_path.iterdir()] == [TRACE_FILE]
    events = json.loads(path.read_text())["traceEvents"]
    assert events[0] == ray_event and [e["name"] for e in events[1:]] == ["inner", "outer", "failing"]
