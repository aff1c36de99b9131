"""Shared fixtures: real brokers and agents as subprocesses on loopback."""

from __future__ import annotations

import compileall
import os
import py_compile
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import pytest
import zmq

import tests
import zres
from zres.core import keys
from zres.core.exits import wait_ended

# Worker processes cannot import this test package (their working directory and sys.path
# differ), so functions defined in tests travel by value, as a user's script's would.
cloudpickle.register_pickle_by_value(tests)


@pytest.fixture(autouse=True, scope="session")
def _own_state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Brokers started on a fixed port keep their state under $XDG_STATE_HOME, and a
    broker given no keys makes them under $XDG_CONFIG_HOME (where agents and commands
    find them): the suite's own, never the user's (nor shared with another run of it)."""
    before = {k: os.environ.get(k) for k in ("XDG_STATE_HOME", "ZRES_STATE_DIR",
                                             "XDG_CONFIG_HOME", "ZRES_KEYS")}
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state-home"))
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config-home"))
    os.environ.pop("ZRES_STATE_DIR", None)
    os.environ.pop("ZRES_KEYS", None)
    yield
    # Agents started without --name under it and killed leave their stores' memory tiers
    # in /dev/shm (the next start has another name): the suite's go with it.
    from zres.agent.data.store import forget_stores
    forget_stores(os.environ["XDG_STATE_HOME"])
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(autouse=True, scope="session")
def _compiled_once() -> None:
    """Where Python writes no bytecode (PYTHONDONTWRITEBYTECODE), every broker, agent,
    worker and command the suite starts compiled zres's sources anew: about 0.1 s of each
    one's start, thousands of times. They are compiled once, here, beside the sources
    (``__pycache__``, as Python itself would; git ignores it), checked against them by
    hash whenever they are imported."""
    if sys.flags.dont_write_bytecode:
        compileall.compile_dir(os.path.dirname(zres.__file__), quiet=2,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)


def wait_until(condition: Callable[[], Any], timeout: float = 20.0, interval: float = 0.02,
               message: str = "condition") -> Any:
    """Poll CONDITION until it returns something truthy; fail after TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def stop_process(pid: int) -> None:
    """SIGSTOP process PID and return once every thread of it has stopped: kill() returns
    at once, and on a busy machine a thread already running could still answer a
    request sent right after it."""
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                    if fh.read().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                        return False
            except FileNotFoundError:
                pass  # (a thread that ended meanwhile)
        return True
    wait_until(stopped, message=f"process {pid} to stop")


def process_gone(pid: int) -> bool:
    """Whether process PID has ended: gone, or a zombie with no thread left.

    The leader of a multi-threaded process shows "Z" while its other threads are still
    exiting, and its parent's waitpid() does not report it until they are gone.
    """
    try:
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                return False
        return os.listdir(f"/proc/{pid}/task") == [str(pid)]
    except FileNotFoundError:
        return True


# For a test that waits for an agent it killed or stopped to be declared lost: heard from
# ten times a second, lost after 1 s of silence (make_cluster's 3 s was most of such a
# test's time; tests/e2e/test_faults.py shows none is lost wrongly at 1 s under stress:
# the agents beat from a thread of their own).
LOSS = {"heartbeat_interval": 0.1, "heartbeat_timeout": 1.0}


@pytest.fixture
def make_cluster() -> Iterator[Callable[..., zres.LocalCluster]]:
    """Start LocalClusters (same arguments as zres.LocalCluster); all stop at teardown."""
    clusters: list[zres.LocalCluster] = []

    def start(*args: Any, **kwargs: Any) -> zres.LocalCluster:
        kwargs.setdefault("heartbeat_interval", 0.2)
        kwargs.setdefault("heartbeat_timeout", 3.0)
        cluster = zres.LocalCluster(*args, **kwargs)
        clusters.append(cluster)
        return cluster

    yield start
    for cluster in clusters:
        cluster.close()


@pytest.fixture
def make_client() -> Iterator[Callable[..., zres.Client]]:
    """Connect Clients to a given address; all close at teardown."""
    clients: list[zres.Client] = []

    def connect(address: str, **kwargs: Any) -> zres.Client:
        client = zres.Client(address, **kwargs)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.close()


@pytest.fixture
def spawn() -> Iterator[Any]:
    """Start subprocesses with Popen; every one still running is killed at teardown."""
    procs: list[subprocess.Popen[Any]] = []

    def start(args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("stdout", subprocess.DEVNULL)
        kwargs.setdefault("stderr", subprocess.DEVNULL)
        proc = subprocess.Popen(args, **kwargs)
        procs.append(proc)
        return proc

    yield start
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()  # an agent stops its worker processes on SIGTERM
            if not wait_ended(proc, 10):
                proc.kill()
        proc.wait(10)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


_FIND = object()


def raw_dealer(address: str, key: Any = _FIND) -> zmq.Socket:
    """A DEALER connected to the broker at ADDRESS with KEY (a keys.PeerKey; None: none;
    by default the key a command would find for it): a peer played by hand."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    keys.secure(sock, keys.find(None, ("admin", "client"), address) if key is _FIND else key)
    sock.connect(address)
    return sock
