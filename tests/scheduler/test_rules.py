"""The scheduling rules of issue 3 on the pure core, with plain data and a fake clock."""

from __future__ import annotations

import random

import pytest

from zres.core.resources import GPU_MEMORY, UNIT, task_request
from zres.scheduler.policy import Scheduler


def units(**amounts: float) -> dict[str, int]:
    return {name: round(amount * UNIT) for name, amount in amounts.items()}


def run_events(sched: Scheduler, submits: list[tuple[float, int, dict, float]],
               until: float = 100.0, stream: int = 0) -> dict[int, tuple[float, float]]:
    """Drive SCHED: SUBMITS are (time, id, request, duration); return id -> (start, end).

    With STREAM > 0, every time a task ends, STREAM more 1-second GPU=1 tasks arrive.
    """
    pending = sorted(submits, key=lambda s: (s[0], s[1]))
    durations = {task: duration for _, task, _, duration in submits}
    times: dict[int, tuple[float, float]] = {}
    running: dict[int, float] = {}
    now, next_id = 0.0, 10_000
    while now <= until and (pending or running or sched.waiting):
        while pending and pending[0][0] <= now:
            _, task, request, _ = pending.pop(0)
            sched.enqueue(task, task_request(request), now=now)
        for grant in sched.schedule(now):
            end = now + durations.get(grant.task, 1.0)
            running[grant.task] = end
            times[grant.task] = (now, end)
        upcoming = list(running.values()) + [p[0] for p in pending[:1]]
        if not upcoming:
            break
        now = min(upcoming)
        for task, end in sorted(running.items()):
            if end <= now:
                sched.release(task)
                del running[task]
                for _ in range(stream):
                    sched.enqueue(next_id, task_request({"GPU": 1}), now=now)
                    next_id += 1
    return times


@pytest.mark.parametrize("spacing", [0.0, 0.1, 0.3])
def test_guild_example_backfills_whatever_the_spacing(spacing):
    sched = Scheduler(starvation_after=5.0)
    sched.add_slot(1, "a", units(CPU=8, gpu0=1, gpu1=1))
    requests = [{"gpu0": 1}, {"gpu0": 1}, {"gpu0": 1, "gpu1": 1}, {"gpu1": 1}]
    times = run_events(sched, [(i * spacing, i, r, 1.0) for i, r in enumerate(requests)])
    aaa, bbb, ccc, ddd = (times[i] for i in range(4))
    assert ddd[0] < aaa[1], "ddd must start while aaa runs"
    assert max(end for _, end in times.values()) == pytest.approx(3.0)


def test_reservation_stops_a_stream_of_small_tasks_from_starving_a_large_one():
    sched = Scheduler(starvation_after=5.0)
    sched.add_slot(1, "a", units(CPU=8, GPU=2))
    sched.add_slot(2, "b", units(CPU=8, GPU=2))
    # Four GPU=1 tasks with staggered ends keep both slots busy; each end brings two more.
    submits = [(0.0, i, {"GPU": 1}, 1.0 + 0.25 * i) for i in range(4)]
    submits.append((0.0, 99, {"GPU": 2}, 1.0))
    times = run_events(sched, submits, until=30.0, stream=2)
    assert 99 in times, "GPU=2 starved"
    start, end = times[99]
    assert 5.0 <= start <= 7.0  # reserved after 5 s, then the running tasks drained
    assert any(s >= end for task, (s, _) in times.items() if task >= 10_000), \
        "the stream goes on afterwards"


def test_a_large_request_starves_without_the_reservation_rule():
    """The control for the test above: the same stream with reservations switched off."""
    sched = Scheduler(starvation_after=float("inf"))
    sched.add_slot(1, "a", units(CPU=8, GPU=2))
    sched.add_slot(2, "b", units(CPU=8, GPU=2))
    submits = [(0.0, i, {"GPU": 1}, 1.0 + 0.25 * i) for i in range(4)]
    submits.append((0.0, 99, {"GPU": 2}, 1.0))
    assert 99 not in run_events(sched, submits, until=30.0, stream=2)


def test_without_waiting_long_enough_there_is_no_reservation():
    sched = Scheduler(starvation_after=5.0)
    sched.add_slot(1, "a", units(CPU=8, GPU=2))
    sched.enqueue(1, task_request({"GPU": 1}), now=0.0)
    assert [g.task for g in sched.schedule(0.0)] == [1]
    sched.enqueue(2, task_request({"GPU": 2}), now=0.0)
    assert sched.schedule(0.1) == []  # blocked from here on
    sched.enqueue(3, task_request({"GPU": 1}), now=4.9)
    assert [g.task for g in sched.schedule(4.9)] == [3]  # backfill, no reservation yet
    assert "reservation" not in sched.why(2)
    sched.release(1)
    sched.enqueue(4, task_request({"GPU": 1}), now=5.0)
    assert sched.schedule(5.1) == []  # task 2 reserved the slot; 4 may not take the GPU
    assert "holds a reservation on a" in sched.why(2)
    assert "reserved for task 2" in sched.why(4)
    sched.release(3)
    assert [g.task for g in sched.schedule(6.0)] == [2]


def test_higher_priority_is_not_fenced_by_a_lower_reservation():
    sched = Scheduler(starvation_after=1.0)
    sched.add_slot(1, "a", units(CPU=8, GPU=2))
    sched.enqueue(1, task_request({"GPU": 1}))
    sched.schedule(0.0)
    sched.enqueue(2, task_request({"GPU": 2}), now=0.0)
    sched.schedule(0.0)  # blocked from here on
    sched.schedule(2.0)
    assert sched.slots[1].reserved_by == 2
    sched.enqueue(3, task_request({"GPU": 1}), priority=5, now=2.0)
    assert [g.task for g in sched.schedule(2.0)] == [3]


def test_same_events_give_the_same_schedule():
    def run() -> list[tuple[int, int, list[int]]]:
        rng = random.Random(3)
        sched = Scheduler(starvation_after=2.0)
        for slot in range(6):
            sched.add_slot(slot, f"n{slot}", units(CPU=4, GPU=slot % 3, MEMORY=64e9))
        out = []
        for step in range(300):
            shape = rng.choice([{}, {"GPU": 1}, {"GPU": 0.5}, {"CPU": 2}, {"GPU": 2}])
            sched.enqueue(step, task_request(shape), priority=rng.randint(0, 2), now=step)
            for grant in sched.schedule(float(step)):
                out.append((grant.task, grant.slot, grant.gpus))
            for task in list(sched.running)[: rng.randint(0, 2)]:
                sched.release(task)
        return out
    assert run() == run()


def test_gpu_memory_shares_a_device_while_the_sum_fits():
    sched = Scheduler()
    sched.add_slot(1, "a", units(CPU=16, GPU=2), gpu_memory=[40 * 10**9 * UNIT] * 2)
    assert sched.slots[1].total[GPU_MEMORY] == 80 * 10**9 * UNIT
    for task in range(5):
        sched.enqueue(task, task_request({"GPU_MEMORY": "20GB"}))
    grants = sched.schedule()
    assert len(grants) == 4
    by_device: dict[int, int] = {}
    for grant in grants:
        assert len(grant.gpus) == 1
        by_device[grant.gpus[0]] = by_device.get(grant.gpus[0], 0) + 1
    assert by_device == {0: 2, 1: 2}
    assert "GPU_MEMORY" in sched.why(4)
    sched.release(grants[0].task)
    assert [g.task for g in sched.schedule()] == [4]


def test_whole_gpu_takes_the_device_memory_and_needs_an_untouched_device():
    sched = Scheduler()
    sched.add_slot(1, "a", units(CPU=16, GPU=2), gpu_memory=[40 * 10**9 * UNIT] * 2)
    sched.enqueue(1, task_request({"GPU_MEMORY": "10GB"}))
    (first,) = sched.schedule()
    sched.enqueue(2, task_request({"GPU": 1}))
    sched.enqueue(3, task_request({"GPU": 1}))
    grants = sched.schedule()
    assert [g.task for g in grants] == [2]
    assert grants[0].gpus != first.gpus
    assert sched.slots[1].free[GPU_MEMORY] == 30 * 10**9 * UNIT
    sched.release(1)
    assert [g.task for g in sched.schedule()] == [3]


def test_memory_larger_than_any_one_device_is_infeasible():
    sched = Scheduler()
    sched.add_slot(1, "a", units(CPU=16, GPU=2), gpu_memory=[40 * 10**9 * UNIT] * 2)
    reason = sched.infeasible_reason(task_request({"GPU_MEMORY": "60GB"}))
    assert reason is not None and "GPU_MEMORY" in reason and "one device" in reason


def test_capacity_change_lowering_below_use_takes_no_new_work_until_it_fits():
    sched = Scheduler()
    sched.add_slot(1, "a", units(CPU=8, foo=2))
    for task in range(3):
        sched.enqueue(task, task_request({"foo": 1}))
    assert len(sched.schedule()) == 2
    sched.set_capacity(1, units(CPU=8, foo=1))
    assert sched.slots[1].free["foo"] == -UNIT
    sched.release(0)
    assert sched.schedule() == []  # in use 1 of 1
    sched.release(1)
    assert [g.task for g in sched.schedule()] == [2]
    sched.set_capacity(1, units(CPU=8, foo=3))
    sched.enqueue(9, task_request({"foo": 2}))
    assert [g.task for g in sched.schedule()] == [9]


def test_capacity_change_of_gpus_uses_only_known_devices():
    sched = Scheduler()
    sched.add_slot(1, "a", units(CPU=8, GPU=2))
    with pytest.raises(ValueError, match="2 GPU device"):
        sched.set_capacity(1, units(CPU=8, GPU=3))
    sched.set_capacity(1, units(CPU=8, GPU=1))
    sched.enqueue(1, task_request({"GPU": 1}))
    sched.enqueue(2, task_request({"GPU": 1}))
    grants = sched.schedule()
    assert [(g.task, g.gpus) for g in grants] == [(1, [0])]
    assert sched.infeasible_reason(task_request({"GPU": 2})) is not None


def test_per_decision_work_does_not_scan_every_slot():
    """A pass after one task ends probes only the slot that gained room."""
    sched = Scheduler()
    for slot in range(2000):
        sched.add_slot(slot, f"n{slot}", units(CPU=1))
    for task in range(4000):
        sched.enqueue(task, task_request({}))
    assert len(sched.schedule()) == 2000
    probed: list[int] = []
    original = sched._place

    def spy(task, fences, only=None):  # type: ignore[no-untyped-def]
        probed.append(len(only) if only is not None else -1)
        return original(task, fences, only)
    sched._place = spy  # type: ignore[method-assign]
    sched.release(7)
    assert [g.slot for g in sched.schedule()] == [7]
    assert probed[0] == 1
