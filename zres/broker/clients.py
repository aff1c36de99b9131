"""The clients the broker knows: who they are, when they were last heard, their task ids.

A client names its tasks with ids of its own (``local``); the broker maps them to its
task ids per client, so one client can never name another's task.

A client's session is bound to the key that said hello with its routing id: a message
on that routing id from another key is refused (``Broker._acting``), and since the
routing id's messages now go to that other connection, nothing more is sent to it (the
session is *away*) until its own key is heard again. So is a client whose connection
closed: what the broker tells it meanwhile waits (``held``) and goes once it is back,
rather than to whoever takes the routing id next.

A client whose connection closed and that does not come back within GRACE seconds (a
client that reconnects does so within a fraction of a second: a network blip, its
broker's restart) is gone, as one silent for the TIMEOUT (a stopped process, a cut
network) or one that said goodbye: its work is stopped, but what it detached
(``orphans``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.limits import quote
from ..logs import get_logger

log = get_logger("zres.broker")


@dataclass(slots=True)
class ClientRecord:
    ident: bytes
    name: str
    last_seen: float
    ids: dict[int, int] = field(default_factory=dict)  # local id -> task id
    # Restored from the state of a previous life of the broker, and not heard since.
    restored: bool = False
    accepted: int = 0   # the highest local id submitted, to acknowledge once kept
    # Who it acts as: the name of its key (with keys), or the owner of the task it was made
    # in (its hello's task token), with a client's powers; its tasks', jobs' and actors'
    # owner. ROLE: the powers (client or admin; "" without keys).
    owner: str = ""
    role: str = ""
    # The key that said hello with its routing id ("role:name", and its public key):
    # only that key may speak for it ("": restored, not heard since).
    key: str = ""
    public: str = ""
    fd: int = -1        # the connection it last spoke over
    away: bool = False  # that connection closed, or another key took its routing id
    away_since: float = 0.0  # when that connection closed (0: it did not)
    held: list[tuple[str, Any, Any]] = field(default_factory=list)  # told while away
    output: bool = True  # it wants its tasks' output (hello{output})
    output_allowance: tuple[float, float] = (0.0, 0.0)  # bytes it may be sent, as of when
    # The local ids it says it holds, while it says so after a restart (resume{holds}).
    holds: set[int] | None = None


class ClientRegistry:
    """Connected clients by routing id; ON_DROP(client, event) cleans up after one leaves."""

    def __init__(self, timeout: float, on_drop: Callable[[ClientRecord, str], None],
                 grace: float = 5.0) -> None:
        self.timeout = timeout
        self.grace = grace    # seconds a client whose connection closed has to come back
        self._by_ident: dict[bytes, ClientRecord] = {}
        self._by_fd: dict[int, bytes] = {}   # connection -> the client last heard over it
        self._on_drop = on_drop

    def __len__(self) -> int:
        return len(self._by_ident)

    def idents(self, present: bool = False) -> list[bytes]:
        """The clients' routing ids (PRESENT: of those not away)."""
        if present:
            return [i for i, c in self._by_ident.items() if not c.away]
        return list(self._by_ident)

    def get(self, ident: bytes) -> ClientRecord | None:
        return self._by_ident.get(ident)

    def hello(self, ident: bytes, name: str, now: float) -> str:
        """Note a client saying hello; return whether it is ``new`` to this broker,
        ``known``, or ``resumed``: its tasks were restored from a previous life's state."""
        client = self._by_ident.get(ident)
        if client is None:
            self._by_ident[ident] = ClientRecord(ident, name, now)
            log.info("client_joined", client=quote(name))
            return "new"
        client.last_seen = now
        if client.restored:
            client.restored = False
            log.info("client_resumed", client=quote(name), tasks=len(client.ids))
            return "resumed"
        return "known"

    def restore(self, ident: bytes, owner: str, wait: float) -> ClientRecord:
        """The client IDENT, acting as OWNER, owned tasks kept by a previous life of the
        broker: it has WAIT seconds (not only the usual timeout) to say hello again."""
        client = self._by_ident.get(ident)
        if client is None:
            last_seen = time.monotonic() + max(0.0, wait - self.timeout)
            client = self._by_ident[ident] = ClientRecord(
                ident, owner or ident[:16].hex(), last_seen, restored=True, owner=owner)
        return client

    def seen(self, ident: bytes, now: float) -> ClientRecord | None:
        """Return the client IDENT and note it is alive, or None if it is unknown."""
        client = self._by_ident.get(ident)
        if client is not None:
            client.last_seen = now
        return client

    def leave(self, ident: bytes, event: str = "client_left") -> None:
        """The client said goodbye (or EVENT: it may not stay): drop it and what it left
        behind."""
        client = self._by_ident.pop(ident, None)
        if client is not None:
            self._on_drop(client, event)

    def all(self) -> list[ClientRecord]:
        return list(self._by_ident.values())

    def heard(self, client: ClientRecord, fd: int) -> list[tuple[str, Any, Any]]:
        """CLIENT (its own key) spoke over connection FD: return what was held for it while
        it was away, to send now."""
        if client.fd != fd:
            if self._by_fd.get(client.fd) == client.ident:
                del self._by_fd[client.fd]
            client.fd = fd
        if fd >= 0:
            # (also when FD is the one it had: a new connection given a closed one's
            # number, which ``disconnected`` forgot)
            self._by_fd[fd] = client.ident
        if not client.away:
            return []
        client.away, client.away_since = False, 0.0
        held, client.held = client.held, []
        log.info("client_back", client=quote(client.name), held=len(held))
        return held

    def disconnected(self, fd: int) -> None:
        """Connection FD closed: the clients last heard over it are away (if one has since
        reconnected over a reused descriptor, its next message brings it back)."""
        client = self._by_ident.get(self._by_fd.pop(fd, b""))
        if client is not None and client.fd == fd:
            client.away, client.away_since = True, time.monotonic()

    def forgive(self, gap: float) -> None:
        """The broker did not listen for GAP seconds: nobody is silent for that."""
        for client in self._by_ident.values():
            client.last_seen += gap
            if client.away_since:
                client.away_since += gap

    def expire(self, now: float) -> None:
        """Drop the clients silent for longer than the timeout, and those whose connection
        closed that are not back within the grace."""
        for client in list(self._by_ident.values()):
            if now - client.last_seen > self.timeout:
                del self._by_ident[client.ident]
                self._on_drop(client, "client_lost")
            elif client.away and client.away_since and now - client.away_since > self.grace:
                del self._by_ident[client.ident]
                self._on_drop(client, "client_gone")
