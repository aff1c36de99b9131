"""Reading objects in place on their holder's host: the holder's agent gives the object's
file (a read-only descriptor, for the object's token) over its local socket
(``zres.agent.data.local``), and the reader maps it, or reads it straight into the
value's memory. No byte goes through a socket and nothing is encrypted: on one host, a
gather of NumPy arrays is a mapping of the agent's store (copy on write), one of bytes
values one copy from it; a worker's copy of another agent's input into its own agent's
store is copied by the kernel, file to file.

Whether a holder is on this host is asked of its data port once per process (``local``);
a fetch from it waits for the answer (a round trip) for at most ``HOLD`` before asking for
bytes over the port, so that a big first object is not moved through the socket: a holder
that never answers (another version, or out of reach) is read over its port, or through
the relay, after that once. The answer names the socket,
which only a process on that host, in its network namespace, can reach, and the process
that must be at its other end (checked with SO_PEERCRED): nobody else on the host can
pose as the agent. ``ZRES_LOCAL_READS=never`` turns this off for a process (every byte
over the data ports, as between hosts: to measure them).
"""

from __future__ import annotations

import itertools
import os
import socket
import stat
import struct
import sys
import time
from typing import Any

from . import objects as O
from . import protocol as P
from .errors import ZresError

ENV = "ZRES_LOCAL_READS"
MODES = ("auto", "never")
HOLD = 0.5          # seconds a fetch waits for a holder to say where its socket is, at most
_CRED = struct.Struct("3i")  # SO_PEERCRED's (pid, uid, gid)


class Refused(ZresError):
    """The holder answered that it cannot give the object (the text says why)."""


def enabled() -> bool:
    """Whether this process reads in place where it can (``$ZRES_LOCAL_READS``);
    ValueError naming a word that is not a mode."""
    word = (os.environ.get(ENV) or "auto").strip().lower()
    if word not in MODES:
        raise ValueError(f"${ENV} is {word!r}, not one of {', '.join(MODES)}")
    return word == "auto" and sys.platform.startswith("linux")


class Link:
    """A connection to a holder's local socket NAME, whose peer must be process PID of
    user UID; TIMEOUT: seconds it may take to answer. OSError if it cannot be made (not
    on this host) or its peer is another process."""

    def __init__(self, name: str, pid: int, uid: int, timeout: float) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(timeout)
            sock.connect("\0" + name)
            peer = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                _CRED.size))
            if peer[:2] != (pid, uid):
                raise ConnectionRefusedError(f"the local socket {name!r} is process "
                                             f"{peer[0]}'s (user {peer[1]}), not the agent's")
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._timeout = timeout
        self._reqs = itertools.count(1)

    def open(self, object_id: int, size: int, token: bytes,
             timeout: float | None = None) -> int:
        """A read-only descriptor of object OBJECT_ID's file (SIZE bytes); Refused if the
        holder says why not; OSError if the socket fails (the holder is gone, stuck past
        the timeout, or TIMEOUT if shorter: TimeoutError, or answers nonsense)."""
        self._sock.settimeout(self._timeout if timeout is None
                              else min(timeout, self._timeout))
        req = next(self._reqs)
        self._sock.send(P.encode(P.GET, {"id": object_id, "token": token, "req": req})[0])
        data, fds, _, _ = socket.recv_fds(self._sock, O.HEAD, 1)
        try:
            if not data:
                raise ConnectionResetError("the holder closed its local socket")
            try:
                msg = P.decode([data])
            except ZresError as exc:
                raise ConnectionResetError(f"the holder answered nonsense: {exc}") from None
            if msg.kind != P.CHUNK or msg.body.get("req") != req:
                raise ConnectionResetError("the holder answered another request")
            if "error" in msg.body:
                raise Refused(str(msg.body["error"])[:200])
            if len(fds) != 1:
                raise ConnectionResetError("the holder sent no file")
            info = os.fstat(fds[0])
            if not stat.S_ISREG(info.st_mode) or info.st_size != size:
                raise Refused(f"sent a file of {info.st_size} bytes for an object of {size}")
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds[0]

    def close(self) -> None:
        self._sock.close()


class Links:
    """What a process knows of holders' local sockets, by data port (address, key):
    asked (waiting for the answer), none (not on this host, or failed), or a Link."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._known: dict[tuple[str, str], Link | None] = {}
        self._asked: dict[int, tuple[str, str]] = {}  # req of a local request -> port
        self._waiting: dict[tuple[str, str], float] = {}  # port asked -> when

    def unknown(self, at: tuple[str, str]) -> bool:
        """Whether the port AT is to be asked where its local socket is (not yet asked)."""
        return at not in self._known and at not in self._waiting

    def asked(self, at: tuple[str, str], req: int) -> None:
        """The port AT was asked, as request REQ."""
        if len(self._asked) > 10_000:  # (ports that never answered: old agents, gone)
            self._asked.clear()
            self._waiting.clear()
        self._asked[req] = at
        self._waiting[at] = time.monotonic()

    def holding(self, at: tuple[str, str]) -> float:
        """How long a fetch from the port AT is still to wait for its answer (0: none)."""
        asked = self._waiting.get(at)
        return 0.0 if asked is None else max(0.0, asked + HOLD - time.monotonic())

    def answered(self, body: dict[str, Any]) -> tuple[str, str] | None:
        """A port's local_reply (BODY): remember its socket, if one is reached here and
        is the agent's; return the port's (address, key) (None: not one asked)."""
        at = self._asked.pop(body.get("req", -1), None)
        if at is None:
            return None
        self._waiting.pop(at, None)
        link = None
        name, pid, uid = body.get("socket"), body.get("pid"), body.get("uid")
        if isinstance(name, str) and type(pid) is int and type(uid) is int:
            try:
                link = Link(name, pid, uid, self._timeout)
            except (OSError, ValueError):
                link = None  # (another host's, or not the agent's: over its port)
        self._known[at] = link
        return at

    def link(self, at: tuple[str, str]) -> Link | None:
        return self._known.get(at)

    def failed(self, at: tuple[str, str]) -> None:
        """AT's socket failed: forget it (asked again by a later fetch: a restarted
        agent has another)."""
        link = self._known.pop(at, None)
        if link is not None:
            link.close()

    def close(self) -> None:
        for link in self._known.values():
            if link is not None:
                link.close()
        self._known.clear()


def frames(fd: int, size: int) -> list[Any]:
    """The frames of the object in the file FD (SIZE bytes: ``objects.read_file``),
    closing FD."""
    try:
        return O.read_file(fd, size)
    finally:
        os.close(fd)
