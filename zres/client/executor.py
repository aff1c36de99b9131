"""``Executor``: the standard ``concurrent.futures.Executor``, running on a zres cluster.

``client.executor(resources=..., **defaults)`` returns one. It keeps the standard contract
to the letter, so that code written for any Executor works with it: ``submit`` passes
every keyword to the function; ``map`` returns an iterator of results in order and raises
``TimeoutError``; ``shutdown(wait, cancel_futures)`` and ``with`` wait for what is pending;
``submit`` after shutdown raises ``RuntimeError``. Its tasks run with its resources and
defaults (priority, retries, infeasible). ``zres.Client`` itself keeps Dask's conventions
(``map`` returns futures; ``submit`` reserves ``resources`` and friends).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from .futures import Future

_DEFAULTS = ("priority", "retries", "infeasible")


class Submitter(Protocol):
    """What an executor needs of its client (``zres.Client``)."""

    address: str
    _closed: bool
    _exited: bool

    # (the options as Client takes them: resources, retries, priority, infeasible, key)
    def _submit(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                resources: Any = None, retries: int | None = None, priority: int | None = None,
                infeasible: str | None = None, key: str | None = None) -> Future[Any]: ...

    def _map(self, fn: Callable[..., Any], iterables: tuple[Iterable[Any], ...],
             kwargs: dict[str, Any], resources: Any = None, retries: int | None = None,
             priority: int | None = None, infeasible: str | None = None,
             key: str | None = None) -> list[Future[Any]]: ...

    def _options(self, resources: Any, retries: int | None = None,
                 priority: int | None = None, infeasible: str | None = None,
                 key: str | None = None) -> dict[str, Any]: ...

    def cancel(self, futures: Iterable[Future], force: bool = False) -> None: ...


class Executor(cf.Executor):
    """Run calls on CLIENT's cluster, each asking for RESOURCES (with DEFAULTS: priority,
    retries, infeasible)."""

    def __init__(self, client: Submitter, resources: Any = None, **defaults: Any) -> None:
        unknown = sorted(set(defaults) - set(_DEFAULTS))
        if unknown:
            raise TypeError(f"executor() got unexpected defaults {unknown}; it takes "
                            f"resources and {', '.join(_DEFAULTS)}")
        self._client = client
        self._defaults = {"resources": resources, **defaults}
        client._options(**self._defaults)  # bad defaults fail here, not at the first call
        self._lock = threading.Lock()
        self._shutdown = False
        self._futures: set[Future] = set()   # submitted and not finished

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        with self._lock:
            self._check_open()
            future = self._client._submit(fn, args, kwargs, **self._defaults)
            self._track(future)
        return future

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any],  # type: ignore[override]
            timeout: float | None = None, chunksize: int = 1, **more: Any) -> Iterator[Any]:
        """Return an iterator of FN's results over ITERABLES, in order, as the standard's:
        every call is submitted now (in batches); TimeoutError if the results are not all
        there TIMEOUT seconds from now; CHUNKSIZE is accepted and ignored (as a
        ThreadPoolExecutor does): tasks already travel in batches."""
        if more:  # a later Python's argument (buffersize): the standard's own way
            return super().map(fn, *iterables, timeout=timeout, chunksize=chunksize, **more)
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._check_open()
            futures = self._client._map(fn, iterables, {}, **self._defaults)
            for future in futures:
                self._track(future)
        return _results_in_order(futures, end, self._client.cancel)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more work; CANCEL_FUTURES: cancel what has not started; WAIT: return
        once every call submitted here has finished."""
        with self._lock:
            self._shutdown = True
            outstanding = list(self._futures)
        if cancel_futures:  # one round trip to the broker for them all
            self._client.cancel(outstanding)
        if wait:
            cf.wait(outstanding)

    def outstanding(self) -> list[Future]:
        """The calls submitted here that have not finished."""
        with self._lock:
            return list(self._futures)

    def _track(self, future: Future) -> None:
        self._futures.add(future)
        future.add_done_callback(self._futures.discard)

    def _check_open(self) -> None:
        if self._shutdown:
            raise RuntimeError("cannot schedule new futures after shutdown")
        if self._client._closed:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown"
                               if self._client._exited else
                               "cannot schedule new futures: the zres client is closed")

    def __repr__(self) -> str:
        state = " shut down" if self._shutdown else ""
        return f"<zres.Executor on {self._client.address}{state}>"


def _results_in_order(futures: list[Future], end: float | None,
                      cancel: Callable[[list[Future]], None]) -> Iterator[Any]:
    """Yield the results of FUTURES in order; CANCEL those not reached if stopped early.
    No reference is kept to a future once its result is yielded."""
    try:
        futures.reverse()
        while futures:
            yield _result_or_cancel(futures.pop(),
                                    None if end is None else end - time.monotonic())
    finally:
        cancel(futures)


def _result_or_cancel(future: Future, timeout: float | None) -> Any:
    try:
        return future.result(timeout)
    finally:
        future.cancel()
        del future
