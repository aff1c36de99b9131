"""What the scheduler says of a waiting task: why it waits, in words a user can act on, and
why no agent could ever run a request."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.resources import Units, fits
from . import explain
from .gangs import Gang
from .records import Inside, Slot, Waiting, Workers, workers_of


class Asking:
    """Mixed into the ``Scheduler``, whose records it reads."""

    if TYPE_CHECKING:  # (the scheduler's own, used here)
        table: Any
        gangs: Any
        queue: Any
        owners: Any
        slots: dict[int, Slot]
        running: dict[int, Any]

        @property
        def waiting(self) -> dict[int, Waiting]: ...

        def _fence_of(self, slot: Slot, task: Waiting, own: bool = True) -> Any: ...

        def _expected_end(self, task: Waiting) -> float | None: ...

        def _why_gang(self, task: Waiting, tail: Any, name: Callable[[int], str]) -> str: ...

    def infeasible_reason(self, units: Units, where: Workers | None = None) -> str | None:
        """Say why no registered slot could ever run UNITS (on the agents WHERE names, if
        it may run only there), or None if one could."""
        return self.table.infeasible_reason(units, where)

    def why(self, task_id: int, count_ahead: bool = True,
            name: Callable[[int], str] = lambda task_id: f"task {task_id}") -> str:
        """Say why a waiting task is not running yet; NAME(id) calls another task by name.

        COUNT_AHEAD counts the tasks of its shape before it (a bounded sample of a long
        queue): fine for one question, left out when describing many tasks at once.
        """
        task = self.waiting.get(task_id)
        if task is None:
            grant = self.running.get(task_id)
            if grant is not None and not grant.started:
                return explain.queued_grant(grant, self.slots[grant.slot], self.running)
            return "running" if grant is not None else "not waiting"
        if not self.slots:
            return "no agent has joined the broker yet"
        tail = task.shape[-1] if task.shape else None
        if type(tail) is Gang or type(tail) is Inside:  # (see ``ganging``)
            never = self.gangs.never(tail) if type(tail) is Gang else None
            return f"infeasible: {never}" if never else self._why_gang(task, tail, name)
        where = workers_of(task.shape)
        reason = self.infeasible_reason(task.units, where)
        if reason is not None:
            return f"infeasible: {reason}"
        quota = self.owners.over_quota(task.owner, task.units)
        if quota is not None:
            return explain.over_quota(task, quota, self.owners.held(task.owner))
        ahead = self.queue.ahead(task) if count_ahead else (0, True)
        reserved = self.slots[task.reserved_slot] if task.reserved_slot is not None else None
        slots = self.slots.values() if where is None or where.loose else self.table.named(where)
        return explain.waiting_task(task, slots, reserved, ahead,
                                    lambda slot: self._fenced(task, slot), name)

    def _fenced(self, task: Waiting, slot: Slot) -> bool:
        """Whether another task's reservation of SLOT keeps TASK off it now (TASK fits
        what is free there: else what it lacks says more)."""
        holder = self.waiting.get(slot.reserved_by) if slot.reserved_by is not None else None
        if holder is None or holder is task or not fits(slot.free, task.units) \
                or (task.owner == holder.owner
                    and (-task.priority, task.seq) < (-holder.priority, holder.seq)):
            return False  # it binds other owners, and its owner's tasks after its holder
        return not self._fence_of(slot, holder).admits(slot, task.units,
                                                        self._expected_end(task))
