"""What an agent gives rank 0 of a multi-node job (its *master*): the address other agents
reach this host at, and a port free here, put in its environment and told to the broker,
which sends the job's other ranks with them (``zres.broker.gangs.ranks``)."""

from __future__ import annotations

import socket

from ..core import net


def master_address(broker: str) -> str:
    """This host's address as other hosts reach it: the one its route towards BROKER's
    host leaves from (loopback for a broker on loopback, or over ipc), bare: an IPv6 one
    without brackets, as torch's MASTER_ADDR takes it."""
    return net.towards(broker)


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port free on every interface of this host now, of ADDRESS's IP family (an
    IPv6 one: of both; the master binds it soon after; as torchrun's own choice, another
    process could take it meanwhile)."""
    if ":" in address:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", 0))
            return int(sock.getsockname()[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def master_env(address: str, port: int) -> dict[str, str]:
    """The variables naming a job's master, in zres's words, torch's and torchrun's."""
    return {"ZRES_MASTER_ADDR": address, "ZRES_MASTER_PORT": str(port),
            "MASTER_ADDR": address, "MASTER_PORT": str(port),
            "PET_MASTER_ADDR": address, "PET_MASTER_PORT": str(port)}
