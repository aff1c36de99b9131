"""Node protection: when the node runs low on memory (its available memory below the
agent's reserve, ``--memory-reserve``), the agent takes no more work, and stops what runs
one at a time until the node has its reserve again: the most recently started of the
lowest priority (Ray's policy), work that asked for no MEMORY before work that did (that
is within what it was given). What is stopped fails with ``MemoryLimitError('node out of
memory ...')``; the agent itself carries on.

Work with a process of its own (a task that asked for MEMORY, a command job, an actor) is
killed whole. A task in a pooled worker process is stopped as a forced cancel stops it
(an exception raised in its call: what it holds is freed as the call unwinds), and its
process is killed if the call has not ended two seconds later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...core.resources import MEMORY, format_bytes
from ...logs import get_logger
from .monitor import Monitor

if TYPE_CHECKING:
    from ..actors import ActorSupervisor
    from ..jobs import JobRunner
    from ..running import TaskRunner
    from ..workers import WorkerPool

log = get_logger("zres.agent")
SETTLE = 1.0  # seconds after a stop before another: what it held takes a moment to free


@dataclass(slots=True, frozen=True)
class Candidate:
    """Something running here that could be stopped to save the node."""

    id: int               # the broker's id (an actor's: its placement)
    kind: str             # "task", "job" or "actor"
    priority: int
    began: float          # when it began here (monotonic)
    asked: bool           # it asked for MEMORY
    own: bool             # it runs in a process tree of its own


def choose(candidates: Iterable[Candidate]) -> Candidate | None:
    """What to stop first: work that asked for no MEMORY before work that did, then the
    lowest priority, then the most recently started."""
    return min(candidates, key=lambda c: (c.asked, c.priority, -c.began), default=None)


class Guard:
    """Protect the node (see the module's docstring) from the agent's loop: ``turn`` each
    turn. RESUME() runs what waited while the node was low (grants that came meanwhile)."""

    def __init__(self, monitor: Monitor, agent: str, runner: TaskRunner,
                 actors: ActorSupervisor, jobs: JobRunner, pool: WorkerPool,
                 resume: Callable[[], None]) -> None:
        self.monitor = monitor
        self.agent = agent
        self.paused = False
        self._runner, self._actors, self._jobs, self._pool = runner, actors, jobs, pool
        self._resume = resume
        self._victim: Candidate | None = None
        self._next = 0.0

    def turn(self, now: float) -> None:
        low = self.monitor.low
        if low != self.paused:
            self._pause(low)
        if not low or now < self._next or (self._victim is not None
                                           and self._victim.id in self._running()):
            return  # (one at a time: the last one stopped must be gone first)
        victim = choose(self.candidates())
        self._victim = victim
        if victim is not None:
            self._next = now + SETTLE
            self._stop(victim)

    def _pause(self, low: bool) -> None:
        self.paused = self._runner.paused = self._pool.paused = low
        available, reserve = self.monitor.available or 0, self.monitor.reserve
        if low:
            log.warning("node_memory_low", agent=self.agent, available=format_bytes(available),
                        reserve=format_bytes(reserve), why="taking no work until it is back")
        else:
            log.info("node_memory_back", agent=self.agent, available=format_bytes(available))
        self._runner.capacity_changed()  # (delegates start nothing queued while low)
        if not low:
            self._resume()

    def _running(self) -> set[int]:
        return {*self._runner.grants, *self._jobs.jobs,
                *(w.actor.placement for w in self._actors.by_id.values() if w.actor)}

    def candidates(self) -> list[Candidate]:
        """Everything running here that could be stopped."""
        found = [Candidate(g.task, "task", -g.key[0], g.began_at, MEMORY in g.taken,
                           bool(g.worker is not None and g.worker.task))
                 for g in self._runner.grants.values() if g.running and g.sent]
        found += [Candidate(j.task, "job", j.priority, j.began, MEMORY in j.taken, True)
                  for j in self._jobs.jobs.values() if not j.cancelled]
        found += [Candidate(w.actor.placement, "actor", w.actor.priority, w.actor.began,
                            bool(w.actor.context["resources"].get(MEMORY)), True)
                  for w in self._actors.by_id.values() if w.actor is not None]
        return found

    def _stop(self, victim: Candidate) -> None:
        available = format_bytes(self.monitor.available or 0)
        why = (f"{available} available, below its reserve of "
               f"{format_bytes(self.monitor.reserve)}, and this was the most recently "
               f"started work of the lowest priority ({victim.priority})")
        log.warning("memory_stopped", agent=self.agent, kind=victim.kind, id=victim.id,
                    priority=victim.priority, available=available)
        if victim.own and self.monitor.kill(victim.id, why):
            return
        error: dict[str, Any] = {
            "type": "MemoryLimitError", "limit": None, "peak": None,
            "message": f"node out of memory on agent {self.agent}: {why}; task {victim.id} "
                       "was stopped (it shared a worker process: its own use is not known)"}
        if victim.kind == "task":
            self._runner.cancel(victim.id, force=True, error=error)
        elif victim.kind == "job":
            self._jobs.cancel(victim.id)
        else:  # (its process dies; the agent reports it as it reaps it)
            for worker in self._actors.by_id.values():
                if worker.actor is not None and worker.actor.placement == victim.id:
                    worker.proc.kill()

