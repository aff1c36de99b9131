"""Python tasks kept across a broker restart (issue 16), the broker stepped in this thread
with a client and an agent played by hand: what a restarted broker gives back to the
client that comes back, and what it makes of the tasks an agent held when it went."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tests.broker.test_agent_link import Peer, report
from zres.broker.journal import Journal
from zres.broker.keeping import KEEP_RESULT
from zres.broker.server import Broker
from zres.broker.store import FILENAME, JOURNAL, Store
from zres.core import protocol as P
from zres.core.resources import UNIT

pytestmark = pytest.mark.timeout(30)
CLIENT = b"client-1"


def broker_on(state: Path) -> Broker:
    return Broker("tcp://127.0.0.1:0", prefetch=0, store=Store(str(state)))


def restarted(broker: Broker, state: Path, *peers: Peer) -> Broker:
    """Stop BROKER and its PEERS (as a crash would leave them: nothing said) and start a
    broker on the same STATE."""
    broker.close()
    for peer in peers:
        peer.close()
    return broker_on(state)


def kept_states(state: Path) -> dict[int, bytes]:
    """The tasks' states a broker started on STATE now would read (as another process
    reads them): the database's, then the journal's records beyond its last fold."""
    with sqlite3.connect(state / FILENAME) as db:
        states = dict(db.execute("SELECT id, state FROM tasks"))
        meta = {k: msgpack.unpackb(v) for k, v in db.execute(
            "SELECT key, value FROM meta WHERE key IN ('journal_seq', 'journal_key')")}
    folded = meta.get("journal_seq", 0)
    journal = Journal(str(state / JOURNAL), meta["journal_key"])
    for seq, body in journal.records():
        for op in msgpack.unpackb(body) if seq > folded else ():
            if op[0] == "d":
                states.pop(op[1], None)
            else:
                states[op[1]] = op[4] if op[0] == "n" else op[2]
    journal.close()
    return states


def hello(broker: Broker) -> tuple[Peer, P.Message]:
    client = Peer(broker, ident=CLIENT)
    client.send(P.HELLO, {"client": "c"})
    return client, client.take(P.WELCOME)


def submit(client: Peer, local: int, deps: list[int] = ()) -> None:  # type: ignore[assignment]
    client.send(P.SUBMIT, {"tasks": [[local, {"foo": UNIT}, 0, 0, list(deps), 2,
                                      f"t{local}", False]]}, [b"fn", b"args%d" % local])


def register(agent: Peer, session: int, **offer: Any) -> P.Message:
    agent.send(P.REGISTER, {"name": "node", "session": session, "host": "h", "pid": 1,
                            "t": time.monotonic(), "jobs": [], "ended": [], **offer,
                            "slots": [{"units": {"CPU": UNIT, "foo": UNIT}, "gpus": []}]},
               offer.pop("frames", []) if "frames" in offer else [])
    return agent.take(P.WELCOME)


def results(client: Peer, info: bool = False) -> dict[int, Any]:
    msg = client.take(P.RESULTS)
    items = msg.body["results"]
    frames = P.split_frames([bytes(f) for f in msg.frames], [i[2] for i in items])
    return {i[0]: (i[1], i[3] if info else f) for i, f in zip(items, frames)}


def finish(agent: Peer, seq: int, session: int, task_id: int, value: bytes) -> None:
    report(agent, seq, session, [value], held=[task_id], started=[task_id],
           results=[[task_id, P.OK, 1, {}]])


def test_a_client_finds_its_tasks_and_results_after_a_restart(tmp_path):
    """Task 1 ended (its small result kept), task 2 waits for it, task 3 ended with a
    result too large to keep: after a restart the client is told again how 1 ended, 2
    runs with 1's result as its input, and 3 runs again once a new task needs it."""
    broker = broker_on(tmp_path)
    client, welcome = hello(broker)
    agent = Peer(broker)
    assert welcome.body["keeps"] is True and welcome.body["resumed"] is False
    register(agent, session=1)
    submit(client, 1)
    assert client.take(P.ACCEPTED).body["upto"] == 1, "acknowledged once written"
    [(first, *_)] = agent.take(P.ASSIGN).body["tasks"]
    finish(agent, 1, 1, first, b"one")
    assert results(client)[1] == (P.OK, [b"one"])
    submit(client, 3)
    assert client.take(P.ACCEPTED).body["upto"] == 3
    [(third, *_)] = agent.take(P.ASSIGN).body["tasks"]
    finish(agent, 2, 1, third, b"x" * (KEEP_RESULT + 1))
    results(client)
    submit(client, 2, deps=[1])
    assert client.take(P.ACCEPTED).body["upto"] == 3, "(2 came after 3)"
    broker = restarted(broker, tmp_path, client, agent)
    client, welcome = hello(broker)
    agent = Peer(broker)
    try:
        assert welcome.body["resumed"] is True
        client.send(P.RESUME, {"ids": [1, 2, 99]})
        told = results(client, info=True)
        assert told[1][0] == P.OK, "a finished task's result was not kept"
        assert told[99][0] == P.FAILED and "did not keep it" in told[99][1]["message"]
        client.send(P.RESUME, {"ids": [1]})
        assert results(client)[1] == (P.OK, [b"one"])
        # (2 was granted as the broker went: its agent, carrying that session, has not
        # got it, so it is granted again)
        register(agent, session=2, carried=1)
        [(second, *_)] = (assign := agent.take(P.ASSIGN)).body["tasks"]
        assert second not in (first, third), "ran again: its result was kept, or not asked"
        assert [bytes(f) for f in assign.frames] == [b"fn", b"args2", b"one"], \
            "2 did not get 1's kept result as its input"
        finish(agent, 1, 2, second, b"two")
        assert results(client)[2] == (P.OK, [b"two"])
        assert not [m for m in agent.sync() if m.kind == P.ASSIGN], \
            "3 ran again, though nothing needed its result yet"
        submit(client, 4, deps=[3])  # a new task needs 3's result, which was not kept
        [(again, *_)] = agent.take(P.ASSIGN).body["tasks"]
        assert again == third, "a result too large to keep is computed again when needed"
        finish(agent, 2, 2, third, b"three")
        [(fourth, *_)] = (assign := agent.take(P.ASSIGN)).body["tasks"]
        assert [bytes(f) for f in assign.frames][-1] == b"three"
        finish(agent, 3, 2, fourth, b"four")
        assert results(client) | results(client) == {3: (P.OK, [b"three"]),
                                                     4: (P.OK, [b"four"])}
    finally:
        for peer in (client, agent):
            peer.close()
        broker.close()


def held_when_the_broker_went(tmp_path: Path) -> int:
    """A broker whose agent held task 1 (handed to a worker, so perhaps begun) when it
    went; return its id."""
    broker = broker_on(tmp_path)
    client, _ = hello(broker)
    agent = Peer(broker)
    register(agent, session=1)
    submit(client, 1)
    [(one, *_)] = agent.take(P.ASSIGN).body["tasks"]
    report(agent, 1, 1, held=[one])
    agent.sync()  # (taken in, and written at the end of that turn)
    broker.close()
    for peer in (client, agent):
        peer.close()
    return one


@pytest.mark.parametrize("word", ["runs", "ended", "returned", "silent"])
def test_a_task_an_agent_held_waits_for_its_word(tmp_path, word):
    task = held_when_the_broker_went(tmp_path)
    broker = broker_on(tmp_path)
    client, _ = hello(broker)
    agent = Peer(broker)
    try:
        client.send(P.CANCEL, {"ids": [1], "req": 5})
        assert client.take(P.CANCEL_REPLY).body["cancelled"] == [], \
            "cancelled while its agent may be running it"
        offer: dict[str, Any] = {
            "runs": {"jobs": [[task, 0, [], {"foo": UNIT}]]},
            "ended": {"ended": [[task, P.OK, 1, {}]], "frames": [b"done"]},
            "returned": {"returned": [task]}, "silent": {}}[word]
        register(agent, session=2, **offer)
        if word == "runs":  # adopted: not granted again; its result counts
            assert not [m for m in agent.sync() if m.kind == P.ASSIGN]
            report(agent, 1, 2, [b"later"], results=[[task, P.OK, 1, {}]])
            assert results(client)[1] == (P.OK, [b"later"])
        elif word == "ended":
            assert results(client)[1] == (P.OK, [b"done"])
        elif word == "returned":  # it never began: granted again, no retry spent
            assert [t[0] for t in agent.take(P.ASSIGN).body["tasks"]] == [task]
        else:  # it may have run, and has no retries: it fails, saying why
            outcome, info = results(client, info=True)[1]
            assert outcome == P.FAILED and info["type"] == "AgentLostError"
            assert "no longer had it" in info["message"]
    finally:
        for peer in (client, agent):
            peer.close()
        broker.close()


def test_a_queued_command_job_keeps_its_retries_across_a_restart(tmp_path):
    """A command job's retries are its own (a restarted broker gave it none: an agent
    lost under it, or a multi-node job's lost rank, then failed it instead of a retry)."""
    broker = broker_on(tmp_path)
    client, _ = hello(broker)
    job = {"job": {"argv": ["true"], "env": {}, "export": {}, "cwd": None, "nodes": 2}}
    client.send(P.SUBMIT, {"tasks": [[1, {"foo": UNIT}, 0, 3, [], 0, "job", False, job]]})
    assert client.take(P.ACCEPTED).body["upto"] == 1
    broker = restarted(broker, tmp_path, client)
    client, _ = hello(broker)
    try:
        [task] = [t for t in broker.graph.tasks.values() if t.name == "job"]
        assert task.retries == 3, "a restarted broker took its job back without its retries"
    finally:
        client.close()
        broker.close()


def test_a_task_offered_back_without_room_for_it_spends_a_retry_not_run_as_never_begun(
        tmp_path):
    """Two tasks ran on an agent whose capacity was lowered to hold one of them when the
    broker restarted: the one it offers back without room is stopped there and fails
    (retries=0), never granted again as one that never arrived (it ran twice)."""
    broker = broker_on(tmp_path)
    client, _ = hello(broker)
    agent = Peer(broker)
    foo = {"CPU": UNIT, "foo": UNIT}

    def join(session: int, foos: int, **offer: Any) -> None:
        agent.send(P.REGISTER, {"name": "node", "session": session, "host": "h", "pid": 1,
                                "t": time.monotonic(), "jobs": [], "ended": [], **offer,
                                "slots": [{"units": {"CPU": 2 * UNIT, "foo": foos * UNIT},
                                           "gpus": []}]})
        agent.take(P.WELCOME)
    join(1, 2)
    submit(client, 1)
    submit(client, 2)
    held = [t[0] for t in agent.take(P.ASSIGN).body["tasks"]]
    held += [t[0] for t in agent.take(P.ASSIGN).body["tasks"]] if len(held) < 2 else []
    report(agent, 1, 1, held=held, started=held)
    agent.sync()
    broker = restarted(broker, tmp_path, client, agent)
    client, _ = hello(broker)
    agent = Peer(broker)
    try:
        client.send(P.RESUME, {"ids": [1, 2]})
        join(2, 1, carried=1, jobs=[[task, 0, [], foo] for task in held])
        (cancel,) = [m for m in agent.sync() if m.kind == P.CANCEL]
        [(outcome, info)] = results(client, info=True).values()
        assert outcome == P.FAILED and info["type"] == "AgentLostError", info
        assert "no longer had room for it" in info["message"]
        assert cancel.body["ids"] == [held[1]]
        assert not [m for m in agent.sync() if m.kind == P.ASSIGN], "granted again"
    finally:
        for peer in (client, agent):
            peer.close()
        broker.close()


def test_what_the_broker_cannot_write_it_does_not_acknowledge(tmp_path):
    """A full disk: neither the task's client nor any agent hears that it is kept (the
    client keeps it to send again), and it is not granted (a direct grant starts the
    moment it arrives: it goes only once the broker has kept that it may have), until it
    is written."""
    broker = Broker("tcp://127.0.0.1:0", prefetch=0,
                    store=Store(str(tmp_path), max_pages=8))  # a few pages: a full disk
    client, _ = hello(broker)
    agent = Peer(broker)
    try:
        register(agent, session=1)
        client.send(P.SUBMIT, {"tasks": [[1, {"foo": UNIT}, 0, 0, [], 2, "big", False]]},
                    [b"fn", b"x" * 200_000])
        told = agent.sync() + agent.sync()
        assert not [m for m in told if m.kind in (P.ASSIGN, P.ACK)], \
            "an agent was told to go ahead with what the broker did not keep"
        assert broker.graph.tasks[1].held, "(it was granted: only not sent)"
        assert not [m for m in client.sync() if m.kind == P.ACCEPTED]
        assert "full" in broker.status()["state"]["error"]
    finally:
        for peer in (client, agent):
            peer.close()
        broker.close()


@pytest.mark.parametrize("carried", [False, True])
def test_a_direct_grant_sent_as_the_broker_died_is_kept_as_perhaps_begun(tmp_path, carried):
    """The broker dies right after sending a direct grant, which its agent may have
    started at once: the restarted broker counts it held there. An agent that carries the
    very session it was sent to offers all it may have begun: one not offered never
    arrived, and goes again uncharged; an agent that began anew may have lost it running
    (no retries: it fails, saying so)."""
    broker = broker_on(tmp_path)
    client, _ = hello(broker)
    agent = Peer(broker)
    register(agent, session=1)
    unkept: list[bool] = []  # (for each assign sent: whether the store had news unwritten)
    send_raw = broker._send_raw
    broker._send_raw = lambda ident, frames: (  # type: ignore[method-assign]
        unkept.append(broker.store.dirty()) if P.decode(frames).kind == P.ASSIGN else None,
        send_raw(ident, frames))[-1]
    submit(client, 1)
    [(task, *_)] = agent.take(P.ASSIGN).body["tasks"]  # (and no word from the agent)
    assert unkept == [False], "a direct grant was sent before the commit that keeps it"
    # Written before it was sent: as another process reads the state now.
    assert msgpack.unpackb(kept_states(tmp_path)[task])[1] == "node", \
        "sent before it was kept as held there"
    broker = restarted(broker, tmp_path, client, agent)
    client, _ = hello(broker)
    agent = Peer(broker)
    try:
        client.send(P.CANCEL, {"ids": [1], "req": 5})
        assert client.take(P.CANCEL_REPLY).body["cancelled"] == [], \
            "cancelled while its agent may be running it"
        register(agent, session=2, **({"carried": 1} if carried else {}))
        if carried:
            assert [t[0] for t in agent.take(P.ASSIGN).body["tasks"]] == [task]
            assert broker.graph.tasks[task].retries == 0
        else:
            outcome, info = results(client, info=True)[1]
            assert outcome == P.FAILED and info["type"] == "AgentLostError"
    finally:
        for peer in (client, agent):
            peer.close()
        broker.close()


def test_an_agent_carrying_another_session_than_the_one_known_may_have_lost_work(tmp_path):
    """Its name's session was 1 when the broker went; it carries session 7's work (say,
    one it began after being told 1 had ended): what was granted to 1 and is not offered
    may have run there."""
    task = held_when_the_broker_went(tmp_path)
    broker = broker_on(tmp_path)
    client, _ = hello(broker)
    agent = Peer(broker)
    try:
        register(agent, session=2, carried=7)
        outcome, info = results(client, info=True)[1]
        assert outcome == P.FAILED and info["type"] == "AgentLostError"
        assert not [t for m in agent.sync() if m.kind == P.ASSIGN for t in m.body["tasks"]
                    if t[0] == task]
    finally:
        for peer in (client, agent):
            peer.close()
        broker.close()


def test_an_agent_declared_lost_before_a_restart_does_not_keep_its_work_after(tmp_path):
    """Its work was given to others when it was declared lost: the restarted broker must
    tell it so (stop everything), not offer to take that work back."""
    broker = broker_on(tmp_path)
    agent = Peer(broker, ident=b"agent-1")
    register(agent, session=1)
    broker.dispatch.lose_agent(broker.agents.by_ident[b"agent-1"], "silent for 9.0s")
    agent.take(P.UNKNOWN)
    broker.close()
    agent.close()

    broker = broker_on(tmp_path)
    agent = Peer(broker, ident=b"agent-1")
    try:
        agent.send(P.REGISTER, {"name": "node", "session": 1, "host": "h", "pid": 1,
                                "t": time.monotonic(), "resume": True, "epoch": 1,
                                "slots": [{"units": {"CPU": UNIT}, "gpus": []}]})
        told = agent.take(P.UNKNOWN).body
        assert told["adopts"] is False, "it would keep work that went elsewhere"
        assert "silent for 9.0s" in told["ended"]
    finally:
        agent.close()
        broker.close()


def test_a_malformed_offer_of_returned_grants_is_ignored_not_fatal(tmp_path):
    task = held_when_the_broker_went(tmp_path)
    broker = broker_on(tmp_path)
    agent = Peer(broker)
    try:
        welcome = register(agent, session=2, returned=[[task], "x", task])
        assert welcome.body["adopts"] is True, "the registration failed on a bad entry"
        assert [t[0] for t in agent.take(P.ASSIGN).body["tasks"]] == [task]
    finally:
        agent.close()
        broker.close()


def submit_quiet(client: Peer, local: int) -> None:
    client.send(P.SUBMIT, {"tasks": [[local, {"foo": UNIT}, 0, 0, [], 2, f"q{local}", False,
                                      {"quiet": True}]]}, [b"fn", b"args%d" % local])


def one_task_ended(state: Path, value: bytes,
                   quiet: bool = False) -> tuple[Broker, Peer, Peer, int]:
    """A broker on STATE, its client and agent: the client's task 1 (QUIET or not) ended
    on the agent with VALUE. Return them and the task's id."""
    broker = broker_on(state)
    client, _ = hello(broker)
    agent = Peer(broker)
    register(agent, session=1)
    (submit_quiet if quiet else submit)(client, 1)
    client.take(P.ACCEPTED)
    [(task, *_)] = agent.take(P.ASSIGN).body["tasks"]
    finish(agent, 1, 1, task, value)
    return broker, client, agent, task


def test_a_quiet_task_is_told_ended_without_its_result_before_and_after_a_restart(tmp_path):
    """A quiet task (a Dask graph's intermediate: its client follows its end, only its
    readers read its result) ends: its client hears "ok" with no frames. After a restart
    its result, too large to keep, is not computed again for the client's resume: the
    client is told it ended, which is all it asked."""
    broker, client, agent, _ = one_task_ended(tmp_path, b"x" * (KEEP_RESULT + 1), quiet=True)
    assert results(client) == {1: (P.OK, [])}, "a quiet task's result went to its client"
    submit_quiet(client, 2)
    client.take(P.ACCEPTED)
    [(second, *_)] = agent.take(P.ASSIGN).body["tasks"]
    report(agent, 2, 1, [b"oops"], held=[second], started=[second],
           results=[[second, P.RAISED, 1, {}]])
    assert results(client) == {2: (P.RAISED, [b"oops"])}, "an error's frames say what it was"
    broker = restarted(broker, tmp_path, client, agent)
    client, _ = hello(broker)
    agent = Peer(broker)
    try:
        register(agent, session=2)
        client.send(P.RESUME, {"ids": [1]})
        assert results(client) == {1: (P.OK, [])}
        assert not [m for m in agent.sync() if m.kind == P.ASSIGN], \
            "the quiet task ran again for a client that wants no result"
    finally:
        for peer in (client, agent):
            peer.close()
        broker.close()


def test_a_release_heard_before_the_hello_of_a_restored_client_is_kept(tmp_path):
    """A restarted broker tells a restored client its tasks' results at once; the client
    may let go of one before it notices the restart (and says hello). That release counts:
    dropped, the task would be held until the client leaves."""
    broker, client, agent, first = one_task_ended(tmp_path, b"one")
    results(client)
    broker = restarted(broker, tmp_path, client, agent)
    client = Peer(broker, ident=CLIENT)
    try:
        assert broker.graph.get(first) is not None, "kept while its client holds it"
        client.send(P.RELEASE, {"ids": [1]})
        client.sync()
        assert broker.graph.get(first) is None, "the release before the hello was dropped"
    finally:
        client.close()
        broker.close()


def test_a_task_for_named_agents_keeps_them_across_a_restart(tmp_path):
    """workers= is kept with the task: after a restart it still runs only on its agent."""
    broker = broker_on(tmp_path)
    client, _ = hello(broker)
    agent = Peer(broker)
    register(agent, session=1)
    client.send(P.SUBMIT, {"tasks": [[1, {"foo": UNIT}, 0, 0, [], 2, "t1", False,
                                      {"workers": ["other"]}]]}, [b"fn", b"args"])
    client.take(P.ACCEPTED)
    assert client.take(P.WARN).body["reason"] == "no agent named other has joined"
    assert not [m for m in agent.sync() if m.kind == P.ASSIGN]
    broker = restarted(broker, tmp_path, client, agent)
    client, _ = hello(broker)
    node, other = Peer(broker), Peer(broker)
    try:
        client.send(P.RESUME, {"ids": [1]})
        register(node, session=2)
        assert not [m for m in node.sync() if m.kind == P.ASSIGN], "not on the named agent"
        register(other, session=1, name="other")
        assert [t[0] for t in other.take(P.ASSIGN).body["tasks"]] == [
            broker.client_link.clients.get(CLIENT).ids[1]]
    finally:
        for peer in (client, node, other):
            peer.close()
        broker.close()


def test_workers_that_are_not_agent_names_are_refused(tmp_path):
    broker = broker_on(tmp_path)
    client, _ = hello(broker)
    try:
        client.send(P.SUBMIT, {"tasks": [[1, {"foo": UNIT}, 0, 0, [], 2, "t1", False,
                                          {"workers": "node"}]]}, [b"fn", b"args"])
        refused = client.take(P.REFUSED)
        assert "workers must be a list of agent names" in refused.body["error"]
        assert broker.graph.tasks == {}
    finally:
        client.close()
        broker.close()


def test_a_task_sent_again_after_a_restart_is_told_again_if_it_ended_before_its_client_came(
        tmp_path):
    """Task 1 was kept, but its client had not heard so when the broker went: it sends it
    again after the restart. The restarted broker ran it before the client came back (its
    result went nowhere): the copy sent again is taken once, and its result told again."""
    broker = broker_on(tmp_path)
    client, _ = hello(broker)
    submit(client, 1)
    client.take(P.ACCEPTED)
    broker = restarted(broker, tmp_path, client)
    agent = Peer(broker)
    client = None
    try:
        register(agent, session=1)
        [(one, *_)] = agent.take(P.ASSIGN).body["tasks"]
        finish(agent, 1, 1, one, b"one")
        agent.sync()  # (ended, and told to a client not there)
        client, _ = hello(broker)
        submit(client, 1)  # (it had not heard it was kept)
        client.send(P.RESUME, {"ids": [], "holds": [1], "last": True})
        assert results(client)[1] == (P.OK, [b"one"]), "its result was never told again"
        assert not [m for m in agent.sync() if m.kind == P.ASSIGN], "it ran twice"
    finally:
        for peer in (client, agent):
            if peer is not None:
                peer.close()
        broker.close()


def test_a_short_tasks_acknowledgement_rides_with_its_result(tmp_path, monkeypatch):
    """One message less each way on a short task's path: its result carries the
    acknowledgement of its submit (once written), and no ACCEPTED goes on its own; a large
    submit is acknowledged at once (its client sends a window ahead of acknowledgements)."""
    from zres.broker import accepting
    monkeypatch.setattr(accepting, "ACCEPT_WITHIN", 60.0)  # (only results may carry it)
    broker = broker_on(tmp_path)
    client, _ = hello(broker)
    agent = Peer(broker)
    try:
        register(agent, session=1)
        submit(client, 1)
        [(task, *_)] = agent.take(P.ASSIGN).body["tasks"]
        assert not [m for m in client.sync() if m.kind == P.ACCEPTED]
        finish(agent, 1, 1, task, b"one")
        msg = client.take(P.RESULTS)
        assert msg.body["upto"] == 1 and msg.body["ids"] == [[1, task, 1]]
        assert task in kept_states(tmp_path)
        assert not [m for m in client.sync() if m.kind == P.ACCEPTED]
        many = accepting.ACCEPT_AT_ONCE
        client.send(P.SUBMIT, {"tasks": [[local, {"foo": UNIT}, 0, 0, [], 2, f"t{local}",
                                          False] for local in range(2, 2 + many)]},
                    [f for _ in range(many) for f in (b"fn", b"args")])
        assert client.take(P.ACCEPTED).body["upto"] == 1 + many
    finally:
        for peer in (client, agent):
            peer.close()
        broker.close()


def test_an_acknowledgement_due_within_a_millisecond_is_waited_for_not_spun_for():
    """The broker's loop waits ``acks.wait`` in a poll of whole milliseconds: a wait of
    less than one would be a poll that returns at once, turn after turn, until it is due."""
    from zres.broker.accepting import Acknowledgements
    from zres.broker.clients import ClientRecord

    sent: list[tuple[bytes, str]] = []
    acks = Acknowledgements(lambda ident, kind, body: sent.append((ident, kind)), None)
    client = ClientRecord(ident=b"c", name="c", last_seen=0.0, accepted=1)
    acks.took(client)
    acks._by[b"c"] = time.monotonic() + 0.0003  # (due in 0.3 ms)
    acks.send_due()
    assert sent == [] and acks.wait >= 0.001
    acks._by[b"c"] = time.monotonic() - 0.001  # (due: sent, and then nothing waits)
    acks.send_due()
    assert sent == [(b"c", P.ACCEPTED)] and acks.wait >= 0.001


def test_a_big_result_that_may_be_made_again_keeps_its_call_across_a_restart(tmp_path):
    """A restored task's call stays on disk until it is granted, and lineage makes a lost
    result again only from a task that has its call: a big result whose holder did not
    come back after a restart failed with 'may not run again (... recompute=True lets it)'
    though its task had asked for that. One with inputs is not made again (they may be
    gone), and says so."""
    from zres.broker.clients import ClientRegistry
    from zres.broker.graph import TaskGraph
    from zres.broker.keeping import TaskKeeper
    from zres.broker.lineage import Lineage
    from zres.core.tasks import Task, TaskState

    def kept_done(keeper: TaskKeeper, task_id: int, deps: list[int]) -> None:
        task = Task(task_id, CLIENT, task_id, {}, 0, 0, f"t{task_id}", False,
                    [b"fn", b"args"], [], holders=1)
        task.recompute = True
        keeper.new(task, deps)
        task.outcome, task.size, task.held_at = P.OK, 100, ["agent-a"]
        task.state = TaskState.DONE
        keeper.changed(task)

    store = Store(str(tmp_path))
    clients = ClientRegistry(60.0, lambda client, event: None)
    clients.restore(CLIENT, "", 60.0).ids.update({1: 1, 2: 2})  # (it holds both)
    keeper = TaskKeeper(store, clients)
    kept_done(keeper, 1, [])
    kept_done(keeper, 2, [1])
    store.commit()
    store.close()
    graph = TaskGraph(on_ready=lambda task: None, on_recorded=lambda task: None)
    keeper = TaskKeeper(Store(str(tmp_path)), ClientRegistry(60.0, lambda c, e: None))
    keeper.restore(graph, graph.fail, lambda task, deps, agent: None,
                   lambda task, deps, agent, link: None, wait=60.0)
    again: list[Task] = []
    lineage = Lineage(graph, None, again.append, lambda task: None)  # type: ignore[arg-type]
    source, reader = graph.tasks[1], graph.tasks[2]
    source.held_at = reader.held_at = ()
    lineage.lost([source, reader], "agent agent-a (it did not come back)")
    assert again == [source] and source.payload == [b"fn", b"args"], source.lost
    assert "its inputs were not kept when the broker restarted" in reader.lost
