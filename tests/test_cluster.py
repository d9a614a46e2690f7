"""driver/cluster.py without a cluster: the embedded cluster's CPUs, sharding, the model path check."""

from __future__ import annotations

import math
import os

import pytest

from agentrl.config import InputError, load_config
from agentrl.driver.cluster import embedded_cpus, resolve_model_path, shard


def test_shard_deals_round_robin():
    assert shard(list(range(5)), 2) == [[0, 2, 4], [1, 3]]
    assert shard([1], 3) == [[1], [], []]


def test_embedded_cpus_cover_what_the_actors_ask_for():
    many = load_config(None, ["rollout.num_workers=8", "runtime.rollout_worker_cpus=2", "rods.enabled=true",
                              "rods.num_cpus=3"])
    assert embedded_cpus(many) == max(os.cpu_count() or 1, math.ceil(8 * 2 + 1 + 3))  # in-process tools: no tool actor
    pooled = load_config(None, ["rollout.num_workers=8", "tools.placement=pool", "tools.num_actors=20"])
    assert embedded_cpus(pooled) == max(os.cpu_count() or 1, math.ceil(8 + 1 + 0.1 * 20))
    assert embedded_cpus(load_config(None, [])) == max(os.cpu_count() or 1, 2)  # the quickstart's 1 + 1: 2 cores do
    assert embedded_cpus(load_config(None, ["runtime.num_cpus=3"])) == 3  # given: used as is


def test_resolve_model_path_names_the_missing_model(tmp_path):
    with pytest.raises(InputError, match="model.path: no model at"):
        resolve_model_path(load_config(None, [f"model.path={tmp_path}"]))
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_path(load_config(None, [f"model.path={tmp_path}"])) == str(tmp_path.resolve())
