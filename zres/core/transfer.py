"""Moving objects over agents' data ports: what a reference to an object holds, the tokens
that allow reading and writing one, and the one fetch and upload that clients, worker
processes and the broker's relay use.

An agent serves the objects it holds on a port of its own (``zres.agent.data``), apart
from every control connection, so a gigabyte moving never delays a heartbeat or a grant.
Anyone may connect (with CURVE when the cluster has keys: the bytes are encrypted), and
nothing is served without a token the broker made: a client gets tokens only for the
objects it owns, agents for the inputs of the tasks they run. A transfer moves an object's
bytes (``objects``) in chunks of ``CHUNK``, from several holders at once, at most
``WINDOW`` requests in flight to each: a holder's port (a ROUTER) drops what it cannot
queue for a reader (past zmq's high-water mark, 1,000 messages), so a fetch of thousands
of objects asked all at once lost answers. Each chunk is copied once, from the message
that brings it to where the value will live (``objects.ObjectBuffer``). A holder on the
reader's own host gives the object's file instead, read in place (``local_reads``).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from . import local_reads, objects
from . import protocol as P
from .data_ports import Ports
from .errors import ZresError

CHUNK = 4 << 20       # bytes a request asks for at most
WINDOW = 8            # requests in flight to one holder (over all its objects)
TIMEOUT = 5.0         # seconds a holder asked for chunks sends none before it counts as gone
IDLE = 60.0           # seconds a data port's connection may go unused before it is closed


class TransferError(ZresError):
    """An object could not be moved: its holders are gone, or refuse (the text says)."""


class Unanswered(TransferError):
    """A holder did not answer (an upload's: it may be reached through the relay)."""


@dataclass(frozen=True, slots=True)
class Holder:
    """An agent holding an object: its name, its data port's address and CURVE public key
    (z85; "" for a cluster without keys); RELAY: reached through the broker's relay,
    whose ADDRESS and KEY these are then (``zres.core.relaying``)."""

    agent: str
    address: str
    key: str = ""
    relay: bool = False


@dataclass(frozen=True, slots=True)
class Ref:
    """Where object ID (SIZE bytes) is, and the TOKEN that lets its holder serve it;
    RELAY: the broker's relay's endpoint and key, if it has one."""

    id: int
    size: int
    token: bytes
    holders: tuple[Holder, ...]
    relay: tuple[str, str] | None = None

    def wire(self) -> list[Any]:
        holders = [[h.agent, h.address, h.key] for h in self.holders]
        return [self.id, self.size, self.token, holders,
                *([list(self.relay)] if self.relay else [])]

    @classmethod
    def from_wire(cls, value: Any) -> Ref:
        """A Ref as ``wire`` wrote it; ValueError if VALUE is not one."""
        try:
            object_id, size, token, holders, *relay = value
            ref = cls(int(object_id), int(size), bytes(token),
                      tuple(Holder(str(a), str(addr), str(k)) for a, addr, k in holders),
                      (str(relay[0][0]), str(relay[0][1])) if relay else None)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a reference to an object: {exc}") from None
        if ref.size <= 0 or not ref.holders:
            raise ValueError("a reference names no holder, or no bytes")
        return ref


def token(secret: bytes, verb: str, object_id: int, size: int = 0) -> bytes:
    """What lets its bearer VERB ("get" or "put") object OBJECT_ID (of SIZE, for a put):
    a MAC of both under the cluster's data SECRET."""
    text = f"{verb}:{object_id}:{size}".encode()
    return hmac.new(secret, text, hashlib.sha256).digest()[:16]


def allowed(secret: bytes, given: Any, verb: str, object_id: int, size: int = 0) -> bool:
    """Whether GIVEN is the token for VERB on OBJECT_ID (SIZE)."""
    return isinstance(given, bytes) and hmac.compare_digest(
        given, token(secret, verb, object_id, size))


@dataclass(slots=True)
class _Fetch:
    ref: Ref
    buffer: objects.ObjectBuffer | objects.ObjectWriter
    holder: int = 0           # which of its holders is being asked
    asked: int = 0            # bytes asked for so far
    got: int = 0              # bytes come
    frames: list[Any] | None = None  # (read in place: local_reads)

    @property
    def at(self) -> tuple[str, str]:
        """Its current holder's data port (address and key)."""
        holder = self.ref.holders[self.holder]
        return holder.address, holder.key


@dataclass(slots=True)
class _Flight:
    """What one call's fetches have under way: requests waiting for their chunk, and per
    holder how many (at most WINDOW), when it last answered and the fetches waiting to
    ask it (in turn: the first ones finish first)."""

    waiting: dict[int, tuple[_Fetch, int, int]] = field(default_factory=dict)  # req ->
    busy: Counter[tuple[str, str]] = field(default_factory=Counter)   # (fetch, offset, length)
    heard: dict[tuple[str, str], float] = field(default_factory=dict)
    queued: dict[tuple[str, str], deque[_Fetch]] = field(default_factory=dict)
    done: int = 0             # fetches complete
    deadline: float | None = None  # (monotonic) the caller's: TimeoutError past it

    def left(self, fetch: _Fetch) -> float | None:
        """Seconds left to the caller's deadline; TimeoutError naming FETCH if none."""
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            holder = fetch.ref.holders[min(fetch.holder, len(fetch.ref.holders) - 1)]
            raise TimeoutError(f"agent {holder.agent} at {_where(holder)} did not answer "
                               "in the time given")
        return left


class Transfers:
    """A process's connections to data ports, and transfers over them (one at a time per
    process: a lock; each moves many objects at once). Its zmq context is its own: its I/O
    thread encrypts bulk data, never the control connection's messages. ROUTES
    (``relaying.Routes``): which holders to try directly, and the relay (None: direct).
    LOCAL: whether to read in place from holders on this host (None: as
    ``$ZRES_LOCAL_READS`` says, ``local_reads``)."""

    def __init__(self, timeout: float = TIMEOUT, routes: Any = None,
                 local: bool | None = None) -> None:
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._timeout = timeout
        self.routes = routes
        self._ports = Ports(self._ctx, routes)
        self._lock = threading.Lock()
        self._reqs = itertools.count(1)
        local = local_reads.enabled() if local is None else local
        self._local = local_reads.Links(timeout) if local else None

    def fetch(self, refs: Sequence[Ref],
              deadline: float | None = None) -> list[list[memoryview]]:
        """The frames of each of REFS, fetched at once from their holders (each into
        memory of its own: ``objects.ObjectBuffer``); TransferError naming the object if
        one cannot be, TimeoutError if they are not all here by DEADLINE (monotonic)."""
        fetches = [_Fetch(self._route(ref), objects.ObjectBuffer(ref.size)) for ref in refs]
        self._run(fetches, deadline)
        return [f.frames if f.frames is not None else f.buffer.frames()  # type: ignore
                for f in fetches]

    def fetch_to(self, ref: Ref, path: str) -> None:
        """Fetch REF into a file at PATH (an agent's copy of another's object)."""
        writer = objects.ObjectWriter(path, ref.size)
        try:
            self._run([_Fetch(self._route(ref), writer)])
            writer.done()
        except BaseException:
            writer.abandon()
            raise

    def _route(self, ref: Ref) -> Ref:
        return self.routes.route(ref) if self.routes is not None else ref

    def _run(self, fetches: list[_Fetch], deadline: float | None = None) -> None:
        with self._lock:
            self._close_idle()
            flight = _Flight(deadline=deadline)
            for fetch in fetches:
                flight.queued.setdefault(fetch.at, deque()).append(fetch)
            local = self._local
            # (holders read in place last: those over the network move meanwhile)
            for at in sorted(flight.queued, key=lambda a: local is not None
                             and local.link(a) is not None):
                self._ask(at, flight)
            poller = zmq.Poller()
            for sock in self._ports.sockets():
                poller.register(sock, zmq.POLLIN)
            while flight.done < len(fetches):
                held = [at for at, queue in flight.queued.items()
                        if queue and local is not None and local.holding(at)]
                wait = min([local.holding(at) for at in held], default=0.2)  # type: ignore
                if deadline is not None:  # (the caller's own limit: result(timeout))
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        flight.left(next(f for f in fetches if f.got < f.ref.size))
                events = dict(poller.poll(max(1, int(wait * 1000) + 1)))
                for sock in events:
                    while True:
                        try:
                            frames = P.recv(sock)
                        except zmq.Again:
                            break
                        self._take(frames, flight)
                for at in held:  # (answered meanwhile: asked again then; else, now)
                    self._ask(at, flight)
                now = time.monotonic()
                for at, busy in list(flight.busy.items()):
                    if busy and now - flight.heard[at] > self._timeout:
                        for fetch in fetches:  # (each of them, whether it asked yet or not)
                            if fetch.at == at and fetch.got < fetch.ref.size:
                                self._next_holder(fetch, flight, "did not answer within "
                                                  f"{self._timeout:g}s", silent=True)
                poller = _poller(self._ports.sockets(), poller)

    def _ask(self, at: tuple[str, str], flight: _Flight) -> None:
        """Keep WINDOW requests in flight to the holder AT, for the fetches queued there
        (the first in the queue asks for all its bytes before the next asks)."""
        queue = flight.queued.get(at)
        self._ports.used(at)
        while queue and flight.busy[at] < WINDOW:
            fetch = queue[0]
            if fetch.asked >= fetch.ref.size:
                queue.popleft()
                continue
            holder = fetch.ref.holders[fetch.holder]
            if self._local is not None and not holder.relay:
                link = self._local.link(at)
                if link is not None and not fetch.asked:
                    queue.popleft()
                    self._read_here(fetch, link, flight)
                    continue
                if self._local.unknown(at):
                    req = next(self._reqs)
                    self._local.asked(at, req)
                    P.send(self._ports.get(at, holder.relay), P.encode(P.LOCAL, {"req": req}))
                if not fetch.asked and self._local.holding(at):
                    return  # (its answer says which way: asked again once it comes)
            length = min(CHUNK, fetch.ref.size - fetch.asked)
            req = next(self._reqs)
            flight.waiting[req] = (fetch, fetch.asked, length)
            if not flight.busy[at]:
                flight.heard[at] = time.monotonic()  # (silent from now on: gone)
            P.send(self._ports.get(at, holder.relay), P.encode(
                P.GET, {"id": fetch.ref.id, "offset": fetch.asked, "length": length,
                        "token": fetch.ref.token, "req": req, **self._fields(holder)}))
            fetch.asked += length
            flight.busy[at] += 1

    def _read_here(self, fetch: _Fetch, link: local_reads.Link, flight: _Flight) -> None:
        """Read FETCH's object in place, its holder being on this host (LINK to it), or
        go on with the holder's data port (its local socket failed), or the next holder
        (it refuses, or did not answer). An OSError reading the file given is ours: raised."""
        at = fetch.at
        try:
            fd = link.open(fetch.ref.id, fetch.ref.size, fetch.ref.token, flight.left(fetch))
        except local_reads.Refused as exc:
            self._next_holder(fetch, flight, str(exc))
            return
        except OSError as exc:
            self._local.failed(at)  # type: ignore[union-attr]
            if isinstance(exc, TimeoutError):
                flight.left(fetch)  # (the caller's time ran out: it is told, not the holder)
                self._next_holder(fetch, flight, f"did not answer within {self._timeout:g}s",
                                  silent=True)
            else:  # (its port says whether it is gone)
                flight.queued[at].appendleft(fetch)
            return
        try:
            if isinstance(fetch.buffer, objects.ObjectWriter):
                try:
                    fetch.buffer.fill_from(fd)
                finally:
                    os.close(fd)
            else:
                fetch.frames = local_reads.frames(fd, fetch.ref.size)
        except objects.ObjectError as exc:
            self._next_holder(fetch, flight, f"sent what is not an object ({exc})")
            return
        fetch.asked = fetch.got = fetch.ref.size
        flight.done += 1

    def _take(self, frames: list[Any], flight: _Flight) -> None:
        """Take in one reply."""
        try:
            msg = P.decode(frames)
        except ZresError:
            return
        if msg.kind == P.LOCAL_REPLY:
            at = self._local.answered(msg.body) if self._local is not None else None
            if at is not None:
                self._ask(at, flight)  # (what waits for it now read in place, if it is here)
            return
        entry = flight.waiting.pop(msg.body.get("req", -1), None)
        if entry is None or msg.kind != P.CHUNK:
            return  # (an answer to a request given up on)
        fetch, offset, length = entry
        at = fetch.at
        flight.busy[at] -= 1
        flight.heard[at] = time.monotonic()
        data = P.buffer(msg.frames[0]) if msg.frames else b""
        why = msg.body.get("error", "a short chunk" if len(data) != length else None)
        if why is None:
            try:
                fetch.buffer.write(offset, data)
                fetch.got += length
            except objects.ObjectError as exc:
                why = f"sent what is not an object ({exc})"
        if why is not None:
            self._next_holder(fetch, flight, str(why))
        elif fetch.got >= fetch.ref.size:
            flight.done += 1
        self._ask(at, flight)

    def _fields(self, holder: Holder) -> dict[str, Any]:
        """What a request to HOLDER says besides the object's (through the relay: whom
        for, and from whom)."""
        return self.routes.fields(holder) if holder.relay and self.routes else {}

    def _next_holder(self, fetch: _Fetch, flight: _Flight, why: str,
                     silent: bool = False) -> None:
        """FETCH's holder failed it (WHY; SILENT: it did not answer): start again from its
        next holder, or give up."""
        at = fetch.at
        for req in [r for r, (f, _, _) in flight.waiting.items() if f is fetch]:
            del flight.waiting[req]
            flight.busy[at] -= 1
        if fetch in flight.queued[at]:
            flight.queued[at].remove(fetch)
        failed = fetch.ref.holders[fetch.holder]
        if silent and self.routes is not None:
            self.routes.failed(failed)  # (to be reached through the relay for a while)
        fetch.holder += 1
        if fetch.holder >= len(fetch.ref.holders):
            raise TransferError(f"object {fetch.ref.id} ({fetch.ref.size} bytes) could not "
                                f"be fetched: agent {failed.agent} at {_where(failed)} {why}")
        fetch.asked = fetch.got = 0
        if isinstance(fetch.buffer, objects.ObjectBuffer):
            fetch.buffer = objects.ObjectBuffer(fetch.ref.size)  # (from the start again)
        flight.queued.setdefault(fetch.at, deque()).append(fetch)
        self._ask(fetch.at, flight)
        self._ask(at, flight)

    def upload(self, holder: Holder, object_id: int, put_token: bytes,
               frames: Sequence[Any]) -> int:
        """Write the object FRAMES make to HOLDER as OBJECT_ID (PUT_TOKEN lets it); return
        its size once HOLDER has it whole; TransferError if it cannot (Unanswered: HOLDER
        did not answer)."""
        size = objects.object_size(frames)
        with self._lock:
            self._close_idle()
            sock = self._ports.get((holder.address, holder.key), holder.relay)
            stream = _Stream(objects.parts(frames))
            inflight: dict[int, int] = {}
            offset, heard = 0, time.monotonic()
            while True:
                while len(inflight) < WINDOW and offset < size:
                    data = stream.take(CHUNK)
                    req = next(self._reqs)
                    inflight[req] = offset
                    P.send(sock, P.encode(P.PUT, {"id": object_id, "size": size,
                                                  "offset": offset, "token": put_token,
                                                  "req": req, **self._fields(holder)},
                                          [data]))
                    offset += len(data)
                if sock.poll(200):
                    msg = P.decode(P.recv(sock))
                    if msg.kind != P.PUT_ACK or inflight.pop(msg.body.get("req", -1),
                                                             None) is None:
                        continue
                    heard = time.monotonic()
                    if "error" in msg.body:
                        raise TransferError(f"object {object_id} could not be put on agent "
                                            f"{holder.agent}: {msg.body['error']}")
                    if msg.body.get("done"):
                        return size
                elif time.monotonic() - heard > self._timeout:
                    self._ports.drop((holder.address, holder.key))  # (with what it queued)
                    raise Unanswered(f"object {object_id} could not be put on agent "
                                     f"{holder.agent} at {_where(holder)}: it did not "
                                     f"answer within {self._timeout:g}s")

    def _close_idle(self) -> None:
        """Close the connections to data ports unused for a while, and forget their local
        sockets (``data_ports``)."""
        for at in self._ports.close_idle(IDLE):
            if self._local is not None:
                self._local.failed(at)

    def close(self) -> None:
        self._ports.close()
        if self._local is not None:
            self._local.close()
        self._ctx.term()


class _Stream:
    """Buffers read in chunks across their boundaries (an object's parts, to upload)."""

    def __init__(self, parts: list[Any]) -> None:
        self._parts = [memoryview(p).cast("B") for p in parts]

    def take(self, count: int) -> bytes:
        out = bytearray()
        while self._parts and len(out) < count:
            part = self._parts[0]
            piece = part[:count - len(out)]
            out += piece
            if piece.nbytes == part.nbytes:
                self._parts.pop(0)
            else:
                self._parts[0] = part[piece.nbytes:]
        return bytes(out)


def _poller(socks: Any, current: zmq.Poller) -> zmq.Poller:
    """A poller over SOCKS (CURRENT if it has them all: a fetch may connect to more)."""
    socks = list(socks)
    if len(current.sockets) == len(socks):
        return current
    poller = zmq.Poller()
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    return poller


def _where(holder: Holder) -> str:
    return f"{holder.address} (through the broker's relay)" if holder.relay \
        else holder.address
