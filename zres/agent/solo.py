"""Tasks that asked for MEMORY run each in a process of its own (a *solo* process),
limited to what they asked for (``memory``) and stopped alone: past its limit, a task's
process is killed and the task fails with ``MemoryLimitError``, while the tasks of the
slot's pooled process, and every other, run on. The process is started when the task is
handed over and stopped once its result is in (a process costs its start: see README's
*Limits*); a queued grant asking MEMORY is never delegated to a pooled process."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

from ..core import protocol as P
from ..core.resources import MEMORY, UNIT
from .grants import Grant
from .memory.monitor import Monitor, Watched, memory_error
from .workers import Worker, WorkerPool


def is_solo(grant: Grant) -> bool:
    """Whether GRANT runs in a process of its own: its task asked for MEMORY."""
    return grant.taken.get(MEMORY, 0) > 0


def start(pool: WorkerPool, memory: Monitor, grant: Grant, nthreads: int) -> Worker:
    """Start GRANT's own process, watched (and limited) from its first instruction."""
    worker = pool.start(grant.slot, grant.devices, nthreads, solo=grant.task)
    memory.watch(grant.task, worker.proc.pid, grant.taken[MEMORY] // UNIT)
    return worker


def ended(memory: Monitor, worker: Worker, item: list[Any], grant: Grant) -> list[Any]:
    """The result ITEM ([id, outcome, nframes, info]) of WORKER's task (GRANT's), with its
    peak memory; its process, done, is stopped (``retire``). A task whose tree went past
    its limit fails so, whatever it returned (FAILED, no frames, MemoryLimitError's info):
    on cgroup v1 the kernel kills one process (a child the task ran with
    ``subprocess.run``), and the task may end before the monitor kills the rest."""
    unit = memory.forget(worker.task)
    retire(memory, worker)
    if unit is None:
        return item
    if unit.killed:
        agent = str(grant.item[3].get("agent", ""))
        return [item[0], P.FAILED, 0, {**memory_error(unit, f"task {item[0]}", agent),
                                       "peak_memory": unit.peak}]
    return [*item[:3], {**item[3], "peak_memory": unit.peak}]


def retire(memory: Monitor, worker: Worker) -> None:
    """Stop WORKER, a solo process whose task has ended (or never will start there: it was
    cancelled before it was handed over); it is reaped later, quietly."""
    if not worker.retired:
        memory.forget(worker.task)
        worker.retired = True
        if worker.proc.returncode is None:  # (not reaped: its id is still its group's)
            # What it started and left behind goes too, as a job's leftovers do (it leads
            # its own session and group): the watcher stops watching it now (a cgroup's
            # processes were killed with it).
            with contextlib.suppress(OSError):
                os.killpg(worker.proc.pid, signal.SIGKILL)
        worker.proc.kill()


def lost(unit: Watched | None, grant: Grant, cause: str,
         started: bool) -> dict[str, Any] | None:
    """Why GRANT's task failed, its process having died of CAUSE (UNIT: what the monitor
    saw of it, if it was its own): killed for its memory (also before the task began: its
    process alone needs more, and would again), or lost if it had STARTED; None: it never
    began, and runs in a new process, uncharged."""
    if unit is not None and unit.killed:
        agent = str(grant.item[3].get("agent", ""))
        return memory_error(unit, f"task {grant.task}", agent)
    if started:
        return {"type": "WorkerLostError",
                "message": f"the worker process running the task {cause}"}
    return None
