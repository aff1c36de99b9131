"""The waiting queue: ready tasks by owner and the shape of their request (a *lane*), best
first in each lane.

All tasks of one shape fit or fail alike, and an owner's quota holds them alike, so a pass
looks only at each lane's head. Order in a lane is higher priority first, then submission
order (``seq``): never dict or set order. (Which owner goes first is ``order``'s.)
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable

from ..core.resources import Units
from .records import Lane, Shape, Waiting, shape_of

_COMPACT_MIN = 64  # a lane's heap is rebuilt once most of at least this many are stale

AHEAD_SAMPLE = 20_000  # lane entries one ``ahead`` looks at, at most


class WaitingQueue:
    """Waiting tasks by id and, per lane (owner, shape), a heap of (-priority, seq, id).

    A removed task's heap entry is dropped lazily, when it reaches the head (the seq check
    also drops the old entry of a task removed and added again). ON_FORGET(shape) is
    called when no lane of a shape has a task left, so shapes seen once do not pile up in
    caches.
    """

    def __init__(self, on_forget: Callable[[Shape], None]) -> None:
        self.tasks: dict[int, Waiting] = {}
        self.by_lane: dict[Lane, list[tuple[int, int, int]]] = {}
        self._seq = 0
        self._stale: dict[Lane, int] = {}      # removed entries left in a lane's heap
        # One copy of each shape, and of its request, shared by its tasks.
        self._shapes: dict[Shape, tuple[Shape, Units]] = {}
        self._lanes: dict[Shape, int] = {}     # how many lanes each shape has
        self._lane_keys: dict[Lane, Lane] = {}  # one copy of each lane, as for shapes
        self._on_forget = on_forget

    def add(self, task_id: int, units: Units, priority: int, queueable: bool,
            kind: Hashable | None, where: Hashable | None = None, owner: str = "",
            near: tuple[str, ...] = (), lasting: bool = False) -> Waiting:
        """Queue a task behind every task of OWNER of higher or equal priority; WHERE: the
        agents it may run on (Workers; None: any), the bundle it is placed in (Inside), or
        the gang it is (see ``gangs``)."""
        self._seq += 1
        shape = shape_of(units, where)
        shape, units = self._shapes.setdefault(shape, (shape, dict(units)))
        lane = (owner, shape)
        lane = self._lane_keys.setdefault(lane, lane)
        task = Waiting(task_id, units, priority, self._seq, shape,
                       queueable=queueable, kind=kind, owner=owner, lane=lane, near=near,
                       lasting=lasting)
        self.tasks[task_id] = task
        heap = self.by_lane.get(lane)
        if heap is None:
            heap = self.by_lane[lane] = []
            self._lanes[shape] = self._lanes.get(shape, 0) + 1
        heapq.heappush(heap, (-priority, self._seq, task_id))
        return task

    def remove(self, task_id: int) -> Waiting | None:
        """Forget a waiting task, wherever it stands; return it (None if not waiting)."""
        task = self.tasks.pop(task_id, None)
        if task is None:
            return None
        lane = task.lane
        heap = self.by_lane.get(lane)
        if heap is None:
            return task
        stale = self._stale.get(lane, 0) + 1
        if len(heap) > _COMPACT_MIN and stale * 2 > len(heap):
            # Mostly removed entries behind a head that stays blocked: rebuild, O(live).
            live = [e for e in heap if self._live(e)]
            heapq.heapify(live)
            self.by_lane[lane] = live
            self._stale.pop(lane, None)
        else:
            self._stale[lane] = stale
        return task

    def census(self, sample: int = 3) -> list[tuple[Lane, int, list[int]]]:
        """Each lane (owner, shape) with tasks waiting: how many, and the ids of SAMPLE of
        them (in no particular order). O(lanes), not O(tasks): for status reports."""
        out = []
        for lane, heap in self.by_lane.items():
            count = len(heap) - self._stale.get(lane, 0)
            if count > 0:
                ids: list[int] = []
                for entry in heap:
                    if len(ids) == sample:
                        break
                    if self._live(entry):
                        ids.append(entry[2])
                out.append((lane, count, ids))
        return out

    def _live(self, entry: tuple[int, int, int]) -> bool:
        task = self.tasks.get(entry[2])
        return task is not None and task.seq == entry[1]

    def head(self, lane: Lane) -> Waiting | None:
        """The first task of LANE, or None (and LANE forgotten) if none waits."""
        heap = self.by_lane.get(lane)
        if heap is None:
            return None
        while heap and not self._live(heap[0]):
            heapq.heappop(heap)
        if not heap:
            del self.by_lane[lane]
            self._stale.pop(lane, None)
            self._lane_keys.pop(lane, None)
            shape = lane[1]
            self._lanes[shape] -= 1
            if not self._lanes[shape]:
                del self._lanes[shape]
                self._shapes.pop(shape, None)
                self._on_forget(shape)
            return None
        return self.tasks[heap[0][2]]

    def take(self, task: Waiting) -> None:
        """Remove TASK, the head of its lane (just returned by ``head``)."""
        heapq.heappop(self.by_lane[task.lane])
        del self.tasks[task.id]

    def lanes(self) -> list[Lane]:
        return list(self.by_lane)

    def members(self, lane: Lane) -> list[int]:
        """The ids of LANE's tasks, in no particular order."""
        return [entry[2] for entry in self.by_lane.get(lane, ()) if self._live(entry)]

    def ahead(self, task: Waiting) -> tuple[int, bool]:
        """How many tasks of TASK's lane come before it, and whether that is exact: a lane
        of more than AHEAD_SAMPLE tasks is sampled (evenly, AHEAD_SAMPLE of them), so one
        question about a task among a million costs what it does among 20,000."""
        heap = self.by_lane.get(task.lane, [])
        step = max(1, len(heap) // AHEAD_SAMPLE)
        tasks, key = self.tasks, (-task.priority, task.seq)
        count = sum(1 for _, seq, tid in heap[::step]
                    if tid in tasks and tasks[tid].seq == seq
                    and (-tasks[tid].priority, seq) < key)
        return count * step, step == 1
