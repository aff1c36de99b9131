"""Broker addresses: what a user may type, and whether anything listens there.

ZeroMQ connects in the background and retries for ever, so a wrong address looks like a
slow broker. Looking for ourselves (a plain TCP or Unix-socket connect) turns "connection
refused" or "unknown host" into an error that names the address at once, and an HTTP server
(the dashboard's port given for the broker's) into one that says so.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
import time
from collections.abc import Callable

from .errors import ZresError

_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s/:\[\]]+):(\d+)")
_TRANSPORTS = ("tcp", "ipc", "inproc")
_HTTP = re.compile(r"(?:http://)?(\[[0-9A-Fa-f:.]+\]|[^\s/:\[\]]*):(\d{1,5})/?")


class Unreachable(ZresError):
    """Nothing accepts connections at a broker's address (refused, unknown host)."""


class Unanswered(ZresError):
    """A broker's address takes connections, but no answer came in the time given."""


def normalize(address: str) -> str:
    """Return ADDRESS as ZeroMQ takes it: ``host:port`` means ``tcp://host:port``.

    Raises ValueError, naming the address and the forms accepted, for anything else.
    """
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"{address!r} is not a broker address: use tcp://HOST:PORT "
                         "(e.g. tcp://127.0.0.1:7070) or ipc://PATH")
    address = address.strip()
    scheme, sep, rest = address.partition("://")
    if not sep:
        if _HOST_PORT.fullmatch(address):
            return normalize(f"tcp://{address}")
        raise ValueError(f"{address!r} is not a broker address: use tcp://HOST:PORT "
                         "(e.g. tcp://127.0.0.1:7070), HOST:PORT or ipc://PATH")
    if scheme not in _TRANSPORTS:
        raise ValueError(f"{address!r}: unknown transport {scheme!r} (use tcp, ipc or inproc)")
    match = _HOST_PORT.fullmatch(rest.rpartition(";")[2]) if scheme == "tcp" else None
    if scheme == "tcp" and match is None:
        raise ValueError(f"{address!r}: a tcp address needs a host and a port, "
                         "e.g. tcp://127.0.0.1:7070")
    if match is not None and int(match.group(2)) > 65535:
        # (libzmq would take the port modulo 65536: 99999 binds or dials 34463)
        raise ValueError(f"{address!r}: port {match.group(2)} is past 65535")
    if match is not None and match.group(1).startswith("["):
        # (zres's sockets are IPv4 ones: libzmq's bind says `No such device`, its connect
        # retries for ever)
        raise ValueError(f"{address!r}: IPv6 addresses are not supported; give an IPv4 "
                         "address or a host name")
    if not rest:
        raise ValueError(f"{address!r}: the address after {scheme}:// is empty")
    return address


def is_local(address: str) -> bool:
    """Whether a broker bound to ADDRESS is reachable from this machine only (loopback,
    a Unix socket, inproc)."""
    scheme, _, rest = address.partition("://")
    if scheme != "tcp":
        return True
    match = _HOST_PORT.fullmatch(rest.rpartition(";")[2])
    return is_loopback(match.group(1).strip("[]") if match else "")


def is_loopback(host: str) -> bool:
    """Whether HOST is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host or interface name: it may face a network
        return False


def parse_http_address(text: str) -> tuple[str, int] | None:
    """Return ``--http``'s HOST and PORT (None for ``off``); ValueError naming TEXT if it
    is neither ``HOST:PORT`` nor ``off``."""
    if text.strip().lower() in ("off", "none", "no", "false", ""):
        return None
    match = _HTTP.fullmatch(text.strip())
    if match is None or int(match.group(2)) > 65535:
        raise ValueError(f"--http {text!r}: give HOST:PORT (e.g. 127.0.0.1:8787) or off")
    return match.group(1).strip("[]") or "0.0.0.0", int(match.group(2))


def unreachable(address: str, timeout: float = 0.5) -> str | None:
    """Say why nothing accepts connections at ADDRESS ("connection refused"), or None
    when something does or it cannot be told (no answer yet, another transport)."""
    scheme, _, rest = address.partition("://")
    try:
        if scheme == "tcp":
            match = _HOST_PORT.fullmatch(rest.rpartition(";")[2])
            if match is None:
                return None
            host = match.group(1).strip("[]")
            socket.create_connection((host, int(match.group(2))), timeout).close()
        elif scheme == "ipc":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(rest)
        return None
    except socket.gaierror:
        return f"unknown host {rest.rpartition(':')[0].rpartition(';')[2]!r}"
    except TimeoutError:
        return None  # a slow or filtered network: it may yet answer
    except FileNotFoundError:
        return "no such socket file"
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH,
                         errno.EADDRNOTAVAIL, errno.ENOTSOCK):
            return exc.strerror.lower() if exc.strerror else str(exc)
        return None


def foreign(address: str, timeout: float = 0.5) -> str | None:
    """Say what listens at ADDRESS when it is an HTTP server, not a ZeroMQ peer; None when
    it is a ZeroMQ peer, or cannot be told (not TCP, nothing there, no answer in time).

    A ZeroMQ peer greets every connection at once, and an HTTP server says nothing until
    asked: only a silent one is sent a request (so no broker is ever sent HTTP unless it is
    stopped, and then it drops the connection when it wakes, as it drops any bad greeting).
    """
    scheme, _, rest = address.partition("://")
    match = _HOST_PORT.fullmatch(rest.rpartition(";")[2]) if scheme == "tcp" else None
    if match is None:
        return None
    try:
        with socket.create_connection((match.group(1).strip("[]"), int(match.group(2))),
                                      timeout) as sock:
            try:
                greeting = sock.recv(16)
            except TimeoutError:
                sock.sendall(b"HEAD / HTTP/1.0\r\n\r\n")
                greeting = sock.recv(16)
    except OSError:  # (a timeout too: a stopped peer, a slow network)
        return None
    if greeting.startswith(b"HTTP/"):
        return "an HTTP server (the dashboard?), not a zres broker's port"
    return None


def wait_for_answer(address: str, answered: Callable[[float], bool], timeout: float,
                    what: str = "no zres broker answered") -> None:
    """Call ANSWERED(seconds), which waits up to that long for the broker, until it says
    True; raise ZresError at TIMEOUT, or as soon as nothing listens at ADDRESS (Unreachable;
    looked at after the first half second, then every second) or an HTTP server does
    (looked at once, after the first half second)."""
    start = time.monotonic()
    deadline = start + timeout
    next_look = start + 0.5
    looked = False
    while True:
        now = time.monotonic()
        if answered(max(0.0, min(deadline, next_look) - now)):
            return
        now = time.monotonic()
        if now >= deadline:
            raise Unanswered(f"{what} at {address} within {timeout:g}s")
        if now >= next_look:
            next_look = now + 1.0
            why = unreachable(address)
            if why is not None:
                raise Unreachable(f"cannot reach the zres broker at {address}: {why}")
            what_is_there = None if looked else foreign(address)
            looked = True
            if what_is_there is not None:
                raise ZresError(f"{address} is {what_is_there}: give the address the "
                                "broker listens on (zres broker --listen, default "
                                "tcp://127.0.0.1:7070)")
