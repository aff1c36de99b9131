"""A plain task's small result goes from its worker process straight to the broker (the
agent is off its way back: agent/direct.py), its agent still told. Real broker, agent and
worker processes, keys on."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import zres
from tests.conftest import process_gone, raw_dealer, stop_process, wait_until
from tests.e2e.test_pipelining import make_short
from tests.tasks import hold, ledgered, starts, wait_for_file
from zres.core import keys
from zres.core import protocol as P

pytestmark = pytest.mark.timeout(120)
# (a stopped agent is not lost during a test, and its workers' results are taken straight
# for two heartbeats: see agent_link.on_direct_done)
SLOW_LOSS = {"heartbeat_interval": 1.0, "heartbeat_timeout": 20.0}


def noop(x: int = 0) -> int:
    return x


def shout_when(release: str, marker: str) -> str:
    print("before the result")
    hold(release, marker)
    Path(marker + ".ended").touch()
    return "shouted"


def pid() -> int:
    return os.getpid()


def big(n: int) -> bytes:
    return b"x" * n


def store_dir() -> str:
    return os.environ["ZRES_OBJECTS"].partition(":")[0]


def length(value: bytes, ledger: str, key: str, release: str) -> int:
    ledgered(ledger, key)
    wait_for_file(release)
    return len(value)


def touch(path: str) -> str:
    Path(path).touch()
    return path


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


def test_a_task_that_failed_to_read_its_input_runs_once_when_its_agent_was_stopped(
        make_cluster, make_client, tmp_path):
    """A failure the broker answers by granting the task again (its input could not be
    read: it ran nothing) goes its agent's way, never straight: else the broker granted it
    again to the same agent before that agent heard of the first end, whose copy was then
    taken for the new grant's, and the body ran twice with retries=0."""
    cluster = make_cluster(agents=[{"slot": 2, "other": 1, "CPU": 4}], names=["a"],
                           **SLOW_LOSS)
    client = make_client(cluster.address)
    ledger, warm = str(tmp_path / "ledger"), str(tmp_path / "warm")
    make_short(client, tmp_path)  # (hold, and length below: short kinds, queued in slots)
    zres.wait([client.submit(length, b"", warm, "w", warm, resources={"other": 1})
               for _ in range(10)], timeout=30)
    value = client.submit(big, 200_000, resources={"other": 1})  # (kept in a's store)
    zres.wait([value], timeout=30)
    path = os.path.join(client.submit(store_dir, resources={"other": 1}).result(30),
                        str(value.id))
    release, marker = str(tmp_path / "release"), str(tmp_path / "b")
    first = client.submit(hold, release, marker, resources={"slot": 2})
    wait_until(lambda: os.path.exists(marker), message="the first task to start")
    then = str(tmp_path / "then")
    x = client.submit(length, value, ledger, "x", then, resources={"slot": 1}, retries=0)
    after = client.submit(length, b"z", ledger, "z", then, resources={"slot": 1}, retries=0)
    wait_until(lambda: all("its worker holds it" in client.why(f) for f in (x, after)),
               message="both to be queued in the slot's worker")
    # (a task the broker grants after that reaches the worker after them)
    client.submit(touch, str(tmp_path / "y"), resources={"other": 1}).result(30)
    agent = cluster.agents["a"]
    os.rename(path, path + ".kept")
    Path(path).write_bytes(b"")  # (x cannot read its input: it ends InputLostError)
    stop_process(agent.pid)
    try:
        Path(release).touch()  # the worker starts both on its own; x fails at once
        wait_until(lambda: starts(ledger).get("z"), message="the task beside x to start")
        Path(then).touch()
        assert after.result(15) == 1  # (straight, after x's end: x went first)
        os.rename(path + ".kept", path)
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    assert x.result(30) == 200_000 and first.result(30) == "released"
    tasks = client.map(touch, [str(tmp_path / f"t{i}") for i in range(4)],
                       resources={"slot": 1})
    assert all(f.result(30) for f in tasks)  # (the slot's books hold: none is held up)
    wait_until(lambda: not {"running", "queued"} & set(client.status()["counts"]),
               message="nothing left running")
    assert starts(ledger) == {"x": 1, "z": 1}, "x (retries=0) ran twice"
