"""What tasks print, caught per task in their worker process, to go to their clients.

The worker replaces ``sys.stdout`` and ``sys.stderr`` with streams that ask which task runs
on the writing thread (the task context, a context variable: ``asyncio`` tasks and an
actor's coroutines carry it too) and keep what it wrote, by whole lines, until the worker's
main thread sends it to the agent (``take``): at least every ``INTERVAL`` seconds while
there is some, and always before the task's result (the rest of a line the task left
unfinished goes when it ends). Output written outside any task (by threads a task started,
by zres itself), and whatever is written to the descriptors 1 and 2 directly (``os.write``,
C libraries, subprocesses), goes to the worker's own streams as before: the agent's log.
What a task writes through ``sys.stdout`` goes there too, as it did before it was forwarded:
an agent's log keeps what its tasks printed, whether or not their clients hear it.

Everything is bounded: each task may send ``RATE`` bytes a second (``BURST`` at once), a
line not ended within ``LINE_MAX`` characters is cut there, and the process keeps at most
``PENDING_MAX`` bytes unsent; what goes over is dropped and counted, and the task's client
is told ``[zres: N bytes of output dropped]`` in its place.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from ..core.context import current_task

INTERVAL = 0.1             # seconds between sends, while there is output
LINE_MAX = 64 * 1024       # characters of one line; a longer one is cut into pieces
RATE = 1024 * 1024         # bytes a second each task may send ...
BURST = 1024 * 1024        # ... and at once
PENDING_MAX = 8 * 1024 * 1024  # bytes kept unsent in the whole process

STDOUT, STDERR = 1, 2


class OutputBuffer:
    """The output of the tasks of one worker process, not sent yet.

    Task threads ``write``; the main thread ``take``s, at ``due`` or before results.
    WAKE is called (from a task thread) when output waits and no send is due yet.
    """

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self.items: list[list[Any]] = []      # [task id, stream, bytes], in order written
        self.due: float | None = None         # when the main thread must send them
        self._bytes = 0
        self._partial: dict[tuple[int, int], tuple[list[str], int]] = {}  # a line not
        # ended yet: its pieces and their length
        self._allowance: dict[int, tuple[float, float]] = {}  # task -> (bytes, when)
        self._dropped: dict[tuple[int, int], list[Any]] = {}  # its note in items
        self._tasks: set[int] = set()          # tasks that wrote anything

    def write(self, task_id: int, stream: int, text: str) -> None:
        """Keep TEXT that task TASK_ID wrote to STREAM; whole lines go at the next send."""
        with self._lock:
            self._tasks.add(task_id)
            key = (task_id, stream)
            parts, size = self._partial.get(key, ([], 0))
            if "\n" not in text and size + len(text) <= LINE_MAX:
                # (kept in parts: a line printed piece by piece is joined once, at its end)
                parts.append(text)
                self._partial[key] = (parts, size + len(text))
                return
            line = "".join(parts) + text
            self._partial.pop(key, None)
            cut = line.rfind("\n") + 1
            if cut:
                self._add(task_id, stream, line[:cut])
                line = line[cut:]
            if len(line) > LINE_MAX:  # (by index: a huge line is copied once, not per piece)
                pos = 0
                while len(line) - pos > LINE_MAX:
                    self._add(task_id, stream, line[pos:pos + LINE_MAX] + "\n")
                    pos += LINE_MAX
                line = line[pos:]
            if line:
                self._partial[key] = ([line], len(line))

    def end(self, task_id: int) -> bool:
        """Task TASK_ID ended: what it left of a line goes too (called before its result
        is put, so the result is never sent ahead of its output). Return whether it
        wrote anything."""
        if task_id not in self._tasks:  # (no lock: a task that printed nothing pays this)
            return False
        with self._lock:
            self._tasks.discard(task_id)
            self._allowance.pop(task_id, None)
            for stream in (STDOUT, STDERR):
                parts, size = self._partial.pop((task_id, stream), ([], 0))
                if size:
                    self._add(task_id, stream, "".join(parts) + "\n")
        return True

    def take(self) -> list[list[Any]]:
        """Return what is to be sent now, a note in the place of what was dropped."""
        if not self.items:
            return []
        with self._lock:
            items, self.items, self._bytes, self.due = self.items, [], 0, None
            for note in self._dropped.values():
                note[2] = f"[zres: {note[2]} bytes of output dropped]\n".encode()
            self._dropped.clear()
        return items

    def _add(self, task_id: int, stream: int, text: str) -> None:
        """Queue whole lines (under the lock), within the task's and the process's bounds."""
        data = text.encode("utf-8", "replace")
        now = time.monotonic()
        allowance, since = self._allowance.get(task_id, (BURST, now))
        allowance = min(BURST, allowance + (now - since) * RATE)
        room = int(min(allowance, PENDING_MAX - self._bytes))
        dropped = 0
        if len(data) > room:
            kept = data.rfind(b"\n", 0, max(room, 0)) + 1  # whole lines only
            dropped, data = len(data) - kept, data[:kept]
        self._allowance[task_id] = (allowance - len(data), now)
        if data:
            self.items.append([task_id, stream, data])
            self._bytes += len(data)
        if dropped:
            # One note per stream and send, where the first drop was; counted on.
            note = self._dropped.get((task_id, stream))
            if note is None:
                note = self._dropped[(task_id, stream)] = [task_id, stream, 0]
                self.items.append(note)
            note[2] += dropped
        if self.due is None and self.items:
            self.due = now + INTERVAL
            self._wake()


class TaskStream:
    """Stand in for ``sys.stdout`` or ``sys.stderr``: a task's writes go to BUFFER and, as
    before output was forwarded, to the stream it replaced (the agent's log: where an
    operator finds them, also when the client does not forward output); any other
    thread's to that stream alone."""

    def __init__(self, buffer: OutputBuffer, stream: int, original: TextIO) -> None:
        self._buffer = buffer
        self._stream = stream
        self._original = original

    def write(self, text: str) -> int:
        task = current_task()
        if task is None:
            return self._original.write(text)
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if text:
            self._buffer.write(task.task_id, self._stream, text)
            self._original.write(text)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._original.flush()

    def isatty(self) -> bool:
        return False if current_task() is not None else self._original.isatty()

    def __getattr__(self, name: str) -> Any:
        # encoding, fileno, buffer...: the real stream's (what is written through them
        # directly is not caught, as the module's docstring says).
        return getattr(self._original, name)


def capture(buffer: OutputBuffer) -> None:
    """Have what tasks write to sys.stdout and sys.stderr go to BUFFER."""
    sys.stdout = TaskStream(buffer, STDOUT, sys.stdout)  # type: ignore[assignment]
    sys.stderr = TaskStream(buffer, STDERR, sys.stderr)  # type: ignore[assignment]
