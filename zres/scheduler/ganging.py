"""Gangs as the Scheduler takes them: queued, placed all at once in a pass, let go of, and
taken back after a broker restart; the tasks placed in their bundles; and why each waits.
(The records and the bundles' books are ``gangs``'; where bundles go, ``gang_fit``'s.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.resources import Units, fits, format_units
from . import explain
from .devices import devices_at, taken_by
from .fit import best_slot
from .gangs import Gang
from .records import Grant, Inside, Slot, Waiting
from .reservations import Fence


class Ganging:
    """Mixed into the ``Scheduler``, whose records it changes."""

    if TYPE_CHECKING:  # (the scheduler's own, used here)
        gangs: Any
        queue: Any
        owners: Any
        table: Any
        slots: dict[int, Slot]
        running: dict[int, Grant]
        _changed: bool
        _now: float
        _gains: bool

        @property
        def waiting(self) -> dict[int, Waiting]: ...

        def _charge(self, grant: Grant) -> None: ...
        def _unreserve(self, task: Waiting) -> None: ...
        def _drop_fence(self, fences: dict[int, Fence], task: Waiting) -> None: ...
        def _fence(self, task: Waiting, fences: dict[int, Fence], now: float) -> None: ...

    def add_gang(self, gang_id: int, bundles: list[Units], strategy: str, ids: list[int],
                 priority: int = 0, owner: str = "", adopting: bool = False) -> None:
        """Queue gang GANG_ID of OWNER: BUNDLES (each a request), placed by STRATEGY
        (``gang_fit.STRATEGIES``) all at once, as grants of ids IDS; ValueError if the
        gang is malformed. Tasks are placed in its bundles with ``enqueue(...,
        where=Inside(GANG_ID, index), queueable=False)``. ADOPTING: it was placed before
        a broker restart, and is not queued: its bundles are taken back where they were
        (``adopt_bundle``), never placed anew meanwhile (elsewhere, away from the work
        that runs in them); one lost queues it again, whole (``remove_gang``)."""
        gang = self.gangs.add(gang_id, bundles, strategy, ids)
        gang.owner, gang.priority = owner, priority
        self._changed = True
        if not adopting:
            self.queue.add(gang_id, gang.total, priority, False, None, gang, owner)

    def gang(self, gang_id: int) -> Gang | None:
        """The gang GANG_ID, queued or placed."""
        return self.gangs.gangs.get(gang_id)

    def remove_gang(self, gang_id: int, requeue: bool = False,
                    now: float | None = None) -> None:
        """Let gang GANG_ID go: out of the queue, or its bundles given back (the tasks
        running inside keep what they took until they end, as grants of their own; NOW,
        default the latest pass's time, ends the owner's charge for the bundles).
        REQUEUE: queue it again as a whole (one of its bundles was lost). Tasks waiting
        for its bundles are the caller's to dequeue."""
        gang = self.gangs.gangs.get(gang_id)
        if gang is None:
            return
        waiting = self.queue.remove(gang_id)
        if waiting is not None:
            self._unreserve(waiting)
        released, kept = self.gangs.unplace(gang)
        at = self._now if now is None else now
        for grant in released:
            self.owners.give(grant.owner, grant.units, grant.weight, at)
        for grant in kept:
            self._charge(grant)
        self._changed = True
        del self.gangs.gangs[gang_id]
        if requeue and waiting is None:
            self.add_gang(gang_id, gang.bundles, gang.strategy, gang.ids, gang.priority,
                          gang.owner)

    def gang_infeasible(self, gang_id: int) -> str | None:
        """Why no registered agents could ever hold gang GANG_ID, or None if they could."""
        gang = self.gangs.gangs.get(gang_id)
        return None if gang is None else self.gangs.never(gang)

    def granted_on(self, slot_id: int) -> set[int]:
        """Every grant on SLOT_ID, started or queued, and those inside its bundles."""
        slot = self.slots[slot_id]
        return {*slot.running, *slot.queue, *self.gangs.on_slot(slot_id)}

    def _place_gang(self, task: Waiting, tail: Gang | Inside, fences: dict[int, Fence],
                    grants: list[Grant], now: float) -> bool:
        """Decide on TASK, a gang or a task inside a bundle, in a pass; True if granted."""
        if type(tail) is Inside:
            grant = self.gangs.inside(task.id, task.units, tail, task.priority, task.seq,
                                      now, task.owner)
            if grant is None:
                return False  # (its gang is not placed, or its bundle is full: it waits)
            self.queue.take(task)
            grants.append(grant)
            return True
        assert type(tail) is Gang
        if self.owners.capped and self.owners.over_quota(task.owner, task.units) is not None:
            if fences:
                self._drop_fence(fences, task)
            self._unreserve(task)
            return False
        # A gang that did not fit, no fence in the way, can fit now only if a slot gained
        # room since: no trial until then (a fence may lift with no room gained).
        made = self.gangs.place(tail, fences, task.owner, task.priority, task.seq, now) \
            if self._gains or not tail.blocked else None
        tail.blocked = made is None and not fences
        if made is None:
            self._fence(task, fences, now)
            return False
        self.queue.take(task)
        if fences:
            self._drop_fence(fences, task)
        self._unreserve(task)
        for grant in made:
            self._charge(grant)
        grants.extend(made)
        self._changed = True  # (tasks waiting inside its bundles may start next pass)
        return True

    # -- a restarted broker takes gangs back ------------------------------------------
    def adopt_bundle(self, gang_id: int, index: int, slot_id: int,
                     positions: list[int]) -> bool:
        """Take bundle INDEX of gang GANG_ID (added, not placed yet) back on SLOT_ID, GPU
        POSITIONS: it was placed there before a broker restart. False if it is not free
        for it there."""
        gang = self.gangs.gangs.get(gang_id)
        slot = self.slots.get(slot_id)
        if gang is None or slot is None or (gang.placed and gang.placed[index] is not None):
            return False
        units = gang.bundles[index]
        devices = devices_at(slot, units, positions)
        if devices is None or not fits(slot.free, units):
            return False
        waiting = self.queue.remove(gang_id)
        if waiting is not None:
            self._unreserve(waiting)
        gpus, shares, memory = devices
        grant = Grant(gang.ids[index], slot_id, units, gpus, taken_by(units, shares, memory),
                      shares, memory, priority=gang.priority, short=False, since=self._now,
                      owner=gang.owner, bundle=(gang_id, index))
        self.table.take(slot, grant)
        self.gangs.adopt(gang, index, slot, grant)
        self._charge(grant)
        self._changed = True
        return True

    def adopt_inside(self, task_id: int, gang_id: int, index: int, units: Units,
                     positions: list[int], priority: int = 0, owner: str = "") -> bool:
        """Take TASK_ID back inside bundle INDEX of gang GANG_ID (taken back already), on
        GPU POSITIONS: it ran there before a broker restart. False if it cannot."""
        if task_id in self.running:
            return False
        grant = self.gangs.inside(task_id, units, Inside(gang_id, index), priority, 0,
                                  self._now, owner, at=positions)
        if grant is not None:
            self._changed = True
        return grant is not None

    # -- why -------------------------------------------------------------------------------
    def _why_gang(self, task: Waiting, tail: Gang | Inside, name: Callable[[int], str]) -> str:
        """Why TASK, a gang or a task inside a bundle, waits (it is feasible)."""
        if type(tail) is Inside:
            gang = self.gangs.gangs.get(tail.gang)
            bundle = gang.placed[tail.index] if gang is not None and gang.placed else None
            if bundle is None:
                return f"waits for {name(tail.gang)} to be placed (it runs in its bundle " \
                       f"{tail.index})"
            space = bundle.space
            lacking = [f"{n}={format_units({n: space.free.get(n, 0)})[len(n) + 1:]}"
                       for n, a in sorted(task.units.items()) if space.free.get(n, 0) < a]
            return (f"waits for room in bundle {tail.index} of {name(tail.gang)} on "
                    f"{space.agent}: it has {' '.join(lacking) or 'no device'} free, it needs "
                    f"{format_units(task.units)}")
        assert type(tail) is Gang
        quota = self.owners.over_quota(task.owner, task.units)
        if quota is not None:
            return explain.over_quota(task, quota, self.owners.held(task.owner))
        fitting = sum(1 for units in tail.bundles
                      if best_slot(units, self.table.candidates(units), {}, None)[0])
        count = len(tail.bundles)
        text = (f"its {count} bundles ({tail.strategy}) are reserved all at once, and not "
                f"all fit now: {fitting} of them would fit on their own")
        if tail.reserved:
            agents = sorted({self.slots[s].agent for s in tail.reserved})
            text += f"; it has reserved {', '.join(agents)} (it waited long enough)"
        return text
