"""A result a worker process sent straight to the broker, told to its client before the
broker takes in the rest of its end (``early_results``), and kept before it is told: the
broker stepped in this thread, with an agent, its worker and a client played by hand."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tests.broker.test_agent_link import Peer, report, submit
from tests.broker.test_direct_results import SESSION, granted_on, results, straight
from tests.broker.test_keeping import broker_on, kept_states
from zres.broker.journal import Journal
from zres.broker.server import Broker
from zres.broker.store import FILENAME, JOURNAL
from zres.core import protocol as P

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def kept(tmp_path: Path) -> Iterator[tuple[Broker, Peer, Peer, Peer, list[Any]]]:
    """A broker keeping its state in TMP_PATH, an agent (session SESSION, one CPU), a
    worker process of its and a client whose task 1 is granted there."""
    broker = broker_on(tmp_path)
    try:
        with granted_on(broker) as peers:
            yield (broker, *peers)
    finally:
        broker.close()


def handle_only(broker: Broker, kind: str) -> None:
    """Have BROKER handle the messages waiting for it up to one of KIND, and nothing of
    its turn after them (no scheduling, no commit, no sending of the turn's batches): as a
    broker killed right after that message would have done."""
    deadline = time.monotonic() + 10
    while True:
        assert broker.sock.poll(100), f"no {kind} came"
        frames = P.recv(broker.sock)
        broker._dispatch(frames, time.monotonic())
        if P.decode(frames[1:]).kind == kind or time.monotonic() > deadline:
            return


def received(peer: Peer) -> list[P.Message]:
    """What PEER was sent so far, waiting a moment for what is on its way."""
    got = []
    while peer.sock.poll(200):
        got.append(P.decode(peer.sock.recv_multipart()))
    return got


def kept_result(state: Path, task_id: int) -> list[bytes] | None:
    """The result of TASK_ID a broker started on STATE now would read (its journal's
    records beyond the last fold; None: none kept there)."""
    with sqlite3.connect(state / FILENAME) as db:
        meta = {k: msgpack.unpackb(v) for k, v in db.execute(
            "SELECT key, value FROM meta WHERE key IN ('journal_seq', 'journal_key')")}
    journal = Journal(str(state / JOURNAL), meta["journal_key"])
    found = None
    for seq, body in journal.records():
        for op in msgpack.unpackb(body) if seq > meta.get("journal_seq", 0) else ():
            if op[0] == "c" and op[1] == task_id and op[3] is not None:
                found = msgpack.unpackb(op[3])
    journal.close()
    return found


def test_a_result_sent_straight_is_told_at_once_and_kept_before_it_is_told(
        kept: tuple[Any, ...], tmp_path: Path):
    """Its client hears it with the message that brought it, before the broker's turn
    goes on; a broker killed right then comes back with the task ended, its result
    kept: nothing its client was told is taken back."""
    broker, agent, client, worker, grant = kept
    task_id = grant[0]
    straight(worker, task_id, grant[6]["attempt"], b"straight")
    handle_only(broker, P.DIRECT_DONE)
    told = [r for m in received(client) if m.kind == P.RESULTS for r in m.body["results"]]
    assert [(r[0], r[1]) for r in told] == [(1, P.OK)], \
        "the client waits for the broker's turn to end to hear its result"
    state = msgpack.unpackb(kept_states(tmp_path)[task_id])
    assert state[3] == P.OK and state[1] == "", f"told, but kept as {state}"
    assert kept_result(tmp_path, task_id) == [b"straight"]


def test_a_result_told_first_is_not_told_again_nor_its_start(kept: tuple[Any, ...]):
    """The rest of its end is taken in as before (its slot free for the next task), and
    its client hears of it once: no second result, no news that it began."""
    broker, agent, client, worker, grant = kept
    straight(worker, grant[0], grant[6]["attempt"], b"straight")
    news = [m for m in client.sync() if m.kind in (P.RESULTS, P.RUNNING)]
    assert [(m.kind, m.body.get("results") or m.body.get("ids")) for m in news] \
        == [(P.RESULTS, [[1, P.OK, 1, {"agent": "node"}]])]
    submit(client, 2)  # its slot is free: granted at once
    (second,) = agent.take(P.ASSIGN).body["tasks"]
    assert not second[6].get("queued")
    report(agent, 1, SESSION, [b"copy"], held=[grant[0]], started=[grant[0]],
           results=[[grant[0], P.OK, 1, {}]])
    assert results(client) == []


def test_a_raised_result_is_told_first_with_what_its_end_records(kept: tuple[Any, ...]):
    broker, agent, client, worker, grant = kept
    straight(worker, grant[0], grant[6]["attempt"], b"error", P.RAISED)
    ((local, outcome, count, info),) = results(client)
    assert (local, outcome, count, info["agent"]) == (1, P.RAISED, 1, "node")
    assert broker.graph.tasks[grant[0]].info == info


def test_a_result_of_a_task_being_cancelled_waits_for_its_cancels_answer(
        kept: tuple[Any, ...]):
    """A cancel asked and not yet answered: its answer comes with the end, as before (a
    result told first would come before it)."""
    broker, agent, client, worker, grant = kept
    client.send(P.CANCEL, {"ids": [1], "req": 7})
    agent.take(P.CANCEL)
    straight(worker, grant[0], grant[6]["attempt"], b"straight")
    news = client.sync()
    assert [m.kind for m in news if m.kind in (P.RESULTS, P.CANCEL_REPLY)] \
        == [P.CANCEL_REPLY, P.RESULTS]


def test_nothing_is_told_first_when_the_state_cannot_be_written(kept: tuple[Any, ...]):
    """A commit that fails (a full disk): the client is not told before the end is
    taken in, and the refused write is said as before."""
    broker, agent, client, worker, grant = kept
    assert broker.store is not None
    broker.store.commit = lambda: False  # type: ignore[method-assign]
    straight(worker, grant[0], grant[6]["attempt"], b"straight")
    handle_only(broker, P.DIRECT_DONE)
    assert [m for m in received(client) if m.kind == P.RESULTS] == []
    assert broker.graph.tasks[grant[0]].state.name == "DONE"


def test_a_client_that_has_let_go_of_its_task_is_not_told_first(kept: tuple[Any, ...]):
    broker, agent, client, worker, grant = kept
    client.send(P.RELEASE, {"ids": [1]})
    client.sync()
    straight(worker, grant[0], grant[6]["attempt"], b"straight")
    assert results(client) == []


def test_a_task_named_twice_in_one_message_is_told_once(kept: tuple[Any, ...]):
    """A message naming one task twice (a broken or hostile peer with the agent's key):
    the first is taken and told, the second dropped, as the agent's own report would."""
    broker, agent, client, worker, grant = kept
    task_id, attempt = grant[0], grant[6]["attempt"]
    worker.send(P.DIRECT_DONE, {"session": SESSION, "epoch": broker.epoch,
                                "results": [[task_id, P.OK, 1, {}, attempt],
                                            [task_id, P.RAISED, 1, {}, attempt]],
                                "started": [task_id]}, [b"ok", b"error"])
    assert [(r[0], r[1]) for r in results(client)] == [(1, P.OK)]
    assert broker.graph.tasks[task_id].outcome == P.OK


def test_the_news_that_it_began_batched_earlier_in_the_turn_is_not_sent_after(
        kept: tuple[Any, ...]):
    """Its agent's report that it began (a task that ran a while) is read in the same turn
    before its result: that news is dropped, as for a result sent with the turn's batch."""
    broker, agent, client, worker, grant = kept
    task_id = grant[0]
    report(agent, 1, SESSION, held=[task_id], started=[task_id])
    handle_only(broker, P.REPORT)
    straight(worker, task_id, grant[6]["attempt"], b"straight")
    handle_only(broker, P.DIRECT_DONE)
    broker.poll_once(time.monotonic(), timeout=0)  # (the rest of the same turn)
    assert [m.kind for m in received(client)] == [P.RESULTS]
