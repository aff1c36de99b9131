"""The pure placement policy (zres.scheduler.Scheduler), driven with plain data."""

from __future__ import annotations

import random

import pytest

from zres.core.resources import UNIT, mapping_to_units, task_request
from zres.scheduler.policy import Scheduler
from zres.scheduler.records import Grant


def req(**amounts) -> dict[str, int]:
    """A task's request in units, as a submit would give it (CPU=1 unless named)."""
    return task_request(amounts)


def cap(**amounts) -> dict[str, int]:
    """A slot's capacity in units."""
    return mapping_to_units(amounts)


def placed(grants: list[Grant]) -> dict[int, int]:
    return {g.task: g.slot for g in grants}


def in_use(sched: Scheduler, slot_id: int) -> dict[str, int]:
    """Sum what the running grants on SLOT_ID have taken."""
    used: dict[str, int] = {}
    for grant in sched.running.values():
        if grant.slot == slot_id:
            for name, amount in grant.taken.items():
                used[name] = used.get(name, 0) + amount
    return used


def check_capacity(sched: Scheduler) -> None:
    """Concurrent grants never exceed capacity, and free is exactly total minus in use."""
    for slot in sched.slots.values():
        used = in_use(sched, slot.id)
        for name, total in slot.total.items():
            assert used.get(name, 0) <= total, (slot.id, name)
            assert slot.free.get(name, 0) == total - used.get(name, 0), (slot.id, name)
        assert set(used) <= set(slot.total)
        for pos in range(len(slot.gpu_free)):
            share = sum(s for g in sched.running.values() if g.slot == slot.id
                        for p, s in zip(g.gpus, g.shares) if p == pos)
            assert 0 <= slot.gpu_free[pos] == UNIT - share


# -- fitting against free amounts --------------------------------------------------------


def test_a_task_fits_only_where_free_covers_every_amount():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=2, MEMORY=10))
    sched.enqueue(1, req(CPU=1, MEMORY=8))
    assert placed(sched.schedule()) == {1: 1}
    # MEMORY=4 is within the slot's total (10) but not its free amount (2).
    sched.enqueue(2, req(CPU=1, MEMORY=4))
    assert sched.schedule() == []
    assert 2 in sched.waiting
    # A slot with the memory free takes it; a CPU-only task still fits the first slot.
    sched.add_slot(2, "b", cap(CPU=1, MEMORY=100))
    sched.enqueue(3, req(CPU=1))
    assert placed(sched.schedule()) == {2: 2, 3: 1}
    # Now neither slot has a CPU free, though both have memory.
    sched.enqueue(4, req(CPU=1, MEMORY=1))
    assert sched.schedule() == []
    sched.release(1)
    assert placed(sched.schedule()) == {4: 1}


def test_a_task_needing_a_resource_a_slot_lacks_does_not_go_there():
    sched = Scheduler()
    sched.add_slot(1, "plain", cap(CPU=64))
    sched.enqueue(1, req(foo=1))
    assert sched.schedule() == []
    sched.add_slot(2, "foo-host", cap(CPU=1, foo=1))
    assert placed(sched.schedule()) == {1: 2}


def test_the_grant_carries_the_requested_units():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=4, foo=2))
    sched.enqueue(7, req(CPU=2, foo=0.5))
    (grant,) = sched.schedule()
    assert (grant.task, grant.slot, grant.units) == (7, 1, {"CPU": 2 * UNIT, "foo": UNIT // 2})
    assert grant.gpus == []
    assert sched.running[7] is grant


def test_concurrent_grants_never_exceed_capacity():
    rng = random.Random(1234)
    sched = Scheduler(starvation_after=3.0)
    sched.add_slot(1, "a", cap(CPU=4, GPU=2, MEMORY=16))
    sched.add_slot(2, "b", cap(CPU=8, MEMORY=32))
    sched.add_slot(3, "c", cap(CPU=2, GPU=1, foo=1))
    shapes = [{"CPU": 1}, {"CPU": 2, "MEMORY": 8}, {"GPU": 0.25}, {"GPU": 0.6},
              {"GPU": 1, "MEMORY": 4}, {"GPU": 2}, {"foo": 1, "CPU": 0.5}, {"CPU": 0.3},
              {"CPU": 3, "MEMORY": 20}]
    next_id, granted = 0, 0
    for step in range(400):
        for _ in range(rng.randint(0, 4)):
            sched.enqueue(next_id, req(**rng.choice(shapes)), rng.randint(0, 2), now=step)
            next_id += 1
        granted += len(sched.schedule(now=step))
        check_capacity(sched)
        for task in sorted(sched.running):
            if rng.random() < 0.3:
                sched.release(task)
        check_capacity(sched)
    assert granted > 300
    for task in sorted(sched.running):
        sched.release(task)
    for slot in sched.slots.values():
        assert slot.free == slot.total
        assert slot.gpu_free == [UNIT] * len(slot.gpu_free)


# -- backfill, order and determinism -----------------------------------------------------


def test_no_head_of_line_blocking():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=4))
    sched.enqueue(1, req(CPU=3))
    assert placed(sched.schedule()) == {1: 1}
    sched.enqueue(2, req(CPU=4), priority=10)   # first in line, cannot fit now
    sched.enqueue(3, req(CPU=1))                # later and lower, fits now
    assert placed(sched.schedule()) == {3: 1}
    assert 2 in sched.waiting
    sched.release(1)
    sched.release(3)
    assert placed(sched.schedule()) == {2: 1}


def test_a_blocked_shape_does_not_block_other_shapes_many_times_over():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=2, GPU=1))
    sched.enqueue(0, req(GPU=1))
    assert placed(sched.schedule()) == {0: 1}
    for task in range(1, 50):
        sched.enqueue(task, req(GPU=1))        # all blocked behind the busy GPU
    sched.enqueue(100, req(CPU=1))
    assert placed(sched.schedule()) == {100: 1}


def test_priority_first_then_submission_order():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=1))
    priorities = {1: 0, 2: 5, 3: 0, 4: 5, 5: -1, 6: 10, 7: 0}
    for task, priority in priorities.items():
        sched.enqueue(task, req(CPU=1), priority=priority)
    order = []
    while sched.waiting:
        grants = sched.schedule()
        assert len(grants) == 1
        order.append(grants[0].task)
        sched.release(grants[0].task)
    assert order == [6, 2, 4, 1, 3, 7, 5]


def test_priority_order_holds_across_different_shapes():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=1, foo=1, bar=1))
    sched.enqueue(1, req(CPU=1))
    sched.enqueue(2, req(CPU=1, foo=1), priority=1)
    sched.enqueue(3, req(CPU=1, bar=1), priority=2)
    sched.enqueue(4, req(CPU=1, foo=1, bar=1))
    order = []
    while sched.waiting:
        (grant,) = sched.schedule()
        order.append(grant.task)
        sched.release(grant.task)
    assert order == [3, 2, 1, 4]


def _scripted_run() -> list[tuple[int, int, tuple[int, ...]]]:
    rng = random.Random(99)
    sched = Scheduler(starvation_after=2.0)
    for slot in range(6):
        sched.add_slot(slot, f"agent{slot}", cap(CPU=4, GPU=slot % 3, MEMORY=8))
    shapes = [{"CPU": 1}, {"GPU": 1}, {"GPU": 0.5}, {"CPU": 2, "MEMORY": 4}, {"GPU": 2}]
    log, next_id = [], 0
    for step in range(200):
        for _ in range(3):
            sched.enqueue(next_id, req(**rng.choice(shapes)), rng.randint(0, 1), now=step)
            next_id += 1
        for grant in sched.schedule(now=step):
            log.append((grant.task, grant.slot, tuple(grant.gpus)))
        for task in sorted(sched.running):
            if rng.random() < 0.4:
                sched.release(task)
    return log


def test_same_events_give_the_same_grants():
    first, second = _scripted_run(), _scripted_run()
    assert len(first) > 100
    assert first == second


def test_equal_slots_are_chosen_by_id_not_by_insertion_order():
    grants = []
    for order in ([3, 1, 2], [2, 3, 1]):
        sched = Scheduler()
        for slot in order:
            sched.add_slot(slot, f"s{slot}", cap(CPU=2))
        sched.enqueue(1, req(CPU=1))
        grants.append(placed(sched.schedule()))
    assert grants[0] == grants[1] == {1: 1}


# -- GPUs per device ---------------------------------------------------------------------


def test_whole_gpus_take_distinct_fully_free_devices():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=8, GPU=4))
    sched.enqueue(1, req(GPU=0.5))
    (frac,) = sched.schedule()
    sched.enqueue(2, req(GPU=2))
    (two,) = sched.schedule()
    assert len(set(two.gpus)) == 2
    assert frac.gpus[0] not in two.gpus          # the half-used device is not "free"
    sched.enqueue(3, req(GPU=2))
    assert sched.schedule() == []                # only one device is wholly free now
    sched.enqueue(4, req(GPU=1))
    (one,) = sched.schedule()
    assert one.gpus[0] not in set(two.gpus) | set(frac.gpus)
    sched.release(1)
    sched.release(4)
    (three,) = sched.schedule()
    assert three.task == 3 and len(set(three.gpus)) == 2
    assert not set(three.gpus) & set(two.gpus)


def test_fractions_pack_onto_the_busiest_device_that_fits():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=16, GPU=3))
    sched.enqueue(1, req(GPU=0.5))
    (a,) = sched.schedule()
    sched.enqueue(2, req(GPU=0.25))
    (b,) = sched.schedule()
    assert b.gpus == a.gpus                      # packs next to the half-used device
    sched.enqueue(3, req(GPU=0.5))
    (c,) = sched.schedule()
    assert c.gpus != a.gpus                      # 0.25 left there: goes elsewhere
    sched.enqueue(4, req(GPU=0.2))
    (d,) = sched.schedule()
    assert d.gpus == a.gpus                      # the busiest device with room (0.25 free)
    sched.enqueue(5, req(GPU=0.3))
    (e,) = sched.schedule()
    assert e.gpus == c.gpus                      # 0.05 left on the first, 0.5 on the second
    # The third device stays wholly free for a whole-GPU task.
    sched.enqueue(6, req(GPU=1))
    (f,) = sched.schedule()
    assert f.gpus not in (a.gpus, c.gpus)
    assert len({*a.gpus, *c.gpus, *f.gpus}) == 3


def test_a_fraction_never_spans_two_devices():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=8, GPU=2))
    sched.enqueue(1, req(GPU=0.6))
    sched.enqueue(2, req(GPU=0.6))
    grants = sched.schedule()
    assert len(grants) == 2
    assert grants[0].gpus != grants[1].gpus
    # 0.8 GPU is free in all, but no single device has 0.7.
    sched.enqueue(3, req(GPU=0.7))
    assert sched.schedule() == []
    sched.enqueue(4, req(GPU=0.4))
    assert placed(sched.schedule()) == {4: 1}
    sched.release(1)
    sched.release(4)
    (grant,) = sched.schedule()
    assert grant.task == 3 and grant.gpus == grants[0].gpus


def test_ten_tenths_of_a_gpu_fill_one_device_exactly():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=100, GPU=1))
    for task in range(11):
        sched.enqueue(task, req(GPU=0.1))
    grants = sched.schedule()
    assert sorted(g.task for g in grants) == list(range(10))
    assert {tuple(g.gpus) for g in grants} == {(0,)}
    sched.release(3)
    assert placed(sched.schedule()) == {10: 1}


def test_release_returns_exactly_what_was_taken():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=4, GPU=2, MEMORY=10))
    before = dict(sched.slots[1].free)
    sched.enqueue(1, req(GPU=0.3, CPU=0.3, MEMORY=3.3))
    sched.enqueue(2, req(GPU=1, CPU=0.1))
    sched.enqueue(3, req(GPU=0.7, MEMORY=0.1))
    assert len(sched.schedule()) == 3
    check_capacity(sched)
    for task in (2, 1, 3):
        sched.release(task)
    assert sched.slots[1].free == before
    # All of it is usable again: both devices wholly, all CPU and memory.
    sched.enqueue(4, req(GPU=2, CPU=4, MEMORY=10))
    assert placed(sched.schedule()) == {4: 1}


def test_release_of_an_unknown_task_changes_nothing():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=1))
    sched.release(42)
    sched.enqueue(1, req(CPU=1))
    assert placed(sched.schedule()) == {1: 1}
    sched.release(1)
    sched.release(1)                              # twice: still only one CPU
    sched.enqueue(2, req(CPU=1))
    sched.enqueue(3, req(CPU=1))
    assert len(sched.schedule()) == 1


def test_gpu_memory_is_taken_on_one_device():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=8, GPU=2), gpu_memory=[8 * UNIT, 8 * UNIT])
    sched.enqueue(1, req(GPU=0.25, GPU_MEMORY=6))
    sched.enqueue(2, req(GPU=0.25, GPU_MEMORY=6))
    grants = sched.schedule()
    assert len(grants) == 2 and grants[0].gpus != grants[1].gpus
    # 4 left in all, 2 per device: 3 on one device does not fit.
    sched.enqueue(3, req(GPU=0.25, GPU_MEMORY=3))
    assert sched.schedule() == []
    assert sched.dequeue(3)
    # A whole GPU takes its device's memory too, so nothing is left for a whole GPU.
    sched.release(1)
    sched.enqueue(4, req(GPU=1))
    (grant,) = sched.schedule()
    assert grant.task == 4 and grant.taken["GPU_MEMORY"] == 8 * UNIT


# -- best fit ----------------------------------------------------------------------------


def test_a_cpu_task_goes_to_the_plain_slot_rather_than_the_gpu_slot():
    sched = Scheduler()
    sched.add_slot(1, "gpu-host", cap(CPU=4, GPU=1))
    sched.add_slot(2, "cpu-host", cap(CPU=4))
    sched.enqueue(1, req(CPU=1))
    assert placed(sched.schedule()) == {1: 2}
    sched.enqueue(2, req(GPU=1))
    assert placed(sched.schedule()) == {2: 1}


def test_a_cpu_task_uses_the_gpu_slot_when_the_plain_one_is_full():
    sched = Scheduler()
    sched.add_slot(1, "gpu-host", cap(CPU=4, GPU=1))
    sched.add_slot(2, "cpu-host", cap(CPU=1))
    sched.enqueue(1, req(CPU=1))
    sched.enqueue(2, req(CPU=1))
    assert placed(sched.schedule()) == {1: 2, 2: 1}


def test_best_fit_prefers_the_slot_with_least_left_over():
    sched = Scheduler()
    sched.add_slot(1, "big", cap(CPU=16))
    sched.add_slot(2, "small", cap(CPU=2))
    sched.enqueue(1, req(CPU=2))
    sched.enqueue(2, req(CPU=8))
    assert placed(sched.schedule()) == {1: 2, 2: 1}


# -- infeasibility and explanations ------------------------------------------------------


def test_infeasible_reason_no_agent_offers_the_resource():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=4, GPU=1))
    assert sched.infeasible_reason(req(foo=1)) == "no agent offers foo"


def test_infeasible_reason_names_the_largest_agent():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=4, GPU=1))
    sched.add_slot(2, "b", cap(CPU=4))
    assert sched.infeasible_reason(req(GPU=2)) == "needs GPU=2, largest agent has GPU=1"
    assert sched.infeasible_reason(req(CPU=0.5, MEMORY=0)) is None


def test_infeasible_reason_when_no_single_agent_has_everything():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=4, GPU=1))
    sched.add_slot(2, "b", cap(CPU=4, foo=1))
    reason = sched.infeasible_reason(req(GPU=1, foo=1))
    assert reason == "no single agent offers CPU=1 GPU=1 foo=1 together"


def test_infeasible_reason_is_none_without_slots_and_for_busy_but_feasible():
    sched = Scheduler()
    assert sched.infeasible_reason(req(GPU=8)) is None   # nobody joined yet: just waiting
    sched.add_slot(1, "a", cap(CPU=1))
    sched.enqueue(1, req(CPU=1))
    sched.schedule()
    assert sched.infeasible_reason(req(CPU=1)) is None   # busy is not infeasible


def test_infeasible_reason_follows_slots_joining_and_leaving():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=4))
    assert sched.infeasible_reason(req(GPU=1)) == "no agent offers GPU"
    sched.add_slot(2, "b", cap(CPU=4, GPU=1))
    assert sched.infeasible_reason(req(GPU=1)) is None
    sched.remove_slot(2)
    assert sched.infeasible_reason(req(GPU=1)) == "no agent offers GPU"


def test_an_infeasible_task_runs_once_a_fitting_slot_joins():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=4, GPU=1))
    sched.enqueue(1, req(GPU=2))
    assert sched.schedule() == []
    sched.add_slot(2, "b", cap(CPU=4, GPU=2))
    (grant,) = sched.schedule()
    assert grant.slot == 2 and sorted(grant.gpus) == [0, 1]


def test_remove_slot_returns_its_running_tasks():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=2))
    sched.add_slot(2, "b", cap(CPU=1, GPU=1))
    for task, request in ((5, req(CPU=1)), (3, req(CPU=1)), (9, req(GPU=1, CPU=0))):
        sched.enqueue(task, request)
    assert placed(sched.schedule()) == {5: 1, 3: 1, 9: 2}
    assert sched.remove_slot(1) == [3, 5]
    assert set(sched.running) == {9}
    sched.release(5)                              # a late "done" for a lost task is harmless
    assert sched.remove_slot(2) == [9]
    assert sched.running == {}


def test_tasks_from_a_removed_slot_can_be_requeued_elsewhere():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=1))
    sched.enqueue(1, req(CPU=1))
    sched.schedule()
    sched.add_slot(2, "b", cap(CPU=1))
    for task in sched.remove_slot(1):
        sched.enqueue(task, req(CPU=1))
    assert placed(sched.schedule()) == {1: 2}


def test_remove_slot_returns_nothing_for_an_idle_slot():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=1))
    assert sched.remove_slot(1) == []
    sched.enqueue(1, req(CPU=1))
    assert sched.schedule() == []


def test_dequeue_forgets_a_waiting_task():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=1))
    sched.enqueue(1, req(CPU=1))
    sched.enqueue(2, req(CPU=1))
    assert sched.dequeue(1) is True
    assert sched.dequeue(1) is False
    assert sched.dequeue(77) is False
    assert placed(sched.schedule()) == {2: 1}
    assert sched.dequeue(2) is False              # running, not waiting
    sched.release(2)
    assert sched.schedule() == []                 # task 1 is never granted


def test_why_texts():
    sched = Scheduler()
    sched.enqueue(1, req(CPU=2))
    assert sched.why(1) == "no agent has joined the broker yet"
    sched.add_slot(1, "alpha", cap(CPU=2))
    sched.enqueue(2, req(foo=1))
    assert sched.why(2) == "infeasible: no agent offers foo"
    sched.enqueue(3, req(GPU=2))
    assert sched.why(3) == "infeasible: no agent offers GPU"
    assert placed(sched.schedule()) == {1: 1}
    assert sched.why(1) == "running"
    assert sched.why(12345) == "not waiting"
    sched.enqueue(4, req(CPU=2))
    sched.enqueue(5, req(CPU=2))
    sched.schedule()
    assert sched.why(4) == "needs CPU=2; alpha has CPU=0 free"
    assert sched.why(5) == ("needs CPU=2; alpha has CPU=0 free; "
                            "queued behind 1 tasks of the same shape")


def test_why_counts_a_long_queue_ahead_by_a_bounded_sample_and_says_about():
    """One question about a task among 100,000 of its shape walks a bounded sample of them,
    not all (issue 28: one request must not stall the loop)."""
    from zres.scheduler.queue import AHEAD_SAMPLE
    sched = Scheduler()
    sched.add_slot(1, "alpha", cap(CPU=1))
    for task in range(1, 100_002):
        sched.enqueue(task, req(CPU=1))
    sched.schedule()
    text = sched.why(100_001)
    count = int(text.split("queued behind about ")[1].split(" tasks")[0].replace(",", ""))
    assert abs(count - 99_999) <= 2 * (100_000 // AHEAD_SAMPLE), text


def test_why_names_the_largest_agent_for_too_large_requests():
    sched = Scheduler()
    sched.add_slot(1, "alpha", cap(CPU=4, GPU=1))
    sched.enqueue(1, req(GPU=2))
    assert sched.why(1) == "infeasible: needs GPU=2, largest agent has GPU=1"


def test_why_says_when_no_device_has_room():
    sched = Scheduler()
    sched.add_slot(1, "alpha", cap(CPU=4, GPU=2))
    sched.enqueue(1, req(GPU=0.6))
    sched.enqueue(2, req(GPU=0.6))
    sched.enqueue(3, req(GPU=0.7))
    sched.schedule()
    assert sched.why(3) == "needs CPU=1 GPU=0.7; alpha has no device with room free"


def test_why_lists_at_most_three_busy_agents():
    sched = Scheduler()
    for slot in range(5):
        sched.add_slot(slot, f"n{slot}", cap(CPU=1))
    for task in range(6):
        sched.enqueue(task, req(CPU=1))
    sched.schedule()
    (waiting,) = sched.waiting
    text = sched.why(waiting)
    assert text == ("needs CPU=1; n0 has CPU=0 free; n1 has CPU=0 free; n2 has CPU=0 free; "
                    "and 2 more agents busy")


@pytest.mark.parametrize("starvation_after", [0.0, 5.0])
def test_a_task_with_no_fitting_capacity_waits_quietly(starvation_after):
    sched = Scheduler(starvation_after=starvation_after)
    sched.add_slot(1, "a", cap(CPU=1))
    sched.enqueue(1, req(GPU=1), now=0.0)
    for now in (0.0, 10.0, 20.0):
        assert sched.schedule(now) == []
    sched.enqueue(2, req(CPU=1), now=20.0)
    assert placed(sched.schedule(20.0)) == {2: 1}


def test_a_dequeued_task_queued_again_takes_its_new_place():
    """Cancelling then queueing a task id again must not keep its old priority."""
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=1))
    sched.enqueue(1, req(CPU=1), priority=0)
    sched.enqueue(2, req(CPU=1), priority=5)
    assert sched.dequeue(2)
    sched.enqueue(3, req(CPU=1), priority=0)
    sched.enqueue(2, req(CPU=1), priority=0)
    order = []
    while sched.waiting:
        (grant,) = sched.schedule()
        order.append(grant.task)
        sched.release(grant.task)
    assert order == [1, 3, 2]
