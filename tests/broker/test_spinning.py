"""The broker's loop polls for a moment before it sleeps, while that catches messages
(zres.broker.spinning): it spins while messages come close together, stops once its spins
catch nothing (an idle broker sleeps), and its turns' CPU leaves the spinning out."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time

import pytest
import zmq

from tests.broker.test_agent_link import Peer
from tests.conftest import wait_until
from zres.broker.metrics import Traffic
from zres.broker.server import Broker
from zres.broker.spinning import _CREDIT, SpinningPoller
from zres.broker.store import Store
from zres.core import protocol as P

pytestmark = pytest.mark.timeout(60)
_names = itertools.count()


@pytest.fixture
def pair():
    """Two connected inproc sockets: the one polled, and the one that sends to it."""
    ctx = zmq.Context.instance()
    polled, sender = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    # (a name of its own each time: a closed socket lets go of its name only later)
    name = f"inproc://spinning-test-{next(_names)}"
    polled.bind(name)
    sender.connect(name)
    poller = zmq.Poller()
    poller.register(polled, zmq.POLLIN)
    yield poller, polled, sender
    for sock in (polled, sender):
        sock.close(0)


def test_spins_after_a_wait_that_ended_in_the_window_and_stops_once_spins_catch_nothing(pair):
    poller, polled, sender = pair
    traffic = Traffic()
    waiting = SpinningPoller(poller, 0.02, traffic)
    assert waiting.poll(30) == [] and traffic.spun == 0, "spun before anything came"
    sender.send(b"soon")  # (there at once: a wait that a spin would have caught)
    assert waiting.poll(1000) and polled.recv() == b"soon"
    waiting.fruitful = True  # (as the loop says of what a wait caught, other than beats)
    assert traffic.spun == 0, "a sleeping wait is no spin"

    def caught() -> bool:  # (again if the wait above ended past the window: descheduled)
        sender.send(b"caught")
        assert waiting.poll(1000) and polled.recv() == b"caught"
        waiting.fruitful = True
        return traffic.spun > 0

    wait_until(caught, timeout=20, message="a spin counted, having caught a message")
    spun = []
    for _ in range(_CREDIT + 3):  # (nothing comes: each spin a miss)
        assert waiting.poll(30) == []
        spun.append(traffic.spun)
    grew = [after > before for before, after in zip(spun, spun[1:])]
    assert grew[:_CREDIT - 1] == [True] * (_CREDIT - 1) and not any(grew[_CREDIT - 1:]), \
        f"did not stop spinning after {_CREDIT} misses: spun {spun}"
    assert spun[_CREDIT - 1] >= _CREDIT * 0.02, "a spin gave up before its window"


def test_never_spins_when_told_zero_or_when_the_loop_must_not_wait(pair):
    poller, polled, sender = pair
    for spin, timeout in ((0.0, 50), (0.02, 0)):
        traffic = Traffic()
        waiting = SpinningPoller(poller, spin, traffic)
        for _ in range(3):
            sender.send(b"x")
            while not waiting.poll(timeout):
                pass
            polled.recv()
            waiting.poll(timeout)  # (nothing: with a spin, a miss)
        assert traffic.spun == 0, f"spin={spin}, timeout={timeout}: spun {traffic.spun}"


def test_a_broker_reports_its_spinning_apart_from_its_turns_cpu(tmp_path):
    """status()["loop"]: the seconds spun, and a longest turn's CPU without them (the
    spinning is waiting, not a turn's work: bench/scale.py reads the longest turn)."""
    broker = Broker("tcp://127.0.0.1:0", prefetch=0, store=Store(str(tmp_path)), spin=0.3)
    peer = Peer(broker)
    try:
        peer.send(P.STATUS, {"req": 1})
        while not peer.sock.poll(0):  # (the wait that took it ended within the window)
            broker.poll_once(time.monotonic(), timeout=1.0)
        broker.poll_once(time.monotonic(), timeout=0.5)  # (nothing comes: it spins 0.3 s)
        loop = broker.status()["loop"]
        assert loop["spun"] >= 0.3
        assert loop["longest_turn_cpu"] < 0.2, f"the spin counted as a turn's work: {loop}"
    finally:
        peer.sock.close(0)
        broker.close()


def test_tells_when_other_threads_wait_for_a_cpu(monkeypatch):
    """What a spin yields to: more threads runnable than this process has CPUs (taken to
    be one here: two busy processes then suffice on a machine of any size)."""
    from zres.broker import spinning

    monkeypatch.setattr(spinning, "_cpus", 1)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        wait_until(spinning.others_wait_for_a_cpu, timeout=30,
                   message=f"{len(busy)} busy processes seen as waiting for a CPU")
    finally:
        for process in busy:
            process.kill()
            process.wait()


def test_waits_that_catch_only_what_may_wait_stop_the_spinning(pair):
    """``fruitful``: a wait that caught nothing worth catching early (heartbeats) is a
    miss, however soon it came: heartbeats close together do not keep an idle loop spinning."""
    poller, polled, sender = pair
    traffic = Traffic()
    waiting = SpinningPoller(poller, 0.02, traffic)
    sender.send(b"work")
    assert waiting.poll(1000) and polled.recv() == b"work"  # (came at once: it spins now)
    waiting.fruitful = True
    for _ in range(_CREDIT):
        sender.send(b"beat")  # (there at once: caught by the spin)
        assert waiting.poll(1000) and polled.recv() == b"beat"  # (not fruitful)
    spun = traffic.spun
    assert waiting.poll(30) == [] and traffic.spun == spun, "spun on after heartbeats alone"


def test_a_spin_that_caught_nothing_is_part_of_the_wait_not_added_to_it():
    """The loop's timeout bounds the whole wait: after a spin of 5 ms, a wait of 10 ms
    sleeps for at most the 5 left (its acknowledgements are due then)."""
    class Poller:
        def __init__(self):
            self.asked, self.events = [], [("sock", 1)]

        def poll(self, timeout_ms):
            self.asked.append(timeout_ms)
            events, self.events = self.events, []
            return events

    poller = Poller()
    waiting = SpinningPoller(poller, 0.005, Traffic())
    assert waiting.poll(10)  # (at once: it spins from now on)
    waiting.fruitful = True
    poller.asked.clear()
    assert waiting.poll(10) == []
    spins, slept = poller.asked[:-1], poller.asked[-1]
    assert spins and set(spins) == {0} and slept <= 5, poller.asked


def test_a_broker_stops_spinning_while_only_heartbeats_come(tmp_path):
    broker = Broker("tcp://127.0.0.1:0", prefetch=0, store=Store(str(tmp_path)), spin=0.3)
    peer = Peer(broker)
    try:
        peer.send(P.STATUS, {"req": 1})
        while not peer.sock.poll(0):  # (a wait that ended within the window: it spins)
            broker.poll_once(time.monotonic(), timeout=1.0)
        for _ in range(_CREDIT):
            peer.send(P.HEARTBEAT, {})
            broker.poll_once(time.monotonic(), timeout=1.0)  # (caught: a heartbeat)
        spun = broker.status()["loop"]["spun"]
        broker.poll_once(time.monotonic(), timeout=0.05)  # (nothing comes)
        assert broker.status()["loop"]["spun"] == spun, "spun on for heartbeats alone"
    finally:
        peer.sock.close(0)
        broker.close()


def test_a_cpu_quota_under_two_cpus_turns_the_default_spin_off(tmp_path):
    """A container's CPU limit (cgroup v2 ``cpu.max`` or v1's CFS quota, on the process's
    group or one above it): a spinning core would use it up and get the group throttled."""
    from zres.broker.spinning import DEFAULT_SPIN, cpu_quota, default_spin

    def tree(cgroup: str, files: dict[str, str]) -> tuple[str, str]:
        (tmp_path / "proc").mkdir(exist_ok=True)
        (tmp_path / "proc" / "cgroup").write_text(cgroup)
        root = tmp_path / "sys"
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        return str(tmp_path / "proc" / "cgroup"), str(root)

    v2 = tree("0::/kubepods/pod1/broker\n", {"cpu.max": "max 100000\n",
                                              "kubepods/pod1/cpu.max": "150000 100000\n",
                                              "kubepods/pod1/broker/cpu.max": "max 100000\n"})
    assert cpu_quota(*v2) == 1.5 and default_spin(*v2) == 0
    v2 = tree("0::/kubepods/pod1/broker\n", {"kubepods/pod1/cpu.max": "400000 100000\n"})
    assert cpu_quota(*v2) == 4 and default_spin(*v2) == DEFAULT_SPIN
    v1 = tree("4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n",
              {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
               "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota(*v1) == 0.5 and default_spin(*v1) == 0
    none = tree("1:cpu:/\n0::/\n", {"cpu/cpu.cfs_quota_us": "-1\n",
                                     "cpu/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota(*none) is None and default_spin(*none) == DEFAULT_SPIN
    assert cpu_quota(str(tmp_path / "missing"), str(tmp_path)) is None  # (not Linux)
