"""Failures are normal: lost agents, dying workers, broker restarts, hostile frames,
clients that vanish. Every test runs real broker and agent processes on loopback and
orders events by waiting on files and on the broker's status, never by sleeping."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

import zres
from tests.conftest import LOSS, process_gone, raw_dealer, stop_process, wait_until
from tests.tasks import hold, wait_for_file
from zres.core import protocol as P
from zres.local import request

HB = {"ZRES_BROKER__HEARTBEAT_INTERVAL": "0.2", "ZRES_BROKER__HEARTBEAT_TIMEOUT": "2.0",
      "ZRES_AGENT__HEARTBEAT_INTERVAL": "0.2", "ZRES_AGENT__HEARTBEAT_TIMEOUT": "2.0"}


# -- task functions (they travel by value to the worker processes) ----------------------------

def first_attempt_blocks(workdir: str) -> str:
    """First attempt: write the agent's name to WORKDIR/started, block until WORKDIR/release.

    Any later attempt (a retry) returns the agent's name at once.
    """
    agent = zres.get_task_context().agent
    started = os.path.join(workdir, "started")
    tmp = f"{started}.{os.getpid()}.{threading.get_ident()}"
    Path(tmp).write_text(agent)
    try:
        os.link(tmp, started)  # atomic: exactly one attempt is the first
    except FileExistsError:
        return agent
    finally:
        os.unlink(tmp)
    wait_for_file(os.path.join(workdir, "release"))
    return agent


def where() -> str:
    return zres.get_task_context().agent


def square(x: int) -> int:
    return x * x


def exit_worker(code: int, log: str) -> None:
    with open(log, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    os._exit(code)


def kill_worker() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def exit_on_first_attempt(marker: str) -> int:
    """Kill the worker process the first time; succeed (returning the pid) afterwards."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return os.getpid()
    os._exit(3)


# -- helpers ------------------------------------------------------------------------------------

@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """A directory for markers; WORKDIR/release is created at teardown, so that every
    blocked task (also in an orphaned worker of a killed agent) ends."""
    yield tmp_path
    (tmp_path / "release").touch()


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZRES_")}
    env.update(HB)
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_broker(spawn: Any, address: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
    """Start ``zres broker`` and wait until it serves (its loop answers a status request)."""
    proc = spawn([sys.executable, "-m", "zres", "broker", "--listen", address, *args],
                 stdout=subprocess.PIPE, env=clean_env(**env))
    line = proc.stdout.readline().decode()
    assert line.startswith("zres broker serving "), line
    request(address, P.STATUS, {}, timeout=20)
    return proc


def start_agent(spawn: Any, address: str, name: str, resources: str) -> subprocess.Popen[bytes]:
    return spawn([sys.executable, "-m", "zres", "agent", address, "--name", name,
                  "--resources", resources, "--no-detect", "--nthreads", "2"], env=clean_env())


def agent_names(address: str) -> set[str]:
    try:
        return {a["name"] for a in request(address, P.STATUS, {}, timeout=5)["agents"]}
    except zres.ZresError:
        return set()


def counts(cluster: zres.LocalCluster) -> dict[str, int]:
    return cluster.status()["counts"]


def kill(proc: subprocess.Popen[Any]) -> None:
    proc.kill()
    proc.wait(10)


# -- 1. agents lost mid-task ---------------------------------------------------------------------

def test_agent_killed_mid_task_is_retried_on_another_agent(make_cluster, make_client,
                                                           workdir):
    cluster = make_cluster(agents=[{"slot": 1}, {"slot": 1}], names=["node-a", "node-b"], **LOSS)
    client = make_client(cluster.address)
    future = client.submit(first_attempt_blocks, str(workdir), resources={"slot": 1},
                           retries=1)
    started = workdir / "started"
    first = wait_until(lambda: started.exists() and started.read_text(),
                       message="the first attempt to start")
    killed_at = time.monotonic()
    cluster.agents[first].kill()
    cluster.agents[first].wait(10)
    other = ({"node-a", "node-b"} - {first}).pop()
    assert future.result(30) == other
    assert future.agent == other
    wait_until(lambda: agent_names(cluster.address) == {other}, timeout=10,
               message=f"{first} to leave the status")
    assert time.monotonic() - killed_at < 15


def test_agent_killed_mid_task_without_retries_raises_agent_lost(make_cluster, make_client,
                                                                  workdir):
    cluster = make_cluster(agents=[{"slot": 1}, {"slot": 1}], names=["node-a", "node-b"], **LOSS)
    client = make_client(cluster.address)
    future = client.submit(first_attempt_blocks, str(workdir), resources={"slot": 1},
                           retries=0)
    started = workdir / "started"
    first = wait_until(lambda: started.exists() and started.read_text(),
                       message="the task to start")
    killed_at = time.monotonic()
    kill(cluster.agents[first])
    with pytest.raises(zres.AgentLostError, match=first):
        future.result(30)
    assert time.monotonic() - killed_at < 15
    wait_until(lambda: first not in agent_names(cluster.address), timeout=10,
               message=f"{first} to leave the status")
    # The surviving agent keeps working.
    other = ({"node-a", "node-b"} - {first}).pop()
    assert client.submit(where, resources={"slot": 1}).result(30) == other


def test_lost_agent_disappears_from_client_status(make_cluster, make_client):
    cluster = make_cluster(agents=[{"slot": 1}, {"slot": 1}], names=["node-a", "node-b"], **LOSS)
    client = make_client(cluster.address)
    assert {a["name"] for a in client.status()["agents"]} == {"node-a", "node-b"}
    killed_at = time.monotonic()
    kill(cluster.agents["node-a"])
    wait_until(lambda: [a["name"] for a in client.status()["agents"]] == ["node-b"],
               timeout=10, message="node-a to leave client.status()")
    assert time.monotonic() - killed_at < 10


def test_queued_task_is_not_charged_when_its_agent_dies(make_cluster, make_client, workdir):
    cluster = make_cluster(agents=[{"slot": 1}], names=["node-a"], **LOSS)
    client = make_client(cluster.address)
    running = client.submit(first_attempt_blocks, str(workdir), resources={"slot": 1},
                            retries=0)
    wait_until(lambda: (workdir / "started").exists(), message="the first task to start")
    queued = client.submit(where, resources={"slot": 1}, retries=0)
    wait_until(lambda: counts(cluster).get("queued") == 1, message="the second task to queue")
    assert "needs" in client.why(queued)
    kill(cluster.agents["node-a"])
    with pytest.raises(zres.AgentLostError, match="node-a"):
        running.result(30)
    # The queued task never ran: it is not charged, and runs when an agent can take it.
    assert not queued.done()
    cluster.add_agent({"slot": 1}, name="node-b")
    assert queued.result(30) == "node-b"


def test_a_granted_task_never_waits_for_a_worker_thread(make_cluster, make_client, workdir):
    # Tasks asking CPU=0 are granted beyond the slot's thread count. Each starts at once in
    # a thread of its own, so "assigned" means "running": an agent loss charges only tasks
    # that were really running, and nothing queues on the agent behind a busy thread.
    cluster = make_cluster(agents=[{"slot": 2}], nthreads=1, names=["node-a"], **LOSS)
    client = make_client(cluster.address)
    running = client.submit(first_attempt_blocks, str(workdir),
                            resources={"slot": 1, "CPU": 0}, retries=0)
    wait_until(lambda: (workdir / "started").exists(), message="the first task to start")
    beside = client.submit(where, resources={"slot": 1, "CPU": 0}, retries=0)
    assert beside.result(30) == "node-a"
    assert not running.done()
    kill(cluster.agents["node-a"])
    with pytest.raises(zres.AgentLostError):
        running.result(30)


def test_each_lost_running_attempt_spends_one_retry(make_cluster, make_client, workdir):
    # Two agents die one after the other under the same task; with retries=1 the second
    # loss exhausts the budget.
    cluster = make_cluster(agents=[{"slot": 1}, {"slot": 1}], names=["node-a", "node-b"], **LOSS)
    client = make_client(cluster.address)
    release, marker_a = str(workdir / "release"), str(workdir / "started-a")

    future = client.submit(hold, release, marker_a, resources={"slot": 1}, retries=1)
    wait_until(lambda: os.path.exists(marker_a), message="the first attempt")
    # Which agent runs it: the one whose slot is in use.
    busy = wait_until(lambda: next((a["name"] for a in cluster.status()["agents"]
                                    if a["slots"][0]["running"]), None))
    other = ({"node-a", "node-b"} - {busy}).pop()
    os.unlink(marker_a)
    kill(cluster.agents[busy])
    wait_until(lambda: os.path.exists(marker_a), message="the retry to start")
    assert busy not in agent_names(cluster.address)
    kill(cluster.agents[other])
    with pytest.raises(zres.AgentLostError, match=other):
        future.result(30)


def test_paused_agent_is_declared_lost_and_rejoins_when_resumed(make_cluster, make_client,
                                                                workdir):
    # SIGSTOP stands in for a network partition: the agent goes silent, its task is retried
    # elsewhere; once resumed it finds the broker has forgotten it and registers again.
    cluster = make_cluster(agents=[{"slot": 1, "a": 1}, {"slot": 1, "b": 1}],
                           names=["node-a", "node-b"], **LOSS)
    client = make_client(cluster.address)
    future = client.submit(first_attempt_blocks, str(workdir), resources={"slot": 1},
                           retries=1)
    started = workdir / "started"
    first = wait_until(lambda: started.exists() and started.read_text(),
                       message="the first attempt to start")
    other = ({"node-a", "node-b"} - {first}).pop()
    paused = cluster.agents[first]
    stop_process(paused.pid)
    try:
        assert future.result(30) == other
        assert first not in agent_names(cluster.address)
    finally:
        paused.send_signal(signal.SIGCONT)
    wait_until(lambda: first in agent_names(cluster.address), timeout=20,
               message=f"{first} to register again")
    mine = {"node-a": "a", "node-b": "b"}[first]
    assert client.submit(where, resources={mine: 1}).result(30) == first
    assert client.submit(where, resources={"slot": 1, mine: 1}).result(30) == first


def test_two_live_agents_with_the_same_name_do_not_evict_each_other_forever(
        make_cluster, make_client):
    # A second agent started by mistake under a name in use must not make the two take
    # turns evicting each other (each eviction fails the tasks running there).
    cluster = make_cluster(agents=[{"slot": 1}], names=["twin"])
    client = make_client(cluster.address)
    original = cluster.agents["twin"]
    duplicate = cluster.add_agent({"slot": 1}, name="twin", wait=False)
    cluster.agents["twin-original"] = original  # so that the cluster stops both
    wait_until(lambda: any(a["pid"] == duplicate.pid for a in cluster.status()["agents"])
               or duplicate.poll() is not None, message="the duplicate to register or exit")
    futures = [client.submit(time.sleep, 0.3, resources={"slot": 1}, retries=0)
               for _ in range(5)]
    errors = [f.exception(60) for f in futures]
    assert errors == [None] * 5, f"tasks failed: {errors}"


def test_client_without_a_broker_gives_up_with_a_clear_error():
    address = f"tcp://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(zres.ZresError, match="no zres broker answered"):
        zres.Client(address, connect_timeout=0.5)
    assert time.monotonic() - started < 10


# -- 2. restarted agents -----------------------------------------------------------------------

def test_restarted_agent_registers_again_and_runs_tasks(make_cluster, make_client):
    cluster = make_cluster(agents=[{"slot": 1}], names=["node-r"], **LOSS)
    client = make_client(cluster.address)
    assert client.submit(where, resources={"slot": 1}).result(30) == "node-r"
    kill(cluster.agents["node-r"])
    wait_until(lambda: "node-r" not in agent_names(cluster.address), timeout=10,
               message="node-r to be declared lost")
    cluster.add_agent({"slot": 1}, name="node-r")
    assert agent_names(cluster.address) == {"node-r"}
    assert client.submit(where, resources={"slot": 1}).result(30) == "node-r"
    assert [f.result(30) for f in client.map(square, range(5), resources={"slot": 1})] == \
        [0, 1, 4, 9, 16]


def test_agent_restarted_before_its_loss_is_noticed_replaces_the_old_one(
        make_cluster, make_client, spawn, workdir):
    # A long heartbeat timeout: the old agent is replaced by name, not by silence.
    cluster = make_cluster(agents=[{"slot": 1}], names=["node-r"], heartbeat_timeout=60.0)
    client = make_client(cluster.address)
    running = client.submit(first_attempt_blocks, str(workdir), resources={"slot": 1},
                            retries=0)
    wait_until(lambda: (workdir / "started").exists(), message="the task to start")
    old_pid = cluster.status()["agents"][0]["pid"]
    kill(cluster.agents["node-r"])
    new = spawn([sys.executable, "-m", "zres", "agent", cluster.address,
                 "--keys", cluster.keys, "--name", "node-r",
                 "--resources", "slot=1", "--no-detect"],
                env=clean_env(ZRES_AGENT__HEARTBEAT_TIMEOUT="60.0"))
    with pytest.raises(zres.AgentLostError, match="node-r"):
        running.result(30)
    agents = cluster.status()["agents"]
    assert [a["name"] for a in agents] == ["node-r"]
    assert agents[0]["pid"] == new.pid != old_pid
    assert client.submit(where, resources={"slot": 1}).result(30) == "node-r"


# -- 3. worker processes dying -------------------------------------------------------------------

def test_worker_exiting_mid_task_raises_worker_lost(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"slot": 1}], names=["node-w"])
    client = make_client(cluster.address)
    log = str(tmp_path / "attempts")
    with pytest.raises(zres.WorkerLostError, match="exited with code 3"):
        client.submit(exit_worker, 3, log, retries=0).result(30)
    with pytest.raises(zres.WorkerLostError, match="SIGKILL"):
        client.submit(kill_worker, retries=0).result(30)
    # Other tasks keep running afterwards, in a fresh worker process.
    assert [f.result(30) for f in client.map(square, range(8))] == [x * x for x in range(8)]
    assert client.submit(where, resources={"slot": 1}).result(30) == "node-w"
    assert Path(log).read_text().count("\n") == 1


def pid() -> int:
    return os.getpid()


def test_worker_that_died_while_idle_does_not_fail_the_next_task(make_cluster, make_client):
    # A worker process killed between tasks (say by the OOM killer) has run nothing since:
    # the next task must start in a fresh worker, not fail with WorkerLostError. The agent
    # is paused while that happens, so the task reaches it before it has seen the death.
    cluster = make_cluster(agents=[{"slot": 1}], names=["node-w"], heartbeat_timeout=10.0)
    client = make_client(cluster.address)
    worker = client.submit(pid).result(30)
    agent = cluster.agents["node-w"]
    stop_process(agent.pid)
    try:
        os.kill(worker, signal.SIGKILL)
        wait_until(lambda: process_gone(worker), message="the worker to die")
        future = client.submit(pid, retries=0)
        wait_until(lambda: cluster.status()["counts"].get("running") == 1,
                   message="the broker to hand the task to the paused agent")
    finally:
        agent.send_signal(signal.SIGCONT)
    assert future.result(30) != worker


def test_worker_lost_task_is_retried_when_retries_allow(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"slot": 1}], names=["node-w"])
    client = make_client(cluster.address)
    marker = str(tmp_path / "died-once")
    pid = client.submit(exit_on_first_attempt, marker, retries=1).result(30)
    assert os.path.exists(marker)
    assert isinstance(pid, int) and pid != os.getpid()
    assert [f.result(30) for f in client.map(square, range(4))] == [0, 1, 4, 9]


def test_worker_lost_retries_are_limited(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"slot": 1}], names=["node-w"])
    client = make_client(cluster.address)
    log = tmp_path / "attempts"
    with pytest.raises(zres.WorkerLostError, match="exited with code 4"):
        client.submit(exit_worker, 4, str(log), retries=2).result(30)
    assert log.read_text().count("\n") == 3, "one attempt plus two retries"
    assert client.submit(square, 7).result(30) == 49


# -- 4. broker restart ----------------------------------------------------------------------

def test_broker_restart_without_its_state_fails_pending_tasks_and_everyone_reconnects(
        spawn, make_client, workdir):
    address = f"tcp://127.0.0.1:{free_port()}"
    broker = start_broker(spawn, address)
    start_agent(spawn, address, "phoenix", "slot=1")
    wait_until(lambda: "phoenix" in agent_names(address), message="the agent to register")
    client = make_client(address)
    pending = client.submit(first_attempt_blocks, str(workdir), resources={"slot": 1})
    wait_until(lambda: (workdir / "started").exists(), message="the task to start")

    kill(broker)
    start_broker(spawn, address, "--fresh")  # a new cluster: the task is not there
    with pytest.raises(zres.BrokerLostError, match="without its state"):
        pending.result(30)
    wait_until(lambda: "phoenix" in agent_names(address), timeout=20,
               message="the agent to register with the new broker")
    assert client.submit(where, resources={"slot": 1}).result(30) == "phoenix"
    assert [a["name"] for a in client.status()["agents"]] == ["phoenix"]


def test_task_submitted_while_the_broker_is_down_does_not_hang(spawn, make_client):
    address = f"tcp://127.0.0.1:{free_port()}"
    broker = start_broker(spawn, address)
    start_agent(spawn, address, "phoenix", "slot=1")
    wait_until(lambda: "phoenix" in agent_names(address), message="the agent to register")
    client = make_client(address)
    assert client.submit(square, 3).result(30) == 9
    kill(broker)
    during = client.submit(square, 4)
    start_broker(spawn, address)
    assert during.result(30) == 16, "sent again to the restarted broker"
    wait_until(lambda: "phoenix" in agent_names(address), timeout=20,
               message="the agent to register with the new broker")
    assert client.submit(square, 5).result(30) == 25


def test_broker_gone_for_good_fails_pending_tasks(spawn, make_client, workdir):
    address = f"tcp://127.0.0.1:{free_port()}"
    broker = start_broker(spawn, address)
    start_agent(spawn, address, "lonely", "slot=1")
    wait_until(lambda: "lonely" in agent_names(address), message="the agent to register")
    client = make_client(address, broker_timeout=1.0)
    pending = client.submit(first_attempt_blocks, str(workdir), resources={"slot": 1})
    wait_until(lambda: (workdir / "started").exists(), message="the task to start")
    kill(broker)
    with pytest.raises(zres.BrokerLostError, match="reconnect window"):
        pending.result(20)


# -- 5. garbage on the broker's port -------------------------------------------------------------

def receive(sock: zmq.Socket[bytes], kind: str, timeout: float = 20.0) -> P.Message:
    """Receive until a message of KIND arrives (others are skipped)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no {kind} message within {timeout}s"
        if sock.poll(int(left * 1000)):
            msg = P.decode(sock.recv_multipart())
            if msg.kind == kind:
                return msg


def header(*items: Any) -> bytes:
    return msgpack.packb(list(items), use_bin_type=True)


def task_item(local: Any, units: Any = None, nframes: Any = 1, deps: Any = (),
              name: Any = "junk") -> list[Any]:
    return [local, {"CPU": 10_000} if units is None else units, 0, 0,
            list(deps) if isinstance(deps, tuple) else deps, nframes, name, False]


GARBAGE: list[list[bytes]] = [
    [b""],                                               # an empty message
    [b"", b""],                                          # a REQ-style empty delimiter
    [b"\x00\xffnot msgpack at all"],
    [os.urandom(64)],
    [b"\x00" * 100_000],                                 # msgpack followed by extra data
    [b"\xdd\xff\xff\xff\xff"],                           # an array claiming 4G items
    [b"\x91" * 100_000 + b"\x00"],                       # arrays nested 100,000 deep
    [msgpack.packb("just a string")],
    [header(1, "hello")],                                # two items, not three
    [header(2, P.HELLO, {"client": "from the future"})],  # another protocol version
    [header(0, P.STATUS, {})],
    [header("1", P.STATUS, {})],
    [header(1, "bogus", {})],                            # unknown kind
    [header(1, ["unhashable"], {})],
    [header(1, P.WELCOME, {"epoch": 1})],                # a kind the broker never receives
    [header(1, P.ASSIGN, {"tasks": []})],
    [header(1, P.HELLO, [])],                            # body not a map
    [header(1, P.HEARTBEAT, {"epoch": "x"})],
    [header(1, P.DONE, {"results": [[1, "ok", 0, {}]]})],  # done from a non-agent
    [header(1, P.REGISTER, {"name": 5, "slots": []})],
    [header(1, P.REGISTER, {"name": "bad", "slots": []})],
    [header(1, P.REGISTER, {"name": "bad", "slots": [1]})],
    [header(1, P.REGISTER, {"name": "bad", "slots": [{"units": {"CPU": -1}}]})],
    [header(1, P.REGISTER, {"name": "bad", "slots": [{"units": {"CPU": 1.5}}]})],
    [header(1, P.REGISTER, {"name": "bad", "slots": [{"units": {"CPU": 1}, "gpus": 7}]})],
    [header(1, P.REGISTER, {"name": "bad",
                            "slots": [{"units": {"CPU": 1}, "gpu_memory": "x"}]})],
    # A malformed registration under a real agent's name must not evict that agent.
    [header(1, P.REGISTER, {"name": "steady", "slots": [{"units": "all of them"}]})],
    [header(1, P.RESOURCES, {"agent": 5})],
    [header(1, P.RESOURCES, {"agent": "steady", "units": {"foo": -1}})],
    [header(1, P.RESOURCES, {"agent": "steady", "units": {"CPU": "lots"}})],
    [header(1, P.STATUS, {}), b"trailing", b"frames"],
    [b"junk"] * 50,                                      # multi-frame junk
    [os.urandom(1000) for _ in range(5)],
]

# Sent after a HELLO, so the broker knows the sender as a client.
BAD_CLIENT_MESSAGES: list[list[bytes]] = [
    [header(1, P.SUBMIT, {})],
    [header(1, P.SUBMIT, {"tasks": "x"})],
    [header(1, P.SUBMIT, {"tasks": [[1, 2, 3]]}), b"payload"],
    [header(1, P.SUBMIT, {"tasks": [task_item(1, {"CPU": -1})]}), b"payload"],
    [header(1, P.SUBMIT, {"tasks": [task_item(2, {"CPU": 1.5})]}), b"payload"],
    [header(1, P.SUBMIT, {"tasks": [task_item(3, "CPU=1")]}), b"payload"],
    [header(1, P.SUBMIT, {"tasks": [task_item(4, nframes=5)]}), b"payload"],
    [header(1, P.SUBMIT, {"tasks": [task_item(5, nframes=-1)]}), b"payload"],
    [header(1, P.SUBMIT, {"tasks": [task_item("six")]}), b"payload"],
    [header(1, P.SUBMIT, {"tasks": [task_item(7, deps="all")]}), b"payload"],
    [header(1, P.SUBMIT, {"tasks": [task_item(8, nframes=0)]})],
    [header(1, P.SUBMIT, {"tasks": [task_item(9, {True: 1})]}), b"payload"],
    [header(1, P.RELEASE, {"ids": "x"})],
    [header(1, P.RELEASE, {"ids": [[1], {}]})],
    [header(1, P.CANCEL, {"ids": [{}]})],
    [header(1, P.CANCEL, {})],
    [header(1, P.WHY, {"id": "x"})],
    [header(1, P.WHY, {})],
]


def test_garbage_frames_are_dropped_and_the_broker_keeps_serving(make_cluster, make_client):
    cluster = make_cluster(agents=[{"foo": 1}], names=["steady"])
    raw = raw_dealer(cluster.address)
    try:
        for frames in GARBAGE:
            raw.send_multipart(frames)
        raw.send_multipart(P.encode(P.HELLO, {"client": "raw"}))
        receive(raw, P.WELCOME)
        for frames in BAD_CLIENT_MESSAGES:
            raw.send_multipart(frames)
        # Messages on one connection are handled in order: once this is answered, the
        # broker has been through every frame above.
        raw.send_multipart(P.encode(P.STATUS))
        status = receive(raw, P.STATUS_REPLY).body
    finally:
        raw.close(0)
    assert cluster.broker.poll() is None, "the broker process died"
    assert [a["name"] for a in status["agents"]] == ["steady"]
    assert status["agents"][0]["slots"][0]["total"]["foo"] == 10_000
    assert status["counts"] == {}, "no rejected submit may leave a task behind"

    client = make_client(cluster.address)
    assert client.submit(square, 12).result(30) == 144
    assert client.submit(where, resources={"foo": 1}).result(30) == "steady"
    assert [f.result(30) for f in client.map(square, range(20))] == [x * x for x in range(20)]
    assert cluster.broker.poll() is None


def test_submit_rejected_midway_leaves_no_task_behind(make_cluster):
    # A submit whose dependency list holds something that is not an id is rejected (the
    # broker logs it); it must not leave a task that status reports as waiting forever.
    cluster = make_cluster(agents=[{"foo": 1}], names=["steady"])
    raw = raw_dealer(cluster.address)
    try:
        raw.send_multipart(P.encode(P.HELLO, {"client": "raw"}))
        receive(raw, P.WELCOME)
        raw.send_multipart([header(1, P.SUBMIT, {"tasks": [task_item(1, deps=[[1]])]}),
                            b"payload"])
        raw.send_multipart([header(1, P.SUBMIT, {"tasks": [task_item(2, deps=[{}])]}),
                            b"payload"])
        raw.send_multipart(P.encode(P.STATUS))
        status = receive(raw, P.STATUS_REPLY).body
    finally:
        raw.close(0)
    assert cluster.broker.poll() is None
    assert status["counts"] == {}, f"rejected submits left tasks behind: {status['counts']}"


def test_junk_payload_fails_only_its_own_task(make_cluster, make_client):
    cluster = make_cluster(agents=[{"foo": 1}], names=["steady"])
    raw = raw_dealer(cluster.address)
    try:
        raw.send_multipart(P.encode(P.HELLO, {"client": "raw"}))
        receive(raw, P.WELCOME)
        raw.send_multipart(P.encode(P.SUBMIT, {"tasks": [task_item(1), task_item(2, nframes=2)]},
                                    [b"not a pickle", b"\x80\x05junk", os.urandom(100)]))
        results = receive(raw, P.RESULTS).body["results"]
        while len(results) < 2:
            results += receive(raw, P.RESULTS).body["results"]
    finally:
        raw.close(0)
    assert sorted((r[0], r[1]) for r in results) == [(1, P.RAISED), (2, P.RAISED)]
    client = make_client(cluster.address)
    assert client.submit(where, resources={"foo": 1}).result(30) == "steady"
    assert cluster.broker.poll() is None


def test_inconsistent_gpu_registration_does_not_take_the_broker_down(make_cluster,
                                                                     make_client):
    # A registration that claims two GPUs but gives the memory of one device is malformed:
    # the broker must drop it (or survive it), not crash when it next schedules GPU work.
    cluster = make_cluster(agents=[{"GPU": 2, "CPU": 4}], names=["real-gpu"])
    raw = raw_dealer(cluster.address)
    try:
        raw.send_multipart(P.encode(P.REGISTER, {
            "name": "liar", "host": "nowhere", "pid": 1,
            "slots": [{"units": {"GPU": 20_000, "CPU": 10_000}, "gpus": ["0"],
                       "gpu_memory": [5]}]}))
        raw.poll(5000)
        client = make_client(cluster.address)
        futures = [client.submit(where, resources={"GPU": 1}, retries=3) for _ in range(4)]
        wait_until(lambda: cluster.broker.poll() is not None or all(f.done() for f in futures),
                   timeout=40, message="the GPU tasks to finish")
    finally:
        raw.close(0)
    assert cluster.broker.poll() is None, \
        f"the broker exited with code {cluster.broker.returncode}"
    assert all(f.result() == "real-gpu" for f in futures)


def test_random_bytes_over_raw_tcp_do_not_disturb_the_broker(make_cluster, make_client):
    cluster = make_cluster(agents=[{"foo": 1}], names=["steady"], address="tcp://127.0.0.1:0")
    host, port = cluster.address.removeprefix("tcp://").rsplit(":", 1)
    payloads = [
        os.urandom(16),
        os.urandom(65536),
        # A ZMTP 3 greeting followed by junk where the handshake should be.
        b"\xff" + b"\x00" * 8 + b"\x7f\x03\x00NULL" + b"\x00" * 16 + b"\x00" * 15
        + os.urandom(4096),
        b"GET / HTTP/1.1\r\nHost: zres\r\n\r\n",
        b"",
    ]
    idle = socket.create_connection((host, int(port)), timeout=10)  # stays open, silent
    try:
        for data in payloads:
            with socket.create_connection((host, int(port)), timeout=10) as conn:
                try:
                    conn.sendall(data)
                except OSError:
                    pass  # the broker may hang up on us mid-write
        client = make_client(cluster.address)
        assert client.submit(where, resources={"foo": 1}).result(30) == "steady"
        assert [f.result(30) for f in client.map(square, range(10))] == \
            [x * x for x in range(10)]
    finally:
        idle.close()
    assert cluster.broker.poll() is None
    assert agent_names(cluster.address) == {"steady"}


# -- 6. signals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_broker_stops_cleanly_on_signal(sig, spawn, make_client):
    address = f"tcp://127.0.0.1:{free_port()}"
    broker = start_broker(spawn, address)
    start_agent(spawn, address, "witness", "slot=1")
    wait_until(lambda: "witness" in agent_names(address), message="the agent to register")
    client = make_client(address)
    assert client.submit(square, 2).result(30) == 4
    broker.send_signal(sig)
    assert broker.wait(10) == 0


# -- 7. clients that vanish ------------------------------------------------------------------------

def test_closed_client_has_its_tasks_cancelled(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"tok": 1}], names=["solo"])
    leaver = make_client(cluster.address)
    stayer = make_client(cluster.address)
    release, marker = str(tmp_path / "release"), str(tmp_path / "started")
    try:
        leaver.submit(hold, release, marker, resources={"tok": 1})
        wait_until(lambda: os.path.exists(marker), message="the leaver's task to start")
        left_behind = leaver.map(square, range(5), resources={"tok": 1})
        mine = stayer.submit(where, resources={"tok": 1})
        wait_until(lambda: counts(cluster) == {"running": 1, "queued": 6},
                   message="seven tasks at the broker")
        leaver.close()
        for future in left_behind:
            with pytest.raises(zres.ZresError):
                future.result(10)
        # Its running task is stopped too (issue 27): its token comes back, and the other
        # client's task, queued for it, runs.
        assert mine.result(30) == "solo"
        wait_until(lambda: counts(cluster) == {"finished": 1}, timeout=10,
                   message="the leaver's tasks to be cancelled")
        assert cluster.status()["clients"] == 1
        assert stayer.submit(square, 9).result(30) == 81
    finally:
        Path(release).touch()


CLIENT_SCRIPT = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import zres

    def hold(release, marker):
        Path(marker).touch()
        deadline = time.time() + 60
        while not os.path.exists(release) and time.time() < deadline:
            time.sleep(0.01)
        return "released"

    address, release, marker = sys.argv[1:4]
    client = zres.Client(address)
    client.submit(hold, release, marker, resources={"tok": 1})
    client.map(abs, range(5), resources={"tok": 1})
    sys.stdin.read()  # until killed
""")


def test_killed_client_has_its_tasks_cancelled(make_cluster, make_client, spawn,
                                                      tmp_path):
    cluster = make_cluster(agents=[{"tok": 1}], names=["solo"],
                           env={"ZRES_BROKER__CLIENT_TIMEOUT": "1.0"})
    stayer = make_client(cluster.address)
    release, marker = str(tmp_path / "release"), str(tmp_path / "started")
    script = tmp_path / "client.py"
    script.write_text(CLIENT_SCRIPT)
    try:
        doomed = spawn([sys.executable, str(script), cluster.address, release, marker],
                       stdin=subprocess.PIPE, env=clean_env(ZRES_KEYS=cluster.keys),
                       cwd=tmp_path)
        wait_until(lambda: os.path.exists(marker), timeout=30,
                   message="the doomed client's task to start")
        mine = stayer.submit(where, resources={"tok": 1})
        wait_until(lambda: counts(cluster) == {"running": 1, "queued": 6},
                   message="seven tasks at the broker")
        kill(doomed)
        # All of them, its running task too (issue 27): the token comes back.
        assert mine.result(30) == "solo"
        wait_until(lambda: counts(cluster) == {"finished": 1}, timeout=15,
                   message="the killed client's tasks to be cancelled")
        assert cluster.status()["clients"] == 1
        assert stayer.submit(square, 6).result(30) == 36
    finally:
        Path(release).touch()
