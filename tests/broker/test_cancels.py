"""Cancels the broker answered as final while its word to the agent was lost (issue 15,
from a review): the agent must still never start what the client was told is cancelled;
and a direct grant, which its agent starts the moment it arrives, is never told
cancelled before its agent has said it had not begun it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.broker.test_agent_link import broker, connected, register, report, submit  # noqa: F401
from zres.broker.server import Broker
from zres.core import protocol as P

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def pipelining() -> Iterator[Broker]:
    pipelined = Broker("tcp://127.0.0.1:0", prefetch=4)
    yield pipelined
    pipelined.close()


def test_a_task_cancelled_while_its_held_report_was_away_is_cancelled_again(
        pipelining: Broker):
    agent, client = connected(pipelining)
    try:
        register(agent, session=5, cpus=1)
        submit(client, 1)  # (one of its kind ends: the kind is short, worth pipelining)
        (first,) = [t[0] for t in agent.take(P.ASSIGN).body["tasks"]]
        report(agent, 1, 5, [b"r"], held=[first], started=[first],
               results=[[first, P.OK, 1, {}]])
        client.take(P.RESULTS)
        submit(client, 2, 3)
        items = agent.take(P.ASSIGN).body["tasks"]
        (task,) = [t[0] for t in items if t[6].get("queued")]  # (3: pipelined behind 2)
        # The client cancels it before the broker hears it held: cancelled for good...
        client.send(P.CANCEL, {"ids": [3], "req": 3})
        assert client.take(P.CANCEL_REPLY).body["cancelled"] == [3]
        agent.sync()  # ... and its CANCEL to the agent is lost with a connection.
        # The agent's held report comes (again) after: the ack would let it start.
        report(agent, 2, 5, held=[task])
        order = [m.kind for m in agent.sync() if m.kind in (P.CANCEL, P.ACK)]
        assert order[:2] == [P.CANCEL, P.ACK], f"acked without a cancel first: {order}"
    finally:
        agent.close()
        client.close()


@pytest.mark.parametrize("begun", [True, False])
def test_a_direct_grant_is_cancelled_only_on_its_agents_word(broker: Broker,  # noqa: F811
                                                             begun: bool):
    """Its agent may have handed it to a worker already, before it says so: the answer
    waits for the agent (it began: not cancelled; it ended cancelled: cancelled)."""
    agent, client = connected(broker)
    try:
        register(agent, session=5)
        submit(client, 1)
        (task,) = [t[0] for t in agent.take(P.ASSIGN).body["tasks"]]
        client.send(P.CANCEL, {"ids": [1], "req": 3})
        assert agent.take(P.CANCEL).body["ids"] == [task]  # (its agent is asked)
        assert not [m for m in client.sync() if m.kind == P.CANCEL_REPLY], \
            "told cancelled before its agent said it had not begun"
        if begun:
            report(agent, 1, 5, held=[task], started=[task])
        else:
            report(agent, 1, 5, held=[task], results=[[task, P.FAILED, 0, {
                "type": "CancelledError", "message": "cancelled"}]])
        assert client.take(P.CANCEL_REPLY).body["cancelled"] == ([] if begun else [1])
    finally:
        agent.close()
        client.close()


def test_a_grant_dropped_on_an_earlier_brokers_cancel_runs_as_its_cancel_said(
        broker: Broker):  # noqa: F811
    """A client asked a cancel; the broker asked the agent, then was killed before it
    answered: the client's cancel() said False (nothing known cancelled). The agent dropped
    the grant, unstarted, on the old broker's word and tells the new one. That broker never
    asked: the task never began, so it runs, as cancel() said, rather than ending
    cancelled (bench/chaos.py, seed 53, round 6)."""
    agent, client = connected(broker)
    try:
        register(agent, session=5, cpus=1)
        submit(client, 1)
        (task,) = [t[0] for t in agent.take(P.ASSIGN).body["tasks"]]
        report(agent, 1, 5, held=[task],
               results=[[task, P.FAILED, 0, {"type": "CancelledError", "message": "cancelled"}]])
        (again,) = agent.take(P.ASSIGN).body["tasks"]
        assert again[0] == task, "the grant dropped unstarted was not granted again"
        assert [m for m in client.sync() if m.kind == P.RESULTS] == [], \
            "the task ended cancelled though its client's cancel() was told nothing"
    finally:
        agent.close()
        client.close()

