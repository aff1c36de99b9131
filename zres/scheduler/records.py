"""What the scheduler keeps: worker slots, waiting tasks, and grants."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from ..core.resources import Units

Shape = tuple[tuple[str, int], ...]


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
    running: set[int] = field(default_factory=set)
    reserved_by: int | None = None
    queue: deque[int] = field(default_factory=deque)   # granted, waiting for room, in order


@dataclass(slots=True)
class Waiting:
    id: int
    units: Units
    priority: int
    seq: int
    shape: Shape
    since: float
    reserved_slot: int | None = None
    reserve_failed: int = -1     # the reservation epoch in which no slot was free to reserve
    queueable: bool = True       # may be granted into a slot's queue (pipelining)
    kind: Hashable | None = None  # what it runs, for its expected duration (None: short)


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
    started: bool = True         # False while it waits in the slot's queue


def shape_of(units: Mapping[str, int]) -> Shape:
    return tuple(sorted(units.items()))
