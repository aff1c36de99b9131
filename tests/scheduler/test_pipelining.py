"""Pipelining in the pure scheduler: tasks granted into a slot's queue ahead of time start
there in order as room frees, never beyond the slot's capacity."""

from __future__ import annotations

import random

from tests.scheduler.test_scheduler import cap, placed, req
from zres.scheduler.policy import Scheduler
from zres.scheduler.records import Grant


def started(sched: Scheduler) -> set[int]:
    return {t for t, g in sched.running.items() if g.started}


def check_started_fit(sched: Scheduler) -> None:
    """What has started never exceeds a slot's capacity (queued grants take nothing)."""
    for slot in sched.slots.values():
        for name, total in slot.total.items():
            used = sum(g.taken.get(name, 0) for g in sched.running.values()
                       if g.slot == slot.id and g.started)
            assert used <= total and slot.free.get(name, 0) == total - used


def test_blocked_tasks_are_queued_on_a_slot_and_start_in_order_as_room_frees():
    sched = Scheduler(prefetch=2)
    sched.add_slot(1, "a", cap(CPU=2))
    for task in range(1, 6):
        sched.enqueue(task, req(CPU=1))
    grants = sched.schedule()
    assert placed(grants) == {1: 1, 2: 1, 3: 1, 4: 1}
    assert [g.started for g in grants] == [True, True, False, False]
    assert 5 in sched.waiting, "a queue holds at most PREFETCH grants"
    assert sched.release(2) == [3] and sched.release(1) == [4]
    assert started(sched) == {3, 4}
    check_started_fit(sched)
    assert placed(sched.schedule()) == {5: 1}
    assert sched.why(5).startswith("queued on a, where it starts when room frees")


def test_a_slot_with_a_queue_takes_no_immediate_grant():
    sched = Scheduler(prefetch=2)
    sched.add_slot(1, "a", cap(CPU=2))
    sched.enqueue(1, req(CPU=2))
    sched.enqueue(2, req(CPU=2))
    assert [g.started for g in sched.schedule()] == [True, False]
    sched.enqueue(3, req(CPU=0))  # would fit now, but must not start ahead of task 2
    grant = sched.schedule()
    assert [(g.task, g.started) for g in grant] == [(3, False)]
    assert sched.release(1) == [2, 3]


def test_gpu_tasks_and_actors_are_never_queued():
    sched = Scheduler(prefetch=4)
    sched.add_slot(1, "a", cap(CPU=4, GPU=1))
    sched.enqueue(1, req(GPU=1))
    sched.enqueue(2, req(GPU=1))
    sched.enqueue(3, req(CPU=4), queueable=False)
    assert placed(sched.schedule()) == {1: 1}
    assert set(sched.waiting) == {2, 3}


def test_a_slot_an_earlier_blocked_task_could_use_is_not_queued_on():
    sched = Scheduler(prefetch=4)
    sched.add_slot(1, "a", cap(CPU=2, GPU=1))
    sched.add_slot(2, "b", cap(CPU=2))
    sched.enqueue(1, req(GPU=1, CPU=2))
    sched.enqueue(2, req(CPU=2))
    assert placed(sched.schedule()) == {1: 1, 2: 2}
    sched.enqueue(3, req(GPU=1, CPU=1), priority=5)  # blocked, cannot be queued
    sched.enqueue(4, req(CPU=1))
    grants = sched.schedule()
    assert placed(grants) == {4: 2}, "task 4 must not queue on a, ahead of task 3"


def test_releasing_a_queued_grant_that_never_started_frees_the_next():
    sched = Scheduler(prefetch=3)
    sched.add_slot(1, "a", cap(CPU=1))
    for task in range(1, 4):
        sched.enqueue(task, req(CPU=1))
    sched.schedule()
    assert sched.queued(1) == [2, 3]
    assert sched.release(2) == []          # cancelled at the agent before it started
    assert sched.release(1) == [3]
    assert sched.remove_slot(1) == [3]


def test_prefetch_zero_queues_nothing():
    sched = Scheduler(prefetch=0)
    sched.add_slot(1, "a", cap(CPU=1))
    sched.enqueue(1, req(CPU=1))
    sched.enqueue(2, req(CPU=1))
    assert all(isinstance(g, Grant) and g.started for g in sched.schedule())
    assert 2 in sched.waiting


def test_random_workload_never_starts_beyond_capacity():
    rng = random.Random(7)
    sched = Scheduler(prefetch=3)
    for slot in range(1, 4):
        sched.add_slot(slot, f"s{slot}", cap(CPU=rng.randint(1, 4), foo=rng.randint(1, 3)))
    next_id = 1
    for _ in range(400):
        if rng.random() < 0.6:
            sched.enqueue(next_id, req(CPU=rng.randint(0, 2), foo=rng.randint(0, 1)))
            next_id += 1
        sched.schedule()
        running = sorted(started(sched))
        if running and rng.random() < 0.5:
            sched.release(rng.choice(running))
        check_started_fit(sched)
        for slot in sched.slots.values():  # a queue's head never fits while it waits
            if slot.queue:
                head = sched.running[slot.queue[0]]
                assert any(slot.free.get(n, 0) < a for n, a in head.taken.items())
