"""``Future``: a concurrent.futures.Future for a task on the cluster, plus helpers."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
from collections.abc import Generator, Iterable, Iterator, Mapping
from typing import Any, Protocol

FIRST_COMPLETED = cf.FIRST_COMPLETED
FIRST_EXCEPTION = cf.FIRST_EXCEPTION
ALL_COMPLETED = cf.ALL_COMPLETED


class Owner(Protocol):
    """What a future needs of the client that made it."""

    _closed: bool

    def _release(self, task_id: int) -> None: ...

    def _cancel(self, future: Future) -> None: ...

    def why(self, future: Future, timeout: float = 10.0) -> str: ...


class Future(cf.Future):  # type: ignore[type-arg]
    """The eventual result of one task; works with concurrent.futures and asyncio.

    Passing a Future as an argument to ``submit`` (also inside lists, tuples, dicts or
    any picklable object) makes that task wait for it and receive its result.
    """

    def __init__(self, client: Owner, task_id: int, name: str) -> None:
        super().__init__()
        self.client = client
        self.id = task_id
        self.name = name
        self.agent: str | None = None         # where it ran, once finished
        self.infeasible: str | None = None    # why no agent can run it, if reported
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

    def cancel(self) -> bool:
        """Cancel the task if it has not finished; a running call finishes unobserved."""
        if not super().cancel():
            return False
        self.client._cancel(self)
        return True

    def why(self, timeout: float = 10.0) -> str:
        """Say why this task is not running yet (or where it runs)."""
        return self.client.why(self, timeout=timeout)

    def __await__(self) -> Generator[Any, None, Any]:
        return asyncio.wrap_future(self).__await__()

    def __reduce__(self) -> Any:
        raise TypeError("a zres.Future can only be passed as an argument to submit() of the "
                        "client that made it; it cannot be pickled otherwise")


def wait(futures: Iterable[cf.Future], timeout: float | None = None,  # type: ignore[type-arg]
         return_when: str = ALL_COMPLETED) -> cf._base.DoneAndNotDoneFutures:  # type: ignore[type-arg]
    """Wait for FUTURES, as concurrent.futures.wait."""
    return cf.wait(futures, timeout=timeout, return_when=return_when)


def as_completed(futures: Iterable[cf.Future],  # type: ignore[type-arg]
                 timeout: float | None = None) -> Iterator[cf.Future]:  # type: ignore[type-arg]
    """Yield FUTURES as they finish, as concurrent.futures.as_completed."""
    return cf.as_completed(futures, timeout=timeout)


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
