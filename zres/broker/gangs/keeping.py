"""Placement groups kept across broker restarts, and multi-node jobs taken back.

The live groups are written to the state store (its ``meta`` table, as one map: groups are
few) whenever one changes; an ended one is dropped. A restarted broker restores them:
- a group waiting to be reserved (or reserved again) waits again, as a whole;
- a reserved group waits for the agents holding its bundles (``adopting``): as each
  agent comes back, its bundles are taken back on the same slot and devices, before
  anything else there (and before the work that ran inside them, which its agent offers
  and the broker takes back into them); a bundle whose agent is not back within the
  grace period, or cannot hold it there any more, is lost: the group is reserved again,
  whole, or fails, as when an agent is lost.

Multi-node jobs keep their ranks in their job record (``job_records``): each rank that was
sent to its agent is taken back when that agent offers it (``ranks``); one its agent no
longer has, or whose agent is not back in time, is lost, and the job's other ranks are
stopped, as when an agent is lost.
"""

from __future__ import annotations

from typing import Any

from ...core.resources import Units
from ...logs import get_logger
from ...scheduler.policy import Scheduler
from ..agents import AgentRecord
from ..store import Store
from .groups import GroupTable
from .records import GroupRecord, GroupState

log = get_logger("zres.broker")
META_KEY = "placement_groups"


class GroupKeeper:
    """Writes GROUPS' changes to STORE (None: nothing is kept), restores them, and takes
    their bundles back as their agents come back."""

    def __init__(self, store: Store | None, groups: GroupTable, sched: Scheduler) -> None:
        self._store = store
        self._groups = groups
        self._sched = sched
        # Reserved groups restored, by the agent each bundle waits for: (group, index).
        self.waiting: dict[str, list[tuple[GroupRecord, int]]] = {}

    def changed(self, group: GroupRecord) -> None:
        """GROUP changed: write the live groups again (at the end of this loop turn)."""
        if self._store is not None:
            self._store.set_meta(META_KEY, {g.id: g.record()
                                            for g in self._groups.groups.values()})

    def restore(self) -> int:
        """Take back the groups kept in the store; return how many."""
        if self._store is None:
            return 0
        kept: dict[str, dict[str, Any]] = self._store.meta(META_KEY, {}) or {}
        for record in kept.values():
            try:
                group = _group(record)
            except (KeyError, TypeError, ValueError):
                continue  # (kept by another version)
            self._groups.restored(group)
            if group.state in (GroupState.READY, GroupState.ADOPTING) and all(group.where):
                group.state = GroupState.ADOPTING
                for index, agent in enumerate(group.agents):
                    self.waiting.setdefault(agent, []).append((group, index))
            else:  # (waiting to be reserved, or reserved again: it waits again, whole)
                group.state = GroupState.RESTARTING if group.starts else GroupState.PENDING
                group.agents = [""] * len(group.bundles)
                group.where = [[] for _ in group.bundles]
            # (one adopting is not queued: placed anew on an agent back first, its work
            # that runs where it was could not be taken back)
            self._sched.add_gang(group.gang, group.bundles, group.strategy, group.ids,
                                 group.priority, group.key,
                                 adopting=group.state is GroupState.ADOPTING)
        if kept:
            log.info("groups_restored", groups=len(kept),
                     adopting=sum(len(b) for b in self.waiting.values()))
        return len(kept)

    def offered(self, agent: AgentRecord) -> None:
        """AGENT is back: take back the bundles it held (before the work inside them)."""
        for group, index in self.waiting.pop(agent.name, []):
            if group.state is not GroupState.ADOPTING:
                continue  # (lost or ended meanwhile)
            slot_index, positions = group.where[index]
            if not (0 <= slot_index < len(agent.slots) and self._sched.adopt_bundle(
                    group.gang, index, agent.slots[slot_index], list(positions))):
                self._lose(group, index, f"agent {agent.name} came back without room for it")
                continue
            gang = self._sched.gang(group.gang)
            if gang is not None and gang.placed and all(b is not None for b in gang.placed):
                group.state = GroupState.READY
                log.info("group_adopted", group=group.label(), agents=group.agents)
                self.changed(group)

    def expire(self, grace: float) -> None:
        """The bundles whose agents were not back within GRACE seconds are lost."""
        waiting, self.waiting = self.waiting, {}
        for agent, bundles in waiting.items():
            for group, index in bundles:
                if group.state is GroupState.ADOPTING:
                    self._lose(group, index, f"agent {agent} did not come back within "
                               f"{grace:g}s of the broker's restart")

    def _lose(self, group: GroupRecord, index: int, why: str) -> None:
        self._groups.bundle_lost(group.ids[index], why)


def _group(record: dict[str, Any]) -> GroupRecord:
    bundles: list[Units] = [dict(b) for b in record["bundles"]]
    return GroupRecord(
        str(record["id"]), str(record["name"]), bundles, str(record["strategy"]),
        bytes(record["client"]), str(record["key"]), int(record["gang"]),
        [int(i) for i in record["ids"]], int(record["restarts"]), bool(record["detached"]),
        int(record["priority"]), GroupState(record["state"]),
        [str(a) for a in record["agents"]], [list(w) for w in record["where"]],
        cause=str(record.get("cause", "")), starts=int(record.get("starts", 0)))
