"""The resource table: every slot's capacity and free amounts, GPUs device by device.

Free amounts change only here (``take``, ``give``, capacity changes), so the index of
slots by free amount never drifts. The table also caches, per request shape, which slots
could ever run it and why none could; both are forgotten whenever a slot is added,
removed or changed. A shape restricted to some agents (``workers=``) is looked up among
their slots alone.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..core.resources import GPU, GPU_MEMORY, UNIT, Units
from .devices import could_ever_fit, infeasible, split_memory
from .index import FreeIndex
from .records import Grant, Shape, Slot, Workers, add_to, shape_of, workers_of

IDLE_SHAPES = 64  # shapes none of whose tasks waits that keep what is cached about them


@dataclass(slots=True)
class NewSlot:
    """A slot to add: GPU in UNITS is how many devices take work; DEVICES (default the
    same) how many the agent has; GPU_MEMORY per device, if known."""

    id: int
    agent: str
    units: Units
    gpu_memory: Sequence[int] | None = None
    devices: int | None = None


class SlotTable:
    """Slots by id, their free amounts, and what is cached about fitting them."""

    def __init__(self, prefetch: int = 0) -> None:
        self.prefetch = prefetch               # grants a slot's queue holds (pipelining)
        self.slots: dict[int, Slot] = {}
        self.capacity: Units = {}              # every slot's total, summed (fair share)
        self.index = FreeIndex()
        self.gained: set[int] = set()      # slots that gained room since the last pass
        self.agents: dict[str, set[int]] = {}  # each agent's slots, by its name
        self.queue_room: set[int] = set()      # slots whose queue has a free place
        self.queue_freed: set[int] = set()     # ... that gained one since the last pass
        self._could_fit: dict[Shape, set[int]] = {}
        self._infeasible: dict[Shape, str | None] = {}
        self._idle: OrderedDict[Shape, None] = OrderedDict()  # none waits now: oldest first
        self.epoch = 0                         # bumps whenever slots change (see changed)

    def add(self, new: Iterable[NewSlot]) -> list[Slot]:
        """Register slots (many at once cost O(n log n), not O(n^2))."""
        added = []
        for spec in new:
            usable = spec.units.get(GPU, 0) // UNIT
            devices = usable if spec.devices is None else spec.devices
            memory = list(spec.gpu_memory) if spec.gpu_memory else split_memory(
                spec.units.get(GPU_MEMORY, 0), usable, devices)
            total = dict(spec.units)
            if sum(memory):
                total[GPU_MEMORY] = sum(memory[:usable])
            slot = Slot(spec.id, spec.agent, total, dict(total), [UNIT] * devices, memory,
                        list(memory), usable)
            self.slots[slot.id] = slot
            add_to(self.capacity, total)
            self.agents.setdefault(slot.agent, set()).add(slot.id)
            if self.prefetch:
                self.queue_room.add(slot.id)
            self.gained.add(slot.id)
            added.append(slot)
        self.index.add_many(added)
        self.changed()
        return added

    def remove(self, slot_ids: Iterable[int]) -> list[Slot]:
        """Forget slots (many at once in one pass over the index)."""
        removed = [self.slots.pop(i) for i in slot_ids]
        for slot in removed:
            add_to(self.capacity, slot.total, -1)
            self.queue_room.discard(slot.id)
            ids = self.agents[slot.agent]
            ids.discard(slot.id)
            if not ids:
                del self.agents[slot.agent]
        self.index.drop_many(removed)
        self.changed()
        return removed

    def check_capacity(self, slot_id: int, units: Units) -> None:
        """Raise ValueError if set_capacity(SLOT_ID, UNITS) would be refused."""
        slot = self.slots[slot_id]
        if units.get(GPU, 0) % UNIT:
            raise ValueError("GPU must be a whole number of devices")
        if units.get(GPU, 0) // UNIT > len(slot.gpu_free):
            raise ValueError(f"it has only {len(slot.gpu_free)} GPU device(s)")
        if GPU_MEMORY in units and units[GPU_MEMORY] != slot.total.get(GPU_MEMORY, 0):
            raise ValueError("GPU_MEMORY comes from the devices and cannot be changed")

    def set_capacity(self, slot_id: int, units: Units) -> None:
        """Change a slot's capacity; work in use above the new amounts finishes normally."""
        self.check_capacity(slot_id, units)
        slot = self.slots[slot_id]
        devices = units.get(GPU, 0) // UNIT
        new = dict(units)
        if sum(slot.gpu_mem_total):
            new[GPU_MEMORY] = sum(slot.gpu_mem_total[:devices])
        for name in set(slot.total) | set(new):
            delta = new.get(name, 0) - slot.total.get(name, 0)
            if delta:
                self.index.set(slot, name, slot.free.get(name, 0) + delta)
        add_to(self.capacity, slot.total, -1)
        slot.total = {n: a for n, a in new.items() if a}
        add_to(self.capacity, slot.total)
        slot.gpu_usable = devices
        self.gained.add(slot.id)
        self.changed()

    def set_open(self, slot_id: int, open_: bool) -> None:
        slot = self.slots[slot_id]
        if slot.open != open_:
            slot.open = open_
            if open_:
                self.gained.add(slot_id)
            self._could_fit.clear()

    def take(self, slot: Slot, grant: Grant) -> None:
        """GRANT's resources are in use on SLOT from now."""
        for name, amount in grant.taken.items():
            self.index.set(slot, name, slot.free.get(name, 0) - amount)
        for pos, share, mem in zip(grant.gpus, grant.shares, grant.memory):
            slot.gpu_free[pos] -= share
            slot.gpu_mem_free[pos] -= mem

    def queue(self, slot: Slot, grant: Grant) -> None:
        """GRANT waits in SLOT's queue (pipelining): its agent starts it when room frees."""
        slot.queue[grant.task] = None
        self.index.queued(slot, grant.taken, 1)
        if len(slot.queue) >= self.prefetch:
            self.queue_room.discard(slot.id)

    def unqueue(self, slot: Slot, grant: Grant) -> None:
        """GRANT, queued on SLOT, is gone unstarted (given back, or cancelled)."""
        del slot.queue[grant.task]
        if not slot.bundles:  # (a slot holding a gang's bundle takes no queued grants)
            self.queue_room.add(slot.id)
        self.index.queued(slot, grant.taken, -1)
        self.gained.add(slot.id)

    def start_queued(self, slot: Slot, grant: Grant) -> None:
        """GRANT, queued on SLOT (no GPUs), has started: what its queue kept for it is in
        use now. Its room is unchanged, and so is the index."""
        del slot.queue[grant.task]
        if not slot.bundles:
            self.queue_room.add(slot.id)
            self.queue_freed.add(slot.id)
        for name, amount in grant.taken.items():
            slot.free[name] -= amount
        add_to(slot.queued_taken, grant.taken, -1)

    def give(self, slot: Slot, grant: Grant) -> None:
        """GRANT's resources are free again on SLOT."""
        for name, amount in grant.taken.items():
            self.index.set(slot, name, slot.free.get(name, 0) + amount)
        for pos, share, mem in zip(grant.gpus, grant.shares, grant.memory):
            slot.gpu_free[pos] += share
            slot.gpu_mem_free[pos] += mem
        self.gained.add(slot.id)

    def changed(self) -> None:
        """A slot was added, removed or resized: what was cached may be wrong now."""
        self.epoch += 1
        self._infeasible.clear()
        self._could_fit.clear()
        self._idle.clear()

    def forget_shape(self, shape: Shape) -> None:
        """No task of SHAPE waits any more. What is cached about it stays for a while: a
        loop's sequential tasks are each the only one of their shape, and working it out
        again for each was a tenth of the broker's time on a submit. Only the last
        ``IDLE_SHAPES`` such shapes keep it (a million distinct shapes pile up nothing)."""
        self._idle[shape] = None
        self._idle.move_to_end(shape)
        if len(self._idle) > IDLE_SHAPES:
            old, _ = self._idle.popitem(last=False)
            self._infeasible.pop(old, None)
            self._could_fit.pop(old, None)

    def named(self, where: Workers) -> list[Slot]:
        """The slots of the agents WHERE names, by id."""
        return [self.slots[i] for i in sorted(i for name in where.names
                                               for i in self.agents.get(name, ()))]

    def fitting(self, shape: Shape, units: Units) -> set[int]:
        """Ids of the open slots whose total capacity could ever run UNITS (of SHAPE), on
        the agents it may run on."""
        ids = self._could_fit.get(shape)
        if ids is None:
            where = workers_of(shape)
            slots = self.slots.values() if where is None or where.loose else self.named(where)
            ids = self._could_fit[shape] = {
                slot.id for slot in slots if slot.open and could_ever_fit(slot, units)}
        return ids

    def infeasible_reason(self, units: Units, where: Workers | None = None) -> str | None:
        """Say why no registered slot (of the agents WHERE names, unless it only prefers
        them) could ever run UNITS, or None if one could."""
        if not self.slots:
            return None  # nothing has joined yet: that is waiting, not infeasible
        shape = shape_of(units, where)
        if shape not in self._infeasible:
            self._infeasible[shape] = self._never(units, where)
        return self._infeasible[shape]

    def _never(self, units: Units, where: Workers | None) -> str | None:
        if where is None or where.loose:
            return infeasible(self.slots.values(), units)
        names = sorted(where.names)
        listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3
                                         else "")
        slots = self.named(where)
        if not slots:
            return (f"no agent named {listed} has joined" if len(names) == 1 else
                    f"none of the agents it may run on ({listed}) has joined")
        reason = infeasible(slots, units)
        return None if reason is None else f"{reason} (it may run only on {listed})"

    def candidates(self, units: Units) -> Iterable[Slot]:
        """Slots that may fit UNITS, scarcest resource first, least free first."""
        if not units:
            return [self.slots[k] for k in sorted(self.slots)]
        ids = self.index.candidates(units)
        return () if ids is None else (self.slots[i] for i in ids)
