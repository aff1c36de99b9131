"""A worker process's side of the data plane: a result too big to travel inline is kept in
its agent's store, and an input held there is read in place (mapped: no copy through a
socket), or, held on another agent, fetched into this agent's store first.

An input on an agent this one cannot reach is fetched through the broker's relay, as a
client's results are (``zres.core.relaying``: its port refuses, or it does not answer),
with the agent's key.

Inputs are fetched before a task's body runs: should one be lost (its holder gone), the
task ends ``InputLostError`` having run nothing of its own, and the broker runs it again,
uncharged, once that input is back (or fails it with the input's loss).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ...core import objects as O
from ...core import transfer as T
from ...core.context import current_task
from ...core.errors import ZresError
from ...core.relaying import Routes, mode_of

INLINE = 64 * 1024   # a result of at most this many bytes travels with the task's end
ENV = "ZRES_OBJECTS"  # the agent's store, for its workers: "MEMORY_DIR:SPILL_DIR"
FETCH_TIMEOUT = 10.0  # seconds without a chunk before an input's holder counts as gone


class InputLost(Exception):
    """An input could not be fetched (the text says which, and why)."""

    def __init__(self, object_id: int, why: str) -> None:
        super().__init__(why)
        self.object_id = object_id


class WorkerObjects:
    """The agent's store as a worker process sees it (``ENV``); None dirs: no store (every
    result travels inline)."""

    def __init__(self, spec: str | None = None) -> None:
        spec = spec if spec is not None else os.environ.get(ENV, "")
        memory, _, spill = spec.partition(":")
        self.memory_dir, self.spill_dir = memory or None, spill or None
        self._transfers: T.Transfers | None = None
        self._lock = threading.Lock()
        self.replicas: list[list[int]] = []   # [id, size] fetched here, for the agent

    def keep(self, task_id: int, frames: list[Any], fn: Any = None,
             agent: str = "") -> tuple[list[Any], dict[str, Any]]:
        """FRAMES of TASK_ID's result (of FN, on AGENT) as they go to the agent, and what
        to add to its info: inline if small, else written to the store ({"stored": size},
        no frames); an OSError saying so if it cannot be."""
        if self.memory_dir is None or sum(memoryview(f).nbytes for f in frames) <= INLINE:
            return frames, {}
        try:
            size = O.write_object(os.path.join(self.memory_dir, str(task_id)), frames)
        except OSError as exc:  # (its file system full, say: not the body's own failure,
            # which a bare "No space left on device" was taken for)
            what = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or fn
            why = (f"the result of task {task_id} ({what}) on agent {agent} could not be "
                   f"kept in its store at {self.memory_dir}: {exc.strerror or exc}")
            raise (OSError(exc.errno, why) if exc.errno else OSError(why)) from exc
        return [], {"stored": size}

    def _path(self, object_id: int) -> str | None:
        for where in (self.memory_dir, self.spill_dir):
            if where is not None and os.path.exists(os.path.join(where, str(object_id))):
                return os.path.join(where, str(object_id))
        return None

    def inputs(self, deps: list[list[Any]], refs: dict[Any, Any] | None) -> list[list[Any]]:
        """DEPS (each input's frames) with those sent as references (REFS: input's index
        -> Ref's wire form) read from the store, fetched into it first if held elsewhere;
        InputLost if one cannot be."""
        if not refs:
            return deps
        out = list(deps)
        for index, wire in refs.items():
            try:
                ref = T.Ref.from_wire(wire)
            except ValueError as exc:  # (none of its holders connected: a broker restarted
                # before they came back) the task ran nothing: lost, not this worker's end
                known = isinstance(wire, list) and wire and type(wire[0]) is int
                raise InputLost(wire[0] if known else -1,
                                f"input {wire[0] if known else index} cannot be read "
                                f"now: {exc}") from None
            path = self._path(ref.id)
            if path is None:
                try:
                    path = self._fetch(ref)
                except OSError as exc:  # (no copy can be kept here: its file system full)
                    out[int(index)] = self._fetch_here(ref, exc)
                    continue
            try:
                out[int(index)] = O.read_object(path)
            except (OSError, O.ObjectError) as exc:
                raise InputLost(ref.id, f"input {ref.id} cannot be read here: {exc}") \
                    from None
        return out

    def _transfers_(self) -> T.Transfers:
        with self._lock:
            if self._transfers is None:
                self._transfers = T.Transfers(timeout=FETCH_TIMEOUT, routes=_routes())
            return self._transfers

    def _fetch(self, ref: T.Ref) -> str:
        """Fetch REF into this agent's store; return its path there (InputLost if its
        holders fail; OSError if the copy cannot be written here)."""
        if self.memory_dir is None:
            raise InputLost(ref.id, f"input {ref.id} is on another agent, and this one has "
                            "no store to fetch it into")
        path = os.path.join(self.memory_dir, str(ref.id))
        try:
            self._transfers_().fetch_to(ref, path)
        except T.TransferError as exc:
            raise InputLost(ref.id, str(exc)) from None
        with self._lock:
            self.replicas.append([ref.id, ref.size])
        return path

    def _fetch_here(self, ref: T.Ref, why: OSError) -> list[Any]:
        """REF's frames fetched into this process's memory alone, its store unable to keep
        a copy (WHY): the task runs (the input lost, it was granted again and failed
        again, for ever)."""
        try:
            return self._transfers_().fetch([ref])[0]  # type: ignore[return-value]
        except (T.TransferError, OSError) as exc:
            raise InputLost(ref.id, f"input {ref.id} cannot be kept on this agent ({why}), "
                            f"nor read into memory: {exc}") from None

    def take_replicas(self) -> list[list[int]]:
        """The inputs fetched here since last asked: [id, size] each."""
        with self._lock:
            taken, self.replicas = self.replicas, []
        return taken


def _routes() -> Routes:
    """Which way this worker's fetches go: its agent's broker, and its agent's key (as the
    agent reaches the broker, so does its worker the relay)."""
    broker = os.environ.get("ZRES_BROKER", "")
    task = current_task()
    agent = task.agent if task is not None else None
    try:
        from ...config import find_key  # (only a worker reading inputs needs its key)
        key = find_key(None, ("agent",), broker, name=agent)
    except ZresError:  # (none: it reaches holders directly only, or a relay without keys)
        key = None
    return Routes(broker, f"agent {agent}" if agent else "a worker", key, mode_of(None))
