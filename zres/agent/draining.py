"""How an agent leaves when it is told to stop (SIGTERM): it takes no new work, hands back
what has not started, lets what runs finish within its drain grace, then says goodbye.
A second request stops it at once."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..core import protocol as P
from ..logs import get_logger

log = get_logger("zres.agent")


class Draining:
    """Mixed into the agent's daemon (``Agent``), whose parts it uses."""

    if TYPE_CHECKING:  # (the daemon's own, used here)
        name: str
        broker: Any
        session: Any
        reports: Any
        runner: Any
        jobs: Any
        actors: Any
        drain_grace: float
        _deferred: Any
        _draining_until: float | None
        _drain_asked: bool

        def stop(self) -> None: ...

        def _send_report(self, last: bool = False) -> None: ...

    def _ask_drain(self) -> None:
        if self._drain_asked:
            self.stop()
        self._drain_asked = True

    def drain(self) -> None:
        """Stop gracefully: take no new work, give back what has not started, let what
        runs finish within the drain grace, then say goodbye. A second call stops at once."""
        if self._draining_until is not None or not self.session.registered:
            self.stop()
            return
        self._draining_until = time.monotonic() + self.drain_grace
        log.info("agent_draining", agent=self.name, grace=self.drain_grace)
        P.send(self.broker, P.encode(P.DRAIN, {"session": self.session.id}))
        self._give_back_unstarted()

    def _give_back_unstarted(self) -> None:
        """Hand the broker back every grant not handed to a worker yet, and every job
        whose start still waits for the broker."""
        for task_id in self._deferred.ids():
            self.reports.give_back(task_id)
        self._deferred.take()
        self.runner.give_back_unstarted()
        for task_id in list(self.runner.placements):
            if task_id not in self.jobs.jobs and not self.actors.placed(task_id):
                self.runner.free(task_id, start=False)  # its start finds it gone
                self.reports.give_back(task_id)

    def _drain_step(self, now: float) -> None:
        assert self._draining_until is not None
        # Actors never finish on their own: they are stopped once the tasks are done.
        tasks_left = bool(self.runner.grants) or bool(self.jobs.jobs)
        if tasks_left and now < self._draining_until:
            return
        if tasks_left:
            log.warning("agent_drain_timeout", agent=self.name, grace=self.drain_grace)
        # What still runs is stopped: the workers' deaths report its tasks as lost.
        self.actors.stop_all("the agent is shutting down")
        self.jobs.stop_all()
        # (all of it: a direct grant handed over, still running, is said held; one not
        # said held when the broker reads the goodbye never reached a worker here)
        self._send_report(last=True)
        P.send(self.broker, P.encode(P.BYE, {"session": self.session.id,
                                             "seq": self.reports.seq}))
        self.stop()
