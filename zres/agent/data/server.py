"""An agent's data port: serves the objects it holds, and takes uploads, in a thread of
its own with a zmq context of its own (its CURVE work never delays the agent's control
connection, and no transfer waits for the agent's loop).

Anyone may connect (with keys, CURVE encrypts; the port's key is the agent's own), and
nothing is served or written without a token the broker made for that object
(``zres.core.transfer``): a ``get`` asks for a range of an object's bytes, a ``put``
writes one. Uploads that complete are handed to the agent's loop (``stored``), which
counts them in its store and tells the broker.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import OrderedDict
from typing import Any
from urllib.parse import urlsplit

import zmq

from ...core import keys, net
from ...core import objects as O
from ...core import protocol as P
from ...core import transfer as T
from ...core.address import is_loopback
from ...core.errors import ProtocolError
from ...core.wakeup import Waker
from ...logs import get_logger
from .local import LocalPort
from .store import ObjectStore

log = get_logger("zres.agent")
_MAPPED = 64        # objects kept mapped for serving, the most recently asked for
_UPLOADS = 64       # uploads under way at once, at most (each holds a file open)
# Seconds an upload may go without a chunk before what came of it is dropped: its sender
# died or gave up (a client killed mid-put, ^C), and a partial file in the memory tier
# held memory the store does not count, for as long as the agent ran. (A sender gives up
# on a port silent for ``transfer.TIMEOUT``; one that comes back starts its put again.)
UPLOAD_IDLE = 60.0


class DataServer:
    """Serve STORE's objects on LISTEN (a zmq address; a wildcard host is advertised as
    the host's address towards BROKER, unless ADVERTISE says where others reach it: a
    public address, behind NAT), with KEY's pair for CURVE (None: no keys)."""

    def __init__(self, store: ObjectStore, listen: str, broker: str,
                 key: keys.PeerKey | None, advertise: str | None = None) -> None:
        self._store = store
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        if key is not None:
            self._sock.curve_server = True
            self._sock.curve_publickey, self._sock.curve_secretkey = key.public, key.secret
        self.bound = net.bind(self._sock, listen)
        self.address = advertise or _advertised(self.bound, broker)
        self.key = key.public.decode() if key is not None else ""
        self.secret: bytes | None = None   # the cluster's data secret (the broker's welcome)
        self.stored: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        # Readable once an upload is stored: the agent's loop polls it, and reports the put
        # at once (it heard of it at its poll's timeout, a quarter of a second per put).
        self.stored_fd, self._stored_w = os.pipe()
        os.set_blocking(self.stored_fd, False)
        os.set_blocking(self._stored_w, False)
        self.served = 0                    # bytes sent, for the agent's reports
        self._mapped: OrderedDict[int, Any] = OrderedDict()
        self._uploads: OrderedDict[tuple[bytes, int], O.ObjectWriter] = OrderedDict()
        self._waker = Waker()  # (its stop, heard at once)
        self._thread = threading.Thread(target=self._run, name="zres-agent-data", daemon=True)
        self.local = LocalPort(store, lambda: self.secret)  # (readers on this host)

    def start(self) -> None:
        self._thread.start()
        self.local.start()

    def stop(self) -> None:
        self._waker.stop()
        if self._thread.is_alive():
            self._thread.join(5)
        self.local.stop()
        self._waker.close()
        for writer in self._uploads.values():
            writer.abandon()
        self._sock.close(0)
        self._ctx.term()
        for fd in (self.stored_fd, self._stored_w):
            os.close(fd)

    def forget(self, ids: list[int]) -> None:
        """These objects were freed: stop serving them from a mapping (the loop's thread;
        the server looks again on the next request)."""
        for object_id in ids:
            self._mapped.pop(object_id, None)

    # -- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._waker.fd, zmq.POLLIN)
        while not self._waker.stopped:
            if self._uploads:
                self._drop_idle(time.monotonic())
            if self._sock not in dict(poller.poll(200)):
                continue
            for _ in range(256):
                try:
                    frames = P.recv(self._sock)
                except zmq.Again:
                    break
                try:
                    self._handle(frames[0].bytes, P.decode(frames[1:]))
                except ProtocolError as exc:
                    log.warning("data_request_refused", error=str(exc)[:200])
                except Exception:  # a bug must not take the port down
                    log.exception("data_request_failed")

    def _drop_idle(self, now: float) -> None:
        """Drop the uploads that have heard nothing for UPLOAD_IDLE seconds (the least
        recently heard are first in ``_uploads``)."""
        for key, writer in list(self._uploads.items()):
            if now - writer.written_at <= UPLOAD_IDLE:
                break
            del self._uploads[key]
            writer.abandon()
            log.info("upload_abandoned", object=key[1], after=UPLOAD_IDLE)

    def _reply(self, ident: bytes, kind: str, body: dict[str, Any],
               frames: tuple[Any, ...] = ()) -> None:
        P.send(self._sock, [ident, *P.encode(kind, body, frames)])

    def _handle(self, ident: bytes, msg: P.Message) -> None:
        req = msg.body.get("req")
        object_id = P.field(msg, "id", int) if msg.kind != P.LOCAL else 0
        if msg.kind == P.GET:
            offset, length = P.field(msg, "offset", int), P.field(msg, "length", int)
            body: dict[str, Any] = {"req": req, "id": object_id, "offset": offset}
            if self.secret is None or not T.allowed(self.secret, msg.body.get("token"),
                                                    "get", object_id):
                self._reply(ident, P.CHUNK, {**body, "error": "refused: not a token of "
                                             "this cluster's for that object"})
                return
            data = self._map(object_id)
            if data is None:
                self._reply(ident, P.CHUNK, {**body, "error": "missing"})
                return
            end = min(len(data), offset + max(0, min(length, T.CHUNK)))
            chunk = memoryview(data)[max(0, offset):end]
            self.served += chunk.nbytes
            self._reply(ident, P.CHUNK, {**body, "size": len(data)}, (chunk,))
        elif msg.kind == P.PUT:
            self._put(ident, msg, object_id, req)
        elif msg.kind == P.LOCAL:
            self._reply(ident, P.LOCAL_REPLY, {"req": req, "pid": os.getpid(),
                                               "uid": os.getuid(),
                                               **({"socket": self.local.name}
                                                  if self.local.name else {})})
        else:
            raise ProtocolError(f"{msg.kind} is not a request for a data port")

    def _map(self, object_id: int) -> Any:
        data = self._mapped.get(object_id)
        if data is None:
            path = self._store.path(object_id)
            if path is None:
                return None
            try:
                data = O.map_object(path)
            except (OSError, O.ObjectError):
                return None
            self._mapped[object_id] = data
            while len(self._mapped) > _MAPPED:
                self._mapped.popitem(last=False)  # (unmapped once no send holds it)
        else:
            self._mapped.move_to_end(object_id)
        return data

    def _put(self, ident: bytes, msg: P.Message, object_id: int, req: Any) -> None:
        size, offset = P.field(msg, "size", int), P.field(msg, "offset", int)
        body: dict[str, Any] = {"req": req, "id": object_id, "offset": offset}
        if self.secret is None or not T.allowed(self.secret, msg.body.get("token"), "put",
                                                object_id, size):
            self._reply(ident, P.PUT_ACK, {**body, "error": "refused: not a token of this "
                                           "cluster's for writing that object"})
            return
        writer = self._uploads.get((ident, object_id))
        try:
            if writer is None:
                writer = self._uploads[ident, object_id] = O.ObjectWriter(
                    self._store.new_path(object_id), size)
                while len(self._uploads) > _UPLOADS:
                    self._uploads.popitem(last=False)[1].abandon()
            self._uploads.move_to_end((ident, object_id))  # (least recently heard first)
            writer.write(offset, P.buffer(msg.frames[0]) if msg.frames else b"")
            if writer.complete():
                del self._uploads[ident, object_id]
                writer.done()
                self.stored.put((object_id, size))
                try:
                    os.write(self._stored_w, b"!")
                except BlockingIOError:
                    pass  # (woken already: the loop reads the whole queue)
                body["done"] = True
        except (OSError, O.ObjectError) as exc:
            self._uploads.pop((ident, object_id), None)
            if writer is not None:
                writer.abandon()
            body["error"] = f"cannot keep it: {exc}"
        self._reply(ident, P.PUT_ACK, body)


def _advertised(bound: str, broker: str) -> str:
    """BOUND (a data port's endpoint) as others reach it: a wildcard host replaced by this
    host's address towards BROKER's."""
    parts = urlsplit(bound)
    if parts.hostname not in ("0.0.0.0", "::", "*"):
        return bound
    return f"tcp://{net.spelled(net.towards(broker), str(parts.port))}"


def default_listen(broker: str) -> str:
    """Where an agent's data port listens by default: loopback when its broker is on
    loopback (``::1`` for a broker there), else every interface (of both IP families for a
    broker reached over IPv6). (Loopback however written: ``[::ffff:127.0.0.1]``, the
    IPv4 one mapped, is 127.0.0.1's.)"""
    found = net.host_port(broker)  # (None: ipc or inproc, this host)
    host = net.unmapped(found[0]) if found is not None else "127.0.0.1"
    if is_loopback(host):
        return "tcp://[::1]:0" if net.v6(host) else "tcp://127.0.0.1:0"
    return "tcp://*:0" if net.ipv6(broker) else "tcp://0.0.0.0:0"
