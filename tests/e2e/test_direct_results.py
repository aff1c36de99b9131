"""A plain task's small result goes from its worker process straight to the broker (the
agent is off its way back: agent/direct.py), its agent still told. Real broker, agent and
worker processes, keys on."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.conftest import process_gone, raw_dealer, stop_process, wait_until
from tests.tasks import hold
from zres.core import keys
from zres.core import protocol as P

pytestmark = pytest.mark.timeout(120)
SLOW_LOSS = {"heartbeat_timeout": 20.0}  # (a stopped agent is not lost during a test)


def noop(x: int = 0) -> int:
    return x


def shout_when(release: str, marker: str) -> str:
    print("before the result")
    hold(release, marker)
    Path(marker + ".ended").touch()
    return "shouted"


def pid() -> int:
    return os.getpid()


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0] == "T"


def test_a_result_reaches_its_client_while_its_agent_is_stopped(make_cluster, make_client,
                                                               tmp_path):
    """The agent is not on a result's way back: a task that ends while its agent is
    stopped (SIGSTOP) is done for its client at once; the agent, back, catches up and runs
    the next task in the slot the first one freed."""
    cluster = make_cluster(agents=[{"slot": 1}], names=["a"], **SLOW_LOSS)
    client = make_client(cluster.address)
    assert client.submit(noop, 1, resources={"slot": 1}).result(30) == 1
    release, marker = str(tmp_path / "release"), str(tmp_path / "started")
    future = client.submit(hold, release, marker, resources={"slot": 1}, retries=0)
    wait_until(lambda: os.path.exists(marker), message="the task to start")
    agent = cluster.agents["a"]
    stop_process(agent.pid)
    try:
        Path(release).touch()
        assert future.result(15) == "released"
        assert stopped(agent.pid), "the agent ran meanwhile: this proves nothing"
        assert future.agent == "a"
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    assert [f.result(30) for f in client.map(noop, range(5), resources={"slot": 1},
                                             retries=0)] == list(range(5))


def test_a_tasks_output_still_comes_before_its_result(make_cluster, make_client, tmp_path,
                                                      capsys: pytest.CaptureFixture[str]):
    """A task that printed sends its result its agent's way, behind that output: never
    straight, where it would overtake it."""
    cluster = make_cluster(agents=[{"slot": 1}], names=["a"], **SLOW_LOSS)
    client = make_client(cluster.address)
    assert client.submit(noop, 1).result(30) == 1
    release, marker = str(tmp_path / "release"), str(tmp_path / "started")
    future = client.submit(shout_when, release, marker, retries=0)
    wait_until(lambda: os.path.exists(marker), message="the task to start")
    agent = cluster.agents["a"]
    stop_process(agent.pid)
    try:
        Path(release).touch()
        wait_until(lambda: os.path.exists(marker + ".ended"), message="the task to end")
        with pytest.raises(TimeoutError):
            future.result(1.0)  # (its output is with the stopped agent, and so is it)
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    assert future.result(30) == "shouted"
    assert "before the result" in capsys.readouterr().out


def test_a_worker_killed_just_after_its_result_went_straight_loses_nothing(
        make_cluster, make_client, tmp_path):
    """Its agent's copy of the result may die with it: the agent then reports the task
    lost, which the broker, that has its result, ignores; the slot is free again."""
    cluster = make_cluster(agents=[{"slot": 1}], names=["a"])
    client = make_client(cluster.address)
    assert client.submit(noop, 1, resources={"slot": 1}).result(30) == 1
    for i in range(3):
        worker = client.submit(pid, resources={"slot": 1}, retries=0).result(30)
        os.kill(worker, signal.SIGKILL)  # (its copy to the agent is most likely unsent)
        wait_until(lambda w=worker: process_gone(w), message="the worker to die")
        assert client.submit(noop, i, resources={"slot": 1}, retries=0).result(30) == i


def test_only_an_agents_key_may_send_a_result_straight(make_cluster, make_client, tmp_path):
    """A client's key is refused, naming the kind; the task it named runs on untouched."""
    cluster = make_cluster(agents=[{"slot": 1}], names=["a"])
    client = make_client(cluster.address)
    release, marker = str(tmp_path / "release"), str(tmp_path / "started")
    future = client.submit(hold, release, marker, retries=0)
    wait_until(lambda: os.path.exists(marker), message="the task to start")
    sock = raw_dealer(cluster.address, keys.find(None, ("client",), cluster.address))
    try:
        P.send(sock, P.encode(P.DIRECT_DONE, {"session": 1, "epoch": 1, "results": [
            [1, P.OK, 1, {}, 1]], "started": [1]}, [b"forged"]))
        assert sock.poll(10_000), "the broker did not answer"
        refused = P.decode(sock.recv_multipart())
        assert refused.kind == P.REFUSED and refused.body.get("kind") == P.DIRECT_DONE
    finally:
        sock.close(0)
    Path(release).touch()
    assert future.result(30) == "released"
