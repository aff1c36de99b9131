"""Why a task is not running yet, in words a user can act on."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from ..core.resources import GPU, GPU_MEMORY, Units, format_amount, format_units
from .devices import could_ever_fit
from .records import Grant, Slot, Waiting


def _lacking(slot: Slot, units: Mapping[str, int]) -> list[str]:
    """SLOT's free amounts of the names in UNITS that it has too little of."""
    return [f"{n}={format_amount(n, slot.free.get(n, 0))}"
            for n, a in sorted(units.items()) if slot.free.get(n, 0) < a]


def queued_grant(grant: Grant, slot: Slot, running: Mapping[int, Grant]) -> str:
    """Explain a grant waiting in SLOT's queue for room (RUNNING: every grant by task)."""
    ahead = sum(1 for other in slot.queue if (-running[other].priority, running[other].seq)
                < (-grant.priority, grant.seq))
    lacking = " ".join(_lacking(slot, grant.taken))
    where = (f"{slot.agent} has {lacking} free" if lacking
             else f"room is free on {slot.agent}: it starts now")
    return (f"queued on {slot.agent}, where it starts when room frees (needs "
            f"{format_units(grant.taken)}; {where}"
            + (f"; {ahead} queued there before it)" if ahead else ")"))


def over_quota(task: Waiting, quota: Units, held: Units) -> str:
    """Explain a task that waits for its owner's QUOTA (its owner holds HELD now)."""
    owner = f"owner {task.owner}" if task.owner else "owner (the default key)"
    holds = {n: held.get(n, 0) for n in quota}
    text = (f"waits for its {owner}'s quota: it may hold {format_units(quota)} at once, "
            f"holds {format_units(holds)} and this task needs {format_units(task.units)}; "
            "others' work passes it")
    if any(task.units.get(n, 0) > cap for n, cap in quota.items()):
        text += " (it asks more than the whole quota: it runs only if the quota is raised)"
    return text


def waiting_task(task: Waiting, slots: Iterable[Slot], reserved: Slot | None,
                 ahead: tuple[int, bool], fenced: Callable[[Slot], bool],
                 name: Callable[[int], str]) -> str:
    """Explain a feasible task that fits on none of SLOTS now.

    RESERVED is the slot it holds a reservation on; AHEAD how many tasks of its shape come
    before it, and whether exactly (else about as many); FENCED(slot) whether another
    task's reservation keeps it off SLOT, NAME(id) how to call that task ("task load-3").
    """
    short = []
    for slot in sorted(slots, key=lambda s: s.id):
        if not could_ever_fit(slot, task.units):
            continue
        if slot.reserved_by is not None and fenced(slot):
            short.append(f"{slot.agent} is reserved for {name(slot.reserved_by)}")
        elif not slot.open:
            short.append(f"{slot.agent} takes no new work now (leaving, or not heard from)")
        elif lacking := _lacking(slot, task.units):
            short.append(f"{slot.agent} has {' '.join(lacking)} free")
        elif slot.queue:
            short.append(f"{slot.agent}'s free room is kept for the {len(slot.queue)} "
                         "grants queued there")
        elif task.units.get(GPU) or task.units.get(GPU_MEMORY):
            short.append(f"{slot.agent} has no device with room free")
        else:
            short.append(f"{slot.agent} has room: it is placed at the next pass")
    text = f"needs {format_units(task.units)}; " + "; ".join(short[:3])
    if len(short) > 3:
        text += f"; and {len(short) - 3} more agents busy"
    if reserved is not None:
        text += f"; holds a reservation on {reserved.agent}"
    if ahead[0]:
        text += (f"; queued behind {'' if ahead[1] else 'about '}{ahead[0]:,} tasks of the "
                 "same shape")
    return text
