"""A placement group as the broker keeps it: its record, its states and their transitions,
and the specs a client sends to make one or to place work in one of its bundles; and a
multi-node job's gang as it is placed and runs (``ranks``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import ProtocolError
from ...core.limits import Limits, check_count, check_name, check_units
from ...core.resources import Units
from ...core.tasks import Task
from ...scheduler.gang_fit import STRATEGIES
from ...scheduler.records import Grant
from ..job_records import JobRecord


class GroupState(enum.Enum):
    PENDING = "pending"          # waiting for every bundle to fit at once
    READY = "ready"              # every bundle reserved
    RESTARTING = "restarting"    # a bundle was lost with its agent: reserved again, whole
    ADOPTING = "adopting"        # the broker restarted: its agents have not all come back
    REMOVED = "removed"
    FAILED = "failed"            # a bundle lost, and no restarts left


ENDED = frozenset({GroupState.REMOVED, GroupState.FAILED})

_ALLOWED = {
    GroupState.PENDING: {GroupState.READY, GroupState.REMOVED, GroupState.FAILED},
    GroupState.READY: {GroupState.RESTARTING, GroupState.REMOVED, GroupState.FAILED},
    GroupState.RESTARTING: {GroupState.READY, GroupState.REMOVED, GroupState.FAILED},
    GroupState.ADOPTING: {GroupState.READY, GroupState.RESTARTING, GroupState.REMOVED,
                          GroupState.FAILED},
    GroupState.REMOVED: set(),
    GroupState.FAILED: set(),
}


@dataclass(slots=True)
class GroupRecord:
    """A placement group: BUNDLES reserved by STRATEGY for the work placed inside them."""

    id: str                      # made by its client (random), as an actor's
    name: str                    # "" when unnamed; a named group outlives its client
    bundles: list[Units]
    strategy: str
    client: bytes                # the client that made it
    key: str                     # its owner: the name of that client's key ("": no keys)
    gang: int                    # its construction task's id: its gang's in the scheduler
    ids: list[int]               # its bundles' grant ids (never sent to agents)
    restarts: int                # times it may be reserved again after a loss (-1: always)
    detached: bool = False       # outlives its client (a named one always does)
    priority: int = 0
    state: GroupState = GroupState.PENDING
    agents: list[str] = field(default_factory=list)   # where each bundle is ("": nowhere)
    # Where each bundle is on its agent: [slot index, [GPU positions]] (a restarted broker
    # takes it back there), or [] while not placed.
    where: list[list[Any]] = field(default_factory=list)
    members: set[int] = field(default_factory=set)    # tasks placed in its bundles
    cause: str = ""              # why it ended
    starts: int = 0              # times it was reserved

    def label(self) -> str:
        return f"placement group {self.name or self.id[:8]}"

    def describe(self) -> dict[str, Any]:
        """What status and the dashboard show of it (amounts in units)."""
        return {"id": self.id, "name": self.name, "owner": self.key, "state": self.state.value,
                "strategy": self.strategy, "restarts_left": self.restarts,
                "starts": self.starts, "cause": self.cause,
                "bundles": [{"units": units, "agent": agent}
                            for units, agent in zip(self.bundles, self.agents)]}

    def record(self) -> dict[str, Any]:
        """What the state store keeps of it."""
        return {"id": self.id, "name": self.name, "bundles": self.bundles,
                "strategy": self.strategy, "client": self.client, "key": self.key,
                "gang": self.gang, "ids": self.ids, "restarts": self.restarts,
                "detached": self.detached, "priority": self.priority,
                "state": self.state.value, "agents": self.agents, "where": self.where,
                "cause": self.cause, "starts": self.starts}


def set_group_state(group: GroupRecord, new: GroupState) -> None:
    """Move GROUP to NEW, refusing any transition the table does not allow."""
    if new not in _ALLOWED[group.state]:
        raise RuntimeError(f"{group.label()}: {group.state.value} -> {new.value}")
    group.state = new


def check_group_spec(spec: Any, limits: Limits) -> dict[str, Any]:
    """Validate a placement group's spec {id, name?, bundles, strategy, restarts?,
    detached?} off the wire."""
    if not isinstance(spec, dict) or not isinstance(spec.get("id"), str) or not spec["id"] \
            or not isinstance(spec.get("bundles"), list) or not spec["bundles"]:
        raise ProtocolError("submit: a placement group needs an id and a non-empty list of "
                            "bundles")
    check_name(spec["id"], limits, "submit: a placement group's id")
    name = check_name(spec.get("name", ""), limits, "submit: a placement group's name")
    check_count(len(spec["bundles"]), limits.slots, "submit: a placement group's bundles",
                "max_slots")
    bundles = [check_units(b, limits, "submit: a bundle") for b in spec["bundles"]]
    if any(not b for b in bundles):
        raise ProtocolError("submit: a bundle must ask for something")
    strategy, restarts = spec.get("strategy", "PACK"), spec.get("restarts", 0)
    if strategy not in STRATEGIES:
        raise ProtocolError(f"submit: strategy must be one of {', '.join(STRATEGIES)}")
    if type(restarts) is not int or restarts < -1 \
            or not isinstance(spec.get("detached", False), bool):
        raise ProtocolError("submit: a placement group's restarts must be an int >= -1, "
                            "and detached a bool")
    return {"id": spec["id"], "name": name if isinstance(spec.get("name", ""), str) else "",
            "bundles": bundles, "strategy": strategy, "restarts": restarts,
            "detached": bool(spec.get("detached"))}


def check_placement(value: Any) -> tuple[str, int]:
    """Validate a task's placement [group id, bundle index] off the wire."""
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            and type(value[1]) is int and value[1] >= 0):
        raise ProtocolError("submit: placement must be [placement group id, bundle index]")
    return value[0], value[1]


# A rank as a job record keeps it: [grant id, agent, state, exit code, GPUs].
ID, AGENT, STATE, EXIT, GPUS = range(5)
Outcome = tuple[str, list[Any], dict[str, Any]]


@dataclass(slots=True)
class Gang:
    """A multi-node job being placed or running: its ranks' grants and how they ended."""

    job: JobRecord
    task: Task
    ids: list[int]
    grants: dict[int, Grant] = field(default_factory=dict)     # placed, by rank
    sent: set[int] = field(default_factory=set)                # ranks sent to their agents
    ended: dict[int, Outcome] = field(default_factory=dict)    # by rank
    failing: tuple[int, Outcome] | None = None                 # the first rank that failed
    lost: bool = False                                         # ... lost with its agent
    stopping: bool = False                                     # cancelled
    away: set[int] = field(default_factory=set)  # restored: ranks waiting for their agent
