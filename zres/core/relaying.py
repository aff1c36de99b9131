"""Which way a process's transfers go: straight to an object's holders, or through the
broker's relay, for a client or agent that cannot reach a holder's data port (NAT, a
firewall).

A transfer goes to a holder directly first. A holder whose port refuses connections, or
that does not answer within the transfer's timeout, is tried again through the relay (a
thread of the broker's: ``zres.broker.relay``), which forwards each request to that agent
and each chunk back as it comes; and this process remembers, for ``REMEMBER`` seconds,
that the holder's address needs the relay, so later transfers go there at once.
``ZRES_RELAY=always`` (or ``Client(relay=True)``) sends every transfer through the relay
(a firewalled client), ``never`` none.

The relay is reached as the broker is: with the process's own key (CURVE, the broker's key
as the server's), and the request names the holder (``agent``) and who asks (``from``,
counted in the broker's status). Where the relay listens comes with every reference to an
object and in the broker's welcome; a wildcard host there ("0.0.0.0", "*", "::") means
the host this process reaches the broker at.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import zmq

from .address import unreachable
from .keys import PeerKey
from .net import host_port, spelled
from .transfer import Holder, Ref

ENV = "ZRES_RELAY"    # auto (the default), always, never
MODES = ("auto", "always", "never")
REMEMBER = 600.0      # seconds a holder that could not be reached goes through the relay
_WILDCARDS = ("0.0.0.0", "*", "::", "")


def mode_of(given: bool | str | None) -> str:
    """The relay mode GIVEN says (True: always, False: never, None: ``$ZRES_RELAY``, else
    auto); ValueError naming a word that is not one."""
    if given is True or given is False:
        return "always" if given else "never"
    word = (given if given is not None else os.environ.get(ENV) or "auto").strip().lower()
    if word not in MODES:
        raise ValueError(f"relay mode {word!r} (from {'$' + ENV if given is None else 'relay='})"
                         f" is not one of {', '.join(MODES)}")
    return word


def resolve(endpoint: str, broker: str) -> str:
    """ENDPOINT (the relay's, as the broker bound it) as this process reaches it: a
    wildcard host replaced by the host of BROKER (the broker's address here)."""
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp" or parts.hostname not in _WILDCARDS:
        return endpoint
    found = host_port(broker)
    return f"tcp://{spelled(found[0] if found else '127.0.0.1', str(parts.port))}"


class Routes:
    """Where a process (NAME, e.g. a client's; KEY its key pair, None without keys) sends
    its transfers, in MODE (``mode_of``); BROKER: the broker's address here; RELAY(): the
    relay's endpoint and key from the broker's welcome, if known (for uploads)."""

    def __init__(self, broker: str, name: str = "", key: PeerKey | None = None,
                 mode: str = "auto",
                 relay: Callable[[], tuple[str, str] | None] = lambda: None) -> None:
        self.mode = mode
        self._broker = broker
        self._name = name[:200]
        self._key = key
        self._relay = relay
        self._lock = threading.Lock()
        self._slow: dict[str, float] = {}   # holder address -> until when it is relayed
        self._probed: dict[str, float] = {}  # holder address -> until when it is taken as up

    def route(self, ref: Ref) -> Ref:
        """REF with the holders to try in order: those to be reached directly, then each
        holder again through the relay (no relay known: REF as it is)."""
        relay = self._relay_of(ref.relay)
        if relay is None:
            return ref
        direct = [h for h in ref.holders if self.direct(h)]
        return dataclasses.replace(ref, holders=(*direct, *(_through(h, relay)
                                                            for h in ref.holders)))

    def uploads(self, holder: Holder) -> list[Holder]:
        """The ways to put an object on HOLDER, in order (directly, through the relay)."""
        relay = self._relay_of(None)
        ways = [holder] if relay is None or self.direct(holder) else []
        return ways + ([_through(holder, relay)] if relay is not None else [])

    def direct(self, holder: Holder) -> bool:
        """Whether to try HOLDER directly: not if told to relay everything, nor if its
        address failed lately, nor if its port refuses connections now (looked at once
        per address while it answers)."""
        if holder.relay or self.mode != "auto":
            return not holder.relay and self.mode == "never"
        now = time.monotonic()
        with self._lock:
            if self._slow.get(holder.address, 0.0) > now:
                return False
            if self._probed.get(holder.address, 0.0) > now:
                return True
        if unreachable(holder.address) is not None:
            self.failed(holder)
            return False
        with self._lock:
            if len(self._probed) > 10_000:  # (addresses of agents long gone)
                self._probed = {a: t for a, t in self._probed.items() if t > now}
            self._probed[holder.address] = now + REMEMBER
        return True

    def failed(self, holder: Holder) -> None:
        """HOLDER could not be reached directly: its address goes through the relay for a
        while."""
        if holder.relay or self.mode != "auto":
            return
        now = time.monotonic()
        with self._lock:
            if len(self._slow) > 10_000:  # (addresses of agents long gone)
                self._slow = {a: t for a, t in self._slow.items() if t > now}
            self._slow[holder.address] = now + REMEMBER
            self._probed.pop(holder.address, None)

    def fields(self, holder: Holder) -> dict[str, Any]:
        """What a request to HOLDER says besides the object's: through the relay, the agent
        it is for and who asks."""
        return {"agent": holder.agent, "from": self._name} if holder.relay else {}

    def secure(self, sock: zmq.Socket[Any]) -> bool:
        """Give SOCK (to the relay) this process's key pair, as to the broker; False if it
        has none."""
        if self._key is None:
            return False
        sock.curve_publickey, sock.curve_secretkey = self._key.public, self._key.secret
        return True

    def _relay_of(self, given: tuple[str, str] | None) -> tuple[str, str] | None:
        """The relay's address here and key: GIVEN (a reference's), else the welcome's;
        None if neither, or this process never relays."""
        relay = given or self._relay()
        if relay is None or not relay[0] or self.mode == "never":
            return None
        return resolve(relay[0], self._broker), relay[1]


def _through(holder: Holder, relay: tuple[str, str]) -> Holder:
    return Holder(holder.agent, relay[0], relay[1], relay=True)
