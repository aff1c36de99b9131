"""GPUs per device, and whether a request could ever fit a slot.

A slot's GPUs are accounted device by device: GPU=k (whole) takes k wholly free devices with
all their memory; a fraction below 1 packs onto the busiest device with room, never
spanning two; GPU_MEMORY=m takes m bytes on one device.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from ..core.resources import GPU, GPU_MEMORY, UNIT, Units, fits, format_amount, format_units
from .records import Slot


def pick_devices(slot: Slot, units: Mapping[str, int]) -> tuple[list[int], list[int],
                                                                  list[int]] | None:
    """Choose devices for a request: (positions, shares, memory), or None if none fit now."""
    amount, memory = units.get(GPU, 0), units.get(GPU_MEMORY, 0)
    if not amount and not memory:
        return [], [], []
    usable = range(slot.gpu_usable)
    if amount >= UNIT:
        whole = [p for p in usable if slot.gpu_free[p] == UNIT
                 and slot.gpu_mem_free[p] == slot.gpu_mem_total[p]]
        count = amount // UNIT
        chosen = whole[:count]
        if len(chosen) < count or sum(slot.gpu_mem_total[p] for p in chosen) < memory:
            return None
        return chosen, [UNIT] * count, [slot.gpu_mem_total[p] for p in chosen]
    # A fraction, or memory alone: one device, the fullest one that still has room.
    best = None
    for pos in usable:
        share, mem = slot.gpu_free[pos], slot.gpu_mem_free[pos]
        if share < max(amount, 1) or mem < memory:
            continue
        key = (mem if not amount else share, pos)
        if best is None or key < best:
            best = key
    if best is None:
        return None
    return [best[1]], [amount], [memory]


def devices_at(slot: Slot, units: Mapping[str, int],
               positions: list[int]) -> tuple[list[int], list[int], list[int]] | None:
    """The devices a request holds at POSITIONS, as ``pick_devices`` would have chosen
    them: (positions, shares, memory), or None if they are not free for it now."""
    amount, memory = units.get(GPU, 0), units.get(GPU_MEMORY, 0)
    if not amount and not memory:
        return ([], [], []) if not positions else None
    if any(not 0 <= p < slot.gpu_usable for p in positions) \
            or len(set(positions)) != len(positions):
        return None
    if amount >= UNIT:
        if len(positions) != amount // UNIT or not all(
                slot.gpu_free[p] == UNIT and slot.gpu_mem_free[p] == slot.gpu_mem_total[p]
                for p in positions):
            return None
        return list(positions), [UNIT] * len(positions), [slot.gpu_mem_total[p]
                                                          for p in positions]
    if len(positions) != 1 or slot.gpu_free[positions[0]] < max(amount, 1) \
            or slot.gpu_mem_free[positions[0]] < memory:
        return None
    return list(positions), [amount], [memory]


def taken_by(units: Units, shares: list[int], memory: list[int]) -> Units:
    """What a grant of UNITS takes from its slot, given the compute SHARES and MEMORY it
    takes per device: a whole GPU takes all of its device's memory too."""
    taken = dict(units)
    if shares:
        taken[GPU] = sum(shares)
        if sum(memory):
            taken[GPU_MEMORY] = sum(memory)
    return taken


def could_ever_fit(slot: Slot, units: Units) -> bool:
    """Return whether SLOT, with nothing running, could run UNITS."""
    if not fits(slot.total, units):
        return False
    fresh = Slot(slot.id, slot.agent, slot.total, slot.total, [UNIT] * len(slot.gpu_free),
                 slot.gpu_mem_total, slot.gpu_mem_total, slot.gpu_usable)
    return pick_devices(fresh, units) is not None


def split_memory(total: int, usable: int, devices: int) -> list[int]:
    """Split a declared GPU_MEMORY total evenly over the USABLE devices (of DEVICES)."""
    if not usable:
        return [0] * devices
    return [total // usable] * devices


def infeasible(slots: Collection[Slot], units: Units) -> str | None:
    """Say why none of SLOTS could ever run UNITS, or None if one could."""
    if any(could_ever_fit(slot, units) for slot in slots):
        return None
    for name, amount in sorted(units.items()):
        largest = max((s.total.get(name, 0) for s in slots
                       if name in s.total), default=None)
        if largest is None:
            return f"no agent offers {name}"
        if largest < amount:
            return (f"needs {name}={format_amount(name, amount)}, largest agent has "
                    f"{name}={format_amount(name, largest)}")
    if GPU_MEMORY in units:
        return (f"needs GPU_MEMORY={format_amount(GPU_MEMORY, units[GPU_MEMORY])} on one "
                "device, no agent has a device that large")
    return f"no single agent offers {format_units(units)} together"
