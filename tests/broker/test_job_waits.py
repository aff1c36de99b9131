"""Waits on jobs' ends (``zres.broker.job_waits``), with plain data: a held request is
answered once none of its jobs is left to end, or at its time, once; looked at again when
an agent is lost; past the limit, not held."""

from __future__ import annotations

from typing import Any

from zres.broker import job_waits
from zres.broker.job_waits import JobWaits, Wait


class Table:
    """Jobs' states, and the answers sent."""

    def __init__(self) -> None:
        self.pending: set[int] = set()
        self.sent: list[tuple[Any, bool]] = []

    def answer(self, wait: Wait, now: bool) -> bool:
        if not now and self.pending & set(wait.jobs):
            return True
        self.sent.append((wait.req, now))
        return False


def wait(req: int, jobs: list[Any], deadline: float = 100.0) -> Wait:
    return Wait(b"me", req, jobs, "client", "alice", deadline)


def test_a_wait_is_answered_once_all_its_jobs_ended_or_at_its_time_and_once_only():
    table = Table()
    waits = JobWaits(table.answer)
    table.pending = {1, 2, 3}
    assert waits.hold(wait(10, [1, 2])) and waits.hold(wait(11, [3, "x"], deadline=5.0))
    assert waits.held == 2
    table.pending.discard(1)
    waits.ended(1)
    waits.answer(1.0)
    assert table.sent == [], "answered while one of its jobs runs on"
    table.pending.discard(2)
    waits.ended(2)
    waits.answer(2.0)
    assert table.sent == [(10, False)] and waits.held == 1
    waits.answer(5.0)  # (its time is up: answered as its jobs are)
    assert table.sent == [(10, False), (11, True)] and waits.held == 0
    waits.ended(3)
    waits.recheck()
    waits.answer(200.0)
    assert len(table.sent) == 2, "a wait answered twice"


def test_an_agent_lost_has_every_wait_looked_at_again():
    """(A queued job may have become infeasible: no end of its own says so.)"""
    table = Table()
    waits = JobWaits(table.answer)
    table.pending = {1}
    waits.hold(wait(10, [1]))
    table.pending = set()  # (judged infeasible now)
    waits.answer(1.0)
    assert table.sent == []
    waits.recheck()
    waits.answer(1.0)
    assert table.sent == [(10, False)]


def test_past_the_limit_a_request_is_not_held(monkeypatch):
    monkeypatch.setattr(job_waits, "MAX_HELD", 2)
    waits = JobWaits(Table().answer)
    assert waits.hold(wait(1, [1])) and waits.hold(wait(2, [1]))
    assert not waits.hold(wait(3, [1]))
