"""A client's side of the data plane (issue 29): a result kept on agents is fetched straight
from an agent holding it when it is asked for (``Future.result``, ``gather``), from several
agents at once for many, over their data ports (``zres.core.transfer``), not through the
broker; only an agent this client cannot reach is reached through the broker's relay
(``zres.core.relaying``, its MODE). A result nobody asks for never travels (a future only
passed on to other tasks).

A holder gone meanwhile is looked up again (``locate``): the result is elsewhere (a copy
on another agent), being made again (its task had retries left: waited for), or lost for
good (the future fails with ``ResultLostError``, naming the agent).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from ..core import protocol as P
from ..core import transfer as T
from ..core.errors import RemoteError, ResultLostError, ZresError
from ..core.relaying import Routes
from ..core.serialize import loads

_LOOK_AGAIN = 0.2  # seconds between looks for a result that is being made again
# Seconds a finished task's result kept on an agent is given to be fetched at least,
# whatever the caller's timeout: that bounds the wait for the task to end (a timeout of 0
# on a done future returns its value, as concurrent.futures' does, not TimeoutError
# because its bytes were not here yet).
FETCH_FLOOR = 5.0


def fetch_time(deadline: float | None) -> float | None:
    """Seconds a fetch gets until the caller's DEADLINE (monotonic; None: no limit): what is
    left, but at least FETCH_FLOOR."""
    return None if deadline is None else max(FETCH_FLOOR, deadline - time.monotonic())


class Remote:
    """A finished future's result while it is still on agents: its reference."""

    __slots__ = ("ref",)

    def __init__(self, ref: Any) -> None:
        self.ref = ref

    def __repr__(self) -> str:
        return "<result kept on an agent>"


class Fetcher:
    """Fetch the results of CLIENT's futures (its I/O thread asks ``locate``), and put
    its values on agents; through the broker's relay as MODE says (``relaying``)."""

    def __init__(self, client: Any, mode: str = "auto") -> None:
        self._client = client
        self._mode = mode
        self._transfers: T.Transfers | None = None
        # Uploads have transfers of their own: one process's transfers go one at a time,
        # and a small result asked for in one thread waited out another's 1 GiB put.
        self._uploads: T.Transfers | None = None
        self._routes: Routes | None = None
        self._lock = threading.Lock()

    def fetch(self, futures: Iterable[Any], timeout: float | None = None) -> None:
        """Replace the Remote results of FUTURES (finished) by their values: fetched at
        once, one pass for all; looked up again where a holder is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        todo = [f for f in futures if type(f._result) is Remote]
        if todo and self._client._closed:
            # (its broker let go of it when the client went: nobody holds it any more)
            raise ZresError(f"the result of {todo[0].label} was kept on an agent, and was "
                            "let go of when its client closed: read results before closing")
        while todo:
            transfers = self._transfers_()
            try:
                values = transfers.fetch([T.Ref.from_wire(f._result.ref) for f in todo],
                                         deadline)
            except TimeoutError as exc:
                raise TimeoutError(f"the result of {todo[0].name} could not be fetched "
                                   f"within {timeout:.3g}s: {exc}") from None
            except T.TransferError as exc:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"the result of {todo[0].name} could not be fetched "
                                       f"within {timeout:.3g}s: {exc}") from None
                self._locate(todo, deadline)
                todo = [f for f in todo if type(f._result) is Remote and f._exception is None]
                continue
            for future, frames in zip(todo, values):
                try:
                    value = loads(frames)
                except Exception as exc:
                    _settle(future, exception=RemoteError(
                        f"the result of {future.name} cannot be unpickled here: {exc!r}"))
                    continue
                _settle(future, value)
            return

    def _locate(self, futures: list[Any], deadline: float | None) -> None:
        """Ask the broker where FUTURES' results are now; wait while they are made again."""
        waiting = {f._local: f for f in futures}
        while waiting:
            io = self._client._io
            wait = io.broker_timeout if deadline is None \
                else max(0.01, min(io.broker_timeout, deadline - time.monotonic()))
            try:
                reply = io.request(P.LOCATE, {"ids": list(waiting)}, wait)
            except ZresError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"the result of {next(iter(waiting.values())).name} "
                                       "could not be located in the time given") from None
                raise
            for local, ref in (reply.get("refs") or {}).items():
                future = waiting.pop(int(local), None)
                if future is not None:
                    _settle(future, Remote(ref))
            for local, why in (reply.get("lost") or {}).items():
                future = waiting.pop(int(local), None)
                if future is not None:
                    _settle(future, exception=ResultLostError(
                        f"task {future.name}: {why}"))
            if not waiting:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the result of {next(iter(waiting.values())).name} is "
                                   "being made again, and is not there yet")
            time.sleep(_LOOK_AGAIN)

    def upload(self, holder: T.Holder, object_id: int, token: bytes,
               frames: list[Any]) -> None:
        """Put the object FRAMES make on HOLDER as OBJECT_ID: directly, else (HOLDER did
        not answer) through the broker's relay."""
        transfers = self._transfers_(uploads=True)
        ways = transfers.routes.uploads(holder)
        for way in ways:
            try:
                transfers.upload(way, object_id, token, frames)
                return
            except T.Unanswered:
                if way is ways[-1]:
                    raise
                transfers.routes.failed(way)  # (through the relay for a while)

    def _transfers_(self, uploads: bool = False) -> T.Transfers:
        """The transfers fetches go by (UPLOADS: puts), sharing which holders are reached
        through the relay."""
        with self._lock:
            if self._routes is None:
                io = self._client._io
                self._routes = Routes(self._client.address, self._client.name, io.key,
                                      self._mode, lambda: self._client._io.relay)
            if uploads:
                if self._uploads is None:
                    self._uploads = T.Transfers(routes=self._routes, local=False)
                return self._uploads
            if self._transfers is None:
                self._transfers = T.Transfers(routes=self._routes)
            return self._transfers

    def close(self) -> None:
        for transfers in (self._transfers, self._uploads):
            if transfers is not None:
                transfers.close()
        self._transfers = self._uploads = None


def _settle(future: Any, value: Any = None, exception: BaseException | None = None) -> None:
    """Put VALUE (or EXCEPTION) in place of FUTURE's result: it has finished already, and
    what waits on it has been told; only what it holds changes."""
    with future._condition:
        if exception is not None:
            future._exception = exception
        else:
            future._result = value
