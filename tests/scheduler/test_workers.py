"""Agents by name (Dask's ``workers=`` and ``allow_other_workers=``) in the pure scheduler."""

from __future__ import annotations

from tests.scheduler.test_pipelining import agent_starts, check_started_fit
from tests.scheduler.test_scheduler import cap, placed, req
from zres.scheduler.policy import Scheduler
from zres.scheduler.records import workers


def two_agents(**options: float) -> Scheduler:
    sched = Scheduler(**options)  # type: ignore[arg-type]
    sched.add_slot(1, "agent-a", cap(CPU=2))
    sched.add_slot(2, "agent-b", cap(CPU=2))
    return sched


def test_a_task_for_named_agents_runs_only_there_and_waits_for_them():
    sched = two_agents()
    for task in (1, 2, 3):
        sched.enqueue(task, req(), where=workers(["agent-b"]))
    assert placed(sched.schedule()) == {1: 2, 2: 2}, "agent-a would do as well: not asked"
    assert sched.why(3) == "needs CPU=1; agent-b has CPU=0 free"
    sched.enqueue(4, req())                    # the same request, on any agent
    assert placed(sched.schedule()) == {4: 1}, "a restricted shape blocks no other task"
    sched.release(1)
    assert placed(sched.schedule()) == {3: 2}


def test_names_no_agent_has_are_infeasible_until_one_joins():
    sched = two_agents()
    where = workers(["gpu-9"])
    assert sched.infeasible_reason(req(), where) == "no agent named gpu-9 has joined"
    assert sched.infeasible_reason(req(), workers(["x", "y"])) == (
        "none of the agents it may run on (x, y) has joined")
    sched.enqueue(1, req(), where=where)
    assert sched.schedule() == []
    assert sched.why(1) == "infeasible: no agent named gpu-9 has joined"
    sched.add_slot(3, "gpu-9", cap(CPU=1))
    assert sched.infeasible_reason(req(), where) is None
    assert placed(sched.schedule()) == {1: 3}


def test_named_agents_too_small_say_so():
    sched = two_agents()
    reason = sched.infeasible_reason(req(CPU=3), workers(["agent-a", "nobody"]))
    assert reason == "needs CPU=3, largest agent has CPU=2 (it may run only on agent-a, nobody)"
    sched.add_slot(3, "big", cap(CPU=8))
    assert sched.infeasible_reason(req(CPU=3), workers(["agent-a"])) is not None
    assert sched.infeasible_reason(req(CPU=3)) is None


def test_preferred_agents_go_first_when_they_fit_else_any():
    sched = two_agents()
    prefer_b = workers(["agent-b", "unknown"], loose=True)
    assert sched.infeasible_reason(req(), workers(["unknown"], loose=True)) is None
    for task in (1, 2, 3):
        sched.enqueue(task, req(), where=prefer_b)
    assert placed(sched.schedule()) == {1: 2, 2: 2, 3: 1}


def test_restricted_tasks_queue_and_reserve_only_on_their_agents():
    sched = two_agents(prefetch=2, starvation_after=5.0)
    sched.finished("short", 0.001)
    only_a = workers(["agent-a"])
    for task in range(1, 7):
        sched.enqueue(task, req(), now=0.0, kind="short", where=only_a)
    grants = sched.schedule(0.0)
    assert {g.slot for g in grants} == {1} and len(grants) == 4   # 2 started, 2 queued
    check_started_fit(sched)
    sched.release(1)
    assert agent_starts(sched, 1) == [3]
    sched.enqueue(10, req(CPU=2), now=0.0, where=only_a)   # blocked, then starving
    sched.enqueue(11, req(CPU=2), now=0.0)
    grants = placed(sched.schedule(0.0))
    assert grants[11] == 2 and 10 not in grants
    assert all(slot == 1 for task, slot in grants.items() if task < 10)
    sched.schedule(6.0)
    assert sched.slots[1].reserved_by == 10 and sched.slots[2].reserved_by is None


def test_a_decision_for_a_task_on_any_agent_never_looks_agents_up_by_name():
    sched = two_agents()
    looked_up = []
    named = sched.table.named
    sched.table.named = lambda where: looked_up.append(where) or named(where)  # type: ignore
    for task in range(1, 6):
        sched.enqueue(task, req())
    assert len(sched.schedule()) == 4
    sched.why(5)
    assert looked_up == []
