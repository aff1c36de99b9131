"""Reservations for starving tasks: when the wait starts, and what a reservation leaves to
others (fake clock, plain data)."""

from __future__ import annotations

from tests.scheduler.test_pipelining import agent_starts, check_started_fit
from tests.scheduler.test_scheduler import cap, placed, req
from zres.scheduler.policy import Scheduler


def reserved(sched: Scheduler) -> dict[int, int]:
    """Slot id -> the task holding a reservation on it."""
    return {s.id: s.reserved_by for s in sched.slots.values() if s.reserved_by is not None}


def room(sched: Scheduler, units: dict[str, int]) -> int:
    """How many tasks asking UNITS a pass can grant: started where the slot's room (free
    less what its queue will take) fits them, then into the queues' free places."""
    total = 0
    for slot in sched.slots.values():
        direct = min((slot.free.get(n, 0) - slot.queued_taken.get(n, 0)) // a
                     for n, a in units.items())
        total += max(direct, 0) + sched.prefetch - len(slot.queue)
    return total


# -- the clock: a wait counts from the first pass that finds the task blocked ------------


def test_a_big_map_queued_long_ago_is_not_starving_and_keeps_pipelining():
    """1,000 short tasks queued at t=0 on one agent, the first pass at t=10: no
    reservation, and every pass fills what the slot and its queue have room for (issue 28:
    a reserved slot takes no queued grants, so one task a pass went)."""
    sched = Scheduler(starvation_after=5.0, prefetch=2)
    sched.add_slot(1, "a", cap(CPU=2))
    sched.finished("short", 0.001)
    for task in range(1000):
        sched.enqueue(task, req(), now=0.0, kind="short")
    now, passes = 10.0, 0
    while sched.waiting:
        expected = min(room(sched, req()), len(sched.waiting))
        grants = sched.schedule(now)
        assert len(grants) == expected, f"pass {passes} at t={now:.2f}"
        assert reserved(sched) == {}, f"a slot was reserved at t={now:.2f}"
        check_started_fit(sched)
        # The oldest task ends; the agent starts what it has queued.
        sched.release(min(t for t, g in sched.running.items() if g.started))
        agent_starts(sched, 1)
        now += 0.01
        passes += 1
    assert now > 15.0, "the passes span more than starvation_after"


def test_a_blocked_task_still_reserves_after_being_blocked_long_enough():
    """A CPU=2 task passed over by a stream of CPU=1 tasks (never two CPUs free at once)
    reserves its slot starvation_after seconds after its first blocked pass, not after it
    was queued, and then starts; pipelining on."""
    sched = Scheduler(starvation_after=5.0, prefetch=2)
    sched.add_slot(1, "a", cap(CPU=2))
    sched.finished("small", 0.001)
    sched.enqueue(100, req(CPU=1), now=0.0, kind="small")
    sched.enqueue(101, req(CPU=1), now=0.0, kind="small")
    assert placed(sched.schedule(0.0)) == {100: 1, 101: 1}
    sched.enqueue(1, req(CPU=2), now=0.0, kind="big")
    running = [100, 101]
    next_id, now, big_start = 102, 1.0, None
    while now < 20.0 and big_start is None:
        # The older small task ends; a new one arrives.
        sched.release(running.pop(0))
        sched.enqueue(next_id, req(CPU=1), now=now, kind="small")
        next_id += 1
        for grant in sched.schedule(now):
            if grant.task == 1:
                big_start = now
            else:
                assert grant.started, "a slot an earlier blocked task could use takes no queue"
                running.append(grant.task)
        if now < 6.0:  # first blocked at t=1: not starving before t=6
            assert reserved(sched) == {}, f"reserved at t={now}"
        now += 0.5
    assert big_start is not None, "the CPU=2 task starved"
    assert 6.0 <= big_start <= 7.0
    assert reserved(sched) == {}

