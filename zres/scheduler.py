"""Pure placement policy: which waiting task runs on which worker slot, and why not.

No sockets, threads or clocks: the broker feeds events in (slot added or removed,
task queued, task finished) and calls ``schedule()`` for the assignments to send.

Rules
- Order: higher priority first; equal priority in submission order (``seq``). Ties never
  depend on dict or set order, so the same events always give the same schedule.
- Backfill: a task that cannot start is skipped, never blocking later tasks that can.
  Waiting tasks are indexed by the *shape* of their request: all tasks of one shape fit
  or fail alike, so one failed fit blocks a whole shape for the pass in O(1).
- Fit is checked against each slot's *free* amounts, subtracted at assignment and
  returned at release; concurrent grants never exceed any slot's capacity.
- GPUs are accounted per device: GPU=k (whole) takes k fully free devices; a fraction
  below 1 packs onto the busiest device that still has room, never spanning two.
- Among slots that fit, prefer the one that strands least: fewest resource kinds the
  task does not use (keep GPU nodes for GPU work), then least left over, then slot id.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .resources import GPU, UNIT, Units, fits, format_amount, format_units

Shape = tuple[tuple[str, int], ...]


@dataclass(slots=True)
class Slot:
    """One worker slot: a set of resources that tasks are placed into."""

    id: int
    agent: str
    total: Units
    free: Units
    gpu_free: list[int]          # free units per device, UNIT when idle
    running: set[int] = field(default_factory=set)


@dataclass(slots=True)
class Waiting:
    id: int
    units: Units
    priority: int
    seq: int
    shape: Shape


@dataclass(slots=True)
class Grant:
    """A placement decision: task ID runs on SLOT with these units and device positions."""

    task: int
    slot: int
    units: Units
    gpus: list[int]


def shape_of(units: Mapping[str, int]) -> Shape:
    return tuple(sorted(units.items()))


class Scheduler:
    """Resource table plus waiting queue; every method is plain, fast bookkeeping."""

    def __init__(self) -> None:
        self.slots: dict[int, Slot] = {}
        self.waiting: dict[int, Waiting] = {}
        self.running: dict[int, Grant] = {}
        self._by_shape: dict[Shape, list[tuple[int, int, int]]] = {}
        self._seq = 0
        self._infeasible_cache: dict[Shape, str | None] = {}

    # -- resource table -------------------------------------------------------------
    def add_slot(self, slot_id: int, agent: str, units: Units) -> None:
        """Register a slot with capacity UNITS (GPU must be whole devices)."""
        devices = units.get(GPU, 0) // UNIT
        self.slots[slot_id] = Slot(slot_id, agent, dict(units), dict(units),
                                   [UNIT] * devices)
        self._infeasible_cache.clear()

    def remove_slot(self, slot_id: int) -> list[int]:
        """Drop a slot; return the ids of the tasks that were running on it."""
        slot = self.slots.pop(slot_id)
        for task in slot.running:
            del self.running[task]
        self._infeasible_cache.clear()
        return sorted(slot.running)

    # -- tasks ----------------------------------------------------------------------
    def enqueue(self, task_id: int, units: Units, priority: int = 0) -> None:
        """Queue a ready task."""
        self._seq += 1
        shape = shape_of(units)
        self.waiting[task_id] = Waiting(task_id, dict(units), priority, self._seq, shape)
        heapq.heappush(self._by_shape.setdefault(shape, []), (-priority, self._seq, task_id))

    def dequeue(self, task_id: int) -> bool:
        """Forget a waiting task (cancelled); return whether it was waiting."""
        # Its heap entry is skipped lazily when it reaches the top.
        return self.waiting.pop(task_id, None) is not None

    def release(self, task_id: int) -> None:
        """Return a running task's resources to its slot."""
        grant = self.running.pop(task_id, None)
        if grant is None:
            return
        slot = self.slots.get(grant.slot)
        if slot is None:
            return
        slot.running.discard(task_id)
        for name, amount in grant.units.items():
            slot.free[name] = slot.free.get(name, 0) + amount
        for pos in grant.gpus:
            slot.gpu_free[pos] += _per_device(grant.units.get(GPU, 0), len(grant.gpus))

    # -- placement ------------------------------------------------------------------
    def schedule(self) -> list[Grant]:
        """Place every waiting task that fits now, best first; return the grants."""
        heads: list[tuple[int, int, Shape]] = []
        for shape, heap in list(self._by_shape.items()):
            top = self._top(shape, heap)
            if top is not None:
                heads.append((top[0], top[1], shape))
        heapq.heapify(heads)
        grants: list[Grant] = []
        while heads:
            _, _, shape = heapq.heappop(heads)
            heap = self._by_shape[shape]
            task = self.waiting[heap[0][2]]
            grant = self._place(task)
            if grant is None:
                continue  # the whole shape is blocked this pass; others may still fit
            heapq.heappop(heap)
            del self.waiting[task.id]
            grants.append(grant)
            top = self._top(shape, heap)
            if top is not None:
                heapq.heappush(heads, (top[0], top[1], shape))
        return grants

    def _top(self, shape: Shape, heap: list[tuple[int, int, int]]) -> tuple[int, int, int] | None:
        while heap and heap[0][2] not in self.waiting:
            heapq.heappop(heap)
        if not heap:
            del self._by_shape[shape]
            return None
        return heap[0]

    def _place(self, task: Waiting) -> Grant | None:
        best: tuple[tuple[int, float, int], Slot, list[int]] | None = None
        for slot in self.slots.values():
            if not fits(slot.free, task.units):
                continue
            gpus = pick_gpus(slot.gpu_free, task.units.get(GPU, 0))
            if gpus is None:
                continue
            score = (_unused_kinds(slot, task.units), _leftover(slot, task.units), slot.id)
            if best is None or score < best[0]:
                best = (score, slot, gpus)
        if best is None:
            return None
        _, slot, gpus = best
        for name, amount in task.units.items():
            slot.free[name] -= amount
        for pos in gpus:
            slot.gpu_free[pos] -= _per_device(task.units.get(GPU, 0), len(gpus))
        slot.running.add(task.id)
        grant = Grant(task.id, slot.id, task.units, gpus)
        self.running[task.id] = grant
        return grant

    # -- explaining -----------------------------------------------------------------
    def infeasible_reason(self, units: Units) -> str | None:
        """Say why no registered slot could ever run UNITS, or None if one could."""
        if not self.slots:
            return None  # nothing has joined yet: that is waiting, not infeasible
        shape = shape_of(units)
        if shape not in self._infeasible_cache:
            self._infeasible_cache[shape] = self._infeasible(units)
        return self._infeasible_cache[shape]

    def _infeasible(self, units: Units) -> str | None:
        for slot in self.slots.values():
            if fits(slot.total, units) and pick_gpus([UNIT] * len(slot.gpu_free),
                                                     units.get(GPU, 0)) is not None:
                return None
        for name, amount in sorted(units.items()):
            largest = max((s.total.get(name, 0) for s in self.slots.values()
                           if name in s.total), default=None)
            if largest is None:
                return f"no agent offers {name}"
            if largest < amount:
                return (f"needs {name}={format_amount(name, amount)}, largest agent has "
                        f"{name}={format_amount(name, largest)}")
        return f"no single agent offers {format_units(units)} together"

    def why(self, task_id: int) -> str:
        """Say why a waiting task is not running yet."""
        task = self.waiting.get(task_id)
        if task is None:
            return "running" if task_id in self.running else "not waiting"
        if not self.slots:
            return "no agent has joined the broker yet"
        reason = self.infeasible_reason(task.units)
        if reason is not None:
            return f"infeasible: {reason}"
        ahead = sum(1 for _, seq, tid in self._by_shape.get(task.shape, ())
                    if tid in self.waiting and (-self.waiting[tid].priority, seq)
                    < (-task.priority, task.seq))
        short = []
        for slot in self.slots.values():
            if fits(slot.total, task.units):
                lacking = [f"{n}={format_amount(n, slot.free.get(n, 0))}"
                           for n, a in sorted(task.units.items()) if slot.free.get(n, 0) < a]
                short.append(f"{slot.agent} has {' '.join(lacking) or 'no whole free GPU'}")
        text = f"needs {format_units(task.units)}; busy: " + "; ".join(short[:3])
        if len(short) > 3:
            text += f"; and {len(short) - 3} more"
        if ahead:
            text += f"; queued behind {ahead} tasks of the same shape"
        return text

    def snapshot(self) -> Iterable[Slot]:
        return (self.slots[k] for k in sorted(self.slots))


def pick_gpus(gpu_free: list[int], amount: int) -> list[int] | None:
    """Choose device positions for AMOUNT GPU units, or None if it cannot fit now."""
    if amount == 0:
        return []
    if amount < UNIT:
        # Pack fractions onto the busiest device that still has room (least stranding).
        best = None
        for pos, free in enumerate(gpu_free):
            if free >= amount and (best is None or free < gpu_free[best]):
                best = pos
        return None if best is None else [best]
    whole = [pos for pos, free in enumerate(gpu_free) if free == UNIT]
    count = amount // UNIT
    return whole[:count] if len(whole) >= count else None


def _per_device(amount: int, ndevices: int) -> int:
    return amount if ndevices == 1 and amount < UNIT else UNIT


def _unused_kinds(slot: Slot, units: Units) -> int:
    return sum(1 for name, total in slot.total.items() if total and name not in units)


def _leftover(slot: Slot, units: Units) -> float:
    return sum((slot.free[name] - amount) / slot.total[name]
               for name, amount in units.items() if slot.total.get(name))
