"""What the broker tells people: why a task waits, and the cluster's status as plain data."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from ..core.resources import format_units
from ..core.tasks import Task, TaskState
from ..scheduler.policy import Scheduler
from ..scheduler.records import shape_of
from .actors import ActorRouting, ActorState
from .agents import AgentRegistry
from .dispatch import where
from .graph import TaskGraph

_LISTED = 200           # waiting tasks listed in a status reply
_LISTED_INFEASIBLE = 1000  # ... infeasible ones, which matter more, up to this many
_DEPENDENCIES = "waiting for dependencies"


class Explainer:
    """Answer ``why`` and ``status`` from the graph, the scheduler, agents and actors."""

    def __init__(self, graph: TaskGraph, sched: Scheduler, agents: AgentRegistry,
                 actors: ActorRouting) -> None:
        self._graph = graph
        self._sched = sched
        self._agents = agents
        self._actors = actors

    def why(self, task: Task | None, count_ahead: bool = True) -> str:
        """Say why TASK is not running yet, or where it runs.

        COUNT_AHEAD counts the tasks queued before it (O(waiting)): fine for one question,
        left out when describing many tasks at once.
        """
        if task is None:
            return "unknown task (finished and released, or lost in a broker restart)"
        if task.state is TaskState.WAITING:
            return self._graph.waiting_for(task)
        if task.state is TaskState.QUEUED and task.actor:
            actor = self._actors.actors.get(task.actor)
            state = actor.state.value if actor is not None else "dead"
            return f"queued for actor {task.actor[:8]} ({state}) behind the caller's earlier calls"
        if task.state is TaskState.QUEUED:
            return self._sched.why(task.id, count_ahead, self._label)
        if task.state is TaskState.RUNNING:
            grant = self._sched.running.get(task.id)
            if grant is not None and not grant.started:
                text = self._sched.why(task.id, name=self._label)
                # Handed to the worker process, it starts there the moment room frees.
                return text + "; its worker holds it" if task.held else text
            return f"running on {task.agent}"
        return task.state.value

    def brief(self, task: Task) -> str:
        """WHY without counting what is ahead: for lists of many tasks."""
        return self.why(task, count_ahead=False)

    def report(self, address: str, epoch: int, clients: int) -> dict[str, Any]:
        """Describe agents, task counts and every task that cannot run, as plain data."""
        agents = []
        for agent in sorted(self._agents.by_ident.values(), key=lambda a: a.name):
            slots = [self._sched.slots[s] for s in agent.slots]
            agents.append({"name": agent.name, "host": agent.host, "pid": agent.pid,
                           "draining": agent.draining, "away": agent.away,
                           "slots": [{"total": s.total, "free": s.free,
                                      "running": len(s.running), "gpus": g}
                                     for s, g in zip(slots, agent.gpus)]})
        counts: dict[str, int] = defaultdict(int)
        blocked: list[dict[str, Any]] = []
        # Waiting work other than the scheduler's queue (dependencies, actor calls, grants
        # queued on a slot), by what makes its reason; the queue counts its own by shape.
        # Each kind is explained once: explaining 100,000 waiting tasks would hold up the loop.
        kinds: dict[tuple[Any, ...], list[Any]] = {}
        scheduled = self._sched.waiting
        running: list[dict[str, Any]] = []
        now = time.monotonic()
        for task in self._graph.tasks.values():
            grant = self._sched.running.get(task.id)
            # A grant waiting in a slot's queue has not started: it counts as queued.
            pending = grant is not None and not grant.started
            counts["queued" if pending else task.state.value] += 1
            state = task.state
            if state is TaskState.QUEUED:
                reason = self._sched.infeasible_reason(task.units, where(task))
                if len(blocked) < _LISTED or (reason is not None
                                              and len(blocked) < _LISTED_INFEASIBLE):
                    blocked.append({"id": task.id, "name": task.name, "units": task.units,
                                    "reason": self.brief(task)})
                if task.id in scheduled:
                    continue
            if state is TaskState.RUNNING and not pending:
                if len(running) < _LISTED:
                    running.append({"id": task.id, "name": task.name, "agent": task.agent,
                                    "units": task.units,
                                    "seconds": round(now - task.started_at, 1)})
            elif state is not TaskState.DONE and state is not TaskState.FAILED:
                key = (shape_of(task.units), state, task.actor,
                       grant.slot if grant is not None else None)
                kind = kinds.get(key)
                if kind is None:
                    kinds[key] = [0, [], task]
                    kind = kinds[key]
                kind[0] += 1
                if kind[0] <= 3:  # a few of its tasks, to recognise it by
                    kind[1].append(task.name)
        return {"epoch": epoch, "address": address, "agents": agents, "clients": clients,
                "counts": dict(counts), "waiting": blocked, "actors": self._actor_status(),
                "groups": self._groups(kinds), "running": running}

    def _groups(self, kinds: dict[tuple[Any, ...], list[Any]]) -> list[dict[str, Any]]:
        """Waiting work grouped by request and reason, most tasks first: KINDS (counted
        from the graph) and the scheduler's queue, whose reserved tasks (a few: one per
        slot at most) are told apart, as their reason says so."""
        found: list[tuple[Any, int, list[str], str, Any]] = []
        for (shape, state, *_), (count, names, task) in kinds.items():
            found.append((shape, count, names, _DEPENDENCIES if state is TaskState.WAITING
                          else self.brief(task), task.units))
        reserved = [slot.reserved_by for slot in self._sched.slots.values()
                    if slot.reserved_by in self._sched.waiting]
        for task_id in reserved:
            task = self._sched.waiting[task_id]
            found.append((task.shape, 1, [self._name(task_id)],
                          self._sched.why(task_id, False, self._label),
                          task.units))
        for shape, count, ids in self._sched.queue.census():
            ids = sorted(i for i in ids if i not in reserved) or [
                i for i, t in self._sched.waiting.items()
                if t.shape == shape and i not in reserved][:3]
            count -= sum(1 for i in reserved if self._sched.waiting[i].shape == shape)
            if count > 0 and ids:
                found.append((shape, count, [self._name(i) for i in ids],
                              self._sched.why(ids[0], False, self._label),
                              self._sched.waiting[ids[0]].units))
        groups: dict[tuple[Any, str], dict[str, Any]] = {}
        for shape, count, names, reason, units in found:
            group = groups.get((shape, reason))
            if group is None:
                group = groups[shape, reason] = {
                    "request": format_units(units), "units": dict(units), "reason": reason,
                    "count": 0, "names": [], "infeasible": reason.startswith("infeasible")}
            group["count"] += count
            group["names"] = (group["names"] + names)[:3]
        return sorted(groups.values(), key=lambda g: (-g["count"], g["request"], g["reason"]))

    def _label(self, task_id: int) -> str:
        """Call waiting task TASK_ID by its name in a reason: "task load-3", "actor ..."."""
        task = self._graph.get(task_id)
        return f"task {task.name}" if task is not None else self._name(task_id)

    def _name(self, task_id: int) -> str:
        """The name of waiting task TASK_ID (an actor's construction has none of its own)."""
        task = self._graph.get(task_id)
        if task is not None:
            return task.name
        actor = self._actors.placements.get(task_id)
        return f"actor {actor.cls}({actor.name or actor.id[:8]})" if actor else str(task_id)

    def _actor_status(self) -> list[dict[str, Any]]:
        out = []
        for actor in sorted(self._actors.actors.values(), key=lambda a: a.ready_task):
            entry = {"id": actor.id, "name": actor.name, "cls": actor.cls,
                     "state": actor.state.value, "agent": actor.agent_name,
                     "units": actor.units, "restarts_left": actor.restarts,
                     "starts": actor.starts, "running": len(actor.inflight),
                     "queued": sum(len(q) for q in actor.queues.values())}
            if actor.placement in self._sched.waiting:
                entry["reason"] = self._sched.why(actor.placement, False, self._label)
            elif actor.state is ActorState.PENDING:
                entry["reason"] = self.why(self._graph.get(actor.ready_task), False)
            elif actor.state is ActorState.ADOPTING:
                entry["reason"] = (f"the broker restarted: it waits for agent "
                                   f"{actor.agent_name} to offer it back")
            out.append(entry)
        return out
