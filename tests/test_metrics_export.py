"""The Prometheus names of agentrl's gauges, as Ray really exports them (issue 40).

A Ray node is started on loopback with a metrics export port; a driver joined to it logs a step
through the real ``MetricsSink`` (``telemetry.ray_metrics``), and the node's Prometheus endpoint
is scraped until the gauges appear (Ray reports application metrics every few seconds). Checked:
every metric of the step is there under ``prometheus_name`` (``ray_agentrl_*``, which
docs/monitoring.md and docs/operating.md give), labelled ``run=<run.name>``, with its value; and every
series the Grafana dashboard in deploy/grafana/ queries is one of them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from ray_nodes import free_ports, stop_node

from agentrl.telemetry.metrics import prometheus_name

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "agentrl-run.json"
# a step's metrics as the driver logs them (docs/monitoring.md, "metrics.jsonl"), and an evaluation's
STEP = {"train/success": 0.5, "train/progress": 0.625, "perf/tokens_per_s": 1234.0, "time/generate": 3.5,
        "time/learn": 2.0, "time/sync": 0.25, "time/step": 6.0, "learner/loss": -0.125, "learner/kl": 0.01,
        "learner/grad_norm": 0.75, "train/policy_lag": 0.0, "buffer/size": 4.0, "eval/success": 0.4,
        "recovery/worker_restarts": 0.0}

DRIVER = """
import json, sys, time, urllib.request
from pathlib import Path
import ray
from agentrl.config import load_config
from agentrl.telemetry.metrics import MetricsSink
address, port, run_dir, step = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4])
ray.init(address=address, log_to_driver=False)
cfg = load_config(None, ["run.name=scrape", "telemetry.tensorboard=false", "telemetry.ray_metrics=true"])
text, deadline = "", time.monotonic() + 90
with MetricsSink(run_dir, cfg.telemetry, cfg.run.name) as sink:
    while time.monotonic() < deadline:
        sink.log(1, step)
        time.sleep(2)
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        except OSError:
            continue
        if all(("agentrl_" + k.replace("/", "_")) in text for k in step):
            break
print("SCRAPED-BEGIN")
print(text)
"""


def _series(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text format: name -> [(labels, value)]."""
    out: dict[str, list] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)", line)
        if m and not line.startswith("#"):
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return out


@pytest.mark.integration
def test_gauges_are_scraped_under_their_documented_names(tmp_path):
    gcs, metrics, agent, dashboard, client = free_ports(5)
    temp = tempfile.mkdtemp(prefix="arm-", dir="/tmp")  # short: Ray's socket paths must fit AF_UNIX
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env["RAY_AUTH_MODE"] = "disabled"  # loopback only
    ray_bin = str(Path(sys.executable).parent / "ray")
    node = subprocess.Popen(
        [ray_bin, "start", "--head", "--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1",
         "--port", str(gcs), "--num-cpus", "1", "--include-dashboard", "false", "--dashboard-port", str(dashboard),
         "--dashboard-agent-listen-port", str(agent), "--metrics-export-port", str(metrics),
         "--ray-client-server-port", str(client), "--temp-dir", temp],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while subprocess.run([ray_bin, "status", "--address", f"127.0.0.1:{gcs}"], env=env, capture_output=True,
                             timeout=60).returncode != 0:
            assert node.poll() is None and time.monotonic() < deadline, "the Ray node did not start"
            time.sleep(1)
        driver = subprocess.run([sys.executable, "-c", DRIVER, f"127.0.0.1:{gcs}", str(metrics), str(tmp_path / "run"),
                                 json.dumps(STEP)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    finally:
        stop_node(node, [temp])
        subprocess.run(["rm", "-rf", temp], check=False)
    assert driver.returncode == 0 and "SCRAPED-BEGIN" in driver.stdout, driver.stdout[-3000:] + driver.stderr[-3000:]
    series = _series(driver.stdout.split("SCRAPED-BEGIN", 1)[1])
    for key, value in STEP.items():
        name = prometheus_name(key)
        assert name.startswith("ray_agentrl_"), name
        ours = [(labels, v) for labels, v in series.get(name, []) if labels.get("run") == "scrape"]
        assert ours and all(v == value for _, v in ours), (key, name, sorted(n for n in series if "agentrl" in n))
    assert not any(n.startswith("agentrl_") for n in series)  # the unprefixed names README used to give

    # the dashboard queries only series that exist, with the run label
    dash = json.loads(DASHBOARD.read_text())
    queried = {name for panel in dash["panels"] for t in panel["targets"]
               for name in re.findall(r"\b(ray_agentrl_\w+)\{run=~\"\$run\"\}", t["expr"])}
    assert queried and queried <= set(series), sorted(queried - set(series))
    assert len(queried) == sum(len(p["targets"]) for p in dash["panels"])  # every target matched the pattern
    assert "ray_agentrl_train_success" in dash["templating"]["list"][1]["query"]
