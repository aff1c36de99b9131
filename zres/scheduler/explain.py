"""Why a task is not running yet, in words a user can act on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..core.resources import format_amount, format_units
from .devices import could_ever_fit
from .records import Grant, Slot, Waiting


def _lacking(slot: Slot, units: Mapping[str, int]) -> list[str]:
    """SLOT's free amounts of the names in UNITS that it has too little of."""
    return [f"{n}={format_amount(n, slot.free.get(n, 0))}"
            for n, a in sorted(units.items()) if slot.free.get(n, 0) < a]


def queued_grant(grant: Grant, slot: Slot) -> str:
    """Explain a grant waiting in SLOT's queue for room."""
    ahead = slot.queue.index(grant.task)
    return (f"queued on {slot.agent}, where it starts when room frees (needs "
            f"{format_units(grant.taken)}; {slot.agent} has "
            f"{' '.join(_lacking(slot, grant.taken)) or 'room'} free"
            + (f"; {ahead} queued there before it)" if ahead else ")"))


def waiting_task(task: Waiting, slots: Iterable[Slot], reserved: Slot | None,
                 ahead: int) -> str:
    """Explain a feasible task that fits on none of SLOTS now.

    RESERVED is the slot it holds a reservation on; AHEAD how many tasks of its shape come
    before it.
    """
    short = []
    for slot in sorted(slots, key=lambda s: s.id):
        if not could_ever_fit(slot, task.units):
            continue
        if slot.reserved_by not in (None, task.id):
            short.append(f"{slot.agent} is reserved for task {slot.reserved_by}")
            continue
        free = " ".join(_lacking(slot, task.units)) or "no device with room"
        short.append(f"{slot.agent} has {free} free")
    text = f"needs {format_units(task.units)}; " + "; ".join(short[:3])
    if len(short) > 3:
        text += f"; and {len(short) - 3} more agents busy"
    if reserved is not None:
        text += f"; holds a reservation on {reserved.agent}"
    if ahead:
        text += f"; queued behind {ahead} tasks of the same shape"
    return text
