"""The broker stepped in this thread, with an agent and a client played by hand over real
sockets: what it makes of reports that arrive out of order, of resumptions that cross its
grants, and of messages from sessions it has ended."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from zres.broker.server import Broker
from zres.core import protocol as P
from zres.core.resources import UNIT

pytestmark = pytest.mark.timeout(30)


class Peer:
    """One DEALER socket talking to BROKER, which it steps while it waits."""

    _reqs = itertools.count(1)

    def __init__(self, broker: Broker, ident: bytes | None = None) -> None:
        self.broker = broker
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if ident is not None:  # a client keeps its routing id across reconnections
            self.sock.setsockopt(zmq.ROUTING_ID, ident)
        self.sock.connect(broker.address)
        self.inbox: list[P.Message] = []

    def send(self, kind: str, body: dict[str, Any], frames: list[bytes] = ()) -> None:  # type: ignore[assignment]
        P.send(self.sock, P.encode(kind, body, frames))

    def step(self) -> None:
        self.broker.poll_once(time.monotonic(), timeout=0.005)
        while self.sock.poll(0):
            self.inbox.append(P.decode(self.sock.recv_multipart()))

    def take(self, kind: str) -> P.Message:
        """The first message of KIND received (stepping until one comes)."""
        deadline = time.monotonic() + 10
        while True:
            for index, msg in enumerate(self.inbox):
                if msg.kind == kind:
                    return self.inbox.pop(index)
            assert time.monotonic() < deadline, f"no {kind} came"
            self.step()

    def sync(self) -> list[P.Message]:
        """Everything the broker has sent us up to now; returns and clears the inbox.

        A status request's reply comes after it on this connection, but is sent as the
        request is read, and what the same turn decided (results, grants) only at the
        turn's end: a second request, read in a later turn, is answered after those."""
        for _ in range(2):
            req = next(self._reqs)
            self.send(P.STATUS, {"req": req})
            while not any(m.kind == P.STATUS_REPLY and m.body.get("req") == req
                          for m in self.inbox):
                self.step()
        got = [m for m in self.inbox if m.kind != P.STATUS_REPLY]
        self.inbox = []
        return got

    def close(self) -> None:
        self.sock.close(0)


@pytest.fixture
def broker() -> Iterator[Broker]:
    broker = Broker("tcp://127.0.0.1:0", prefetch=0)
    yield broker
    broker.close()


def register(agent: Peer, session: int, cpus: int = 2, resume: bool = False) -> P.Message:
    body: dict[str, Any] = {"name": "node", "session": session, "host": "h", "pid": 1,
                            "t": time.monotonic(),
                            "slots": [{"units": {"CPU": cpus * UNIT}, "gpus": []}]}
    if resume:
        body["resume"] = True
    agent.send(P.REGISTER, body)
    return agent.take(P.WELCOME)


def submit(client: Peer, *locals_: int) -> None:
    client.send(P.SUBMIT, {"tasks": [[n, {"CPU": UNIT}, 0, 0, [], 2, f"t{n}", False]
                                     for n in locals_]},
                [f for _ in locals_ for f in (b"fn", b"args")])


def connected(broker: Broker) -> tuple[Peer, Peer]:
    agent, client = Peer(broker), Peer(broker)
    client.send(P.HELLO, {"client": "c"})
    client.take(P.WELCOME)
    return agent, client


def report(agent: Peer, seq: int, session: int, frames: list[bytes] = (),  # type: ignore[assignment]
           **fields: Any) -> None:
    agent.send(P.REPORT, {"seq": seq, "session": session, **fields}, frames)


def test_a_report_after_a_gap_waits_for_the_one_before_it(broker: Broker):
    """Report 2 was lost with a connection, report 3 came first: 3 must not be taken in
    ahead of 2, or 2 (sent again) is skipped as seen and its results are lost."""
    agent, client = connected(broker)
    try:
        register(agent, session=5)
        submit(client, 1, 2)
        granted = [t[0] for t in agent.take(P.ASSIGN).body["tasks"]]
        assert len(granted) == 2
        first, second = granted
        report(agent, 1, 5, held=granted, started=granted)
        report(agent, 3, 5, [b"r2"], results=[[second, P.OK, 1, {}]])
        report(agent, 2, 5, [b"r1"], results=[[first, P.OK, 1, {}]])
        report(agent, 3, 5, [b"r2"], results=[[second, P.OK, 1, {}]])  # sent again
        outcomes: dict[int, str] = {}
        while len(outcomes) < 2:
            outcomes.update((r[0], r[1]) for r in client.take(P.RESULTS).body["results"])
        assert outcomes == {1: P.OK, 2: P.OK}, f"a result was lost: {outcomes}"
    finally:
        agent.close()
        client.close()


def test_a_grant_sent_after_a_resumption_is_not_taken_for_one_lost_before_it(broker: Broker):
    """The agent's HOLDING is built before grants the broker sent after its welcome
    reach it: those must not go again (they would run twice)."""
    agent, client = connected(broker)
    try:
        register(agent, session=5, cpus=1)
        submit(client, 1, 2)
        (first,) = [t[0] for t in agent.take(P.ASSIGN).body["tasks"]]
        report(agent, 1, 5, held=[first], started=[first])
        welcome = register(agent, session=5, cpus=1, resume=True)
        report(agent, 2, 5, [b"r1"], results=[[first, P.OK, 1, {}]])
        second = agent.take(P.ASSIGN).body["tasks"][0][0]  # room freed: granted at once
        agent.send(P.HOLDING, {"session": 5, "tasks": [], "resumed": welcome.body["resumed"]})
        later = agent.sync() + agent.sync()
        again = [t[0] for m in later if m.kind == P.ASSIGN for t in m.body["tasks"]]
        assert second not in again, "the grant was sent twice: it would run twice"
        assert broker.graph.tasks[second].attempt == 1
    finally:
        agent.close()
        client.close()


def test_news_for_an_ended_session_names_that_session(broker: Broker):
    """An agent that began a new session must be able to tell that an 'ended' answer is
    about its old one, or it stops the new one too."""
    agent, client = connected(broker)
    try:
        register(agent, session=5)
        register(agent, session=6)  # a new session of the same agent
        agent.sync()                # (what was said of session 5 as it ended)
        report(agent, 1, 5)         # in flight from the old one
        unknown = agent.take(P.UNKNOWN)
        assert unknown.body.get("ended") and unknown.body.get("session") == 5
    finally:
        agent.close()
        client.close()


def test_a_submit_refused_records_none_of_its_tasks(broker: Broker):
    agent, client = connected(broker)
    spec = {"id": "same", "name": "", "cls": "A", "methods": [], "restarts": 0,
            "concurrency": 1}
    try:
        client.send(P.SUBMIT, {"tasks": [
            [1, {"CPU": UNIT}, 0, 0, [], 2, "plain", False],
            [2, {}, 0, 0, [], 2, "a", False, {"actor": spec}],
            [3, {}, 0, 0, [], 2, "b", False, {"actor": spec}]]}, [b"f", b"a"] * 3)
        refused = client.take(P.REFUSED)
        assert refused.body["ids"] == [1, 2, 3] and "already in use" in refused.body["error"]
        assert broker.graph.tasks == {}, "a refused submit left tasks running"
    finally:
        agent.close()
        client.close()


def test_a_direct_grant_counts_as_begun_when_its_agent_is_lost(broker: Broker):
    """Its agent hands it to a worker the moment it arrives, asking nothing: lost with its
    agent, it may have begun (as Ray counts a task leased to a dead node), so with no
    retries it fails, saying so."""
    agent, client = connected(broker)
    try:
        register(agent, session=5)
        submit(client, 1)
        agent.take(P.ASSIGN)
        register(agent, session=6)  # a new session: the old one's work is gone
        (item,) = client.take(P.RESULTS).body["results"]
        assert item[1] == P.FAILED and item[3]["type"] == "AgentLostError"
        assert "may have started" in item[3]["message"]
    finally:
        agent.close()
        client.close()


@pytest.mark.parametrize("heard", [False, True])
def test_a_direct_grant_a_resumed_session_never_had_goes_again_uncharged(broker: Broker,
                                                                         heard: bool):
    """Lost with a connection before its agent said it held it: it never arrived, and goes
    again, no retry spent. One its agent said it held, and no longer has, may have run."""
    agent, client = connected(broker)
    try:
        register(agent, session=5)
        submit(client, 1)
        (task,) = [t[0] for t in agent.take(P.ASSIGN).body["tasks"]]
        if heard:
            report(agent, 1, 5, held=[task])
        welcome = register(agent, session=5, resume=True)
        agent.send(P.HOLDING, {"session": 5, "tasks": [], "resumed": welcome.body["resumed"]})
        if heard:
            (item,) = client.take(P.RESULTS).body["results"]
            assert item[3]["type"] == "AgentLostError"
        else:
            assert [t[0] for t in agent.take(P.ASSIGN).body["tasks"]] == [task]
            assert broker.graph.tasks[task].retries == 0, "charged, though it never arrived"
    finally:
        agent.close()
        client.close()


def test_a_direct_grant_reported_held_needs_no_acknowledgement(broker: Broker):
    """Nothing waits for it: the broker counted it held before it sent it."""
    agent, client = connected(broker)
    try:
        register(agent, session=5)
        submit(client, 1)
        (task,) = [t[0] for t in agent.take(P.ASSIGN).body["tasks"]]
        report(agent, 1, 5, held=[task])
        assert not [m for m in agent.sync() if m.kind == P.ACK], "an ack sent for nothing"
        assert not broker.graph.tasks[task].unheard
    finally:
        agent.close()
        client.close()


@pytest.mark.parametrize("told", [True, False])
def test_a_direct_grant_that_crosses_its_agents_goodbye_runs_again_uncharged(
        broker: Broker, told: bool):
    """The goodbye comes after the agent's last report, which says held every direct grant
    it handed over: with every report read, one never said held never reached a worker
    there. With a report missing (lost with a connection), it may have: it is charged."""
    agent, client = connected(broker)
    other = Peer(broker)
    try:
        register(agent, session=5)
        submit(client, 1)
        (task,) = [t[0] for t in agent.take(P.ASSIGN).body["tasks"]]
        agent.send(P.BYE, {"session": 5, "seq": 0 if told else 1})
        if told:
            register(other, session=6)
            assert [t[0] for t in other.take(P.ASSIGN).body["tasks"]] == [task]
            assert broker.graph.tasks[task].retries == 0
        else:
            (item,) = client.take(P.RESULTS).body["results"]
            assert item[3]["type"] == "AgentLostError"
    finally:
        agent.close()
        client.close()
        other.close()
