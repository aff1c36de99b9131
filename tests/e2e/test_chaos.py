"""The chaos harness's short form (bench/chaos.py): a mixed workload while agents and
workers are killed, stopped, drained and restarted at random instants. Every future
resolves truthfully, no retries=0 body begins twice, no resource unit is over-granted and
no process is left behind. ``python bench/chaos.py --rounds 50`` runs it long."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import cloudpickle
import pytest


@pytest.mark.timeout(300)
def test_two_rounds_of_chaos_keep_every_promise():
    path = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"
    spec = importlib.util.spec_from_file_location("zres_chaos", path)
    assert spec is not None and spec.loader is not None
    chaos = importlib.util.module_from_spec(spec)
    sys.modules["zres_chaos"] = chaos
    spec.loader.exec_module(chaos)
    cloudpickle.register_pickle_by_value(chaos)  # the workers cannot import bench/
    reports = chaos.run(rounds=2, seed=7, tasks=300)
    for report in reports:
        assert not report["problems"], report["problems"][:10]
        assert report["left_behind"] == 0
        assert report["outcomes"].get("ok", 0) > report["tasks"] * 0.8
