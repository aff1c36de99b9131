"""An agent's heartbeats and its lease, whatever its loop is busy with (issue 28): a
broker and an agent stepped in this thread (the agent's loop runs only when the test
steps it), the agent's heartbeat thread running on its own, command jobs for real."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.conftest import wait_until
from zres.agent.daemon import Agent
from zres.agent.slots import plan_slots
from zres.broker.server import Broker
from zres.core import protocol as P
from zres.core.resources import UNIT, parse_spec

pytestmark = pytest.mark.timeout(60)


class Stepped:
    """A broker and an agent of this process, each turning only when told to."""

    def __init__(self, tmp_path: Path, timeout: float = 3.0) -> None:
        self.broker = Broker("tcp://127.0.0.1:0", heartbeat_interval=0.2,
                             heartbeat_timeout=timeout)
        self.agent = Agent(self.broker.address,
                           plan_slots(parse_spec("CPU=500"), 1, 2, detect=False), name="node",
                           heartbeat_interval=0.2, heartbeat_timeout=timeout,
                           state=str(tmp_path / "agent"))
        self.client = zmq.Context.instance().socket(zmq.DEALER)
        self.client.setsockopt(zmq.LINGER, 0)
        self.client.connect(self.broker.address)

    def step(self, agent: bool = True) -> None:
        self.broker.poll_once(time.monotonic(), timeout=0.005)
        if agent:
            self.agent.poll_once(time.monotonic(), timeout=0.005)

    def until(self, condition: Callable[[], Any], what: str, agent: bool = True) -> None:
        deadline = time.monotonic() + 20
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            self.step(agent)

    def registered(self) -> bool:
        return any(a.name == "node" for a in self.broker.agents.by_ident.values())

    def close(self) -> None:
        self.client.close(0)
        self.agent.shutdown()
        self.broker.close()


@pytest.fixture
def stepped(tmp_path: Path) -> Iterator[Stepped]:
    pair = Stepped(tmp_path)
    yield pair
    pair.close()


@pytest.fixture
def short_lease(tmp_path: Path) -> Iterator[Stepped]:
    """A pair whose timeout is 1 s: its lease, 0.6 s, lapses sooner than at 3 s (2.6 s)."""
    pair = Stepped(tmp_path, timeout=1.0)
    yield pair
    pair.close()


def test_an_agent_whose_loop_is_busy_is_not_lost_and_one_stuck_for_good_is(tmp_path):
    pair = Stepped(tmp_path, timeout=1.0)
    try:
        pair.until(lambda: pair.agent.session.registered, "registration")
        pair.agent.heartbeat.start()
        # The agent's loop does not turn for three times the broker's timeout: its
        # heartbeat thread keeps it alive, and its lease too.
        busy_until = time.monotonic() + 3.0
        while time.monotonic() < busy_until:
            pair.step(agent=False)
            assert pair.registered(), "a busy agent was declared lost"
        assert pair.agent.session.valid(), "its lease lapsed while it was alive"
        # Stuck for longer than its heartbeat thread covers (four times the timeout): the
        # broker gives up on it, as on any silent agent.
        pair.until(lambda: not pair.registered(), "a stuck agent to be declared lost",
                   agent=False)
    finally:
        pair.close()


def test_an_ack_that_comes_after_the_lease_lapsed_starts_nothing(short_lease, tmp_path):
    pair = short_lease
    pair.until(lambda: pair.agent.session.registered, "registration")
    marks = tmp_path / "started"
    marks.mkdir()
    items = [[i, {"CPU": UNIT}, 0, 0, [], 0, f"job-{i}", False,
              {"job": {"argv": ["touch", str(marks / str(i))], "env": {}, "cwd": None,
                       "detached": False}}] for i in range(1, 201)]
    P.send(pair.client, P.encode(P.HELLO, {"client": "c"}))
    P.send(pair.client, P.encode(P.SUBMIT, {"tasks": items}))
    # The broker grants the 200 jobs; the agent holds them and says so, and waits for the
    # broker's ack to start them (its loop stepped alone: the broker hears nothing yet).
    pair.until(lambda: len(pair.agent.runner.placements) == 200, "the grants to arrive")
    pair.agent.poll_once(time.monotonic(), timeout=0.005)  # (its report goes out)
    wait_until(lambda: not pair.agent.session.valid(), message="the agent's lease to lapse")
    # Now the broker takes the report in and acknowledges it: the agent, its lease gone,
    # must not start the jobs on that ack (the broker may have given up on it already).
    acked = pair.agent.reports.seq
    pair.until(lambda: pair.broker.agents.by_ident and
               next(iter(pair.broker.agents.by_ident.values())).acked >= acked,
               "the broker to acknowledge the held jobs", agent=False)
    pair.agent.poll_once(time.monotonic(), timeout=0.05)  # (the ack is read)
    assert not pair.agent.jobs.jobs and not list(marks.iterdir()), \
        "jobs started on an ack that came after the lease lapsed"
    # Once the broker echoes a heartbeat again, the lease holds and they all start.
    pair.until(lambda: len(list(marks.iterdir())) == 200, "the jobs to start")


def test_the_heartbeat_thread_beats_only_while_the_loops_beats_go_unechoed(stepped,
                                                                           monkeypatch):
    """While the agent's loop beats and the broker echoes it, its heartbeat thread sends
    nothing (each of its beats costs the broker two messages); once the loop stops turning,
    it beats (and the agent is kept, as above)."""
    pair = stepped
    pair.until(lambda: pair.agent.session.registered, "registration")
    sides: list[float] = []
    side_beat = pair.broker.link.on_side_beat
    monkeypatch.setattr(pair.broker.link, "on_side_beat",
                        lambda *a: sides.append(time.monotonic()) or side_beat(*a))
    pair.agent.heartbeat.start()
    until = time.monotonic() + 20 * 0.2  # (twenty of its intervals)
    while time.monotonic() < until:
        pair.step()
    assert len(sides) <= 5, f"{len(sides)} side beats in twenty intervals"
    busy_until = time.monotonic() + 1.0
    while time.monotonic() < busy_until:
        pair.step(agent=False)
    assert len(sides) >= 2 and pair.registered()
