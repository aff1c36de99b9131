"""Slots sorted by room, one index per resource name, for O(log n) candidate lookup.

A slot's *room* in a resource is what is free there less what the grants queued there
(pipelining) will take: what a new grant may take at once. Indexing room, not what is
free, keeps a decision from walking slots whose free amounts are all promised to their
queues (with many agents, most of them)."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from ..core.resources import Units
from .records import Slot


class FreeIndex:
    """For each resource name, the slots offering it as a sorted list of (room, slot id).

    Every change to a slot's free or queued amounts goes through ``set`` or ``queued``, so
    the index never drifts.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, list[tuple[int, int]]] = {}

    def set(self, slot: Slot, name: str, amount: int) -> None:
        """Set SLOT's free NAME to AMOUNT, in the slot and in the index."""
        queued = slot.queued_taken.get(name, 0)
        if name in slot.free:
            self._remove(name, slot.free[name] - queued, slot.id)
        slot.free[name] = amount
        bisect.insort(self._by_name.setdefault(name, []), (amount - queued, slot.id))

    def queued(self, slot: Slot, amounts: Units, sign: int) -> None:
        """Add (SIGN 1) or take away (-1) AMOUNTS to what SLOT's queued grants will take."""
        for name, amount in amounts.items():
            queued = slot.queued_taken.get(name, 0)
            free = slot.free[name]  # (a queued grant fits the slot: it offers NAME)
            index = self._by_name[name]
            del index[bisect.bisect_left(index, (free - queued, slot.id))]
            queued += sign * amount
            if queued:
                slot.queued_taken[name] = queued
            else:
                slot.queued_taken.pop(name, None)
            bisect.insort(index, (free - queued, slot.id))

    def add_many(self, slots: list[Slot]) -> None:
        """Index new SLOTS (their free amounts set already, nothing queued): one sort per
        name touched."""
        touched = set()
        for slot in slots:
            for name, amount in slot.free.items():
                self._by_name.setdefault(name, []).append((amount, slot.id))
                touched.add(name)
        for name in touched:
            self._by_name[name].sort()

    def drop_many(self, slots: list[Slot]) -> None:
        """Forget every amount SLOTS offer (they are leaving): one pass per name touched."""
        if len(slots) == 1:
            queued = slots[0].queued_taken
            for name, amount in slots[0].free.items():
                self._remove(name, amount - queued.get(name, 0), slots[0].id)
            return
        ids = {slot.id for slot in slots}
        for name in {name for slot in slots for name in slot.free}:
            kept = [entry for entry in self._by_name[name] if entry[1] not in ids]
            if kept:
                self._by_name[name] = kept
            else:
                del self._by_name[name]

    def _remove(self, name: str, amount: int, slot_id: int) -> None:
        index = self._by_name[name]
        del index[bisect.bisect_left(index, (amount, slot_id))]
        if not index:
            del self._by_name[name]

    def offering(self, name: str) -> int:
        """How many slots offer NAME."""
        return len(self._by_name.get(name, ()))

    def candidates(self, units: Units) -> Iterator[int] | None:
        """Ids of the slots with room enough of UNITS' scarcest name, least room first.

        None when some name is offered nowhere. Indexing, not slicing: a decision must not
        copy the whole index.
        """
        pivot: tuple[list[tuple[int, int]], int] | None = None
        for name, amount in units.items():
            index = self._by_name.get(name)
            if not index:
                return None
            start = bisect.bisect_left(index, (amount, -1))
            if pivot is None or len(index) - start < len(pivot[0]) - pivot[1]:
                pivot = (index, start)
        assert pivot is not None, "units must not be empty"
        index, start = pivot
        return (index[i][1] for i in range(start, len(index)))

    def with_room(self, name: str, amount: int) -> int:
        """How many slots have room for AMOUNT of NAME (O(log n))."""
        index = self._by_name.get(name, [])
        return len(index) - bisect.bisect_left(index, (amount, -1))

    def most_free(self, name: str) -> Iterator[int]:
        """Ids of the slots offering NAME, most room first."""
        index = self._by_name.get(name, [])
        return (index[i][1] for i in range(len(index) - 1, -1, -1))
