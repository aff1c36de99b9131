"""The Scheduler: resource table, waiting queue, placement passes, reservations, slot queues.

See the package's docstring for the rules it keeps.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable

from ..core.resources import GPU, GPU_MEMORY, UNIT, Units, fits
from . import explain
from .devices import could_ever_fit, infeasible, pick_devices, split_memory
from .durations import Durations
from .index import FreeIndex
from .queue import WaitingQueue
from .records import Grant, Shape, Slot, Waiting, shape_of

_CANDIDATES = 8   # fitting slots compared for best fit per decision
_QUEUE_HEADS = 32  # blocked shapes considered for slot queues per pass



class Scheduler:
    """Resource table plus waiting queue; every method is plain bookkeeping."""

    def __init__(self, starvation_after: float = 5.0, prefetch: int = 0) -> None:
        self.starvation_after = starvation_after
        self.prefetch = prefetch
        self.durations = Durations()
        self.slots: dict[int, Slot] = {}
        self.queue = WaitingQueue(self._forget_shape)
        self.running: dict[int, Grant] = {}
        self._index = FreeIndex()
        self._infeasible_cache: dict[Shape, str | None] = {}
        # Shapes that failed to fit everywhere in an earlier pass, and the slots that have
        # gained room since: such a shape can only fit on one of those, so a pass probes
        # just them instead of every candidate (a pass after one task ends is O(1) slots).
        self._blocked: set[Shape] = set()
        self._gained: set[int] = set()
        self._could_fit: dict[Shape, set[int]] = {}    # slots whose capacity fits a shape
        self._reservation_epoch = 0                     # bumps when a reservation ends
        self._changed = False                           # since the last pass

    # -- resource table -------------------------------------------------------------
    def add_slot(self, slot_id: int, agent: str, units: Units,
                 gpu_memory: list[int] | None = None, devices: int | None = None) -> None:
        """Register a slot with capacity UNITS.

        GPU in UNITS is how many devices take work; DEVICES (default the same) is how many
        the agent has, so a lowered GPU count can be raised again. GPU_MEMORY may be given
        per device; a declared GPU_MEMORY total is split evenly over the devices.
        """
        usable = units.get(GPU, 0) // UNIT
        devices = usable if devices is None else devices
        memory = list(gpu_memory) if gpu_memory else split_memory(
            units.get(GPU_MEMORY, 0), usable, devices)
        total = dict(units)
        if sum(memory):
            total[GPU_MEMORY] = sum(memory[:usable])
        slot = Slot(slot_id, agent, total, {}, [UNIT] * devices, memory, list(memory), usable)
        self.slots[slot_id] = slot
        for name, amount in total.items():
            self._index.set(slot, name, amount)
        self._gained.add(slot_id)
        self._topology_changed()

    def remove_slot(self, slot_id: int) -> list[int]:
        """Drop a slot; return the ids of the tasks that were running on it.

        Grants still in its queue (never started) are dropped too: read ``queued(slot)``
        first to queue them again.
        """
        slot = self.slots.pop(slot_id)
        self._index.drop(slot)
        for task in [*slot.running, *slot.queue]:
            del self.running[task]
        if slot.reserved_by in self.waiting:
            self.waiting[slot.reserved_by].reserved_slot = None
        self._topology_changed()
        return sorted(slot.running)

    def check_capacity(self, slot_id: int, units: Units) -> None:
        """Raise ValueError if set_capacity(SLOT_ID, UNITS) would be refused."""
        slot = self.slots[slot_id]
        if units.get(GPU, 0) % UNIT:
            raise ValueError("GPU must be a whole number of devices")
        if units.get(GPU, 0) // UNIT > len(slot.gpu_free):
            raise ValueError(f"it has only {len(slot.gpu_free)} GPU device(s)")
        if GPU_MEMORY in units and units[GPU_MEMORY] != slot.total.get(GPU_MEMORY, 0):
            raise ValueError("GPU_MEMORY comes from the devices and cannot be changed")

    def queued(self, slot_id: int) -> list[int]:
        """Return the grants waiting in SLOT_ID's queue, in order."""
        return list(self.slots[slot_id].queue)

    def set_capacity(self, slot_id: int, units: Units) -> list[int]:
        """Change a slot's capacity; work in use above the new amounts finishes normally.

        Return the queued grants that now start.
        """
        self.check_capacity(slot_id, units)
        slot = self.slots[slot_id]
        devices = units.get(GPU, 0) // UNIT
        new = dict(units)
        if sum(slot.gpu_mem_total):
            new[GPU_MEMORY] = sum(slot.gpu_mem_total[:devices])
        for name in set(slot.total) | set(new):
            delta = new.get(name, 0) - slot.total.get(name, 0)
            if delta:
                self._index.set(slot, name, slot.free.get(name, 0) + delta)
        slot.total = {n: a for n, a in new.items() if a}
        slot.gpu_usable = devices
        self._gained.add(slot_id)
        self._topology_changed()
        return self._promote(slot)

    def _topology_changed(self) -> None:
        self._changed = True
        self._infeasible_cache.clear()
        self._could_fit.clear()
        self._reservation_epoch += 1
        for slot in self.slots.values():  # a slot that can no longer fit its reserver
            task = self.waiting.get(slot.reserved_by) if slot.reserved_by is not None else None
            if task is None or not could_ever_fit(slot, task.units):
                if task is not None:
                    self._unreserve(task)
                slot.reserved_by = None

    def needs_pass(self) -> bool:
        """Return whether anything changed since the last pass that a pass could act on:
        a task queued or gone, a slot added, changed or gaining room (run schedule again)."""
        return self._changed or bool(self._gained)

    def _fitting(self, task: Waiting) -> set[int]:
        """Ids of the slots whose total capacity could ever run TASK's shape."""
        ids = self._could_fit.get(task.shape)
        if ids is None:
            ids = self._could_fit[task.shape] = {
                sid for sid, slot in self.slots.items() if could_ever_fit(slot, task.units)}
        return ids

    # -- tasks ----------------------------------------------------------------------
    def enqueue(self, task_id: int, units: Units, priority: int = 0, now: float = 0.0,
                queueable: bool = True, kind: Hashable | None = None) -> None:
        """Queue a ready task; QUEUEABLE=False keeps it out of slot queues (an actor).

        KIND groups tasks expected to take alike (see ``finished``)."""
        self._changed = True
        self.queue.add(task_id, units, priority, now,
                       queueable and GPU not in units and GPU_MEMORY not in units, kind)

    @property
    def waiting(self) -> dict[int, Waiting]:
        """The waiting tasks by id."""
        return self.queue.tasks

    def finished(self, kind: Hashable, seconds: float) -> None:
        """Note that a task of KIND ran SECONDS, from start to its result."""
        self.durations.finished(kind, seconds)

    def dequeue(self, task_id: int) -> bool:
        """Forget a waiting task (cancelled); return whether it was waiting."""
        task = self.queue.remove(task_id)
        if task is None:
            return False
        self._changed = True
        self._unreserve(task)
        return True

    def release(self, task_id: int) -> list[int]:
        """Return a finished task's resources to its slot (or drop it from the slot's
        queue if it never started); return the queued grants that start now."""
        grant = self.running.pop(task_id, None)
        slot = self.slots.get(grant.slot) if grant else None
        if grant is None or slot is None:
            return []
        self._changed = True
        if not grant.started:
            slot.queue.remove(task_id)
            return self._promote(slot)
        slot.running.discard(task_id)
        for name, amount in grant.taken.items():
            self._index.set(slot, name, slot.free.get(name, 0) + amount)
        for pos, share, mem in zip(grant.gpus, grant.shares, grant.memory):
            slot.gpu_free[pos] += share
            slot.gpu_mem_free[pos] += mem
        self._gained.add(slot.id)
        return self._promote(slot)

    def _promote(self, slot: Slot) -> list[int]:
        """Start SLOT's queued grants, in order, while the head fits (the agent does too)."""
        started = []
        while slot.queue:
            grant = self.running[slot.queue[0]]
            if not fits(slot.free, grant.taken):
                break
            slot.queue.popleft()
            for name, amount in grant.taken.items():
                self._index.set(slot, name, slot.free[name] - amount)
            slot.running.add(grant.task)
            grant.started = True
            started.append(grant.task)
        return started

    # -- placement ------------------------------------------------------------------
    def schedule(self, now: float = 0.0) -> list[Grant]:
        """Place every waiting task that fits now, best first; return the grants."""
        self._changed = False
        heads: list[tuple[int, int, Shape]] = []
        for shape in self.queue.shapes():
            head = self.queue.head(shape)
            if head is not None:
                heads.append((-head.priority, head.seq, shape))
        heapq.heapify(heads)
        fences: dict[int, Units] = {}
        grants: list[Grant] = []
        blocked: list[Waiting] = []
        gained = [self.slots[i] for i in sorted(self._gained) if i in self.slots]
        self._gained.clear()
        while heads:
            _, _, shape = heapq.heappop(heads)
            task = self.queue.head(shape)
            assert task is not None, "a shape in heads has a head"
            grant, fenced = self._place(task, fences,
                                        gained if shape in self._blocked else None)
            if grant is None:
                if not fenced:  # a fence binds only tasks after its owner: not a later head
                    self._blocked.add(shape)
                self._fence(task, fences, now)
                blocked.append(task)
                continue  # the whole shape is blocked this pass; others may still fit
            self.queue.take(task)
            self._unreserve(task)
            grants.append(grant)
            head = self.queue.head(shape)
            if head is not None:
                heapq.heappush(heads, (-head.priority, head.seq, shape))
        if self.prefetch and blocked:
            grants.extend(self._fill_queues(blocked))
        return grants

    def _fill_queues(self, blocked: list[Waiting]) -> list[Grant]:
        """Grant blocked tasks, best first, into slot queues with room (pipelining).

        A slot that a blocked task before it could use, but not queue on, is left alone:
        later tasks must not start there ahead of it.
        """
        grants: list[Grant] = []
        claimed: set[int] = set()
        for head in blocked[:_QUEUE_HEADS]:
            shape = head.shape
            while (task := self.queue.head(shape)) is not None:
                queueable = task.queueable and self.durations.short(task.kind)
                slot = self._queue_slot(task, claimed) if queueable else None
                if slot is None:
                    claimed |= self._fitting(task)
                    break
                self.queue.take(task)
                self._unreserve(task)
                grant = Grant(task.id, slot.id, task.units, [], dict(task.units), [], [],
                              started=False)
                slot.queue.append(task.id)
                self.running[task.id] = grant
                grants.append(grant)
        return grants

    def _queue_slot(self, task: Waiting, claimed: set[int]) -> Slot | None:
        best: Slot | None = None
        for slot_id in self._fitting(task):
            slot = self.slots[slot_id]
            if (len(slot.queue) >= self.prefetch or slot.reserved_by is not None
                    or slot_id in claimed):
                continue
            if best is None or (len(slot.queue), slot.id) < (len(best.queue), best.id):
                best = slot
        return best

    def _forget_shape(self, shape: Shape) -> None:
        """No task of SHAPE waits any more: drop what is cached about it."""
        self._blocked.discard(shape)
        self._infeasible_cache.pop(shape, None)
        self._could_fit.pop(shape, None)

    def _place(self, task: Waiting, fences: dict[int, Units],
               only: list[Slot] | None = None) -> tuple[Grant | None, bool]:
        """Grant TASK the best fitting slot; also say whether a fence turned one away."""
        best: tuple[tuple[int, float, int], Slot, tuple[list[int], list[int], list[int]]] | None
        best, found, fenced = None, 0, False
        for slot in self._candidates(task.units) if only is None else only:
            if slot.queue:
                continue  # it would start ahead of the grants queued there
            fence = fences.get(slot.id)
            if fence is not None and not all(
                    slot.free.get(n, 0) - a >= fence.get(n, 0) for n, a in task.units.items()):
                fenced = True
                continue
            if not fits(slot.free, task.units):
                continue
            devices = pick_devices(slot, task.units)
            if devices is None:
                continue
            score = (_unused_kinds(slot, task.units), _leftover(slot, task.units), slot.id)
            if best is None or score < best[0]:
                best = (score, slot, devices)
            found += 1
            if found >= _CANDIDATES:
                break
        if best is None:
            return None, fenced
        _, slot, (gpus, shares, memory) = best
        taken = dict(task.units)
        if gpus:
            taken[GPU] = sum(shares)
            if sum(memory):
                taken[GPU_MEMORY] = sum(memory)
        for name, amount in taken.items():
            self._index.set(slot, name, slot.free[name] - amount)
        for pos, share, mem in zip(gpus, shares, memory):
            slot.gpu_free[pos] -= share
            slot.gpu_mem_free[pos] -= mem
        slot.running.add(task.id)
        grant = Grant(task.id, slot.id, task.units, gpus, taken, shares, memory)
        self.running[task.id] = grant
        return grant, fenced

    def _candidates(self, units: Units) -> Iterable[Slot]:
        """Slots that may fit UNITS, scarcest resource first, least free first."""
        if not units:
            return [self.slots[k] for k in sorted(self.slots)]
        ids = self._index.candidates(units)
        return () if ids is None else (self.slots[i] for i in ids)

    def _fence(self, task: Waiting, fences: dict[int, Units], now: float) -> None:
        """Keep a starving task's reserved slot from being taken by tasks after it."""
        if task.reserved_slot is None:
            if (now - task.since < self.starvation_after
                    or task.reserve_failed == self._reservation_epoch):
                return
            choice = self._soonest_slot(task, fences)
            if choice is None:
                task.reserve_failed = self._reservation_epoch
                return
            task.reserved_slot = choice.id
            choice.reserved_by = task.id
        if task.reserved_slot not in fences:
            fences[task.reserved_slot] = task.units

    def _soonest_slot(self, task: Waiting, fences: dict[int, Units]) -> Slot | None:
        # Walk the slots with the most free of the task's scarcest resource first and
        # compare a few: a full scan would make each reservation cost O(agents).
        fitting = self._fitting(task)
        if not fitting or not task.units:
            return None
        name = min(task.units, key=self._index.offering)
        best: tuple[tuple[float, int, int], Slot] | None = None
        seen = 0
        for slot_id in self._index.most_free(name):
            slot = self.slots[slot_id]
            if slot.id not in fitting or slot.reserved_by is not None or slot.id in fences:
                continue
            short = sum(max(0, a - slot.free.get(n, 0)) / slot.total[n]
                        for n, a in task.units.items())
            key = (short, len(slot.running), slot.id)
            if best is None or key < best[0]:
                best = (key, slot)
            seen += 1
            if seen >= _CANDIDATES:
                break
        return best[1] if best else None

    def _unreserve(self, task: Waiting) -> None:
        slot = self.slots.get(task.reserved_slot) if task.reserved_slot is not None else None
        if slot is not None and slot.reserved_by == task.id:
            slot.reserved_by = None
            self._gained.add(slot.id)
            self._reservation_epoch += 1
        task.reserved_slot = None

    # -- explaining -----------------------------------------------------------------
    def infeasible_reason(self, units: Units) -> str | None:
        """Say why no registered slot could ever run UNITS, or None if one could."""
        if not self.slots:
            return None  # nothing has joined yet: that is waiting, not infeasible
        shape = shape_of(units)
        if shape not in self._infeasible_cache:
            self._infeasible_cache[shape] = infeasible(self.slots.values(), units)
        return self._infeasible_cache[shape]

    def why(self, task_id: int, count_ahead: bool = True) -> str:
        """Say why a waiting task is not running yet.

        COUNT_AHEAD walks the task's shape queue (O(waiting)): fine for one question,
        left out when describing many tasks at once.
        """
        task = self.waiting.get(task_id)
        if task is None:
            grant = self.running.get(task_id)
            if grant is not None and not grant.started:
                return explain.queued_grant(grant, self.slots[grant.slot])
            return "running" if grant is not None else "not waiting"
        if not self.slots:
            return "no agent has joined the broker yet"
        reason = self.infeasible_reason(task.units)
        if reason is not None:
            return f"infeasible: {reason}"
        ahead = self.queue.ahead(task) if count_ahead else 0
        reserved = self.slots[task.reserved_slot] if task.reserved_slot is not None else None
        return explain.waiting_task(task, self.slots.values(), reserved, ahead)

def _unused_kinds(slot: Slot, units: Units) -> int:
    return sum(1 for name in slot.total if name not in units)


def _leftover(slot: Slot, units: Units) -> float:
    return sum((slot.free[name] - amount) / slot.total[name]
               for name, amount in units.items() if slot.total.get(name))
