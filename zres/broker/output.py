"""Passing what tasks print on to the clients that own them.

An agent sends its tasks' output (``output``) as its workers wrote it, before it reports
their results; the broker sends it on at once to each task's client, so a client always
has a task's output before its result. Output is plain bytes, never unpickled, kept or
sent again: what arrives for a task the broker no longer knows, from an agent's old
session, or for a client that has gone or asked for none (``hello{output: false}``),
is dropped.

Each client is sent at most ``RATE`` bytes of output a second (``BURST`` at once; each
task's worker already keeps to its own share): the broker queues what it sends without a
bound, and a client that stops reading must not make it hold gigabytes. What goes over is
dropped, and the client told ``[zres: N bytes of output dropped]`` in its place.
"""

from __future__ import annotations

from typing import Any

from ..core import protocol as P
from ..core.errors import ProtocolError
from ..core.limits import quote
from .agents import AgentRegistry
from .clients import ClientRegistry
from .graph import TaskGraph
from .outbox import Send

RATE = 8 * 1024 * 1024   # bytes of output a second to one client ...
BURST = 8 * 1024 * 1024  # ... and at once


class OutputRouter:
    """Send the lines agents report to the clients whose tasks printed them."""

    def __init__(self, send: Send, agents: AgentRegistry, graph: TaskGraph,
                 clients: ClientRegistry) -> None:
        self._send = send
        self._agents = agents
        self._graph = graph
        self._clients = clients

    def on_output(self, ident: bytes, msg: P.Message, now: float) -> None:
        agent = self._agents.by_ident.get(ident)
        if agent is None or msg.body.get("session") != agent.session:
            return  # an old session's: its tasks are someone else's now, or gone
        items = P.field(msg, "items", list)
        out: dict[bytes, list[list[Any]]] = {}
        dropped: dict[tuple[bytes, int, int], list[Any]] = {}  # its note, per task and stream
        for item in items:
            if not (isinstance(item, list) and len(item) == 3 and type(item[0]) is int
                    and item[1] in (1, 2) and isinstance(item[2], bytes)):
                raise ProtocolError(f"output: an item is not [task id, 1 or 2, bytes]: "
                                    f"{quote(item, 80)}")
            task = self._graph.get(item[0])
            if task is None or task.agent != agent.name:
                continue  # (only the agent it was given to speaks for a task)
            client = self._clients.get(task.client)
            if client is None or not client.output or client.ids.get(task.local_id) != task.id:
                continue
            lines = out.setdefault(client.ident, [])
            allowance, since = client.output_allowance
            allowance = min(BURST, allowance + (now - since) * RATE)
            if len(item[2]) <= allowance:
                client.output_allowance = (allowance - len(item[2]), now)
                lines.append([task.local_id, task.name, agent.name, item[1], item[2]])
                continue
            client.output_allowance = (allowance, now)
            key = (client.ident, task.id, item[1])
            if key not in dropped:
                dropped[key] = [task.local_id, task.name, agent.name, item[1], 0]
                lines.append(dropped[key])
            dropped[key][4] += len(item[2])
        for note in dropped.values():
            note[4] = f"[zres: {note[4]} bytes of output dropped]\n".encode()
        for client_ident, lines in out.items():
            if lines:
                self._send(client_ident, P.OUTPUT, {"items": lines})
