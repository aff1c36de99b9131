"""An agent's local socket: a reader on the agent's own host (a client, a worker process
of another agent) is given the file of an object it has the token for, as a descriptor,
and reads it in place (``zres.core.local_reads``): no byte of it goes through a socket,
and none is encrypted (CURVE protects bytes crossing a network; these never leave the
host's memory).

The socket is a Linux abstract unix socket (no file: nothing left behind by a killed
agent, no directory whose permissions a reader of another user would need) with a random
name, which the data port tells whoever asks (``local``). Only a process on this host, in
its network namespace, can reach it: any other reads over the data port as before. A
reader checks that the socket's peer is the process the data port named (SO_PEERCRED),
so that nobody else on the host can pose as the agent. As on the data port, nothing is
given without the broker's token for that object; a descriptor is read only (the file is
the agent's, 0600: a reader of another user could not open it by its name).
"""

from __future__ import annotations

import os
import secrets
import selectors
import socket
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ...core import protocol as P
from ...core import transfer as T
from ...core.errors import ProtocolError
from ...core.wakeup import Waker
from ...logs import get_logger
from .store import ObjectStore

log = get_logger("zres.agent")
_READERS = 1024    # connections kept at once, at most (each a descriptor): the oldest go
_REQUEST = 4096    # bytes of a request, at most
_SEND = 1.0        # seconds an answer may wait to be sent before its reader is dropped


class LocalPort:
    """Give readers on this host the files of STORE's objects, each for its token (made
    with SECRET(): the cluster's data secret, None until the broker's welcome). ``name``:
    the socket's (without its leading NUL), "" where there is none (not Linux)."""

    def __init__(self, store: ObjectStore, secret: Callable[[], bytes | None]) -> None:
        self._store = store
        self._secret = secret
        self.name = ""
        self._listener: socket.socket | None = None
        self._readers: OrderedDict[int, socket.socket] = OrderedDict()
        self._selector = selectors.DefaultSelector()
        self._waker = Waker()
        self._thread = threading.Thread(target=self._run, name="zres-agent-local",
                                        daemon=True)
        if sys.platform.startswith("linux"):
            try:
                self._listen()
            except OSError as exc:
                log.warning("local_socket_unavailable", error=str(exc)[:200])

    def _listen(self) -> None:
        name = f"zres-data-{secrets.token_hex(16)}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.bind("\0" + name)
            sock.listen(64)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._listener, self.name = sock, name

    def start(self) -> None:
        if self._listener is not None:
            self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket (once: a second stop does nothing, for its
        waker's descriptors, closed twice, could be another's by then)."""
        if self._waker.stopped:
            return
        self._waker.stop()
        if self._thread.is_alive():
            self._thread.join(5)
        self._waker.close()
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        if self._listener is not None:
            self._listener.close()
        self._selector.close()

    # -- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        assert self._listener is not None
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._waker.fd, selectors.EVENT_READ, self._waker)
        while not self._waker.stopped:
            for key, _ in self._selector.select(1.0):
                try:
                    if key.data is None:
                        self._accept()
                    elif isinstance(key.data, socket.socket):
                        self._serve(key.data)
                except Exception:  # a bug must not take the socket down
                    log.exception("local_request_failed")

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                reader, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # (out of descriptors: those waiting wait for one)
                log.warning("local_accept_failed", error=str(exc)[:200])
                return
            reader.settimeout(_SEND)
            self._readers[reader.fileno()] = reader
            self._selector.register(reader, selectors.EVENT_READ, reader)
            while len(self._readers) > _READERS:
                self._drop(next(iter(self._readers.values())))

    def _drop(self, reader: socket.socket) -> None:
        self._readers.pop(reader.fileno(), None)
        try:
            self._selector.unregister(reader)
        except (KeyError, ValueError):
            pass
        reader.close()

    def _serve(self, reader: socket.socket) -> None:
        try:
            request = reader.recv(_REQUEST)
        except OSError:
            request = b""
        if not request:  # (its reader closed it)
            self._drop(reader)
            return
        self._readers.move_to_end(reader.fileno())
        try:
            body, fd = self._answer(P.decode([request]))
        except ProtocolError as exc:
            log.warning("local_request_refused", error=str(exc)[:200])
            self._drop(reader)
            return
        try:
            socket.send_fds(reader, P.encode(P.CHUNK, body), [fd] if fd is not None else [])
        except OSError:  # (gone, or not reading: it reads over the data port then)
            self._drop(reader)
        finally:
            if fd is not None:
                os.close(fd)

    def _answer(self, msg: P.Message) -> tuple[dict[str, Any], int | None]:
        """What to answer MSG (a get), and the descriptor of the file to give with it."""
        if msg.kind != P.GET:
            raise ProtocolError(f"{msg.kind} is not a request for a local socket")
        object_id = P.field(msg, "id", int)
        body: dict[str, Any] = {"req": msg.body.get("req"), "id": object_id}
        secret = self._secret()
        if secret is None or not T.allowed(secret, msg.body.get("token"), "get", object_id):
            return {**body, "error": "refused: not a token of this cluster's for that "
                    "object"}, None
        for _ in range(3):  # (moved to disk between looking and opening: looked for again)
            path = self._store.path(object_id)
            if path is None:
                break
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            return {**body, "size": os.fstat(fd).st_size}, fd
        return {**body, "error": "missing"}, None
