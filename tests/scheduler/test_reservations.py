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



# -- what a reservation leaves to later tasks (backfill) ----------------------------------


def reserve(sched: Scheduler, holder: int, units: dict[str, int], now: float) -> int:
    """Queue HOLDER asking UNITS at NOW, blocked (of a kind never seen: never queued on a
    slot); pass again starvation_after later, when it reserves a slot; return that slot."""
    sched.enqueue(holder, units, now=now, kind="holder")
    assert sched.schedule(now) == []
    assert reserved(sched) == {}
    assert sched.schedule(now + sched.starvation_after) == []
    (slot,) = [s for s, t in reserved(sched).items() if t == holder]
    return slot


def test_a_task_that_needs_nothing_short_takes_a_free_cpu_beside_a_reservation():
    """Issue 27 item 5: a GPU task reserving gpu-node must not idle the CPU there, when the
    task holding the GPU holds a CPU too (it gives one back with the GPU)."""
    sched = Scheduler(starvation_after=5.0)
    sched.add_slot(1, "gpu-node", cap(CPU=2, gpu=1))
    sched.add_slot(2, "cpu-node", cap(CPU=1))
    sched.enqueue(1, req(gpu=1), now=0.0)       # CPU=1 too, as every task by default
    sched.enqueue(2, req(), now=0.0)
    assert placed(sched.schedule(0.0)) == {1: 1, 2: 2}
    assert reserve(sched, 3, req(gpu=1), now=0.0) == 1
    for task in (10, 11, 12):
        sched.enqueue(task, req(), now=6.0)
    assert placed(sched.schedule(6.0)) == {10: 1}, "the free CPU is idle behind task 3"
    assert sched.why(11) == "needs CPU=1; gpu-node has CPU=0 free; cpu-node has CPU=0 free"
    sched.release(1)  # the GPU task ends: 3 starts, beside 10
    assert placed(sched.schedule(7.0)) == {3: 1}
    assert reserved(sched) == {}


def test_a_task_that_could_delay_the_holder_is_still_kept_off():
    """The same, but the GPU's task holds no CPU: when it ends, the holder would wait for
    the CPU a later task took. That task is kept off, and told why, by name."""
    sched = Scheduler(starvation_after=5.0)
    sched.add_slot(1, "gpu-node", cap(CPU=1, gpu=1))
    sched.enqueue(1, req(gpu=1, CPU=0), now=0.0)
    assert placed(sched.schedule(0.0)) == {1: 1}
    assert reserve(sched, 3, req(gpu=1), now=0.0) == 1
    sched.enqueue(10, req(), now=6.0)
    assert sched.schedule(6.0) == []
    assert sched.why(10, name=lambda task: f"task train-{task}") == (
        "needs CPU=1; gpu-node is reserved for task train-3")
    sched.release(1)
    assert placed(sched.schedule(7.0)) == {3: 1}


def test_with_several_resources_short_every_task_that_must_end_gives_back():
    """The holder lacks a gpu and a licence: both their tasks must end before it starts,
    and together they give back 3 CPUs, so it can lend the 2 free CPUs (its own 2 among
    them), which the gpu's task alone would not give back."""
    sched = Scheduler(starvation_after=5.0)
    sched.add_slot(1, "a", cap(CPU=5, gpu=1, lic=1))
    sched.enqueue(1, req(gpu=1, CPU=1), now=0.0)
    sched.enqueue(2, req(lic=1, CPU=2), now=0.0)
    assert placed(sched.schedule(0.0)) == {1: 1, 2: 1}
    assert reserve(sched, 3, req(gpu=1, lic=1, CPU=2), now=0.0) == 1
    sched.enqueue(10, req(CPU=2), now=6.0)
    assert placed(sched.schedule(6.0)) == {10: 1}
    sched.release(1)
    assert sched.schedule(7.0) == [], "still no licence"
    sched.release(2)
    assert placed(sched.schedule(8.0)) == {3: 1}


def test_a_task_expected_to_end_before_the_holder_could_start_backfills():
    """EASY backfill: the gpu the holder waits for is held until about t=100; a task of a
    kind that takes a second may use the other gpu meanwhile, one that takes longer or
    whose run time is unknown may not."""
    sched = Scheduler(starvation_after=5.0)
    sched.add_slot(1, "a", cap(CPU=8, gpu=2))
    for kind, seconds in (("long", 100.0), ("quick", 1.0), ("slow", 200.0)):
        sched.finished(kind, seconds)
    sched.enqueue(1, req(gpu=1), now=0.0, kind="long")
    assert placed(sched.schedule(0.0)) == {1: 1}
    assert reserve(sched, 2, req(gpu=2), now=0.0) == 1
    # (Tasks asking alike wait in order: each kind asks differently here.)
    sched.enqueue(10, req(gpu=1, CPU=1), now=6.0, kind="slow")
    sched.enqueue(11, req(gpu=1, CPU=2), now=6.0, kind=None)
    assert sched.schedule(6.0) == []
    assert "reserved for task 2" in sched.why(10)
    assert "reserved for task 2" in sched.why(11)
    sched.enqueue(12, req(gpu=1, CPU=3), now=6.0, kind="quick")
    assert placed(sched.schedule(6.0)) == {12: 1}
    sched.release(12)
    sched.dequeue(10)
    sched.dequeue(11)
    # Past the long task's estimate it may end any moment: nothing backfills by the clock.
    sched.enqueue(13, req(gpu=1, CPU=3), now=150.0, kind="quick")
    assert sched.schedule(150.0) == []
    assert "reserved for task 2" in sched.why(13)
    sched.release(1)
    assert placed(sched.schedule(151.0)) == {2: 1}


def test_a_running_task_of_unknown_run_time_lends_nothing_by_the_clock():
    sched = Scheduler(starvation_after=5.0)
    sched.add_slot(1, "a", cap(CPU=8, gpu=2))
    sched.finished("quick", 1.0)
    sched.enqueue(1, req(gpu=1), now=0.0)       # no kind: no estimate
    assert placed(sched.schedule(0.0)) == {1: 1}
    assert reserve(sched, 2, req(gpu=2), now=0.0) == 1
    sched.finished("instant", 0.0)  # (ended within the report that said it began)
    sched.enqueue(10, req(gpu=1), now=6.0, kind="quick")
    sched.enqueue(11, req(gpu=1, CPU=2), now=6.0, kind="instant")
    assert sched.schedule(6.0) == []


def test_the_start_of_a_queued_grant_dates_its_expected_end():
    """A grant that started from a slot's queue is expected to end counting from when its
    agent started it (pipelining)."""
    sched = Scheduler(starvation_after=5.0, prefetch=2)
    sched.add_slot(1, "a", cap(CPU=2, lic=2))
    sched.finished("short", 0.001)
    sched.finished("quick", 1.0)
    sched.enqueue(1, req(CPU=2), now=0.0, kind="short")
    sched.enqueue(2, req(CPU=2), now=0.0, kind="short")
    assert [g.started for g in sched.schedule(0.0)] == [True, False]
    sched.release(1)
    sched.started(2, now=50.0)
    sched.finished("short", 30.0)   # (its kind turns out slower: it ends about t=65)
    assert reserve(sched, 3, req(CPU=2, lic=2), now=51.0) == 1
    sched.enqueue(10, req(lic=1, CPU=0), now=56.0, kind="quick")
    assert placed(sched.schedule(56.0)) == {10: 1}, "it ends long before task 2"
    sched.release(10)
    sched.enqueue(11, req(lic=1, CPU=0), now=64.5, kind="quick")
    assert sched.schedule(64.5) == [], "it would end after task 2"
