"""A worker process's way straight to the broker (zres.agent.direct), against a ROUTER
socket standing in for the broker: which results go straight, and when the agent's copy
is kept back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from tests.conftest import wait_until
from zres.agent.data.worker_side import INLINE
from zres.agent.direct import LATER, DirectResults
from zres.core import protocol as P

pytestmark = pytest.mark.timeout(30)
VIA = [7, 99]  # session, epoch


@pytest.fixture
def broker() -> Iterator[zmq.Socket]:
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")
    yield sock
    sock.close(0)


def connected(broker: zmq.Socket) -> DirectResults:
    direct = DirectResults()
    direct.connect({"address": broker.getsockopt(zmq.LAST_ENDPOINT).decode()})
    # (nothing goes before the connection is made: ZMQ_IMMEDIATE)
    wait_until(lambda: straight(direct, [1]) is not None and _drain(broker),
               message="the connection to be made")
    direct.take_later()
    return direct


def _drain(broker: zmq.Socket) -> bool:
    got = False
    while broker.poll(50):
        broker.recv_multipart()
        got = True
    return got


def straight(direct: DirectResults, ids: list[int], info: dict[str, Any] | None = None,
             frames: list[bytes] | None = None, context: dict[str, Any] | None = None,
             more: Any = None, turns_by: float | None = None) -> bool:
    """Start IDS with CONTEXT, then end them (each one frame); return whether the agent's
    copy is kept back."""
    for task_id in ids:
        direct.note(task_id, {"via": VIA, "attempt": 3, **(context or {})})
    items = [[task_id, P.OK, 1, dict(info or {})] for task_id in ids]
    return direct.sent(items, frames or [b"r"] * len(ids), ids, more, lambda: [b"copy"],
                       time.monotonic() if turns_by is None else turns_by)


def test_a_small_result_goes_straight_naming_its_grant(broker: zmq.Socket):
    direct = connected(broker)
    assert straight(direct, [5]), "the agent's copy was not kept back"
    assert broker.poll(5000)
    msg = P.decode(broker.recv_multipart()[1:])
    assert msg.kind == P.DIRECT_DONE
    assert (msg.body["session"], msg.body["epoch"]) == tuple(VIA)
    assert msg.body["results"] == [[5, P.OK, 1, {}, 3]] and msg.body["started"] == [5]
    assert direct.take_later() == [[b"copy"]]


@pytest.mark.parametrize("why", ["printed", "stored", "bound to cores", "too many", "too big",
                                 "no via"])
def test_what_goes_the_agents_way_only(broker: zmq.Socket, why: str):
    direct = connected(broker)
    ids = [1, 2, 3] if why == "too many" else [1]
    if why == "printed":
        direct.note(1, {"via": VIA})
        direct.printed(1)
    kept = straight(direct, ids, info={"stored": 10} if why == "stored" else None,
                    frames=[b"x" * (2 * INLINE + 1)] if why == "too big" else None,
                    context={"cpus": [0]} if why == "bound to cores" else
                    {"via": None} if why == "no via" else None) if why != "printed" else \
        direct.sent([[1, P.OK, 1, {}]], [b"r"], [1], None, lambda: [b"copy"],
                    time.monotonic())
    assert not kept and direct.later == []
    assert not broker.poll(200), f"a result {why} went straight"


def test_the_agents_copy_goes_at_once_when_it_says_more_or_the_loop_is_not_due(
        broker: zmq.Socket):
    direct = connected(broker)
    assert not straight(direct, [1], more=[9]), "a copy telling of a dropped grant waited"
    assert not straight(direct, [2], turns_by=time.monotonic() + 10 * LATER), \
        "a copy waited for a main thread that does not turn soon"
    assert _drain(broker), "the results themselves did not go straight"


def test_a_worker_told_a_bad_address_sends_everything_the_agents_way():
    direct = DirectResults()
    direct.connect({"address": "nonsense://here"})
    assert not straight(direct, [1])
    direct.connect({})  # (and a spec without one)
    assert not straight(direct, [2])
