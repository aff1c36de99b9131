"""Stopping a running Python call from outside its thread (a cancel with ``force=True``).

The only way into a running call is an exception raised asynchronously in its thread
(``PyThreadState_SetAsyncExc``): it lands at the thread's next bytecode boundary, so
``finally`` blocks and ``with`` exits run, but a call blocked in C (a long ``sleep``, a
socket read, a CUDA kernel) sees it only when that returns. The agent kills the worker
process when a stopped call has not ended within a grace; this is the gentle first step.

It must land in the user's call and nowhere else: it is raised only while the call runs
(between ``enter`` and ``leave``, under one lock), at most once per call, and ``leave``
withdraws it if it has not landed yet. It can still land in the few bytecodes between the
user's function returning and ``leave``: the worker's outer frame catches ``Stopped`` for
that, and since it lands at most once, nothing can interrupt that handler.
"""

from __future__ import annotations

import ctypes
import threading


class Stopped(BaseException):
    """Raised in a call's thread to stop it: a BaseException, so that ``except
    Exception`` in the user's code does not swallow it (as with KeyboardInterrupt)."""


class CallStopper:
    """Which thread runs which call, and the stops asked for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: dict[int, int] = {}   # task id -> thread ident, while the call runs
        self._raised: set[int] = set()       # stops raised, maybe not landed yet

    def enter(self, task_id: int) -> None:
        """The calling thread starts running TASK_ID's call."""
        with self._lock:
            self._threads[task_id] = threading.get_ident()

    def leave(self, task_id: int) -> None:
        """The calling thread is done with TASK_ID's call: withdraw a stop that has not
        landed (safe to call twice)."""
        with self._lock:
            ident = self._threads.pop(task_id, None)
            if task_id in self._raised:
                self._raised.discard(task_id)
                if ident is not None:
                    _set_async_exc(ident, None)

    def stop(self, task_id: int) -> bool:
        """Raise Stopped in the thread running TASK_ID; whether it was running."""
        with self._lock:
            ident = self._threads.get(task_id)
            if ident is None or task_id in self._raised:
                return False
            self._raised.add(task_id)
            _set_async_exc(ident, Stopped)
            return True


def _set_async_exc(ident: int, exc: type[BaseException] | None) -> None:
    """Raise EXC in thread IDENT at its next bytecode (None: withdraw a pending one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(ident), ctypes.py_object(exc) if exc is not None else None)
