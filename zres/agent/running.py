"""Running granted tasks on a node's slots, and starting queued grants as room frees.

The broker's grants arrive as *direct* (they fit now, by the broker's accounting: start at
once) or *queued* (pipelining: start when room frees here). Queued grants start highest
priority first, each when it fits beside what runs; one that does not fit is passed over
(backfill) until it has waited ``starve`` seconds.

The rule that keeps every attempt fenced: nothing starts that the broker does not count
as possibly started. A direct grant is counted so from its assignment (the broker keeps
that before it sends the grant), so it goes to a worker process the moment it arrives. A
queued grant is handed over only once the broker has acknowledged the report saying it is
``held``; the broker counts every other grant of a lost agent as never started. Both are
reported held. While one worker process runs everything a slot runs, the agent hands it
up to ``DELEGATE`` queued grants (reported held, handed over once acknowledged) that it
starts on its own the moment room frees, with no round trip. When a worker dies, its start
log says which of its tasks had started (lost) and which had not (they run in a new
process, uncharged). Nothing starts while the lease has lapsed.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import time
from collections.abc import Callable
from typing import Any

from ..core import protocol as P
from ..core.resources import CPU, Units
from ..logs import get_logger
from . import solo
from .cpus import CoreBinder
from .grants import Events, Grant, SlotState, add_units
from .handback import HandingBack
from .memory.monitor import Monitor
from .slots import SlotSpec
from .workers import Worker, WorkerPool, exit_cause, kill

log = get_logger("zres.agent")
STOP_GRACE = 2.0  # seconds a call cancelled with force has to end before its process dies

# Queued grants a worker may hold to start on its own. Each may have started when its agent
# is lost, so the broker charges them a retry then (fails them, with none): fewer means
# less charged in a loss, more means fewer round trips between worker and agent.
DELEGATE = 16


class TaskRunner(HandingBack):
    """The node's slots, the tasks running on them and the grants queued there.

    EVENTS collects what the broker must hear; LEASE_VALID() says whether the broker still
    counts on this agent (nothing starts otherwise); STARVE is how long a queued grant may
    be passed over. MEMORY watches (and limits) the processes of tasks that asked for
    MEMORY (``solo``); CPUS, if given, binds each task to cores of its own (``cpus``).
    """

    def __init__(self, specs: list[SlotSpec], pool: WorkerPool, events: Events,
                 lease_valid: Callable[[], bool], starve: float = 5.0,
                 memory: Monitor | None = None, cpus: CoreBinder | None = None) -> None:
        self.cpus = cpus
        self.slots = [SlotState(spec) for spec in specs]
        self._pool = pool
        self.memory = memory or Monitor(None, False, 0)
        self._events = events
        self._lease_valid = lease_valid
        self.starve = starve
        self.grants: dict[int, Grant] = {}
        self.placements: dict[int, tuple[int, Units]] = {}   # actors and jobs: slot, taken
        self._runs = itertools.count(1)
        self._giving_back: set[int] = set()   # delegated grants asked back, to return
        self.draining = False                 # the agent is leaving: nothing new starts
        self.paused = False                   # the node is low on memory: nor now

    # -- the books: every change of what runs goes through these ------------------------
    def _run(self, grant: Grant, worker: Worker) -> None:
        """GRANT runs in WORKER from now: count it."""
        state = self.slots[grant.slot]
        add_units(state.used, grant.taken)
        grant.running, grant.worker, grant.began_at = True, worker, time.monotonic()
        state.runners[id(worker)] = state.runners.get(id(worker), 0) + 1
        worker.running.add(grant.task)

    def _unrun(self, grant: Grant) -> None:
        """GRANT no longer runs (it ended, or its process died before starting it)."""
        if not grant.running:
            return
        state = self.slots[grant.slot]
        add_units(state.used, grant.taken, -1)
        grant.running = False
        if self.cpus is not None:
            self.cpus.give(grant.task)
        if grant.worker is not None and grant.worker.task:  # (its own process: done too)
            solo.retire(self.memory, grant.worker)
        key = id(grant.worker)
        state.runners[key] -= 1
        if not state.runners[key]:
            del state.runners[key]
        if grant.worker is not None:
            grant.worker.running.discard(grant.task)

    def _undelegate(self, state: SlotState, task_id: int) -> Grant | None:
        grant = state.delegated.pop(task_id, None)
        if grant is not None:
            add_units(state.delegated_taken, grant.taken, -1)
        return grant

    # -- grants -------------------------------------------------------------------------
    def add(self, grants: list[Grant]) -> None:
        """Grants arrived (one ASSIGN's): start what may start, queue the rest."""
        touched = set()
        for grant in grants:
            self.grants[grant.task] = grant
            bisect.insort(self.slots[grant.slot].waiting, grant, key=_order)
            touched.add(grant.slot)
        for slot in sorted(touched):
            self.start_ready(slot)

    def hold(self, slot: int, task_id: int, taken: Units) -> None:
        """Count TAKEN in use on SLOT for TASK_ID, a placement run outside the pool (an
        actor's process, a command job)."""
        state = self.slots[slot]
        add_units(state.used, taken)
        state.placements += 1
        self.placements[task_id] = (slot, taken)

    def free(self, task_id: int, start: bool = True) -> int | None:
        """TASK_ID has ended here: give back what it took and (START) start what now
        fits. Return its slot."""
        placement = self.placements.pop(task_id, None)
        if placement is not None:
            slot, taken = placement
            add_units(self.slots[slot].used, taken, -1)
            self.slots[slot].placements -= 1
        else:
            grant = self.grants.pop(task_id, None)
            if grant is None:
                return None
            slot = grant.slot
            self._unrun(grant)
        if start:
            self.start_ready(slot)
        return slot

    def start_ready(self, slot: int) -> None:
        """Start what may start on SLOT now; hand the delegate the next queued grants."""
        if self.draining or self.paused or not self._lease_valid():
            return
        state = self.slots[slot]
        now = None
        index = 0
        # Grants asking the same amounts fit or fail alike: one look per distinct request.
        failed: set[tuple[tuple[str, int], ...]] = set()
        while index < len(state.waiting):
            grant = state.waiting[index]
            shape = tuple(grant.taken.items())
            if grant.direct or (shape not in failed and state.fits(grant.taken)):
                del state.waiting[index]
                self._hand_over(grant)
                continue
            failed.add(shape)
            now = now if now is not None else time.monotonic()
            if now - grant.since >= self.starve:
                break  # it has waited long enough: nothing behind it overtakes
            index += 1
        # The delegate is topped up in batches, when half is used: one message, several.
        # (None with cores to bind: the agent binds each task as it hands it over.)
        if not state.waiting or len(state.delegated) > DELEGATE // 2 or self.cpus:
            return
        worker = self._delegate_to(slot, state.waiting[0].devices)
        if worker is None:
            return
        state.delegate = worker
        while state.waiting and len(state.delegated) < DELEGATE \
                and state.waiting[0].devices == worker.gpus \
                and not solo.is_solo(state.waiting[0]):  # (one of those: a process of its own)
            grant = state.waiting.pop(0)
            grant.run, grant.worker = next(self._runs), worker
            state.delegated[grant.task] = grant
            add_units(state.delegated_taken, grant.taken)
            self._events.held(grant.task)
            self._send(worker, grant, {"queued": True, "priority": -grant.key[0],
                                       "seq": grant.key[1], "since": grant.since})

    def _hand_over(self, grant: Grant) -> None:
        """Start GRANT in its slot's worker process, or its own (it is reported held: a
        queued one first, a direct one with the next report)."""
        worker = solo.start(self._pool, self.memory, grant, self.slots[grant.slot].spec.nthreads) \
            if solo.is_solo(grant) else self.worker(grant.slot, grant.devices)
        grant.run = next(self._runs)
        self._run(grant, worker)
        (self._events.fenced if grant.direct else self._events.held)(grant.task)
        cores = self.cpus.take(grant.slot, grant.task, grant.taken.get(CPU, 0)) \
            if self.cpus is not None else []
        self._send(worker, grant, {"cpus": cores} if cores else {})

    def _send(self, worker: Worker, grant: Grant, extra: dict[str, Any]) -> None:
        """Send GRANT to WORKER: a direct grant now (the broker counted it held before it
        sent it), a queued one once the broker has heard it is held (see reports)."""
        item = [grant.item[0], grant.item[1], grant.item[2],
                {**grant.item[3], "taken": grant.taken, "run": grant.run, **extra}]

        def send() -> None:
            if self.grants.get(grant.task) is grant:  # not cancelled or given back meanwhile
                grant.sent = True
                self._pool.send(worker, item, grant.frames)
        if grant.direct:
            send()
        else:
            self._events.then(send)

    def _delegate_to(self, slot: int, devices: tuple[str, ...]) -> Worker | None:
        """The process that may hold SLOT's queued grants: the one running all it runs
        (it counts the slot's use itself)."""
        state = self.slots[slot]
        worker = self._pool.by_slot.get((slot, devices))
        if worker is None or worker.proc.returncode is not None or state.placements or (
                state.delegate is not None and state.delegate is not worker):
            return None
        if any(key != id(worker) for key in state.runners):
            return None  # a process with other devices shares the slot
        return worker

    def _end_delegation_if_done(self, slot: int) -> None:
        """Once SLOT's worker holds none of its queue, the agent starts the rest itself."""
        state = self.slots[slot]
        if not state.delegated:
            state.delegate = None
        self.start_ready(slot)

    def worker(self, slot: int, devices: tuple[str, ...]) -> Worker:
        """The live process for SLOT and DEVICES, started if there is none. (One that died
        unnoticed is found by the next reap: what it was handed but had not started runs
        again elsewhere, uncharged.)"""
        worker = self._pool.by_slot.get((slot, devices))
        if worker is not None and worker.proc.returncode is None:
            return worker
        if worker is not None:
            self.reap()  # it died while idle: what it held goes to a new process
            worker = self._pool.by_slot.get((slot, devices))
            if worker is not None and worker.proc.returncode is None:
                return worker
        return self._pool.start(slot, devices, self.slots[slot].spec.nthreads,
                                keep=self.slots[slot].delegate)

    def capacity_changed(self) -> None:
        """The slots' capacity changed: tell delegates, start what now fits."""
        for index, state in enumerate(self.slots):
            if state.delegate is not None:
                self._pool.touch(state.delegate)  # a RUN carries the new capacity
            self.start_ready(index)

    def lease_renewed(self) -> None:
        for index, state in enumerate(self.slots):
            self.start_ready(index)
            if state.delegate is not None and state.delegated:
                self._pool.touch(state.delegate)  # it starts nothing while the lease lapses

    # -- cancels, outcomes, deaths ---------------------------------------------------
    def cancel(self, task_id: int, force: bool = False,
               error: dict[str, Any] | None = None) -> None:
        """Stop TASK_ID if it has not started (the broker has already failed it). A running
        call is stopped only with FORCE: an exception raised in it, then, if it has not
        ended within STOP_GRACE, its worker process is killed. ERROR: it fails so (the
        node ran low on memory), not cancelled."""
        grant = self.grants.get(task_id)
        if grant is None:
            return
        state = self.slots[grant.slot]
        worker = grant.worker
        if any(g is grant for g in state.waiting):
            state.waiting.remove(grant)
            del self.grants[task_id]
            self._report_cancelled(task_id)
            return
        if worker is not None and not grant.sent:
            # Its hand-off still waits for the broker to hear it held, so the broker
            # cancelled it knowing it had not begun: it never reaches the process.
            if self._undelegate(state, task_id) is not None:
                del self.grants[task_id]
                self._end_delegation_if_done(grant.slot)
            else:
                self.free(task_id)
            self._report_cancelled(task_id)
            return
        starting = worker is not None and not worker.ready and worker.proc.returncode is None
        if worker is None or not (force or task_id in state.delegated or starting):
            return  # a running call, not forced: it finishes unobserved
        if worker.ready and worker.proc.returncode is None:
            # The worker drops a queued grant unless it has started it, and says which;
            # told after the hand-offs waiting now, so that it never overtakes the grant.
            body: dict[str, Any] = {"ids": [task_id], "force": True} if force \
                else {"ids": [task_id]}
            if error is not None:
                body["error"] = state.stop_errors[task_id] = error
            self._events.after(functools.partial(self._pool.tell, worker, P.CANCEL, body))
            if task_id in state.delegated:
                state.cancelling.add(task_id)
            if force:
                state.stopping[task_id] = time.monotonic() + STOP_GRACE
        elif task_id in state.delegated:
            # Nobody to ask: a process that has not started has not started it.
            self._undelegate(state, task_id)
            del self.grants[task_id]
            worker.backlog = [(i, f) for i, f in worker.backlog if i[0][0] != task_id]
            self._report_cancelled(task_id)
            self._end_delegation_if_done(grant.slot)
        elif worker.proc.returncode is None:
            # Its process is still starting (a direct grant's: the broker asks, as it may
            # have begun): it waits in the backlog, unstarted.
            worker.backlog = [(i, f) for i, f in worker.backlog if i[0][0] != task_id]
            self.free(task_id)
            self._report_cancelled(task_id)

    def _stop_overdue(self, now: float) -> None:
        """Kill the worker process of each forced cancel that has not ended in time."""
        for state in self.slots:
            for task_id, deadline in list(state.stopping.items()):
                grant = self.grants.get(task_id)
                if grant is None or grant.worker is None:
                    del state.stopping[task_id]  # it ended
                    state.stop_errors.pop(task_id, None)
                elif now >= deadline and grant.worker.proc.returncode is None:
                    log.warning("worker_stopped", pid=grant.worker.proc.pid,
                                why=f"task {task_id}, cancelled with force, did not end "
                                f"within {STOP_GRACE:g}s")
                    grant.worker.stopped_for = task_id
                    grant.worker.proc.kill()  # reaped next: see reap()

    def done(self, worker: Worker, body: dict[str, Any], results: list[list[Any]]) -> None:
        """WORKER reports: tasks it started, results, and queued grants it dropped."""
        state = self.slots[worker.slot]
        for task_id in body.get("started", ()):
            state.cancelling.discard(task_id)
            grant = self._undelegate(state, task_id)
            if grant is not None:  # a queued grant it started on its own
                self._run(grant, worker)
            grant = self.grants.get(task_id)
            if grant is not None:
                grant.begun = True
                self._giving_back.discard(task_id)  # (asked back as it began: it runs)
                self._events.started(task_id)
        for item, result in zip(body["results"], results):
            if item[0] in self.grants:
                if worker.task == item[0]:  # (its own process: with its peak, then gone)
                    ended = solo.ended(self.memory, worker, item, self.grants[item[0]])
                    if ended[1] != item[1]:  # (killed for its memory: its result is void)
                        result = []
                    item = ended
                self.free(item[0], start=False)
                self._events.result(item[0], item[1], result, item[3])
        for task_id in body.get("dropped", ()):  # cancelled before it started
            state.cancelling.discard(task_id)
            if self._undelegate(state, task_id) is not None:
                self.grants.pop(task_id, None)
                if task_id in self._giving_back:
                    self._giving_back.discard(task_id)
                    self._events.give_back(task_id)
                else:
                    self._report_cancelled(task_id)
        self._end_delegation_if_done(worker.slot)

    def reap(self) -> None:
        """Fail the started tasks of worker processes that died; the rest run again."""
        self._stop_overdue(time.monotonic())
        for worker in self._pool.task_workers():
            code = worker.proc.poll()
            if code is None:
                continue
            if worker.retired:  # its task ended: stopped on purpose
                self._pool.forget(worker)
                continue
            unit = self.memory.forget(worker.task) if worker.task else None
            why = "stopped as its node ran low on memory" if worker.stopped_for in \
                self.slots[worker.slot].stop_errors else "cancelled with force"
            cause = exit_cause(code) if not worker.stopped_for else (
                f"was killed to stop task {worker.stopped_for}, {why}")
            started = self._pool.started_by(worker)
            mine = sorted((g for g in self.grants.values() if g.worker is worker),
                          key=lambda g: g.key)
            log.warning("worker_died", pid=worker.proc.pid, cause=cause, tasks=len(mine))
            self._pool.forget(worker)
            state = self.slots[worker.slot]
            if state.delegate is worker:
                state.delegate = None
            for grant in mine:
                self._undelegate(state, grant.task)
                cancelled = grant.task in state.cancelling
                state.cancelling.discard(grant.task)
                asked = grant.task in self._giving_back  # (by a drain, a restart, a recall)
                self._giving_back.discard(grant.task)
                error = solo.lost(unit, grant, cause, grant.begun or grant.run in started)
                if state.stopping.pop(grant.task, None) is not None:  # the one it stopped
                    self.free(grant.task, start=False)
                    stopped = state.stop_errors.pop(grant.task, None)
                    if stopped is not None:
                        self._events.result(grant.task, P.FAILED, [], stopped)
                    else:
                        self._report_cancelled(grant.task)
                elif error is not None:
                    self.free(grant.task, start=False)
                    self._events.result(grant.task, P.FAILED, [], error)
                elif cancelled:
                    self.free(grant.task, start=False)
                    self._report_cancelled(grant.task)
                elif self.draining or asked:  # it never started, and is asked back
                    self.free(grant.task, start=False)
                    self._events.give_back(grant.task)
                else:  # it never started: it runs in a new process, uncharged
                    self._unrun(grant)
                    grant.worker, grant.run = None, 0
                    bisect.insort(state.waiting, grant, key=_order)
            self.start_ready(worker.slot)

    def abandon(self, why: str, keep: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        """Stop everything running or queued here: the broker no longer counts it. The
        placements KEEP (jobs a restarted broker may adopt) stay counted."""
        kept = {t: p for t, p in self.placements.items() if t in keep}
        for worker in self._pool.task_workers():
            if worker.task:
                self.memory.forget(worker.task)
            if worker.task or worker.running or worker.backlog or any(
                    g.worker is worker for g in self.grants.values()):
                log.warning("worker_stopped", pid=worker.proc.pid, why=why,
                            tasks=len(worker.running) + len(worker.backlog))
                kill(worker.proc)
                self._pool.forget(worker)
        self.slots = [SlotState(state.spec) for state in self.slots]
        self.grants.clear()
        self.placements.clear()
        self._giving_back.clear()
        for task_id, (slot, taken) in kept.items():
            self.hold(slot, task_id, taken)

    def holding(self) -> list[int]:
        """Every grant this agent holds (waiting, handed over or running)."""
        return [*self.grants, *self.placements]

    def busy(self) -> bool:
        """Whether anything is held here."""
        return bool(self.grants or self.placements)

    def _report_cancelled(self, task_id: int) -> None:
        self._events.result(task_id, P.FAILED, [], {"type": "CancelledError",
                                                    "message": "cancelled"})


def _order(grant: Grant) -> tuple[bool, tuple[int, int]]:
    """Direct grants first (they fit by the broker's accounting), then priority, then seq."""
    return not grant.direct, grant.key
