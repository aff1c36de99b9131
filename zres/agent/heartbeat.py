"""The agent's heartbeat thread: beats to the broker on a socket of its own, so that no
work on the agent's loop (starting hundreds of command jobs, taking in a large message)
makes it look lost, and renews its lease from the broker's echo.

It beats only while the loop turns: a loop stuck for ``stall`` seconds (a bug, a hung
disk) lets the broker declare the agent lost, as a silent agent is, rather than keep its
resources for ever. The loop still sends its own heartbeats over its connection; the
broker takes either as a sign of life (``side`` heartbeats name the session they are for).
And it beats only while those are late: while the broker echoes a heartbeat of the loop's
sent within the last two intervals (half the lease, if that is shorter), a beat of its own
would tell the broker nothing new and cost it two messages more (a broker of a thousand
agents spent a third of a core on heartbeats, half of them these).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import zmq

from ..core import keys, net
from ..core import protocol as P
from ..core.errors import ProtocolError
from ..core.wakeup import Waker
from .session import Session


class HeartbeatThread:
    """Beat every INTERVAL seconds to the broker at ADDRESS (with KEY) for SESSION, while
    the agent's loop has turned within STALL seconds (``turned``)."""

    def __init__(self, ctx: zmq.Context[Any], address: str, key: keys.PeerKey | None,
                 session: Session, interval: float, stall: float) -> None:
        self._ctx = ctx
        self._address = address
        self._key = key
        self._session = session
        self._interval = interval
        self._stall = stall
        self.turned_at = time.monotonic()   # written by the loop, read here
        self._waker = Waker()  # (its stop, heard at once)
        self._thread = threading.Thread(target=self._run, name="zres-agent-heartbeat",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._waker.stop()
        if self._thread.is_alive():
            self._thread.join(2 * self._interval + 1.0)
        self._waker.close()

    def turned(self, now: float) -> None:
        """The agent's loop turned at NOW."""
        self.turned_at = now

    def _run(self) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 4)  # (a beat that cannot go is stale by the next one)
        keys.secure(sock, self._key)
        net.connect(sock, self._address)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._waker.fd, zmq.POLLIN)
        try:
            due = time.monotonic()
            while not self._waker.stopped:
                if sock in dict(poller.poll(max(1, int((due - time.monotonic()) * 1000)))):
                    self._receive(sock)
                now = time.monotonic()
                if now < due:
                    continue
                due = now + self._interval
                session = self._session
                late = min(2 * self._interval, session.lease_len / 2)
                if session.registered and now - self.turned_at < self._stall \
                        and not session.renewed_since(now - late):
                    P.send_now(sock, P.encode(P.HEARTBEAT, {
                        "t": now, "session": session.id, "side": True}))
        finally:
            sock.close(0)

    def _receive(self, sock: zmq.Socket[Any]) -> None:
        while True:
            try:
                msg = P.decode(P.recv(sock))
            except zmq.Again:
                return
            except ProtocolError:
                continue
            echo, session = msg.body.get("echo"), msg.body.get("session")
            if msg.kind == P.HEARTBEAT and isinstance(echo, float) and type(session) is int:
                self._session.renew(echo, session, msg.body.get("epoch"))
