"""Process trees and their memory, read from /proc (Linux): what the watcher samples.

A tree is a root process, its descendants (by parent), and, if the root leads a session
of its own (a command job, a task's own process), every process of that session: a child
whose parent has died still counts. Its memory is the sum of its processes' resident set
and swap (``VmRSS`` + ``VmSwap``): pages shared between them (a fork's copy-on-write, a
shared library) count once per process, so a tree of forked processes reads more than it
holds, never less.

The processes made since a moment are found without reading every process: the kernel
hands out process ids in turn (``ns_last_pid`` says the last one, ``pid_max`` where it
wraps), so those made since are the ids after the last one then (``last_pid``, ``since``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable

PROC = "/proc"


def usable() -> bool:
    """Whether this system's processes can be read here (Linux's /proc)."""
    return os.path.isfile(f"{PROC}/self/status") and os.path.isfile(f"{PROC}/self/stat")


def table() -> dict[int, tuple[int, int]]:
    """Every process now: pid -> (parent pid, session id). (One read per process: about
    15 microseconds each; the watcher does it a few times a second, not at every sample.)"""
    found: dict[int, tuple[int, int]] = {}
    for entry in os.listdir(PROC):
        if entry.isdigit():
            _stat(int(entry), found)
    return found


def last_pid() -> int | None:
    """The last process id the kernel handed out (in this /proc's namespace), or None where
    it does not say."""
    try:
        with open(f"{PROC}/sys/kernel/ns_last_pid", "rb") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return None


def since(last: int, now: int) -> dict[int, tuple[int, int]]:
    """The processes with the ids handed out after LAST up to NOW (``last_pid`` both; the
    ids wrap at ``pid_max``): pid -> (parent pid, session id), as ``table``. (A thread's
    id reads as its process: a process of a tree then, and moved as a whole.)"""
    found: dict[int, tuple[int, int]] = {}
    if now >= last:
        ids: Iterable[int] = range(last + 1, now + 1)
    else:  # (wrapped: the kernel goes on from 300; from 1 here, a few reads more)
        try:
            with open(f"{PROC}/sys/kernel/pid_max", "rb") as fh:
                top = int(fh.read())
        except (OSError, ValueError):
            top = 1 << 22
        ids = [*range(last + 1, top), *range(1, now + 1)]
    for pid in ids:
        _stat(pid, found)
    return found


def stat(pid: int) -> list[bytes] | None:
    """The fields of PID's /proc/PID/stat after its command's name: state, parent pid,
    process group, session, ... (``proc(5)``'s from the third); None if it ended meanwhile,
    or never was."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
    return data.rpartition(b")")[2].split()


def _stat(pid: int, found: dict[int, tuple[int, int]]) -> None:
    """Put PID's (parent pid, session id) in FOUND, if it is there."""
    fields = stat(pid)
    if fields is not None and len(fields) > 3:
        found[pid] = (int(fields[1]), int(fields[3]))


def members(root: int, processes: dict[int, tuple[int, int]]) -> set[int]:
    """ROOT's tree in PROCESSES (see ``table``): itself, its descendants, and its session's
    processes if it leads one. Empty if ROOT is gone."""
    if root not in processes:
        return set()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in processes.items():
        children.setdefault(parent, []).append(pid)
    found, stack = {root}, [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    if processes[root][1] == root:  # a session leader: its session is its own
        found.update(pid for pid, (_, session) in processes.items() if session == root)
    return found


def resident(pid: int) -> int:
    """PID's resident memory plus its swap, in bytes (0 if it is gone, or a zombie)."""
    try:
        with open(f"{PROC}/{pid}/status", "rb") as fh:
            data = fh.read()
    except OSError:
        return 0
    total = 0
    for line in data.splitlines():
        if line.startswith((b"VmRSS:", b"VmSwap:")):
            total += int(line.split()[1]) * 1024  # (kB)
    return total


def kill(pids: Iterable[int]) -> None:
    """SIGKILL each of PIDS that is still there."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_first(pid: int, score: int = 500) -> None:
    """Tell the kernel to pick PID (a task's process) before the agent, should the node
    run out of memory before the agent has stopped anything: a higher ``oom_score_adj``
    (raising it needs no privilege; children inherit it)."""
    try:
        with open(f"{PROC}/{pid}/oom_score_adj", "w") as fh:
            fh.write(str(score))
    except OSError:
        pass  # gone already, or not Linux
