"""How the broker's loop waits for its next message: it polls for a moment (``spin``
seconds) before it sleeps, while such moments keep catching messages.

A process asleep in a poll is woken by the kernel, and on a virtual machine whose idle
CPUs halt without polling first (the development VM's do: its kernel turns guest halt
polling off) each wake-up is an exit to the host: 100 to 200 us, against a few on bare
metal or where the host polls before it deschedules a halted CPU. A short task's round trip
wakes the broker twice (its submit, its result), and the broker is the hub every other
hop goes through. Polling for up to a millisecond after a turn takes those wake-ups off the
path (bench/history/latency-2026-11-27-session8.txt: 0.80 of the median on two cores).

It costs CPU while messages come, none while idle: the loop spins only while one of its
last ``_CREDIT`` waits ended within the window (a wait asleep counts as well: would a spin
have caught it?). A broker whose messages come further apart, as long tasks' do, stops
spinning after a few misses and sleeps as before. A wait that caught only heartbeats counts
as a miss (``fruitful``): a thousand agents beating every half second are a message every
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

from ..logs import get_logger
from .metrics import Traffic

log = get_logger("zres.broker")

DEFAULT_SPIN = 0.001  # seconds
_CREDIT = 4  # waits in a row that catch nothing before the loop stops spinning


class SpinningPoller:
    """POLLER's ``poll`` (a zmq poller), spinning for up to SPIN seconds first while
    that pays (see above; None: ``default_spin``); the seconds spun are added to
    TRAFFIC's ``spun``."""

    def __init__(self, poller: Any, spin: float | None, traffic: Traffic) -> None:
        self._poller = poller
        self.spin = default_spin() if spin is None else spin
        self._traffic = traffic
        self._credit = 0  # (spinning while positive)
        self._was = 0  # (the credit before the last wait)
        # Set by the loop when what the last wait caught was worth catching early (work,
        # not heartbeats); a wait that caught nothing else counts as a miss.
        self.fruitful = False

    def poll(self, timeout_ms: int) -> list[tuple[Any, int]]:
        """Wait up to TIMEOUT_MS milliseconds for events; return them (poll's list)."""
        if not self.fruitful:
            self._credit = max(self._was - 1, 0)
        self.fruitful = False
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


def default_spin(cgroups: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float:
    """``DEFAULT_SPIN``, or 0 under a CPU quota of less than two CPUs (a container's limit,
    a service's CPUQuota): a spinning core uses up the quota, and the kernel then stops the
    whole group for the rest of its period, far longer than a wake-up."""
    quota = cpu_quota(cgroups, root)
    if quota is not None and quota < 2:
        log.info("broker_spin_off", cpu_quota=quota, why="a CPU quota under two CPUs")
        return 0.0
    return DEFAULT_SPIN


def cpu_quota(cgroups: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float | None:
    """The fewest CPUs a cgroup quota allows this process, on its own group or any above
    it (cgroup v2's ``cpu.max``, v1's ``cpu.cfs_quota_us``); None where there is none."""
    try:
        with open(cgroups) as lines:
            groups = [line.rstrip("\n").split(":", 2) for line in lines]
    except OSError:
        return None  # (not Linux)
    found: list[float] = []
    for fields in groups:
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # v2: one hierarchy
            base, read = root, _v2_quota
        elif "cpu" in controllers.split(","):
            base, read = os.path.join(root, controllers), _v1_quota
        else:
            continue
        parts = [part for part in path.split("/") if part]
        for depth in range(len(parts), -1, -1):
            quota = read(os.path.join(base, *parts[:depth]))
            if quota is not None:
                found.append(quota)
    return min(found, default=None)


def _v2_quota(directory: str) -> float | None:
    try:
        with open(os.path.join(directory, "cpu.max")) as text:
            quota, period = text.read().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(directory: str) -> float | None:
    try:
        with open(os.path.join(directory, "cpu.cfs_quota_us")) as text:
            quota = int(text.read())
        with open(os.path.join(directory, "cpu.cfs_period_us")) as text:
            period = int(text.read())
        return None if quota < 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None
