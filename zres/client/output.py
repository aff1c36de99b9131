"""Print what a client's tasks printed, line by line, each line prefixed
``(TASK AGENT) ``, on this process's stdout or stderr as the task wrote it.

A printer thread of the client's writes it: a stream that stalls (a paused terminal, a pipe
nobody reads) must not stall the I/O thread, whose heartbeats keep the client's work alive.
Results that arrive while output waits to be printed are settled by the printer after that
output, so a task's output is printed before its ``result()`` returns. The stream is looked
up at each batch, so pytest's capsys and notebooks that swap ``sys.stdout`` get it.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable
from typing import Any

_QUEUED = 256  # batches of output waiting to be printed, at most; more are dropped


class Printer:
    """Prints output batches in order, on a thread of its own, started at the first."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Callable[..., None], Any]] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0       # batches of output queued, not printed yet
        self._thread: threading.Thread | None = None
        self.dropped = 0        # batches dropped while the stream did not keep up

    def output(self, items: list[Any]) -> None:
        """Print ITEMS (an ``output`` message's) after what is queued; drop them if the
        stream has not kept up with the last ``_QUEUED`` batches."""
        with self._lock:
            if self._waiting >= _QUEUED:
                self.dropped += 1
                return
            self._waiting += 1
        self._put(self._print, items)

    def after_output(self, settle: Callable[[], None]) -> None:
        """Call SETTLE now if no output waits, else once what waits has been printed."""
        with self._lock:
            waiting = self._waiting
        # (only the I/O thread queues output, and it is the caller: none can come between)
        if waiting:
            self._put(lambda _: settle(), None)
        else:
            settle()

    def _put(self, call: Callable[..., None], arg: Any) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="zres-client-output",
                                            daemon=True)
            self._thread.start()
        self._queue.put((call, arg))

    def _print(self, items: list[Any]) -> None:
        try:
            print_output(items)
        finally:
            with self._lock:
                self._waiting -= 1

    def _run(self) -> None:
        while True:
            call, arg = self._queue.get()
            try:
                call(arg)
            except Exception:  # (settling or printing: never let the thread die)
                pass


def print_output(items: list[Any]) -> None:
    """Print ITEMS ([id, task name, agent, stream, bytes]) from an ``output`` message."""
    out: list[str] = []
    err: list[str] = []
    for item in items:
        try:
            _, name, agent, stream, data = item
            text = data.decode("utf-8", "replace")
        except (TypeError, ValueError, AttributeError):
            continue  # malformed: not worth failing the client for
        prefix = f"({name} {agent}) "
        lines = out if stream == 1 else err
        for line in text.splitlines(keepends=True):
            lines.append(prefix + line if line.endswith("\n") else prefix + line + "\n")
    for lines, stream in ((out, sys.stdout), (err, sys.stderr)):
        if lines and stream is not None:
            try:
                stream.write("".join(lines))
                stream.flush()
            except (OSError, ValueError):  # a closed or broken stream: nothing to tell
                pass
