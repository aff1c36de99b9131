"""The objects an agent holds: one file each (``zres.core.objects``), in memory while they
fit its budget, on its disk past it.

The memory tier is a private directory in ``/dev/shm`` (a tmpfs: its files are memory,
and every worker process maps them without a copy), else in the agent's state directory
(the page cache then plays that part). Past ``budget`` bytes there, the objects used least
recently move, in a thread of the store's, to the spill tier in the state directory, and
are read from there (mapped as well) until freed. Nothing of a previous life of the agent
is kept: both directories are emptied at start (a restarted agent is a new session, whose
broker counts nothing it held before).

Whoever makes an object writes its file (a worker process its task's result, the data
server an upload, a worker an input it fetched) and the agent is told (``added``); the
store counts what is where, and frees what the broker lets go of.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from dataclasses import dataclass

from ...logs import get_logger
from ..files import private_dir, safe_name

log = get_logger("zres.agent")
_SHM = "/dev/shm"
SHM_NOTE = "object-store"  # (a file in the agent's state directory: see ``forget_stores``)
MIN_BUDGET = 64 << 20


@dataclass(slots=True)
class _Entry:
    size: int
    spilled: bool = False
    used: float = 0.0    # when last made or read (time.monotonic())
    moving: bool = False


class ObjectStore:
    """The objects held in STATE_DIR's tiers; at most BUDGET bytes in memory."""

    def __init__(self, state_dir: str, budget: int) -> None:
        self.budget = max(int(budget), MIN_BUDGET)
        self.spill_dir = os.path.join(state_dir, "spill")
        self.memory_dir = _memory_dir(state_dir, self.budget)
        for path in (self.memory_dir, self.spill_dir):
            os.close(private_dir(path, "the agent's object store"))
        # (where it is, beside its state: whoever removes the state removes it too, as a
        # local cluster does, whose agents may have been killed: /dev/shm is memory)
        with open(os.path.join(state_dir, SHM_NOTE), "w") as fh:
            fh.write(self.memory_dir)
            _empty(path)
        self.in_shm = self.memory_dir.startswith(_SHM + "/")
        self._objects: dict[int, _Entry] = {}
        self._lock = threading.Lock()  # (the spill thread moves files and marks them)
        self._memory = 0
        self._spilled = 0
        self._moves: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._mover: threading.Thread | None = None

    def path(self, object_id: int) -> str | None:
        """Where OBJECT_ID's file is now (None: not held here)."""
        for where in (self.memory_dir, self.spill_dir):
            path = os.path.join(where, str(int(object_id)))
            if os.path.exists(path):
                return path
        return None

    def new_path(self, object_id: int) -> str:
        """Where a new object OBJECT_ID is written (the memory tier)."""
        return os.path.join(self.memory_dir, str(int(object_id)))

    def added(self, object_id: int, size: int) -> None:
        """OBJECT_ID (SIZE bytes) was written in the memory tier; spill if over budget."""
        with self._lock:
            old = self._objects.pop(object_id, None)
            if old is not None:
                self._forget(old)
            self._objects[object_id] = _Entry(size, used=time.monotonic())
            self._memory += size
        self._spill_if_over()

    def used(self, object_id: int) -> None:
        """OBJECT_ID was read (kept in memory longer than what was not)."""
        entry = self._objects.get(object_id)
        if entry is not None:
            entry.used = time.monotonic()

    def holds(self, object_id: int) -> bool:
        return object_id in self._objects

    def held(self) -> list[list[int]]:
        """[id, size] of every object held (offered to a restarted broker)."""
        with self._lock:
            return [[i, e.size] for i, e in self._objects.items()]

    def free(self, ids: list[int]) -> None:
        """Delete these objects (mappings of them outlive their files)."""
        for object_id in ids:
            with self._lock:
                entry = self._objects.pop(object_id, None)
                if entry is not None:
                    self._forget(entry)
            for where in (self.memory_dir, self.spill_dir):
                try:
                    os.unlink(os.path.join(where, str(int(object_id))))
                except FileNotFoundError:
                    pass

    def _forget(self, entry: _Entry) -> None:
        if entry.spilled:
            self._spilled -= entry.size
        else:
            self._memory -= entry.size

    def stats(self) -> dict[str, int]:
        """What it holds: objects, bytes in memory and on disk, the memory budget."""
        return {"objects": len(self._objects), "memory": self._memory,
                "spilled": self._spilled, "budget": self.budget}

    # -- spilling ---------------------------------------------------------------------------
    def _spill_if_over(self) -> None:
        """Move the least recently used objects to disk until memory is under budget."""
        with self._lock:
            over = self._memory - sum(e.size for e in self._objects.values() if e.moving) \
                - self.budget
            if over <= 0:
                return
            for object_id, entry in sorted(self._objects.items(), key=lambda i: i[1].used):
                if over <= 0:
                    break
                if entry.spilled or entry.moving:
                    continue
                entry.moving = True
                over -= entry.size
                self._moves.put(object_id)
        if self._mover is None:
            self._mover = threading.Thread(target=self._move, name="zres-agent-spill",
                                           daemon=True)
            self._mover.start()

    def _move(self) -> None:
        while (object_id := self._moves.get()) is not None:
            source = os.path.join(self.memory_dir, str(object_id))
            target = os.path.join(self.spill_dir, str(object_id))
            try:
                shutil.copyfile(source, target + ".part", follow_symlinks=False)
                os.chmod(target + ".part", 0o600)
                os.rename(target + ".part", target)
                os.unlink(source)  # (after: a reader looks in memory first, then on disk)
            except OSError as exc:
                log.warning("object_spill_failed", object=object_id, error=str(exc))
                with self._lock:
                    entry = self._objects.get(object_id)
                    if entry is not None:
                        entry.moving = False
                continue
            with self._lock:
                entry = self._objects.get(object_id)
                if entry is None:  # freed while it moved
                    _unlink(target)
                    continue
                entry.moving, entry.spilled = False, True
                self._memory -= entry.size
                self._spilled += entry.size

    def close(self) -> None:
        """Stop moving and delete every object (the agent stops: nobody can ask for them)."""
        if self._mover is not None:
            self._moves.put(None)
            self._mover.join(5)
        for path in (self.memory_dir, self.spill_dir):
            _empty(path)
        if self.in_shm:
            try:
                os.rmdir(self.memory_dir)
            except OSError:
                pass


def _memory_dir(state_dir: str, budget: int) -> str:
    """The memory tier's directory: in /dev/shm if it is there with room for BUDGET, else
    in the state directory."""
    try:
        room = os.statvfs(_SHM)
        if room.f_bavail * room.f_frsize >= budget and os.access(_SHM, os.W_OK):
            return os.path.join(_SHM, f"zres-{os.geteuid()}-{safe_name(state_dir)[-60:]}")
    except OSError:
        pass
    return os.path.join(state_dir, "objects")


def _empty(path: str) -> None:
    for name in os.listdir(path):
        _unlink(os.path.join(path, name))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except IsADirectoryError:
        shutil.rmtree(path, ignore_errors=True)
    except FileNotFoundError:
        pass


def forget_stores(state_root: str) -> None:
    """Remove the memory tiers of the object stores of agents whose state directories are
    under STATE_ROOT (about to be removed: a local cluster's), stopped or killed."""
    for root, _, files in os.walk(state_root):
        if SHM_NOTE in files:
            try:
                with open(os.path.join(root, SHM_NOTE)) as fh:
                    where = fh.read()
            except OSError:
                continue
            if os.path.dirname(where) == _SHM and os.path.basename(where).startswith(
                    f"zres-{os.geteuid()}-"):
                shutil.rmtree(where, ignore_errors=True)
