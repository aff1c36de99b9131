"""How the broker takes in one message: its header decoded within the limits, its sender
checked against its key and role, then handled now, or after what the same client's
earlier messages left to do (``backlog``); what is refused is said to its sender."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import zmq

from ..core import protocol as P
from ..core.errors import ProtocolError
from ..core.limits import LimitExceeded, quote
from ..logs import get_logger
from .auth import Forbidden
from .store import StateUnwritable

log = get_logger("zres.broker")
Handler = Callable[[bytes, P.Message, float], None]


class Intake:
    """Mixed into the ``Broker``, whose parts it hands each message to."""

    _head: Any = None   # the first frame of the message being handled

    if TYPE_CHECKING:  # (the broker's own, used here)
        limits: Any
        gate: Any
        ids: Any
        clients: Any
        backlog: Any
        waiting: Any
        _fd: int
        _handlers: dict[str, Handler]

        def _send(self, ident: bytes, kind: str, body: dict[str, Any] | None = None,
                  frames: Sequence[Any] = (), hold: bool = True) -> None: ...

    def _dispatch(self, frames: list[Any], now: float) -> None:
        ident = frames[0].bytes
        self._head = frames[0]
        try:
            self._fd = frames[0].get(zmq.SRCFD)
        except zmq.ZMQError:  # a message libzmq made itself, of no connection
            self._fd = -1
        msg: P.Message | None = None
        try:
            if len(frames) > 1 and len(frames[1]) > self.limits.header_bytes:
                raise LimitExceeded(
                    f"a message's header of {len(frames[1])} bytes is larger than the "
                    f"broker's limit of {self.limits.header_bytes} (max_header_bytes)")
            msg = P.decode(frames[1:])
            if msg.kind != P.HEARTBEAT:  # (what was worth waking early for: ``spinning``)
                self.waiting.fruitful = True
            handler = self._handlers.get(msg.kind)
            if handler is None:
                raise ProtocolError(f"{msg.kind} is not a message for the broker")
            if self.gate.keys is not None:
                self.ids.check(frames[0], ident, msg)
            client = self.clients.get(ident)
            if client is not None:  # (its own key: checked above)
                for kind, body, held in self.clients.heard(client, self._fd):
                    self._send(ident, kind, body, held)
        except (ProtocolError, LimitExceeded, StateUnwritable, Forbidden) as exc:
            self._refused(ident, msg, exc)
            return
        except Exception:  # a bug must not take the broker down for everyone
            log.exception("message_failed", peer=ident[:16].hex())
            return
        if msg.kind != P.HEARTBEAT and self.backlog.busy(ident):
            # Behind what its earlier messages left to do (a large submit): in order.
            seen = (self.ids.acting, self.ids.conn, self._fd)
            self.backlog.defer(ident, lambda: self._handle(ident, msg, handler, seen))
            return
        self._handle(ident, msg, handler)

    def peer(self) -> str:
        """The IP address the message being handled came from ("": not over TCP)."""
        try:
            return str(self._head.get("Peer-Address"))
        except (zmq.ZMQError, AttributeError):
            return ""

    def _handle(self, ident: bytes, msg: P.Message, handler: Handler,
                seen: tuple[Any, Any, int] | None = None) -> None:
        """Run HANDLER for MSG from IDENT (SEEN: who sent it, on which connection, as it
        was when it arrived, for one that waited in the backlog)."""
        if seen is not None:
            self.ids.acting, self.ids.conn, self._fd = seen
        try:
            handler(ident, msg, time.monotonic())
        except (ProtocolError, LimitExceeded, StateUnwritable, Forbidden) as exc:
            self._refused(ident, msg, exc)
        except Exception:  # a bug must not take the broker down for everyone
            log.exception("message_failed", peer=ident[:16].hex())

    def _refused(self, ident: bytes, msg: P.Message | None, exc: Exception,
                 ids: list[int] | None = None) -> None:
        """Tell IDENT why MSG is refused (its tasks, IDS if given, or its request fail,
        naming why), and log it short."""
        log.warning("bad_message", peer=ident[:16].hex(), error=quote(str(exc)))
        self._refuse(ident, msg, str(exc), ids)

    def _refuse(self, ident: bytes, msg: P.Message | None, error: str,
                ids: list[int] | None = None) -> None:
        body: dict[str, Any] = {"error": quote(error, 500)}
        if msg is not None:
            body["kind"] = msg.kind
            if "req" in msg.body:
                body["req"] = msg.body["req"]
            items = msg.body.get("tasks") if msg.kind == P.SUBMIT else None
            if ids is not None:  # (what a submit taken in part had left)
                body["ids"] = ids
            elif isinstance(items, list):
                body["ids"] = [i[0] for i in items if isinstance(i, list) and i
                               and type(i[0]) is int]
        self._send(ident, P.REFUSED, body, hold=False)  # (to whoever sent it, away or not)
