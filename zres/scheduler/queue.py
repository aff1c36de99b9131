"""The waiting queue: ready tasks by the shape of their request, best first in each shape.

All tasks of one shape fit or fail alike, so a pass looks only at each shape's head.
Order is higher priority first, then submission order (``seq``): never dict or set order.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable

from ..core.resources import Units
from .records import Shape, Waiting, Workers, shape_of

_COMPACT_MIN = 64  # a shape's heap is rebuilt once most of at least this many are stale


class WaitingQueue:
    """Waiting tasks by id and, per shape, a heap of (-priority, seq, id).

    A removed task's heap entry is dropped lazily, when it reaches the head (the seq check
    also drops the old entry of a task removed and added again). ON_FORGET(shape) is
    called when a shape has no task left, so shapes seen once do not pile up in caches.
    """

    def __init__(self, on_forget: Callable[[Shape], None]) -> None:
        self.tasks: dict[int, Waiting] = {}
        self.by_shape: dict[Shape, list[tuple[int, int, int]]] = {}
        self._seq = 0
        self._stale: dict[Shape, int] = {}     # removed entries left in a shape's heap
        # One copy of each shape, and of its request, shared by its tasks.
        self._shapes: dict[Shape, tuple[Shape, Units]] = {}
        self._on_forget = on_forget

    def add(self, task_id: int, units: Units, priority: int, queueable: bool,
            kind: Hashable | None, where: Workers | None = None) -> Waiting:
        """Queue a task behind every task of higher or equal priority; WHERE: the agents it
        may run on (None: any)."""
        self._seq += 1
        shape = shape_of(units, where)
        shape, units = self._shapes.setdefault(shape, (shape, dict(units)))
        task = Waiting(task_id, units, priority, self._seq, shape,
                       queueable=queueable, kind=kind)
        self.tasks[task_id] = task
        heapq.heappush(self.by_shape.setdefault(shape, []), (-priority, self._seq, task_id))
        return task

    def remove(self, task_id: int) -> Waiting | None:
        """Forget a waiting task, wherever it stands; return it (None if not waiting)."""
        task = self.tasks.pop(task_id, None)
        if task is None:
            return None
        heap = self.by_shape.get(task.shape)
        if heap is None:
            return task
        stale = self._stale.get(task.shape, 0) + 1
        if len(heap) > _COMPACT_MIN and stale * 2 > len(heap):
            # Mostly removed entries behind a head that stays blocked: rebuild, O(live).
            live = [e for e in heap if self._live(e)]
            heapq.heapify(live)
            self.by_shape[task.shape] = live
            self._stale.pop(task.shape, None)
        else:
            self._stale[task.shape] = stale
        return task

    def census(self, sample: int = 3) -> list[tuple[Shape, int, list[int]]]:
        """Each shape with tasks waiting: how many, and the ids of SAMPLE of them (in no
        particular order). O(shapes), not O(tasks): for status reports."""
        out = []
        for shape, heap in self.by_shape.items():
            count = len(heap) - self._stale.get(shape, 0)
            if count > 0:
                ids: list[int] = []
                for entry in heap:
                    if len(ids) == sample:
                        break
                    if self._live(entry):
                        ids.append(entry[2])
                out.append((shape, count, ids))
        return out

    def _live(self, entry: tuple[int, int, int]) -> bool:
        task = self.tasks.get(entry[2])
        return task is not None and task.seq == entry[1]

    def head(self, shape: Shape) -> Waiting | None:
        """The first task of SHAPE, or None (and SHAPE forgotten) if none waits."""
        heap = self.by_shape.get(shape)
        if heap is None:
            return None
        while heap and not self._live(heap[0]):
            heapq.heappop(heap)
        if not heap:
            del self.by_shape[shape]
            self._stale.pop(shape, None)
            self._shapes.pop(shape, None)
            self._on_forget(shape)
            return None
        return self.tasks[heap[0][2]]

    def take(self, task: Waiting) -> None:
        """Remove TASK, the head of its shape (just returned by ``head``)."""
        heapq.heappop(self.by_shape[task.shape])
        del self.tasks[task.id]

    def shapes(self) -> list[Shape]:
        return list(self.by_shape)

    def ahead(self, task: Waiting) -> int:
        """How many tasks of TASK's shape come before it (O(tasks of the shape))."""
        return sum(1 for _, seq, tid in self.by_shape.get(task.shape, ())
                   if tid in self.tasks and self.tasks[tid].seq == seq
                   and (-self.tasks[tid].priority, seq) < (-task.priority, task.seq))
