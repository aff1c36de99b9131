"""``Future``: a concurrent.futures.Future for a task on the cluster, plus helpers."""

from __future__ import annotations

import concurrent.futures as cf
import queue
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from concurrent.futures import _base
from typing import Any, Generic, Protocol, TypeVar, overload

from ..core.errors import MemoryLimitError
from ..core.resources import format_bytes
from .fetching import Remote, fetch_time

T = TypeVar("T")
R = TypeVar("R")  # what a submitted function returns

FIRST_COMPLETED = cf.FIRST_COMPLETED
FIRST_EXCEPTION = cf.FIRST_EXCEPTION
ALL_COMPLETED = cf.ALL_COMPLETED


class Owner(Protocol):
    """What a future needs of the client that made it."""

    _closed: bool
    _futures_lock: threading.RLock  # the lock its futures share
    _io: Any  # its I/O thread (``io.IOThread``), which runs the done-callbacks

    def _release(self, task_id: int) -> None: ...

    def _cancel(self, futures: list[Future[Any]]) -> None: ...

    def why(self, future: Future[Any], timeout: float = 10.0) -> str: ...

    def _fetch(self, futures: list[Future[Any]], timeout: float | None = None) -> None: ...


class _Condition:
    """A future's condition (what concurrent.futures and its waiters lock and wait on),
    on a lock the futures of one client share: a real ``threading.Condition`` is made
    only when a thread waits on this future, and notifying one that nobody waits on does
    nothing. (The lock is an RLock: ``concurrent.futures.wait`` takes every future's.)"""

    __slots__ = ("_lock", "_waited")

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._waited: threading.Condition | None = None

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._lock.__exit__(*exc)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        if self._waited is None:  # (under the lock: no notify can come in between)
            self._waited = threading.Condition(self._lock)
        return self._waited.wait(timeout)

    def notify(self, n: int = 1) -> None:
        if self._waited is not None:
            self._waited.notify(n)

    def notify_all(self) -> None:
        if self._waited is not None:
            self._waited.notify_all()


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

    # It outlives its client (submit(detached=True), Client(detach=True)).
    detached = False
    # Bytes its process used at most, once finished, for a task that ran in a process of
    # its own (it asked for MEMORY; a command job): None for one in a pooled process.
    peak_memory: int | None = None

    def __init__(self, client: Owner, local: int, name: str,
                 deps: Iterable[Future[Any]] = ()) -> None:
        # cf.Future's own __init__, but for its Condition: a lock, a deque and five bound
        # methods per future, 1.3 KB, most of what a future of a million-task map took.
        # The futures of one client share their client's lock; a future gets a condition
        # of its own (on that lock) only when a thread waits on it (see _Condition).
        self._condition = _Condition(client._futures_lock)  # type: ignore[assignment]
        self._state = _base.PENDING
        self._result: Any = None
        self._exception: BaseException | None = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Callable[[cf.Future[T]], object]] = []
        self.client = client
        # The client's own number for the task, on the wire between it and its broker
        # only; users see the broker's (``id``).
        self._local = local
        self._id: int | None = None
        self.name = name
        self.agent: str | None = None         # where it ran, once finished
        self.infeasible: str | None = None    # why no agent can run it, if reported
        self.actor_call = False               # a method call on an actor
        # Once finished (or cancelled), the broker keeps the result until this is dropped.
        self._release_when_dropped = False
        # Its inputs, while it may wait for them (weakly: a future keeps no result alive).
        self._deps: Any = [weakref.ref(d) for d in deps] if deps else ()

    @property
    def id(self) -> int | None:
        """The task's id on the cluster: what ``zres status``, the dashboard, errors and
        ``zres cancel --task`` say (a command job's is its job id). None until the broker
        has taken the task, a round trip after it was submitted."""
        return self._id

    def _ended_words(self) -> str:
        """How the (ended) task ended: its state, and, for one that ran in a process of its
        own, where and the memory it used at most, or why it was stopped for memory."""
        if isinstance(self._exception, MemoryLimitError):
            return f"{self.status}: {self._exception}"
        if self.peak_memory is None:
            return self.status
        return f"{self.status} on {self.agent}, peak memory {format_bytes(self.peak_memory)}"

    @property
    def status(self) -> str:
        """The task's state, in the words every view uses: ``waiting`` (for its inputs),
        ``queued`` (for resources, or not sent yet), ``running``, ``finished``, ``error``
        (it raised, or failed) or ``cancelled``."""
        state = self._state
        if state == _base.FINISHED:
            return "error" if self._exception is not None else "finished"  # type: ignore[attr-defined]
        if state in (_base.CANCELLED, _base.CANCELLED_AND_NOTIFIED):
            return "cancelled"
        if state == _base.RUNNING:
            return "running"
        return "waiting" if any(d is not None and not d.done()
                                for d in (ref() for ref in self._deps)) else "queued"

    @property
    def label(self) -> str:
        """How errors name the task: its name and, once known, its id."""
        return f"{self.name} (id {self._id})" if self._id is not None else self.name

    def __del__(self) -> None:
        # Cheaper than a weakref.finalize per result, which showed in profiles.
        if self._release_when_dropped:
            try:
                self.client._release(self._local)
            except Exception:  # the interpreter is shutting down
                pass

    def __repr__(self) -> str:
        shown = self._id if self._id is not None else "?"
        return f"<zres.Future {self.name} id={shown} {self.status}>"

    def _repr_html_(self) -> str:
        from .html import future
        why = None
        if self._state == _base.PENDING and not self.client._closed:
            try:  # (what client.why says: a round trip, kept short)
                why = self.client.why(self, timeout=2.0)
            except Exception as exc:  # the broker is away: said, not raised
                why = f"(the broker did not say why: {exc})"
        return future(self.name, self._id, self.status, self.agent, self.infeasible, why)

    def cancel(self) -> bool:
        """Cancel the task unless it has begun, as concurrent.futures does: True if it is
        cancelled (it will never run), False if it may have begun or has finished.

        The broker decides, knowing exactly which tasks an agent may have started, so
        this waits for its answer (one round trip). Called from a done-callback (the
        client's I/O thread, which cannot wait), or while the broker is silent (stopped or
        restarting: no word from it for ten heartbeats, at least 3 s), it returns False
        and the future ends cancelled when the answer comes (the broker back), if the task
        had not begun.
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

    def _check_waitable(self) -> None:
        """Refuse to wait on the client's I/O thread (in a done-callback): the future
        could only end by that thread, which would wait for ever (or for its timeout)."""
        if self._state in (_base.PENDING, _base.RUNNING) and self.client._io.on_thread():
            raise RuntimeError(
                f"{self!r} has not ended and cannot be waited for in a done-callback: "
                "callbacks run on the client's I/O thread, which ends futures; wait in "
                "another thread, or add a callback to it instead")

    def result(self, timeout: float | None = None) -> T:
        """The task's result, as concurrent.futures gives it; one kept on an agent is
        fetched from there now (see ``fetching``). TIMEOUT bounds the wait for the task to
        end; the fetch gets what is left of it, but at least ``FETCH_FLOOR`` (5 s): a
        done future's ``result(timeout=0)`` returns its value."""
        self._check_waitable()
        deadline = None if timeout is None else time.monotonic() + timeout
        value = super().result(timeout)
        if type(value) is Remote:
            self.client._fetch([self], fetch_time(deadline))
            value = super().result(timeout)
        return value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The task's exception, as concurrent.futures gives it (None if it succeeded): the
        exception ``result()`` would raise. So a result kept on an agent is fetched, as
        ``result()`` fetches it (and kept: ``result()`` then costs nothing): lost with its
        holders, it is the ResultLostError; one that cannot be unpickled here, the
        RemoteError. (``status`` says ``error`` or ``finished`` without fetching.)"""
        self._check_waitable()
        deadline = None if timeout is None else time.monotonic() + timeout
        error = super().exception(timeout)
        if error is None and type(self._result) is Remote:
            self.client._fetch([self], fetch_time(deadline))
            error = super().exception(timeout)
        return error

    def why(self, timeout: float = 10.0) -> str:
        """Say why this task is not running yet (or where it runs)."""
        return self.client.why(self, timeout=timeout)

    def __await__(self) -> Generator[Any, None, T]:
        import asyncio  # (here: only a program awaiting futures runs an event loop)
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
    """Replace every Future in FUTURES (a future, or lists, tuples, sets and dicts of them,
    nested) by its result, keeping each container's type (as Dask's gather does); a
    generator or other iterator of them gives a list.

    Raises the first task error met, in argument order.
    """
    if isinstance(futures, Iterator):  # (walked twice below: read once, here)
        futures = list(futures)
    _fetch_all(futures, timeout)
    return _results(futures, timeout)


def _fetch_all(futures: Any, timeout: float | None) -> None:
    """Fetch every result kept on agents among FUTURES, many at once (not one by one): as
    they finish, each batch that finished while the last was fetched, together (from
    their several holders at once), until all have finished or TIMEOUT passes."""
    found: list[Future[Any]] = []
    work = [futures]
    while work:
        item = work.pop()
        if isinstance(item, Future):
            found.append(item)
        elif isinstance(item, (list, tuple, set, frozenset)):
            work.extend(item)
        elif isinstance(item, Mapping):
            work.extend(item.values())
    deadline = None if timeout is None else time.monotonic() + timeout
    finished: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for future in found:
        future.add_done_callback(finished.put)  # (at once for one finished already)
    left = len(found)
    while left:
        try:
            batch = [finished.get(timeout=None if deadline is None
                                  else max(0.0, deadline - time.monotonic()))]
        except queue.Empty:
            return  # (_results raises TimeoutError for what has not finished)
        while True:
            try:
                batch.append(finished.get_nowait())
            except queue.Empty:
                break
        left -= len(batch)
        by_client: dict[int, list[Future[Any]]] = {}
        for future in batch:
            if future.cancelled() or future._exception is not None:
                left = 0  # (_results raises in order, as soon as it meets it)
            elif type(future._result) is Remote:
                by_client.setdefault(id(future.client), []).append(future)
        for group in by_client.values():
            group[0].client._fetch(group, fetch_time(deadline))


def _results(futures: Any, timeout: float | None) -> Any:
    if isinstance(futures, cf.Future):
        return futures.result(timeout)
    if isinstance(futures, (list, tuple, set, frozenset)):
        return type(futures)(_results(f, timeout) for f in futures)
    if isinstance(futures, Mapping):
        return {k: _results(v, timeout) for k, v in futures.items()}
    return futures
