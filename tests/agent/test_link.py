"""The link between an agent and its workers: whole messages in order, both ways, any size;
the agent's end never waits; only the agent's own workers get in."""

from __future__ import annotations

import array
import os
import socket
import struct
import subprocess
import sys
import threading

import pytest

from tests.conftest import wait_until
from zres.agent.link import AgentLink, LinkClosed, WorkerLinks

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def links(tmp_path):
    made = []

    def make(allowed=lambda name, pid: name == b"w1" and pid == os.getpid()):
        made.append(WorkerLinks(str(tmp_path / "workers"), allowed))
        return made[-1]

    yield make
    for each in made:
        each.close()


def _receive(links, count, timeout=20.0):
    got = []
    wait_until(lambda: got.extend(links.receive()) or len(got) >= count, timeout=timeout,
               interval=0.001, message=f"{count} messages at the agent")
    return got


def _read(link, count):
    got = []
    wait_until(lambda: got.extend(link.read()) or len(got) >= count, interval=0.001,
               message=f"{count} messages at the worker")
    return got


def _ready(agent):
    """A worker's end, connected as w1 and heard by the agent."""
    worker = AgentLink(agent.path, b"w1")
    worker.send([b"ready"])
    _receive(agent, 1)
    return worker


def test_messages_arrive_whole_and_in_order_both_ways(links):
    agent = links()
    worker = AgentLink(agent.path, b"w1")
    sent = [[b"head %d" % i, b"", b"x" * (i * 37)] for i in range(300)]
    sent.append([b"big", os.urandom(3_000_001), b"", b"tail"])  # past one read's chunk
    sent.append([array.array("d", [1.5, 2.5])])                # items of 8 bytes
    for frames in sent:
        worker.send(frames)
    got = _receive(agent, len(sent))
    assert [name for name, _ in got] == [b"w1"] * len(sent)
    assert [[bytes(f) for f in frames] for _, frames in got] == \
        [[bytes(f) for f in frames] for frames in sent]
    for frames in sent:
        agent.send(b"w1", frames)
    back = _read(worker, len(sent))
    assert [[bytes(f) for f in frames] for frames in back] == \
        [[bytes(f) for f in frames] for frames in sent]
    worker.close()


def test_the_agents_end_never_waits_for_a_worker_that_does_not_read(links):
    agent = links()
    worker = _ready(agent)
    big = os.urandom(8 * 1024 * 1024)
    done = threading.Event()

    def flood():  # far more than the kernel's buffers hold, nobody reading
        for i in range(8):
            agent.send(b"w1", [b"%d" % i, big])
        done.set()

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    assert done.wait(10), "the agent's send waited for the worker"
    got = []

    def drained():  # the agent writes what waited as room frees
        agent.receive()
        got.extend(worker.read())
        return len(got) == 8

    wait_until(drained, interval=0.001, message="all eight read")
    assert [bytes(frames[0]) for frames in got] == [b"%d" % i for i in range(8)]
    assert all(bytes(frames[1]) == big for frames in got)
    worker.close()


def test_a_stranger_is_refused_and_heard_nothing(links):
    agent = links()
    stranger = AgentLink(agent.path, b"someone-else")  # a name the agent never gave
    stranger.send([b"done", b"forged result"])
    for _ in range(50):
        assert agent.receive() == []
    agent.send(b"someone-else", [b"run"])
    with pytest.raises(LinkClosed):
        wait_until(lambda: stranger.read() and False, timeout=5, interval=0.001)
    stranger.close()


def test_a_worker_name_from_another_process_is_refused(links, tmp_path):
    """The name alone is not enough: the kernel says which process connected."""
    agent = links()
    script = ("import sys\nfrom zres.agent.link import AgentLink, LinkClosed\n"
              "link = AgentLink(sys.argv[1], b'w1')\nlink.send([b'forged'])\n"
              "try:\n    while not link.read():\n        pass\nexcept LinkClosed:\n"
              "    sys.exit(0)\nsys.exit(1)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, agent.path],
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    got = []
    wait_until(lambda: got.extend(agent.receive()) or proc.poll() is not None,
               interval=0.001, message="the other process cut off")
    assert proc.returncode == 0 and got == []
    real = AgentLink(agent.path, b"w1")
    real.send([b"ok"])
    assert [bytes(f) for _, frames in _receive(agent, 1) for f in frames] == [b"ok"]
    real.close()


def test_each_end_hears_the_other_go(links):
    agent = links()
    worker = _ready(agent)
    worker.close()
    for _ in range(20):
        agent.receive()  # (the agent drops it: nothing raised, nothing delivered)
    agent.send(b"w1", [b"to nobody"])
    second = _ready(agent)
    agent.close()
    with pytest.raises(LinkClosed):
        wait_until(lambda: second.read() and False, timeout=5, interval=0.001)
    with pytest.raises(LinkClosed):
        for _ in range(1000):
            second.send([b"x" * 65536])
    second.close()


@pytest.mark.parametrize("garbage", [
    b"\xff" * 64,                                           # billions of frames
    struct.pack("<IQ", 1, 1 << 62) + b"x" * 64,              # a frame of 4 EiB
], ids=["frames", "bytes"])
def test_a_garbage_stream_is_cut_off(links, garbage):
    agent = links(lambda name, pid: True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(agent.path)
    sock.sendall(garbage)
    for _ in range(50):
        assert agent.receive() == []
    sock.settimeout(5)
    assert sock.recv(10) == b""  # closed by the agent
    sock.close()
