"""LocalCluster's processes never outlive the program that started them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import zmq

import zres
from tests.cli.test_cli import clean_env, zres_cli
from tests.conftest import process_gone, wait_until
from zres import local
from zres.core import keys
from zres.core import protocol as P
from zres.core.address import Unanswered

# A user's program: a local cluster, one task run on it, then the pids of everything the
# cluster started (broker, agent, the agent's worker process) on one line.
PROGRAM = textwrap.dedent("""
    import os, sys
    import zres
    cluster = zres.LocalCluster(agents=[{"slot": 1}], nthreads=1)
    client = zres.Client(cluster.address)
    worker = client.submit(os.getpid).result(60)
    print(cluster.broker.pid, *[p.pid for p in cluster.agents.values()], worker, flush=True)
    if sys.argv[1] == "raise":
        raise RuntimeError("the program fails without closing its cluster")
    if sys.argv[1] == "wait":
        sys.stdin.read()  # until the test kills it
    # "end": the program ends here, closing neither its client nor its cluster, with
    # futures left to be collected as the interpreter goes (one in a reference cycle)
    futures = client.map(abs, range(-50, 0))
    assert sum(f.result(60) for f in futures) == 1275
    cycle = [futures[0]]
    cycle.append(cycle)
""")


def start(tmp_path: Path, how: str) -> tuple[subprocess.Popen[str], list[int]]:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    proc = subprocess.Popen([sys.executable, str(script), how], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(), cwd=str(tmp_path))
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(f"the program did not start its cluster: {proc.communicate()[1]}")
    pids = [int(p) for p in line.split()]
    assert len(pids) == 3 and all(not process_gone(p) for p in pids)
    return proc, pids


def kill_leftovers(pids: list[int]) -> None:
    """Whatever the outcome, leave no process of the test behind."""
    for pid in pids:
        if not process_gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_killed_program_takes_its_local_cluster_along(tmp_path):
    proc, pids = start(tmp_path, "wait")
    try:
        proc.send_signal(signal.SIGKILL)  # no atexit, no finally: only the cluster can notice
        proc.wait(10)
        wait_until(lambda: all(process_gone(p) for p in pids), timeout=15,
                   message="broker, agent and worker to stop after their program was killed")
    finally:
        kill_leftovers(pids)


def test_a_program_ending_in_an_exception_stops_its_local_cluster(tmp_path):
    proc, pids = start(tmp_path, "raise")
    try:
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 1 and "without closing its cluster" in err
        # close() ran at exit and waited for the broker and agent; the worker goes with them.
        assert process_gone(pids[0]) and process_gone(pids[1])
        wait_until(lambda: process_gone(pids[2]), timeout=15, message="the worker to stop")
    finally:
        kill_leftovers(pids)


def test_exit_with_takes_a_process_id():
    result = zres_cli("broker", "--exit-with", "me")
    assert result.returncode == 2
    assert "'me' is not a process id" in result.stderr


def test_a_program_ending_without_closing_anything_ends_quietly(tmp_path):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    # Output and errors in one pipe, as on a terminal (the failure showed only then).
    result = subprocess.run([sys.executable, str(script), "end"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=clean_env(), cwd=str(tmp_path), timeout=60)
    first, *rest = result.stdout.splitlines()
    pids = [int(p) for p in first.split()]
    try:
        assert result.returncode == 0 and not rest, result.stdout
        wait_until(lambda: all(process_gone(p) for p in pids), timeout=15,
                   message="the cluster's processes to stop")
    finally:
        kill_leftovers(pids)


def test_a_restarted_local_broker_is_the_same_cluster_and_its_agents_come_back(make_cluster):
    cluster = make_cluster(agents=[{"foo": 1}])
    before = cluster.status()["cluster"]
    old_pid = cluster.broker.pid
    cluster.restart_broker()
    assert cluster.broker.pid != old_pid
    assert cluster.status()["cluster"] == before
    state = cluster.status()["state"]
    assert state["dir"] == cluster.state_dir and state["error"] is None
    cluster.wait_for_agents(["agent-0"], 30)


def test_a_local_cluster_whose_broker_finds_its_port_taken_starts_again_on_another(
        monkeypatch):
    """Its agents start beside its broker, told a port that was free a moment before: if
    another process took it meanwhile, the broker cannot listen there, and the cluster
    starts again (the third time on a port its broker picks), its first agents stopped."""
    spawned: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def recorded(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        spawned.append(popen(*args, **kwargs))  # type: ignore[call-overload]
        return spawned[-1]

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(local, "_known_address", lambda _: f"tcp://127.0.0.1:{port}")
        monkeypatch.setattr(local.subprocess, "Popen", recorded)
        with zres.LocalCluster(agents=[{"foo": 1}], address="tcp://127.0.0.1:0") as cluster:
            assert not cluster.address.endswith(f":{port}")
            assert [a["name"] for a in cluster.status()["agents"]] == ["agent-0"]
            client = zres.Client(cluster.address)
            try:
                assert client.submit(abs, -3, resources={"foo": 1}).result(60) == 3
            finally:
                client.close()
            # Two tries on the taken port (a broker and an agent each), then the third.
            assert len(spawned) == 6
            assert all(p.poll() is not None for p in spawned[:4]), "a first try's process"


def test_a_local_cluster_listens_on_a_unix_socket_only_its_user_reaches(monkeypatch):
    """By default its broker is reached through a socket in the cluster's own directory
    (0700), not a TCP port anyone on the machine can connect to or take; with a path too
    long for a unix socket, on loopback TCP."""
    with zres.LocalCluster(agents=[{"foo": 1}]) as cluster:
        path = cluster.address.removeprefix("ipc://")
        assert cluster.address.startswith("ipc://") and path.endswith("/broker.sock")
        assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
        assert cluster.state_dir not in path, "the open port would say where the state is"
        with zres.Client(cluster.address) as client:
            assert client.submit(abs, -3, resources={"foo": 1}).result(60) == 3
    assert not os.path.exists(os.path.dirname(path)), "left behind"
    monkeypatch.setattr(local, "_SOCKET_PATH_MAX", 10)
    with zres.LocalCluster(agents=[{"foo": 1}]) as cluster:
        assert cluster.address.startswith("tcp://127.0.0.1:")
        assert cluster.status()["agents"][0]["name"] == "agent-0"


def test_a_request_whose_broker_goes_before_answering_is_unanswered_then_not_at_its_timeout(
        tmp_path):
    """A broker killed (or restarted) with a request unanswered never answers it, nor does
    one started again at its address at once, which never had it: the request says so as
    the connection closes, not after its timeout (``zres wait`` then asks the new one)."""
    address = f"ipc://{tmp_path}/broker"
    keys.remember(address, None)  # (no keys: a broker played by hand)
    ctx = zmq.Context.instance()
    bound, asked, done = threading.Event(), threading.Event(), threading.Event()

    def broker_restarted() -> None:
        first = ctx.socket(zmq.ROUTER)
        first.bind(address)
        bound.set()
        if first.poll(30_000):
            first.recv_multipart()
            asked.set()
        first.close(0)
        again = ctx.socket(zmq.ROUTER)  # (at once: no moment with nothing there)
        again.bind(address)
        done.wait(60)
        again.close(0)

    broker = threading.Thread(target=broker_restarted)
    broker.start()
    try:
        bound.wait(10)
        with pytest.raises(Unanswered, match="closed the connection before it answered"):
            local.request(address, P.STATUS, {}, timeout=10)
        assert asked.is_set()
    finally:
        done.set()
        broker.join(10)
        keys.forget(address)
