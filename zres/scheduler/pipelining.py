"""Where a blocked task may be queued (pipelining), without walking every slot.

A task of a short kind that fits nowhere now may be granted into the queue of a slot that
could run it, if that slot's queue has a free place, no reservation holds the slot, and
what the task needs there is free or held by short tasks (never behind long work). Of
those, the slot with the shortest queue, then the lowest id, takes it.

Walking every slot that could run a shape, once per queued grant, costs O(agents) a
decision; so each shape keeps the set of slots that met those conditions when last
looked at (its candidates), checked again lazily when used. A slot can only come to meet
them by gaining room or a free place in its queue, or by losing a reservation (the events
``touched`` hears), so nothing is missed: a pass builds a heap of (queued, slot id) from a
shape's candidates and takes from it one grant at a time.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from ..core.resources import Units
from .records import Shape, Slot
from .table import SlotTable


class QueueChoice:
    """Each shape's candidate slots for queued grants (see the module's docstring)."""

    def __init__(self, table: SlotTable) -> None:
        self._table = table
        self._candidates: dict[Shape, tuple[Units, set[int]]] = {}

    def forget(self, shape: Shape | None = None) -> None:
        """Drop what is kept of SHAPE (None: of every shape: the slots changed)."""
        if shape is None:
            self._candidates.clear()
        else:
            self._candidates.pop(shape, None)

    def touched(self, slot_ids: Iterable[int]) -> None:
        """SLOT_IDS may have come to take queued grants: look at them again."""
        if not self._candidates:
            return
        slots = self._table.slots
        for slot_id in slot_ids:
            slot = slots.get(slot_id)
            if slot is None:
                continue
            for shape, (units, candidates) in self._candidates.items():
                if self._may_queue(slot, shape, units):
                    candidates.add(slot_id)

    def heap(self, shape: Shape, units: Units, claimed: list[set[int]]
             ) -> list[tuple[int, int]]:
        """The slots a task of SHAPE (asking UNITS) may be queued on now, as a heap of
        (grants queued there, slot id); CLAIMED: slots left to earlier blocked tasks."""
        slots = self._table.slots
        kept = self._candidates.get(shape)
        if kept is None:
            kept = self._candidates[shape] = (units, {
                i for i in self._table.queue_room if self._may_queue(slots[i], shape, units)})
        candidates = kept[1]
        room = []
        for slot_id in list(candidates):
            slot = slots.get(slot_id)
            if slot is None or not self._may_queue(slot, shape, units):
                candidates.discard(slot_id)
            elif not any(slot_id in c for c in claimed):
                room.append((len(slot.queue), slot_id))
        heapq.heapify(room)
        return room

    def _may_queue(self, slot: Slot, shape: Shape, units: Units) -> bool:
        table = self._table
        return (slot.id in table.queue_room and slot.reserved_by is None
                and slot.id in table.fitting(shape, units) and frees_soon(slot, units))


def frees_soon(slot: Slot, units: Units) -> bool:
    """Whether what UNITS needs on SLOT is free or held by short tasks only (queued grants
    are short too): only then is a queue there worth joining, not behind long work."""
    return all(slot.free.get(n, 0) + slot.short_taken.get(n, 0) >= a
               for n, a in units.items())

