"""Pipelining in the pure scheduler: tasks granted into a slot's queue ahead of time start
there when their agent says so; what has started never exceeds a slot's capacity, and a
task that fits now is never held back by a queue."""

from __future__ import annotations

import random

from tests.scheduler.test_scheduler import cap, placed, req
from zres.scheduler.policy import Scheduler
from zres.scheduler.records import Grant, workers
from zres.scheduler.stragglers import LONG_AFTER


def started(sched: Scheduler) -> set[int]:
    return {t for t, g in sched.running.items() if g.started}


def check_started_fit(sched: Scheduler) -> None:
    """What has started never exceeds a slot's capacity (queued grants take nothing); the
    index of room (free less queued) and the slots with a free place in their queue are
    what the slots say."""
    index = sched.table.index._by_name
    for slot in sched.slots.values():
        for name, total in slot.total.items():
            used = sum(g.taken.get(name, 0) for g in sched.running.values()
                       if g.slot == slot.id and g.started)
            assert used <= total and slot.free.get(name, 0) == total - used
        for name, amount in slot.free.items():
            assert (amount - slot.queued_taken.get(name, 0), slot.id) in index[name]
        assert (slot.id in sched.table.queue_room) == (len(slot.queue) < sched.prefetch)
    assert sum(map(len, index.values())) == sum(len(s.free) for s in sched.slots.values())


def agent_starts(sched: Scheduler, slot_id: int) -> list[int]:
    """Start what an agent would: queued grants in (priority, seq) order, each that fits
    beside what has started (backfill), reported to the scheduler."""
    slot = sched.slots[slot_id]
    order = sorted(slot.queue, key=lambda t: (-sched.running[t].priority, sched.running[t].seq))
    begun = []
    for task in order:
        grant = sched.running[task]
        if all(slot.free.get(n, 0) >= a for n, a in grant.taken.items()):
            sched.started(task)
            begun.append(task)
    return begun


def test_blocked_tasks_are_queued_on_a_slot_and_start_when_their_agent_says_so():
    sched = Scheduler(prefetch=2)
    sched.add_slot(1, "a", cap(CPU=2))
    for task in range(1, 6):
        sched.enqueue(task, req(CPU=1))
    grants = sched.schedule()
    assert placed(grants) == {1: 1, 2: 1, 3: 1, 4: 1}
    assert [g.started for g in grants] == [True, True, False, False]
    assert 5 in sched.waiting, "a queue holds at most PREFETCH grants"
    sched.release(2)
    assert started(sched) == {1}, "the broker never predicts a start"
    assert agent_starts(sched, 1) == [3]
    sched.release(1)
    assert agent_starts(sched, 1) == [4]
    check_started_fit(sched)
    assert placed(sched.schedule()) == {5: 1}
    assert sched.why(5).startswith("queued on a, where it starts when room frees")


def test_a_task_that_fits_beside_a_queue_is_granted_at_once():
    sched = Scheduler(prefetch=2)
    sched.add_slot(1, "a", cap(CPU=4))
    sched.enqueue(1, req(CPU=3))
    sched.enqueue(2, req(CPU=3))
    assert [g.started for g in sched.schedule()] == [True, False]
    sched.enqueue(3, req(CPU=1))  # 1 CPU is free, but task 2 will need it when 1 ends
    assert placed(sched.schedule()) == {3: 1}, "it joins the queue; the agent backfills"
    assert [g.started for g in sched.running.values() if g.task == 3] == [False]
    sched.enqueue(4, req(CPU=0))  # takes nothing the queue needs: it goes now
    (grant,) = sched.schedule()
    assert (grant.task, grant.started) == (4, True)


def test_an_agent_that_reports_its_starts_late_never_runs_beyond_capacity():
    # The agent starts queued grants on its own and the broker hears of each start a
    # little later; meanwhile the broker keeps granting. What truly runs on the agent
    # must never exceed the slot, whatever the order.
    rng = random.Random(3)
    sched = Scheduler(prefetch=4)
    sched.add_slot(1, "a", cap(CPU=4, foo=2))
    total = sched.slots[1].total
    running: set[int] = set()        # what truly runs on the agent
    unreported: list[int] = []       # queued grants it started, not reported yet
    held: set[int] = set()           # grants it has received

    def true_use(name: str) -> int:
        return sum(sched.running[t].taken.get(name, 0) for t in running)

    for task in range(1, 300):
        sched.enqueue(task, req(CPU=rng.randint(0, 2), foo=rng.randint(0, 1)))
        for grant in sched.schedule():
            held.add(grant.task)
            if grant.started:
                running.add(grant.task)  # a direct grant starts on arrival
        for queued in sorted(held - running, key=lambda t: sched.running[t].seq):
            need = sched.running[queued].taken
            if all(true_use(n) + a <= total.get(n, 0) for n, a in need.items()):
                running.add(queued)
                unreported.append(queued)
        for name in total:
            assert true_use(name) <= total[name], f"{name} over capacity on the agent"
        if unreported and rng.random() < 0.5:
            for begun in unreported:
                sched.started(begun)
            unreported.clear()
        if running and rng.random() < 0.5:
            end = rng.choice(sorted(set(running) - set(unreported)) or [0])
            if end:
                running.discard(end)
                held.discard(end)
                sched.release(end)


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


def test_no_queue_forms_behind_long_work():
    sched = Scheduler(prefetch=4)
    sched.add_slot(1, "a", cap(CPU=1))
    sched.finished("long", 30.0)
    sched.finished("short", 0.001)
    sched.enqueue(1, req(CPU=1), kind="long")
    assert placed(sched.schedule()) == {1: 1}
    sched.enqueue(2, req(CPU=1), kind="short")
    assert sched.schedule() == [], "it would wait behind a task of 30 s"
    assert 2 in sched.waiting
    sched.add_slot(2, "b", cap(CPU=1))
    assert placed(sched.schedule()) == {2: 2}, "so a newcomer takes it at once"


def test_a_queued_grant_that_never_started_leaves_the_queue_when_released():
    sched = Scheduler(prefetch=3)
    sched.add_slot(1, "a", cap(CPU=1))
    for task in range(1, 4):
        sched.enqueue(task, req(CPU=1))
    sched.schedule()
    assert sched.queued(1) == [2, 3]
    sched.release(2)                       # cancelled at the agent before it started
    assert sched.queued(1) == [3] and sched.slots[1].free["CPU"] == 0
    sched.release(1)
    assert agent_starts(sched, 1) == [3]
    assert sched.remove_slot(1) == [3]


def test_queued_grants_keep_their_priority_for_the_agent():
    sched = Scheduler(prefetch=4)
    sched.add_slot(1, "a", cap(CPU=4, slot=1))
    sched.enqueue(1, req(slot=1))
    assert placed(sched.schedule()) == {1: 1}
    sched.enqueue(2, req(slot=1), priority=1)
    sched.enqueue(3, req(slot=1), priority=2)
    sched.enqueue(4, req(slot=1), priority=0)
    assert sorted(g.task for g in sched.schedule()) == [2, 3, 4]
    assert "2 queued there before it" in sched.why(4)
    sched.release(1)
    assert agent_starts(sched, 1) == [3], "the highest priority first"


def test_prefetch_zero_queues_nothing():
    sched = Scheduler(prefetch=0)
    sched.add_slot(1, "a", cap(CPU=1))
    sched.enqueue(1, req(CPU=1))
    sched.enqueue(2, req(CPU=1))
    assert all(isinstance(g, Grant) and g.started for g in sched.schedule())
    assert 2 in sched.waiting


def test_a_closed_slot_takes_no_new_grant_until_opened():
    sched = Scheduler(prefetch=4)
    sched.add_slot(1, "a", cap(CPU=2))
    sched.set_open(1, False)
    sched.enqueue(1, req(CPU=1))
    assert sched.schedule() == []
    assert "takes no new work" in sched.why(1)
    sched.set_open(1, True)
    assert placed(sched.schedule()) == {1: 1}


def test_random_workload_never_starts_beyond_capacity():
    rng = random.Random(7)
    sched = Scheduler(prefetch=3)
    for slot in range(1, 4):
        sched.add_slot(slot, f"s{slot}", cap(CPU=rng.randint(1, 4), foo=rng.randint(1, 3)))
    next_id = 1
    for _ in range(400):
        if rng.random() < 0.6:
            sched.enqueue(next_id, req(CPU=rng.randint(0, 2), foo=rng.randint(0, 1)),
                          priority=rng.randint(0, 2))
            next_id += 1
        sched.schedule()
        running = sorted(started(sched))
        if running and rng.random() < 0.5:
            sched.release(rng.choice(running))
        for slot in sched.slots:
            agent_starts(sched, slot)
        check_started_fit(sched)


def test_a_queued_grant_given_back_unstarted_gives_its_room_to_a_blocked_task():
    """Room a queued grant kept comes back when it goes unstarted (cancelled, or given
    back by its agent): a task blocked for that room starts at the next pass."""
    sched = Scheduler(prefetch=2)
    sched.add_slot(1, "a", cap(CPU=2))
    sched.finished("short", 0.001)
    sched.enqueue(1, req(CPU=1), kind="short")
    sched.enqueue(2, req(CPU=2), kind="short")
    assert [(g.task, g.started) for g in sched.schedule()] == [(1, True), (2, False)]
    sched.enqueue(3, req(CPU=1), kind="long")      # never queued: its room is kept for 2
    assert sched.schedule() == []
    sched.release(2)                               # cancelled before it started
    assert placed(sched.schedule()) == {3: 1}
    check_started_fit(sched)


def test_a_queued_grant_starting_calls_for_a_pass_that_fills_its_place():
    """The agent started a queued grant (room freed earlier): its queue has a free place,
    which the next pass fills, though no task ended since the last one."""
    sched = Scheduler(prefetch=1)
    sched.add_slot(1, "a", cap(CPU=1))
    sched.finished("short", 0.001)
    for task in (1, 2, 3):
        sched.enqueue(task, req(CPU=1), kind="short")
    assert [(g.task, g.started) for g in sched.schedule()] == [(1, True), (2, False)]
    sched.release(1)
    assert sched.schedule() == [], "the queue is full"
    assert agent_starts(sched, 1) == [2]
    assert sched.needs_pass()
    assert [(g.task, g.started) for g in sched.schedule()] == [(3, False)]
    assert not sched.needs_pass()


def test_room_freed_with_nothing_waiting_calls_for_no_pass_until_a_task_waits():
    """Short tasks end with nothing waiting: no pass (it could place nothing, and a task
    ending one at a time would cost one each); what they freed, room and a queue's place,
    is there for the pass that a task queued later calls for."""
    sched = Scheduler(prefetch=1)
    sched.add_slot(1, "a", cap(CPU=1))
    sched.finished("short", 0.001)
    for task in (1, 2):
        sched.enqueue(task, req(CPU=1), kind="short")
    assert [(g.task, g.started) for g in sched.schedule()] == [(1, True), (2, False)]
    sched.release(1)
    assert agent_starts(sched, 1) == [2]
    sched.release(2)
    assert not sched.needs_pass(), "a pass with nothing waiting"
    for task in (3, 4):
        sched.enqueue(task, req(CPU=1), kind="short")
    assert sched.needs_pass()
    assert [(g.task, g.started) for g in sched.schedule()] == [(3, True), (4, False)]
    check_started_fit(sched)
    assert not sched.needs_pass()


def test_no_queue_forms_behind_actors_that_hold_a_slot_for_good():
    """Chaos round 49: two actors, restarted (a restart's placement has no kind: counted
    short), held all of a's slot resource while b was away; blocked tasks of a short kind
    were queued on a as if behind short work, and waited there for ever after b came back
    with room. An actor's hold never ends, so it is never short work: they wait, and b
    takes them."""
    sched = Scheduler(prefetch=4)
    sched.finished("recompute", 0.001)
    sched.add_slot(1, "cpu-a", cap(CPU=4, slot=2))
    sched.add_slot(2, "cpu-b", cap(CPU=4, slot=2))
    sched.set_open(2, False)                       # draining, or not heard from
    sched.enqueue(1, req(slot=1), queueable=False)  # restarted actors: no kind
    sched.enqueue(2, req(slot=1), queueable=False)
    assert placed(sched.schedule()) == {1: 1, 2: 1}
    for task in (3, 4, 5):
        sched.enqueue(task, req(CPU=1, slot=1), kind="recompute")
    assert sched.schedule() == [], "queued behind the actors, they would never start"
    assert sched.queued(1) == []
    sched.set_open(2, True)
    grants = sched.schedule()
    assert placed(grants) == {3: 2, 4: 2, 5: 2}
    assert [g.started for g in grants] == [True, True, False], "5 queues behind 3 and 4"
    check_started_fit(sched)


def test_no_queue_forms_behind_a_command_job_or_an_actor_whose_kind_ran_short():
    """What holds its room for good is never short work, even of a kind that ran short."""
    sched = Scheduler(prefetch=4)
    sched.add_slot(1, "a", cap(CPU=1))
    sched.finished("quick", 0.001)
    sched.enqueue(1, req(CPU=1), queueable=False, kind="quick")
    assert placed(sched.schedule()) == {1: 1}
    sched.enqueue(2, req(CPU=1), kind="quick")
    assert sched.schedule() == [] and 2 in sched.waiting


# -- short tasks that turn out long ------------------------------------------------------


def test_a_short_task_that_runs_long_no_longer_has_grants_queued_behind_it():
    # Slot 1 runs a short-kind task that turns out long: the grants queued behind it, which
    # slot 2 could run, are named for recall (they stay queued until the agent gives them
    # back), and from then on nothing new is queued behind it; slot 2 takes them once free.
    sched = Scheduler(prefetch=4)
    sched.finished("f", 0.001)  # (a short kind)
    sched.add_slot(1, "a", cap(CPU=1))
    sched.add_slot(2, "b", cap(CPU=1))
    assert sched.adopt(100, 2, req(CPU=1), [])  # (long work, a job say: it queues nothing)
    for task in range(1, 4):
        sched.enqueue(task, req(CPU=1), kind="f")
    grants = sched.schedule(now=0.0)
    assert placed(grants) == {1: 1, 2: 1, 3: 1} and started(sched) == {1, 100}
    assert sched.overdue(LONG_AFTER / 2) == {}, "not long yet"
    assert sched.overdue(LONG_AFTER) == {1: [2, 3]}
    assert sched.queued(1) == [2, 3], "recalled grants stay queued until given back"
    assert sched.overdue(2 * LONG_AFTER) == {}, "named once"
    # The agent gives them back (never begun): they wait again, nothing queues behind 1.
    for task in (2, 3):
        sched.release(task)
        sched.enqueue(task, req(CPU=1), kind="f")
    sched.enqueue(4, req(CPU=1), kind="f")
    assert sched.schedule(now=1.0) == [] and set(sched.waiting) == {2, 3, 4}
    sched.release(100)
    assert placed(sched.schedule(now=1.0)) == {2: 2, 3: 2, 4: 2}
    check_started_fit(sched)
    sched.release(1)  # (its end gives back what it held, once)
    assert sched.slots[1].short_taken.get("CPU", 0) == 0
    check_started_fit(sched)


def test_only_queued_grants_no_longer_covered_by_short_work_are_recalled():
    # Two CPUs, two short tasks: one turns long; what is queued still frees soon through
    # the other, so nothing is recalled; once both are long, all of it is.
    sched = Scheduler(prefetch=4)
    sched.finished("f", 0.001)  # (a short kind)
    sched.add_slot(1, "a", cap(CPU=2))
    sched.add_slot(2, "b", cap(CPU=1))
    assert sched.adopt(100, 2, req(CPU=1), [])
    for task in range(1, 5):
        sched.enqueue(task, req(CPU=1), kind="f")
    sched.schedule(now=0.0)
    assert started(sched) == {1, 2, 100} and sched.queued(1) == [3, 4]
    sched.release(2)
    sched.started(3, now=LONG_AFTER / 2)
    assert sched.overdue(LONG_AFTER) == {}, "task 3 (started later) still frees room soon"
    assert sched.overdue(2 * LONG_AFTER) == {1: [4]}


def test_a_task_that_ends_in_time_is_never_taken_to_be_long():
    sched = Scheduler(prefetch=4)
    sched.finished("f", 0.001)  # (a short kind)
    sched.add_slot(1, "a", cap(CPU=1))
    for task in range(1, 3):
        sched.enqueue(task, req(CPU=1), kind="f")
    sched.schedule(now=0.0)
    sched.release(1)
    sched.started(2, now=0.05)
    assert sched.overdue(LONG_AFTER) == {} and sched.running[2].short


def test_grants_queued_behind_a_task_turned_long_stay_where_no_other_slot_could_run_them():
    sched = Scheduler(prefetch=4)
    sched.finished("f", 0.001)
    sched.add_slot(1, "a", cap(CPU=1))
    sched.add_slot(2, "b", cap(GPU=1))  # (it could never run them)
    for task in range(1, 3):
        sched.enqueue(task, req(CPU=1), kind="f")
    sched.schedule(now=0.0)
    assert sched.overdue(LONG_AFTER) == {} and sched.queued(1) == [2]
    assert not sched.running[1].short, "taken to be long all the same"


def test_a_grant_that_may_run_only_on_its_slots_agent_is_not_recalled():
    # Pinned to agent a (workers=["a"]): slot 2, of agent b, could never run it, so it is
    # not asked back (it would only wait in the broker for slot 1 instead of in its queue).
    sched = Scheduler(prefetch=4)
    sched.finished("f", 0.001)
    sched.add_slot(1, "a", cap(CPU=1))
    sched.add_slot(2, "b", cap(CPU=1))
    assert sched.adopt(100, 2, req(CPU=1), [])
    sched.enqueue(1, req(CPU=1), kind="f")
    sched.enqueue(2, req(CPU=1), kind="f", where=workers(["a"]))
    sched.enqueue(3, req(CPU=1), kind="f", where=workers(["a", "b"]))
    sched.enqueue(4, req(CPU=1), kind="f", where=workers(["a"], loose=True))
    assert placed(sched.schedule(now=0.0)) == {1: 1, 2: 1, 3: 1, 4: 1}
    assert sched.overdue(LONG_AFTER) == {1: [3, 4]}
