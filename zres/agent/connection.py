"""The agent's one connection to its broker: a DEALER socket with this agent's key, and
the monitor that tells it of reconnections and of a broker that refuses its key."""

from __future__ import annotations

import uuid
from typing import Any

import zmq

from ..core import keys, net

RECONNECTED = "reconnected"


class BrokerConnection:
    """A DEALER to ADDRESS with KEY (None: no CURVE); ``sock`` and ``monitor`` to poll."""

    def __init__(self, ctx: zmq.Context[Any], address: str, key: keys.PeerKey | None) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        # A random routing id, kept for the agent's life: a reconnection resumes as us.
        self.sock.setsockopt(zmq.ROUTING_ID, uuid.uuid4().bytes)
        self.sock.setsockopt(zmq.LINGER, 0)
        # Tried again 20 ms after a refused connection, then 40, 80, and every 100 ms (zmq's
        # default, every 100 ms from the first): an agent started beside its broker (a
        # local cluster) is in as soon as the broker listens.
        self.sock.setsockopt(zmq.RECONNECT_IVL, 20)
        self.sock.setsockopt(zmq.RECONNECT_IVL_MAX, 100)
        keys.secure(self.sock, key)
        # Refused for having no key, the agent's starter may find keys made since (a
        # broker starting on this machine makes them): it says so, or the error.
        self.keyless = key is None
        self._handshakes = keys.Handshakes(address, key)
        self.monitor = self.sock.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | keys.HANDSHAKES)
        net.connect(self.sock, address)

    def events(self) -> list[str]:
        """What the monitor says: RECONNECTED for each new connection, or why the broker
        refuses our key (a sentence for the user)."""
        out = []
        while self.monitor.poll(0):
            event = net.monitor_event(self.monitor)[0]
            refused = self._handshakes.refused(event)
            if refused is not None:
                out.append(refused)
            elif event == zmq.EVENT_CONNECTED:
                out.append(RECONNECTED)
        return out

    def send_or_drop(self, frames: list[Any]) -> None:
        """Send FRAMES unless the queue to the broker is full: for what may be lost (tasks'
        output), which must never stall the agent nor fill the queue for its reports."""
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            pass

    def close(self) -> None:
        self.sock.disable_monitor()  # (its address is free for a later socket's)
        self.monitor.close(0)
        self.sock.close(0)
