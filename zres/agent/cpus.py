"""Binding tasks to cores (``zres agent --bind-cpus``, off by default), as Slurm's cpusets do:
a task asking ``CPU=k`` runs on k cores of its own (a fraction rounds up) among its slot's
share of the agent's CPU affinity set, the least busy ones first; ``get_task_context().cpus``
says which. A Python task's thread is bound (what it starts inherits it: its subprocesses,
the threads of a library it imports); a command job's process group is. Cores are taken as
a task is handed over and given back as it ends, so with binding the agent starts a slot's
queued grants itself (none is handed to a pooled process ahead of time)."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator

from ..core.resources import UNIT


class CoreBinder:
    """The cores of each of NSLOTS slots, and which tasks are bound to which."""

    def __init__(self, nslots: int, cores: list[int] | None = None) -> None:
        found = sorted(cores if cores is not None else os.sched_getaffinity(0))
        share = max(1, len(found) // nslots)
        # Slot i gets its own run of cores; with more slots than cores, they share.
        self.cores = [found[(i * share) % len(found):][:share] or found[:share]
                      for i in range(nslots)]
        self._load: dict[int, int] = {core: 0 for core in found}
        self._bound: dict[int, list[int]] = {}

    def take(self, slot: int, task_id: int, cpu: int) -> list[int]:
        """Bind TASK_ID on SLOT, asking CPU units, to its cores; return them (none for a
        task asking no CPU)."""
        count = min(math.ceil(cpu / UNIT), len(self.cores[slot]))
        if count <= 0:
            return []
        chosen = sorted(sorted(self.cores[slot], key=lambda c: (self._load[c], c))[:count])
        for core in chosen:
            self._load[core] += 1
        self._bound[task_id] = chosen
        return chosen

    def give(self, task_id: int) -> None:
        """TASK_ID has ended: its cores are free for others."""
        for core in self._bound.pop(task_id, ()):
            self._load[core] -= 1


@contextlib.contextmanager
def born_on(cores: list[int]) -> Iterator[None]:
    """Run the block with this thread bound to CORES (none: as it is), then as before: a
    process started in it is born on them, and so is what it starts at once (binding it
    after its start would miss what it started meanwhile)."""
    before = os.sched_getaffinity(0) if cores else None
    if cores:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cores)  # (0: this thread alone, on Linux)
    try:
        yield
    finally:
        if before is not None:
            os.sched_setaffinity(0, before)
