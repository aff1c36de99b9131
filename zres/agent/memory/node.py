"""How much memory this node can still give, and what the agent keeps in reserve.

Available is the kernel's estimate of what can be allocated without swapping
(``MemAvailable``, which counts reclaimable page cache), or less where the agent's own
cgroup (or one above it) has a limit: that limit, less what the cgroup uses, page cache
it could drop (``inactive_file``) aside. So an agent in ``docker run --memory 8g`` is
protected at its container's limit, not the host's.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import detect

RESERVE_SHARE = 0.05   # the default reserve: 5% of the memory the node has (Ray's 0.95)
_USAGE = {"memory.max": ("memory.current", "inactive_file"),
          "memory.limit_in_bytes": ("memory.usage_in_bytes", "total_inactive_file")}


def meminfo(root: str | os.PathLike[str] = "/") -> dict[str, int]:
    """/proc/meminfo in bytes, by field (MemTotal, MemAvailable, ...)."""
    found = {}
    try:
        text = (Path(root) / "proc/meminfo").read_text()
    except OSError:
        return {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            found[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return found


def available(root: str | os.PathLike[str] = "/") -> int | None:
    """Bytes this node can still give the agent's work (None: it cannot be told here)."""
    info = meminfo(root)
    best = info.get("MemAvailable")
    for path in detect.memory_limit_files(root):
        limit = _int(path)
        if limit is None or limit <= 0 or (info.get("MemTotal") and limit >= info["MemTotal"]):
            continue  # no limit ("max", v1's huge number)
        usage_name, inactive_name = _USAGE[path.name]
        usage = _int(path.with_name(usage_name))
        if usage is None:
            continue
        free = limit - usage + _stat(path.with_name("memory.stat"), inactive_name)
        best = free if best is None else min(best, free)
    return None if best is None else max(best, 0)


def total(root: str | os.PathLike[str] = "/") -> int:
    """The memory this node has for the agent: the machine's, or its cgroup's limit."""
    return detect.memory(root)[0]


def default_reserve(root: str | os.PathLike[str] = "/") -> int:
    """The reserve when none is given: RESERVE_SHARE of the node's memory."""
    return int(total(root) * RESERVE_SHARE)


def _int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat(path: Path, name: str) -> int:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0
