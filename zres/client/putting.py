"""The putting face of ``zres.Client``: values placed on an agent once, for many tasks to
read (``scatter``, and calls too big to travel with their task), uploaded straight there,
never through the broker."""

from __future__ import annotations

import itertools
import time
import warnings
from typing import TYPE_CHECKING, Any, cast

from ..core import objects as O
from ..core import protocol as P
from ..core import transfer as T
from ..core.errors import ZresError
from ..core.serialize import dumps
from .futures import Future, Owner
from .session import RequestLost


class PutMethods:
    """Mixed into ``Client``: scatter, and the puts behind it."""

    if TYPE_CHECKING:  # (the client's own, used here)
        _io: Any
        _ids: itertools.count[int]
        _fetcher: Any

        def _check_open(self) -> None: ...

    def _put(self, frames: list[Any], name: str) -> Future:
        """Put FRAMES (a pickled value) on an agent the broker chooses, uploaded straight
        there; return its future (a task of this client's that ends once the agent has it
        whole; its result is the value). A failed upload is tried on another agent."""
        size = O.object_size(frames)
        # (why the last try failed, as text: an exception kept here keeps this frame, and
        # with it the value's frames and the future made, until a garbage collection:
        # the value pinned on its agent, and in this process, long after it was used)
        why, tries, waited = "", 0, Waiting(name, self._io.broker_timeout)
        while tries < 3:
            local = next(self._ids)
            future: Future[Any] = Future(cast(Owner, self), local, name)
            with self._io.lock:
                self._check_open()
                self._io.pending[local] = future
            try:
                reply = self._io.request(P.PLACE, {"local": local, "size": size},
                                         self._io.broker_timeout)
            except RequestLost as exc:  # (the broker restarted meanwhile: ask it again)
                why, tries = str(exc), tries + 1
                self._io.pending.pop(local, None)
                self._io.ask(P.CANCEL, {"ids": [local], "force": True})  # (if it was kept)
                continue
            if "error" in reply:
                self._io.pending.pop(local, None)
                self._io.outbox.append((P.RELEASE, local, ()))  # (the broker failed it)
                self._io.wake()
                if reply.get("wait") and waited.another_look():  # (no agent is there yet)
                    continue
                raise ZresError(f"{name} could not be put on an agent: {reply['error']}"
                                + waited.how_long())
            tries += 1
            future._id = reply["id"]
            try:
                self._fetcher.upload(T.Holder(*reply["at"]), reply["id"], reply["token"],
                                     frames)
                return future
            except T.TransferError as exc:
                why = str(exc)  # (the agent went, or could not keep it: stop it, try again)
                self._io.ask(P.CANCEL, {"ids": [local], "force": True})
        raise ZresError(f"{name} could not be put on an agent: {why}")

    def scatter(self, data: Any) -> Any:
        """Put DATA on the cluster once, for many tasks to read (Dask's ``scatter``, Ray's
        ``put``): a future whose result is DATA, kept on an agent; a list, tuple or dict is
        put item by item (a list of futures back). Pass the future to ``submit``."""
        if isinstance(data, (list, tuple)):
            return type(data)(self.scatter(item) for item in data)
        if isinstance(data, dict):
            return {key: self.scatter(value) for key, value in data.items()}
        return self._put(dumps(data), f"scatter-{type(data).__name__}")


class Waiting:
    """How long a put NAME has waited for an agent with a data port to connect (as a task
    waits for one that could run it): up to TIMEOUT (the client's broker_timeout),
    looking again at growing intervals, saying so once after a few seconds."""

    def __init__(self, name: str, timeout: float) -> None:
        self._name, self._timeout = name, timeout
        self._start = time.monotonic()
        self._pause = 0.02
        self._warned = False

    def another_look(self) -> bool:
        """Wait a little, then True; False once TIMEOUT has passed."""
        waited = time.monotonic() - self._start
        if waited + self._pause > self._timeout:
            return False
        if waited > 3 and not self._warned:
            self._warned = True
            warnings.warn(f"zres: {self._name} waits for an agent with a data port to "
                          f"connect (for up to {self._timeout:g}s, broker_timeout)",
                          stacklevel=4)
        time.sleep(self._pause)
        self._pause = min(self._pause * 2, 0.5)
        return True

    def how_long(self) -> str:
        waited = time.monotonic() - self._start
        return f" (after waiting {waited:.0f}s for one)" if waited >= 1 else ""
