"""Results a worker process sends straight to the broker (``direct_done``, besides its
agent's copy): the broker stepped in this thread, the agent, its worker and a client
played by hand over real sockets. Taken for the grant they name and no other; the agent's
copy, coming later, changes nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.broker.test_agent_link import Peer, connected, register, report, submit
from zres.broker.server import Broker
from zres.core import protocol as P

pytestmark = pytest.mark.timeout(30)

SESSION = 5


@pytest.fixture
def broker() -> Iterator[Broker]:
    broker = Broker("tcp://127.0.0.1:0", prefetch=0)
    yield broker
    broker.close()


@contextlib.contextmanager
def granted_on(broker: Broker) -> Iterator[tuple[Peer, Peer, Peer, list[Any]]]:
    """An agent (session SESSION, one CPU), a worker process of its, and a client whose
    task 1 is granted there, on BROKER: the peers and the grant."""
    agent, client = connected(broker)
    worker = Peer(broker)
    try:
        register(agent, session=SESSION, cpus=1)
        submit(client, 1)
        (grant,) = agent.take(P.ASSIGN).body["tasks"]
        yield agent, client, worker, grant
    finally:
        for peer in (agent, client, worker):
            peer.close()


@pytest.fixture
def granted(broker: Broker) -> Iterator[tuple[Peer, Peer, Peer, list[Any]]]:
    with granted_on(broker) as peers:
        yield peers


def straight(worker: Peer, task: int, attempt: int, value: bytes, outcome: str = P.OK,
             **over: Any) -> None:
    """The worker's direct_done for TASK: ended OUTCOME with VALUE (fields as OVER says)."""
    body = {"session": SESSION, "epoch": worker.broker.epoch,
            "results": [[task, outcome, 1, {}, attempt]], "started": [task], **over}
    worker.send(P.DIRECT_DONE, body, [value])


def results(client: Peer) -> list[list[Any]]:
    """The results the client was sent so far."""
    return [r for m in client.sync() if m.kind == P.RESULTS for r in m.body["results"]]


def test_a_result_sent_straight_ends_its_task_and_the_agents_copy_changes_nothing(
        broker: Broker, granted: tuple[Any, ...]):
    agent, client, worker, grant = granted
    task_id, attempt = grant[0], grant[6]["attempt"]
    straight(worker, task_id, attempt, b"straight")
    ((local, outcome, _, _),) = results(client)
    assert (local, outcome) == (1, P.OK)
    assert broker.graph.tasks[task_id].begun, "its start was not taken in with it"
    submit(client, 2)  # its slot is free at once: granted directly, not queued
    (second,) = agent.take(P.ASSIGN).body["tasks"]
    assert not second[6].get("queued")
    # The agent's copy of the first (held, started, the result again) comes later.
    report(agent, 1, SESSION, [b"copy"], held=[task_id], started=[task_id],
           results=[[task_id, P.OK, 1, {}]])
    later = agent.sync()
    assert results(client) == [], "the agent's copy was taken as a second result"
    assert not [m for m in later if m.kind == P.ACK], \
        "the copy of a result that came straight was acknowledged on its own"
    assert broker.graph.tasks[second[0]].state.name == "RUNNING"


@pytest.mark.parametrize("wrong", ["attempt", "epoch", "session", "actor", "failed"])
def test_a_result_sent_straight_for_another_grant_is_dropped(
        broker: Broker, granted: tuple[Any, ...], wrong: str):
    """Of an earlier attempt (the task was granted again since), of another life of the
    broker, of a session that is not the agent's now, or of a task that is not a plain
    grant there: dropped, the task still runs, and the agent's own report ends it. So is
    a failure: it may have the task granted again, to the same agent, whose copy of this
    end (naming no attempt) would then be taken for the new grant's."""
    agent, client, worker, grant = granted
    task_id, attempt = grant[0], grant[6]["attempt"]
    over: dict[str, Any] = {"attempt": {}, "epoch": {"epoch": broker.epoch + 1},
                            "session": {"session": SESSION + 1}, "actor": {},
                            "failed": {}}[wrong]
    if wrong == "actor":
        broker.actors.placements[task_id] = object()  # type: ignore[assignment]
    straight(worker, task_id, attempt + 1 if wrong == "attempt" else attempt,
             b"forged", P.FAILED if wrong == "failed" else P.OK, **over)
    assert results(client) == [], f"a result of another {wrong} ended the task"
    if wrong == "actor":
        del broker.actors.placements[task_id]
    report(agent, 1, SESSION, [b"real"], held=[task_id], started=[task_id],
           results=[[task_id, P.OK, 1, {}]])
    ((local, outcome, _, _),) = results(client)
    assert (local, outcome) == (1, P.OK)


def test_a_result_sent_straight_while_its_agent_is_silent_waits_for_the_agents_copy(
        broker: Broker, granted: tuple[Any, ...]):
    """An agent not heard for two heartbeats may be stopped or hung: a result taken
    straight would free its slot there, and grants it may never start would follow (each
    lost with it: AgentLostError, or a retry spent). Its own copy, once heard, ends it."""
    agent, client, worker, grant = granted
    record = broker.agents.by_session[SESSION]
    record.last_seen -= 3 * broker.hb_interval
    straight(worker, grant[0], grant[6]["attempt"], b"straight")
    assert results(client) == [], "a silent agent's slot was freed by its worker"
    report(agent, 1, SESSION, [b"copy"], held=[grant[0]], started=[grant[0]],
           results=[[grant[0], P.OK, 1, {}]])
    ((local, outcome, _, _),) = results(client)
    assert (local, outcome) == (1, P.OK)


def test_a_malformed_direct_result_is_refused_and_changes_nothing(
        broker: Broker, granted: tuple[Any, ...]):
    agent, client, worker, grant = granted
    worker.send(P.DIRECT_DONE, {"session": SESSION, "epoch": broker.epoch,
                                "results": [[grant[0], P.OK, 3, {}, 1]]}, [b"one"])
    refused = worker.take(P.REFUSED)
    assert "direct_done" in refused.body["error"]
    assert results(client) == []
    assert broker.graph.tasks[grant[0]].state.name == "RUNNING"
