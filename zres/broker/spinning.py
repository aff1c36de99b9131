"""How the broker's loop waits for its next message: it polls for a moment (``spin``
seconds) before it sleeps, while such moments keep catching messages.

A process asleep in a poll is woken by the kernel, and on a virtual machine whose idle
CPUs halt (most clouds', where the guest does not poll before halting) each wake-up is an
exit to the host: 100 to 200 us, against a few on bare metal. A short task's round trip
wakes the broker twice (its submit, its result), and the broker is the hub every other
hop goes through. Polling for up to a millisecond after a turn takes those wake-ups off the
path (bench/history/latency-2026-11-27-session8.txt: 0.80 of the median on two cores).

It costs CPU while messages come, none while idle: the loop spins only while one of its
last ``_CREDIT`` waits ended within the window (a wait asleep counts as well: would a spin
have caught it?). A broker whose messages come further apart, as long tasks' do, stops
spinning after a few misses and sleeps as before. A wait that caught only heartbeats counts
as a miss (``unfruitful``): a thousand agents beating every half second are a message every
half millisecond, and would keep an idle broker spinning on most of a core for nothing.
While other threads wait for a CPU (the agents and workers of a map, on the broker's
machine) a spin yields its CPU between polls: spinning regardless cost a 1,000-task map 6%
of its throughput on two cores, and 5 ms tasks 10% of their round trip. ``[broker] spin =
0`` turns it off.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .metrics import Traffic

DEFAULT_SPIN = 0.001  # seconds
_CREDIT = 4  # waits in a row that catch nothing before the loop stops spinning


class SpinningPoller:
    """POLLER's ``poll`` (a zmq poller), spinning for up to SPIN seconds first while
    that pays (see above; None: ``DEFAULT_SPIN``); the seconds spun are added to
    TRAFFIC's ``spun``."""

    def __init__(self, poller: Any, spin: float | None, traffic: Traffic) -> None:
        self._poller = poller
        self.spin = DEFAULT_SPIN if spin is None else spin
        self._traffic = traffic
        self._credit = 0  # (spinning while positive)
        self._was = 0  # (the credit before the last wait: see ``unfruitful``)

    def poll(self, timeout_ms: int) -> list[tuple[Any, int]]:
        """Wait up to TIMEOUT_MS milliseconds for events; return them (poll's list)."""
        self._was = self._credit
        if self.spin <= 0 or timeout_ms <= 0:
            return self._poller.poll(timeout_ms)
        start = time.monotonic()
        window = min(self.spin, timeout_ms / 1000)
        if self._credit > 0:
            while True:
                events = self._poller.poll(0)
                now = time.monotonic()
                if events or now - start >= window:
                    break
                if others_wait_for_a_cpu():
                    os.sched_yield()
            self._traffic.spun += now - start
            if events:
                self._credit = _CREDIT
                return events
            # (the spin is part of the wait: the loop's timeout is not put off by it)
            timeout_ms = max(timeout_ms - int((now - start) * 1000), 0)
        events = self._poller.poll(timeout_ms)
        if events and time.monotonic() - start < window:
            self._credit = _CREDIT  # (a spin would have caught it: spin from now on)
        else:
            self._credit = max(self._credit - 1, 0)
        return events

    def unfruitful(self) -> None:
        """What the last wait caught was not worth catching early (heartbeats): it counts
        as a miss."""
        self._credit = max(self._was - 1, 0)


_loadavg: int | None = None  # (/proc/loadavg, opened once per process; -1: none)
_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def others_wait_for_a_cpu() -> bool:
    """Whether more threads are runnable on this machine than this process has CPUs (the
    kernel's count now, in /proc/loadavg: 2 us to read); True where it cannot be known."""
    global _loadavg
    try:
        if _loadavg is None:
            _loadavg = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
        if _loadavg >= 0:
            return int(os.pread(_loadavg, 128, 0).split()[3].split(b"/")[0]) > (_cpus or 1)
    except (OSError, ValueError, IndexError):
        _loadavg = -1  # (not Linux: not asked again)
    return True  # (unknown: yield at every poll, as when the machine is busy)
