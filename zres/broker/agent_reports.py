"""What agents report, taken in by the ``Dispatcher`` (mixed in): which grants each handed
to a worker process, which began, which ended and how (the result, or where it is kept),
which copies of results it now holds, which actors exited, and which grants it gives back
unstarted."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core import protocol as P
from ..core.resources import token_devices
from ..core.tasks import Task, TaskState
from .actor_records import ActorState
from .agents import AgentRecord, AgentRegistry

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..scheduler.policy import Scheduler
    from .actors import ActorRouting
    from .gangs.ranks import RankTable
    from .graph import TaskGraph
    from .jobs import JobTable
    from .lineage import Lineage
    from .objects import ObjectDirectory
    from .outbox import Send


class AgentReports:
    """Mixed into the ``Dispatcher``, whose records it changes."""

    if TYPE_CHECKING:  # (the dispatcher's own, used here)
        _send: Send
        _agents: AgentRegistry
        _graph: TaskGraph
        _sched: Scheduler
        _actors: ActorRouting
        _jobs: JobTable
        _objects: ObjectDirectory
        _ranks: RankTable
        _on_started: Callable[[Task], None]
        _tell_first: Callable[[Task, str, list[Any], dict[str, Any]], None]
        _on_changed: Callable[[Task], None]
        lineage: Lineage

        def release(self, task_id: int) -> None: ...
        def _to_drop(self, task_id: int) -> bool: ...
        def _too_late_to_cancel(self, task: Task) -> None: ...
        def _requeue(self, task: Task) -> None: ...
        def _retry(self, task: Task, why: str) -> None: ...
        def _stopped(self, task: Task) -> None: ...

    def _owner(self, task_id: int) -> AgentRecord | None:
        grant = self._sched.running.get(task_id)
        return self._agents.slot_owner.get(grant.slot) if grant is not None else None

    def _mine(self, agent: AgentRecord, task_id: Any) -> Task | None:
        """The task of TASK_ID if its current grant is on AGENT (else a stale report)."""
        if self._owner(task_id) is not agent:
            return None
        task = self._graph.get(task_id)
        return task if task is not None and task.state is TaskState.RUNNING else None

    def report(self, agent: AgentRecord, body: dict[str, Any], payloads: list[list[Any]],
               now: float) -> None:
        """Take in one report of AGENT's, all at once, in its fields' order."""
        # (what it says of multi-node jobs' ranks is theirs: ``gangs.ranks``)
        body, payloads = self._ranks.report(agent, body, payloads)
        for task_id in _ids(body.get("held")):
            if self._owner(task_id) is agent and self._to_drop(task_id):
                # Cancelled while this report was away (the cancel perhaps lost with a
                # connection): told again, before the ack that would let it start.
                self._send(agent.ident, P.CANCEL, {"ids": [task_id]})
            task = self._mine(agent, task_id) or self._actors.call_on(agent.ident, task_id)
            if task is not None:
                task.held = True
                if task.id in self._jobs.active:
                    self._jobs.held(task, agent.name)
                self._on_changed(task)
        for task_id in _ids(body.get("started")):
            task = self._mine(agent, task_id)
            if task is None:
                call = self._actors.call_on(agent.ident, task_id)
                if call is not None:
                    self._on_started(call)
                continue
            self._on_started(task)
            task.held = task.begun = True
            self._too_late_to_cancel(task)
            task.started_at = now
            grant = self._sched.running[task_id]
            if not grant.started:
                self._sched.started(task_id, now)
            if task.id in self._jobs.active:
                slot_index = agent.slots.index(grant.slot)
                self._jobs.started(task, agent.name,
                                   [agent.gpus[slot_index][p] for p in grant.gpus]
                                   or list(token_devices(grant.units)))
        self._results(agent, body.get("results", []), payloads, now)
        for item in body.get("stored") or ():  # (copies it fetched, or uploads it took)
            if isinstance(item, list) and len(item) == 2 and type(item[0]) is int:
                self._objects.copied(item[0], agent.name)
        for exit_ in body.get("exits", []):
            if isinstance(exit_, dict):
                self._actors.exited(agent.ident, str(exit_.get("actor")),
                                    exit_.get("placement", -1), str(exit_.get("cause")),
                                    _ids(exit_.get("running")), str(exit_.get("error", "")),
                                    exit_.get("exceeded") is True)
        for task_id in _ids(body.get("returned")):
            task = self._mine(agent, task_id)
            if task is not None:  # it never started there: again, uncharged
                self.release(task_id)
                self._requeue(task)
            elif self._owner(task_id) is agent and task_id not in self._actors.placements:
                # Its task ended meanwhile (cancelled as it was given back: the agent's
                # CANCEL found nothing, so this is its only answer): its grant goes.
                self.release(task_id)

    def direct_results(self, agent: AgentRecord, items: list[list[Any]],
                       payloads: list[list[Any]], started: Any, now: float) -> None:
        """Results a worker process of AGENT sent straight here (each [id, outcome, nframes,
        info, attempt]; STARTED: the starts of those among them that began in the same
        batch): each taken as AGENT's report of it would be, if it is of the grant that
        runs now (on AGENT, that attempt; a plain task's, never an actor's) and ends the
        task (ok, raised), else dropped. The agent's report of the same comes later, and
        finds it ended. (A failure may grant the task again, to AGENT too, whose report
        of the earlier grant, naming no attempt, would then be taken for the new one's:
        only AGENT's own report, in order, lets go of its grant.)"""
        kept: list[list[Any]] = []
        frames: list[list[Any]] = []
        ids: set[int] = set()  # (a task named twice is taken once)
        for (task_id, outcome, nframes, info, attempt), payload in zip(items, payloads):
            task = self._mine(agent, task_id)
            if task is not None and task.attempt == attempt and isinstance(info, dict) \
                    and outcome in (P.OK, P.RAISED) and task_id not in self._actors.placements \
                    and task_id not in self._jobs.active and task_id not in ids:
                ids.add(task_id)
                kept.append([task_id, outcome, nframes, info])
                frames.append(payload)
        if kept:
            for item, payload in zip(kept, frames):  # (its client first: early_results)
                item[3]["agent"] = agent.name  # (as its end records: see _results)
                self._tell_first(self._graph.tasks[item[0]], item[1], payload, item[3])
            self.report(agent, {"started": [t for t in _ids(started) if t in ids and not
                                            self._graph.tasks[t].begun], "results": kept},
                        frames, now)

    def _results(self, agent: AgentRecord, items: list[Any], payloads: list[list[Any]],
                 now: float) -> None:
        for (task_id, outcome, _, info), frames in zip(items, payloads):
            info = info if isinstance(info, dict) else {}
            actor = self._actors.placements.get(task_id)
            if actor is not None:
                if actor.agent == agent.ident and actor.state is ActorState.STARTING:
                    self._actors.started(actor, str(outcome), frames, info)
                continue
            actor = self._actors.call_actor.get(task_id)
            if actor is not None:
                if actor.agent != agent.ident:
                    continue  # a late result from the actor's previous instance
                del self._actors.call_actor[task_id]
                actor.inflight.pop(task_id, None)
                task = self._graph.get(task_id)
                if task is not None and task.state is TaskState.RUNNING:
                    info = {**info, "agent": agent.name}
                    self._finish(task, agent, outcome, frames, info)
                continue
            if self._owner(task_id) is not agent:
                continue  # stale: cancelled, or retried elsewhere after a loss
            self.release(task_id)
            task = self._graph.get(task_id)
            if task is None or task.state is not TaskState.RUNNING:
                continue
            if task.stopping and outcome != P.OK:  # a forced cancel stopped it
                self._stopped(task)
                continue
            if task.begun and outcome != P.FAILED:
                self._sched.finished(task.kind, now - task.started_at)
            if outcome == P.FAILED and task.retries and (
                    info.get("type") == "WorkerLostError" or info.get("type")
                    == "MemoryLimitError" and task.retry_oom):  # (opted in: else it fails)
                self._retry(task, info.get("message", "worker lost"))
            elif outcome == P.FAILED and info.get("type") == "InputLostError":
                self.lineage.input_lost(task, info, self._requeue)  # (it ran nothing)
            elif outcome == P.FAILED and info.get("type") == "CancelledError" \
                    and not task.cancelling and task.id not in self._jobs.active:
                # Dropped unstarted on a cancel this broker never asked: an earlier life's,
                # killed before it answered (its asker's cancel() said False). It never
                # began: it runs, as that answer said, uncharged.
                self._requeue(task)
            else:
                info["agent"] = agent.name
                self._finish(task, agent, outcome, frames, info)

    def _finish(self, task: Task, agent: AgentRecord, outcome: Any, frames: list[Any],
                info: dict[str, Any]) -> None:
        """TASK ended on AGENT: its result travelled (FRAMES), or INFO says its worker
        stored it there (kept, unless over the limit: then the task fails naming it)."""
        refused = self._objects.kept(task, agent.name, str(outcome), info)
        if refused is not None:
            self._graph.fail(task, "ZresError", refused)
            return
        self._graph.finish(task, str(outcome), frames, info)



def _ids(value: Any) -> list[int]:
    return [v for v in value if type(v) is int] if isinstance(value, list) else []
