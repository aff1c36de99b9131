"""``Future``: a concurrent.futures.Future for a task on the cluster, plus helpers."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from concurrent.futures import _base
from typing import Any, Generic, Protocol, TypeVar, overload

T = TypeVar("T")
R = TypeVar("R")  # what a submitted function returns

FIRST_COMPLETED = cf.FIRST_COMPLETED
FIRST_EXCEPTION = cf.FIRST_EXCEPTION
ALL_COMPLETED = cf.ALL_COMPLETED


class Owner(Protocol):
    """What a future needs of the client that made it."""

    _closed: bool

    def _release(self, task_id: int) -> None: ...

    def _cancel(self, futures: list[Future[Any]]) -> None: ...

    def why(self, future: Future[Any], timeout: float = 10.0) -> str: ...


class Future(cf.Future[T], Generic[T]):
    """The eventual result of one task; works with concurrent.futures and asyncio.
    ``Future[R]`` for a task of a function returning R (``client.submit`` says so to mypy).

    Passing a Future as an argument to ``submit`` (also inside lists, tuples, dicts or
    any picklable object) makes that task wait for it and receive its result.
    """

    # A quiet task's future ends with None: its client asked to hear that it ended, not
    # for its result (see zres.dask, whose intermediate results only their dependents read).
    quiet = False
    # Called on the client's I/O thread when the task begins, if set.
    _on_running: Callable[[Future], None] | None = None

    def __init__(self, client: Owner, task_id: int, name: str) -> None:
        super().__init__()
        self.client = client
        self.id = task_id
        self.name = name
        self.agent: str | None = None         # where it ran, once finished
        self.infeasible: str | None = None    # why no agent can run it, if reported
        self.actor_call = False               # a method call on an actor
        # Once finished (or cancelled), the broker keeps the result until this is dropped.
        self._release_when_dropped = False

    def __del__(self) -> None:
        # Cheaper than a weakref.finalize per result, which showed in profiles.
        if self._release_when_dropped:
            try:
                self.client._release(self.id)
            except Exception:  # the interpreter is shutting down
                pass

    def __repr__(self) -> str:
        state = self._state.lower()
        return f"<zres.Future {self.name} id={self.id} {state}>"

    def _repr_html_(self) -> str:
        from .html import future
        return future(self.name, self.id, self._state.lower(), self.agent, self.infeasible)

    def cancel(self) -> bool:
        """Cancel the task unless it has begun, as concurrent.futures does: True if it is
        cancelled (it will never run), False if it may have begun or has finished.

        The broker decides, knowing exactly which tasks an agent may have started, so
        this waits for its answer (one round trip). Called from a done-callback (the
        client's I/O thread, which cannot wait), it returns False and the future ends
        cancelled when the answer comes, if the task had not begun.
        ``client.cancel(future, force=True)`` stops a running task.
        """
        if self._state == _base.PENDING:
            self.client._cancel([self])
        return self.cancelled()

    def _end_cancelled(self, *states: str) -> bool:
        """Move the future from one of STATES to cancelled, notifying everyone who waits
        on it at once; return whether it moved.

        No executor thread picks a cancelled zres future up to tell ``wait`` and
        ``as_completed`` (a ThreadPoolExecutor's worker does that for its own), so this
        does it, under the future's lock, as ``set_running_or_notify_cancel`` would.
        From RUNNING: the task was stopped (a forced cancel, a cancelled job).
        """
        with self._condition:
            if self._state not in states:
                return False
            self._state = _base.CANCELLED_AND_NOTIFIED
            for waiter in self._waiters:
                waiter.add_cancelled(self)
            self._condition.notify_all()
        self._invoke_callbacks()  # type: ignore[attr-defined]
        return True

    def _set_running(self) -> None:
        """The task began on an agent (the client's I/O thread heard it)."""
        with self._condition:
            if self._state != _base.PENDING:
                return
            self._state = _base.RUNNING
        if self._on_running is not None:
            self._on_running(self)

    def why(self, timeout: float = 10.0) -> str:
        """Say why this task is not running yet (or where it runs)."""
        return self.client.why(self, timeout=timeout)

    def __await__(self) -> Generator[Any, None, T]:
        return asyncio.wrap_future(self).__await__()

    def __reduce__(self) -> Any:
        raise TypeError("a zres.Future can only be passed as an argument to submit() of the "
                        "client that made it; it cannot be pickled otherwise")


def wait(futures: Iterable[cf.Future[T]], timeout: float | None = None,
         return_when: str = ALL_COMPLETED) -> cf._base.DoneAndNotDoneFutures[T]:
    """Wait for FUTURES, as concurrent.futures.wait."""
    return cf.wait(futures, timeout=timeout, return_when=return_when)


def as_completed(futures: Iterable[cf.Future[T]],
                 timeout: float | None = None) -> Iterator[cf.Future[T]]:
    """Yield FUTURES as they finish, as concurrent.futures.as_completed."""
    return cf.as_completed(futures, timeout=timeout)


@overload
def gather(futures: cf.Future[T], timeout: float | None = None) -> T: ...
@overload
def gather(futures: list[Future[T]], timeout: float | None = None) -> list[T]: ...
@overload
def gather(futures: Any, timeout: float | None = None) -> Any: ...
def gather(futures: Any, timeout: float | None = None) -> Any:
    """Replace every Future in FUTURES (a future, or lists/tuples/dicts of them) by its result.

    Raises the first task error met, in argument order.
    """
    if isinstance(futures, cf.Future):
        return futures.result(timeout)
    if isinstance(futures, (list, tuple)):
        return type(futures)(gather(f, timeout) for f in futures)
    if isinstance(futures, Mapping):
        return {k: gather(v, timeout) for k, v in futures.items()}
    return futures
