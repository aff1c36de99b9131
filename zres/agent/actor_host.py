"""An actor's instance inside its worker process: construction, then method calls."""

from __future__ import annotations

import inspect
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from ..core import protocol as P

if TYPE_CHECKING:
    import asyncio


class ActorHost:
    """Hold one actor instance; run its construction and method calls.

    The construction runs alone; then up to CONCURRENCY calls at once, started in the
    order they arrived (``waiting``), each only after the previous result was sent.
    """

    READY = "__zres_ready__"  # a call that only waits for the instance to be up

    def __init__(self, concurrency: int) -> None:
        self.instance: Any = None
        self.concurrency = concurrency
        self.waiting: deque[tuple[Any, ...]] = deque()
        self.free = 1               # the construction's place
        self.constructed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def finished(self, outcome: str) -> None:
        if self.constructed:
            self.free += 1
        elif outcome == P.OK:
            self.constructed, self.free = True, self.concurrency
        # else __init__ raised: nothing more runs here; the agent ends this process

    def run(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], create: bool) -> Any:
        if create:
            self.instance = fn(*args, **kwargs)
            return None
        if fn == self.READY:
            return None
        value = getattr(self.instance, fn)(*args, **kwargs)
        if inspect.isawaitable(value):
            import asyncio  # (here: a worker process whose calls are plain starts without it)

            # The actor's one event loop: its coroutines share state safely with each other.
            value = asyncio.run_coroutine_threadsafe(_await(value), self.loop()).result()
        return value

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                import asyncio
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="zres-actor-loop",
                                 daemon=True).start()
            return self._loop



async def _await(awaitable: Any) -> Any:
    return await awaitable
