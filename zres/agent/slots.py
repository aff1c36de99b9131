"""What a node offers: its slots, worked out from detected and declared resources."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.errors import ResourceSpecError
from ..core.resources import (
    CPU,
    GPU,
    GPU_MEMORY,
    MEMORY,
    UNIT,
    Units,
    format_amount,
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

    Declared amounts are offered in full by every slot (as Dask's --resources); detected
    memory and GPUs are split between slots so the node is never offered twice over.
    """
    if nworkers < 1:
        raise ResourceSpecError("nworkers must be at least 1")
    cpus, cpus_why = detect_mod.cpus()
    threads = nthreads or max(1, cpus // nworkers)
    tokens = [name for name in declared if token_devices({name: 1})]
    if tokens and GPU in declared:
        raise ResourceSpecError(f"invalid resource spec: declare GPU=k or per-device tokens "
                                f"({', '.join(tokens)}), not both")
    # Per-device tokens stand for the devices: offering detected GPUs too would offer
    # each device twice.
    devices = gpu_mod.discover() if detect and not tokens else []
    memory, memory_why = detect_mod.memory() if detect else (0, "not detected")
    memory //= nworkers
    if declared.get(GPU, 0) % UNIT:
        raise ResourceSpecError(f"invalid resource spec 'GPU={format_amount(GPU, declared[GPU])}'"
                                ": an agent's GPU must be a whole number of devices")
    slots = []
    for index in range(nworkers):
        units: Units = {CPU: threads * UNIT}
        if memory:
            units[MEMORY] = memory * UNIT
        mine = devices[index::nworkers]
        if GPU in declared:
            # Each slot gets devices of its own, never the same physical GPU twice.
            count = declared[GPU] // UNIT
            if devices and len(devices) < count * nworkers:
                raise ResourceSpecError(
                    f"invalid resource spec 'GPU={count}': {nworkers} worker(s) of {count} "
                    f"GPU(s) need {count * nworkers} devices, this node has {len(devices)}")
            mine = devices[index * count:(index + 1) * count]
            ids = [d.id for d in mine] or [str(index * count + i) for i in range(count)]
        else:
            ids = [d.id for d in mine]
        if ids:
            units[GPU] = len(ids) * UNIT
        gpu_mem = [d.memory * UNIT for d in mine] if GPU_MEMORY not in declared else []
        if sum(gpu_mem):
            units[GPU_MEMORY] = sum(gpu_mem)
        else:
            gpu_mem = []
        units.update(declared)
        if not units.get(GPU):
            units.pop(GPU, None)
            ids, gpu_mem = [], []
        slots.append(SlotSpec(units, ids, threads, gpu_mem))
    # Said once at start (the spec was good): what the node offers by itself, and why.
    log.info("resources_detected", cpu=cpus, cpu_from=cpus_why,
             memory=format_amount(MEMORY, memory * nworkers * UNIT), memory_from=memory_why)
    return slots

