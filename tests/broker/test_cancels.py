"""Cancels the broker answered as final while its word to the agent was lost (issue 15,
from a review): the agent must still never start what the client was told is cancelled."""

from __future__ import annotations

import pytest

from tests.broker.test_agent_link import broker, connected, register, report, submit  # noqa: F401
from zres.broker.server import Broker
from zres.core import protocol as P

pytestmark = pytest.mark.timeout(30)


def test_a_task_cancelled_while_its_held_report_was_away_is_cancelled_again(broker: Broker):  # noqa: F811
    agent, client = connected(broker)
    try:
        register(agent, session=5)
        submit(client, 1)
        (task,) = [t[0] for t in agent.take(P.ASSIGN).body["tasks"]]
        # The client cancels it before the broker hears it held: cancelled for good...
        client.send(P.CANCEL, {"ids": [1], "req": 3})
        assert client.take(P.CANCEL_REPLY).body["cancelled"] == [1]
        agent.sync()  # ... and its CANCEL to the agent is lost with a connection.
        # The agent's held report comes (again) after: the ack would let it start.
        report(agent, 1, 5, held=[task])
        order = [m.kind for m in agent.sync() if m.kind in (P.CANCEL, P.ACK)]
        assert order[:2] == [P.CANCEL, P.ACK], f"acked without a cancel first: {order}"
    finally:
        agent.close()
        client.close()
