"""What the broker tells people: why a task waits, and the cluster's status as plain data."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from ..core.resources import format_units
from ..core.tasks import Task, TaskState
from ..scheduler.policy import Scheduler
from .actors import ActorRouting, ActorState
from .agents import AgentRegistry
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
            return self._sched.why(task.id, count_ahead)
        if task.state is TaskState.RUNNING:
            grant = self._sched.running.get(task.id)
            if grant is not None and not grant.started:
                text = self._sched.why(task.id)
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
        groups: dict[tuple[Any, ...], dict[str, Any]] = {}
        reasons: dict[tuple[Any, ...], str] = {}
        running: list[dict[str, Any]] = []
        now = time.monotonic()
        for task in self._graph.tasks.values():
            grant = self._sched.running.get(task.id)
            # A grant waiting in a slot's queue has not started: it counts as queued.
            pending = grant is not None and not grant.started
            counts["queued" if pending else task.state.value] += 1
            if task.state is TaskState.QUEUED:
                reason = self._sched.infeasible_reason(task.units)
                if len(blocked) < _LISTED or (reason is not None
                                              and len(blocked) < _LISTED_INFEASIBLE):
                    blocked.append({"id": task.id, "name": task.name, "units": task.units,
                                    "reason": self.brief(task)})
            if task.state in (TaskState.QUEUED, TaskState.WAITING) or pending:
                self._group(task, grant.slot if pending and grant else None, groups, reasons)
            elif task.state is TaskState.RUNNING:
                if len(running) < _LISTED:
                    running.append({"id": task.id, "name": task.name, "agent": task.agent,
                                    "units": task.units,
                                    "seconds": round(now - task.started_at, 1)})
        return {"epoch": epoch, "address": address, "agents": agents, "clients": clients,
                "counts": dict(counts), "waiting": blocked, "actors": self._actor_status(),
                "groups": sorted(groups.values(), key=lambda g: (-g["count"], g["request"],
                                                                 g["reason"])),
                "running": running}

    def _group(self, task: Task, slot: int | None, groups: dict[tuple[Any, ...], Any],
               reasons: dict[tuple[Any, ...], str]) -> None:
        """Count TASK in its group of waiting work: the same request, the same reason.

        Tasks of one request that wait alike (the same shape, reservation, actor or slot
        queue) share a reason, worked out once: explaining every one of 100,000 waiting
        tasks would hold up the loop.
        """
        shape = tuple(sorted(task.units.items()))
        if task.state is TaskState.WAITING:
            reason = _DEPENDENCIES
        else:
            waiting = self._sched.waiting.get(task.id)
            key = (shape, task.actor, slot, waiting.reserved_slot if waiting else None)
            reason = reasons.get(key) or reasons.setdefault(key, self.brief(task))
        group = groups.get((shape, reason))
        if group is None:
            group = groups[shape, reason] = {
                "request": format_units(task.units), "units": dict(task.units),
                "reason": reason, "count": 0, "infeasible": reason.startswith("infeasible"),
                "names": []}
        group["count"] += 1
        if len(group["names"]) < 3:  # a few of its tasks, to recognise it by
            group["names"].append(task.name)

    def _actor_status(self) -> list[dict[str, Any]]:
        out = []
        for actor in sorted(self._actors.actors.values(), key=lambda a: a.ready_task):
            entry = {"id": actor.id, "name": actor.name, "cls": actor.cls,
                     "state": actor.state.value, "agent": actor.agent_name,
                     "units": actor.units, "restarts_left": actor.restarts,
                     "starts": actor.starts, "running": len(actor.inflight),
                     "queued": sum(len(q) for q in actor.queues.values())}
            if actor.placement in self._sched.waiting:
                entry["reason"] = self._sched.why(actor.placement, count_ahead=False)
            elif actor.state is ActorState.PENDING:
                entry["reason"] = self.why(self._graph.get(actor.ready_task), False)
            elif actor.state is ActorState.ADOPTING:
                entry["reason"] = (f"the broker restarted: it waits for agent "
                                   f"{actor.agent_name} to offer it back")
            out.append(entry)
        return out
