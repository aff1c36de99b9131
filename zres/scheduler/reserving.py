"""Reservations as the Scheduler makes and ends them: a starving task's slot, or a starving
gang's slots (one per bundle), and the fences they put up in a pass (``reservations``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.resources import Units
from .gangs import Gang
from .records import Slot, Waiting, workers_of
from .reservations import Fence, fence, soonest_slot


def gang_of(task: Waiting) -> Gang | None:
    """The gang TASK (a waiting entry) is, if it is one."""
    tail = task.shape[-1] if task.shape else None
    return tail if type(tail) is Gang else None


class Reserving:
    """Mixed into the ``Scheduler``, whose records it changes."""

    if TYPE_CHECKING:  # (the scheduler's own, used here)
        starvation_after: float
        durations: Any
        table: Any
        gangs: Any
        slots: dict[int, Slot]
        running: dict[int, Any]
        _reserved: set[int]
        _reservation_epoch: int
        _now: float
        _queues: Any

        def _fitting(self, task: Waiting) -> set[int]: ...

    def _held_units(self, slot: Slot, task: Waiting) -> Units:
        """What TASK's reservation of SLOT is for: its request, or its gang's bundle there."""
        gang = gang_of(task)
        return gang.reserved.get(slot.id, task.units) if gang is not None else task.units

    def _held_slots(self, task: Waiting) -> list[int]:
        """The slots TASK holds reserved."""
        gang = gang_of(task)
        if gang is not None:
            return list(gang.reserved)
        return [] if task.reserved_slot is None else [task.reserved_slot]

    def _fence_of(self, slot: Slot, task: Waiting, own: bool = True) -> Fence:
        """What TASK's reservation of SLOT keeps from the tasks after it, now (OWN: from
        its owner's too)."""
        return fence(slot, self._held_units(slot, task), task.id,
                     (self.running[t] for t in slot.running), self.durations, self._now,
                     task.owner, own)

    def _fence(self, task: Waiting, fences: dict[int, Fence], now: float) -> None:
        """Keep a starving task's reserved slots from being taken by tasks after it.

        TASK is blocked in this pass: it starves once it has been blocked for
        ``starvation_after`` seconds, counted from the first pass that found it so."""
        if task.blocked_since is None:
            task.blocked_since = now
        if not self._reserved and now - task.blocked_since < self.starvation_after:
            return  # (most often: nothing is reserved anywhere, and it does not starve)
        held = self._held_slots(task)
        if not held:
            if (now - task.blocked_since < self.starvation_after
                    or task.reserve_failed == self._reservation_epoch):
                return
            gang = gang_of(task)
            if gang is not None:
                chosen = self.gangs.reserve(gang, fences)
            else:
                choice = soonest_slot(task.units, self._fitting(task), self.table, fences,
                                      workers_of(task.shape))
                chosen = None if choice is None else {choice.id: task.units}
            if chosen is None:
                task.reserve_failed = self._reservation_epoch
                return
            for slot_id in chosen:
                self.slots[slot_id].reserved_by = task.id
                self._reserved.add(slot_id)
            if gang is not None:
                gang.reserved = chosen
            else:
                task.reserved_slot = next(iter(chosen))
            held = list(chosen)
        for slot_id in held:
            fence_ = fences.get(slot_id)
            if fence_ is None:
                fences[slot_id] = self._fence_of(self.slots[slot_id], task)
            else:
                fence_.own = True  # (the pass has reached its holder)

    def _drop_fence(self, fences: dict[int, Fence], task: Waiting) -> None:
        """TASK's reservations hold nothing back for the rest of the pass (it starts, or
        waits for its owner's quota)."""
        for slot_id in self._held_slots(task):
            if slot_id in fences and fences[slot_id].holder == task.id:
                del fences[slot_id]

    def _unreserve(self, task: Waiting) -> None:
        if not self._reserved:  # (nothing is reserved anywhere: it holds nothing)
            task.reserved_slot = None
            return
        for slot_id in self._held_slots(task):
            slot = self.slots.get(slot_id)
            if slot is not None and slot.reserved_by == task.id:
                slot.reserved_by = None
                self._reserved.discard(slot.id)
                self.table.gained.add(slot.id)
                self._queues.touched([slot.id])  # (it may take queued grants in this pass)
                self._reservation_epoch += 1
        task.reserved_slot = None
        gang = gang_of(task)
        if gang is not None:
            gang.reserved = {}
