"""What a reservation keeps from the tasks ordered after its holder.

A task blocked for ``starvation_after`` seconds reserves the slot where it will fit soonest
(see ``policy``). In every pass, a task ordered after it may start on that slot only if it
cannot delay the holder's start there; a reservation never idles what the holder does not
need. A later task is admitted when either holds:

- **It leaves what the holder will need.** The holder is *short* of a resource when less of
  it is free than it asks for. Of a resource it is short of, a later task takes nothing;
  of another resource it asks for, the later task leaves free the holder's amount less
  what the tasks that must end first give back of it, at least. The holder cannot start
  before the running tasks that end have given back its shortfall D of each short
  resource M; whichever tasks those are, of a resource N they give back at least D times
  the least N any task holding M holds per unit of M (several short resources: the
  largest of these bounds). So a CPU task may take the last free CPU beside a GPU task
  reserving the slot for the GPU, when the task holding that GPU holds a CPU too: it gives
  one back with the GPU. A task using nothing the holder asks for is never held back.
  GPU and GPU_MEMORY are never lent this way (devices are taken whole: an amount free is
  not a device free).
- **It is expected to end before the holder could start** (EASY backfill): the holder's
  start is estimated from the expected ends of the tasks holding what it is short of
  (each kind's recent run time, ``durations``), taken in order until they give back its
  shortfall; the later task's end is now plus its kind's run time.

Estimates err toward the holder: a running task of a kind with no estimate, or past its
estimate, is taken to end now (nothing then backfills by the clock behind it), and a later
task of a kind with no estimate never backfills by the clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..core.resources import GPU, GPU_MEMORY, Units
from .durations import Durations
from .records import Grant, Slot, Waiting, Workers
from .table import SlotTable

_COMPARED = 8   # slots compared when choosing where to reserve


@dataclass(slots=True)
class Fence:
    """What the reservation of task HOLDER (of OWNER) keeps on its slot in one pass."""

    holder: int
    keep: Units      # a later task leaves at least this much free of each name
    start: float     # the earliest the holder could start there, by the estimates
    owner: str = ""
    # Whether it binds OWNER's own tasks too: those the pass takes after the holder (its
    # owner's tasks ordered before it are not held back). Other owners' tasks it binds
    # wherever the pass takes them: fair share decides who goes first, not who starves.
    own: bool = True

    def binds(self, owner: str) -> bool:
        """Whether this fence holds back a task of OWNER now."""
        return self.own or owner != self.owner

    def admits(self, slot: Slot, units: Units, end: float | None) -> bool:
        """Whether a later task asking UNITS, expected to end at END (None: unknown), may
        start on SLOT now (it fits there: checked apart)."""
        if end is not None and end < self.start:  # (an estimate of 0 s never passes "now")
            return True
        keep = self.keep
        return all(slot.free.get(n, 0) - a >= keep.get(n, 0) for n, a in units.items())


def fence(slot: Slot, units: Units, holder: int, running: Iterable[Grant],
          durations: Durations, now: float, owner: str = "", own: bool = True) -> Fence:
    """Fence SLOT for HOLDER (of OWNER), which asks UNITS there; RUNNING: the grants
    started there. OWN: it binds its owner's tasks (else only others')."""
    short = {n: a - slot.free.get(n, 0) for n, a in units.items() if slot.free.get(n, 0) < a}
    holding = [g for g in running if any(g.taken.get(m, 0) > 0 for m in short)]
    keep = dict(units)
    for name, amount in units.items():
        if name in short or name == GPU or name == GPU_MEMORY:
            continue
        given = 0
        for short_name, lacking in short.items():
            bounds = [lacking * g.taken.get(name, 0) // g.taken[short_name]
                      for g in holding if g.taken.get(short_name, 0) > 0]
            if bounds:
                given = max(given, min(bounds))
        keep[name] = max(0, amount - given)
    return Fence(holder, keep, _start(short, holding, durations, now), owner, own)


def _start(short: Units, holding: list[Grant], durations: Durations, now: float) -> float:
    """When HOLDING will have given back SHORT, by their expected ends (at least NOW)."""
    if not short:
        return now  # blocked by devices or a slot's queue: no estimate
    ends = sorted((_end(g, durations, now), g.task, g) for g in holding)
    left = dict(short)
    for end, _, grant in ends:
        for name in left:
            left[name] -= grant.taken.get(name, 0)
        if all(amount <= 0 for amount in left.values()):
            return end
    return now  # they never give enough back (a capacity lowered): no estimate


def _end(grant: Grant, durations: Durations, now: float) -> float:
    expected = durations.expected(grant.kind)
    return now if expected is None else max(now, grant.since + expected)


def held_fences(slots: Mapping[int, Slot], reserved: Iterable[int],
                waiting: Mapping[int, Waiting],
                fence_of: Callable[[Slot, Waiting], Fence]) -> dict[int, Fence]:
    """The fences of the RESERVED slots' holders as a pass begins, each binding only other
    owners' tasks (FENCE_OF(slot, holder) makes one) until the pass reaches its holder:
    fair share orders owners, it does not let one starve another's big task."""
    fences = {}
    for slot_id in sorted(reserved):
        holder = waiting.get(slots[slot_id].reserved_by)  # type: ignore[arg-type]
        if holder is not None:
            fences[slot_id] = fence_ = fence_of(slots[slot_id], holder)
            fence_.own = False
    return fences


def drop_fence(fences: dict[int, Fence], task: Waiting) -> None:
    """TASK's reservation holds nothing back for the rest of the pass (it starts, or waits
    for its owner's quota)."""
    slot_id = task.reserved_slot
    if slot_id is not None and slot_id in fences and fences[slot_id].holder == task.id:
        del fences[slot_id]


def soonest_slot(units: Units, fitting: set[int], table: SlotTable, fences: dict[int, Fence],
                 where: Workers | None = None) -> Slot | None:
    """The slot where a task asking UNITS will fit soonest (the least still to be freed,
    then the fewest tasks running, then slot id), of FITTING (the open slots that could
    ever run it) not reserved already. WHERE: the agents it may run on, if restricted."""
    # Walk the slots with the most room of the task's scarcest resource first and compare
    # a few: a full scan would make each reservation cost O(agents). A task restricted to
    # a few agents walks their slots alone.
    if not fitting or not units:
        return None
    name = min(units, key=table.index.offering)
    slots = table.slots
    if where is None or where.loose:
        order = table.index.most_free(name)
    else:
        order = iter(sorted(fitting, key=lambda i: (_room(slots[i], name), i), reverse=True))
    best: tuple[tuple[float, int, int], Slot] | None = None
    seen = 0
    for slot_id in order:
        slot = slots[slot_id]
        if slot.id not in fitting or slot.reserved_by is not None or slot.id in fences:
            continue
        short = sum(max(0, a - slot.free.get(n, 0)) / slot.total[n] for n, a in units.items())
        key = (short, len(slot.running), slot.id)
        if best is None or key < best[0]:
            best = (key, slot)
        seen += 1
        if seen >= _COMPARED:
            break
    return best[1] if best else None


def _room(slot: Slot, name: str) -> int:
    return slot.free.get(name, 0) - slot.queued_taken.get(name, 0)
