"""What a node offers: slots planned from detected and declared resources. Declared amounts
are split between an agent's workers as detected ones are (never multiplied), device ids are
never invented past what was declared, and a device count past the limit is refused before
anything is built."""

from __future__ import annotations

import json

import pytest

from zres.agent.slots import plan_slots
from zres.core.limits import Limits
from zres.core.resources import GPU, MEMORY, UNIT, ResourceSpecError, parse_spec


def test_workers_with_a_declared_gpu_count_share_the_devices_declared(monkeypatch):
    monkeypatch.setenv("ZRES_TEST_FAKE_GPUS", json.dumps([{"memory": 1e9}] * 4))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    slots = plan_slots(parse_spec("GPU=2"), nworkers=2, nthreads=1)
    assert [s.gpus for s in slots] == [["0"], ["1"]]          # 2 GPUs in all, not 4
    assert [s.units[GPU] for s in slots] == [UNIT, UNIT]
    with pytest.raises(ResourceSpecError, match="this node has 4"):
        plan_slots(parse_spec("GPU=5"), nworkers=1, nthreads=1)
    with pytest.raises(ResourceSpecError, match=r"'GPU=3'.* 2 workers"):
        plan_slots(parse_spec("GPU=3"), nworkers=2, nthreads=1)


def test_declared_amounts_are_split_between_workers_never_multiplied():
    slots = plan_slots(parse_spec("GPU=2 MEMORY=10GB foo=4 CPU=6"), nworkers=2, nthreads=1,
                       detect=False)
    assert [s.gpus for s in slots] == [["0"], ["1"]]          # devices 2, 3 not invented
    for slot in slots:
        assert slot.units[GPU] == UNIT
        assert slot.units[MEMORY] == 5 * 10**9 * UNIT
        assert slot.units["foo"] == 2 * UNIT and slot.units["CPU"] == 3 * UNIT
    # Bytes split to the byte: the node's total is exactly what was declared.
    odd = plan_slots(parse_spec("MEMORY=10GB"), nworkers=3, nthreads=1, detect=False)
    assert sum(s.units[MEMORY] for s in odd) == 10 * 10**9 * UNIT


def test_an_amount_that_does_not_split_into_whole_shares_is_refused_naming_why():
    with pytest.raises(ResourceSpecError, match=r"'GPU=1'.*2 workers"):
        plan_slots(parse_spec("GPU=1"), nworkers=2, nthreads=1, detect=False)
    with pytest.raises(ResourceSpecError, match=r"'licence=3'.*2 workers.*multiple of 2"):
        plan_slots(parse_spec("licence=3"), nworkers=2, nthreads=1, detect=False)
    # A fraction declared is split as given, when it splits exactly.
    halves = plan_slots(parse_spec("foo=0.5"), nworkers=2, nthreads=1, detect=False)
    assert [s.units["foo"] for s in halves] == [UNIT // 4, UNIT // 4]


def test_per_device_tokens_go_to_one_worker_each():
    slots = plan_slots(parse_spec("gpu0=1 gpu1=1"), nworkers=2, nthreads=1, detect=False)
    assert [sorted(n for n in s.units if n.startswith("gpu")) for s in slots] == [
        ["gpu0"], ["gpu1"]]


MAX_DEVICES = 4096  # (zres.core.limits.MAX_DEVICES: what a broker takes in one slot)


def test_a_device_count_past_the_limit_is_refused_at_once_naming_it():
    for spec in (f"GPU={MAX_DEVICES + 1}", "GPU=1e6"):
        with pytest.raises(ResourceSpecError, match=f"more than {MAX_DEVICES} devices"):
            plan_slots(parse_spec(spec), nworkers=1, nthreads=1, detect=False)
    assert len(plan_slots(parse_spec(f"GPU={MAX_DEVICES}"), 1, 1, detect=False)[0].gpus) \
        == MAX_DEVICES
    with pytest.raises(ResourceSpecError, match=f"more than {Limits().slots}"):
        plan_slots({}, nworkers=Limits().slots + 1, nthreads=1, detect=False)
