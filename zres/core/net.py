"""IPv4 and IPv6: which family a zmq socket reaches an address over, host and port spelled
for either, and this host's address as another host reaches it.

libzmq's sockets speak IPv4 only unless told (``zmq.IPV6``). Told, they resolve a host
name to its IPv6 addresses first (``getaddrinfo`` for ``AF_INET6``, IPv4 ones mapped only
when there is none), and dial the first: a name with both (``localhost``, where /etc/hosts
gives it ``::1`` too, as most Linux systems do) is then dialled at ``::1`` while its
broker listens on 127.0.0.1, for ever. So every zmq socket of zres that may use TCP binds
and connects through ``bind`` and ``connect`` here, which tell it per address: IPv6 for an
IPv6 literal (``tcp://[::1]:7070``), for ``*`` (every address of both families: libzmq
binds ``::`` with IPv4 mapped, or ``0.0.0.0`` where the kernel has no IPv6) and for a
name with IPv6 addresses only (or none yet: DNS may come later, and IPv4 ones are still
reached, mapped); IPv4, as ever, for an IPv4 literal, a name with an IPv4 address, and an
interface's name.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
from typing import Any

import zmq

# tcp://HOST:PORT's last HOST:PORT (zmq's "tcp://SOURCE;HOST:PORT" too): [IPv6] or another
_HOST_PORT = re.compile(r"\[([^\s/\[\]]+)\]:(\d+)|([^\s/:\[\]]+):(\d+)")
_WILDCARDS = ("*", "0.0.0.0", "::", "")


def host_port(address: str) -> tuple[str, int] | None:
    """The host (an IPv6 one without its brackets) and port of a ``tcp://`` ADDRESS; None
    for another transport or no ``HOST:PORT``."""
    scheme, _, rest = address.partition("://")
    match = _HOST_PORT.fullmatch(rest.rpartition(";")[2]) if scheme == "tcp" else None
    if match is None:
        return None
    return (match[1], int(match[2])) if match[1] is not None else (match[3], int(match[4]))


def literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """HOST as an IP address (an IPv6 one may name its zone: ``fe80::1%eth0``); None for
    a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def v6(host: str) -> bool:
    """Whether a socket reaches (or binds) HOST (bare: no brackets) over IPv6, as the
    module's docstring says."""
    if host == "*":
        return True
    ip = literal(host)
    if ip is not None:
        return ip.version == 6
    try:
        socket.if_nametoindex(host)
        return False  # (an interface's name: its IPv4 address, as before)
    except (OSError, ValueError):
        pass
    try:
        found = {info[0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except (OSError, ValueError):  # (no such name, yet)
        return True
    return socket.AF_INET not in found


def ipv6(address: str) -> bool:
    """Whether a zmq socket reaches (or binds) ADDRESS over IPv6 (not TCP: no)."""
    found = host_port(address)
    return found is not None and v6(found[0])


def connect(sock: zmq.Socket[Any], address: str) -> None:
    """Connect SOCK to ADDRESS over the IP family that reaches it."""
    sock.setsockopt(zmq.IPV6, int(ipv6(address)))
    sock.connect(address)


def bind(sock: zmq.Socket[Any], address: str) -> str:
    """Bind SOCK to ADDRESS, over IPv6 for an IPv6 address or ``*`` (both families);
    return the endpoint bound (a port 0 replaced by the one picked)."""
    sock.setsockopt(zmq.IPV6, int(ipv6(address)))
    sock.bind(address)
    return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))


def spelled(host: str, port: int | str) -> str:
    """HOST:PORT, an IPv6 HOST in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def unmapped(host: str) -> str:
    """HOST, an IPv4 address if it is one mapped into IPv6 (``::ffff:10.0.0.5``: a peer
    of a socket bound to every address of both families, over IPv4)."""
    ip = literal(host)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped) if mapped is not None else host


def towards(address: str) -> str:
    """This host's address (bare: no brackets) as the host of ADDRESS (a zmq address)
    reaches it: the one the route there leaves from, of the family a socket dials ADDRESS
    over (loopback for a host on loopback; 127.0.0.1 for ipc or a wildcard). A link-local
    IPv6 one names its zone (``fe80::5%eth0``): without it, it cannot be dialled."""
    found = host_port(address)
    if found is None or found[0] in _WILDCARDS:
        return "127.0.0.1"
    host = found[0]
    families = (socket.AF_INET6, socket.AF_INET) if v6(host) else (socket.AF_INET,
                                                                      socket.AF_INET6)
    for family in families:
        try:
            target = socket.getaddrinfo(host, 9, family, socket.SOCK_DGRAM)[0][4]
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect(target)  # (no packet is sent: it only picks the route)
                mine = probe.getsockname()
            return _zoned(str(mine[0]), mine[3] if len(mine) > 3 else 0)
        except (OSError, ValueError, IndexError):
            continue
    try:  # (no route there: the address this host's name has)
        named = socket.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM)
        return str(named[0][4][0])
    except (OSError, ValueError, IndexError):
        return "127.0.0.1"


def _zoned(host: str, scope: int) -> str:
    """HOST with its zone (the interface SCOPE names; 0: none), as zmq and Python take it."""
    if not scope or "%" in host:
        return host
    try:
        return f"{host}%{socket.if_indextoname(scope)}"
    except OSError:
        return f"{host}%{scope}"


def monitor_event(monitor: zmq.Socket[Any]) -> tuple[int, int]:
    """Read one event from MONITOR (a socket's ``get_monitor_socket``): (event, value).

    libzmq's format: a frame of a 16-bit event and a 32-bit value, then one naming the
    endpoint. Read here rather than with pyzmq's ``recv_monitor_message``, whose module
    imports ``zmq.asyncio`` and with it asyncio: 45 ms of the start of every zres command
    and worker process, which read a monitor on every connection and run no event loop."""
    frames = monitor.recv_multipart()
    event, value = struct.unpack("=hi", frames[0])
    return event, value
