"""A restarted broker takes back what ran on while it was gone: command jobs.

A broker that keeps its state restores its job table at start. A queued job is queued
again. A job that was running is *adopting*: its agent, which keeps jobs running when
its broker goes away (if the broker comes back as the same cluster), offers them with
its next session, with their slot and GPU positions, and says how recent jobs ended.
- A job offered by the agent it ran on is running again there: its resources are taken
  on that slot and those devices before anything else can be granted them.
- A job that ended meanwhile gets the outcome its agent kept.
- A job its agent no longer has, or whose agent is not back within GRACE seconds, is
  lost, saying why.
- A job offered that the broker does not know (or cannot hold there) is stopped, its
  resources counted until it is gone.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import structlog

from ..core import protocol as P
from ..core.errors import ProtocolError
from ..core.tasks import Task, TaskState, set_state
from ..scheduler.policy import Scheduler
from .agents import AgentRecord
from .graph import TaskGraph
from .jobs import JobRecord, JobTable
from .store import Store

log = structlog.get_logger("zres.broker")


class Adoption:
    """The jobs a restarted broker takes back from GRAPH's previous life."""

    def __init__(self, graph: TaskGraph, sched: Scheduler, jobs: JobTable,
                 grace: float) -> None:
        self._graph = graph
        self._sched = sched
        self._jobs = jobs
        self.grace = grace
        self._deadline = time.monotonic() + grace

    def restore(self, store: Store) -> None:
        """Take back the job table kept in STORE: queue the queued jobs again."""
        # Hundreds of thousands of records become objects here, none of them garbage: the
        # cyclic collector would walk them all, again and again, for nothing.
        gc.disable()
        try:
            again = self._jobs.restore(store.jobs())
            for job in again:
                self._graph.link(self._task(job), [])
        finally:
            gc.enable()
        store.commit()
        if again or self._jobs.done or self._jobs.adopting:
            log.info("state_restored", dir=store.directory, queued=len(again),
                     running=len(self._jobs.adopting), finished=len(self._jobs.done))

    def _task(self, job: JobRecord) -> Task:
        task = Task(job.id, b"", -1, dict(job.units), job.priority, 0, job.name, job.strict,
                    [], [], holders=0)  # no client holds it any more
        self._graph.add(task)
        return task

    def offered(self, agent: AgentRecord, body: dict[str, Any],
                frames: list[Any]) -> list[int]:
        """AGENT's new session offers the jobs it runs and says how recent ones ended;
        return the ids of those it must stop."""
        running = body.get("jobs")
        if running is None:
            return []  # not a new session's offer (an agent just started, or resuming)
        stop = [entry[0] for entry in running if isinstance(running, list)
                and _well_formed(entry, len(agent.slots)) and not self._take(agent, *entry)]
        self._ended(agent, body.get("ended"), frames)
        for job in [j for j in self._jobs.adopting.values() if _on(j) == agent.name]:
            if self._jobs.held_only(job):  # it never started there: it goes again
                self._jobs.requeue_adopting(job)
                self._graph.link(self._task(job), [])
            else:
                self._jobs.not_adopted(job, f"the broker restarted while it ran, and agent "
                                       f"{agent.name} no longer had it when it came back")
        return stop

    def _take(self, agent: AgentRecord, task_id: int, index: int, positions: list[int],
              taken: Any) -> bool:
        """Take back TASK_ID, which AGENT runs on its slot INDEX (GPU POSITIONS); False if
        it is not ours to run: then it is to be stopped there, and its resources (TAKEN)
        are counted until it is gone."""
        slot = agent.slots[index]
        job = self._jobs.adopting.get(task_id)
        if job is not None and _on(job) == agent.name and self._sched.adopt(
                task_id, slot, dict(job.units), positions, job.priority):
            self._running(self._task(job), agent)
            self._jobs.adopted(job, agent.name)
            log.info("job_adopted", job=job.id, agent=agent.name)
            return True
        self._graph.skip_past(task_id)  # (a state older than the agent's work)
        units = _units(taken)
        if self._graph.get(task_id) is not None or units is None \
                or not self._sched.adopt(task_id, slot, units, positions):
            log.warning("job_not_adopted", job=task_id, agent=agent.name)
            return False
        unknown = JobRecord(task_id, f"job {task_id}", [], {}, True, 0.0, {})
        self._running(self._task(unknown), agent).stopping = True
        return False

    def _ended(self, agent: AgentRecord, ended: Any, frames: list[Any]) -> None:
        """Record how AGENT's adopting jobs ENDED while the broker was away."""
        items = ended if isinstance(ended, list) else []
        if not (all(isinstance(i, list) and len(i) == 4 and type(i[0]) is int
                    and type(i[2]) is int and i[2] >= 0 for i in items)
                and sum(i[2] for i in items) == len(frames)):
            return  # malformed: ignored whole
        for (task_id, outcome, _, info), result in zip(
                items, P.split_frames(frames, [i[2] for i in items])):
            job = self._jobs.adopting.get(task_id)
            if job is not None and _on(job) == agent.name and isinstance(info, dict):
                task = self._running(self._task(job), agent)
                self._jobs.adopted(job, agent.name)
                self._graph.finish(task, str(outcome), result, info)

    @staticmethod
    def _running(task: Task, agent: AgentRecord) -> Task:
        """TASK runs on AGENT (it began before this broker did)."""
        set_state(task, TaskState.QUEUED)
        set_state(task, TaskState.RUNNING)
        task.agent = agent.name
        task.held = task.begun = True
        task.started_at = time.monotonic()
        return task

    def expire(self, now: float) -> None:
        """The jobs whose agents are not back within the grace period are lost."""
        if self._jobs.adopting and now >= self._deadline:
            for job in list(self._jobs.adopting.values()):
                self._jobs.not_adopted(job, f"the broker restarted while it ran, and agent "
                                       f"{_on(job)} did not come back within "
                                       f"{self.grace:g}s")


def _well_formed(entry: Any, slots: int) -> bool:
    """Whether an offered job reads [id, slot index, [GPU positions], taken]."""
    return (isinstance(entry, list) and len(entry) == 4
            and all(type(v) is int for v in entry[:2]) and 0 <= entry[1] < slots
            and isinstance(entry[2], list) and all(type(p) is int for p in entry[2]))


def _on(job: JobRecord) -> str:
    """The agent JOB runs on, or may: a job held there but not reported started yet."""
    return job.agent or job.held_on


def _units(value: Any) -> dict[str, int] | None:
    try:
        return P.check_units(value, "register")
    except ProtocolError:
        return None
