"""A thousand agents at one broker (issue 28 item 5): a broker stepped in this thread, and a
thousand agents' connections (plain sockets of this process speaking the agents'
protocol: a real agent each would be a thousand processes) beating when the test says."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from zres.broker import server
from zres.broker.server import Broker
from zres.broker.store import Store
from zres.core import protocol as P
from zres.core import versions
from zres.core.resources import UNIT

pytestmark = pytest.mark.timeout(120)

AGENTS = 1000
TIMEOUT, BEAT = 1.5, 0.25  # the broker's heartbeat timeout and interval, and the agents'


class Fleet:
    """AGENTS agents' connections, registered at BROKER."""

    def __init__(self, broker: Broker, agents: int = AGENTS) -> None:
        self.broker = broker
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.ctx.max_sockets = agents + 64
        self.socks, self.sessions = [], []
        for i in range(agents):
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(broker.address)
            session = random.getrandbits(62)
            P.send(sock, P.encode(P.REGISTER, {
                "name": f"node-{i}", "session": session, "host": "h", "pid": i,
                "t": time.monotonic(), "versions": versions.mine(),
                "slots": [{"units": {"CPU": 2 * UNIT}, "gpus": [], "gpu_memory": []}]}))
            self.socks.append(sock)
            self.sessions.append(session)
        self.quiet: set[int] = set()   # agents that no longer beat (stopped, say)
        self.until(lambda: len(broker.agents) == agents, "every agent to register")

    def beat(self) -> None:
        """Every agent not quiet beats, on its connection."""
        now = self._beaten = time.monotonic()
        for i, (sock, session) in enumerate(zip(self.socks, self.sessions)):
            if i not in self.quiet:
                P.send(sock, P.encode(P.HEARTBEAT, {"t": now, "session": session}))

    def step(self) -> None:
        """One turn of the broker's loop, the agents beating as often as they do."""
        if time.monotonic() - self._beaten >= BEAT:
            self.beat()
        self.broker.poll_once(time.monotonic(), timeout=0.005)

    _beaten = 0.0

    def until(self, condition: Callable[[], Any], what: str, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            self.step()

    def lost(self) -> list[str]:
        """Why each agent declared lost was (the broker told it so)."""
        return list(self.broker.agents.ended.values())

    def close(self) -> None:
        self.ctx.destroy(linger=0)


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    broker = Broker("tcp://127.0.0.1:0", heartbeat_interval=BEAT, heartbeat_timeout=TIMEOUT)
    fleet = Fleet(broker)
    yield fleet
    fleet.close()
    broker.close()


def test_a_thousand_agents_behind_long_turns_are_not_lost(fleet, monkeypatch):
    """1,000 agents beating throughout: a turn of twice the heartbeat timeout loses none;
    nor do turns that each read far fewer messages than the agents send (their beats wait
    unread, in the socket, for longer than the timeout); one that stops beating is still
    found silent, once everything it could have sent has been read."""
    broker = fleet.broker
    schedule = broker.sched.schedule

    def long_pass(now: float) -> Any:  # (the agents beat on while the loop is away)
        end = time.monotonic() + 2 * TIMEOUT
        while time.monotonic() < end:
            fleet.beat()
            time.sleep(BEAT)
        return schedule(now)

    monkeypatch.setattr(broker.sched, "needs_pass", lambda: True)
    monkeypatch.setattr(broker.sched, "schedule", long_pass)
    fleet.step()
    assert broker._traffic.longest_turn >= 2 * TIMEOUT
    monkeypatch.setattr(broker.sched, "schedule", schedule)
    fleet.until(lambda: not broker.sock.poll(0), "the beats sent meanwhile to be read")
    assert fleet.lost() == [] and len(broker.agents) == AGENTS

    # Turns of a fifth of the timeout, each reading 50 messages while the agents send a
    # thousand: an agent's turn to be read comes every twenty turns, 1.5 timeouts apart.
    def slow_pass(now: float) -> Any:
        fleet.beat()
        time.sleep(TIMEOUT / 5)
        return schedule(now)

    monkeypatch.setattr(server, "_BATCH", 50)
    monkeypatch.setattr(broker.sched, "schedule", slow_pass)
    end = time.monotonic() + 2 * TIMEOUT  # (each agent read once, 1.5 timeouts late)
    while time.monotonic() < end:
        fleet.step()
    assert broker.sock.poll(0), "the loop was never behind its messages"
    assert fleet.lost() == [] and len(broker.agents) == AGENTS
    monkeypatch.setattr(server, "_BATCH", 2000)
    monkeypatch.setattr(broker.sched, "schedule", schedule)
    fleet.until(lambda: not broker.sock.poll(0), "the loop to catch up")
    assert fleet.lost() == [] and len(broker.agents) == AGENTS

    fleet.quiet.add(7)
    fleet.until(lambda: fleet.lost(), "the agent that stopped beating to be found silent")
    assert len(fleet.lost()) == 1 and "silent" in fleet.lost()[0]
    assert broker.agents.named("node-7") is None and len(broker.agents) == AGENTS - 1


def test_lost_agents_and_name_bindings_are_kept_across_a_restart_in_either_form(tmp_path):
    """What a broker keeps of the agents it declared lost (so that a restarted one does not
    take their work back) and of which key each agent name is bound to: written as the
    registry's own maps at the next commit however many changed, and read back; a list
    of [id, why] pairs, as earlier versions kept lost agents, is read too."""
    store = Store(str(tmp_path))
    store.set_meta("ended_agents", [[b"old-agent", "silent for 3.1s"]])
    store.commit()
    broker = Broker("tcp://127.0.0.1:0", heartbeat_interval=BEAT, heartbeat_timeout=TIMEOUT,
                    store=store)
    assert broker.agents.ended == {b"old-agent": "silent for 3.1s"}
    fleet = Fleet(broker, 3)
    try:
        fleet.quiet.update(range(3))
        fleet.until(lambda: len(fleet.lost()) == 4, "the three agents to be found silent")
        broker.agents.bind("node-0", "agent:agent")
        assert store.commit()
    finally:
        fleet.close()
        broker.close()
    store = Store(str(tmp_path))
    broker = Broker("tcp://127.0.0.1:0", store=store)
    try:
        assert list(broker.agents.ended)[0] == b"old-agent" and len(broker.agents.ended) == 4
        assert all("silent" in why for why in broker.agents.ended.values())
        assert broker.agents.name_keys == {"node-0": "agent:agent"}
    finally:
        broker.close()
