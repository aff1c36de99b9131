"""Heartbeats at the broker: agents' beats answered, silent agents and clients found, the
loop's own stalls forgiven.

An agent beats on its connection every interval (and from its heartbeat thread while those
go unechoed: ``agent_link.on_side_beat``); each beat is answered once the turn it came in
has kept what came with it: the lease's echo and the reports kept acknowledged. Nothing here
walks every agent per beat or per turn: a broker has thousands. An agent is silent when
nothing came from it for the timeout before the last moment the loop had read everything
that had arrived (``drained_at``): beats waiting unread behind a long turn or a flood of
reports are not silence.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..core import protocol as P
from ..logs import get_logger
from .agent_link import AgentLink
from .agents import AgentRegistry
from .clients import ClientRegistry
from .dispatch import Dispatcher
from .outbox import Send

log = get_logger("zres.broker")


class Heartbeats:
    """Beats in and out. SEND: the broker's send; RAW(ident, frames): one message sent as
    encoded (the clients' beats, the same frames for every client)."""

    def __init__(self, send: Send, raw: Callable[[bytes, list[Any]], None],
                 agents: AgentRegistry, clients: ClientRegistry, link: AgentLink,
                 dispatch: Dispatcher, epoch: int, interval: float) -> None:
        self._send = send
        self._raw = raw
        self._agents = agents
        self._clients = clients
        self._link = link
        self._dispatch = dispatch
        self._epoch = epoch
        self._interval = interval
        # When the socket last had nothing left to read: what any agent sent before then
        # has been read, so its silence is judged as of then.
        self.drained_at = time.monotonic()
        self._beats: dict[bytes, None] = {}  # agents whose beats came this turn

    def stalled(self, seconds: float) -> None:
        """The loop did not listen for SECONDS (stopped, or held by one turn): if that is
        long, nobody is to be found silent for it."""
        if seconds > max(2 * self._interval, 1.0):
            self._agents.forgive(seconds)
            self._clients.forgive(seconds)
            log.warning("broker_stalled", seconds=round(seconds, 1))

    def on_heartbeat(self, ident: bytes, msg: P.Message, now: float) -> None:
        agent = self._link.agent(ident, now, quiet=True)
        if agent is not None:
            sent = msg.body.get("t")
            if isinstance(sent, float):
                agent.echo = sent
            self._link.beat(agent, msg.body)  # (what its store holds, its memory: for status)
            self._beats[ident] = None
        elif msg.body.get("side") is True:  # an agent's heartbeat thread
            self._link.on_side_beat(ident, msg, now)
        elif self._clients.seen(ident, now) is None:
            self._send(ident, P.UNKNOWN,
                       self._link.unknown_body(ident, msg.body.get("session")))

    def answer(self) -> None:
        """Answer the agents' beats of this turn (after its commit): the lease's echo, and
        every report kept so far acknowledged. One message each, as they come: never one
        to every agent in one turn."""
        if not self._beats:
            return
        beats, self._beats = self._beats, {}
        for ident in beats:
            agent = self._agents.get(ident)
            if agent is not None:
                agent.acked = agent.kept
                self._send(ident, P.HEARTBEAT, {"epoch": self._epoch, "echo": agent.echo,
                                                "ack": agent.kept})

    def tick(self, now: float) -> None:
        """Every interval: lose the silent agents, drop the silent clients, beat to the
        clients."""
        # Silent as of when everything sent had been read: a loop behind its messages (long
        # turns, a flood of reports) loses nobody whose heartbeats wait unread.
        heard_all = min(now, self.drained_at)
        for agent in self._agents.silent(heard_all):
            self._dispatch.lose_agent(agent, f"silent for {heard_all - agent.last_seen:.1f}s",
                                      recheck=False)  # (see Broker.settle)
        self._clients.expire(now)
        beat = P.encode(P.HEARTBEAT, {"epoch": self._epoch})
        for ident in self._clients.idents(present=True):
            self._raw(ident, beat)
