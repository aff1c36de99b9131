"""Where the results kept on agents are: the broker's directory of objects (issue 29).

A result over ``INLINE`` bytes stays on the agent that made it (``zres.agent.data``); the
broker records only which agents hold a copy (``Task.held_at``: the maker first, then those
that fetched it as an input) and its size, never its bytes. From that it makes references
(``zres.core.transfer.Ref``): for an assign, whose worker reads the input in place or
fetches it, and for the client, which fetches its result straight from a holder. Tokens
are MACs under the cluster's data secret, which agents know and clients never see: a
client gets a token only with a result of its own.

When nobody holds a task any more, its copies are freed on their agents (one ``free`` a
turn per agent). When an agent is lost, its copies go with it: a result with none left is
lost (see ``dispatch``, which runs its task again or fails what needs it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..core import protocol as P
from ..core import transfer as T
from ..core.tasks import Task
from .agents import AgentRegistry
from .outbox import Send
from .store import Store


class ObjectDirectory:
    """The broker's record of the objects agents hold, over AGENTS (their data ports),
    with the cluster's data SECRET."""

    def __init__(self, send: Send, agents: AgentRegistry, secret: bytes,
                 get: Callable[[int], Task | None],
                 finish: Callable[[Task, str, list[Any], dict[str, Any]], None]
                 = lambda task, outcome, frames, info: None,
                 fail: Callable[[Task, str, str], None] = lambda task, error, why: None,
                 limit: int = 64 << 30) -> None:
        self._send = send
        self._agents = agents
        self.secret = secret
        self._get = get
        self._finish, self._fail = finish, fail  # (the task graph's)
        self._puts: dict[int, tuple[str, int]] = {}  # put task -> agent, size it awaits
        self.by_agent: dict[str, set[int]] = {}   # agent name -> tasks it holds a copy of
        self._to_free: dict[str, list[int]] = {}
        self.relay: tuple[str, str] | None = None   # the broker's relay: endpoint, key
        # After a restart: agents that held restored results and have not come back yet.
        self._unconfirmed: set[str] = set()
        self._since: float | None = None
        self.limit = limit  # bytes an object may have (the broker's max_object_bytes)

    # -- where copies are ---------------------------------------------------------------
    def kept(self, task: Task, agent: str, outcome: str, info: dict[str, Any]) -> str | None:
        """TASK ended with OUTCOME on AGENT, which says in INFO (``stored``, taken out) that
        it kept the result: recorded there (see ``stored``); return why not, or None."""
        size = info.pop("stored", None)
        if outcome != P.OK or type(size) is not int or size <= 0:
            return None
        return self.stored(task, agent, size)

    def stored(self, task: Task, agent: str, size: int) -> str | None:
        """TASK's result (SIZE bytes) was made on AGENT and stays there; or, over the
        limit, it is freed there: return why (its task fails saying so)."""
        if size > self.limit:
            self._to_free.setdefault(agent, []).append(task.id)
            return (f"the result of task {task.name} has {size} bytes, more than the "
                    f"broker's limit of {self.limit} (max_object_bytes)")
        task.size, task.held_at = size, [agent]
        self.by_agent.setdefault(agent, set()).add(task.id)
        pending = self._to_free.get(agent)
        if pending and task.id in pending:  # (offered on its return, its end read after)
            pending.remove(task.id)
        return None

    def place(self, task: Task, size: int) -> T.Holder | None:
        """Choose where a value of SIZE bytes a client puts goes (TASK stands for it until
        it is there): the connected agent with the most room in its store (None: none)."""
        best = None
        for agent in self._agents.by_ident.values():
            if agent.data_address and not agent.draining and not agent.away:
                store = agent.store or {}
                room = store.get("budget", 0) - store.get("memory", 0)
                if best is None or (room, agent.name) > best[0]:
                    best = ((room, agent.name), agent)
        if best is None:
            return None
        agent = best[1]
        self._puts[task.id] = (agent.name, size)
        task.agent = agent.name
        return T.Holder(agent.name, agent.data_address, agent.data_key)

    def putting(self, task: Task, agent: str, size: int) -> None:
        """TASK, restored from the state store, stands for a value of SIZE bytes its client
        was putting on AGENT: done once AGENT has it (offered on its return, or said when
        the upload ends), failed if AGENT is not back within the grace period."""
        self._puts[task.id] = (agent, size)
        task.agent = agent
        self._unconfirmed.add(agent)

    def put_token(self, task: Task, size: int) -> bytes:
        return T.token(self.secret, "put", task.id, size)

    def copied(self, task_id: int, agent: str) -> None:
        """AGENT holds a copy of TASK_ID's result too (an input it fetched, or a value put
        there: then the put is done)."""
        awaited = self._puts.get(task_id)
        task = self._get(task_id)
        if awaited is not None and awaited[0] == agent and task is not None:
            del self._puts[task_id]
            self.stored(task, agent, awaited[1])
            self._finish(task, P.OK, [], {"agent": agent})
            return
        if task is None or not task.size or task.result:
            self._to_free.setdefault(agent, []).append(task_id)  # (needed by nobody now)
            return
        if agent not in task.held_at:
            task.held_at = [*task.held_at, agent]
            self.by_agent.setdefault(agent, set()).add(task.id)

    def dropped(self, task: Task) -> None:
        """Nobody holds TASK any more: its copies are freed where they are (a value still
        being put is too, if its upload ends after all)."""
        self._puts.pop(task.id, None)
        for agent in task.held_at:
            self._to_free.setdefault(agent, []).append(task.id)
            held = self.by_agent.get(agent)
            if held is not None:
                held.discard(task.id)
        task.held_at = ()

    def lost(self, agent: str) -> list[Task]:
        """AGENT is gone, and its copies with it; return the tasks left with none (values
        being put there fail: their clients put them again elsewhere)."""
        self._to_free.pop(agent, None)
        for task_id, (where, _) in list(self._puts.items()):
            task = self._get(task_id)
            if where == agent:
                del self._puts[task_id]
                if task is not None:
                    self._fail(task, "ZresError", f"agent {agent}, which it was being "
                               "put on, was lost")
        gone = []
        for task_id in self.by_agent.pop(agent, ()):
            task = self._get(task_id)
            if task is None or agent not in task.held_at:
                continue
            task.held_at = [a for a in task.held_at if a != agent]
            if not task.held_at:
                gone.append(task)
        return sorted(gone, key=lambda t: t.id)

    def offered(self, agent: str, objects: Any) -> list[Task]:
        """AGENT's new session offers the objects it holds (after a restart of the broker,
        which restored where they were): those it no longer has are lost there; return the
        tasks left with no copy."""
        self._unconfirmed.discard(agent)
        have = {o[0] for o in objects if isinstance(o, list) and o and type(o[0]) is int} \
            if isinstance(objects, list) else set()
        gone = []
        for task_id in list(self.by_agent.get(agent, ())):
            if task_id in have:
                continue
            self.by_agent[agent].discard(task_id)
            task = self._get(task_id)
            if task is not None and agent in task.held_at:
                task.held_at = [a for a in task.held_at if a != agent]
                if not task.held_at:
                    gone.append(task)
        for task_id in have - self.by_agent.get(agent, set()):
            if self._puts.get(task_id, ("",))[0] == agent:
                self.copied(task_id, agent)  # (a put whose upload ended meanwhile: done)
            else:
                self._to_free.setdefault(agent, []).append(task_id)  # (nobody's any more)
        return gone

    def restored(self, task: Task) -> None:
        """TASK, restored from the state store, is held where it says, if those agents
        come back with it (``offered``) within the grace period (``expire``)."""
        for agent in task.held_at:
            self.by_agent.setdefault(agent, set()).add(task.id)
            self._unconfirmed.add(agent)

    def expire(self, now: float, grace: float) -> list[tuple[str, list[Task]]]:
        """The agents that held restored results and did not come back within GRACE
        seconds of the first call: each with the tasks left with no copy."""
        if not self._unconfirmed:
            return []
        if self._since is None:
            self._since = now
            return []
        if now - self._since < grace:
            return []
        late, self._unconfirmed = self._unconfirmed, set()
        return [(agent, self.lost(agent)) for agent in sorted(late)]

    def near(self, task: Task) -> tuple[str, ...]:
        """The agents holding the most bytes of TASK's inputs kept on agents, most first
        (at most three: where the scheduler tries it first)."""
        held: dict[str, int] = {}
        for dep_id in task.deps:
            dep = self._get(dep_id)
            if dep is not None and dep.size:
                for agent in dep.held_at:
                    held[agent] = held.get(agent, 0) + dep.size
        return tuple(sorted(held, key=lambda a: (-held[a], a))[:3])

    # -- references ---------------------------------------------------------------------
    def ref(self, task: Task) -> list[Any] | None:
        """A reference to TASK's result, its connected holders first (None: none is
        connected)."""
        holders = []
        for name in task.held_at:
            agent = self._agents.by_name.get(name)
            if agent is not None and agent.data_address:
                holders.append(T.Holder(name, agent.data_address, agent.data_key))
        if not holders:
            return None
        return T.Ref(task.id, task.size, T.token(self.secret, "get", task.id),
                     tuple(holders), self.relay).wire()

    def relay_field(self) -> dict[str, Any]:
        """What a welcome says of the relay: its endpoint and key (a wildcard host: the
        host the peer reaches the broker at), if there is one."""
        return {"relay": list(self.relay)} if self.relay is not None else {}

    def flush(self) -> None:
        """Send each agent the objects to free that this turn found."""
        for agent, ids in self._to_free.items():
            record = self._agents.by_name.get(agent)
            if record is not None:
                self._send(record.ident, P.FREE, {"ids": ids})
        self._to_free.clear()


def data_secret(store: Store | None) -> bytes:
    """The cluster's data secret, which tokens for its results are made with: kept in
    STORE, the broker's state, so that tokens outlive its restarts (None: a new one)."""
    secret = store.meta("data_secret") if store else None
    if not isinstance(secret, bytes):
        secret = os.urandom(32)
        if store is not None:
            store.set_meta("data_secret", secret)
    return secret
