"""The threads a worker process runs its tasks on: made on demand, reused, at most a
given number.

A ``concurrent.futures.ThreadPoolExecutor`` without the future: the worker reads no
task's outcome from it (each reports its own), and a future, its condition and its work
item cost a few microseconds a task on both threads, on the path of every task."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from ..logs import get_logger

log = get_logger("zres.worker")


class TaskThreads:
    """Run what is handed over on an idle thread, or a new one while fewer than MOST
    exist (past that, it waits for one to be free). Threads are named PREFIX_N."""

    def __init__(self, most: int, prefix: str) -> None:
        self._most = most
        self._prefix = prefix
        self._calls: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = \
            queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0   # threads done with their call and not yet handed another

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run FN(*ARGS) on one of the threads. FN reports its own outcome (a task's error
        included): what escapes it is a bug of the worker's, which ends the process, as on
        its main thread (its agent then fails what it ran as lost, rather than wait for
        ever on an outcome that will never be sent)."""
        with self._lock:
            if self._idle:
                self._idle -= 1
            elif self._threads < self._most:
                self._threads += 1
                threading.Thread(target=self._serve, daemon=True,
                                 name=f"{self._prefix}_{self._threads - 1}").start()
        self._calls.put((fn, args))

    def _serve(self) -> None:
        calls, lock = self._calls, self._lock
        while True:
            fn, args = calls.get()
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 (see submit)
                log.exception("task_thread_failed")
                os._exit(70)
            del fn, args  # (nothing of a call outlives it here)
            with lock:
                self._idle += 1
