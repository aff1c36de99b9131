"""What the broker tells people: why a task waits, and the cluster's status as plain data."""

from __future__ import annotations

import itertools
import time
from typing import Any

from ..core.resources import format_bytes, format_units
from ..core.tasks import Task, TaskState, state_word
from ..scheduler.policy import Scheduler
from ..scheduler.records import shape_of
from .actor_records import ActorState
from .actors import ActorRouting
from .agents import AgentRegistry
from .graph import TaskGraph

_LISTED = 200           # waiting and running tasks listed in a status reply
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
        if task.group and task.id in self._sched.waiting:  # (a group reserved again)
            return self._sched.why(task.id, count_ahead, self._label)
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
            if task.stopping:
                return f"being stopped on {task.agent} (cancelled while it ran)"
            return f"running on {task.agent}"
        word, peak = state_word(task), task.info.get("peak_memory")
        if task.info.get("type") == "MemoryLimitError":
            return f"{word}: {task.info.get('message')}"
        return f"{word} on {task.agent}, peak memory {format_bytes(peak)}" \
            if type(peak) is int else word

    def brief(self, task: Task) -> str:
        """WHY without counting what is ahead: for lists of many tasks."""
        return self.why(task, count_ahead=False)

    def report(self, address: str, epoch: int, clients: int) -> dict[str, Any]:
        """Describe agents, task counts and the work that waits, as plain data.

        Nothing here walks every task: counts come from the graph's census, waiting work
        from its groups and the scheduler's queue (by request), and the lists name only
        the first tasks of each kind. A status at a million queued tasks costs what one
        at ten does, and holds up nobody's work on the loop."""
        agents = []
        pending = 0  # grants waiting in a slot's queue: granted, not started (queued)
        memory: dict[int, tuple[int, int]] = {}  # what runs in a process of its own
        for agent in sorted(self._agents.by_ident.values(), key=lambda a: a.name):
            slots = [self._sched.slots[s] for s in agent.slots]
            pending += sum(len(s.queue) for s in slots)
            memory.update(agent.tasks_memory)
            agents.append({"name": agent.name, "host": agent.host, "pid": agent.pid,
                           "draining": agent.draining, "away": agent.away,
                           "store": agent.store or {}, "data": agent.data_address,
                           "memory": {**(agent.memory or {}), "tasks": [
                               [i, c, p] for i, (c, p) in agent.tasks_memory.items()]},
                           "slots": [{"total": s.total, "free": s.free,
                                      "running": len(s.running), "gpus": g}
                                     for s, g in zip(slots, agent.gpus)]})
        census = self._graph.census
        counts = {word: count for word, count in census.counts.items() if count}
        owners = dict(census.owners)
        if pending:
            counts["queued"] = counts.get("queued", 0) + pending
            counts["running"] = counts.get("running", 0) - pending
            if not counts["running"]:
                del counts["running"]
            for slot in self._sched.slots.values():  # (a few per slot: see prefetch)
                for task_id in slot.queue:
                    task = self._graph.get(task_id)
                    if task is not None:
                        key = (task.owner, task.client_gone)
                        owners[key] = owners.get(key, 0) - 1
        reasons: dict[Any, str] = {}  # one explanation per request and reservation
        return {"epoch": epoch, "address": address, "agents": agents, "clients": clients,
                "counts": counts, "owners": self._sched.owners.describe(
                    time.monotonic(), census.waiting_by_owner),
                "waiting": self._first_waiting(reasons),
                "actors": self._actor_status(memory), "groups": self._groups(reasons),
                "running": self._first_running(memory),
                "running_by_owner": [{"owner": owner, "client_gone": gone, "count": count}
                                     for (owner, gone), count in sorted(owners.items())
                                     if count > 0]}

    def _first_waiting(self, reasons: dict[Any, str]) -> list[dict[str, Any]]:
        """The first tasks of the scheduler's queue, each with why it waits."""
        out = []
        for task_id in itertools.islice(self._sched.waiting, _LISTED):
            task = self._graph.get(task_id)
            if task is not None:
                out.append({"id": task.id, "name": task.name, "units": task.units,
                            "reason": self._reason(task_id, reasons)})
        return out

    def _reason(self, task_id: int, reasons: dict[Any, str]) -> str:
        """Why queued task TASK_ID waits, explained once per owner and request (its lane:
        an owner may wait for its quota), kind (what it runs: how long it is expected to
        take) and reservation."""
        waiting = self._sched.waiting[task_id]
        key = (waiting.lane, waiting.kind, waiting.reserved_slot,
               waiting.id if waiting.reserved_slot is not None else None)
        if key not in reasons:
            reasons[key] = self._sched.why(task_id, False, self._label)
        return reasons[key]

    def _first_running(self, memory: dict[int, tuple[int, int]]) -> list[dict[str, Any]]:
        """The first tasks that run (their grants started), in the order they were granted,
        with their MEMORY now and at most, for those in a process of their own."""
        out: list[dict[str, Any]] = []
        now = time.monotonic()
        for task_id in self._graph.census.running:
            grant = self._sched.running.get(task_id)
            if grant is not None and not grant.started:
                continue  # queued in a slot: counted as queued
            task = self._graph.tasks[task_id]
            out.append({"id": task.id, "name": task.name, "agent": task.agent,
                        "units": task.units, "seconds": round(now - task.started_at, 1),
                        "owner": task.owner, "client_gone": task.client_gone,
                        "detached": task.detached, "stopping": task.stopping,
                        **_memory(memory.get(task.id))})
            if len(out) >= _LISTED:
                break
        return out

    def _groups(self, reasons: dict[Any, str]) -> list[dict[str, Any]]:
        """Waiting work grouped by request and reason, most tasks first: the census's
        groups (for dependencies, behind an actor's calls), grants queued in slots, and
        the scheduler's queue, whose reserved tasks (a few: one per slot at most) are told
        apart, as their reason says so."""
        found: list[tuple[Any, int, list[str], str, Any]] = []
        for (state, shape, actor), members in self._graph.census.waiting_groups():
            names = [self._graph.tasks[i].name for i in members.samples]
            if state is TaskState.WAITING:
                reason = _DEPENDENCIES
            else:
                record = self._actors.actors.get(actor)
                reason = (f"queued for actor {actor[:8]} "
                          f"({record.state.value if record is not None else 'dead'}) "
                          "behind the caller's earlier calls")
            found.append((shape, members.count, names, reason, dict(shape)))
        for slot in self._sched.slots.values():
            by_shape: dict[Any, list[int]] = {}
            for task_id in slot.queue:
                by_shape.setdefault(shape_of(self._sched.running[task_id].units),
                                    []).append(task_id)
            for shape, ids in by_shape.items():
                first = self._graph.get(ids[0])
                if first is not None:
                    found.append((shape, len(ids), [self._name(i) for i in ids[:3]],
                                  self.brief(first), dict(shape)))
        reserved = [slot.reserved_by for slot in self._sched.slots.values()
                    if slot.reserved_by in self._sched.waiting]
        for task_id in reserved:
            task = self._sched.waiting[task_id]
            found.append((task.shape, 1, [self._name(task_id)], self._reason(task_id, reasons),
                          task.units))
        for lane, count, ids in self._sched.queue.census():
            shape = lane[1]
            ids = sorted(i for i in ids if i not in reserved)
            count -= sum(1 for i in reserved if self._sched.waiting[i].lane == lane)
            if count > 0 and ids:
                found.append((shape, count, [self._name(i) for i in ids],
                              self._reason(ids[0], reasons), self._sched.waiting[ids[0]].units))
        groups: dict[tuple[Any, str], dict[str, Any]] = {}
        for shape, count, names, reason, units in found:
            group = groups.get((shape, reason))
            if group is None:
                group = groups[shape, reason] = {
                    "request": format_units(units), "units": dict(units), "reason": reason,
                    "count": 0, "names": [], "infeasible": reason.startswith("infeasible"),
                    "state": "waiting" if reason == _DEPENDENCIES else "queued"}
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

    def _actor_status(self, memory: dict[int, tuple[int, int]]) -> list[dict[str, Any]]:
        out = []
        for actor in sorted(self._actors.actors.values(), key=lambda a: a.ready_task):
            entry = {"id": actor.id, "name": actor.name, "cls": actor.cls,
                     "state": actor.state.value, "agent": actor.agent_name,
                     "units": actor.units, "restarts_left": actor.restarts,
                     "starts": actor.starts, "running": len(actor.inflight),
                     "queued": sum(len(q) for q in actor.queues.values()),
                     **_memory(memory.get(actor.placement))}
            if actor.placement in self._sched.waiting:
                entry["reason"] = self._sched.why(actor.placement, False, self._label)
            elif actor.state is ActorState.PENDING:
                entry["reason"] = self.why(self._graph.get(actor.ready_task), False)
            elif actor.state is ActorState.ADOPTING:
                entry["reason"] = (f"the broker restarted: it waits for agent "
                                   f"{actor.agent_name} to offer it back")
            out.append(entry)
        return out


def _memory(figures: tuple[int, int] | None) -> dict[str, Any]:
    """A running thing's memory for a report: bytes now and at most, and as people read
    them (none for a task sharing a pooled worker process: its own use is not known)."""
    if figures is None:
        return {}
    current, peak = figures
    return {"memory": current, "peak_memory": peak,
            "memory_shown": f"{format_bytes(current)} (peak {format_bytes(peak)})"}
