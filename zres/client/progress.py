"""``zres.progress``: a progress bar over futures, in a terminal or a notebook (tqdm)."""

from __future__ import annotations

import collections
import concurrent.futures as cf
import queue
from collections.abc import Mapping
from typing import IO, Any


def progress(futures: Any, *, desc: str = "tasks", file: IO[str] | None = None,
             interval: float = 0.2) -> list[cf.Future]:  # type: ignore[type-arg]
    """Show a progress bar until every one of FUTURES has ended; return them as a list.

    FUTURES: a future, or lists, tuples and dicts of them (``client.compute``'s too). The
    bar counts what has ended, and says how many ended in an error or were cancelled, and
    how many run, are queued and wait, in the words of every view; it is tqdm's
    ``auto`` front end: text on a terminal (FILE, default stderr), a widget in Jupyter.
    Interrupting it (Ctrl-C) stops the bar, not the tasks.
    """
    from tqdm.auto import tqdm

    items = _futures(futures)
    ended: queue.SimpleQueue[cf.Future] = queue.SimpleQueue()  # type: ignore[type-arg]
    for future in items:
        future.add_done_callback(ended.put)
    left = len(items)
    error = cancelled = 0
    with tqdm(total=len(items), desc=desc, unit="task", file=file, dynamic_ncols=True) as bar:
        while left:
            count = 0
            try:
                while True:
                    future = ended.get(timeout=interval if count == 0 else 0)
                    count += 1
                    if future.cancelled():
                        cancelled += 1
                    elif _failed(future):
                        error += 1
            except queue.Empty:
                pass
            left -= count
            states = collections.Counter(_state(f) for f in items if not f.done())
            bar.set_postfix(error=error, cancelled=cancelled, running=states["running"],
                            queued=states["queued"], waiting=states["waiting"],
                            refresh=False)
            bar.update(count)
    return items


def _state(future: cf.Future) -> str:  # type: ignore[type-arg]
    """A pending FUTURE's state: a zres future says (waiting, queued, running)."""
    status = getattr(future, "status", None)
    if isinstance(status, str):
        return status
    return "running" if future.running() else "queued"


def _failed(future: cf.Future) -> bool:  # type: ignore[type-arg]
    """Whether FUTURE (ended) failed; a zres future's status says so without fetching a
    result kept on an agent, as its ``exception()`` would."""
    status = getattr(future, "status", None)
    return status == "error" if isinstance(status, str) else future.exception() is not None


def _futures(value: Any) -> list[cf.Future]:  # type: ignore[type-arg]
    if isinstance(value, cf.Future):
        return [value]
    if isinstance(value, (list, tuple, set)):
        return [f for item in value for f in _futures(item)]
    if isinstance(value, Mapping):
        return [f for item in value.values() for f in _futures(item)]
    raise TypeError(f"progress() takes futures (or lists, tuples and dicts of them), not "
                    f"{type(value).__name__}")
