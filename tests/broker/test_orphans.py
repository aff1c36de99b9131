"""Work whose client is gone (issue 27), the broker stepped in this thread with a client and
an agent played by hand: what runs is stopped as a forced cancel stops it and listed,
client gone, until its agent says it is gone; what is detached runs on, listed, and its
owner stops it by id; a client whose connection closed has a grace to come back."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.broker.test_agent_link import Peer, report
from zres.broker.server import Broker
from zres.core import protocol as P
from zres.core.resources import UNIT

pytestmark = pytest.mark.timeout(30)
CANCELLED = {"type": "CancelledError", "message": "stopped by a forced cancel"}


def register(agent: Peer, session: int) -> None:
    agent.send(P.REGISTER, {"name": "node", "session": session, "host": "h", "pid": 1,
                            "t": time.monotonic(), "jobs": [], "ended": [],
                            "slots": [{"units": {"CPU": 3 * UNIT, "foo": 3 * UNIT},
                                       "gpus": []}]})
    agent.take(P.WELCOME)


def client_of(broker: Broker, ident: bytes = b"client-1") -> Peer:
    client = Peer(broker, ident=ident)
    client.send(P.HELLO, {"client": "c"})
    client.take(P.WELCOME)
    return client


def submit(client: Peer, *tasks: tuple[Any, ...]) -> None:
    """Submit a foo=1 task per (local id, extra[, the local ids of its inputs])."""
    client.send(P.SUBMIT, {"tasks": [[local, {"foo": UNIT}, 0, 0, list(deps), 2, f"t{local}",
                                      False, extra] for local, extra, *deps in tasks]},
                [f for _ in tasks for f in (b"fn", b"args")])


def started(agent: Peer, session: int, count: int) -> list[int]:
    """Take COUNT grants and say they all began; return their ids."""
    granted: list[int] = []
    while len(granted) < count:
        granted += [t[0] for t in agent.take(P.ASSIGN).body["tasks"]]
    report(agent, 1, session, held=granted, started=granted)
    agent.sync()
    return granted


def cancels(agent: Peer) -> list[tuple[list[int], bool]]:
    """The cancels the broker has sent AGENT up to now: (ids, forced)."""
    return [(m.body["ids"], m.body.get("force") is True) for m in agent.sync()
            if m.kind == P.CANCEL]


def test_a_gone_clients_tasks_are_stopped_and_its_detached_one_runs_on():
    broker = Broker("tcp://127.0.0.1:0", prefetch=0)
    agent, client, owner = Peer(broker), client_of(broker), Peer(broker)
    try:
        register(agent, session=1)
        submit(client, (1, {}), (2, {}), (3, {"detached": True}))
        # The client learns the ids its tasks have here (what its futures show).
        assert client.take(P.ACCEPTED).body["ids"] == [[1, 1, 3]]
        first, second, detached = started(agent, 1, 3)
        # A detached task waiting for one that is not: what it needs runs on with it.
        submit(client, (4, {}), (5, {"detached": True}, 4))
        assert client.take(P.ACCEPTED).body["ids"] == [[4, 4, 2]]
        client.send(P.BYE, {})
        client.step()
        # Stopped where they run, as a forced cancel stops them: still running (holding
        # their resources) until the agent says they are gone, listed as such.
        assert sorted(cancels(agent)) == [([first], True), ([second], True)]
        status = broker.status()
        assert status["counts"] == {"running": 3, "queued": 1, "waiting": 1}
        assert [(t["id"], t["client_gone"], t["stopping"], t["detached"])
                for t in status["running"]] == [(first, True, True, False),
                                                 (second, True, True, False),
                                                 (detached, True, False, True)]
        assert status["running_by_owner"] == [{"owner": "", "client_gone": True, "count": 3}]
        report(agent, 2, 1, results=[[first, P.FAILED, 0, CANCELLED],
                                     [second, P.FAILED, 0, CANCELLED]])
        agent.sync()
        status = broker.status()
        # (ended, and nobody holds them; what the tokens freed runs)
        assert status["counts"] == {"running": 2, "waiting": 1}
        assert broker.graph.finished == {"finished": 0, "error": 0, "cancelled": 2}
        assert status["agents"][0]["slots"][0]["free"]["foo"] == UNIT
        # The detached one runs on until its owner stops it by id, from anywhere.
        owner.send(P.TASK_CANCEL, {"task": detached, "req": 7})
        reply = owner.take(P.TASK_CANCEL_REPLY).body
        assert reply == {"req": 7, "name": "t3", "state": "stopping"}
        assert cancels(agent) == [([detached], True)]
        owner.send(P.TASK_CANCEL, {"task": 99, "req": 8})
        assert owner.take(P.TASK_CANCEL_REPLY).body["error"].startswith("no task 99")
    finally:
        for peer in (agent, client, owner):
            peer.close()
        broker.close()


def test_a_client_whose_connection_closed_has_a_grace_to_come_back():
    broker = Broker("tcp://127.0.0.1:0", prefetch=0, client_grace=10.0)
    agent, client = Peer(broker), client_of(broker)
    try:
        register(agent, session=1)
        submit(client, (1, {}))
        [task] = started(agent, 1, 1)
        client.close()  # (a killed process: its connection closes, nothing said)
        record = broker.clients.get(b"client-1")
        while record is None or not record.away:
            agent.step()
            record = broker.clients.get(b"client-1")
        # It reconnects within the grace (a network blip): its work is untouched, however
        # long after it the grace would have ended (within its silence timeout, 30 s).
        client = client_of(broker)
        broker.clients.expire(time.monotonic() + 20)
        assert cancels(agent) == [] and broker.status()["counts"] == {"running": 1}
        # Its connection closes again, and it stays away past the grace: gone.
        client.close()
        while not broker.clients.get(b"client-1").away:  # type: ignore[union-attr]
            agent.step()
        broker.clients.expire(time.monotonic() + 11)
        assert broker.clients.get(b"client-1") is None
        assert cancels(agent) == [([task], True)]
    finally:
        for peer in (agent, client):
            peer.close()
        broker.close()
