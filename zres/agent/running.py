"""Running granted tasks on a node's slots, and starting queued grants as room frees.

Each slot counts what runs there as the broker granted it (``used``), and keeps the grants
the broker queued on it (pipelining) in order; the head starts when it fits beside what
runs, the rule the broker applies to the same events, so both agree on what has started.
While one worker process runs everything a slot runs, the agent hands it the queue's
head (``delegated``), and that process starts them itself with no round trip.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from ..core import protocol as P
from ..core.resources import Units
from .slots import SlotSpec
from .workers import Worker, WorkerPool, exit_cause, kill

log = structlog.get_logger("zres.agent")

# A grant waiting for room: task id, taken units, devices, RUN item, payload frames.
QueuedGrant = tuple[int, Units, tuple[str, ...], list[Any], list[Any]]
Report = Callable[[int, str, list[Any], dict[str, Any]], None]


@dataclass(slots=True)
class SlotState:
    """What runs on one slot now, and the grants waiting for room there, in order."""

    spec: SlotSpec
    used: dict[str, int] = field(default_factory=dict)   # the broker's grants, as taken
    queue: deque[QueuedGrant] = field(default_factory=deque)
    # The queue's head, handed to the one worker process that runs everything this slot
    # runs; kept here until they start, to queue them again if that process dies.
    delegated: dict[int, QueuedGrant] = field(default_factory=dict)
    delegate: Worker | None = None
    cancelling: set[int] = field(default_factory=set)  # delegated, cancel sent, not answered

    def fits(self, taken: Units) -> bool:
        return all(self.spec.units.get(n, 0) - self.used.get(n, 0) >= a
                   for n, a in taken.items())


class TaskRunner:
    """The node's slots, the tasks running on them and the grants queued there.

    REPORT(id, outcome, frames, info) sends an outcome to the broker.
    """

    def __init__(self, specs: list[SlotSpec], pool: WorkerPool, report: Report) -> None:
        self.slots = [SlotState(spec) for spec in specs]
        self._pool = pool
        self._report_to_broker = report
        self.task_worker: dict[int, Worker] = {}
        self.held: dict[int, tuple[int, Units]] = {}   # task or actor placement -> slot, taken

    # -- grants -------------------------------------------------------------------------
    def hold(self, slot: int, task_id: int, taken: Units) -> None:
        """Count TAKEN as in use on SLOT, for TASK_ID (a task, or an actor's placement)."""
        used = self.slots[slot].used
        for name, amount in taken.items():
            used[name] = used.get(name, 0) + amount
        self.held[task_id] = (slot, taken)

    def free(self, task_id: int) -> None:
        """TASK_ID has ended here: return what it took and start what now fits."""
        held = self.held.pop(task_id, None)
        if held is None:
            return
        slot, taken = held
        used = self.slots[slot].used
        for name, amount in taken.items():
            used[name] -= amount
        self.start_queued(slot)

    def queue(self, slot: int, grant: QueuedGrant) -> None:
        """Queue GRANT on SLOT behind the grants there; it starts when it fits."""
        self.slots[slot].queue.append(grant)
        self.start_queued(slot)

    def start_queued(self, slot: int) -> None:
        """Start SLOT's queued grants in order while the head fits (the broker's rule)."""
        state = self.slots[slot]
        if state.delegated:
            return  # ahead of the rest; the worker holding them starts them
        while state.queue and state.fits(state.queue[0][1]):
            task_id, taken, devices, item, frames = state.queue.popleft()
            self.hold(slot, task_id, taken)
            self.run(slot, devices, item, frames)
        while state.queue:
            worker = self._delegate_to(slot, state.queue[0][2])
            if worker is None:
                return
            entry = state.queue.popleft()
            task_id, taken, _, item, frames = entry
            state.delegated[task_id] = entry
            state.delegate = worker
            self._pool.send(worker, [item[0], item[1], item[2],
                                     {**item[3], "taken": taken, "queued": True}], frames)

    def _delegate_to(self, slot: int, devices: tuple[str, ...]) -> Worker | None:
        """Return the process that may hold SLOT's queue: the one running all it runs."""
        state = self.slots[slot]
        worker = self._pool.by_slot.get((slot, devices))
        if worker is None or worker.proc.poll() is not None or (
                state.delegate is not None and state.delegate is not worker):
            return None
        for task_id, (held_slot, _) in self.held.items():
            if held_slot == slot and self.task_worker.get(task_id) is not worker:
                return None  # an actor, or a process with other devices, shares the slot
        return worker

    def _end_delegation_if_done(self, slot: int) -> None:
        """Once SLOT's worker holds none of its queue, the agent starts the rest itself."""
        state = self.slots[slot]
        if not state.delegated:
            state.delegate = None
            self.start_queued(slot)

    def run(self, slot: int, devices: tuple[str, ...], item: list[Any],
            frames: list[Any]) -> None:
        """Run ITEM, held on SLOT already, in the process for SLOT and DEVICES."""
        worker = self.worker(slot, devices)
        self.task_worker[item[0]] = worker
        worker.running.add(item[0])
        # What it took, for the worker's accounting of the slot should it hold the queue.
        held = self.held.get(item[0])
        if held is not None:
            item[3]["taken"] = held[1]
        self._pool.send(worker, item, frames)

    def worker(self, slot: int, devices: tuple[str, ...]) -> Worker:
        """The live process for SLOT and DEVICES, started if there is none."""
        worker = self._pool.alive(slot, devices)
        if worker is not None:
            return worker
        if self._pool.by_slot.get((slot, devices)) is not None:
            # Died while idle (or about to be reaped): start afresh. Reaping may itself
            # start this slot's queued grants on a new process.
            self.reap()
            worker = self._pool.alive(slot, devices)
            if worker is not None:
                return worker
        return self._pool.start(slot, devices, self.slots[slot].spec.nthreads,
                                keep=self.slots[slot].delegate)

    def capacity_changed(self) -> None:
        """The slots' capacity changed: tell delegates, start what now fits."""
        for index, state in enumerate(self.slots):
            if state.delegate is not None:
                self._pool.touch(state.delegate)  # a RUN carries the new capacity
            self.start_queued(index)

    # -- cancels, outcomes, deaths ---------------------------------------------------
    def cancel(self, task_id: int) -> None:
        """Stop TASK_ID if it has not started; a running command job's process group is
        stopped by its worker; a running Python call cannot be interrupted safely. Either
        way the broker has already failed it."""
        for slot, state in enumerate(self.slots):
            delegate = state.delegate
            if task_id not in state.delegated or delegate is None:
                pass
            elif delegate.ready and delegate.proc.poll() is None:
                # The worker drops it unless it has started it, and says which.
                self._pool.tell(delegate, P.CANCEL, {"ids": [task_id]})
                state.cancelling.add(task_id)
            else:
                # Nobody to ask: a starting process has not been sent it yet, and a dead
                # one's queue is taken back, so it has not started: drop it here.
                del state.delegated[task_id]
                delegate.backlog = [(i, f) for i, f in delegate.backlog if i[0][0] != task_id]
                self._report_cancelled(task_id)
                self._end_delegation_if_done(slot)
            if any(entry[0] == task_id for entry in state.queue):  # granted, not started
                state.queue = deque(e for e in state.queue if e[0] != task_id)
                self._report_cancelled(task_id)
                self.start_queued(slot)
        worker = self.task_worker.get(task_id)
        if worker is None:
            return
        if worker.ready:  # after the task itself, which may still be in a batch
            self._pool.tell(worker, P.CANCEL, {"ids": [task_id]})
        kept = [(i, f) for i, f in worker.backlog if i[0][0] != task_id]
        if len(kept) != len(worker.backlog):
            worker.backlog = kept
            worker.running.discard(task_id)
            self._report_cancelled(task_id)
            self.free(task_id)

    def done(self, worker: Worker, body: dict[str, Any], results: list[list[Any]]) -> None:
        """WORKER reports: queued grants it started, results, and grants it dropped."""
        state = self.slots[worker.slot]
        for task_id in body.get("started", ()):  # queued grants it has started
            state.cancelling.discard(task_id)
            entry = state.delegated.pop(task_id, None)
            if entry is not None:
                self.hold(worker.slot, task_id, entry[1])
                self.task_worker[task_id] = worker
                worker.running.add(task_id)
        for item, result in zip(body["results"], results):
            worker.running.discard(item[0])
            self.free(item[0])
            if self.task_worker.pop(item[0], None) is not None:
                self._report(item[0], item[1], result, item[3])
        for task_id in body.get("dropped", ()):  # cancelled before it started
            state.cancelling.discard(task_id)
            if state.delegated.pop(task_id, None) is not None:
                self._report_cancelled(task_id)
        self._end_delegation_if_done(worker.slot)

    def reap(self) -> None:
        """Fail the tasks of worker processes that died; their queues run on new ones."""
        for worker in list(self._pool.by_slot.values()):
            code = worker.proc.poll()
            if code is None:
                continue
            cause = exit_cause(code)
            log.warning("worker_died", pid=worker.proc.pid, cause=cause,
                        tasks=len(worker.running))
            for task_id in sorted(worker.running):
                self._report(task_id, P.FAILED, [], {
                    "type": "WorkerLostError",
                    "message": f"the worker process running the task {cause}"})
            self._forget(worker)
            for state in self.slots:
                if state.delegate is worker:  # not reported started: they run on a new one
                    for task_id in sorted(state.cancelling):  # ... unless cancelled meanwhile
                        if state.delegated.pop(task_id, None) is not None:
                            self._report_cancelled(task_id)
                    state.queue.extendleft(reversed(state.delegated.values()))
                    state.delegated.clear()
                    state.cancelling.clear()
                    state.delegate = None
            for task_id in sorted(worker.running):
                self.free(task_id)
            self.start_queued(worker.slot)

    def abandon(self, why: str) -> None:
        """Stop everything running or queued here: the broker no longer counts it."""
        holding = {id(state.delegate) for state in self.slots}
        for worker in list(self._pool.by_slot.values()):
            if worker.running or worker.backlog or id(worker) in holding:
                log.warning("worker_stopped", pid=worker.proc.pid, why=why,
                            tasks=len(worker.running) + len(worker.backlog))
                kill(worker.proc)
                self._forget(worker)
        for state in self.slots:
            state.used.clear()
            state.queue.clear()
            state.delegated.clear()
            state.delegate = None
        self.held.clear()

    def busy(self) -> bool:
        """Whether any task runs here (or is being handed to a process)."""
        return bool(self.task_worker)

    def _forget(self, worker: Worker) -> None:
        self._pool.forget(worker)
        for task_id in worker.running:
            self.task_worker.pop(task_id, None)

    def _report_cancelled(self, task_id: int) -> None:
        self._report(task_id, P.FAILED, [], {"type": "CancelledError", "message": "cancelled"})

    def _report(self, task_id: int, outcome: str, frames: list[Any],
                info: dict[str, Any]) -> None:
        self.task_worker.pop(task_id, None)
        self._report_to_broker(task_id, outcome, frames, info)
