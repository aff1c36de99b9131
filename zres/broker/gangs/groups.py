"""Placement groups: bundles of resources on several agents, reserved together for their
owner's tasks and actors.

A group is made by a submit whose task carries ``{group: spec}`` (its *construction*, as
an actor's): that task waits in the scheduler as the group's gang (its id is the gang's),
and ends, with no result, once every bundle is reserved: ``pg.ready()``. Work placed in
bundle k (``{placement: [group id, k]}``) waits in the scheduler for room in that bundle
alone, on the agent holding it; it is refused at submit if it asks more than the bundle.

A group is its owner key's: only that key and admin keys place work in it or remove it. It
ends when removed (``group {op: remove}``: ``pg.remove()``), or when the client that made
it goes, unless it is named or detached (as actors are). A removed group's waiting work
fails, naming why; what runs inside is stopped (a forced cancel; actors are killed) and
keeps what it took until it is gone; the rest of its bundles comes back at once.

A bundle lost with its agent lets the whole group go (what runs in its other bundles runs
on, holding what it took): the group is reserved again as a whole if it has restarts left
(``restarts``; -1: always), and its waiting work, and what was lost with the agent and may
run again (retries, actor restarts), goes into the new bundles; with none left it fails:
its waiting work fails, and what runs in its other bundles still runs on until it ends.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ...core import protocol as P
from ...core.resources import format_units
from ...core.tasks import FINISHED, Task, TaskState
from ...logs import get_logger
from ...scheduler.gang_fit import total_of
from ...scheduler.gangs import inside_refusal
from ...scheduler.policy import Scheduler
from ...scheduler.records import Grant, Inside
from ..agents import AgentRegistry
from ..graph import TaskGraph
from ..outbox import Send
from .records import GroupRecord, GroupState, set_group_state

log = get_logger("zres.broker")
_ENDED_KEPT = 10_000  # ended groups remembered, so late work is told why it cannot run
_MEMBERS_PRUNED = 4096  # a group's members looked through for finished ones past this


class GroupTable:
    """The placement groups, by id and by name, and what happens to them.

    NEW_ID() makes scheduler ids (the bundles'); CHANGED(group) writes one whose state
    changed; END(group id, task ids, why, stop running) ends the work placed in an ended
    group (its tasks, its construction if it waits, its actors); SENDER() says who the message
    handled acts as (role, owner)."""

    def __init__(self, send: Send, graph: TaskGraph, sched: Scheduler,
                 agents: AgentRegistry, new_id: Callable[[], int],
                 end: Callable[[str, list[int], str, bool], None],
                 changed: Callable[[GroupRecord], None] = lambda group: None,
                 sender: Callable[[], tuple[str, str]] = lambda: ("", "")) -> None:
        self._send = send
        self._graph = graph
        self._sched = sched
        self._agents = agents
        self._new_id = new_id
        self._end = end
        self._changed = changed
        self._sender = sender
        self.groups: dict[str, GroupRecord] = {}
        self.names: dict[str, str] = {}
        self.by_gang: dict[int, GroupRecord] = {}
        self.of_bundle: dict[int, tuple[GroupRecord, int]] = {}
        self.ended: OrderedDict[str, GroupRecord] = OrderedDict()

    # -- made, and the work placed in it ---------------------------------------------------
    def sent_again(self, group_id: str, client: bytes) -> bool:
        """Whether GROUP_ID names a group CLIENT made: its construction, sent again after
        a broker restart, is that group, not a new one."""
        group = self.groups.get(group_id) or self.ended.get(group_id)
        return group is not None and group.client == client

    def add(self, task: Task, spec: dict[str, Any]) -> bool:
        """Make the group TASK constructs (SPEC checked: ``check_group_spec``); False if it
        cannot be (TASK failed: its id or name is taken)."""
        if spec["id"] in self.groups or spec["id"] in self.ended:
            self._graph.fail(task, "ValueError", f"placement group id {spec['id'][:40]} is "
                             "already in use")
            return False
        if spec["name"] and spec["name"] in self.names:
            self._graph.fail(task, "ValueError",
                             f"a placement group named {spec['name']!r} already exists")
            return False
        ids = [self._new_id() for _ in spec["bundles"]]
        group = GroupRecord(spec["id"], spec["name"], spec["bundles"], spec["strategy"],
                            task.client, task.owner, task.id, ids, spec["restarts"],
                            spec["detached"] or bool(spec["name"]), task.priority,
                            agents=[""] * len(ids), where=[[] for _ in ids])
        self._index(group)
        task.group, task.units, task.quiet = group.id, total_of(group.bundles), True
        task.detached = task.detached or group.detached
        self._changed(group)
        log.info("group_created", group=group.label(), strategy=group.strategy,
                 bundles=[format_units(b) for b in group.bundles])
        return True

    def restored(self, group: GroupRecord) -> None:
        """GROUP was kept by this broker's previous life (``keeping``)."""
        self._index(group)

    def rejoin(self, task: Task) -> None:
        """TASK, kept by this broker's previous life, was placed in a bundle: it is one of
        its group's again (members are not kept: removing the group after a restart left
        what ran or waited in it alone, the waiting work waiting forever)."""
        assert task.bundle is not None
        group = self.groups.get(task.bundle[0])
        if group is not None:
            group.members.add(task.id)

    def _index(self, group: GroupRecord) -> None:
        self.groups[group.id] = group
        self.by_gang[group.gang] = group
        for index, bundle_id in enumerate(group.ids):
            self.of_bundle[bundle_id] = (group, index)
        if group.name:
            self.names[group.name] = group.id

    def check_placement(self, task: Task, placement: tuple[str, int], role: str) -> str | None:
        """Why TASK may not be placed in bundle PLACEMENT ([group id, index]) by a key of
        ROLE (None: it may, and is now one of the group's)."""
        group_id, index = placement
        group = self.groups.get(group_id)
        if group is None:
            ended = self.ended.get(group_id)
            return (f"its {ended.label()} has ended: {ended.cause}" if ended is not None
                    else f"no placement group {group_id[:40]} (it ended long ago, or never was)")
        if role != "admin" and task.owner != group.key:
            who = f"only {group.key} or an admin key" if group.key else "only an admin key"
            return f"{group.label()} belongs to {group.key or 'no key'}: {who} may place work in it"
        if index >= len(group.bundles):
            return f"{group.label()} has {len(group.bundles)} bundles: there is no bundle {index}"
        refusal = inside_refusal(group.bundles[index], task.units)
        if refusal is not None:
            return f"it cannot run in bundle {index} of {group.label()}: {refusal}"
        task.bundle = (group_id, index)
        if len(group.members) >= _MEMBERS_PRUNED:
            group.members = {m for m in group.members
                             if (t := self._graph.get(m)) is not None and t.state not in FINISHED}
        group.members.add(task.id)
        return None

    def inside(self, bundle: tuple[str, int]) -> Inside | None:
        """Where work placed in BUNDLE (group id, index) waits in the scheduler (None: its
        group has ended)."""
        group = self.groups.get(bundle[0])
        return None if group is None else Inside(group.gang, bundle[1])

    def ended_cause(self, group_id: str) -> str:
        group = self.ended.get(group_id)
        return f"its {group.label()} has ended: {group.cause}" if group else \
            f"its placement group {group_id[:40]} has ended"

    # -- reserved -------------------------------------------------------------------------
    def queue(self, task: Task) -> str | None:
        """TASK, a group's construction, is ready: queue its gang; return why no agents
        could ever hold it (None: they could)."""
        group = self.by_gang.get(task.id)
        self._graph.set_state(task, TaskState.QUEUED)
        if group is None:  # (restored after its group ended)
            self._graph.fail(task, "ZresError", self.ended_cause(task.group))
            return None
        if self._sched.gang(group.gang) is None:  # (a restored one is queued already)
            self._sched.add_gang(group.gang, group.bundles, group.strategy, group.ids,
                                 group.priority, group.key)
        return self._sched.gang_infeasible(group.gang)

    def placed(self, grant: Grant) -> None:
        """A bundle of a group is reserved (the scheduler places them all in one pass)."""
        group, index = self.of_bundle[grant.task]
        agent = self._agents.slot_owner[grant.slot]
        group.agents[index] = agent.name
        group.where[index] = [agent.slots.index(grant.slot), list(grant.gpus)]
        if all(group.agents) and group.state is not GroupState.READY:
            set_group_state(group, GroupState.READY)
            group.starts += 1
            log.info("group_ready", group=group.label(), agents=group.agents)
            task = self._graph.get(group.gang)
            if task is not None and task.state is TaskState.QUEUED:
                self._graph.set_state(task, TaskState.RUNNING)
                self._graph.finish(task, P.OK, [], {"agents": list(group.agents)})
        self._changed(group)

    def bundle_lost(self, bundle_id: int, why: str, left: bool = False) -> None:
        """A bundle was lost with its agent (WHY): the group is reserved again, whole, or
        fails. LEFT: its agent left as planned (drained): reserved again, no restart
        spent (an operator draining a node for maintenance does not fail the groups on it,
        as Ray's node drain does not)."""
        group, index = self.of_bundle[bundle_id]
        if group.state not in (GroupState.READY, GroupState.ADOPTING):
            return  # (another of its bundles, lost with the same agent: done already)
        cause = f"its bundle {index} was lost with agent {group.agents[index]} ({why})"
        group.agents = [""] * len(group.bundles)
        group.where = [[] for _ in group.bundles]
        if group.restarts == 0 and not left:
            self._sched.remove_gang(group.gang, now=time.monotonic())
            self.end(group, GroupState.FAILED, f"{cause}, and it had no restarts left")
            return
        if group.restarts > 0 and not left:
            group.restarts -= 1
        log.warning("group_restarting", group=group.label(), cause=cause,
                    restarts_left=group.restarts)
        set_group_state(group, GroupState.RESTARTING)
        self._sched.remove_gang(group.gang, requeue=True, now=time.monotonic())
        self._changed(group)

    # -- ended ----------------------------------------------------------------------------
    def end(self, group: GroupRecord, state: GroupState, cause: str) -> None:
        """End GROUP (removed or failed, for CAUSE): its work stopped, its bundles back."""
        set_group_state(group, state)
        group.cause = cause
        (log.info if state is GroupState.REMOVED else log.warning)(
            "group_ended", group=group.label(), state=state.value, cause=cause)
        why = f"its {group.label()} was removed" if state is GroupState.REMOVED else \
            f"its {group.label()} failed: {cause}"
        # (and its construction, if it still waits; what runs is stopped only when the
        # group is removed: README, Gangs, Faults)
        self._end(group.id, [*sorted(group.members), group.gang], why,
                  state is GroupState.REMOVED)
        self._sched.remove_gang(group.gang, now=time.monotonic())
        del self.groups[group.id]
        del self.by_gang[group.gang]
        for bundle_id in group.ids:
            self.of_bundle.pop(bundle_id, None)
        if group.name and self.names.get(group.name) == group.id:
            del self.names[group.name]
        group.members = set()
        self.ended[group.id] = group
        while len(self.ended) > _ENDED_KEPT:
            self.ended.popitem(last=False)
        self._changed(group)

    def drop_owned_by(self, client: bytes, name: str) -> None:
        """Remove the groups the client CLIENT (called NAME) made, but named or detached
        ones, which live until removed."""
        for group in [g for g in self.groups.values() if g.client == client and not g.detached]:
            self.end(group, GroupState.REMOVED, f"its owner, client {name}, disconnected")

    # -- requests -----------------------------------------------------------------------------
    def on_group(self, ident: bytes, msg: P.Message, now: float) -> None:
        """``group {op: remove, id}``: end a group (its owner or an admin key);
        ``group {op: lookup, name}``: the live group of that name."""
        op = msg.body.get("op")
        body: dict[str, Any] = {"req": msg.body.get("req")}
        role, owner = self._sender()
        if op == "remove":
            group = self.groups.get(str(msg.body.get("id")))
            if group is None:
                ended = self.ended.get(str(msg.body.get("id")))
                body["state"] = ended.state.value if ended is not None else "unknown"
            elif role != "admin" and owner != group.key:
                body["error"] = (f"{group.label()} belongs to {group.key or 'no key'}: only "
                                 f"{group.key or 'an admin key'} or an admin key may remove it")
            else:
                self.end(group, GroupState.REMOVED, "removed by its owner")
                body["state"] = GroupState.REMOVED.value
        elif op == "lookup":
            group = self.groups.get(self.names.get(str(msg.body.get("name")), ""))
            if group is not None and (role == "admin" or owner == group.key):
                body["group"] = {"id": group.id, "name": group.name, "bundles": group.bundles,
                                 "strategy": group.strategy}
            elif group is not None:
                body["error"] = (f"{group.label()} exists but belongs to "
                                 f"{group.key or 'no key'}")
        else:
            body["error"] = f"group: unknown op {str(op)[:40]!r}"
        self._send(ident, P.GROUP_REPLY, body)

    def describe(self) -> list[dict[str, Any]]:
        """The live groups, oldest first, with why each that waits waits."""
        out = []
        for group in sorted(self.groups.values(), key=lambda g: g.gang):
            entry = group.describe()
            if group.gang in self._sched.waiting:
                entry["reason"] = self._sched.why(group.gang, False)
            out.append(entry)
        return out
