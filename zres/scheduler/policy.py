"""The Scheduler: waiting queue, placement passes, reservations and slot queues, over the
resource table.

See the package's docstring for the rules it keeps.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable

from ..core.resources import GPU, GPU_MEMORY, Units, fits
from .asking import Asking
from .devices import could_ever_fit, devices_at, taken_by
from .durations import Durations
from .fit import best_slot
from .ganging import Ganging
from .gangs import Gang, GangBook
from .order import PassOrder
from .owners import DEFAULT_HALF_LIFE, Owners, Quotas, weight_of
from .pipelining import QueueChoice
from .queue import WaitingQueue
from .records import Grant, Inside, Shape, Slot, Waiting, Workers, add_to, workers, workers_of
from .reservations import Fence, held_fences
from .reserving import Reserving
from .stragglers import Stragglers
from .table import NewSlot, SlotTable

_QUEUE_HEADS = 32  # blocked shapes considered for slot queues per pass


class Scheduler(Asking, Reserving, Ganging, Stragglers):
    """Resource table plus waiting queue; every method is plain bookkeeping."""

    def __init__(self, starvation_after: float = 5.0, prefetch: int = 0,
                 half_life: float = DEFAULT_HALF_LIFE, quotas: Quotas | None = None) -> None:
        self.starvation_after = starvation_after
        self.prefetch = prefetch
        self.durations = Durations()
        # Each owner's use and holdings (fair share, HALF_LIFE seconds) and QUOTAS.
        self.owners = Owners(half_life, quotas)
        self.table = SlotTable(prefetch)
        self.slots = self.table.slots
        self.queue = WaitingQueue(self._forget_shape)
        self._queues = QueueChoice(self.table)
        self.running: dict[int, Grant] = {}     # every grant, started or queued on a slot
        self.gangs = GangBook(self.table, self.running)  # gangs, their bundles (``ganging``)
        # Shapes that failed to fit everywhere in an earlier pass: such a shape can only
        # fit on a slot that has gained room since, so a pass probes just those instead of
        # every candidate (a pass after one task ends is O(1) slots).
        self._blocked: set[Shape] = set()
        self._reserved: set[int] = set()              # slots held for a starving task
        self._reservation_epoch = 0                   # bumps when a reservation ends
        self._changed = False                         # since the last pass
        self._now = 0.0                               # the time of the latest pass
        self._gains = True                            # slots gained room since the last
        self._init_stragglers()                       # short tasks that may turn long

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
        """Drop a slot; return the tasks granted to it, started or queued, and the gangs'
        bundles there and the tasks inside them (their grants go: read ``running`` or
        ``queued`` first to tell which; ``gangs.bundles`` for the bundles, whose gangs the
        caller lets go of or queues again: ``remove_gang``)."""
        granted = self.granted_on(slot_id)  # (and the tasks inside its gangs' bundles)
        (slot,) = self.table.remove([slot_id])
        for task in granted:
            grant = self.running.pop(task)
            if not grant.within:  # (one inside a bundle: the bundle's grant held it)
                self.owners.give(grant.owner, grant.units, grant.weight, self._now)
        self.gangs.slot_gone(slot_id)
        if slot.reserved_by in self.waiting:  # (its holder reserves afresh: all or none)
            self._unreserve(self.waiting[slot.reserved_by])
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
        self._queues.forget()
        self._changed = True

    def queued(self, slot_id: int) -> list[int]:
        """Return the grants queued on SLOT_ID that have not started."""
        return list(self.slots[slot_id].queue)

    def _topology_changed(self) -> None:
        self._changed = True
        self._queues.forget()
        self._reservation_epoch += 1
        for slot_id in list(self._reserved):  # a slot that can no longer fit its reserver
            slot = self.slots[slot_id]
            task = self.waiting.get(slot.reserved_by) if slot.reserved_by is not None else None
            if task is None or not could_ever_fit(slot, self._held_units(slot, task)):
                if task is not None:
                    self._unreserve(task)
                slot.reserved_by = None
                self._reserved.discard(slot_id)

    def needs_pass(self) -> bool:
        """Return whether anything changed since the last pass that a pass could act on:
        a task queued or gone, a slot added, changed, gaining room or a place in its queue
        (run schedule again). With no task waiting a pass could place nothing: none runs
        until one waits (what changed meanwhile is still there for that pass to see); a
        short task's end, the room it frees, would otherwise cost a pass each."""
        return bool(self.queue.tasks) and (self._changed or bool(self.table.gained)
                                           or bool(self.table.queue_freed))

    def _fitting(self, task: Waiting) -> set[int]:
        """Ids of the open slots whose total capacity could ever run TASK's shape."""
        return self.table.fitting(task.shape, task.units)

    # -- tasks ----------------------------------------------------------------------
    def enqueue(self, task_id: int, units: Units, priority: int = 0, now: float = 0.0,
                queueable: bool = True, kind: Hashable | None = None,
                where: Workers | None = None, owner: str = "",
                near: tuple[str, ...] = ()) -> None:
        """Queue a ready task of OWNER (the key that submitted it: fair share and quotas);
        QUEUEABLE=False keeps it out of slot queues and says it may hold its room for good
        (an actor, a command job): its hold never counts as short work, so no grant queues
        behind it (it could wait there for ever while another slot has room).

        KIND groups tasks expected to take alike (see ``finished``). WHERE: the agents it
        may run on, or prefers (None: any; see ``records.workers``). NOW, when it was
        queued, starts no clock: its wait for a reservation counts from the first pass that
        finds it blocked (a task queued behind many that run in turn is not starving).
        NEAR: the agents holding most of its inputs' bytes, preferred when they fit now."""
        self._changed = True
        self.queue.add(task_id, units, priority,
                       queueable and GPU not in units and GPU_MEMORY not in units, kind, where,
                       owner, near, lasting=not queueable)

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
        self.table.start_queued(slot, grant)
        self._start(slot, grant, queued=True)

    def _start(self, slot: Slot, grant: Grant, queued: bool = False) -> None:
        """GRANT starts on SLOT; QUEUED: from its queue (what it takes was kept for it)."""
        grant.started = True
        if not queued:
            self.table.take(slot, grant)
        slot.running.add(grant.task)
        if grant.short:
            add_to(slot.short_taken, grant.taken)
            self._note_short(grant)

    def adopt(self, task_id: int, slot_id: int, units: Units, positions: list[int],
              priority: int = 0, owner: str = "", where: Inside | None = None) -> bool:
        """Take UNITS on SLOT_ID (GPU POSITIONS) for TASK_ID of OWNER, which runs there
        already (a job a restarted broker takes back); False if they are not free for it.
        It counts toward OWNER's quota, over it or not. WHERE: it ran inside that bundle
        (taken back already, on that slot): it takes its room there."""
        if where is not None:
            return self.adopt_inside(task_id, where.gang, where.index, units, positions,
                                     priority, owner)
        slot = self.slots.get(slot_id)
        if slot is None or task_id in self.running:
            return False
        devices = devices_at(slot, units, positions)
        if devices is None or not fits(slot.free, units):
            return False
        gpus, shares, memory = devices
        grant = Grant(task_id, slot.id, units, gpus, taken_by(units, shares, memory), shares,
                      memory, priority=priority, short=False, since=self._now, owner=owner)
        self._start(slot, grant)
        self._charge(grant)
        self._changed = True
        return True

    def release(self, task_id: int, now: float | None = None) -> None:
        """Give a finished task's resources back to its slot (or drop it from the slot's
        queue if it never started); NOW (default: the latest pass's time) ends its
        owner's charge for it."""
        grant = self.running.get(task_id)
        slot = self.slots.get(grant.slot) if grant else None
        if grant is None or slot is None or task_id in self.gangs.bundles:
            return  # (a gang's bundle is let go of with its gang: ``remove_gang``)
        del self.running[task_id]
        self._changed = True
        if grant.within:
            self.gangs.release_inside(grant)
            return
        self.owners.give(grant.owner, grant.units, grant.weight,
                         self._now if now is None else now)
        if not grant.started:
            self.table.unqueue(slot, grant)
            return
        slot.running.discard(task_id)
        if grant.short:
            add_to(slot.short_taken, grant.taken, -1)
        self.table.give(slot, grant)

    # -- placement ------------------------------------------------------------------
    def schedule(self, now: float = 0.0) -> list[Grant]:
        """Place every waiting task that fits now: owners by fair share, each owner's tasks
        by priority (``order``); return the grants."""
        self._changed = False
        self._now = now
        order = PassOrder(self.queue, self.owners, now)
        # (a reservation binds other owners' tasks before the pass reaches its holder)
        fences = held_fences(self.slots, self._reserved, self.waiting,
                             self._fence_of) if order.owners > 1 else {}
        grants: list[Grant] = []
        blocked: list[Waiting] = []
        gained = [self.slots[i] for i in sorted(self.table.gained) if i in self.slots]
        self._gains = bool(gained)  # (a gang that did not fit tries again only then)
        if self.prefetch:
            self._queues.touched(self.table.gained | self.table.queue_freed)
            self.table.queue_freed.clear()
        self.table.gained.clear()
        # A blocked shape probes only the slots that gained room, each shape its own copy:
        # a slot that does not fit a shape cannot fit it later in the pass (room only
        # shrinks), so it is dropped from that shape's copy, never walked twice; and a
        # shape that fit nowhere (no fence in the way) fits nowhere for any later owner.
        probes: dict[Shape, list[Slot]] = {}
        failed: set[Shape] = set()
        several, capped = order.owners > 1, self.owners.capped
        granted = False
        while (task := order.next(granted)) is not None:
            granted = False
            shape = task.shape
            tail = shape[-1] if shape else None
            if type(tail) is Gang or type(tail) is Inside:  # (see ``ganging``)
                granted = self._place_gang(task, tail, fences, grants, now)
                continue
            if capped and self.owners.over_quota(task.owner, task.units) is not None:
                # It waits for its owner's quota, and reserves nothing meanwhile (that
                # would idle what others can use); the owner's other lanes and other
                # owners go on.
                if fences:
                    self._drop_fence(fences, task)
                self._unreserve(task)
                continue
            grant, fenced = None, False
            if shape not in failed:
                only = None
                if shape in self._blocked:
                    only = probes.get(shape)
                    if only is None:
                        only = probes[shape] = list(gained)
                grant, fenced = self._place(task, fences, only)
            if grant is None:
                if not fenced:  # a fence binds only tasks after its owner: not a later head
                    self._blocked.add(shape)
                    if several:
                        failed.add(shape)
                self._fence(task, fences, now)
                blocked.append(task)
                continue  # its lane is blocked this pass; others go on
            self.queue.take(task)
            if fences:
                self._drop_fence(fences, task)
            self._unreserve(task)
            grants.append(grant)
            granted = True
        if self.prefetch and blocked:
            grants.extend(self._fill_queues(blocked))
        return grants

    def _fill_queues(self, blocked: list[Waiting]) -> list[Grant]:
        """Grant blocked tasks, best first, into slot queues with room (pipelining): each
        on the slot with the shortest queue (then the lowest id) whose short tasks will
        soon free what it needs (never one held up by long work).

        A slot that a blocked task before it could use, but not queue on, is left alone:
        later tasks must not start there ahead of it. The slots are taken from those with
        a free place in their queue (kept by the table), in a heap per shape.
        """
        grants: list[Grant] = []
        claimed: list[set[int]] = []  # what the blocked tasks before could use
        for head in blocked[:_QUEUE_HEADS]:
            shape = head.shape
            room: list[tuple[int, int]] | None = None
            while (task := self.queue.head(head.lane)) is not None:
                if room is None and task.queueable and self.durations.short(task.kind):
                    room = self._queues.heap(shape, task.units, claimed)
                if not room or not (task.queueable and self.durations.short(task.kind)):
                    claimed.append(self._fitting(task))
                    break
                if self.owners.over_quota(task.owner, task.units) is not None:
                    break
                queued, slot_id = heapq.heappop(room)
                slot = self.slots[slot_id]
                self.queue.take(task)
                if task.reserved_slot is not None:
                    self._unreserve(task)
                    room = None  # (built again: the slot it held may take queued grants)
                grant = Grant(task.id, slot.id, task.units, [], dict(task.units), [], [],
                              started=False, priority=task.priority, seq=task.seq,
                              short=True, kind=task.kind, owner=task.owner,
                              where=workers_of(shape))
                self.table.queue(slot, grant)
                self._charge(grant)
                grants.append(grant)
                if room is not None and queued + 1 < self.prefetch:
                    heapq.heappush(room, (queued + 1, slot_id))
        return grants

    def _forget_shape(self, shape: Shape) -> None:
        """No task of SHAPE waits any more: drop what is cached about it."""
        self._blocked.discard(shape)
        self.table.forget_shape(shape)
        self._queues.forget(shape)

    def _place(self, task: Waiting, fences: dict[int, Fence],
               only: list[Slot] | None = None) -> tuple[Grant | None, bool]:
        """Grant TASK the best fitting slot; also say whether a fence turned one away.

        ONLY: the slots to probe (else the index's candidates); those that do not fit are
        dropped from it. A task restricted to some agents probes only theirs; one that
        prefers them probes theirs first."""
        where = workers_of(task.shape)
        end = self._expected_end(task) if fences else None
        owner = task.owner
        found, fenced = None, False
        for agent in task.near if where is None else ():
            # (its inputs' agents first, most bytes first; never waited for)
            found, fenced = best_slot(task.units, self.table.named(workers((agent,))),
                                      fences, end, owner=owner)
            if found is not None:
                break
        if found is None and where is None:
            found, fenced = best_slot(task.units, self.table.candidates(task.units)
                                      if only is None else only, fences, end, only, owner)
        elif found is None and where is not None:
            named = self.table.named(where) if only is None else [
                s for s in only if s.agent in where.names]
            found, fenced = best_slot(task.units, named, fences, end, owner=owner)
            if found is None and where.loose:
                found, also = best_slot(task.units, self.table.candidates(task.units)
                                        if only is None else only, fences, end, only, owner)
                fenced = fenced or also
        if found is None:
            return None, fenced
        slot, (gpus, shares, memory) = found
        grant = Grant(task.id, slot.id, task.units, gpus, taken_by(task.units, shares, memory),
                      shares, memory, priority=task.priority, seq=task.seq,
                      short=not task.lasting and self.durations.short(task.kind),
                      kind=task.kind, since=self._now, owner=owner)
        self._start(slot, grant)
        self._charge(grant)
        return grant, fenced

    def _charge(self, grant: Grant) -> None:
        """GRANT is made (started or queued): its owner holds it from now."""
        grant.weight = weight_of(grant.units, self.table.capacity)
        self.owners.take(grant.owner, grant.units, grant.weight, self._now)
        self.running[grant.task] = grant

    def _expected_end(self, task: Waiting) -> float | None:
        """When TASK would end if it started now, by its kind's recent runs (None: unknown)."""
        expected = self.durations.expected(task.kind)
        return None if expected is None else self._now + expected
