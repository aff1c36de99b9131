"""The order a pass takes waiting tasks in: owners by fair share, each owner's by priority.

Each pass looks at the head of every lane (an owner's tasks of one shape, ``queue``). It
serves the owner of least charge first (``owners``: recent use plus what it holds now),
that owner's best head (higher priority, then submission order) next; after each decision
the owner goes back in line with its charge as it is now, so a grant moves it back. Ties
of charge fall to the heads' (priority, seq), then to the owner's name: never dict or set
order. With one owner (no keys) the order is its heads' alone, as before fair share.

Cost: a pass builds one heap per owner of its lanes' heads and one of owners (O(lanes)),
and each decision costs O(log owners + log lanes): nothing per waiting task.
"""

from __future__ import annotations

import heapq

from .owners import Owners
from .queue import WaitingQueue
from .records import Lane, Waiting

Head = tuple[int, int, Lane]   # (-priority, seq, lane) of a lane's first task


class PassOrder:
    """One pass's order over the queue's lanes (see the module's docstring)."""

    def __init__(self, queue: WaitingQueue, owners: Owners, now: float) -> None:
        self._queue = queue
        self._owners = owners
        self._now = now
        self._heads: dict[str, list[Head]] = {}
        for lane in queue.lanes():
            head = queue.head(lane)
            if head is not None:
                heads = self._heads.get(lane[0])
                if heads is None:
                    heads = self._heads[lane[0]] = []
                heads.append((-head.priority, head.seq, lane))
        for heads in self._heads.values():
            heapq.heapify(heads)
        self.owners = len(self._heads)  # owners with work waiting as the pass begins
        # Owners in line by (charge, their best head's -priority and seq, name); with one
        # owner, no line: its heads are the order.
        self._only = next(iter(self._heads.values())) if self.owners == 1 else None
        self._line = [] if self._only is not None else [
            self._in_line(owner, heads) for owner, heads in self._heads.items()]
        heapq.heapify(self._line)
        self._begun = False  # (a task was returned: the next call says how it went)

    def _in_line(self, owner: str, heads: list[Head]) -> tuple[float, int, int, str]:
        priority, seq, _ = heads[0]
        return (self._owners.charge(owner, self._now), priority, seq, owner)

    def next(self, more: bool = False) -> Waiting | None:
        """The next task to decide on (None: the pass is over). MORE says how the task it
        returned last was decided: granted, so its lane may go on in this pass; else its
        lane is done for the pass (blocked, or over its owner's quota). One call a
        decision: this is the pass's inner loop."""
        heads = self._only
        if heads is None:
            return self._next_in_line(more)
        if self._begun:
            lane = heads[0][2]
            head = self._queue.head(lane) if more else None
            if head is None:
                heapq.heappop(heads)
            else:
                heapq.heapreplace(heads, (-head.priority, head.seq, lane))
        self._begun = True
        return self._first(heads)

    def _next_in_line(self, more: bool) -> Waiting | None:
        line = self._line
        if self._begun:
            owner = line[0][3]
            heads = self._heads[owner]
            lane = heads[0][2]
            head = self._queue.head(lane) if more else None
            if head is None:
                heapq.heappop(heads)
            else:
                heapq.heapreplace(heads, (-head.priority, head.seq, lane))
            if heads:  # back in line, with its charge as it is now
                heapq.heapreplace(line, self._in_line(owner, heads))
            else:
                heapq.heappop(line)
        self._begun = True
        while line:
            task = self._first(self._heads[line[0][3]])
            if task is not None:
                return task
            heapq.heappop(line)
        return None

    def _first(self, heads: list[Head]) -> Waiting | None:
        while heads:
            task = self._queue.head(heads[0][2])
            if task is not None:
                return task
            heapq.heappop(heads)  # (emptied since: cancelled)
        return None
