"""What a node offers: its slots, worked out from detected and declared resources."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.errors import ResourceSpecError
from ..core.limits import MAX_DEVICES, Limits
from ..core.resources import (
    CPU,
    GPU,
    GPU_MEMORY,
    MEMORY,
    UNIT,
    Units,
    format_amount,
    is_bytes,
    token_devices,
)
from ..logs import get_logger
from . import detect as detect_mod
from . import gpu as gpu_mod

log = get_logger("zres.agent")


@dataclass(slots=True)
class SlotSpec:
    """One slot's capacity (changed at run time by ``zres resources``) and devices."""

    units: Units
    gpus: list[str]        # device ids for CUDA_VISIBLE_DEVICES, one per whole GPU
    nthreads: int
    gpu_memory: list[int] = field(default_factory=list)   # units per device, if detected


def plan_slots(declared: Units, nworkers: int, nthreads: int | None,
               detect: bool = True) -> list[SlotSpec]:
    """Work out each slot's capacity: detected CPU, MEMORY, GPU, overridden by DECLARED.

    What a node has, detected or declared, is split between its slots (one per worker), so
    the node is never offered twice over: ``--nworkers 2 --resources "GPU=2 MEMORY=10GB"``
    gives each worker one GPU and 5 GB. A declared amount that does not split into equal
    shares (whole ones, for a whole number) is refused, naming why; bytes split to the
    byte. Device ids are the detected devices', or 0..k-1 for a declared GPU=k on a node
    where none are detected: never more than declared. Per-device tokens (gpu0=1 ...) go
    to one worker each.
    """
    if nworkers < 1:
        raise ResourceSpecError("nworkers must be at least 1")
    if nworkers > Limits().slots:
        raise ResourceSpecError(f"nworkers {nworkers}: more than {Limits().slots}, the most "
                                "slots one agent may offer (the broker's max_slots)")
    cpus, cpus_why = detect_mod.cpus()
    threads = nthreads or max(1, cpus // nworkers)
    tokens = sorted((name for name in declared if token_devices({name: 1})),
                    key=lambda name: int(name[3:]))
    if tokens and GPU in declared:
        raise ResourceSpecError(f"invalid resource spec: declare GPU=k or per-device tokens "
                                f"({', '.join(tokens)}), not both")
    count = _declared_devices(declared)  # (refused before anything is built)
    shares = {name: _split(name, amount, nworkers) for name, amount in declared.items()
              if name not in tokens}
    # Per-device tokens stand for the devices: offering detected GPUs too would offer
    # each device twice.
    devices = gpu_mod.discover() if detect and not tokens else []
    if count is not None and devices and count > len(devices):
        raise ResourceSpecError(f"invalid resource spec 'GPU={count}': this node has "
                                f"{len(devices)} GPU(s)")
    memory, memory_why = detect_mod.memory() if detect else (0, "not detected")
    memory //= nworkers
    slots = []
    for index in range(nworkers):
        units: Units = {CPU: threads * UNIT}
        if memory:
            units[MEMORY] = memory * UNIT
        mine = devices[index::nworkers]
        if count is not None:
            # Each slot gets devices of its own, never the same physical GPU twice.
            per = count // nworkers
            mine = devices[index * per:(index + 1) * per]
            ids = [d.id for d in mine] or [str(index * per + i) for i in range(per)]
        else:
            ids = [d.id for d in mine]
        if ids:
            units[GPU] = len(ids) * UNIT
        gpu_mem = [d.memory * UNIT for d in mine] if GPU_MEMORY not in declared else []
        if sum(gpu_mem):
            units[GPU_MEMORY] = sum(gpu_mem)
        else:
            gpu_mem = []
        units.update((name, share[index]) for name, share in shares.items())
        units.update((name, declared[name]) for name in tokens[index::nworkers])
        if not units.get(GPU):
            units.pop(GPU, None)
            ids, gpu_mem = [], []
        slots.append(SlotSpec(units, ids, threads, gpu_mem))
    # Said once at start (the spec was good): what the node offers by itself, and why.
    log.info("resources_detected", cpu=cpus, cpu_from=cpus_why,
             memory=format_amount(MEMORY, memory * nworkers * UNIT), memory_from=memory_why)
    return slots


def _declared_devices(declared: Units) -> int | None:
    """How many GPUs DECLARED names (None: it names none), checked: whole, and within what
    a slot may hold, before a single device id is made."""
    if GPU not in declared:
        return None
    if declared[GPU] % UNIT:
        raise ResourceSpecError(f"invalid resource spec 'GPU={format_amount(GPU, declared[GPU])}'"
                                ": an agent's GPU must be a whole number of devices")
    count = declared[GPU] // UNIT
    if count > MAX_DEVICES:
        raise ResourceSpecError(f"invalid resource spec 'GPU={count}': more than {MAX_DEVICES} "
                                "devices, the most an agent may offer (zres.core.limits)")
    return count


def _split(name: str, amount: int, parts: int) -> list[int]:
    """AMOUNT of NAME in PARTS equal shares: bytes to the byte (the first shares take what
    is left over), a fraction exactly, a whole number in whole shares; else refused."""
    if is_bytes(name):
        return _bytes_shares(amount, parts)
    share, rest = divmod(amount, parts)
    if rest or (amount % UNIT == 0 and share % UNIT):
        raise ResourceSpecError(
            f"invalid resource spec '{name}={format_amount(name, amount)}': {parts} workers "
            f"cannot share it in equal {'whole ' if amount % UNIT == 0 else ''}shares; "
            f"declare a multiple of {parts}, or fewer workers (what an agent declares is the "
            "node's, split between its workers)")
    return [share] * parts


def _bytes_shares(amount: int, parts: int) -> list[int]:
    """AMOUNT (units of bytes) in PARTS shares of whole bytes, the first ones a byte more."""
    whole, rest = divmod(amount // UNIT, parts)
    shares = [(whole + (1 if i < rest else 0)) * UNIT for i in range(parts)]
    shares[0] += amount % UNIT  # (a fraction of a byte declared: kept, not lost)
    return shares
