"""Waits on jobs' ends: a ``jobs`` request for some jobs with ``wait`` is held until none of
them is left to end, or for that many seconds (at most ``MAX_WAIT``), not answered at once.

``zres wait`` asks so, and asks again only when it is answered: it hears a job's end as
the broker does, not at its next look (it looked every fifth of a second, each look a
connection and a request of its own, however many waited). A held request is a record,
never a wait of the loop's: a job's end (``ended``) makes its waits due, and each turn the
broker answers those due and those whose time is up (``answer``); an agent lost makes
every wait due, since a queued job may be infeasible now. A requester that goes leaves its
wait to end at its time (its answer is dropped); a broker that restarts loses the waits
(their requesters ask again). Past ``MAX_HELD`` held at once, requests are answered at
once (their requesters then look again a little later, as before).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_WAIT = 30.0      # seconds a request may be held, at most
MAX_HELD = 10_000    # requests held at once, at most
PENDING = frozenset({"queued", "running"})  # a job in these states is still to end


@dataclass(slots=True, eq=False)
class Wait:
    """One held request: who asked (IDENT, its REQ), for which JOBS, as whom (ROLE,
    OWNER: what it may see), until when (DEADLINE, monotonic)."""

    ident: bytes
    req: Any
    jobs: list[Any]
    role: str
    owner: str
    deadline: float
    done: bool = False


class JobWaits:
    """The held ``jobs`` requests. ANSWER(wait, now) sends WAIT its answer (its jobs as they
    are now), unless one of them is still to end and not NOW (its time is up); it returns
    whether it still waits (nothing was sent)."""

    def __init__(self, answer: Callable[[Wait, bool], bool]) -> None:
        self._answer = answer
        self._by_job: dict[int, list[Wait]] = {}
        self._deadlines: list[tuple[float, int, Wait]] = []
        self._due: list[Wait] = []
        self._order = itertools.count()
        self.held = 0

    def hold(self, wait: Wait) -> bool:
        """Hold WAIT until its jobs have ended or its time is up; False if too many are
        held (answer it now)."""
        if self.held >= MAX_HELD:
            return False
        self.held += 1
        for job_id in wait.jobs:
            if type(job_id) is int:
                self._by_job.setdefault(job_id, []).append(wait)
        heapq.heappush(self._deadlines, (wait.deadline, next(self._order), wait))
        return True

    def ended(self, job_id: int) -> None:
        """Job JOB_ID ended: the waits on it are looked at again this turn."""
        self._due.extend(self._by_job.pop(job_id, ()))

    def recheck(self) -> None:
        """Look at every wait again this turn (an agent was lost: a job may be infeasible)."""
        self._due.extend(w for _, _, w in self._deadlines)

    def answer(self, now: float) -> None:
        """Answer the waits whose jobs have all ended, and those whose time is up."""
        due, self._due = self._due, []
        for wait in due:
            if not wait.done and not self._answer(wait, False):
                self._finish(wait)
        while self._deadlines and (self._deadlines[0][0] <= now or self._deadlines[0][2].done):
            _, _, wait = heapq.heappop(self._deadlines)
            if not wait.done:
                self._answer(wait, True)
                self._finish(wait)

    def _finish(self, wait: Wait) -> None:
        wait.done = True
        self.held -= 1
        for job_id in wait.jobs:
            waits = self._by_job.get(job_id) if type(job_id) is int else None
            if waits is not None and wait in waits:
                waits.remove(wait)
                if not waits:
                    del self._by_job[job_id]
