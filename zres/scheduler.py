"""Pure placement policy: which waiting task runs on which worker slot, and why not.

No sockets, threads or clocks: the broker feeds events in (slot added, changed or removed,
task queued, task finished, the time) and calls ``schedule(now)`` for the grants to send.

Rules
- Order: higher priority first; equal priority in submission order (``seq``). Ties never
  depend on dict or set order, so the same events always give the same schedule.
- Backfill: a task that cannot start is skipped, never blocking later tasks that can.
  Waiting tasks are indexed by the *shape* of their request: all tasks of one shape fit
  or fail alike, so one failed fit blocks a whole shape for the pass.
- Fit is checked against each slot's *free* amounts, subtracted at grant and returned at
  release; concurrent grants never exceed any slot's capacity.
- No starvation: a task that has waited ``starvation_after`` seconds while blocked gets a
  reservation on the slot where it will fit soonest (the least still to be freed). From
  then on, in every pass, tasks ordered after it may take from that slot only what
  leaves its whole request free; it starts as soon as the tasks running there finish.
  Tasks ordered before it (higher priority) are not fenced.
- GPUs are accounted per device: GPU=k (whole) takes k devices that are wholly free,
  with all their memory; a fraction below 1 packs onto the busiest device with room,
  never spanning two. GPU_MEMORY=m takes m bytes on one device (with the fraction, if
  both are asked), packing onto the device with least memory left that fits.
- Among slots that fit, prefer the one that strands least: fewest resource kinds the task
  does not use (keep GPU nodes for GPU work), then least left over, then slot id.
- Cost: each decision looks up candidates in a per-resource index of slots sorted by free
  amount (bisect), examining at most a few fitting slots; passes touch one head per shape.
- Pipelining (``prefetch`` > 0): a *short* task that fits nowhere now may be granted to
  a slot whose capacity could run it, into that slot's queue of at most ``prefetch`` grants; it
  starts when room frees there. Queued grants start strictly in order, each when it fits
  the slot's free amounts: the agent applies the same rule to the same grants and the
  same completions, so both sides agree on what runs, and the agent never starts more
  than its capacity. A slot with a queue takes no immediate grant (it would overtake).
  Only tasks without GPU or GPU_MEMORY, and not actors, are queued; a slot reserved for
  a starving task, or one an earlier blocked task could use, takes none. This hides the
  broker round trip between one task's end and the next one's start. The price: work that
  would fit a slot now waits while that slot has a queue, and a queued grant waits for
  room there even if another slot frees first. So only tasks of a *kind* (the caller's
  label, e.g. the function) whose recent runs took under ``SHORT_TASK`` are queued: the
  wait a queue can cause stays a few milliseconds, and long work is never held back. A
  task with no kind is taken to be short.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field

from .resources import GPU, UNIT, Units, fits, format_amount, format_units

GPU_MEMORY = "GPU_MEMORY"
Shape = tuple[tuple[str, int], ...]
_CANDIDATES = 8   # fitting slots compared for best fit per decision
_QUEUE_HEADS = 32  # blocked shapes considered for slot queues per pass


@dataclass(slots=True)
class Slot:
    """One worker slot: resources that tasks are placed into."""

    id: int
    agent: str
    total: Units
    free: Units
    gpu_free: list[int]          # compute share free per device, UNIT when idle
    gpu_mem_total: list[int]     # memory units per device
    gpu_mem_free: list[int]
    gpu_usable: int              # devices [0, gpu_usable) may take new work
    running: set[int] = field(default_factory=set)
    reserved_by: int | None = None
    queue: deque[int] = field(default_factory=deque)   # granted, waiting for room, in order


@dataclass(slots=True)
class Waiting:
    id: int
    units: Units
    priority: int
    seq: int
    shape: Shape
    since: float
    reserved_slot: int | None = None
    reserve_failed: int = -1     # the reservation epoch in which no slot was free to reserve
    queueable: bool = True       # may be granted into a slot's queue (pipelining)
    kind: Hashable | None = None  # what it runs, for its expected duration (None: short)


@dataclass(slots=True)
class Grant:
    """A placement: task TASK runs on SLOT with UNITS, on device positions GPUS."""

    task: int
    slot: int
    units: Units
    gpus: list[int]
    taken: Units                 # what the slot gives up (a whole GPU takes its memory)
    shares: list[int]            # compute share taken per device in GPUS
    memory: list[int]            # memory units taken per device in GPUS
    started: bool = True         # False while it waits in the slot's queue


def shape_of(units: Mapping[str, int]) -> Shape:
    return tuple(sorted(units.items()))


# Pipelining queues only tasks whose kind ran shorter than this, on average, lately.
SHORT_TASK = 0.01
_DURATION_WEIGHT = 0.5    # of the newest run in the moving average
_MAX_KINDS = 10_000       # kinds remembered; past this the averages start afresh


class Scheduler:
    """Resource table plus waiting queue; every method is plain bookkeeping."""

    def __init__(self, starvation_after: float = 5.0, prefetch: int = 0) -> None:
        self.starvation_after = starvation_after
        self.prefetch = prefetch
        self._durations: dict[Hashable, float] = {}   # kind -> moving average run time
        self.slots: dict[int, Slot] = {}
        self.waiting: dict[int, Waiting] = {}
        self.running: dict[int, Grant] = {}
        self._by_shape: dict[Shape, list[tuple[int, int, int]]] = {}
        self._index: dict[str, list[tuple[int, int]]] = {}   # name -> sorted (free, slot)
        self._seq = 0
        self._infeasible_cache: dict[Shape, str | None] = {}
        # Shapes that failed to fit everywhere in an earlier pass, and the slots that have
        # gained room since: such a shape can only fit on one of those, so a pass probes
        # just them instead of every candidate (a pass after one task ends is O(1) slots).
        self._blocked: set[Shape] = set()
        self._gained: set[int] = set()
        self._could_fit: dict[Shape, set[int]] = {}    # slots whose capacity fits a shape
        self._reservation_epoch = 0                     # bumps when a reservation ends
        self._stale: dict[Shape, int] = {}              # cancelled entries left in a heap

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
        memory = list(gpu_memory) if gpu_memory else _split(units.get(GPU_MEMORY, 0), usable,
                                                            devices)
        total = dict(units)
        if sum(memory):
            total[GPU_MEMORY] = sum(memory[:usable])
        slot = Slot(slot_id, agent, total, {}, [UNIT] * devices, memory, list(memory), usable)
        self.slots[slot_id] = slot
        for name, amount in total.items():
            self._set_free(slot, name, amount)
        self._gained.add(slot_id)
        self._topology_changed()

    def remove_slot(self, slot_id: int) -> list[int]:
        """Drop a slot; return the ids of the tasks that were running on it.

        Grants still in its queue (never started) are dropped too: read ``queued(slot)``
        first to queue them again.
        """
        slot = self.slots.pop(slot_id)
        for name, amount in slot.free.items():
            self._unindex(name, amount, slot_id)
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
                self._set_free(slot, name, slot.free.get(name, 0) + delta)
        slot.total = {n: a for n, a in new.items() if a}
        slot.gpu_usable = devices
        self._gained.add(slot_id)
        self._topology_changed()
        return self._promote(slot)

    def _topology_changed(self) -> None:
        self._infeasible_cache.clear()
        self._could_fit.clear()
        self._reservation_epoch += 1
        for slot in self.slots.values():  # a slot that can no longer fit its reserver
            task = self.waiting.get(slot.reserved_by) if slot.reserved_by is not None else None
            if task is None or not _could_ever_fit(slot, task.units):
                if task is not None:
                    self._unreserve(task)
                slot.reserved_by = None

    def needs_pass(self) -> bool:
        """Return whether a slot gained room since the last pass (run schedule again)."""
        return bool(self._gained)

    def _fitting(self, task: Waiting) -> set[int]:
        """Ids of the slots whose total capacity could ever run TASK's shape."""
        ids = self._could_fit.get(task.shape)
        if ids is None:
            ids = self._could_fit[task.shape] = {
                sid for sid, slot in self.slots.items() if _could_ever_fit(slot, task.units)}
        return ids

    # -- tasks ----------------------------------------------------------------------
    def enqueue(self, task_id: int, units: Units, priority: int = 0, now: float = 0.0,
                queueable: bool = True, kind: Hashable | None = None) -> None:
        """Queue a ready task; QUEUEABLE=False keeps it out of slot queues (an actor).

        KIND groups tasks expected to take alike (see ``finished``)."""
        self._seq += 1
        shape = shape_of(units)
        self.waiting[task_id] = Waiting(task_id, dict(units), priority, self._seq, shape, now,
                                        queueable=queueable and GPU not in units
                                        and GPU_MEMORY not in units, kind=kind)
        heapq.heappush(self._by_shape.setdefault(shape, []), (-priority, self._seq, task_id))

    def finished(self, kind: Hashable, seconds: float) -> None:
        """Note that a task of KIND ran SECONDS, from start to its result."""
        average = self._durations.get(kind)
        if average is None and len(self._durations) >= _MAX_KINDS:
            self._durations.clear()
        self._durations[kind] = seconds if average is None else (
            average + _DURATION_WEIGHT * (seconds - average))

    def _short(self, task: Waiting) -> bool:
        return task.kind is None or self._durations.get(task.kind, SHORT_TASK) < SHORT_TASK

    def dequeue(self, task_id: int) -> bool:
        """Forget a waiting task (cancelled); return whether it was waiting."""
        task = self.waiting.pop(task_id, None)  # its heap entry is skipped lazily
        if task is None:
            return False
        self._unreserve(task)
        heap = self._by_shape.get(task.shape)
        if heap is None:
            return True
        stale = self._stale.get(task.shape, 0) + 1
        if len(heap) > 64 and stale * 2 > len(heap):
            # Mostly cancelled entries behind a head that stays blocked: rebuild, O(live).
            live = [e for e in heap if e[2] in self.waiting and self.waiting[e[2]].seq == e[1]]
            heapq.heapify(live)
            self._by_shape[task.shape] = live
            self._stale.pop(task.shape, None)
        else:
            self._stale[task.shape] = stale
        return True

    def release(self, task_id: int) -> list[int]:
        """Return a finished task's resources to its slot (or drop it from the slot's
        queue if it never started); return the queued grants that start now."""
        grant = self.running.pop(task_id, None)
        slot = self.slots.get(grant.slot) if grant else None
        if grant is None or slot is None:
            return []
        if not grant.started:
            slot.queue.remove(task_id)
            return self._promote(slot)
        slot.running.discard(task_id)
        for name, amount in grant.taken.items():
            self._set_free(slot, name, slot.free.get(name, 0) + amount)
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
                self._set_free(slot, name, slot.free[name] - amount)
            slot.running.add(grant.task)
            grant.started = True
            started.append(grant.task)
        return started

    # -- placement ------------------------------------------------------------------
    def schedule(self, now: float = 0.0) -> list[Grant]:
        """Place every waiting task that fits now, best first; return the grants."""
        heads: list[tuple[int, int, Shape]] = []
        for shape, heap in list(self._by_shape.items()):
            top = self._top(shape, heap)
            if top is not None:
                heads.append((top[0], top[1], shape))
        heapq.heapify(heads)
        fences: dict[int, Units] = {}
        grants: list[Grant] = []
        blocked: list[Waiting] = []
        gained = [self.slots[i] for i in sorted(self._gained) if i in self.slots]
        self._gained.clear()
        while heads:
            _, _, shape = heapq.heappop(heads)
            heap = self._by_shape[shape]
            task = self.waiting[heap[0][2]]
            grant, fenced = self._place(task, fences,
                                        gained if shape in self._blocked else None)
            if grant is None:
                if not fenced:  # a fence binds only tasks after its owner: not a later head
                    self._blocked.add(shape)
                self._fence(task, fences, now)
                blocked.append(task)
                continue  # the whole shape is blocked this pass; others may still fit
            heapq.heappop(heap)
            del self.waiting[task.id]
            self._unreserve(task)
            grants.append(grant)
            top = self._top(shape, heap)
            if top is not None:
                heapq.heappush(heads, (top[0], top[1], shape))
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
            while True:
                heap = self._by_shape.get(shape)
                top = self._top(shape, heap) if heap is not None else None
                if top is None:
                    break
                task = self.waiting[top[2]]
                slot = (self._queue_slot(task, claimed) if task.queueable and self._short(task)
                        else None)
                if slot is None:
                    claimed |= self._fitting(task)
                    break
                assert heap is not None
                heapq.heappop(heap)
                del self.waiting[task.id]
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

    def _top(self, shape: Shape, heap: list[tuple[int, int, int]]) -> tuple[int, int, int] | None:
        # Entries of dequeued tasks are dropped here; the seq check also drops the stale
        # entry of a task that was dequeued and queued again.
        while heap and (heap[0][2] not in self.waiting
                        or self.waiting[heap[0][2]].seq != heap[0][1]):
            heapq.heappop(heap)
        if not heap:
            # Forget the shape entirely, so shapes seen once do not pile up in the caches.
            del self._by_shape[shape]
            self._blocked.discard(shape)
            self._stale.pop(shape, None)
            self._infeasible_cache.pop(shape, None)
            self._could_fit.pop(shape, None)
            return None
        return heap[0]

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
            self._set_free(slot, name, slot.free[name] - amount)
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
        pivot: tuple[int, list[tuple[int, int]], int] | None = None
        for name, amount in units.items():
            index = self._index.get(name)
            if not index:
                return []
            start = bisect.bisect_left(index, (amount, -1))
            if pivot is None or len(index) - start < len(pivot[1]) - pivot[2]:
                pivot = (0, index, start)
        assert pivot is not None
        _, index, start = pivot
        # Indexing, not slicing: a decision must not copy the whole index.
        return (self.slots[index[i][1]] for i in range(start, len(index)))

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
        name = min(task.units, key=lambda n: len(self._index.get(n, ())))
        index = self._index.get(name, [])
        best: tuple[tuple[float, int, int], Slot] | None = None
        seen = 0
        for pos in range(len(index) - 1, -1, -1):
            slot = self.slots[index[pos][1]]
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

    # -- the free-amount index -------------------------------------------------------
    def _set_free(self, slot: Slot, name: str, amount: int) -> None:
        if name in slot.free:
            self._unindex(name, slot.free[name], slot.id)
        slot.free[name] = amount
        bisect.insort(self._index.setdefault(name, []), (amount, slot.id))

    def _unindex(self, name: str, amount: int, slot_id: int) -> None:
        index = self._index[name]
        pos = bisect.bisect_left(index, (amount, slot_id))
        del index[pos]
        if not index:
            del self._index[name]

    # -- explaining -----------------------------------------------------------------
    def infeasible_reason(self, units: Units) -> str | None:
        """Say why no registered slot could ever run UNITS, or None if one could."""
        if not self.slots:
            return None  # nothing has joined yet: that is waiting, not infeasible
        shape = shape_of(units)
        if shape not in self._infeasible_cache:
            self._infeasible_cache[shape] = self._infeasible(units)
        return self._infeasible_cache[shape]

    def _infeasible(self, units: Units) -> str | None:
        if any(_could_ever_fit(slot, units) for slot in self.slots.values()):
            return None
        for name, amount in sorted(units.items()):
            largest = max((s.total.get(name, 0) for s in self.slots.values()
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

    def why(self, task_id: int, count_ahead: bool = True) -> str:
        """Say why a waiting task is not running yet.

        COUNT_AHEAD walks the task's shape queue (O(waiting)): fine for one question,
        left out when describing many tasks at once.
        """
        task = self.waiting.get(task_id)
        if task is None:
            grant = self.running.get(task_id)
            if grant is not None and not grant.started:
                slot = self.slots[grant.slot]
                ahead = slot.queue.index(task_id)
                lacking = [f"{n}={format_amount(n, slot.free.get(n, 0))}"
                           for n, a in sorted(grant.taken.items()) if slot.free.get(n, 0) < a]
                return (f"queued on {slot.agent}, where it starts when room frees (needs "
                        f"{format_units(grant.taken)}; {slot.agent} has "
                        f"{' '.join(lacking) or 'room'} free"
                        + (f"; {ahead} queued there before it)" if ahead else ")"))
            return "running" if grant is not None else "not waiting"
        if not self.slots:
            return "no agent has joined the broker yet"
        reason = self.infeasible_reason(task.units)
        if reason is not None:
            return f"infeasible: {reason}"
        ahead = sum(
            1 for _, seq, tid in self._by_shape.get(task.shape, ())
            if tid in self.waiting and self.waiting[tid].seq == seq
            and (-self.waiting[tid].priority, seq) < (-task.priority, task.seq)
        ) if count_ahead else 0
        short = []
        for slot in sorted(self.slots.values(), key=lambda s: s.id):
            if not _could_ever_fit(slot, task.units):
                continue
            if slot.reserved_by not in (None, task.id):
                short.append(f"{slot.agent} is reserved for task {slot.reserved_by}")
                continue
            lacking = [f"{n}={format_amount(n, slot.free.get(n, 0))}"
                       for n, a in sorted(task.units.items()) if slot.free.get(n, 0) < a]
            short.append(f"{slot.agent} has {' '.join(lacking) or 'no device with room'} free")
        text = f"needs {format_units(task.units)}; " + "; ".join(short[:3])
        if len(short) > 3:
            text += f"; and {len(short) - 3} more agents busy"
        if task.reserved_slot is not None:
            text += f"; holds a reservation on {self.slots[task.reserved_slot].agent}"
        if ahead:
            text += f"; queued behind {ahead} tasks of the same shape"
        return text


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


def _could_ever_fit(slot: Slot, units: Units) -> bool:
    if not fits(slot.total, units):
        return False
    fresh = Slot(slot.id, slot.agent, slot.total, slot.total, [UNIT] * len(slot.gpu_free),
                 slot.gpu_mem_total, slot.gpu_mem_total, slot.gpu_usable)
    return pick_devices(fresh, units) is not None


def _split(total: int, usable: int, devices: int) -> list[int]:
    if not usable:
        return [0] * devices
    return [total // usable] * devices


def _unused_kinds(slot: Slot, units: Units) -> int:
    return sum(1 for name in slot.total if name not in units)


def _leftover(slot: Slot, units: Units) -> float:
    return sum((slot.free[name] - amount) / slot.total[name]
               for name, amount in units.items() if slot.total.get(name))
