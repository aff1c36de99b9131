"""Work an agent carries across a restart of its broker, and what it offers the new one.

A broker that keeps its state (``adopts`` in its welcome, of this agent's cluster) takes
back what ran on while it was away. So when such a broker restarts, the agent stops
nothing that runs: Python tasks in worker processes, command jobs and actors run on. It
drops the grants, job starts and actor calls that never reached their process (the
broker sends them again), asks its workers back for the queued grants they have not
begun, and registers a new session only once they have answered, offering:
- ``jobs``: what runs here ([id, slot, GPU positions, taken]), tasks and jobs alike;
- ``actors``: the actor processes ([actor id, placement, slot, GPU positions, [calls
  each has in hand]]);
- ``ended``: how the work ended that the old broker had not acknowledged (the results
  of reports it may never have read), with their frames;
- ``returned``: grants that never began here, to be granted again;
- ``exits``: the actor processes that ended meanwhile (a report's ``exits``: the calls
  each had begun), so that the calls they never began run on the next instance;
- ``carried``: the session whose work this is. A broker that last knew this agent by that
  session knows the offer is all that session may have begun: a grant made to it and not
  offered never arrived (a direct grant sent as the broker died), and goes again uncharged.
The restarted broker adopts what it knows and stops the rest.
"""

from __future__ import annotations

from typing import Any

from ..core import protocol as P
from .actors import ActorSupervisor
from .jobs import JobRunner
from .reports import Reports
from .running import TaskRunner


class CarryOver:
    """What this agent will offer its broker's next life, until that one welcomes it."""

    def __init__(self, runner: TaskRunner, jobs: JobRunner, reports: Reports,
                 actors: ActorSupervisor) -> None:
        self._runner = runner
        self._jobs = jobs
        self._actors = actors
        self._reports = reports
        self._ended: dict[int, list[Any]] = {}
        self._returned: list[int] = []
        self._exits: list[dict[str, Any]] = []
        # Offered once: what ends after that goes in the new session's first report (the
        # broker takes only the first offer of a session; a repeat must not swallow news).
        self._offered = False
        self._carried: int | None = None   # the session whose work this is

    def adopts(self, msg: P.Message) -> bool:
        """Whether MSG comes from a broker of our cluster that keeps its state."""
        return msg.body.get("adopts") is True and msg.body.get("cluster") == self._jobs.cluster

    def begin(self, session: int) -> None:
        """The broker restarted on its state: keep what runs, take what it did not hear, of
        SESSION (or of the session an offer not yet welcomed carries: it is all here)."""
        if self._carried is None:
            self._carried = session
        self._take_reports()
        self._reports.reset()
        self._offered = False
        self._runner.give_back_unstarted(restart=True)
        self._returned.extend(self._actors.carry_over())
        for task_id in list(self._runner.placements):
            if task_id not in self._jobs.jobs and not self._actors.placed(task_id):
                self._runner.free(task_id, start=False)  # a job whose start waited: void
                self._returned.append(task_id)

    def _take_reports(self) -> None:
        results, returned, exits = self._reports.salvage()
        for item in results:
            self._ended[item[0]] = item
        self._returned.extend(returned)
        self._exits.extend(exits)

    def ready(self) -> bool:
        """Whether the offer is complete: every worker asked back for a grant answered."""
        return not self._runner.settling()

    def offer(self) -> tuple[dict[str, Any], list[Any]]:
        """The fields a new session's REGISTER offers, and their frames."""
        if not self._offered:  # what ended since (it has not been reported to anyone)
            self._take_reports()
            self._offered = True
        ended = dict(self._ended)
        for task_id, (outcome, frames, info) in self._jobs.recent.items():
            ended.setdefault(task_id, [task_id, outcome, list(frames), info])
        items = list(ended.values())
        body = {"jobs": [*self._jobs.offer(), *self._runner.offer()],
                "actors": self._actors.offer(self._slot_of),
                "ended": [[i, outcome, len(frames), info] for i, outcome, frames, info in items],
                "returned": list(self._returned), "exits": list(self._exits)}
        if self._carried is not None:
            body["carried"] = self._carried
        return body, [f for _, _, frames, _ in items for f in frames]

    def _slot_of(self, placement: int) -> tuple[int, tuple[str, ...]] | None:
        where = self._runner.placements.get(placement)
        return None if where is None else (where[0],
                                           tuple(self._runner.slots[where[0]].spec.gpus))

    def clear(self) -> None:
        """The new session is welcomed (or the old work is void): nothing is left to offer."""
        self._ended.clear()
        self._returned.clear()
        self._exits.clear()
        self._offered = False
        self._carried = None
