"""The cancelling face of ``zres.Client``: cancel futures (or stop them), stop a task by
its id, and let go of tasks whose results are no longer wanted."""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Iterable
from concurrent.futures import _base
from typing import TYPE_CHECKING, Any

from ..core import protocol as P
from ..core.errors import ZresError
from .futures import Future
from .outbox import STOP
from .session import RequestLost

# A broker silent this long (its heartbeats come every interval) is taken for stopped or
# restarting: a cancel waits no longer for its answer.
SILENT_BEATS, SILENT_MIN = 10, 3.0


class CancelMethods:
    """Mixed into ``Client``: cancels, stops and releases."""

    if TYPE_CHECKING:  # (the client's own, used here)
        _io: Any
        _closed: bool

    def cancel(self, futures: Future | Iterable[Future], force: bool = False) -> None:
        """Cancel FUTURES (one, or an iterable): what has not started never runs, and its
        future is cancelled now. A running task goes on (as ``Future.cancel`` says), unless
        FORCE: then it is stopped where it runs (an exception raised in its call; its
        worker process killed if the call has not ended two seconds later; a command job's
        process group terminated), and its future ends cancelled once it is gone, its
        resources free again. A task that finishes first keeps its result.
        """
        items = [futures] if isinstance(futures, Future) else list(futures)
        for future in items:
            if not isinstance(future, Future) or future.client is not self:
                raise ValueError(f"{future!r} is not a future of this client")
            if force and future.actor_call:
                raise ValueError(f"{future.name} is an actor's method call: it cannot be "
                                 "stopped alone; kill the actor (zres.kill) instead")
        if force:  # their futures end when the broker says the tasks are gone
            for future in items:
                if not future.done():
                    self._io.outbox.append((STOP, future._local, ()))
                    future._release_when_dropped = True
            self._io.wake()
        else:
            self._cancel([f for f in items if f._state == _base.PENDING])

    def cancel_task(self, task_id: int, timeout: float = 10.0) -> str:
        """Stop the task TASK_ID (its ``id``, as ``zres status`` lists it) wherever it is,
        as ``cancel(force=True)`` does: also one of an earlier client, detached, whose
        client is gone. Only its owner (this client's key) or an admin key may: another's
        raises ZresError naming its owner. Return ``stopping`` (it runs: its resources
        free once it is gone) or ``cancelled``."""
        if not isinstance(task_id, int) or isinstance(task_id, bool):
            raise TypeError(f"task_id must be a task's id (an int), not {task_id!r}")
        reply = self._io.request(P.TASK_CANCEL, {"task": task_id}, timeout)
        if "error" in reply:
            raise ZresError(reply["error"])
        return str(reply.get("state", "cancelled"))

    def _cancel(self, futures: list[Future]) -> None:
        """Ask the broker to cancel the tasks of FUTURES that have not begun; those it
        cancels end cancelled once it answers. This waits for the answer (a round trip)
        while the broker is heard from; unless it runs on the I/O thread (a done-callback),
        or the broker is silent (stopped, restarting: see ``_answered``): then they end
        when the answer comes, asked again of a broker that restarted before it answered."""
        if not futures or self._closed:
            return
        reply = self._io.ask(P.CANCEL, {"ids": [f._local for f in futures]})
        by_id = {f._local: f for f in futures}

        def cancelled(reply: cf.Future) -> None:  # type: ignore[type-arg]
            if isinstance(reply.exception(), RequestLost):  # (asked again of the new one)
                self._cancel([f for f in futures if f._state == _base.PENDING])
            if reply.exception() is not None:
                return  # the broker is gone: they fail as everything pending does
            for task_id in reply.result().get("cancelled", ()):
                future = by_id.get(task_id)
                if future is not None:
                    future._release_when_dropped = True
                    self._io.held.add(task_id)
                    self._io.pending.pop(task_id, None)
                    self._io.ended_unnamed(future)
                    future._end_cancelled(_base.PENDING)

        if self._io.on_thread() or not _answered(self._io, reply):
            reply.add_done_callback(cancelled)  # (at once, should it have come meanwhile)
            return
        cancelled(reply)

    def _forget(self, futures: Iterable[Future[Any]], cancel: bool = False) -> None:
        """Let go of FUTURES' tasks now, finished or not (not when the futures are
        dropped): a result stays with the broker only for the tasks that read it. CANCEL:
        first cancel those that have not begun."""
        futures = list(futures)
        if self._closed or not futures:
            return
        if cancel:
            self._cancel([f for f in futures if f._state == _base.PENDING])
        with self._io.lock:
            for future in futures:
                held = self._io.pending.pop(future._local, None) is not None \
                    or future._release_when_dropped
                future._release_when_dropped = False
                self._io.held.discard(future._local)
                if held:
                    self._io.outbox.append((P.RELEASE, future._local, ()))
        self._io.wake()

    def _release(self, task_id: int) -> None:
        """A future was let go of: its release goes with the I/O thread's next pass (the
        next submit, a result, or its beat, within half a heartbeat), not a wake-up of its
        own: in a loop of submit-then-result, one message and two wake-ups less a task."""
        self._io.held.discard(task_id)
        if not self._closed:
            self._io.outbox.append((P.RELEASE, task_id, ()))


def _answered(io: Any, reply: cf.Future) -> bool:  # type: ignore[type-arg]
    """Wait for REPLY, from IO's broker, while it is heard from (up to its broker_timeout):
    whether it came (or failed). A broker silent for SILENT_BEATS heartbeats (at least
    SILENT_MIN seconds) is stopped or restarting: its answer comes when it is back."""
    deadline = time.monotonic() + io.broker_timeout
    while True:
        silent = max(SILENT_MIN, SILENT_BEATS * io.hb_interval)
        try:
            reply.exception(min(0.25, silent / 4))
            return True
        except cf.TimeoutError:
            pass
        now = time.monotonic()
        # (its last word, any message: the I/O thread's own record of it)
        if now > deadline or now - io._last_heard > silent:
            return False
