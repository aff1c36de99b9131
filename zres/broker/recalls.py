"""Grants queued behind a short task that turned out long, asked back from their agents
(pipelining: ``scheduler.stragglers`` says which).

The broker only asks (``recall``); nothing changes here until the agent answers. The agent
gives back, as ``returned`` in a report (the path a draining agent's unstarted grants
take), exactly those it had not begun, and lets the others run: a grant it started as the
request came is reported started, as usual. So a recall crossing a start never runs a task
twice nor loses one, and a returned grant is queued again with no retry spent. A request
lost with a connection, or one that found the grant not yet taken in (its assignment held
back while the agent's lease lapsed), is asked again after ``ASK_AGAIN`` while the grant is
still queued there. Nothing is kept across a broker restart: a restarted broker is given
back every grant that had not begun (``carry``), and takes work it adopts to be long.
"""

from __future__ import annotations

from ..core import protocol as P
from ..logs import get_logger
from ..scheduler.policy import Scheduler
from ..scheduler.records import Grant
from .agents import AgentRegistry
from .outbox import Send

log = get_logger("zres.broker")
ASK_AGAIN = 1.0  # seconds before a grant still queued after its recall is asked again


class Recalls:
    """The queued grants asked back, and when."""

    def __init__(self, send: Send, sched: Scheduler, agents: AgentRegistry) -> None:
        self._send = send
        self._sched = sched
        self._agents = agents
        self._asked: dict[int, tuple[Grant, float]] = {}  # task: (its grant, when asked)
        self._next_look = 0.0

    def tick(self, now: float) -> None:
        """Ask back what is queued behind tasks that turned long by NOW; ask again what
        is still queued ASK_AGAIN after it was asked."""
        for slot_id, ids in self._sched.overdue(now).items():
            self._ask(slot_id, ids, now)
        if not self._asked or now < self._next_look:
            return
        self._next_look = now + ASK_AGAIN
        again: dict[int, list[int]] = {}
        for task_id, (grant, when) in list(self._asked.items()):
            if self._sched.running.get(task_id) is not grant or grant.started:
                del self._asked[task_id]  # given back, started, cancelled, or lost
            elif now - when >= ASK_AGAIN:
                again.setdefault(grant.slot, []).append(task_id)
        for slot_id, ids in again.items():
            self._ask(slot_id, ids, now)

    def _ask(self, slot_id: int, ids: list[int], now: float) -> None:
        agent = self._agents.slot_owner.get(slot_id)
        if agent is None:
            return
        for task_id in ids:
            self._asked[task_id] = (self._sched.running[task_id], now)
        self._send(agent.ident, P.RECALL, {"ids": ids})
        log.info("grants_recalled", agent=agent.name, tasks=len(ids),
                 why="queued behind a task of a short kind that has run long")
