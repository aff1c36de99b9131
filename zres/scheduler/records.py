"""What the scheduler keeps: worker slots, waiting tasks, and grants."""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.resources import Units

# A request's (name, amount) pairs, sorted; then, for a task that may run only on (or
# prefers) some agents, its Workers. Tasks of one shape fit or fail alike.
Shape = tuple[Any, ...]
# An owner's tasks of one shape: they wait in one queue, fit or fail alike, and are held by
# their owner's quota alike.
Lane = tuple[str, Shape]


@dataclass(frozen=True, slots=True)
class Workers:
    """The agents a task is placed on, by name: only those (``workers=``), or, LOOSE
    (``allow_other_workers=True``), those first when one fits now, else any."""

    names: frozenset[str]
    loose: bool = False


@dataclass(frozen=True, slots=True)
class Inside:
    """The bundle a task is placed in: bundle INDEX of gang GANG, whose resources alone it
    draws on (see ``gangs``)."""

    gang: int
    index: int


def workers(names: Collection[str] | None, loose: bool = False) -> Workers | None:
    """The placement of a task asking for agents NAMES (None or none: any agent)."""
    return Workers(frozenset(names), loose) if names else None


@dataclass(slots=True)
class Slot:
    """One worker slot: resources that tasks are placed into."""

    id: int
    agent: str
    total: Units
    free: Units
    gpu_free: list[int]          # compute share free per device, UNIT when idle
    gpu_mem_total: list[int]     # memory units per device
    gpu_mem_free: list[int]
    gpu_usable: int              # devices [0, gpu_usable) may take new work
    running: set[int] = field(default_factory=set)    # started grants
    reserved_by: int | None = None
    # Pipelining: grants queued here, not started yet (the agent starts them as room frees
    # and reports each start), and what they will take; what started short grants hold.
    queue: dict[int, None] = field(default_factory=dict)
    queued_taken: Units = field(default_factory=dict)
    short_taken: Units = field(default_factory=dict)
    open: bool = True            # takes new grants (not while its agent drains or is away)
    bundles: int = 0             # gangs' bundles held here: it takes no queued grants


@dataclass(slots=True)
class Waiting:
    id: int
    units: Units
    priority: int
    seq: int
    shape: Shape
    # The first pass that found it blocked (it fit nowhere it could run): its wait for a
    # reservation counts from here, not from when it was queued (None: not blocked yet).
    blocked_since: float | None = None
    reserved_slot: int | None = None
    reserve_failed: int = -1     # the reservation epoch in which no slot was free to reserve
    queueable: bool = True       # may be granted into a slot's queue (pipelining)
    # It may hold its room for good (an actor, a command job): never short work, whatever
    # its kind's record says (a queue behind it would never start).
    lasting: bool = False
    kind: Hashable | None = None  # what it runs, for its expected duration (None: short)
    owner: str = ""              # the key that submitted it ("": none), for fair share
    lane: Lane = ("", ())        # (owner, shape): one tuple shared by the lane's tasks
    # The agents holding the most bytes of its inputs (results kept on agents), best
    # first: where it goes if it fits there now (locality never makes it wait).
    near: tuple[str, ...] = ()


@dataclass(slots=True)
class Grant:
    """A placement: task TASK runs on SLOT with UNITS, on device positions GPUS."""

    task: int
    slot: int
    units: Units
    gpus: list[int]
    taken: Units                 # what the slot gives up (a whole GPU takes its memory)
    shares: list[int]            # compute share taken per device in GPUS
    memory: list[int]            # memory units taken per device in GPUS
    started: bool = True         # its resources are taken (False while queued)
    priority: int = 0            # the task's, and its place in submission order: the
    seq: int = 0                 # agent starts queued grants in this order too
    short: bool = True           # of a kind known to run briefly
    kind: Hashable | None = None  # what it runs, for its expected end (see ``reservations``)
    since: float = 0.0           # when it started (as the scheduler was told the time)
    owner: str = ""              # its task's owner, charged for it from grant to release
    weight: float = 0.0          # its dominant share of the cluster when granted (``owners``)
    # A gang's (``gangs``): this grant *is* bundle (gang, index), a reservation on the slot
    # (or a multi-node job's rank); or its task draws on the bundle of grant WITHIN alone
    # (0: none), whose resources that grant holds.
    bundle: tuple[int, int] | None = None
    within: int = 0
    # A queued grant's: the agents its task may run on (None: any), for where else it
    # could go if asked back (``stragglers``).
    where: Workers | None = None


def shape_of(units: Mapping[str, int], where: Hashable | None = None) -> Shape:
    """The shape of a request for UNITS; WHERE (Workers, Inside, or a gang) is appended."""
    shape = tuple(sorted(units.items()))
    return shape if where is None else (*shape, where)


def workers_of(shape: Shape) -> Workers | None:
    """The agents tasks of SHAPE are placed on (None: any)."""
    return shape[-1] if shape and isinstance(shape[-1], Workers) else None


def add_to(into: Units, amounts: Mapping[str, int], sign: int = 1) -> None:
    """Add (SIGN 1) or subtract (-1) AMOUNTS into INTO, dropping names that reach 0."""
    for name, amount in amounts.items():
        total = into.get(name, 0) + sign * amount
        if total:
            into[name] = total
        else:
            into.pop(name, None)
