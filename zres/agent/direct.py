"""A worker process's own connection to the broker, for the small results of plain tasks:
the agent is off their way back (one process fewer on a task's round trip).

The agent stays the authority. It tells each worker where the broker is, with its own
key (``direct`` in a RUN, over the agent's private socket), and the session and broker
epoch every grant it hands over runs under (``via``). A result goes straight to the
broker, with that session, epoch and the grant's attempt, only if it is small (inline),
its task printed nothing (its output goes through the agent, and must reach the client
before its result), is not bound to cores (the agent picks the least loaded from what
it knows ends) and ended it (ok, raised: a failure, an input not read or a stop, may
have the broker grant the task again, to this agent too, before the agent has heard of
this end; the agent's copy, which names no attempt, would then end the new grant in its
books and the broker's). The same result still goes to the agent, as before; the broker takes
whichever comes first for the grant it names (session, epoch and attempt all current),
and the other finds it ended: a copy lost on either way (a full queue, a broker restart,
the worker killed) costs nothing.

The agent's copy is kept back for up to ``LATER`` (sent by the worker's main thread at a
quiet turn, or once it has waited half that: see ``WorkerProcess.run``), several in one
go: on a busy machine the agent does not wake, once a task, to pass on results the
broker already has while the broker and the client are busy with them. Nothing waits for
it but the agent's own books, which only ever count a slot fuller than it is (a queued
grant there starts that much later; a direct grant starts at once whatever they say, as
the broker counted it). It goes at once when there is more in it than the results sent
straight (starts of other tasks, dropped grants, replicas), or when the main thread would
not turn within ``LATER``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import zmq

from ..core import net
from ..core import protocol as P
from ..logs import get_logger
from .data.worker_side import INLINE

log = get_logger("zres.worker")

LATER = 0.02    # seconds the agent's copy may wait for the main thread's turn, at most
_MOST = 2       # results in one batch to send straight (a bigger batch is throughput's)


class DirectResults:
    """The broker connection of one worker process (made once the agent says where), the
    grants whose results may go straight to it, and the agent's copies kept back."""

    def __init__(self) -> None:
        self._sock: zmq.Socket[Any] | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._grants: dict[int, tuple[int, int, int]] = {}  # task -> session, epoch, attempt
        self.later: list[Callable[[], list[Any]]] = []    # the agent's copies kept back
        self._since = 0.0                                   # ... since then

    def connect(self, spec: Any) -> None:
        """Connect as SPEC says ({address, key?: [server, public, secret]}), once."""
        if self._sock is not None or not isinstance(spec, dict):
            return
        self._ctx = zmq.Context(io_threads=1)  # (its own: kept as long as the socket)
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, uuid.uuid4().bytes)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 64)  # (past that, the agent's copy is the one)
        sock.setsockopt(zmq.RCVHWM, 1)   # (the broker answers nothing here)
        # Nothing queued for a connection not made (yet, or again after a broker restart):
        # such a result goes the agent's way at once, not later, or to another broker.
        sock.setsockopt(zmq.IMMEDIATE, 1)
        try:
            key = spec.get("key")
            if isinstance(key, list) and len(key) == 3:
                sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = key
            net.connect(sock, str(spec["address"]))
        except (zmq.ZMQError, KeyError, TypeError) as exc:  # (every result the agent's way)
            log.warning("direct_results_off", error=str(exc))
            sock.close(0)
            return
        self._sock = sock

    def note(self, task_id: int, context: dict[str, Any]) -> None:
        """TASK_ID starts with CONTEXT: its result may go straight to the broker if the
        agent said under which session (not if it is bound to cores)."""
        via = context.get("via")
        if self._sock is not None and isinstance(via, list) and len(via) == 2 \
                and not context.get("cpus"):
            self._grants[task_id] = (via[0], via[1], int(context.get("attempt", 0)))

    def printed(self, task_id: int) -> None:
        """TASK_ID wrote output: its result goes the agent's way, after that output."""
        self._grants.pop(task_id, None)

    def sent(self, items: list[Any], frames: list[Any], started: list[int], more: Any,
             copy: Callable[[], list[Any]], turns_by: float) -> bool:
        """Send the broker these results (done's ITEMS and FRAMES; STARTED: the starts in
        the same batch) if all may go straight, and keep back the agent's copy (COPY()
        makes it: encoded once it goes, off the way to the broker) if it says nothing else
        (MORE: dropped grants or replicas it tells too) and the main thread turns by
        TURNS_BY, within LATER; return whether it is kept back (not to be sent now)."""
        if not self._send(items, frames, started) or more \
                or not set(started) <= {item[0] for item in items} \
                or turns_by - time.monotonic() > LATER:
            return False
        if not self.later:
            self._since = time.monotonic()
        self.later.append(copy)
        return True

    def _send(self, items: list[Any], frames: list[Any], started: list[int]) -> bool:
        grants = [self._grants.pop(item[0], None) for item in items]
        if self._sock is None or not items or len(items) > _MOST or None in grants \
                or any(item[1] == P.FAILED for item in items) \
                or len(set(g[:2] for g in grants if g is not None)) != 1 \
                or any("stored" in item[3] for item in items) \
                or sum(len(P.buffer(f)) for f in frames) > INLINE * _MOST:
            return False
        session, epoch, _ = grants[0]  # type: ignore[misc]
        ids = {item[0] for item in items}
        body = {"session": session, "epoch": epoch,
                "results": [[*item, grant[2]] for item, grant in zip(items, grants)
                            if grant is not None],
                "started": [t for t in started if t in ids]}
        try:
            self._sock.send_multipart(P.encode(P.DIRECT_DONE, body, frames), zmq.NOBLOCK,
                                      copy=False)
        except zmq.Again:  # (not connected, or the broker is slow: the agent's way)
            return False
        return True

    def due(self) -> bool:
        """Whether the copies kept back have waited long enough: sent at this turn of the
        main thread (else at a later one, with those of the next results)."""
        return time.monotonic() - self._since >= LATER / 2

    def take_later(self) -> list[list[Any]]:
        """The agent's copies kept back, to send now (in order)."""
        later, self.later = self.later, []
        return [copy() for copy in later]
