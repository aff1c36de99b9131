"""Regressions for problems found in review: each test failed before its fix."""

from __future__ import annotations

import json
import pickle

import pytest

import zres
from tests.conftest import wait_until
from tests.tasks import wait_for_file
from zres.agent import plan_slots
from zres.resources import UNIT, ResourceSpecError, parse_spec, task_request
from zres.scheduler import Scheduler
from zres.serialize import CallPickler


def units(**amounts: float) -> dict[str, int]:
    return {name: round(amount * UNIT) for name, amount in amounts.items()}


def fail_when(path: str) -> None:
    wait_for_file(path)
    raise KeyError("head of the chain")


def step(previous: object) -> object:
    return previous


def test_a_failure_at_the_head_of_a_long_chain_fails_the_whole_chain(make_cluster, make_client,
                                                                    tmp_path):
    cluster = make_cluster(agents=[{"CPU": 2}])
    client = make_client(cluster.address)
    head = client.submit(fail_when, str(tmp_path / "go"))
    chain = [head]
    for _ in range(3000):  # deeper than Python's recursion limit
        chain.append(client.submit(step, chain[-1]))
    wait_until(lambda: "waiting for 1 of 1" in client.why(chain[-1]), message="chain queued")
    (tmp_path / "go").touch()
    with pytest.raises(KeyError):
        chain[-1].result(60)
    assert cluster.broker.poll() is None
    assert client.submit(step, 7).result(30) == 7


def test_a_shape_blocked_only_by_a_fence_runs_when_the_reservation_moves_elsewhere():
    sched = Scheduler(starvation_after=1.0)
    sched.add_slot(1, "x", units(CPU=8, GPU=2))
    sched.add_slot(2, "y", units(CPU=8, GPU=2))
    for task in (10, 11, 12):
        sched.enqueue(task, task_request({"GPU": 1}))
    sched.schedule(0.0)  # 10, 11 on x? best fit packs: x gets two, y one
    sched.enqueue(1, task_request({"GPU": 2}), now=0.0)
    sched.enqueue(2, task_request({"GPU": 1}), now=0.0)
    grants = sched.schedule(2.0)  # 1 reserves a slot; 2 is fenced there but fits elsewhere
    placed = {g.task for g in grants}
    if 2 not in placed:
        # Free the slot 1 did not reserve: 1 moves there, and 2 must then run too.
        reserved = next(s for s in sched.slots.values() if s.reserved_by == 1)
        other = next(s for s in sched.slots.values() if s is not reserved)
        for task in list(other.running):
            sched.release(task)
        for _ in range(3):
            placed |= {g.task for g in sched.schedule(3.0)}
            if not sched.needs_pass():
                break
        assert {1, 2} <= placed


def test_a_reservation_that_can_no_longer_fit_is_dropped():
    sched = Scheduler(starvation_after=1.0)
    sched.add_slot(1, "x", units(CPU=8, GPU=2))
    sched.enqueue(10, task_request({"GPU": 1}))
    sched.schedule(0.0)
    sched.enqueue(1, task_request({"GPU": 2}), now=0.0)
    sched.schedule(2.0)
    assert sched.slots[1].reserved_by == 1
    sched.set_capacity(1, units(CPU=8, GPU=1))  # GPU=2 can never fit here now
    assert sched.slots[1].reserved_by is None
    sched.enqueue(2, task_request({"GPU": 1}), now=2.0)
    sched.release(10)
    assert [g.task for g in sched.schedule(3.0)] == [2]


def test_cancelled_entries_do_not_pile_up_behind_a_blocked_head():
    sched = Scheduler()
    sched.add_slot(1, "x", units(CPU=1))
    sched.enqueue(0, task_request({}))
    sched.schedule()
    for task in range(1, 20_001):
        sched.enqueue(task, task_request({}))
        sched.dequeue(task)
    assert sum(len(h) for h in sched._by_shape.values()) < 200


def test_distinct_shapes_do_not_pile_up_in_caches():
    sched = Scheduler()
    sched.add_slot(1, "x", units(CPU=4, MEMORY=1e12))
    for task in range(2_000):
        request = task_request({"MEMORY": 1e6 + task})
        sched.infeasible_reason(request)
        sched.enqueue(task, request)
        for grant in sched.schedule():
            sched.release(grant.task)
    while sched.waiting:
        for grant in sched.schedule():
            sched.release(grant.task)
    assert len(sched._infeasible_cache) < 10 and len(sched._could_fit) < 10


def test_submitted_arguments_are_a_snapshot_of_writable_buffers():
    data = bytearray(b"A" * 100_000)
    deps: list[object] = []
    frames = CallPickler(zres.Future).call(b"fn", (pickle.PickleBuffer(data),), {}, deps, {})
    data[:] = b"B" * 100_000
    assert bytes(frames[2][:5]) == b"AAAAA"


def test_workers_with_a_declared_gpu_count_get_devices_of_their_own(monkeypatch):
    monkeypatch.setenv("ZRES_TEST_FAKE_GPUS", json.dumps([{"memory": 1e9}] * 4))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    slots = plan_slots(parse_spec("GPU=2"), nworkers=2, nthreads=1)
    assert [s.gpus for s in slots] == [["0", "1"], ["2", "3"]]
    with pytest.raises(ResourceSpecError, match="need 6 devices"):
        plan_slots(parse_spec("GPU=3"), nworkers=2, nthreads=1)
    undetected = plan_slots(parse_spec("GPU=1"), nworkers=2, nthreads=1, detect=False)
    assert [s.gpus for s in undetected] == [["0"], ["1"]]


def test_gpu_count_lowered_and_raised_again_keeps_device_memory():
    sched = Scheduler()
    sched.add_slot(1, "x", units(CPU=4, GPU=2), gpu_memory=[40 * 10**9 * UNIT] * 2)
    sched.set_capacity(1, units(CPU=4))
    sched.set_capacity(1, units(CPU=4, GPU=2))
    assert sched.slots[1].total["GPU_MEMORY"] == 80 * 10**9 * UNIT
    sched.enqueue(1, task_request({"GPU_MEMORY": "30GB"}))
    assert len(sched.schedule()) == 1


def test_a_lowered_gpu_count_survives_re_registration():
    """Broker and agent stepped in one thread: lower GPU, re-register, raise it again."""
    import time

    import zmq

    from zres import protocol as P
    from zres.agent import Agent
    from zres.broker import Broker

    broker = Broker("tcp://127.0.0.1:0")
    agent = Agent(broker.address, plan_slots(parse_spec("GPU=2"), 1, 2, detect=False),
                  name="node")
    admin = zmq.Context.instance().socket(zmq.DEALER)
    admin.connect(broker.address)

    def step_until(condition, what):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < deadline, what
            broker.poll_once(time.monotonic(), timeout=0.01)
            agent.poll_once(time.monotonic(), timeout=0.01)

    def change(gpus: int) -> dict:  # type: ignore[type-arg]
        admin.send_multipart(P.encode(P.RESOURCES, {"agent": "node",
                                                    "units": {"GPU": gpus * UNIT}}))
        step_until(lambda: admin.poll(0), "a reply to the capacity change")
        return P.decode(admin.recv_multipart()).body

    try:
        step_until(lambda: agent.registered, "registration")
        assert "error" not in change(1)
        step_until(lambda: agent.slots[0].units["GPU"] == UNIT, "the agent to learn it")
        agent.registered = False
        agent._register(time.monotonic())  # as after a broker restart or a silence
        step_until(lambda: agent.registered, "re-registration")
        (record,) = broker.agents.values()
        assert broker.sched.slots[record.slots[0]].total["GPU"] == UNIT
        assert "error" not in change(2)
    finally:
        admin.close(0)
        agent.shutdown()
        broker.sock.close(0)
