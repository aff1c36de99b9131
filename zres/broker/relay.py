"""The broker's relay: objects moved for clients and agents that cannot reach a holder's
data port themselves (NAT, a firewall), a chunk at a time, never held whole.

It is a thread of the broker's with a zmq context and a ROUTER socket of its own, beside
the broker's address (``[broker] relay_listen``): no relayed byte passes through the
broker's loop, so a gigabyte relayed delays no heartbeat and no grant. It speaks CURVE with
the broker's key and lets in the holders of the broker's keys only (a ZAP handler of its
own over the same keys directory, ``auth``): a peer gets in as it gets into the broker.

A request is a data port's ``get`` or ``put`` (``zres.core.transfer``) naming the holder
(``agent``) and who asks (``from``). Its token is checked here (the relay knows the
cluster's data secret); then it goes on over a connection of the relay's own to that
agent's data port (a CURVE client with the broker's key pair: a data port serves any
holder of a token), and the answer comes back to the requester as it arrives. A requester
keeps its window of requests in flight per transfer, so at most that many chunks of a
transfer pass through at once; at most ``MAX_INFLIGHT`` requests are forwarded at once
(more wait their turn, a little while; past ``MAX_WAITING`` they are refused).

Where it reaches an agent is told at each registration (``route``): the port the agent
bound, on the host its control connection comes from (``Peer-Address``), when it bound
every interface, else the address it bound; then the address it advertises (which may be
one only others reach: ``--data-advertise``). An agent the broker declares lost (``forget``)
has its requests, those in flight and those that come later, answered at once that it was
lost (its requesters try their next holder, or ask the broker where the object is now),
not after a timeout, until it registers again. An agent that leaves the relay's requests
unanswered for ``TIMEOUT`` has them answered with an error (the same for its requesters),
and its next address is tried for the next ones. A requester that goes away leaves
nothing behind: its answers are dropped as they come, or its requests time out.

What it moved is counted, in all and per requester (the name of its key, and the name it
gives), for status and ``/metrics`` (``status``: a small copy made under a lock).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import zmq

from ..core import keys as K
from ..core import net
from ..core import protocol as P
from ..core import transfer as T
from ..core.errors import ProtocolError, ZresError
from ..core.limits import quote
from ..core.wakeup import Waker
from ..logs import get_logger
from .auth import Gate

log = get_logger("zres.broker")
MAX_INFLIGHT = 256     # requests forwarded to agents at once (each answered by <= 4 MiB)
MAX_WAITING = 4096     # requests waiting for room, at most
TIMEOUT = 4.0          # seconds an agent may leave the relay unanswered (requesters wait 5)
_COUNTED = 256         # requesters counted one by one (the least recently seen dropped)
_ROUTES = 10_000       # agents it knows the way to, at most
_WILDCARDS = ("0.0.0.0", "::", "*")
_FORWARDED = ("id", "token", "offset", "length", "size")  # (a request's fields, to its agent)


@dataclass(slots=True)
class _Back:
    """The relay's connection to one agent's data port, and its requests unanswered."""

    sock: zmq.Socket[Any]
    agent: str
    address: str
    waiting: set[int] = field(default_factory=set)
    heard: float = 0.0     # when it last answered (or was first asked, since)


@dataclass(slots=True)
class _Request:
    ident: bytes           # the requester
    req: Any               # its number for the request
    answer: str            # chunk or put_ack
    object_id: int
    offset: int
    back: _Back
    who: tuple[str, str]   # its key's name, and the name it gives


class Relay:
    """Relay transfers on LISTEN (a zmq address) for holders of the keys in KEYS (a
    directory; None: anyone), with the cluster's data SECRET; an agent silent for TIMEOUT
    seconds fails its requests."""

    def __init__(self, listen: str, keys: str | None, secret: bytes,
                 timeout: float = TIMEOUT) -> None:
        self.timeout = timeout
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._gate = Gate(self._ctx, keys)
        self._pair = K.broker_pair(keys) if keys is not None else None
        self._secret = secret
        self._front = self._ctx.socket(zmq.ROUTER)
        self._front.setsockopt(zmq.LINGER, 0)
        self._gate.secure(self._front)
        try:
            self.address = net.bind(self._front, listen)
        except zmq.ZMQError as exc:
            self._front.close(0)
            self._gate.close()
            self._ctx.term()
            raise ZresError(f"the broker's relay cannot listen on {listen}: {exc}") from None
        self.key = self._pair[0].decode() if self._pair is not None else ""
        self._lock = threading.Lock()   # the routes and counts, shared with the loop
        self._routes: OrderedDict[str, tuple[list[str], str]] = OrderedDict()
        self._failed: dict[str, int] = {}   # agent -> how many of its addresses failed
        self._lost: OrderedDict[str, str] = OrderedDict()  # agent declared lost -> why
        self._dropped: list[str] = []  # agents lost since the thread last looked
        self._backs: dict[tuple[str, str], _Back] = {}
        self._inflight: dict[int, _Request] = {}
        self._waiting: deque[tuple[float, bytes, P.Message, tuple[str, str]]] = deque()
        self._reqs = itertools.count(1)
        self._transfers = self._bytes = 0
        self._by: OrderedDict[tuple[str, str], list[int]] = OrderedDict()
        self._waker = Waker()  # (its stop, heard at once: not at its poll's timeout)
        self._thread = threading.Thread(target=self._run, name="zres-broker-relay",
                                        daemon=True)
        self._thread.start()
        log.info("relay_started", address=self.address)

    # -- the loop's side ----------------------------------------------------------------
    def route(self, agent: str, data: Any, peer: str) -> None:
        """AGENT registered, its data port as DATA says (its register's ``data``), its
        connection coming from PEER (an IP address, or "")."""
        if not isinstance(data, dict):
            return
        found = targets(data.get("address"), data.get("bound"), peer)
        with self._lock:
            self._routes[agent] = (found, str(data.get("key", ""))[:100])
            self._routes.move_to_end(agent)
            self._failed.pop(agent, None)
            self._lost.pop(agent, None)
            while len(self._routes) > _ROUTES:
                self._routes.popitem(last=False)

    def forget(self, agent: str, why: str) -> None:
        """AGENT was declared lost (WHY): its requests are answered so at once, those in
        flight (by the thread's next turn) and those to come, until it registers again."""
        with self._lock:
            self._routes.pop(agent, None)
            self._failed.pop(agent, None)
            self._lost[agent] = why[:200]
            self._lost.move_to_end(agent)
            while len(self._lost) > _ROUTES:
                self._lost.popitem(last=False)
            self._dropped.append(agent)

    def status(self) -> dict[str, Any]:
        """What it has relayed: in all, and per requester (most bytes first)."""
        with self._lock:
            by = sorted(self._by.items(), key=lambda item: -item[1][1])
            return {"address": self.address, "transfers": self._transfers,
                    "bytes": self._bytes, "inflight": len(self._inflight),
                    "clients": [{"owner": owner, "client": name, "transfers": t, "bytes": b}
                                for (owner, name), (t, b) in by]}

    def close(self) -> None:
        self._waker.stop()
        if self._thread.is_alive():
            self._thread.join(5)
        self._waker.close()
        for back in self._backs.values():
            back.sock.close(0)
        self._front.close(0)
        self._gate.close()
        self._ctx.term()

    # -- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        looked = 0.0
        poller = self._poller()
        while not self._waker.stopped:
            try:
                events = dict(poller.poll(100))
                now = time.monotonic()
                if self._gate.zap is not None and self._gate.zap in events:
                    self._gate.serve()
                changed = self._take(events, now) | self._drop()
                if now - looked > 0.5:
                    looked = now
                    self._gate.refresh()  # (a key removed is refused from then on)
                    changed |= self._expire(now)
                if changed:
                    poller = self._poller()
            except Exception:  # a bug must not take the relay down
                log.exception("relay_failed")
                poller = self._poller()

    def _poller(self) -> zmq.Poller:
        poller = zmq.Poller()
        poller.register(self._front, zmq.POLLIN)
        poller.register(self._waker.fd, zmq.POLLIN)
        if self._gate.zap is not None:
            poller.register(self._gate.zap, zmq.POLLIN)
        for back in self._backs.values():
            poller.register(back.sock, zmq.POLLIN)
        return poller

    def _take(self, events: dict[Any, int], now: float) -> bool:
        """Take in what came (requests, answers); return whether a connection was made."""
        backs = len(self._backs)
        for back in [b for b in self._backs.values() if b.sock in events]:
            for _ in range(256):
                try:
                    self._answer(back, P.recv(back.sock), now)
                except zmq.Again:
                    break
        while self._waiting and len(self._inflight) < MAX_INFLIGHT:
            _, ident, msg, who = self._waiting.popleft()
            self._forward(ident, msg, who, now)
        if self._front in events:
            for _ in range(256):
                try:
                    frames = P.recv(self._front)
                except zmq.Again:
                    break
                self._request(frames, now)
        return len(self._backs) != backs

    def _request(self, frames: list[Any], now: float) -> None:
        ident = frames[0].bytes
        try:
            msg = P.decode(frames[1:])
            if msg.kind not in (P.GET, P.PUT):
                raise ProtocolError(f"{msg.kind} is not a request for the broker's relay")
            P.field(msg, "id", int)
        except ProtocolError as exc:
            log.warning("relay_request_refused", error=quote(str(exc)))
            return
        role, name, public = self._gate.sender(frames[0])
        if role and not self._gate.current(public):
            self._refuse(ident, msg, f"its key {role}:{name} was revoked")
        elif (why := self._wrong(msg)) is not None:
            self._refuse(ident, msg, why)
        elif len(self._inflight) < MAX_INFLIGHT:
            self._forward(ident, msg, (name, str(msg.body.get("from", ""))[:200]), now)
        elif len(self._waiting) < MAX_WAITING:
            self._waiting.append((now, ident, msg, (name, str(msg.body.get("from", ""))[:200])))
        else:
            self._refuse(ident, msg, "the broker's relay is busy")

    def _wrong(self, msg: P.Message) -> str | None:
        """What is wrong with request MSG, if anything: its fields, its token, its agent."""
        body = msg.body
        offset, size = body.get("offset"), body.get("length" if msg.kind == P.GET else "size")
        if type(offset) is not int or type(size) is not int or offset < 0 or size < 0 or \
                msg.kind == P.PUT and len(msg.frames) != 1:
            return f"a malformed {msg.kind}"
        if not T.allowed(self._secret, body.get("token"), msg.kind, body["id"],
                         size if msg.kind == P.PUT else 0):
            return "refused: not a token of this cluster's for that object"
        return self._unknown(body.get("agent"))

    def _unknown(self, agent: Any) -> str | None:
        """Why AGENT cannot be reached through the relay (lost, or never registered), or
        None."""
        with self._lock:
            if isinstance(agent, str) and agent in self._routes:
                return None
            why = self._lost.get(agent) if isinstance(agent, str) else None
        if why is not None:
            return f"agent {agent} was declared lost by the broker ({why})"
        return f"no agent {quote(agent, 100)} is known to the broker"

    def _refuse(self, ident: bytes, msg: P.Message, why: str) -> None:
        answer = P.CHUNK if msg.kind == P.GET else P.PUT_ACK
        P.send(self._front, [ident, *P.encode(answer, {
            "req": msg.body.get("req"), "id": msg.body.get("id"),
            "offset": msg.body.get("offset"), "error": why})])

    def _forward(self, ident: bytes, msg: P.Message, who: tuple[str, str], now: float) -> None:
        """Send request MSG on to its agent's data port."""
        agent = msg.body["agent"]
        with self._lock:
            route = self._routes.get(agent)
            tried = self._failed.get(agent, 0)
        if route is None or not route[0]:  # (lost while it waited for room, say)
            self._refuse(ident, msg, self._unknown(agent)
                         or f"the broker knows no address of agent {agent}")
            return
        address = route[0][tried % len(route[0])]
        back = self._backs.get((address, route[1]))
        if back is None:
            back = self._backs[address, route[1]] = _Back(self._connect(address, route[1]),
                                                          agent, address)
        req = next(self._reqs)
        offset = msg.body["offset"]
        if msg.kind == P.PUT:
            self._count(who, offset == 0, len(msg.frames[0]))
        body: dict[str, Any] = {k: msg.body[k] for k in _FORWARDED if k in msg.body}
        P.send(back.sock, P.encode(msg.kind, {**body, "req": req}, msg.frames[:1]))
        if not back.waiting:
            back.heard = now
        back.waiting.add(req)
        self._inflight[req] = _Request(ident, msg.body.get("req"),
                                       P.CHUNK if msg.kind == P.GET else P.PUT_ACK,
                                       msg.body["id"], offset, back, who)

    def _connect(self, address: str, key: str) -> zmq.Socket[Any]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)  # (bounded by MAX_INFLIGHT: a send never blocks)
        if key:
            public, secret = self._pair if self._pair is not None else zmq.curve_keypair()
            sock.curve_serverkey = key.encode()
            sock.curve_publickey, sock.curve_secretkey = public, secret
        net.connect(sock, address)
        return sock

    def _answer(self, back: _Back, frames: list[Any], now: float) -> None:
        """Pass an agent's answer back to whoever asked (dropped if that one is gone)."""
        back.heard = now
        try:
            msg = P.decode(frames)
        except ProtocolError:
            return
        req = msg.body.get("req")
        request = self._inflight.pop(req, None) if type(req) is int and req in back.waiting \
            else None
        if request is None:
            return  # (an answer to a request given up on)
        back.waiting.discard(req)
        if msg.kind == P.CHUNK and "error" not in msg.body and msg.frames:
            self._count(request.who, request.offset == 0, len(msg.frames[0]))  # (then sent)
        P.send(self._front, [request.ident, *P.encode(msg.kind, {**msg.body,
                                                                 "req": request.req},
                                                      msg.frames[:1])])

    def _count(self, who: tuple[str, str], begins: bool, size: int) -> None:
        with self._lock:
            self._transfers += begins
            self._bytes += size
            counts = self._by.get(who)
            if counts is None:
                counts = self._by[who] = [0, 0]
                if len(self._by) > _COUNTED:
                    self._by.popitem(last=False)
            self._by.move_to_end(who)
            counts[0] += begins
            counts[1] += size

    def _expire(self, now: float) -> bool:
        """Answer with an error the requests of agents silent for TIMEOUT (their next
        address is tried next), and those that waited that long for room; return whether a
        connection was closed."""
        while self._waiting and now - self._waiting[0][0] > self.timeout:
            _, ident, msg, _ = self._waiting.popleft()
            self._refuse(ident, msg, "the broker's relay is busy")
        silent = [b for b in self._backs.values()
                  if b.waiting and now - b.heard > self.timeout]
        for back in silent:
            self._close(back, f"agent {back.agent} did not answer the broker's relay at "
                        f"{back.address} within {self.timeout:g}s")
            with self._lock:
                self._failed[back.agent] = self._failed.get(back.agent, 0) + 1
            log.warning("relay_agent_silent", agent=back.agent, address=back.address)
        return bool(silent)

    def _drop(self) -> bool:
        """Close the connections to the agents declared lost since the last turn, their
        requests answered that it was lost; return whether one was closed."""
        with self._lock:
            if not self._dropped:
                return False
            dropped, self._dropped = set(self._dropped), []
        gone = [b for b in self._backs.values() if b.agent in dropped]
        for back in gone:
            self._close(back, self._unknown(back.agent) or f"agent {back.agent} was lost")
        return bool(gone)

    def _close(self, back: _Back, why: str) -> None:
        """Answer BACK's requests with the error WHY, and close it (none counted in flight
        once its first answer has gone: a requester told may look at once)."""
        for request in [self._inflight.pop(req) for req in back.waiting]:
            P.send(self._front, [request.ident, *P.encode(request.answer, {
                "req": request.req, "id": request.object_id, "offset": request.offset,
                "error": why})])
        del self._backs[next(k for k, b in self._backs.items() if b is back)]
        back.sock.close(0)  # (and what it had queued)


def targets(advertised: Any, bound: Any, peer: str) -> list[str]:
    """Where the relay may reach an agent's data port, best first: the port it BOUND on
    the host its connection comes from (PEER), when it bound every interface, else the
    address it bound; then the one it ADVERTISED."""
    found = []
    if isinstance(bound, str) and bound.startswith(("tcp://", "ipc://")) and len(bound) < 256:
        parts = urlsplit(bound)
        if parts.hostname not in _WILDCARDS:
            found.append(bound)
        elif peer and parts.port:
            host = net.literal(net.unmapped(peer))  # (an IPv4 peer of a socket on [::])
            if host is not None:
                found.append(f"tcp://{net.spelled(str(host), parts.port)}")
    if isinstance(advertised, str) and advertised.startswith(("tcp://", "ipc://")) \
            and len(advertised) < 256 and advertised not in found:
        found.append(advertised)
    return found


def listen_beside(broker: str, given: str | None) -> str | None:
    """Where the relay listens: GIVEN (``[broker] relay_listen``; "off": nowhere), else
    beside the broker's address BROKER (its host, a free port; its socket's path and
    ``-relay``)."""
    if given is not None:
        return None if given.strip().lower() in ("off", "none", "no", "") else given
    scheme, _, rest = broker.partition("://")
    if scheme == "tcp":
        return f"tcp://{rest.rpartition(':')[0]}:0"
    return f"ipc://{rest}-relay" if scheme == "ipc" else None
