"""When the broker's process runs Python's cyclic garbage collector.

A full pass walks every object the process holds: at a million queued tasks that is tens
of millions of objects and seconds of a stalled loop (every other user's message waits),
and the default thresholds run one each time the heap has grown by a quarter, so while a
million tasks arrive the loop stalls again and again, for longer each time. The broker's
records never make garbage in cycles (they are freed by reference counts as tasks end),
so its process keeps the collector's cheap young passes and runs a full one itself, now
and then, only while it holds few tasks; the rare cycle (an exception's traceback, say)
waits for that.
"""

from __future__ import annotations

import gc

FULL_EVERY = 300.0     # seconds between full passes, at least
FULL_UNDER = 100_000   # ... and only while the broker holds fewer tasks than this


class Collector:
    """The broker's policy for the cyclic collector (see the module's docstring)."""

    def __init__(self) -> None:
        self._last_full = 0.0

    def start(self, now: float) -> None:
        """Take over full passes from the collector's thresholds (for this process)."""
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, 1 << 30)  # (a full pass after 2**30 middle ones)
        self._last_full = now

    def tick(self, now: float, held: int) -> bool:
        """Run a full pass if one is due and cheap: the broker holds HELD tasks; return
        whether it ran (a time for other clean-ups that walk what is kept)."""
        if now - self._last_full < FULL_EVERY or held >= FULL_UNDER:
            return False
        self._last_full = now
        gc.collect()
        return True
