"""Which slot a task takes now: the best of the first few that fit it.

Among slots that fit, the one that strands least: fewest resource kinds the task does not
use (keep GPU nodes for GPU work), then least left over, then slot id. A decision looks
at most at ``CANDIDATES`` fitting slots, taken in the order given (the index's: least room
first of the task's scarcest resource), so it never costs O(agents).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..core.resources import Units, fits
from .devices import pick_devices
from .records import Slot
from .reservations import Fence

CANDIDATES = 8   # fitting slots compared for best fit per decision
Devices = tuple[list[int], list[int], list[int]]   # positions, shares, memory


def best_slot(units: Units, slots: Iterable[Slot], fences: dict[int, Fence],
              end: float | None, only: list[Slot] | None = None, owner: str = ""
              ) -> tuple[tuple[Slot, Devices] | None, bool]:
    """The best of the first few of SLOTS that a task of OWNER asking UNITS fits now, with
    its devices; and whether a fence turned one away (END: when the task would end, for the
    fences; see ``reservations``). SLOTS is ONLY when given: then those that do not fit
    are dropped from it (in a pass, what does not fit now will not fit later).

    On a slot with queued grants, a task takes only what leaves room for all of them:
    its agent may start them any moment."""
    best: tuple[tuple[int, float, int], Slot, Devices] | None = None
    found, fenced = 0, False
    kept: list[Slot] = []
    for index, slot in enumerate(slots):
        if not slot.open:
            continue
        fence = fences.get(slot.id)
        if fence is not None and fence.binds(owner) and not fence.admits(slot, units, end):
            fenced = True
            kept.append(slot)  # (a fence may admit a later task of the shape)
            continue
        if not fits(slot.free, units) or (slot.queue and not all(
                slot.free.get(n, 0) - slot.queued_taken.get(n, 0) >= a
                for n, a in units.items())):
            continue
        devices = pick_devices(slot, units)
        if devices is None:
            continue
        kept.append(slot)
        score = (_unused_kinds(slot, units), _leftover(slot, units), slot.id)
        if best is None or score < best[0]:
            best = (score, slot, devices)
        found += 1
        if found >= CANDIDATES:
            if only is not None:
                kept.extend(only[index + 1:])
            break
    if only is not None:
        only[:] = kept
    return (None if best is None else (best[1], best[2])), fenced


def _unused_kinds(slot: Slot, units: Units) -> int:
    """How many kinds of resource SLOT offers that UNITS does not use (O(len(units)))."""
    return len(slot.total) - sum(1 for name in units if name in slot.total)


def _leftover(slot: Slot, units: Units) -> float:
    return sum((slot.free[name] - amount) / slot.total[name]
               for name, amount in units.items() if slot.total.get(name))
