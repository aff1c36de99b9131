"""Slots sorted by free amount, one index per resource name, for O(log n) candidate lookup."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from ..core.resources import Units
from .records import Slot


class FreeIndex:
    """For each resource name, the slots offering it as a sorted list of (free, slot id).

    Every change to a slot's free amounts goes through ``set`` so the index never drifts.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, list[tuple[int, int]]] = {}

    def set(self, slot: Slot, name: str, amount: int) -> None:
        """Set SLOT's free NAME to AMOUNT, in the slot and in the index."""
        if name in slot.free:
            self._remove(name, slot.free[name], slot.id)
        slot.free[name] = amount
        bisect.insort(self._by_name.setdefault(name, []), (amount, slot.id))

    def add_many(self, slots: list[Slot]) -> None:
        """Index new SLOTS (their free amounts set already): one sort per name touched."""
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
            for name, amount in slots[0].free.items():
                self._remove(name, amount, slots[0].id)
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
        """Ids of the slots with enough of UNITS' scarcest name, least free first.

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

    def most_free(self, name: str) -> Iterator[int]:
        """Ids of the slots offering NAME, most free first."""
        index = self._by_name.get(name, [])
        return (index[i][1] for i in range(len(index) - 1, -1, -1))
