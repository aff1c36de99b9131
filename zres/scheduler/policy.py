"""The Scheduler: waiting queue, placement passes, reservations and slot queues, over the
resource table.

See the package's docstring for the rules it keeps.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable

from ..core.resources import GPU, GPU_MEMORY, Units, fits
from . import explain
from .devices import could_ever_fit, devices_at, pick_devices
from .durations import Durations
from .queue import WaitingQueue
from .records import Grant, Shape, Slot, Waiting, add_to
from .reservations import Fence, fence
from .table import NewSlot, SlotTable

_CANDIDATES = 8   # fitting slots compared for best fit per decision
_QUEUE_HEADS = 32  # blocked shapes considered for slot queues per pass


class Scheduler:
    """Resource table plus waiting queue; every method is plain bookkeeping."""

    def __init__(self, starvation_after: float = 5.0, prefetch: int = 0) -> None:
        self.starvation_after = starvation_after
        self.prefetch = prefetch
        self.durations = Durations()
        self.table = SlotTable()
        self.slots = self.table.slots
        self.queue = WaitingQueue(self._forget_shape)
        self.running: dict[int, Grant] = {}     # every grant, started or queued on a slot
        # Shapes that failed to fit everywhere in an earlier pass: such a shape can only
        # fit on a slot that has gained room since, so a pass probes just those instead of
        # every candidate (a pass after one task ends is O(1) slots).
        self._blocked: set[Shape] = set()
        self._reserved: set[int] = set()              # slots held for a starving task
        self._reservation_epoch = 0                   # bumps when a reservation ends
        self._changed = False                         # since the last pass
        self._now = 0.0                               # the time of the latest pass

    # -- resource table -------------------------------------------------------------
    def add_slot(self, slot_id: int, agent: str, units: Units,
                 gpu_memory: list[int] | None = None, devices: int | None = None) -> None:
        """Register a slot with capacity UNITS (see NewSlot)."""
        self.add_slots([NewSlot(slot_id, agent, units, gpu_memory, devices)])

    def add_slots(self, new: list[NewSlot]) -> None:
        """Register many slots at once (an agent's): O(n log n)."""
        self.table.add(new)
        self._topology_changed()

    def remove_slot(self, slot_id: int) -> list[int]:
        """Drop a slot; return the tasks granted to it, started or queued (their grants go:
        read ``running`` or ``queued`` first to tell which)."""
        (slot,) = self.table.remove([slot_id])
        granted = [*slot.running, *slot.queue]
        for task in granted:
            del self.running[task]
        if slot.reserved_by in self.waiting:
            self.waiting[slot.reserved_by].reserved_slot = None
        self._reserved.discard(slot_id)
        self._topology_changed()
        return sorted(granted)

    def check_capacity(self, slot_id: int, units: Units) -> None:
        """Raise ValueError if set_capacity(SLOT_ID, UNITS) would be refused."""
        self.table.check_capacity(slot_id, units)

    def set_capacity(self, slot_id: int, units: Units) -> None:
        """Change a slot's capacity; work in use above the new amounts finishes normally."""
        self.table.set_capacity(slot_id, units)
        self._topology_changed()

    def set_open(self, slot_id: int, open_: bool) -> None:
        """Open or close SLOT_ID to new grants (closed while its agent drains or is away);
        what runs there is not disturbed."""
        self.table.set_open(slot_id, open_)
        self._changed = True

    def queued(self, slot_id: int) -> list[int]:
        """Return the grants queued on SLOT_ID that have not started."""
        return list(self.slots[slot_id].queue)

    def _topology_changed(self) -> None:
        self._changed = True
        self._reservation_epoch += 1
        for slot_id in list(self._reserved):  # a slot that can no longer fit its reserver
            slot = self.slots[slot_id]
            task = self.waiting.get(slot.reserved_by) if slot.reserved_by is not None else None
            if task is None or not could_ever_fit(slot, task.units):
                if task is not None:
                    self._unreserve(task)
                slot.reserved_by = None
                self._reserved.discard(slot_id)

    def needs_pass(self) -> bool:
        """Return whether anything changed since the last pass that a pass could act on:
        a task queued or gone, a slot added, changed or gaining room (run schedule again)."""
        return self._changed or bool(self.table.gained)

    def _fitting(self, task: Waiting) -> set[int]:
        """Ids of the open slots whose total capacity could ever run TASK's shape."""
        return self.table.fitting(task.shape, task.units)

    # -- tasks ----------------------------------------------------------------------
    def enqueue(self, task_id: int, units: Units, priority: int = 0, now: float = 0.0,
                queueable: bool = True, kind: Hashable | None = None) -> None:
        """Queue a ready task; QUEUEABLE=False keeps it out of slot queues (an actor).

        KIND groups tasks expected to take alike (see ``finished``). NOW, when it was
        queued, starts no clock: its wait for a reservation counts from the first pass that
        finds it blocked (a task queued behind many that run in turn is not starving)."""
        self._changed = True
        self.queue.add(task_id, units, priority,
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

    def started(self, task_id: int, now: float | None = None) -> None:
        """A grant queued on a slot has started there (its agent says so; NOW, default the
        latest pass's time): take its resources now. (The agent starts queued grants as
        room frees; the broker learns it from the agent's reports, in order, and never
        predicts it.)"""
        grant = self.running.get(task_id)
        slot = self.slots.get(grant.slot) if grant is not None else None
        if grant is None or slot is None or grant.started:
            return
        grant.since = self._now if now is None else now
        del slot.queue[task_id]
        add_to(slot.queued_taken, grant.taken, -1)
        self._start(slot, grant)

    def _start(self, slot: Slot, grant: Grant) -> None:
        grant.started = True
        self.table.take(slot, grant)
        slot.running.add(grant.task)
        if grant.short:
            add_to(slot.short_taken, grant.taken)

    def adopt(self, task_id: int, slot_id: int, units: Units, positions: list[int],
              priority: int = 0) -> bool:
        """Take UNITS on SLOT_ID (GPU POSITIONS) for TASK_ID, which runs there already (a
        job a restarted broker takes back); False if they are not free for it."""
        slot = self.slots.get(slot_id)
        if slot is None or task_id in self.running:
            return False
        devices = devices_at(slot, units, positions)
        if devices is None or not fits(slot.free, units):
            return False
        gpus, shares, memory = devices
        taken = dict(units)
        if gpus:
            taken[GPU] = sum(shares)
            if sum(memory):
                taken[GPU_MEMORY] = sum(memory)
        grant = Grant(task_id, slot.id, units, gpus, taken, shares, memory,
                      priority=priority, short=False, since=self._now)
        self._start(slot, grant)
        self.running[task_id] = grant
        self._changed = True
        return True

    def release(self, task_id: int) -> None:
        """Give a finished task's resources back to its slot (or drop it from the slot's
        queue if it never started)."""
        grant = self.running.pop(task_id, None)
        slot = self.slots.get(grant.slot) if grant else None
        if grant is None or slot is None:
            return
        self._changed = True
        if not grant.started:
            del slot.queue[task_id]
            add_to(slot.queued_taken, grant.taken, -1)
            return
        slot.running.discard(task_id)
        if grant.short:
            add_to(slot.short_taken, grant.taken, -1)
        self.table.give(slot, grant)

    # -- placement ------------------------------------------------------------------
    def schedule(self, now: float = 0.0) -> list[Grant]:
        """Place every waiting task that fits now, best first; return the grants."""
        self._changed = False
        self._now = now
        heads: list[tuple[int, int, Shape]] = []
        for shape in self.queue.shapes():
            head = self.queue.head(shape)
            if head is not None:
                heads.append((-head.priority, head.seq, shape))
        heapq.heapify(heads)
        fences: dict[int, Fence] = {}
        grants: list[Grant] = []
        blocked: list[Waiting] = []
        gained = [self.slots[i] for i in sorted(self.table.gained) if i in self.slots]
        self.table.gained.clear()
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
                              started=False, priority=task.priority, seq=task.seq,
                              short=True, kind=task.kind)
                slot.queue[task.id] = None
                add_to(slot.queued_taken, grant.taken)
                self.running[task.id] = grant
                grants.append(grant)
        return grants

    def _queue_slot(self, task: Waiting, claimed: set[int]) -> Slot | None:
        """The slot to queue TASK on: one with room in its queue whose short tasks will
        soon free what TASK needs (never one held up by long work), shortest queue first."""
        best: Slot | None = None
        for slot_id in self._fitting(task):
            slot = self.slots[slot_id]
            if (len(slot.queue) >= self.prefetch or slot.reserved_by is not None
                    or slot_id in claimed or not _frees_soon(slot, task.units)):
                continue
            if best is None or (len(slot.queue), slot.id) < (len(best.queue), best.id):
                best = slot
        return best

    def _forget_shape(self, shape: Shape) -> None:
        """No task of SHAPE waits any more: drop what is cached about it."""
        self._blocked.discard(shape)
        self.table.forget_shape(shape)

    def _place(self, task: Waiting, fences: dict[int, Fence],
               only: list[Slot] | None = None) -> tuple[Grant | None, bool]:
        """Grant TASK the best fitting slot; also say whether a fence turned one away.

        On a slot with queued grants, a task takes only what leaves room for all of them:
        its agent may start them any moment."""
        best: tuple[tuple[int, float, int], Slot, tuple[list[int], list[int], list[int]]] | None
        best, found, fenced = None, 0, False
        end = self._expected_end(task) if fences else None
        for slot in self.table.candidates(task.units) if only is None else only:
            if not slot.open:
                continue
            fence_ = fences.get(slot.id)
            if fence_ is not None and not fence_.admits(slot, task.units, end):
                fenced = True
                continue
            if not fits(slot.free, task.units) or (slot.queue and not all(
                    slot.free.get(n, 0) - slot.queued_taken.get(n, 0) >= a
                    for n, a in task.units.items())):
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
        grant = Grant(task.id, slot.id, task.units, gpus, taken, shares, memory,
                      priority=task.priority, seq=task.seq,
                      short=self.durations.short(task.kind), kind=task.kind, since=self._now)
        self._start(slot, grant)
        self.running[task.id] = grant
        return grant, fenced

    def _expected_end(self, task: Waiting) -> float | None:
        """When TASK would end if it started now, by its kind's recent runs (None: unknown)."""
        expected = self.durations.expected(task.kind)
        return None if expected is None else self._now + expected

    def _fence_of(self, slot: Slot, task: Waiting) -> Fence:
        """What TASK's reservation of SLOT keeps from the tasks after it, now."""
        return fence(slot, task.units, task.id, (self.running[t] for t in slot.running),
                     self.durations, self._now)

    def _fence(self, task: Waiting, fences: dict[int, Fence], now: float) -> None:
        """Keep a starving task's reserved slot from being taken by tasks after it.

        TASK is blocked in this pass: it starves once it has been blocked for
        ``starvation_after`` seconds, counted from the first pass that found it so."""
        if task.blocked_since is None:
            task.blocked_since = now
        if task.reserved_slot is None:
            if (now - task.blocked_since < self.starvation_after
                    or task.reserve_failed == self._reservation_epoch):
                return
            choice = self._soonest_slot(task, fences)
            if choice is None:
                task.reserve_failed = self._reservation_epoch
                return
            task.reserved_slot = choice.id
            choice.reserved_by = task.id
            self._reserved.add(choice.id)
        if task.reserved_slot not in fences:
            fences[task.reserved_slot] = self._fence_of(self.slots[task.reserved_slot], task)

    def _soonest_slot(self, task: Waiting, fences: dict[int, Fence]) -> Slot | None:
        # Walk the slots with the most free of the task's scarcest resource first and
        # compare a few: a full scan would make each reservation cost O(agents).
        fitting = self._fitting(task)
        if not fitting or not task.units:
            return None
        name = min(task.units, key=self.table.index.offering)
        best: tuple[tuple[float, int, int], Slot] | None = None
        seen = 0
        for slot_id in self.table.index.most_free(name):
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
            self._reserved.discard(slot.id)
            self.table.gained.add(slot.id)
            self._reservation_epoch += 1
        task.reserved_slot = None

    # -- explaining -----------------------------------------------------------------
    def infeasible_reason(self, units: Units) -> str | None:
        """Say why no registered slot could ever run UNITS, or None if one could."""
        return self.table.infeasible_reason(units)

    def why(self, task_id: int, count_ahead: bool = True,
            name: Callable[[int], str] = lambda task_id: f"task {task_id}") -> str:
        """Say why a waiting task is not running yet; NAME(id) calls another task by name.

        COUNT_AHEAD walks the task's shape queue (O(waiting)): fine for one question,
        left out when describing many tasks at once.
        """
        task = self.waiting.get(task_id)
        if task is None:
            grant = self.running.get(task_id)
            if grant is not None and not grant.started:
                slot = self.slots[grant.slot]
                ahead = sum(1 for other in slot.queue
                            if (-self.running[other].priority, self.running[other].seq)
                            < (-grant.priority, grant.seq))
                return explain.queued_grant(grant, slot, ahead)
            return "running" if grant is not None else "not waiting"
        if not self.slots:
            return "no agent has joined the broker yet"
        reason = self.infeasible_reason(task.units)
        if reason is not None:
            return f"infeasible: {reason}"
        ahead = self.queue.ahead(task) if count_ahead else 0
        reserved = self.slots[task.reserved_slot] if task.reserved_slot is not None else None
        return explain.waiting_task(task, self.slots.values(), reserved, ahead,
                                    lambda slot: self._fenced(task, slot), name)

    def _fenced(self, task: Waiting, slot: Slot) -> bool:
        """Whether another task's reservation of SLOT keeps TASK off it now (TASK fits
        what is free there: else what it lacks says more)."""
        holder = self.waiting.get(slot.reserved_by) if slot.reserved_by is not None else None
        if holder is None or holder is task or not fits(slot.free, task.units) \
                or (-task.priority, task.seq) < (-holder.priority, holder.seq):
            return False  # a reservation binds only the tasks ordered after its holder
        return not self._fence_of(slot, holder).admits(slot, task.units,
                                                        self._expected_end(task))


def _frees_soon(slot: Slot, units: Units) -> bool:
    """Whether what UNITS needs on SLOT is free or held by short tasks only (queued grants
    are short too): only then is a queue there worth joining, not behind long work."""
    return all(slot.free.get(n, 0) + slot.short_taken.get(n, 0) >= a
               for n, a in units.items())


def _unused_kinds(slot: Slot, units: Units) -> int:
    """How many kinds of resource SLOT offers that UNITS does not use (O(len(units)))."""
    return len(slot.total) - sum(1 for name in units if name in slot.total)


def _leftover(slot: Slot, units: Units) -> float:
    return sum((slot.free[name] - amount) / slot.total[name]
               for name, amount in units.items() if slot.total.get(name))
