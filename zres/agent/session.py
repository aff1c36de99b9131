"""This agent's session at its broker: its id, the broker's epoch, and the lease.

The session is the broker's record of the agent, kept across pauses and reconnections.
The lease fences the agent's work: it runs from when the agent sent a heartbeat that the
broker has since echoed (on the agent's own clock, so no two clocks are compared), for
less time than the broker waits before it declares the agent lost. While it has lapsed,
the agent and its workers start nothing: the broker may already count their grants as
someone else's.
"""

from __future__ import annotations

import random
import threading
import time

from ..core.address import unreachable
from ..logs import get_logger
from .shared import Lease

log = get_logger("zres.agent")


class Session:
    """The session's state; LEASE is the file the workers read the lease from.

    Two threads renew the lease: the agent's loop and its heartbeat thread; a lock keeps
    the later end from being overwritten by an earlier one, and an echo of a session
    since left from renewing the new one."""

    def __init__(self, lease: Lease) -> None:
        self._lock = threading.Lock()
        self._lease = lease
        self.id = _new_id()
        self.epoch: int | None = None
        self.registered = False
        self.lease_len = 0.0
        self.until = 0.0             # the lease's end (time.monotonic())
        self.asked_at = 0.0          # when the last registration was sent

    def valid(self) -> bool:
        """Whether the broker still counts on this agent: work may start."""
        return self.registered and time.monotonic() < self.until

    def renew(self, anchor: float, session: int | None = None,
              epoch: int | None = None) -> None:
        """The broker heard what we sent at ANCHOR (for SESSION, as the broker of EPOCH
        says: not this session's, or another broker's, renews nothing)."""
        with self._lock:
            if session is not None and (session != self.id or epoch != self.epoch
                                        or not self.registered):
                return
            self.until = max(self.until, anchor + self.lease_len)
            self._lease.set(self.until)

    def renewed_since(self, sent: float) -> bool:
        """Whether the lease runs from a heartbeat sent at SENT or later (the broker has
        echoed one that recent)."""
        return self.until - self.lease_len >= sent

    def welcomed(self, epoch: int | None, lease_len: float) -> bool:
        """The broker welcomed this session; return whether for the first time."""
        with self._lock:
            first = not self.registered
            self.epoch, self.lease_len, self.registered = epoch, lease_len, True
        return first

    def ask_again(self) -> None:
        """Register this session again, at once (the broker forgot us, or restarted)."""
        self.registered = False
        self.asked_at = 0.0

    def restart(self) -> None:
        """Begin a new session: the old one's work is void, its lease gone."""
        with self._lock:
            self.id = _new_id()
            self.epoch = None
            self.until = 0.0
            self._lease.set(0.0)
            self.ask_again()


def _new_id() -> int:
    return random.getrandbits(62)


class ReachWarning:
    """Say, FIRST seconds after the agent last had a session at its broker and every
    EVERY seconds after, that it cannot reach the broker: the address, and why if a look
    can tell (an agent pointed at a wrong address must not wait in silence)."""

    FIRST, EVERY = 5.0, 30.0

    def __init__(self, address: str) -> None:
        self.address = address
        self._since: float | None = None
        self._next = 0.0

    def update(self, now: float, registered: bool) -> None:
        if registered:
            self._since = None
        elif self._since is None:
            self._since, self._next = now, now + self.FIRST
        elif now >= self._next:
            self._next = now + self.EVERY
            log.warning("broker_unreachable", broker=self.address,
                        seconds=round(now - self._since),
                        why=unreachable(self.address) or "no zres broker answers there")
