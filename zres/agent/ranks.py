"""What an agent gives rank 0 of a multi-node job (its *master*): the address other agents
reach this host at, and a port free here, put in its environment and told to the broker,
which sends the job's other ranks with them (``zres.broker.gangs.ranks``)."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit


def master_address(broker: str) -> str:
    """This host's address as other hosts reach it: the one its route towards BROKER's
    host leaves from (loopback for a broker on loopback, or over ipc)."""
    parts = urlsplit(broker)
    host = parts.hostname or ""
    if parts.scheme in ("ipc", "inproc") or not host:
        return "127.0.0.1"
    try:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.connect((host, 9))  # (no packet is sent: it only picks the route)
            return str(probe.getsockname()[0])
        finally:
            probe.close()
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def free_port() -> int:
    """A TCP port free on every interface of this host now (the master binds it soon
    after; as torchrun's own choice, another process could take it meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def master_env(address: str, port: int) -> dict[str, str]:
    """The variables naming a job's master, in zres's words, torch's and torchrun's."""
    return {"ZRES_MASTER_ADDR": address, "ZRES_MASTER_PORT": str(port),
            "MASTER_ADDR": address, "MASTER_PORT": str(port),
            "PET_MASTER_ADDR": address, "PET_MASTER_PORT": str(port)}
