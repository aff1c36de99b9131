"""Getting tasks to agents and their outcomes back.

A ready task is queued in the scheduler; its grant goes to the agent owning the slot in
one ASSIGN batch per agent per loop turn; the agent's DONE gives the resources back and
records the outcome. Losses are handled here too: a lost worker or agent retries what was
running (a retry is spent only on work that had started) and re-queues what had not.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from ..core import protocol as P
from ..core.resources import token_devices
from ..core.tasks import FINISHED, Task, TaskState, set_state
from ..scheduler.policy import Scheduler
from ..scheduler.records import Grant
from .actors import ActorRouting, ActorState
from .agents import AgentRecord, AgentRegistry
from .graph import TaskGraph
from .jobs import JobTable
from .outbox import Batches, Send

log = structlog.get_logger("zres.broker")


class Dispatcher:
    """Move tasks from ready to queued, granted, running and finished, across agents."""

    def __init__(self, send: Send, graph: TaskGraph, sched: Scheduler, agents: AgentRegistry,
                 actors: ActorRouting, jobs: JobTable) -> None:
        self._send = send
        self._graph = graph
        self._sched = sched
        self._agents = agents
        self._actors = actors
        self._jobs = jobs
        self._assigns = Batches(send, P.ASSIGN, "tasks")

    # -- queueing ---------------------------------------------------------------------
    def make_ready(self, task: Task) -> None:
        """TASK has every input: queue it for resources (or for its actor)."""
        if task.actor:
            self._actors.call_ready(task)
            return
        reason = self._sched.infeasible_reason(task.units)
        if reason is not None and task.strict:
            self._graph.fail(task, "InfeasibleError",
                             f"task {task.name} is infeasible: {reason}")
            return
        set_state(task, TaskState.QUEUED)
        self._enqueue(task)
        if reason is not None:
            self.warn_infeasible(task, reason)

    def _enqueue(self, task: Task) -> None:
        # An actor's construction holds its slot for good, and a command job is a process
        # of its own, usually long: neither waits in a slot's queue.
        self._sched.enqueue(task.id, task.units, task.priority, time.monotonic(),
                            queueable=not task.creates and task.id not in self._jobs.active,
                            kind=task.kind)

    def warn_infeasible(self, task: Task, reason: str) -> None:
        """Tell TASK's client, once per reason, that no agent could ever run it."""
        if task.warned == reason:
            return
        task.warned = reason
        log.warning("task_infeasible", task=task.name, id=task.id, reason=reason)
        self._send(task.client, P.WARN, {"id": task.local_id, "reason": reason})

    def recheck_feasibility(self) -> None:
        """Judge every queued task again against the agents there now."""
        for task_id in list(self._sched.waiting):
            task = self._graph.get(task_id)
            if task is None:
                continue  # an actor's restart: it waits for a fitting agent to join
            reason = self._sched.infeasible_reason(task.units)
            if reason is None:
                task.warned = ""
            elif task.strict:
                self._sched.dequeue(task.id)
                self._graph.fail(task, "InfeasibleError",
                                 f"task {task.name} is infeasible: {reason}")
            else:
                self.warn_infeasible(task, reason)

    def cancel(self, task: Task) -> None:
        """Fail TASK as cancelled, and stop it wherever it is."""
        actor = self._actors.actors.get(task.creates) if task.creates else None
        if actor is not None:
            self._actors.kill(actor, "its construction was cancelled")
            return
        if task.actor:  # a call: failing it is enough (one running finishes unobserved)
            pass
        elif task.state is TaskState.QUEUED:
            self._sched.dequeue(task.id)
        elif task.state is TaskState.RUNNING:
            # The worker cannot stop a running Python call; its resources come back when
            # it returns, and the result is dropped then.
            grant = self._sched.running.get(task.id)
            owner = self._agents.slot_owner.get(grant.slot) if grant is not None else None
            if owner is not None:
                self._send(owner.ident, P.CANCEL, {"ids": [task.id]})
        self._graph.fail(task, "CancelledError", f"task {task.name} was cancelled")

    # -- granting -----------------------------------------------------------------------
    def assign(self, grants: list[Grant]) -> None:
        """Send the scheduler's GRANTS to their agents, one batch per agent."""
        for grant in grants:
            agent = self._agents.slot_owner[grant.slot]
            slot_index = agent.slots.index(grant.slot)
            actor = self._actors.placements.get(grant.task)
            if actor is not None:
                self._actors.place(actor, agent.ident, agent.name)
                self._assigns.add(agent.ident, [
                    grant.task, slot_index, grant.units, grant.gpus, actor.spawn_counts[0],
                    actor.spawn_counts[1], {"actor": actor.id, "concurrency": actor.concurrency,
                                            "taken": grant.taken}], actor.spawn)
                continue
            task = self._graph.tasks[grant.task]
            set_state(task, TaskState.RUNNING)
            task.agent = agent.name
            task.started_at = time.monotonic()
            if task.id in self._jobs.active and grant.started:
                self._jobs.started(task, agent.name,
                                   [agent.gpus[slot_index][p] for p in grant.gpus]
                                   or list(token_devices(grant.units)))
            counts, inputs = self._graph.inputs(task)
            item = [task.id, slot_index, grant.units, grant.gpus, len(task.payload), counts]
            if not grant.started or grant.taken != grant.units:
                # The agent starts a queued grant when TAKEN fits its own free amounts.
                item.append({"queued": not grant.started, "taken": grant.taken})
            self._assigns.add(agent.ident, item, [*task.payload, *inputs])
        self._assigns.flush()

    def release(self, task_id: int) -> None:
        """Give TASK_ID's grant back to the scheduler, noting the queued grants that start."""
        self._note_started(self._sched.release(task_id))

    def _note_started(self, task_ids: list[int]) -> None:
        """Note queued grants that the scheduler (and so the agent) has just started."""
        now = time.monotonic()
        for task_id in task_ids:
            task = self._graph.get(task_id)
            if task is not None:
                task.started_at = now
            if task_id in self._jobs.active:
                task = self._graph.tasks[task_id]
                grant = self._sched.running[task_id]
                self._jobs.started(task, task.agent, list(token_devices(grant.units)))

    def capacity_changed(self, started: list[int]) -> None:
        """An agent's capacity changed and the queued grants STARTED began."""
        self._note_started(started)
        self.recheck_feasibility()

    # -- outcomes -------------------------------------------------------------------------
    def done(self, agent: AgentRecord, items: list[Any], payloads: list[list[Any]],
             now: float) -> None:
        """AGENT reports outcomes: ITEMS [id, outcome, nframes, info] with their PAYLOADS."""
        for (task_id, outcome, _, info), frames in zip(items, payloads):
            info = info if isinstance(info, dict) else {}
            actor = self._actors.placements.get(task_id)
            if actor is not None:
                if actor.agent == agent.ident and actor.state is ActorState.STARTING:
                    self._actors.started(actor, str(outcome), frames, info)
                continue
            actor = self._actors.call_actor.pop(task_id, None)
            if actor is not None:
                actor.inflight.pop(task_id, None)
                task = self._graph.get(task_id)
                if task is not None and task.state is TaskState.RUNNING:
                    self._graph.finish(task, str(outcome), frames, {**info, "agent": agent.name})
                continue
            grant = self._sched.running.get(task_id)
            if grant is None or self._agents.slot_owner.get(grant.slot) is not agent:
                continue  # stale: cancelled, or retried elsewhere after a loss
            started = grant.started
            self.release(task_id)
            task = self._graph.get(task_id)
            if task is None or task.state is not TaskState.RUNNING:
                continue
            if started and outcome != P.FAILED:
                self._sched.finished(task.kind, now - task.started_at)
            if outcome == P.FAILED and info.get("type") == "WorkerLostError" and task.retries:
                self._retry(task, info.get("message", "worker lost"))
            else:
                info["agent"] = agent.name
                self._graph.finish(task, str(outcome), frames, info)

    def _retry(self, task: Task, why: str) -> None:
        task.retries -= 1
        log.info("task_retried", task=task.name, id=task.id, why=why, retries_left=task.retries)
        self._requeue(task)

    def _requeue(self, task: Task) -> None:
        set_state(task, TaskState.QUEUED)
        self._jobs.requeued(task)
        self._enqueue(task)

    def lose_agent(self, agent: AgentRecord, why: str, recheck: bool = True) -> None:
        """AGENT is gone: re-queue what had not started there, retry or fail what had."""
        self._agents.remove(agent)
        log.warning("agent_lost", agent=agent.name, why=why)
        for slot_id in agent.slots:
            for task_id in self._sched.queued(slot_id):  # never started: no retry spent
                task = self._graph.get(task_id)
                if task is not None and task.state is TaskState.RUNNING:
                    self._requeue(task)
            for task_id in self._sched.remove_slot(slot_id):
                actor = self._actors.placements.get(task_id)
                if actor is not None:
                    self._actors.lost(actor, f"its agent {agent.name} was lost ({why})", None)
                    continue
                task = self._graph.get(task_id)
                if task is None or task.state is not TaskState.RUNNING:
                    continue
                if task.retries:
                    self._retry(task, f"agent {agent.name} lost")
                else:
                    self._graph.fail(task, "AgentLostError",
                                     f"agent {agent.name} was lost ({why}) while running task "
                                     f"{task.name}, and it had no retries left")
        if recheck:
            self.recheck_feasibility()

    def drop_work_of(self, client: bytes, task_ids: list[int]) -> None:
        """The client CLIENT left: cancel its unfinished TASK_IDS, except named actors and
        detached jobs, which live on."""
        for task_id in task_ids:
            task = self._graph.get(task_id)
            if task is not None and task.state not in FINISHED \
                    and task.creates not in self._actors.actors \
                    and not self._jobs.detached(task):
                self.cancel(task)
