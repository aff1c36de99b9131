"""A restarted broker takes back what ran on while it was gone: command jobs and Python
tasks.

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
Python tasks an agent held (``keeping`` restores them; a direct grant is held from its
assignment) wait the same way, and the agent also gives back those that never began
there: they are granted again, uncharged. An agent that carries the very session the
broker last knew it by (``carried``: the same process, which stopped nothing) offers all
that may have begun there, so one it does not offer never reached it (an assignment lost
with the broker): it is granted again, uncharged too (a job never reported started, and
an actor's construction, alike). One whose agent began anew (or carries another
session), or is not back in time, may have run: it spends a retry, or fails with
AgentLostError. Actors are taken back alike (``actor_keeping``), and so are
placement groups' bundles (before the work inside them) and multi-node jobs' ranks
(``gangs.keeping``, ``gangs.rank_keeping``).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from ..core import protocol as P
from ..core.errors import ProtocolError
from ..core.tasks import Task, TaskState
from ..logs import get_logger
from ..scheduler.policy import Scheduler
from ..scheduler.records import Inside
from .actor_keeping import ActorKeeper
from .agents import AgentRecord
from .clients import ClientRegistry
from .graph import TaskGraph
from .jobs import JobRecord, JobTable
from .store import Store

log = get_logger("zres.broker")


class Adoption:
    """The jobs a restarted broker takes back from GRAPH's previous life."""

    def __init__(self, graph: TaskGraph, sched: Scheduler, jobs: JobTable,
                 grace: float, clients: ClientRegistry, reconnect: float,
                 actors: ActorKeeper, objects: Any = None, gangs: Any = None) -> None:
        # Python tasks an agent held when the broker went: task id -> (task, its inputs'
        # ids, the agent's name).
        self.tasks: dict[int, tuple[Task, list[int], str]] = {}
        self._graph = graph
        self._actors = actors
        self._objects = objects  # (where results kept on agents are: ``objects``)
        # Gangs (issue 31): the placement groups' keeper, the multi-node jobs' ranks, the
        # groups (where work placed in a bundle is taken back).
        self._gangs: Any
        self._ranks: Any
        self._groups: Any
        self._gangs, self._ranks, self._groups = gangs or (None, None, None)
        self._clients = clients
        self._reconnect = reconnect   # how long a job's client has to come back
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
            if self._gangs is not None:  # (before the actors and tasks placed in them)
                self._gangs.restore()
            again = self._jobs.restore(store.jobs())
            for job in again:
                self._graph.link(self._task(job), [])
            for job in self._jobs.done.values():
                if job.client and job.ended:  # its client may not have heard how it ended
                    task = self._task(job)
                    task.outcome, task.info, task.result = job.ended[0], job.ended[1], \
                        list(job.ended[2])
                    self._graph.restored_as(
                        task, TaskState.DONE if task.outcome == P.OK else TaskState.FAILED)
            for job in [j for j in self._jobs.adopting.values() if j.nodes > 1]:
                # (a multi-node job runs again as a whole; each rank waits for its agent)
                task = self._task(job)
                self._graph.set_state(task, TaskState.QUEUED)
                self._graph.set_state(task, TaskState.RUNNING)
                task.agent, task.held, task.begun = job.agent, True, job.started is not None
                self._jobs.adopting.pop(job.id)
                self._jobs.active[job.id] = job
                self._ranks.restore(job, task)
            for job in self._jobs.adopting.values():
                if job.client:  # its client may ask after it before its agent is back
                    self._clients.restore(job.client, job.owner,
                                          self._reconnect).ids[job.local] = job.id
        finally:
            gc.enable()
        store.commit()
        if again or self._jobs.done or self._jobs.adopting:
            log.info("state_restored", dir=store.directory, queued=len(again),
                     running=len(self._jobs.adopting), finished=len(self._jobs.done))

    def wait_for(self, task: Task, deps: list[int], agent: str) -> None:
        """TASK (restored, its inputs DEPS) was held on AGENT: wait for that agent's word."""
        task.held, task.agent = True, agent   # (cancel() answers: it may be running)
        self.tasks[task.id] = (task, deps, agent)

    def _task(self, job: JobRecord) -> Task:
        task = Task(job.id, job.client, job.local, dict(job.units), job.priority, job.retries,
                    job.name, job.strict, [], [], holders=1 if job.client else 0,
                    owner=job.owner)
        task.detached, task.client_gone = job.detached, not job.client
        if job.client:  # its client waits for it: it is given back when that one returns
            self._clients.restore(job.client, job.owner, self._reconnect).ids[job.local] = \
                job.id
        self._graph.add(task)
        return task

    def offered(self, agent: AgentRecord, body: dict[str, Any],
                frames: list[Any]) -> list[int]:
        """AGENT's new session offers the jobs it runs and says how recent ones ended;
        return the ids of those it must stop."""
        running = body.get("jobs")
        if running is None:
            return []  # not a new session's offer (an agent just started, or resuming)
        if self._gangs is not None:  # (its bundles first: work ran inside them)
            self._gangs.offered(agent)
        self._actors.offered(agent, body.get("actors"))
        self._actors.exited_away(agent, body.get("exits"))
        entries = [e for e in running if _well_formed(e, len(agent.slots))] \
            if isinstance(running, list) else []
        stop = [entry[0] for entry in entries if not self._take(agent, *entry)]
        self._ended(agent, body.get("ended"), frames)
        returned = body.get("returned")
        returned = {i for i in returned if type(i) is int} if isinstance(returned, list) \
            else set()
        for task_id in returned:
            if self._waiting(task_id, agent.name) is not None:
                self._again(task_id, None)  # it never began there
        carried = body.get("carried")
        whole = type(carried) is int and carried == agent.previous  # (see the docstring)
        self._actors.given_back(agent, returned, whole)
        for task_id in [i for i, (_, _, on) in self.tasks.items() if on == agent.name]:
            if whole:
                log.info("task_never_arrived", id=task_id, agent=agent.name)
            self._again(task_id, None if whole else f"the broker restarted while agent "
                        f"{agent.name} held it, and that agent no longer had it when it "
                        "came back")
        for job in [j for j in self._jobs.adopting.values() if _on(j) == agent.name]:
            # Given back: its start waited for the old broker, and never came; or, its
            # agent carrying the whole session, not offered: its start never arrived.
            # (Only the agent can say so: one started anew has no word of what its last
            # life may have begun.)
            if self._jobs.held_only(job) and (job.id in returned or whole and all(
                    not isinstance(e, list) or e[:1] != [job.id] for e in running)):
                self._jobs.requeue_adopting(job)
                self._graph.link(self._task(job), [])
            else:
                self._lost(job, f"the broker restarted while it ran (or was starting), "
                           f"and agent {agent.name} no longer had it when it came back")
        self._actors.settle(agent)
        if self._ranks is not None:
            self._ranks.settle(agent, f"the broker restarted while it ran, and agent "
                               f"{agent.name} no longer had it when it came back")
        return stop

    def _take(self, agent: AgentRecord, task_id: int, index: int, positions: list[int],
              taken: Any) -> bool:
        """Take back TASK_ID, which AGENT runs on its slot INDEX (GPU POSITIONS); False if
        it is not ours to run: then it is to be stopped there, and its resources (TAKEN)
        are counted until it is gone."""
        slot = agent.slots[index]
        if self._ranks is not None and self._ranks.is_rank(task_id):  # (a multi-node job's)
            return self._ranks.adopt(agent, task_id, slot, positions)
        waiting = self._waiting(task_id, agent.name)
        inside = self._groups.inside(waiting.bundle) if waiting is not None \
            and waiting.bundle and self._groups is not None else None
        if inside is not None and not self._placed(inside):
            # Its group let go of its bundles (one was lost with its agent) and waits to be
            # reserved again: what ran inside holds what it took, as a grant of its own, as
            # without the restart (not taken back, it was stopped and run again as if it
            # had never arrived: twice, for a body that may run at most once).
            inside = None
        if waiting is not None and self._sched.adopt(task_id, slot, dict(waiting.units),
                                                     positions, waiting.priority,
                                                     waiting.owner, inside):
            self._hold_inputs(task_id)
            self._running(waiting, agent)
            log.info("task_adopted", task=waiting.name, id=task_id, agent=agent.name)
            return True
        if waiting is not None:
            # It runs there, and there is no room for it now (its agent's capacity was
            # lowered meanwhile): stopped there, it began, and goes again only as a retry
            # (not as one that never arrived, which ran it twice, retries=0 or not).
            log.warning("task_not_adopted", task=waiting.name, id=task_id, agent=agent.name)
            self._again(task_id, f"the broker restarted while it ran on agent {agent.name}, "
                        "which no longer had room for it when it came back")
            return False
        job = self._jobs.adopting.get(task_id)
        if job is not None and _on(job) == agent.name and self._sched.adopt(
                task_id, slot, dict(job.units), positions, job.priority, job.owner):
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

    def _placed(self, inside: Inside) -> bool:
        """Whether the bundle INSIDE names is reserved (its gang placed, that bundle kept)."""
        gang = self._sched.gang(inside.gang)
        return gang is not None and gang.placed is not None \
            and gang.placed[inside.index] is not None

    def _ended(self, agent: AgentRecord, ended: Any, frames: list[Any]) -> None:
        """Record how AGENT's adopting jobs ENDED while the broker was away."""
        items = ended if isinstance(ended, list) else []
        if not (all(isinstance(i, list) and len(i) == 4 and type(i[0]) is int
                    and type(i[2]) is int and i[2] >= 0 for i in items)
                and sum(i[2] for i in items) == len(frames)):
            return  # malformed: ignored whole
        for (task_id, outcome, _, info), result in zip(
                items, P.split_frames(frames, [i[2] for i in items])):
            if isinstance(info, dict):
                outcome, info = self._kept(task_id, agent, str(outcome), info)
            if self._ranks is not None and self._ranks.is_rank(task_id) \
                    and isinstance(info, dict):
                self._ranks.ended_away(agent, task_id, str(outcome), result, info)
                continue
            waiting = self._waiting(task_id, agent.name)
            if waiting is not None and isinstance(info, dict):
                self._hold_inputs(task_id)
                self._graph.finish(self._running(waiting, agent), str(outcome), result, info)
                continue
            job = self._jobs.adopting.get(task_id)
            if job is not None and _on(job) == agent.name and isinstance(info, dict):
                task = self._running(self._task(job), agent)
                self._jobs.adopted(job, agent.name)
                self._graph.finish(task, str(outcome), result, info)
                continue
            if isinstance(info, dict):  # an actor's construction or call, perhaps
                self._actors.ended(agent, task_id, str(outcome), result, info)

    def _kept(self, task_id: int, agent: AgentRecord, outcome: str,
              info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """A result AGENT kept while the broker was away is recorded where it is, as a
        report's is (``objects.kept``); one over the limit fails its task, naming it.
        Returns the outcome and info to record."""
        entry = self.tasks.get(task_id)
        task = entry[0] if entry is not None else self._graph.get(task_id)
        refused = None if task is None or self._objects is None else \
            self._objects.kept(task, agent.name, outcome, info)
        return (outcome, info) if refused is None else (
            P.FAILED, {"type": "ZresError", "message": refused})

    def _waiting(self, task_id: int, agent: str) -> Task | None:
        """The Python task TASK_ID if it waits for AGENT's word (it may have ended or been
        cancelled meanwhile: then it waits no more)."""
        entry = self.tasks.get(task_id)
        if entry is None or entry[2] != agent:
            return None
        if entry[0].state is not TaskState.WAITING:
            del self.tasks[task_id]
            return None
        return entry[0]

    def _hold_inputs(self, task_id: int) -> None:
        """The task runs (or ran) again: it holds its inputs (a retry needs them)."""
        task, deps, _ = self.tasks.pop(task_id)
        for dep in deps:
            self._graph.tasks[dep].holders += 1
        task.deps = list(deps)

    def _again(self, task_id: int, lost: str | None) -> None:
        """Queue the task TASK_ID again: uncharged if it never began (LOST is None), else
        spending a retry, or failing it with AgentLostError if it has none left."""
        task, deps, _ = self.tasks.pop(task_id)
        if task.state is not TaskState.WAITING:
            return
        task.held = False
        if lost is not None and not task.retries:
            self._graph.fail(task, "AgentLostError", f"{lost}, and it had no retries left")
            return
        if lost is not None:
            task.retries -= 1
            log.info("task_retried", task=task.name, id=task_id, why=lost,
                     retries_left=task.retries)
        self._graph.link(task, deps)

    def _running(self, task: Task, agent: AgentRecord) -> Task:
        """TASK runs on AGENT (it began before this broker did)."""
        self._graph.set_state(task, TaskState.QUEUED)
        self._graph.set_state(task, TaskState.RUNNING)
        task.agent = agent.name
        task.held = task.begun = True
        task.started_at = time.monotonic()
        return task

    def expire(self, now: float) -> None:
        """The jobs and tasks whose agents are not back within the grace period are lost."""
        if now < self._deadline:
            return
        if self._actors.adopting:
            self._actors.expire(self.grace)
        if self._gangs is not None:
            self._gangs.expire(self.grace)
            self._ranks.expire(self.grace)
        for task_id, (_, _, agent) in list(self.tasks.items()):
            self._again(task_id, f"the broker restarted while agent {agent} held it, and "
                        f"that agent did not come back within {self.grace:g}s")
        if self._jobs.adopting:
            for job in list(self._jobs.adopting.values()):
                self._lost(job, f"the broker restarted while it ran, and agent {_on(job)} "
                           f"did not come back within {self.grace:g}s")

    def _lost(self, job: JobRecord, why: str) -> None:
        """JOB was not taken back: it is lost, and its client (if one waits) told so."""
        self._jobs.not_adopted(job, why)
        if job.client:
            self._graph.fail(self._task(job), "AgentLostError", why)


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
