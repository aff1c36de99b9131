"""Getting tasks to agents and their outcomes back.

A ready task is queued in the scheduler; its grant goes to the agent owning the slot in
one ASSIGN batch per agent per loop turn. The agent's reports say, in order, which grants
it handed to a worker process (``held``: possibly started), which began, which ended (the
resources come back) and which it gives back unstarted.

A *direct* grant (one that fits its slot now) is counted held from its assignment: that is
written to the state store before the grant leaves (``send_assigns``, after the turn's
commit), and its agent hands it to a worker at once, waiting for no acknowledgement. A
*queued* grant (pipelining) is held only once its agent reports it so (and hands it over
once the broker has acknowledged that report).

When an agent is lost, the broker knows what may have run there: a held grant (a direct
one included: as Ray counts a task leased to a dead node) may have started, so it spends a
retry or, with none left, fails with AgentLostError saying so; a queued grant its agent
never reported held never started, and goes again with no retry spent. A direct grant its
agent turns out never to have had (a resumed session that does not hold it, a restarted
broker's agent that carries its old session's work without it) goes again, uncharged.
``retries=0`` therefore means the body runs at most once, whatever fails.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import Any

from ..core import protocol as P
from ..core.tasks import Task, TaskState
from ..logs import get_logger
from ..scheduler.policy import Scheduler
from ..scheduler.records import Grant
from .actor_records import ActorState
from .actors import ActorRouting
from .agent_reports import AgentReports
from .agents import AgentRecord, AgentRegistry
from .cancels import CancelAnswers
from .feasibility import Feasibility, where
from .gangs.ranks import RankTable
from .gangs.records import GroupState
from .gangs.routing import GangRouting
from .graph import TaskGraph
from .jobs import JobTable
from .lineage import Lineage
from .objects import ObjectDirectory
from .outbox import Batches, Send
from .recalls import Recalls

log = get_logger("zres.broker")


class CancelOutcome(enum.Enum):
    CANCELLED = "cancelled"    # it never runs (or, forced, it is being stopped)
    GOES_ON = "goes on"        # it may have begun: it runs to its end
    ASKED = "asked"            # its agent says whether its worker process had begun it


class Dispatcher(AgentReports, GangRouting, Feasibility):
    """Move tasks from ready to queued, granted, running and finished, across agents."""

    def __init__(self, send: Send, graph: TaskGraph, sched: Scheduler, agents: AgentRegistry,
                 actors: ActorRouting, jobs: JobTable, cancels: CancelAnswers,
                 on_started: Callable[[Task], None],
                 on_changed: Callable[[Task], None] = lambda task: None,
                 load: Callable[[Task], list[Any]] = lambda task: [],
                 token: Callable[[str], str] = lambda subject: "",
                 objects: ObjectDirectory | None = None, groups: Any = None,
                 on_lost: Callable[[str, str], None] | None = None,
                 tell_first: Callable[[Task, str, list[Any], dict[str, Any]], None]
                 = lambda *ended: None) -> None:
        self._send = send
        # Tells the broker's relay an agent was lost (its name, why): it answers its
        # requesters so at once rather than after its timeout.
        self._on_lost = on_lost
        # Results kept on agents, and what becomes of those lost with them (issue 29).
        self._objects = objects or ObjectDirectory(send, agents, b"", graph.get)
        self.lineage = Lineage(graph, sched, lambda task: self._enqueue(task), on_changed)
        # TOKEN(subject): the token a grant carries, so that a client made inside the task
        # acts for its owner ("": none, without keys). See ``auth``.
        self._token = token
        self._on_started = on_started  # tells its client the task began
        self._tell_first = tell_first  # ... and a direct result at once (early_results)
        self._on_changed = on_changed  # writes a kept task again (held, or requeued)
        self._load = load  # reads a restored task's call from the state store
        self._cancels = cancels
        self._graph = graph
        self._sched = sched
        self._agents = agents
        self._actors = actors
        self._jobs = jobs
        # A scheduling pass's grants of tasks, sent once the turn's commit holds them
        # (send_assigns); those that start only once the broker has heard them held (an
        # actor's construction, a multi-node job's rank) go as they are made: before the
        # commit that keeps where they went (a broker killed in its fsync would have kept
        # an actor's place, never sent).
        self._assigns = Batches(send, P.ASSIGN, "tasks")
        gated = self._gated = Batches(send, P.ASSIGN, "tasks")
        # Gangs (issue 31): placement groups, and multi-node jobs' ranks (``gangs``).
        self._groups = groups
        self._ranks = self.ranks = RankTable(
            send, graph, sched, agents, jobs, graph.new_id, gated.add,
            lambda: gated.flush(self._ack), token, on_started)
        self._warned: set[int] = set()  # tasks told they were infeasible (some may be gone)
        self.recalls = Recalls(send, sched, agents)  # queued behind work that turned long

    # -- queueing ---------------------------------------------------------------------
    def make_ready(self, task: Task) -> None:
        """TASK has every input: queue it for resources (or for its actor)."""
        if task.actor:
            self._actors.call_ready(task)
            return
        if task.group or self._ranks.is_gang(task):
            self._queue_gang(task)
            return
        # (work placed in a bundle fits it: its group says whether the group can be placed)
        reason = None if task.bundle else self._sched.infeasible_reason(task.units,
                                                                         where(task))
        if reason is not None and task.strict:
            self._graph.fail(task, "InfeasibleError",
                             f"task {task.name} (id {task.id}) is infeasible: {reason}")
            return
        self._graph.set_state(task, TaskState.QUEUED)
        self._enqueue(task)
        if reason is not None:
            self.warn_infeasible(task, reason)

    def _enqueue(self, task: Task) -> None:
        # An actor's construction holds its slot for good, and a command job is a process
        # of its own, usually long: neither waits in a slot's queue.
        place: Any = where(task)
        if task.bundle is not None:  # (it runs in a placement group's bundle)
            place = self._groups.inside(task.bundle)
            if place is None:
                self._graph.fail(task, "ZresError", f"task {task.name} (id {task.id}) cannot "
                                 f"run: {self._groups.ended_cause(task.bundle[0])}")
                return
        self._sched.enqueue(task.id, task.units, task.priority, time.monotonic(),
                            queueable=not (task.creates or task.bundle)
                            and task.id not in self._jobs.active,
                            kind=task.kind, where=place, owner=task.owner,
                            near=self._objects.near(task))

    def cancel(self, task: Task, force: bool = False) -> CancelOutcome:
        """Cancel TASK if it cannot have begun: it fails as cancelled now. One that has
        begun goes on, unless FORCE: then it is stopped where it runs, and fails as
        cancelled once its agent says it is gone. One held by a worker process that
        starts it on its own (a pipelined grant) is dropped there unless it has begun:
        its agent's word settles it (ASKED)."""
        actor = self._actors.actors.get(task.creates) if task.creates else None
        if task.held and task.state is TaskState.WAITING:
            return CancelOutcome.GOES_ON  # restored: its agent has not said if it runs
        if task.id in self._ranks.gangs:  # (a multi-node job: its ranks are stopped)
            return CancelOutcome.CANCELLED if self._ranks.cancel(task, force) \
                else CancelOutcome.GOES_ON
        if actor is not None:
            if actor.state is not ActorState.PENDING and not force:
                return CancelOutcome.GOES_ON  # its __init__ may be running
        elif task.actor:
            if task.state is TaskState.RUNNING:
                return CancelOutcome.GOES_ON  # sent to its actor (a call is not stopped alone)
        elif task.state is TaskState.RUNNING and (task.held or task.begun):
            owner = self._owner(task.id)
            if owner is None:
                return CancelOutcome.GOES_ON
            if force:
                task.stopping = True
                self._send(owner.ident, P.CANCEL, {"ids": [task.id], "force": True})
                return CancelOutcome.CANCELLED
            if task.begun or task.id in self._jobs.active:
                return CancelOutcome.GOES_ON  # a held job is starting: jobs never queue
            if not task.cancelling:
                task.cancelling = True
                self._send(owner.ident, P.CANCEL, {"ids": [task.id]})
            return CancelOutcome.ASKED
        self.drop(task)
        return CancelOutcome.CANCELLED

    def drop(self, task: Task) -> None:
        """Fail TASK as cancelled now, wherever it is: a grant not handed over is taken
        back and a command job stopped; a Python call already started runs to its end
        unobserved (its resources come back then, its result is dropped)."""
        actor = self._actors.actors.get(task.creates) if task.creates else None
        if actor is not None:
            self._actors.kill(actor, "its construction was cancelled")
            return
        if task.id in self._ranks.gangs:  # (it ends cancelled once every rank is gone)
            self._ranks.cancel(task, force=True)
            return
        if task.group:  # (a placement group's: the group goes with it)
            self._graph.fail(task, "CancelledError", f"{task.name} (id {task.id}) was cancelled")
            group = self._groups.groups.get(task.group)
            if group is not None:
                self._groups.end(group, GroupState.REMOVED, "its construction was cancelled")
            return
        if task.actor:
            pass  # a call: failing it is enough (one sent finishes unobserved)
        elif task.state is TaskState.QUEUED:
            self._sched.dequeue(task.id)
        elif task.state is TaskState.RUNNING:
            owner = self._owner(task.id)
            if owner is not None:
                self._send(owner.ident, P.CANCEL, {"ids": [task.id]})
        self._graph.fail(task, "CancelledError",
                         f"task {task.name} (id {task.id}) was cancelled")

    # -- granting -----------------------------------------------------------------------
    def assign(self, grants: list[Grant]) -> None:
        """Make the scheduler's GRANTS, one batch per agent, sent by send_assigns; a direct
        grant of a Python task is counted held from now (see the module's docstring)."""
        for grant in grants:
            if grant.bundle is not None:  # (a gang's bundle: reserved, or a job's rank)
                self._gang_placed(grant)
                continue
            agent = self._agents.slot_owner[grant.slot]
            slot_index = agent.slots.index(grant.slot)
            opts: dict[str, Any] = {"priority": grant.priority, "seq": grant.seq}
            if not grant.started or grant.taken != grant.units:
                # The agent starts a queued grant when TAKEN fits its own free amounts.
                opts.update(queued=not grant.started, taken=grant.taken)
            actor = self._actors.placements.get(grant.task)
            if actor is not None:
                self._actors.place(actor, agent.ident, agent.name)
                opts.update(actor=actor.id, concurrency=actor.concurrency, taken=grant.taken)
                if actor.spawn_refs:
                    opts["refs"] = actor.spawn_refs
                if actor.spawn_call_in >= 0:
                    opts["payload"] = actor.spawn_call_in
                token = self._token(f"a{actor.id}:{actor.key}")
                if token:
                    opts["token"] = token
                self._gated.add(agent.ident, [
                    grant.task, slot_index, grant.units, grant.gpus, actor.spawn_counts[0],
                    actor.spawn_counts[1], opts], actor.spawn)
                continue
            task = self._graph.tasks[grant.task]
            self._graph.set_state(task, TaskState.RUNNING)
            task.agent = agent.name
            task.started_at = time.monotonic()
            task.attempt += 1
            job = self._jobs.active.get(task.id)
            # (a job's start still waits for the broker to hear it held: jobs are long)
            task.held = task.unheard = grant.started and job is None
            task.begun = False
            if task.held:
                self._on_changed(task)  # (kept before it leaves: its agent asks nothing)
            opts["attempt"] = task.attempt
            token = self._token(f"t{task.id}:{task.owner}")
            if job is not None:
                # (a job's programs find it in their environment: `zres submit` in a job
                # submits as the job's owner)
                opts["job"] = job.for_agent(token)
            elif token:
                opts["token"] = token
            if not task.payload and not job:  # restored: its call stayed on disk till now
                task.payload = self._load(task)
            counts, inputs, refs = self._graph.inputs(task)
            if refs:  # (inputs kept on agents: its worker reads or fetches them)
                opts["refs"] = refs
            if task.call_in >= 0:  # (its call was put on an agent: that input is it)
                opts["payload"] = task.call_in
            self._assigns.add(agent.ident, [task.id, slot_index, grant.units, grant.gpus,
                                            len(task.payload), counts, opts],
                              [*task.payload, *inputs])
        self._gated.flush(self._ack)

    def send_assigns(self) -> None:
        """Send the grants made since the last call: only once the state store holds what
        they say (a direct grant may start the moment it arrives)."""
        self._assigns.flush(self._ack)

    def heard(self, agent: AgentRecord, held: Any) -> list[Any]:
        """AGENT reports it holds HELD: of its direct grants, counted held from their
        assignment, that is all it says (nothing to write, no hand-off waits for an
        acknowledgement); return the rest, news to take in."""
        news = []
        for task_id in held if isinstance(held, list) else ():
            task = self._graph.get(task_id) if type(task_id) is int else None
            if task is not None and task.unheard and not task.cancelling and (
                    task.state is not TaskState.RUNNING or self._owner(task_id) is agent):
                task.unheard = False  # (ended already: its result came straight, direct)
            else:
                news.append(task_id)
        return news

    def _ack(self, ident: bytes) -> dict[str, Any]:
        agent = self._agents.get(ident)
        if agent is None:
            return {}
        agent.acked = agent.kept
        return {"ack": agent.kept}

    def release(self, task_id: int) -> None:
        """Give TASK_ID's grant back to the scheduler (its owner is charged till now)."""
        self._sched.release(task_id, time.monotonic())

    def sent_to(self, agent: AgentRecord) -> set[int]:
        """Every grant, actor placement and call AGENT has been sent and not finished."""
        granted = {t for s in agent.slots for t in self._sched.granted_on(s)}
        return granted | self._actors.held_on(agent.ident)

    def reconcile(self, agent: AgentRecord, holding: set[int], sent: set[int]) -> None:
        """AGENT resumed its session and holds HOLDING. Of what it had been SENT before
        the resumption, what it does not hold never reached it (lost with a connection):
        it goes again, uncharged. What it holds that is not its any more is cancelled
        there. (What was sent after the resumption's welcome cannot have been lost.)"""
        granted = self.sent_to(agent)
        for task_id in sent & granted:
            task = self._mine(agent, task_id)
            if task is None or task_id in holding:
                continue
            if (task.held and not task.unheard) or task.begun:
                self._lost(task, f"agent {agent.name} no longer has it after reconnecting")
            else:
                self.release(task_id)
                self._requeue(task)
        self._actors.resend_unheld(agent.ident, holding, sent)
        self._ranks.resend(agent, holding, sent)
        strays = sorted(t for t in holding if t not in granted or self._to_drop(t))
        if strays:
            self._send(agent.ident, P.CANCEL, {"ids": strays})

    def _to_drop(self, task_id: int) -> bool:
        """Whether the grant TASK_ID, still counted on its agent, must be cancelled there:
        its task was dropped (cancelled) meanwhile, or a cancel was asked (perhaps lost
        with a connection). Actors' placements and calls are never grants to drop."""
        if task_id in self._actors.placements or task_id in self._actors.call_actor:
            return False
        if self._ranks.is_rank(task_id):
            return self._ranks.dropping(task_id)
        task = self._graph.get(task_id)
        return task is None or task.state is not TaskState.RUNNING or task.cancelling

    def _too_late_to_cancel(self, task: Task) -> None:
        """TASK began, or may have: a cancel asked of its agent is answered no."""
        if task.cancelling:
            task.cancelling = False
            self._cancels.settle(task, cancelled=False)

    def _retry(self, task: Task, why: str) -> None:
        self._too_late_to_cancel(task)  # it may have begun where it was
        task.retries -= 1
        log.info("task_retried", task=task.name, id=task.id, why=why, retries_left=task.retries)
        self._requeue(task)

    def _requeue(self, task: Task) -> None:
        if task.stopping:  # cancelled while it ran, and now gone: it never runs again
            self._stopped(task)
            return
        if task.cancelling:  # its client asked to cancel it, and it had not begun
            self._graph.fail(task, "CancelledError",
                         f"task {task.name} (id {task.id}) was cancelled")
            return
        task.held = task.begun = task.unheard = False
        self._jobs.requeued(task)
        if self.lineage.waits_again(task):  # (an input lost since it was granted)
            self._on_changed(task)
            return
        self._graph.set_state(task, TaskState.QUEUED)
        self._on_changed(task)
        self._enqueue(task)

    def _stopped(self, task: Task) -> None:
        self._graph.fail(task, "CancelledError",
                         f"task {task.name} (id {task.id}) was cancelled while it ran")

    def _lost(self, task: Task, why: str) -> None:
        """TASK may have run where it was: spend a retry, or fail it saying so."""
        self._too_late_to_cancel(task)  # it may have begun there
        if task.stopping:
            self._stopped(task)
            return
        if task.retries:
            self._retry(task, why)
            return
        how = ("while running task" if task.begun else "just after it was granted, to start "
               "at once (so it may have started), task" if task.unheard else
               "after it had handed over (so it may have started) task")
        self._graph.fail(task, "AgentLostError",
                         f"{why} {how} {task.name} (id {task.id}), and it had no retries left")

    # -- agents coming and going ----------------------------------------------------------
    def lose_agent(self, agent: AgentRecord, why: str, recheck: bool = True,
                   left: bool = False, told: bool = False) -> None:
        """AGENT is gone (LEFT: it said goodbye; TOLD: after every report it sent, the
        broker has them all): what never started there goes again, uncharged; what may
        have started spends a retry or fails; its actors restart or die."""
        self._agents.remove(agent, why)
        if self._on_lost is not None:
            self._on_lost(agent.name, why)
        self._assigns.drop(agent.ident)  # (made for its session: never for a later one)
        self.lineage.lost(self._objects.lost(agent.name), f"agent {agent.name} ({why})")
        if left:
            log.info("agent_left", agent=agent.name)
        else:
            log.warning("agent_lost", agent=agent.name, why=why)
        self._send(agent.ident, P.UNKNOWN, {"ended": f"declared lost: {why}",
                                            "session": agent.session})
        lost = [t for slot_id in agent.slots for t in self._sched.remove_slot(slot_id)]
        self._bundles_lost(lost, f"agent {agent.name} {'left' if left else 'was lost'} "
                           f"({why})", left)
        for task_id in lost:
            actor = self._actors.placements.get(task_id)
            if actor is not None:
                self._actors.lost(actor, f"its agent {agent.name} was lost ({why})", None)
                continue
            task = self._graph.get(task_id)
            if task is None or task.state is not TaskState.RUNNING:
                continue
            if task.begun or task.held and not (told and task.unheard):
                # (its reports, all read, say held all it handed over: a direct grant they
                # never said held never reached a worker there)
                self._lost(task, f"agent {agent.name} was lost ({why})")
            else:
                self._requeue(task)  # it never started there
        if recheck:
            self.recheck_feasibility()

    def objects_offered(self, agent: AgentRecord, objects: Any) -> None:
        """AGENT's new session holds OBJECTS ([id, size]): any result it was known to hold
        and no longer does is lost there."""
        self.lineage.lost(self._objects.offered(agent.name, objects),
                          f"agent {agent.name} (it came back without it)")
        self.lineage.holders_back()  # (what waited for what it holds)

    def set_accepting(self, agent: AgentRecord) -> None:
        """Open AGENT's slots to new grants, or close them, as it is there and staying."""
        for slot_id in agent.slots:
            self._sched.set_open(slot_id, self._agents.accepts_work(agent))

    def capacity_changed(self) -> None:
        """An agent's capacity changed."""
        self.recheck_feasibility()

