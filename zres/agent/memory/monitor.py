"""The agent's memory monitor: a thread that samples what it watches and the node.

Watched things are the process trees of a node's own-process work (a task that asked for
MEMORY, an actor, a command job), each by the broker's id for it, with the limit it asked
for (None: figures only). In cgroup mode each has a cgroup the kernel limits; the thread
reads its figures and tells an out-of-memory kill by the cgroup's count of them (on v1,
where the kernel kills one process, it kills the rest). In watcher mode the thread sums the
tree's resident memory and swap every ``INTERVAL`` and kills the whole tree past its limit:
a tree is found again every quarter second or so (less often where reading every process
costs more), so a new process in it counts from then. Work with no limit is sampled every
``SLOW`` seconds, for its figures.

Every ``NODE_INTERVAL`` it reads what the node has available; below the reserve it says
the node is low (``low``) and wakes the agent's loop (``fd`` becomes readable), which stops
taking work and stops something (``guard``); the node is well again once it has the reserve
and a little more (``slack``) available.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import ZresError
from ...core.resources import format_bytes
from ...logs import get_logger
from . import node, procs
from .cgroups import Cgroups, detect

log = get_logger("zres.agent")
INTERVAL = 0.05       # seconds between samples of a limited tree
SLOW = 0.5            # ... of one with no limit (figures only)
NODE_INTERVAL = 0.1   # ... of the node's available memory


@dataclass(slots=True, eq=False)
class Watched:
    """One process tree the monitor watches."""

    id: int                   # the broker's id of the task, job or actor placement
    pid: int                  # its root process
    limit: int | None         # bytes (None: figures only)
    cgroup: str = ""          # its cgroup's path, in cgroup mode
    members: set[int] = field(default_factory=set)
    current: int = 0
    peak: int = 0
    killed: str = ""          # "limit": past its limit; else why the node needed it gone


def memory_error(unit: Watched, what: str, agent: str) -> dict[str, Any]:
    """The outcome of WHAT (a task, a job, an actor's process) on AGENT, killed for memory
    (UNIT says why): a MemoryLimitError naming the limit, the peak and the agent."""
    if unit.killed == "limit":
        message = (f"{what} exceeded its memory limit on agent {agent}: it asked for "
                   f"MEMORY={format_bytes(unit.limit or 0)} and reached "
                   f"{format_bytes(unit.peak)}")
    else:
        message = (f"node out of memory on agent {agent}: {unit.killed}; {what} was "
                   f"stopped, having used {format_bytes(unit.peak)}")
    return {"type": "MemoryLimitError", "message": message, "limit": unit.limit,
            "peak": unit.peak}


class Monitor:
    """Watch process trees' memory (limits enforced by CGROUPS, or by this thread when
    there are none and ENFORCE), and the node's, against RESERVE bytes."""

    def __init__(self, cgroups: Cgroups | None, enforce: bool, reserve: int,
                 available: Callable[[], int | None] = node.available) -> None:
        self.cgroups = cgroups
        self.enforce = enforce and (cgroups is not None or procs.usable())
        self.mode = cgroups.mode if cgroups is not None else \
            "watcher" if self.enforce else "off"
        self.reserve = reserve
        self.slack = max(64 << 20, min(reserve // 4, 256 << 20))  # (well again past it)
        self.available: int | None = None
        self.low = False
        self._available = available
        self._units: dict[int, Watched] = {}
        self._removing: list[str] = []     # cgroups still busy when their work ended
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._rescan = True
        self._wake_r = self._wake_w = -1   # (made by start: an agent's loop polls it)
        self._thread = threading.Thread(target=self._run, name="zres-memory", daemon=True)

    @property
    def fd(self) -> int:
        """Readable when the node has become low, or well again."""
        return self._wake_r

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass

    def start(self) -> None:
        """Remove what an agent killed outright left in its cgroups; start watching."""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        if self.cgroups is not None:  # what an agent killed outright left behind
            for path in self.cgroups.leftovers():
                self.cgroups.kill(path)
                self._removing.append(path)
            self.cgroups.sweep()
        self._thread.start()

    def close(self) -> None:
        """Stop the thread; remove every cgroup made (their processes are killed)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        if self.cgroups is not None:
            for unit in self._units.values():
                if unit.cgroup:
                    self.cgroups.kill(unit.cgroup)
                    self._removing.append(unit.cgroup)
            deadline = time.monotonic() + 2
            while self._removals() and time.monotonic() < deadline:
                time.sleep(0.02)  # (the kernel frees a killed process's cgroup shortly)
            self.cgroups.close()
        if self._wake_r >= 0:
            os.close(self._wake_r)
            os.close(self._wake_w)

    # -- what the agent's loop calls --------------------------------------------------
    def watch(self, unit_id: int, pid: int, limit: int | None, started: bool = False) -> None:
        """Watch PID's tree for UNIT_ID, limited to LIMIT bytes (None: figures only). Call
        it before the process runs anything of the task's: in cgroup mode the process is
        moved into a cgroup of its own now (what it uses before is not counted). STARTED:
        it runs already (a command job), and may have started others: they are moved too."""
        unit = Watched(unit_id, pid, limit if self.enforce else None, members={pid})
        procs.kill_first(pid)
        if self.cgroups is not None:
            try:
                unit.cgroup = self.cgroups.make(f"t-{unit_id}", unit.limit)
                self.cgroups.enter(unit.cgroup, pid)
                if started:
                    self._gather(unit)
            except OSError as exc:  # (a full cgroup tree, a process gone): watched here
                log.warning("cgroup_failed", id=unit_id, error=str(exc))
                if unit.cgroup:
                    self._removing.append(unit.cgroup)
                unit.cgroup = ""
        with self._lock:
            self._units[unit_id] = unit
            self._rescan = True

    def _gather(self, unit: Watched) -> None:
        """Move into UNIT's cgroup what its process started before it was moved there (a
        job's shell may fork at once: left outside, that child would have no limit). What
        a process inside starts is inside: a few looks find none left outside. Every
        process is read once, at the first look; the later ones read only the processes
        made since (``procs.since``: what one moved started before it was), not all of
        /proc again at each job's start (where the kernel does not say which ids it handed
        out last, every process is read again)."""
        assert self.cgroups is not None
        last = procs.last_pid()
        processes = procs.table()
        for look in range(3):
            outside = procs.members(unit.pid, processes) - set(
                self.cgroups.pids(unit.cgroup))
            for pid in outside:
                try:
                    self.cgroups.enter(unit.cgroup, pid)
                except OSError:  # (it ended meanwhile)
                    processes.pop(pid, None)
            if not outside or look == 2:
                return
            now = procs.last_pid() if last is not None else None
            if last is None or now is None:
                processes = procs.table()
            else:  # (an id reused since is read anew: its parent now)
                processes.update(procs.since(last, now))
                last = now

    def forget(self, unit_id: int) -> Watched | None:
        """Stop watching UNIT_ID (its work ended): its record, with its peak and whether it
        was killed for memory; its cgroup is removed (once empty)."""
        with self._lock:
            unit = self._units.pop(unit_id, None)
        if unit is not None and unit.cgroup and self.cgroups is not None:
            current, peak = self.cgroups.usage(unit.cgroup)
            unit.peak = max(unit.peak, peak)
            if unit.limit is not None and not unit.killed and self.cgroups.oom_kills(unit.cgroup):
                unit.killed = "limit"
            self.cgroups.kill(unit.cgroup)  # what its process left behind
            if not self.cgroups.remove(unit.cgroup):
                with self._lock:
                    self._removing.append(unit.cgroup)
        return unit

    def get(self, unit_id: int) -> Watched | None:
        return self._units.get(unit_id)

    def kill(self, unit_id: int, why: str) -> bool:
        """Kill UNIT_ID's whole tree now, saying WHY (the node ran low); False if it is not
        watched."""
        with self._lock:
            unit = self._units.get(unit_id)
            if unit is None:
                return False
            unit.killed = unit.killed or why
            self._kill(unit, procs.members(unit.pid, procs.table()) | unit.members)
        return True

    def figures(self) -> list[list[int]]:
        """[id, current, peak] of everything watched (bytes)."""
        return [[u.id, u.current, u.peak] for u in list(self._units.values())]

    def describe(self) -> dict[str, object]:
        """What the agent tells of its node: mode, reserve, available, low."""
        return {"limits": self.mode, "reserve": self.reserve,
                "available": self.available if self.available is not None else -1,
                "low": self.low}

    # -- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        next_scan = next_slow = next_node = 0.0
        while not self._stop.wait(INTERVAL):
            now = time.monotonic()
            try:
                with self._lock:
                    units = [u for u in self._units.values() if not u.killed]
                    rescan, self._rescan = self._rescan, False
                watched = [u for u in units if not u.cgroup]
                if watched and (rescan or now >= next_scan):
                    processes = procs.table()
                    for unit in watched:
                        unit.members = procs.members(unit.pid, processes) or unit.members
                    next_scan = now + max(0.25, 20 * (time.monotonic() - now))
                slow = now >= next_slow
                if slow:
                    next_slow = now + SLOW
                for unit in units:
                    if unit.limit is not None or slow:
                        self._sample(unit)
                if now >= next_node:
                    next_node = now + NODE_INTERVAL
                    self._node()
                if self._removing:
                    self._removals()
            except Exception:  # a bug must not end the watching
                log.exception("memory_monitor_failed")

    def _sample(self, unit: Watched) -> None:
        if unit.cgroup and self.cgroups is not None:
            unit.current, peak = self.cgroups.usage(unit.cgroup)
            unit.peak = max(unit.peak, peak)
            if unit.limit is not None and self.cgroups.oom_kills(unit.cgroup):
                with self._lock:  # (v1 kills one process: the rest go too)
                    if self._units.get(unit.id) is unit and not unit.killed:
                        unit.killed = "limit"
                        self.cgroups.kill(unit.cgroup)
            return
        unit.current = sum(procs.resident(pid) for pid in unit.members)
        unit.peak = max(unit.peak, unit.current)
        if unit.limit is not None and unit.current > unit.limit:
            with self._lock:
                if self._units.get(unit.id) is unit and not unit.killed:
                    unit.killed = "limit"
                    log.warning("memory_limit_exceeded", id=unit.id,
                                limit=format_bytes(unit.limit), used=format_bytes(unit.current),
                                processes=len(unit.members))
                    self._kill(unit, unit.members)

    def _kill(self, unit: Watched, members: set[int]) -> None:
        if unit.cgroup and self.cgroups is not None:
            self.cgroups.kill(unit.cgroup)
        procs.kill(members)

    def _node(self) -> None:
        self.available = available = self._available()
        if available is None:
            return
        low = available < self.reserve or (self.low and available < self.reserve + self.slack)
        if low != self.low:
            self.low = low
            with contextlib.suppress(BlockingIOError):
                os.write(self._wake_w, b"x")

    def _removals(self) -> list[str]:
        """Remove the cgroups whose processes have gone; return those still busy."""
        with self._lock:
            busy = [p for p in self._removing
                    if self.cgroups is not None and not self.cgroups.remove(p)]
            self._removing = busy
        return busy


MODES = ("auto", "cgroup", "watcher", "off")


def open_monitor(mode: str, state_dir: str, reserve: int | None) -> Monitor:
    """The agent's monitor: MODE "auto" limits with cgroups where the agent can make them,
    else with the watcher; "cgroup" or "watcher" insist (cgroups that cannot be made are an
    error, naming why); "off" limits nothing (figures and the node's reserve remain).
    RESERVE: bytes (None: ``node.RESERVE_SHARE`` of the node's memory). STATE_DIR names the
    agent's cgroups, so its next start finds what it left."""
    if mode not in MODES:
        raise ValueError(f"memory_limits must be one of {', '.join(MODES)}, got {mode!r}")
    found: Cgroups | None = None
    why = "asked for" if mode in ("watcher", "off") else ""
    if mode in ("auto", "cgroup"):
        tag = hashlib.sha1(os.path.abspath(state_dir).encode()).hexdigest()[:12]
        found, why = detect(tag)
        if found is None and mode == "cgroup":
            raise ZresError(f"memory_limits cgroup: no cgroup can be made here: {why}")
    monitor = Monitor(found, mode != "off",
                      node.default_reserve() if reserve is None else reserve)
    log.info("memory_limits", mode=monitor.mode, cgroups=found.base if found else None,
             reserve=format_bytes(monitor.reserve), **({"not_cgroup": why} if why else {}))
    return monitor
