"""The broker's loop turns whatever anyone sends (issue 28): the broker stepped in this
thread, clients played by hand. A huge submit is taken across turns, and what its client
sends after it waits behind it, while everyone else is answered at once."""

from __future__ import annotations

import time

import pytest

from tests.broker.test_agent_link import Peer
from tests.broker.test_keeping import hello
from zres.broker.server import Broker
from zres.broker.store import Store
from zres.core import protocol as P
from zres.core.resources import UNIT

pytestmark = pytest.mark.timeout(60)


def two_clients(tmp_path) -> tuple[Broker, Peer, Peer]:
    """A broker keeping its state in TMP_PATH, with two clients welcomed: one to flood it,
    one whose requests must not wait behind the flood."""
    broker = Broker("tcp://127.0.0.1:0", prefetch=0, store=Store(str(tmp_path)))
    big, _ = hello(broker)
    other = Peer(broker, ident=b"client-2")
    other.send(P.HELLO, {"client": "other"})
    other.take(P.WELCOME)
    return broker, big, other


def test_a_huge_submit_is_taken_across_turns_and_holds_nobody_up(tmp_path):
    broker, big, other = two_clients(tmp_path)
    try:
        count = 20_000
        items = [[i, {"foo": UNIT}, 0, 0, [], 2, f"t{i}", False] for i in range(1, count + 1)]
        big.send(P.SUBMIT, {"tasks": items}, [b"fn", b"args"] * count)
        big.send(P.WHY, {"id": count, "req": 1})  # about its last task: after it is taken
        while not broker.sock.poll(0):
            time.sleep(0.001)  # (until the submit is there to be read, first)
        other.send(P.STATUS, {"req": 7})
        turns = 0
        while not other.sock.poll(0):
            broker.poll_once(time.monotonic(), timeout=0.05)
            turns += 1
            assert turns < 1000, "the other client's status was never answered"
        assert len(broker.graph.tasks) < count, \
            "the other client waited for the whole of a huge submit to be taken"
        why = big.take(P.WHY_REPLY)  # (stepping until it comes)
        assert len(broker.graph.tasks) == count
        assert not why.body["reason"].startswith("unknown task"), \
            f"its client's next message was answered before its submit was taken: {why.body}"
        accepted = [m.body["upto"] for m in big.inbox + big.sync() if m.kind == P.ACCEPTED]
        assert accepted[0] < count and accepted[-1] == count, "not acknowledged as taken"
    finally:
        for peer in (big, other):
            peer.close()
        broker.close()


def test_a_client_that_leaves_a_huge_graph_holds_nobody_up(tmp_path):
    broker, big, other = two_clients(tmp_path)
    try:
        count = 20_000
        for start in range(0, count, 1000):
            items = [[i, {"foo": UNIT}, 0, 0, [], 2, f"t{i}", False]
                     for i in range(start + 1, start + 1001)]
            big.send(P.SUBMIT, {"tasks": items}, [b"fn", b"args"] * 1000)
        big.sync()
        assert len(broker.graph.tasks) == count
        big.send(P.BYE, {})
        while broker.clients.get(b"client-1") is not None:
            broker.poll_once(time.monotonic(), timeout=0.05)
        assert broker.graph.tasks, "the turn its goodbye came in let go of all it held"
        other.sync()  # (answered while the rest is let go of, turn by turn)
        while broker.graph.tasks:
            broker.poll_once(time.monotonic(), timeout=0.01)
    finally:
        for peer in (big, other):
            peer.close()
        broker.close()


def test_the_longest_turn_is_told_in_the_loops_own_cpu_time_too(tmp_path):
    """status()["loop"] tells the longest turn's wall time and, apart, the longest turn's
    CPU time in the loop's thread: on a machine busy with other work a turn waits for a
    CPU far longer than it works, and the two tell those apart (bench/scale.py)."""
    broker = Broker("tcp://127.0.0.1:0", prefetch=0, store=Store(str(tmp_path)))
    schedule = broker.sched.schedule
    try:
        def asleep(now: float) -> object:  # (a turn that waits, using no CPU)
            time.sleep(0.3)
            return schedule(now)

        def working(now: float) -> object:  # (a turn that works 0.1 s of CPU)
            end = time.thread_time() + 0.1
            while time.thread_time() < end:
                pass
            return schedule(now)

        broker.sched.needs_pass = lambda: True  # type: ignore[method-assign]
        for slow in (asleep, working):
            broker.sched.schedule = slow  # type: ignore[method-assign]
            broker.poll_once(time.monotonic())
        loop = broker.status()["loop"]
        assert loop["longest_turn"] >= 0.3
        assert 0.1 <= loop["longest_turn_cpu"] < 0.3
    finally:
        broker.close()
