"""What a node offers: slots planned from detected and declared resources."""

from __future__ import annotations

import json

import pytest

from zres.agent.slots import plan_slots
from zres.core.resources import ResourceSpecError, parse_spec


def test_workers_with_a_declared_gpu_count_get_devices_of_their_own(monkeypatch):
    monkeypatch.setenv("ZRES_TEST_FAKE_GPUS", json.dumps([{"memory": 1e9}] * 4))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    slots = plan_slots(parse_spec("GPU=2"), nworkers=2, nthreads=1)
    assert [s.gpus for s in slots] == [["0", "1"], ["2", "3"]]
    with pytest.raises(ResourceSpecError, match="need 6 devices"):
        plan_slots(parse_spec("GPU=3"), nworkers=2, nthreads=1)
    undetected = plan_slots(parse_spec("GPU=1"), nworkers=2, nthreads=1, detect=False)
    assert [s.gpus for s in undetected] == [["0"], ["1"]]
