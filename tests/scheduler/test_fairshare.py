"""Fair share and quotas between owners in the pure scheduler (fake clock, plain data):
owners with less recent use go first, an owner alone gets everything, reservations still
bind across owners, and quotas cap what an owner holds while others' work passes it."""

from __future__ import annotations

import math
import random

import pytest

from tests.scheduler.test_pipelining import agent_starts, check_started_fit
from tests.scheduler.test_scheduler import cap, check_capacity, req
from zres.core.resources import UNIT
from zres.scheduler.owners import Owners, Quotas, weight_of
from zres.scheduler.policy import Scheduler


def owners_of(sched: Scheduler, grants) -> list[str]:
    return [g.owner for g in grants]


def held_by(sched: Scheduler, owner: str) -> int:
    """How many grants OWNER holds (started or queued)."""
    return sum(1 for g in sched.running.values() if g.owner == owner)


# -- the order between owners ------------------------------------------------------------


def test_a_flood_at_top_priority_does_not_keep_another_owner_waiting():
    """Issue 28: one owner's 10,000 tasks at the highest priority put every other owner's
    task behind them all. With fair share, bob's task (lowest priority) takes the first
    room that frees."""
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=2))
    for task in range(10_000):
        sched.enqueue(task, req(), priority=1000, owner="alice")
    assert owners_of(sched, sched.schedule(0.0)) == ["alice", "alice"]
    sched.enqueue(-1, req(), priority=-1000, now=1.0, owner="bob")
    assert sched.schedule(1.0) == []
    sched.release(0, now=2.0)
    assert [g.task for g in sched.schedule(2.0)] == [-1]
    assert "alice" in sched.why(2) or "needs CPU=1" in sched.why(2)


def test_owners_that_start_together_share_the_room_of_one_pass():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=10))
    for task in range(100):
        sched.enqueue(task, req(), owner="alice")
    for task in range(100, 200):
        sched.enqueue(task, req(), owner="bob")
    grants = sched.schedule(0.0)
    assert owners_of(sched, grants) == ["alice", "bob"] * 5


def test_an_owner_alone_gets_everything_whatever_its_use():
    """Work-conserving: never idle a resource to be fair. Bob has waiting work that fits
    nowhere; alice, who used far more, still takes every free CPU."""
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=4))
    for task in range(4):
        sched.enqueue(task, req(), owner="alice")
    sched.schedule(0.0)
    for task in range(4):
        sched.release(task, now=3600.0)
    sched.enqueue(99, req(GPU=1), owner="bob")  # (infeasible here: it waits)
    for task in range(10, 20):
        sched.enqueue(task, req(), owner="alice")
    assert owners_of(sched, sched.schedule(3600.0)) == ["alice"] * 4
    check_capacity(sched)


def test_an_owner_with_less_recent_use_goes_first_and_priority_orders_within_an_owner():
    sched = Scheduler()
    sched.add_slot(1, "a", cap(CPU=1))
    sched.enqueue(1, req(), owner="bob")
    sched.schedule(0.0)
    sched.release(1, now=600.0)  # bob used the cluster for ten minutes
    sched.enqueue(2, req(), priority=1000, owner="bob")
    sched.enqueue(3, req(), priority=0, owner="alice")
    sched.enqueue(4, req(), priority=5, owner="alice")
    assert [g.task for g in sched.schedule(600.0)] == [4]
    sched.release(4, now=601.0)  # alice's use is far below bob's still
    assert [g.task for g in sched.schedule(601.0)] == [3]
    sched.release(3, now=602.0)
    assert [g.task for g in sched.schedule(602.0)] == [2]


def test_the_same_events_give_the_same_schedule_across_owners():
    def run() -> list[tuple[int, int, str]]:
        rng = random.Random(5)
        sched = Scheduler(starvation_after=2.0, prefetch=2)
        sched.finished("short", 0.001)
        for slot in range(4):
            sched.add_slot(slot, f"n{slot}", cap(CPU=4))
        out = []
        for step in range(400):
            owner = rng.choice(["alice", "bob", "carol"])
            sched.enqueue(step, req(CPU=rng.choice([1, 2])), priority=rng.randint(-2, 2),
                          now=step, owner=owner, kind=rng.choice(["short", None]))
            for grant in sched.schedule(float(step)):
                out.append((grant.task, grant.slot, grant.owner))
            for slot in range(4):
                agent_starts(sched, slot)
            for task in [t for t, g in sched.running.items() if g.started][:rng.randint(0, 2)]:
                sched.release(task, now=step + 0.5)
            check_started_fit(sched)
        return out
    assert run() == run()


# -- use, decaying -----------------------------------------------------------------------


def test_use_is_weighted_by_dominant_share_and_decays_with_the_half_life():
    assert weight_of(req(CPU=4, GPU=1), cap(CPU=64, GPU=8)) == 1 / 8
    assert weight_of({"foo": UNIT}, cap(CPU=64)) == 0.0  # (what the cluster offers none of)
    owners = Owners(half_life=100.0)
    tau = 100.0 / math.log(2)
    owners.take("alice", req(), 0.5, now=0.0)
    assert owners.charge("alice", 0.0) == pytest.approx(tau * 0.5)
    # Held for long, U reaches tau * W; let go, it halves every half-life.
    owners.give("alice", req(), 0.5, now=100_000.0)
    assert owners.usage("alice", 100_000.0) == pytest.approx(tau * 0.5)
    assert owners.usage("alice", 100_100.0) == pytest.approx(tau * 0.25)
    assert owners.charge("alice", 100_200.0) == pytest.approx(tau * 0.125)
    with pytest.raises(ValueError, match="half-life"):
        Owners(half_life=math.inf)


def test_status_describes_each_owners_use_share_and_quota():
    sched = Scheduler(half_life=60.0, quotas=Quotas(hold={"carol": cap(GPU=1)}))
    sched.add_slot(1, "a", cap(CPU=4))
    sched.enqueue(1, req(CPU=3), owner="alice")
    sched.enqueue(2, req(CPU=1), owner="bob")
    sched.schedule(0.0)
    sched.release(2, now=10.0)
    described = {o["owner"]: o for o in sched.owners.describe(10.0)}
    assert described["alice"]["holds"] == req(CPU=3) and described["alice"]["grants"] == 1
    assert described["bob"]["holds"] == {} and described["bob"]["usage"] > 0
    assert described["alice"]["share"] == pytest.approx(0.75, abs=0.01)
    assert described["carol"]["quota"] == cap(GPU=1) and described["carol"]["usage"] == 0


# -- reservations across owners ----------------------------------------------------------


def test_a_big_request_is_not_starved_by_another_owners_stream_of_small_ones():
    """Alice, who holds much of the cluster, waits for a whole agent (CPU=4); bob, whose
    use is lower and so goes first in every pass, streams CPU=1 tasks there so that four
    CPUs are never free at once. Once alice's task has starved, its reservation binds bob's
    tasks too (fair share orders owners; it does not let one starve another)."""
    sched = Scheduler(starvation_after=5.0)
    sched.add_slot(1, "small", cap(CPU=4, fast=1))
    sched.add_slot(2, "big", cap(CPU=16, bigmem=16))
    for task in range(16):  # alice's long work fills the big agent for good
        sched.enqueue(1000 + task, req(bigmem=1), owner="alice")
    sched.enqueue(1, req(CPU=4, fast=1), owner="alice")
    next_id, now = 2, 0.0
    ending: list[tuple[float, int]] = []
    for _ in range(3):  # bob's stream: one ends each second, one more arrives
        sched.enqueue(next_id, req(), now=now, owner="bob")
        next_id += 1
    while now < 60.0:
        for grant in sched.schedule(now):
            if grant.task == 1:
                assert now < 5.0 + 4.0, "alice's big task started once bob's drained"
                return
            if grant.owner == "bob":
                ending.append((now + 3.0, grant.task))
        now += 1.0
        for end, task in [e for e in ending if e[0] <= now]:
            ending.remove((end, task))
            sched.release(task, now=now)
        sched.enqueue(next_id, req(), now=now, owner="bob")
        next_id += 1
    raise AssertionError("alice's big task starved behind bob's stream")


# -- quotas ------------------------------------------------------------------------------


def test_a_quota_caps_what_an_owner_holds_while_others_work_passes():
    quotas = Quotas(hold={"alice": cap(CPU=2)})
    sched = Scheduler(quotas=quotas)
    sched.add_slot(1, "a", cap(CPU=8))
    for task in range(10):
        sched.enqueue(task, req(), priority=1000, owner="alice")
    for task in range(10, 20):
        sched.enqueue(task, req(), owner="bob")
    grants = sched.schedule(0.0)
    assert sorted(owners_of(sched, grants)) == ["alice"] * 2 + ["bob"] * 6
    why = sched.why(2)
    assert "waits for its owner alice's quota" in why and "CPU=2" in why, why
    assert "others' work passes it" in why
    sched.release(0, now=1.0)
    assert [g.task for g in sched.schedule(1.0)] == [2]  # her room, hers again
    assert held_by(sched, "alice") == 2


def test_an_owner_over_quota_in_one_resource_runs_what_needs_none_of_it():
    sched = Scheduler(quotas=Quotas(default_hold=cap(GPU=1)))
    sched.add_slot(1, "a", cap(CPU=8, GPU=4))
    sched.enqueue(1, req(GPU=1), owner="alice")
    sched.enqueue(2, req(GPU=1), priority=5, owner="alice")
    sched.enqueue(3, req(CPU=1), owner="alice")
    sched.enqueue(4, req(GPU=4), owner="bob")  # more than the default quota: never
    assert sorted(g.task for g in sched.schedule(0.0)) == [2, 3]
    assert "more than the whole quota" in sched.why(4)


def test_a_task_waiting_for_its_quota_reserves_nothing():
    """Work-conserving: a task that may not start for its owner's quota keeps no slot
    from others, however long it waits."""
    sched = Scheduler(starvation_after=1.0, quotas=Quotas(hold={"alice": cap(CPU=1)}))
    sched.add_slot(1, "a", cap(CPU=2))
    sched.enqueue(1, req(), owner="alice")
    sched.enqueue(2, req(), owner="alice")
    assert [g.task for g in sched.schedule(0.0)] == [1]
    for step in range(1, 20):
        sched.enqueue(100 + step, req(), now=step, owner="bob")
        assert [g.task for g in sched.schedule(float(step))] == [100 + step]
        sched.release(100 + step, now=step + 0.5)
    assert all(slot.reserved_by is None for slot in sched.slots.values())


def test_queued_grants_count_toward_a_quota():
    sched = Scheduler(prefetch=4, quotas=Quotas(hold={"alice": cap(CPU=2)}))
    sched.finished("short", 0.001)
    sched.add_slot(1, "a", cap(CPU=1))
    for task in range(10):
        sched.enqueue(task, req(), owner="alice", kind="short")
    grants = sched.schedule(0.0)
    assert [g.started for g in grants] == [True, False], "one runs, one queued: her quota"
    sched.release(0, now=1.0)
    agent_starts(sched, 1)
    assert [g.task for g in sched.schedule(1.0)] == [2]
    assert held_by(sched, "alice") == 2


def test_work_taken_back_after_a_restart_counts_toward_its_owners_quota():
    sched = Scheduler(quotas=Quotas(hold={"alice": cap(GPU=1)}))
    sched.add_slot(1, "a", cap(CPU=4, GPU=2))
    assert sched.adopt(7, 1, req(GPU=1), [0], owner="alice")
    sched.enqueue(8, req(GPU=1), owner="alice")
    assert sched.schedule(0.0) == []
    sched.release(7)
    assert [g.task for g in sched.schedule(1.0)] == [8]
