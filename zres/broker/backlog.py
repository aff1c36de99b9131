"""Work the broker's loop takes across turns, each client's in the order it came.

A submit of 100,000 tasks is a few seconds of work: taken in one go it would hold up
every agent's report and every other client's message for as long. A submit is taken a
chunk at a time, one chunk per client per round, for a bounded time each turn of the loop;
what the same client sent after it (a release, a cancel, a question about those tasks)
waits behind it, so that client sees its messages handled in order. Agents' messages, and
heartbeats, never wait here.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

Work = Callable[[], None]


class Backlog:
    """Per client (by routing id), the work left to do, in order."""

    def __init__(self) -> None:
        self._queues: dict[bytes, deque[Work]] = {}

    def busy(self, ident: bytes) -> bool:
        """Whether IDENT has work waiting: what it sends next waits behind it."""
        return ident in self._queues

    def defer(self, ident: bytes, work: Work) -> None:
        """Do WORK after what IDENT has waiting."""
        self._queues.setdefault(ident, deque()).append(work)

    def next(self, ident: bytes, work: Work) -> None:
        """Do WORK before anything else IDENT has waiting (the rest of what is being
        done for it)."""
        self._queues.setdefault(ident, deque()).appendleft(work)

    def drop(self, ident: bytes) -> None:
        """Forget what IDENT has waiting (it left)."""
        self._queues.pop(ident, None)

    def run(self, budget: float) -> None:
        """Do waiting work, one piece per client in turn, for about BUDGET seconds (at
        least one piece, if there is any)."""
        deadline = time.monotonic() + budget
        while self._queues:
            for ident in list(self._queues):
                queue = self._queues.get(ident)
                if not queue:
                    self._queues.pop(ident, None)
                    continue
                work = queue.popleft()
                if not queue:
                    del self._queues[ident]  # (work may put the rest of itself back)
                work()
            if time.monotonic() >= deadline:
                return

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._queues.values())
