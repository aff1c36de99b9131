"""Broker addresses: what a user may type, and whether anything listens there.

ZeroMQ connects in the background and retries for ever, so a wrong address looks like a
slow broker. Looking for ourselves (a plain TCP or Unix-socket connect, over the IP family
the zmq socket dials: ``net``) turns "connection refused" or "unknown host" into an error
that names the address at once, and an HTTP server (the dashboard's port given for the
broker's) into one that says so. An IPv6 host is written in brackets, as in a URL
(``tcp://[::1]:7070``): one without them is refused, saying how to write it.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
import time
from collections.abc import Callable

from .errors import ZresError
from .net import host_port, literal, unmapped, v6

_TRANSPORTS = ("tcp", "ipc", "inproc")
# (an IPv6 one in brackets may name its zone: [fe80::1%eth0])
_HTTP = re.compile(r"(?:http://)?(\[[0-9A-Fa-f:.]+(?:%[\w.-]+)?\]|[^\s/:\[\]]*):(\d{1,5})/?")
_EXAMPLES = "tcp://HOST:PORT (e.g. tcp://127.0.0.1:7070, tcp://[::1]:7070)"
_BRACKETS = "an IPv6 address goes in brackets, its port after them"


class Unreachable(ZresError):
    """Nothing accepts connections at a broker's address (refused, unknown host)."""


class Unanswered(ZresError):
    """A broker's address takes connections, but no answer came in the time given."""


def normalize(address: str) -> str:
    """Return ADDRESS as ZeroMQ takes it: ``host:port`` means ``tcp://host:port``; an IPv6
    host is in brackets (``tcp://[::1]:7070``).

    Raises ValueError, naming the address and the forms accepted, for anything else.
    """
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"{address!r} is not a broker address: use {_EXAMPLES} "
                         "or ipc://PATH")
    address = address.strip()
    scheme, sep, rest = address.partition("://")
    if not sep:
        if host_port(f"tcp://{address}") is not None:
            return normalize(f"tcp://{address}")
        if (example := bracketed(address)) is not None:
            raise ValueError(f"{address!r}: {_BRACKETS}: {example}")
        raise ValueError(f"{address!r} is not a broker address: use {_EXAMPLES}, HOST:PORT "
                         "or ipc://PATH")
    if scheme not in _TRANSPORTS:
        raise ValueError(f"{address!r}: unknown transport {scheme!r} (use tcp, ipc or inproc)")
    found = host_port(address) if scheme == "tcp" else None
    if scheme == "tcp" and (example := bracketed(rest.rpartition(";")[2])) is not None:
        raise ValueError(f"{address!r}: {_BRACKETS}: tcp://{example}")
    if scheme == "tcp" and found is None:
        raise ValueError(f"{address!r}: a tcp address needs a host and a port, e.g. "
                         "tcp://127.0.0.1:7070 or tcp://[::1]:7070")
    if found is not None and found[1] > 65535:
        # (libzmq would take the port modulo 65536: 99999 binds or dials 34463)
        raise ValueError(f"{address!r}: port {found[1]} is past 65535")
    if found is not None and f"[{found[0]}]" in rest and _v6_literal(found[0]) is None:
        raise ValueError(f"{address!r}: [{found[0]}] is not an IPv6 address (brackets are "
                         "for those only: tcp://[::1]:7070, tcp://127.0.0.1:7070)")
    if found is not None and (ip := _v6_literal(found[0])) is not None \
            and ip.is_link_local and not ip.scope_id:
        # (on every link at once: libzmq's bind says `Invalid argument`, its connect and
        # the probe here fail as quietly)
        raise ValueError(f"{address!r}: a link-local IPv6 address needs its zone, the "
                         f"interface it is on: e.g. tcp://[{found[0]}%eth0]:{found[1]}")
    if not rest:
        raise ValueError(f"{address!r}: the address after {scheme}:// is empty")
    return address


def _v6_literal(host: str) -> ipaddress.IPv6Address | None:
    ip = literal(host)
    return ip if isinstance(ip, ipaddress.IPv6Address) else None


def bracketed(text: str) -> str | None:
    """TEXT (HOST:PORT) as it is written when it is an IPv6 address with no brackets
    (``::1:7070``: ``[::1]:7070``); None when it is not one."""
    if "[" in text or text.count(":") < 2:
        return None
    host, _, port = text.rpartition(":")
    if port.isdigit() and _v6_literal(host) is not None:
        return f"[{host}]:{port}"
    return f"[{text}]:PORT" if _v6_literal(text) is not None else None


def is_local(address: str) -> bool:
    """Whether a broker bound to ADDRESS is reachable from this machine only (loopback,
    a Unix socket, inproc)."""
    scheme, _, rest = address.partition("://")
    if scheme != "tcp":
        return True
    found = host_port(address)
    return is_loopback(found[0] if found else "")


def is_loopback(host: str) -> bool:
    """Whether HOST is reachable from this machine only."""
    if host == "localhost":
        return True
    ip = literal(unmapped(host))
    return ip is not None and ip.is_loopback  # (a name: it may face a network)


def parse_http_address(text: str) -> tuple[str, int] | None:
    """Return ``--http``'s HOST (an IPv6 one without brackets) and PORT (None for ``off``);
    ValueError naming TEXT if it is neither ``HOST:PORT`` nor ``off``."""
    if text.strip().lower() in ("off", "none", "no", "false", ""):
        return None
    match = _HTTP.fullmatch(text.strip())
    if match is None or int(match.group(2)) > 65535:
        example = bracketed(text.strip().removeprefix("http://").rstrip("/"))
        raise ValueError(f"--http {text!r}: " + (f"{_BRACKETS}: {example}" if example else
                         "give HOST:PORT (e.g. 127.0.0.1:8787, [::1]:8787) or off"))
    return match.group(1).strip("[]") or "0.0.0.0", int(match.group(2))


def _dial(host: str, port: int, timeout: float) -> socket.socket:
    """A plain TCP connection to HOST:PORT over the family a zmq socket dials it over
    (``net``), each address of HOST's in that family tried in turn; OSError if none
    takes it (gaierror: no such host)."""
    family = socket.AF_INET6 if v6(host) else socket.AF_INET
    flags = socket.AI_V4MAPPED if family == socket.AF_INET6 else 0
    error: OSError = OSError(errno.EADDRNOTAVAIL, "no address")
    for *_, where in socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, 0, flags):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(where)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error


def unreachable(address: str, timeout: float = 0.5) -> str | None:
    """Say why nothing accepts connections at ADDRESS ("connection refused"), or None
    when something does or it cannot be told (no answer yet, another transport)."""
    scheme, _, rest = address.partition("://")
    found = host_port(address)
    try:
        if scheme == "tcp":
            if found is None:
                return None
            _dial(*found, timeout).close()
        elif scheme == "ipc":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(rest)
        return None
    except socket.gaierror:
        return f"unknown host {found[0] if found else rest!r}"
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
    found = host_port(address)
    if found is None:
        return None
    try:
        with _dial(*found, timeout) as sock:
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
