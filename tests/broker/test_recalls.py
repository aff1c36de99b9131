"""Grants queued behind a short-kind task that turned long, asked back (``recall``): the
broker stepped in this thread, an agent of two one-CPU slots and a client played by hand
over real sockets. What the agent answers (``returned``) puts the task back in the queue,
uncharged, and whatever crossed the answer (a cancel) leaves the books right."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.broker.test_agent_link import Peer, connected, report, submit
from zres.broker.server import Broker
from zres.core import protocol as P
from zres.core.resources import UNIT
from zres.core.tasks import TaskState

pytestmark = pytest.mark.timeout(30)

SESSION = 5


@pytest.fixture
def broker() -> Iterator[Broker]:
    broker = Broker("tcp://127.0.0.1:0", prefetch=4)
    yield broker
    broker.close()


def register_two_slots(agent: Peer) -> None:
    agent.send(P.REGISTER, {"name": "node", "session": SESSION, "host": "h", "pid": 1,
                            "t": time.monotonic(),
                            "slots": [{"units": {"CPU": UNIT}, "gpus": []}] * 2})
    agent.take(P.WELCOME)


@pytest.fixture
def recalled(broker: Broker) -> Iterator[tuple[Peer, Peer, int, int]]:
    """Two short-kind tasks run, one on each slot, and turn long; a third, queued behind
    one of them, is asked back: the peers, the third task's id and its slot (the
    agent's next report is numbered 3)."""
    agent, client = connected(broker)
    try:
        register_two_slots(agent)
        submit(client, 1)  # (one of its kind ends at once: the kind is short)
        (first,) = [t[0] for t in agent.take(P.ASSIGN).body["tasks"]]
        report(agent, 1, SESSION, [b"r"], held=[first], started=[first],
               results=[[first, P.OK, 1, {}]])
        client.take(P.RESULTS)
        submit(client, 2, 3, 4)
        items = agent.take(P.ASSIGN).body["tasks"]
        direct = [t[0] for t in items if not t[6].get("queued")]
        (queued,) = [t[0] for t in items if t[6].get("queued")]
        assert len(direct) == 2
        report(agent, 2, SESSION, held=direct, started=direct)
        assert agent.take(P.RECALL).body["ids"] == [queued]  # (once they have run long)
        yield agent, client, queued, broker.sched.running[queued].slot
    finally:
        agent.close()
        client.close()


def test_a_recalled_grant_given_back_waits_again_uncharged_and_its_slot_is_free_of_it(
        broker: Broker, recalled: tuple[Peer, Peer, int, int]):
    agent, client, task_id, slot_id = recalled
    retries = broker.graph.tasks[task_id].retries
    report(agent, 3, SESSION, returned=[task_id])
    client.sync()
    assert task_id not in broker.sched.running and task_id in broker.sched.waiting
    assert broker.sched.slots[slot_id].queue == {}
    assert not broker.sched.slots[slot_id].queued_taken
    task = broker.graph.tasks[task_id]
    assert task.state is TaskState.QUEUED and task.retries == retries
    assert "queued on" not in broker.explain.why(task)


def test_a_grant_given_back_as_its_cancel_crossed_the_answer_leaves_no_grant_behind(
        broker: Broker, recalled: tuple[Peer, Peer, int, int]):
    # The agent gave it back (the recall came first); the client's cancel, crossing that
    # answer, found it not held and failed it at once. The answer must still free the
    # slot's queue (else the slot keeps a grant for good, and is asked again every second).
    agent, client, task_id, slot_id = recalled
    client.send(P.CANCEL, {"ids": [task_id], "req": 1})
    assert client.take(P.CANCEL_REPLY).body["cancelled"] == [task_id]
    report(agent, 3, SESSION, returned=[task_id])
    client.sync()
    assert broker.graph.tasks[task_id].state is TaskState.FAILED
    assert task_id not in broker.sched.running, "the cancelled grant is still counted"
    assert broker.sched.slots[slot_id].queue == {}
    assert not broker.sched.slots[slot_id].queued_taken

