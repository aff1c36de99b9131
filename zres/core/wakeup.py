"""A loop woken by the signals it handles: the process's signal wakeup descriptor, polled
beside its sockets.

Python runs a signal's handler between bytecodes, but a zmq poll it interrupts resumes
its wait: a broker's or agent's loop heard SIGTERM or Ctrl-C only when its poll timed out,
a quarter of a second later (every stop of a local cluster waited that, per process). With
the descriptor polled, the poll returns at once and the loop sees the handler's flag.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any


def wake_on_signals(poller: Any) -> int | None:
    """Have POLLER (a zmq poller) return when a signal with a Python handler arrives;
    return the descriptor it polls (``drain`` it when it is readable), or None where
    signals cannot be waited for so (a thread other than the main one)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    poller.register(read, 1)  # (zmq.POLLIN)
    return read


def drain(fd: int) -> None:
    """Read what signals wrote to FD, so that it wakes the poll no more."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


class Waker:
    """A thread's stop flag, and a descriptor it polls beside its sockets that ``stop``
    (from another thread) makes readable: it hears the stop at once, not at its poll's
    timeout."""

    def __init__(self) -> None:
        self.stopped = False
        self.fd, self._write = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write, False)

    def stop(self) -> None:
        self.stopped = True
        try:
            os.write(self._write, b"!")
        except OSError:
            pass  # (woken already, or closed)

    def close(self) -> None:
        for fd in (self.fd, self._write):
            try:
                os.close(fd)
            except OSError:
                pass
