"""Short tasks that turn out long: their slots stop counting them as short, and the grants
queued behind them that could no longer be queued there are to be given back (pipelining).

A grant is queued on a slot only where what it needs is free or held by short tasks
(``pipelining.frees_soon``): a task of a short kind is expected to end within milliseconds.
One that has run ``LONG_AFTER`` (ten times the short threshold: past scheduling jitter and a
garbage collection's pause, and far past what its kind's record promised: its end alone
would make its kind long) is taken to be long from then on: its hold no longer counts as
short, so nothing new is queued behind it, and of the grants queued on its slot, those that
would not be queued there now, and that another slot could run, are named for recall (the
broker asks its agent to give back those that have not begun; the agent's answer, not
this, takes them off the slot). Each is named once, when the task turns long: a slot that
joins later finds them still queued (left out: looking again as slots join). Every short
grant that starts is noted once in a heap by when it would turn long, and each look pops
only what is due: O(log n) a task, never a walk of what runs.
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, Any

from .durations import SHORT_TASK
from .pipelining import frees_soon
from .records import Grant, Slot, add_to, shape_of

LONG_AFTER = 10 * SHORT_TASK  # seconds a short task runs before it is taken to be long


class Stragglers:
    """Mixed into the ``Scheduler``, whose records it changes."""

    if TYPE_CHECKING:  # (the scheduler's own, used here)
        slots: dict[int, Slot]
        running: dict[int, Grant]
        table: Any

    def _init_stragglers(self) -> None:
        self._turning: list[tuple[float, int, Grant]] = []  # (when long, tie-break, grant)
        self._tie = itertools.count()

    def _note_short(self, grant: Grant) -> None:
        """GRANT, of a short kind, started (at ``grant.since``): watch how long it runs."""
        heapq.heappush(self._turning, (grant.since + LONG_AFTER, next(self._tie), grant))

    def overdue(self, now: float) -> dict[int, list[int]]:
        """Take every short task that has run LONG_AFTER by NOW to be long; return, by slot,
        the grants queued there that would no longer be queued behind what runs (to be
        recalled: they stay queued until their agent gives them back, or starts them)."""
        recall: dict[int, list[int]] = {}
        turning = self._turning
        while turning and turning[0][0] <= now:
            _, _, grant = heapq.heappop(turning)
            slot = self.slots.get(grant.slot)
            if self.running.get(grant.task) is not grant or not grant.short or slot is None:
                continue  # it ended (or its slot went) in time
            grant.short = False
            add_to(slot.short_taken, grant.taken, -1)
            if slot.queue:
                recall[slot.id] = [t for t in slot.queue if self._elsewhere(slot, t)]
        return {s: ids for s, ids in recall.items() if ids}

    def _elsewhere(self, slot: Slot, task_id: int) -> bool:
        """Whether TASK_ID, queued on SLOT, would not be queued there now and another open
        slot could run it, of the agents it may run on (with none, it is no sooner started
        given back: it waits here)."""
        grant = self.running[task_id]
        if frees_soon(slot, grant.taken):
            return False
        could = self.table.fitting(shape_of(grant.units, grant.where), grant.units)
        return len(could) > (slot.id in could)  # (not a copy of a set of every slot)
