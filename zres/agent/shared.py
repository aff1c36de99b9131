"""What an agent shares with its worker processes through memory, surviving either's death.

- The lease: until when (``time.monotonic()``, one clock for every process of the host) the
  broker is known to count this agent as alive. A worker starts a queued grant on its own
  only while the lease holds, so a stopped or cut-off agent's workers soon start nothing.
- A worker's start log: the run number of every task the worker starts, written before
  the task's body runs. When a worker dies, its agent reads which of the tasks it held had
  started (lost: they ran) and which had not (given back to run elsewhere, uncharged).
"""

from __future__ import annotations

import mmap
import os
import struct

_DOUBLE = struct.Struct("d")
_LOG_ENTRIES = 4096          # starts kept; far more than a worker can hold unreported


def _map(path: str, size: int, create: bool) -> mmap.mmap:
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


class Lease:
    """The agent's lease, one double in a shared file."""

    def __init__(self, path: str, create: bool = False) -> None:
        self.path = path
        self._map = _map(path, _DOUBLE.size, create)

    def set(self, deadline: float) -> None:
        _DOUBLE.pack_into(self._map, 0, deadline)

    def until(self) -> float:
        return float(_DOUBLE.unpack_from(self._map, 0)[0])

    def valid(self, now: float) -> bool:
        return now < self.until()


class StartLog:
    """A ring of the last starts of one worker process: a count, then run numbers."""

    def __init__(self, path: str, create: bool = False) -> None:
        self.path = path
        self._map = _map(path, 8 * (_LOG_ENTRIES + 1), create)
        self._words = memoryview(self._map).cast("q")

    def record(self, run: int) -> None:
        """Note that run RUN starts now (before its body runs)."""
        count = self._words[0]
        self._words[1 + count % _LOG_ENTRIES] = run
        self._words[0] = count + 1   # after the entry: a reader never sees a half entry

    def started(self) -> set[int]:
        """The run numbers of the last starts recorded."""
        count = self._words[0]
        first = max(0, count - _LOG_ENTRIES)
        return {self._words[1 + i % _LOG_ENTRIES] for i in range(first, count)}

    def close(self) -> None:
        self._words.release()
        self._map.close()
