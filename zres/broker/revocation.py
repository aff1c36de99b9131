"""Keys revoked while the broker runs: the sessions of keys no longer in the keys
directory end (``Gate.refresh`` notices within a heartbeat)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core import protocol as P
from .agents import AgentRegistry
from .auth import Gate
from .clients import ClientRegistry


def revoke(gate: Gate, clients: ClientRegistry, agents: AgentRegistry, send: Callable[..., None],
           lose: Callable[[Any, str], None]) -> None:
    """End the sessions of keys no longer in GATE's keys directory: clients are dropped
    (their work as if they had left), agents lost (LOSE(agent, why)); each is told why."""
    for client in clients.all():
        if client.public and not gate.current(client.public):
            why = f"its key {client.key} was revoked (removed from the broker's keys)"
            send(client.ident, P.REFUSED, {"kind": P.HELLO, "error": why}, hold=False)
            clients.leave(client.ident, "client_revoked")
    for agent in list(agents.by_ident.values()):
        if agent.public and not gate.current(agent.public):
            why = f"its key {agent.key} was revoked (removed from the broker's keys)"
            send(agent.ident, P.UNKNOWN, {"refused": why})
            lose(agent, why)
