"""How much CPU and memory this process may use: the machine's, narrowed by its CPU
affinity and its cgroup's limits (as Dask's worker does), so that an agent in
``docker run --cpus 4 --memory 8g`` offers CPU=4 and MEMORY=8 GB, not the host's.

Every function takes the file system's root, so tests point it at a directory of cgroup
files of their own.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

_V1_CPU = ("cpu,cpuacct", "cpuacct,cpu", "cpu")


def cpus(root: str | os.PathLike[str] = "/", affinity: set[int] | None = None,
         machine: int | None = None) -> tuple[int, str]:
    """Return how many CPUs this process may use, and why that many.

    The machine's count, the CPUs it may run on (``taskset``, a cpuset), and a cgroup CPU
    quota rounded up (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), whichever is least.
    AFFINITY: the process's own (``os.sched_getaffinity``) and MACHINE the machine's
    count (``os.cpu_count``) unless given.
    """
    count, why = machine or os.cpu_count() or 1, "the machine's CPU count"
    if affinity is None and hasattr(os, "sched_getaffinity"):
        affinity = os.sched_getaffinity(0)
    if affinity and len(affinity) < count:
        count, why = len(affinity), "the process's CPU affinity"
    base = Path(root)
    for path in _candidates(base, "", "cpu.max"):
        quota, _, period = _read(path).partition(" ")  # "max 100000": no quota
        if quota.isdigit() and period.isdigit() and int(period) > 0:
            limit = math.ceil(int(quota) / int(period))
            if 0 < limit < count:
                count, why = limit, f"cgroup {_show(base, path)} ({quota} {period})"
    for controller in _V1_CPU:
        for path in _candidates(base, controller, "cpu.cfs_quota_us"):
            us, period_us = _int(path), _int(path.with_name("cpu.cfs_period_us"))
            if us is not None and period_us and us > 0:  # (-1: no quota)
                limit = math.ceil(us / period_us)
                if 0 < limit < count:
                    count, why = limit, f"cgroup {_show(base, path)} ({us}/{period_us})"
    return count, why


def memory(root: str | os.PathLike[str] = "/",
           physical: int | None = None) -> tuple[int, str]:
    """Return how many bytes of memory this process may use, and why that many: the
    machine's, or less where its cgroup says (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``; "max" and v1's huge "unlimited" are no limit).
    PHYSICAL: the machine's memory unless given (0 where it cannot be told)."""
    total = _physical() if physical is None else physical
    why = "the machine's memory"
    base = Path(root)
    for path in memory_limit_files(root):
        limit = _int(path)
        if limit is not None and limit > 0 and (not total or limit < total):
            total, why = limit, f"cgroup {_show(base, path)}"
    return total, why


def memory_limit_files(root: str | os.PathLike[str] = "/") -> list[Path]:
    """The memory limit files of this process's cgroup and those above it (v2
    ``memory.max``, v1 ``memory.limit_in_bytes``) that exist under ROOT."""
    base = Path(root)
    return [*_candidates(base, "", "memory.max"),
            *_candidates(base, "memory", "memory.limit_in_bytes")]


def _candidates(base: Path, controller: str, name: str) -> Iterator[Path]:
    """The files NAME of this process's cgroup and of each cgroup above it, for cgroup v2
    (CONTROLLER "") or a v1 CONTROLLER, that exist under BASE."""
    mounts = ([base / "sys/fs/cgroup", base / "sys/fs/cgroup/unified"] if not controller
              else [base / "sys/fs/cgroup" / controller])
    own = _own_cgroup(base, controller)
    for mount in mounts:
        parts = Path(own.lstrip("/")).parts if own else ()
        # From this process's cgroup up to the mount's root: a limit set above applies
        # too; a path that does not exist here (no cgroup namespace) leaves the root.
        for depth in range(len(parts), -1, -1):
            path = mount.joinpath(*parts[:depth], name)
            if path.is_file():
                yield path


def _own_cgroup(base: Path, controller: str) -> str:
    """This process's cgroup path for CONTROLLER ("": cgroup v2), from /proc/self/cgroup."""
    wanted = set(controller.split(",")) if controller else set()
    for line in _read(base / "proc/self/cgroup").splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        if (not controller and fields[0] == "0" and not fields[1]) or (
                controller and wanted <= set(fields[1].split(","))):
            return fields[2]
    return ""


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, ValueError):
        return ""


def _int(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text.lstrip("-").isdigit() else None


def _show(base: Path, path: Path) -> str:
    return "/" + str(path.relative_to(base))


def _physical() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0
