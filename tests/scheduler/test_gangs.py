"""Gangs in the pure scheduler: bundles reserved all at once by strategy, tasks inside
bundles, letting go, losses, reservations for starving gangs, feasibility (plain data)."""

from __future__ import annotations

import pytest

from tests.scheduler.test_scheduler import cap, placed, req
from zres.core.resources import UNIT
from zres.scheduler.policy import Scheduler
from zres.scheduler.records import Grant, Inside


def check_books(sched: Scheduler) -> None:
    """Free is total less what the grants on each slot took (a task inside a bundle takes
    from its bundle, never twice), and each bundle's room is its amounts less its tasks'."""
    for slot in sched.slots.values():
        used: dict[str, int] = {}
        for grant in sched.running.values():
            if grant.slot == slot.id and not grant.within and grant.started:
                for name, amount in grant.taken.items():
                    used[name] = used.get(name, 0) + amount
        for name, total in slot.total.items():
            assert slot.free.get(name, 0) == total - used.get(name, 0), (slot.id, name)
    for bundle in sched.gangs.bundles.values():
        used = {}
        for task in bundle.tasks:
            for name, amount in sched.running[task].taken.items():
                used[name] = used.get(name, 0) + amount
        for name, total in bundle.space.total.items():
            assert bundle.space.free.get(name, 0) == total - used.get(name, 0)


def bundles_of(grants: list[Grant]) -> dict[tuple[int, int], str]:
    """(gang, index) -> the agent's slot id holding that bundle, for the bundles granted."""
    return {g.bundle: g.slot for g in grants if g.bundle is not None}


def gpu_cluster(count: int, gpus: int = 1) -> Scheduler:
    sched = Scheduler(starvation_after=5.0)
    for i in range(count):
        sched.add_slot(i + 1, f"n{i + 1}", cap(CPU=4, GPU=gpus))
    return sched


# -- all at once, or nothing -------------------------------------------------------------


def test_two_gangs_never_hold_half_each():
    """Two agents with one GPU each; two gangs of two GPU bundles: one gets both, the other
    holds nothing meanwhile (taken piecemeal, each would hold one and wait forever)."""
    sched = gpu_cluster(2)
    sched.add_gang(100, [req(GPU=1)] * 2, "STRICT_SPREAD", [101, 102])
    sched.add_gang(200, [req(GPU=1)] * 2, "STRICT_SPREAD", [201, 202])
    first = sched.schedule(0.0)
    assert bundles_of(first) == {(100, 0): 1, (100, 1): 2} or \
        bundles_of(first) == {(100, 0): 2, (100, 1): 1}
    assert 200 in sched.waiting and not any(g.bundle and g.bundle[0] == 200
                                            for g in sched.running.values())
    check_books(sched)
    sched.remove_gang(100, now=1.0)
    assert set(bundles_of(sched.schedule(1.0))) == {(200, 0), (200, 1)}
    check_books(sched)


def test_a_gang_that_does_not_fit_takes_nothing_and_marks_nothing_gained():
    sched = gpu_cluster(2)
    sched.enqueue(1, req(GPU=1))
    assert placed(sched.schedule(0.0)) == {1: 1}
    before = {s.id: dict(s.free) for s in sched.slots.values()}
    sched.add_gang(100, [req(GPU=1)] * 2, "STRICT_SPREAD", [101, 102])
    assert sched.schedule(0.0) == []
    assert {s.id: dict(s.free) for s in sched.slots.values()} == before
    assert not sched.needs_pass(), "a failed trial must not make every turn run a pass"
    sched.release(1)
    assert set(bundles_of(sched.schedule(1.0))) == {(100, 0), (100, 1)}


def test_a_gang_that_did_not_fit_is_tried_again_only_once_room_is_gained(monkeypatch):
    """The index's count of slots with room refuses a gang before any trial walks the
    slots; and a gang that a trial found not to fit is not tried again, in the passes
    that other work makes, until some slot has gained room."""
    from zres.scheduler import gang_fit

    trials: list[int] = []
    real = gang_fit.Trial
    monkeypatch.setattr(gang_fit, "Trial", lambda *a: trials.append(a[2]) or real(*a))
    sched = gpu_cluster(3)
    sched.enqueue(1, req(GPU=1))
    sched.enqueue(2, req(GPU=1))
    assert len(sched.schedule(0.0)) == 2
    # One slot has GPU room: the first gang is refused by the count alone; the second's
    # two shapes each have a slot, the same one, so only a trial finds it does not fit.
    sched.add_gang(100, [req(GPU=1)] * 2, "STRICT_SPREAD", [101, 102])
    sched.add_gang(200, [req(GPU=1), req(GPU=1, CPU=2)], "STRICT_SPREAD", [201, 202])
    assert sched.schedule(0.1) == [] and trials == [200]
    for task, now in ((3, 0.2), (4, 0.3)):  # (work comes beside: no slot gains room)
        sched.enqueue(task, req(CPU=1))
        assert placed(sched.schedule(now)).keys() == {task}
    assert trials == [200], "a gang that did not fit waits for room gained"
    sched.release(1)
    assert set(bundles_of(sched.schedule(0.4))) == {(100, 0), (100, 1)}
    check_books(sched)


# -- strategies -------------------------------------------------------------------------


@pytest.mark.parametrize("strategy, agents", [("PACK", 1), ("STRICT_PACK", 1),
                                              ("SPREAD", 3), ("STRICT_SPREAD", 3)])
def test_each_strategy_places_where_it_says(strategy: str, agents: int):
    sched = gpu_cluster(4, gpus=4)
    sched.add_gang(100, [req(GPU=1)] * 3, strategy, [101, 102, 103])
    grants = sched.schedule(0.0)
    assert len({sched.slots[g.slot].agent for g in grants}) == agents
    check_books(sched)


def test_pack_and_spread_fall_back_strict_ones_wait():
    """Two agents of two GPUs; three one-GPU bundles: PACK spills onto a second agent and
    SPREAD doubles up, while STRICT_PACK and STRICT_SPREAD wait (and say why)."""
    for strategy, fits in (("PACK", True), ("SPREAD", True), ("STRICT_PACK", False),
                           ("STRICT_SPREAD", False)):
        sched = gpu_cluster(2, gpus=2)
        sched.add_gang(100, [req(GPU=1)] * 3, strategy, [101, 102, 103])
        grants = sched.schedule(0.0)
        assert (len(grants) == 3) is fits, strategy
        if not fits:
            assert sched.why(100).startswith("infeasible:"), strategy
            assert strategy in sched.why(100)


def test_pack_puts_a_gang_on_one_agent_when_one_has_room():
    sched = gpu_cluster(3, gpus=4)
    sched.enqueue(1, req(GPU=3))   # n1 keeps one GPU free: PACK must not start there
    sched.schedule(0.0)
    sched.add_gang(100, [req(GPU=2), req(GPU=1)], "PACK", [101, 102])
    grants = sched.schedule(0.0)
    assert len({g.slot for g in grants}) == 1


# -- tasks inside bundles -----------------------------------------------------------------


def test_a_task_in_a_bundle_draws_on_the_bundle_only():
    sched = gpu_cluster(1, gpus=4)
    sched.add_gang(100, [req(CPU=1, GPU=2)], "PACK", [101])
    # queued before the gang is placed: it waits for it
    sched.enqueue(1, req(CPU=1, GPU=1), where=Inside(100, 0), queueable=False)
    sched.enqueue(2, req(CPU=1, GPU=1), where=Inside(100, 0), queueable=False)
    sched.enqueue(3, req(CPU=0, GPU=1), where=Inside(100, 0), queueable=False)
    assert "waits for" in sched.why(1)
    grants = sched.schedule(0.0)
    assert [g.bundle for g in grants if g.bundle] == [(100, 0)]
    inside = [g for g in grants if not g.bundle]  # (placed in the same pass, after it)
    assert sorted(g.task for g in inside) == [1, 3]  # task 2 needs a CPU the bundle lacks
    bundle = sched.gangs.bundles[101]
    assert {p for g in inside for p in g.gpus} == set(bundle.grant.gpus)
    assert all(g.within == 101 for g in inside)
    assert sched.slots[1].free["GPU"] == 2 * UNIT, "the rest of the agent stays free"
    assert "bundle 0" in sched.why(2)
    check_books(sched)
    sched.release(1)
    assert placed(sched.schedule(0.2)) == {2: 1}
    check_books(sched)


def test_removing_a_gang_leaves_what_runs_inside_its_own_resources():
    sched = gpu_cluster(1, gpus=2)
    sched.add_gang(100, [req(CPU=2, GPU=2)], "PACK", [101])
    sched.enqueue(1, req(CPU=1, GPU=1), where=Inside(100, 0), queueable=False)
    sched.schedule(0.0)
    sched.schedule(0.1)
    sched.remove_gang(100, now=1.0)
    assert 101 not in sched.running and sched.running[1].within == 0
    assert sched.slots[1].free["GPU"] == UNIT and sched.slots[1].free["CPU"] == 3 * UNIT
    check_books(sched)
    sched.release(1)
    assert sched.slots[1].free == sched.slots[1].total


def test_a_bundle_lost_with_its_agent_queues_its_gang_again_whole():
    sched = gpu_cluster(3)
    sched.add_gang(100, [req(GPU=1)] * 2, "STRICT_SPREAD", [101, 102])
    grants = sched.schedule(0.0)
    lost_slot = grants[0].slot
    sched.enqueue(1, req(CPU=0, GPU=1), where=Inside(100, 0), queueable=False)
    sched.schedule(0.1)
    gone = sched.remove_slot(lost_slot)
    assert grants[0].task in gone
    sched.remove_gang(100, requeue=True, now=1.0)
    again = sched.schedule(1.0)
    assert set(bundles_of(again)) == {(100, 0), (100, 1)}
    assert lost_slot not in {g.slot for g in again}
    check_books(sched)


def test_a_slot_holding_a_bundle_takes_no_queued_grants():
    sched = Scheduler(prefetch=2)
    sched.add_slot(1, "a", cap(CPU=2))
    sched.finished("short", 0.001)
    sched.add_gang(100, [req(CPU=1)], "PACK", [101])
    sched.schedule(0.0)
    for task in range(1, 5):
        sched.enqueue(task, req(CPU=1), kind="short")
    grants = sched.schedule(0.0)
    assert [g.task for g in grants] == [1] and all(g.started for g in grants)


# -- starving gangs, feasibility ------------------------------------------------------------


def test_a_starving_gang_reserves_its_slots_and_is_placed():
    """A stream of one-GPU tasks keeps two two-GPU agents busy; a gang of two two-GPU
    bundles reserves both agents once it has starved, and starts before later tasks."""
    sched = gpu_cluster(2, gpus=2)
    sched.finished("small", 1.0)
    next_id, running = 1, []
    for _ in range(4):
        sched.enqueue(next_id, req(CPU=1, GPU=1), kind="small")
        next_id += 1
    running += [g.task for g in sched.schedule(0.0)]
    sched.add_gang(100, [req(GPU=2)] * 2, "STRICT_SPREAD", [101, 102])
    now, started = 0.0, None
    while now < 30 and started is None:
        now += 0.5
        sched.release(running.pop(0))
        sched.enqueue(next_id, req(CPU=1, GPU=1), kind="small")
        next_id += 1
        for grant in sched.schedule(now):
            if grant.bundle is not None:
                started = now
            elif not grant.within:
                running.append(grant.task)
        check_books(sched)
    assert started is not None and started < 15, started


def test_a_starving_gang_reserves_no_slot_behind_another_gangs_bundle():
    """A placement group's bundle holds one of three one-GPU agents for as long as it
    likes; a stream of one-GPU tasks keeps the other two busy. A starving gang of two
    one-GPU bundles reserves those two (a bundle's end is unknown: reserving behind it
    could wait for ever), and starts."""
    sched = gpu_cluster(3)
    sched.add_gang(50, [req(GPU=1)], "PACK", [51])
    held = bundles_of(sched.schedule(0.0))
    assert list(held) == [(50, 0)]
    sched.finished("small", 1.0)
    for task in (1, 2):
        sched.enqueue(task, req(GPU=1), kind="small")
    running = [g.task for g in sched.schedule(0.0)]
    sched.add_gang(100, [req(GPU=1)] * 2, "STRICT_SPREAD", [101, 102])
    now, next_id, started = 0.0, 3, None
    while now < 30 and started is None:
        now += 0.5
        sched.release(running.pop(0))
        sched.enqueue(next_id, req(GPU=1), kind="small")
        next_id += 1
        for grant in sched.schedule(now):
            if grant.bundle is not None:
                started = now
            else:
                running.append(grant.task)
        assert held[(50, 0)] not in sched.gangs.gangs[100].reserved
        check_books(sched)
    assert started is not None and started < 15, started


def test_an_infeasible_gang_says_why():
    sched = gpu_cluster(2, gpus=2)
    sched.add_gang(100, [req(GPU=4)], "PACK", [101])
    assert "bundle 0" in sched.why(100) and "GPU=4" in sched.why(100)
    assert sched.gang_infeasible(100) is not None
    sched.add_slot(9, "big", cap(CPU=4, GPU=4))
    assert sched.gang_infeasible(100) is None
    assert bundles_of(sched.schedule(0.0)) == {(100, 0): 9}


def test_a_gang_is_held_by_its_owners_quota():
    from zres.scheduler.owners import Quotas
    sched = Scheduler(quotas=Quotas(hold={"alice": cap(GPU=2)}))
    for i in range(3):
        sched.add_slot(i + 1, f"n{i}", cap(CPU=4, GPU=2))
    sched.add_gang(100, [req(GPU=1)] * 3, "SPREAD", [101, 102, 103], owner="alice")
    assert sched.schedule(0.0) == []
    assert "quota" in sched.why(100)
    sched.add_gang(200, [req(GPU=1)] * 2, "SPREAD", [201, 202], owner="alice")
    assert len(sched.schedule(0.0)) == 2


def test_a_restarted_broker_takes_bundles_and_their_tasks_back():
    sched = gpu_cluster(2, gpus=2)
    sched.add_gang(100, [req(GPU=2)] * 2, "STRICT_SPREAD", [101, 102])
    assert sched.adopt_bundle(100, 0, 1, [0, 1])
    assert not sched.adopt_bundle(100, 0, 1, [0, 1]), "taken once"
    assert sched.adopt_inside(5, 100, 0, req(CPU=0, GPU=1), [1])
    assert sched.running[5].gpus == [1] and sched.running[5].within == 101
    assert sched.adopt_bundle(100, 1, 2, [0, 1])
    assert 100 not in sched.waiting
    assert sched.schedule(0.0) == []
    check_books(sched)
