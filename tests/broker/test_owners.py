"""What the broker checks of owners at submit (issue 28): a bounded priority and each
owner's queued quota, refused to the sender alone; and the status's owners. The broker is
stepped in this thread, a client and an agent played by hand (no keys: the owner is "")."""

from __future__ import annotations

import pytest

from tests.broker.test_agent_link import Peer, connected, register
from zres.broker.server import Broker
from zres.core import protocol as P
from zres.core.resources import UNIT
from zres.scheduler.owners import Quotas

pytestmark = pytest.mark.timeout(30)


def items(*locals_: int, priority: int = 0) -> list[list[object]]:
    return [[n, {"CPU": UNIT}, priority, 0, [], 2, f"t{n}", False] for n in locals_]


def send(client: Peer, tasks: list[list[object]]) -> None:
    client.send(P.SUBMIT, {"tasks": tasks}, [b"fn", b"args"] * len(tasks))


@pytest.mark.parametrize("priority", [10**9, -1001, 1001])
def test_a_priority_out_of_range_is_refused_by_the_broker_naming_the_range(priority):
    """A raw peer can send anything: the broker checks the range itself."""
    broker = Broker("tcp://127.0.0.1:0", prefetch=0)
    agent, client = connected(broker)
    try:
        send(client, items(1, 2, priority=priority))
        refused = client.take(P.REFUSED)
        assert refused.body["ids"] == [1, 2]
        assert f"priority must be between -1000 and 1000, got {priority}" in \
            refused.body["error"]
        assert broker.graph.tasks == {}
        send(client, items(3, priority=1000))  # the bounds themselves are fine
        client.sync()
        assert len(broker.graph.tasks) == 1
    finally:
        agent.close()
        client.close()
        broker.close()


def test_a_submit_over_the_queued_quota_is_refused_naming_it_and_records_nothing():
    broker = Broker("tcp://127.0.0.1:0", prefetch=0, quotas=Quotas(default_queued=3))
    agent, client = connected(broker)
    try:
        register(agent, session=1, cpus=1)
        send(client, items(1, 2))            # one runs, one waits
        agent.take(P.ASSIGN)
        send(client, items(3, 4))            # three wait: the quota's worth
        client.sync()
        assert broker.graph.census.waiting_of("") == 3
        send(client, items(5))
        refused = client.take(P.REFUSED)
        assert refused.body["ids"] == [5]
        error = refused.body["error"]
        assert "over the queued quota of owner (the default key): 3 tasks waiting at " \
               "once ([quotas.queued] default); it has 3 waiting and this submit adds 1" \
               in error, error
        assert sorted(t.local_id for t in broker.graph.tasks.values()) == [1, 2, 3, 4]
        status = broker.status()
        [owner] = status["owners"]
        assert (owner["owner"], owner["waiting"], owner["queued_quota"]) == ("", 3, 3)
        assert owner["holds"] == {"CPU": UNIT} and owner["grants"] == 1
    finally:
        agent.close()
        client.close()
        broker.close()
