"""A process's connections to agents' data ports, each closed once unused for a while.

Agents come and go over a cluster's weeks (restarted on another port, replaced by new
ones): a connection kept to each port ever used would keep a descriptor or two (its
socket, and a local socket: ``local_reads``) and zmq's reconnecting to a port that is gone
for as long as the process lives, a client or a worker process up for weeks included. So
one unused for a while (``transfer.IDLE``) is closed; used again, it costs a new handshake.
"""

from __future__ import annotations

import time
from typing import Any

import zmq

from . import net

Port = tuple[str, str]  # a data port: its address and CURVE key


class Ports:
    """DEALER sockets in CTX to data ports; ROUTES (``relaying.Routes``, or None): who
    secures one reached through the broker's relay."""

    def __init__(self, ctx: zmq.Context[Any], routes: Any) -> None:
        self._ctx = ctx
        self._routes = routes
        self._socks: dict[Port, zmq.Socket[Any]] = {}
        self._used: dict[Port, float] = {}  # port -> when last used (monotonic)
        self._public, self._secret = zmq.curve_keypair()  # (authorised by tokens, not keys)

    def get(self, at: Port, relay: bool = False) -> zmq.Socket[Any]:
        """The socket to the data port AT (RELAY: the broker's relay's), connected now if
        it is not yet."""
        self.used(at)
        sock = self._socks.get(at)
        if sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)  # (requests to a holder not reached never block)
            address, key = at
            if key:
                sock.curve_serverkey = key.encode()
                if not (relay and self._routes and self._routes.secure(sock)):
                    sock.curve_publickey, sock.curve_secretkey = self._public, self._secret
            net.connect(sock, address)
            self._socks[at] = sock
        return sock

    def used(self, at: Port) -> None:
        """The port AT is used now (read in place, its socket may not be)."""
        self._used[at] = time.monotonic()

    def sockets(self) -> list[zmq.Socket[Any]]:
        return list(self._socks.values())

    def drop(self, at: Port) -> None:
        """Close the socket to AT (what it queued goes with it)."""
        self._used.pop(at, None)
        sock = self._socks.pop(at, None)
        if sock is not None:
            sock.close(0)

    def close_idle(self, idle_for: float) -> list[Port]:
        """Close the sockets unused for IDLE_FOR seconds; return their ports."""
        now = time.monotonic()
        idle = [at for at, used in self._used.items() if now - used > idle_for]
        for at in idle:
            self.drop(at)
        return idle

    def close(self) -> None:
        for at in list(self._used):
            self.drop(at)
