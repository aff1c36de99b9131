"""``LocalCluster``: a broker and agents as subprocesses on this machine, for demos and tests."""

from __future__ import annotations

import atexit
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import zmq

from .core import keys, net
from .core import protocol as P
from .core.address import Unanswered, parse_http_address, wait_for_answer
from .core.context import task_token
from .core.errors import ZresError
from .core.exits import wait_ended
from .core.report import in_user_units
from .core.resources import UNIT, mapping_to_units

_SOCKET_PATH_MAX = 100  # bytes in a unix socket's path (104 on macOS, 108 on Linux)


class LocalCluster:
    """Start a broker and one agent per entry of AGENTS, as subprocesses.

    ``agents=None`` starts one agent offering this machine's detected resources; a list
    like ``[{"GPU": 2}, {"MEMORY": 100e9}]`` starts one agent per entry offering exactly
    that (plus CPU = ``nthreads``, unless the entry names CPU).

    Its processes never outlive this one: they stop when it ends, even when it was killed or
    ended without calling ``close()``.

    Its broker listens on ADDRESS; by default on a unix socket in a directory of the
    cluster's own (``ipc://...``), which only this user reaches. ``"tcp://127.0.0.1:0"``
    puts it on loopback TCP, a free port; a wildcard host (``"tcp://0.0.0.0:0"``) lets
    other machines' agents join, with its keys.
    """

    def __init__(self, agents: Sequence[Mapping[str, Any]] | None = None, *,
                 nthreads: int | None = None, nworkers: int = 1,
                 address: str | None = None, heartbeat_interval: float = 0.5,
                 heartbeat_timeout: float = 3.0, env: Mapping[str, str] | None = None,
                 start_timeout: float = 60.0, names: Sequence[str] | None = None,
                 drain_grace: float = 0.0, insecure: bool = False,
                 http: str | None = None) -> None:
        self._env = {**os.environ, **(env or {}),
                     "ZRES_BROKER__HEARTBEAT_INTERVAL": str(heartbeat_interval),
                     "ZRES_BROKER__HEARTBEAT_TIMEOUT": str(heartbeat_timeout),
                     "ZRES_AGENT__HEARTBEAT_INTERVAL": str(heartbeat_interval),
                     "ZRES_AGENT__HEARTBEAT_TIMEOUT": str(heartbeat_timeout)}
        self._env.pop("ZRES_BROKER", None)
        # HTTP: the broker's dashboard, /metrics and /health on this HOST:PORT ("127.0.0.1:0"
        # picks a free port); None: none, so that many local clusters never fight over one.
        self._http = ["--http", http or "off"]
        self.dashboard: str | None = None   # its URL, when it has one
        self.nthreads = nthreads
        self.nworkers = nworkers
        # Closing a local cluster stops its work at once (agents give back what has not
        # started and say goodbye); DRAIN_GRACE lets running work finish first.
        self.drain_grace = drain_grace
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.broker: subprocess.Popen[bytes] | None = None
        # Its broker's state: its own, gone with it (nothing else can find this cluster).
        self.state_dir = tempfile.mkdtemp(prefix="zres-local-state-")
        # (a directory of its own: its path is no clue to where the state is kept, which
        # the broker's open port never says)
        self._socket_dir: str | None = None
        if address is None:
            self._socket_dir = tempfile.mkdtemp(prefix="zres-local-")
            address = _private_address(self._socket_dir)
        # Keys of its own: no other user, nor another cluster's key, gets in. Clients in
        # this process find them by its address; others may be given ``keys``.
        # INSECURE: none at all (to measure what CURVE costs, say).
        self.keys = None if insecure else os.path.join(self.state_dir, "keys")
        if self.keys is not None:
            keys.keygen(self.keys)
        self._key_args = ["--insecure"] if self.keys is None else ["--keys", self.keys]
        specs: list[Mapping[str, Any] | None] = [None] if agents is None else list(agents)
        self._exit_with = ["--exit-with", str(os.getpid())]
        atexit.register(self.close)  # a program that ends without close(), or by an exception
        try:
            self._start(address, specs, names, start_timeout)
        except BaseException:
            self.close()
            raise

    def _start(self, address: str, specs: list[Mapping[str, Any] | None],
               names: Sequence[str] | None, timeout: float) -> None:
        """Start the broker and the agents at once, not one after the other (each process
        spends its first ~0.2 s importing Python): the agents are given the broker's
        address before it listens, a TCP port 0 replaced by a port free now. Another
        process may take that port before the broker binds it: then both start again, on
        another; the last try lets the broker pick its port and starts the agents after."""
        for attempt in range(3):
            known = _known_address(address) if attempt < 2 else None
            self.broker = self._spawn_broker(known or address)
            if known is not None:
                self.address = known
                self._add_agents(specs, names)
            try:
                self.address = self._serving(self.broker)
                break
            except ZresError:
                if known is None or known == address:
                    raise  # (not a port of ours that was taken)
                _stop(self.broker)
                self._stop_agents()
        if known is None:
            self._add_agents(specs, names)
        self.wait_for_agents(len(specs), timeout)

    def _add_agents(self, specs: list[Mapping[str, Any] | None],
                    names: Sequence[str] | None) -> None:
        for index, resources in enumerate(specs):
            name = names[index] if names else f"agent-{index}"
            self.add_agent(resources, name=name, wait=False)

    def _stop_agents(self) -> None:
        _stop(*self.agents.values())
        self.agents.clear()

    def _spawn_broker(self, address: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "zres", "broker", "--listen", address,
             "--state", self.state_dir, *self._key_args, *_log_args(),
             *self._http, *self._exit_with],
            stdout=subprocess.PIPE, stderr=_log_sink(), env=self._env,
            stdin=subprocess.DEVNULL)

    def _start_broker(self, address: str, timeout: float) -> str:
        self.broker = self._spawn_broker(address)
        return self._serving(self.broker)

    def _serving(self, broker: subprocess.Popen[bytes]) -> str:
        """The address BROKER (just started) serves on, once it says so; ZresError if it
        ended first."""
        assert broker.stdout is not None
        line = broker.stdout.readline().decode().strip()
        if not line.startswith("zres broker serving "):
            raise ZresError(f"the local broker did not start (said {line!r})")
        address = line.rsplit(" ", 1)[1]
        if parse_http_address(self._http[1]) is not None:  # (ValueError: refused before this)
            self.dashboard = broker.stdout.readline().decode().strip().rsplit(" ", 1)[1]
        keys.remember(address, self.keys)
        return address

    def restart_broker(self, timeout: float = 60.0) -> None:
        """Kill the broker (SIGKILL, as a crash would) and start it again on the same
        address and state directory: the same cluster carries on."""
        if self.broker is not None:
            self.broker.kill()
            wait_ended(self.broker, 10)
            if self.broker.stdout:
                self.broker.stdout.close()
        self._start_broker(self.address, timeout)

    def add_agent(self, resources: Mapping[str, Any] | None = None, *, name: str,
                  wait: bool = True, extra_args: Sequence[str] = ()) -> subprocess.Popen[bytes]:
        """Start one more agent offering RESOURCES, e.g. {"GPU": 2} (None: detect them)."""
        from .agent.files import safe_name
        # Its files beside the broker's state, gone with the cluster: two local clusters
        # each with an agent-0 never share (nor fight over) one directory.
        state = os.path.join(self.state_dir, f"agent-{safe_name(name)}")
        args = [sys.executable, "-m", "zres", "agent", self.address, "--name", name,
                "--state", state, *self._key_args,
                "--nworkers", str(self.nworkers), *_log_args(), *self._exit_with,
                "--drain-grace", str(self.drain_grace), *extra_args]
        if self.nthreads:
            args += ["--nthreads", str(self.nthreads)]
        if resources is not None:
            spec = " ".join(f"{n}={float(a) / UNIT!r}"
                            for n, a in mapping_to_units(resources).items())
            args += ["--resources", spec, "--no-detect"]
        proc = subprocess.Popen(args, env=self._env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=_log_sink())
        self.agents[name] = proc
        if wait:
            self.wait_for_agents([name], 60.0)
        return proc

    def status(self, timeout: float = 10.0) -> dict[str, Any]:
        """Ask the broker for its status (without needing a Client), amounts in user
        units."""
        return in_user_units(request(self.address, P.STATUS, {}, timeout))

    def wait_for_agents(self, agents: int | Sequence[str], timeout: float = 60.0) -> None:
        """Block until that many agents (or those names) are registered."""
        deadline = time.monotonic() + timeout
        while True:
            names = {a["name"] for a in self.status()["agents"]}
            if (len(names) >= agents if isinstance(agents, int) else set(agents) <= names):
                return
            for name, proc in self.agents.items():
                waited_for = isinstance(agents, int) or name in agents
                if waited_for and proc.poll() is not None:
                    raise ZresError(f"local agent {name} exited with code {proc.returncode}")
            if time.monotonic() > deadline:
                raise ZresError(f"local agents did not register within {timeout:g}s")
            time.sleep(0.02)

    def close(self) -> None:
        """Stop the agents and the broker, all at once: the agents' goodbyes need no answer,
        and what the broker would keep of them goes with its state, removed here (one
        after the other, a close took twice as long)."""
        atexit.unregister(self.close)
        _stop(*self.agents.values(), *([self.broker] if self.broker is not None else []))
        if self.broker is not None:
            if self.broker.stdout:
                self.broker.stdout.close()
            self.broker = None
        keys.forget(getattr(self, "address", ""))
        from .agent.data.store import forget_stores
        forget_stores(self.state_dir)  # (an agent killed left its store in /dev/shm)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<zres.LocalCluster {getattr(self, 'address', '?')} agents={len(self.agents)}>"

    def _repr_html_(self) -> str:
        from .client.html import cluster
        address = getattr(self, "address", "?")
        try:
            return cluster("zres.LocalCluster", address, self.status(timeout=2.0))
        except (ZresError, OSError) as exc:
            return cluster("zres.LocalCluster", address, None, str(exc))


def _private_address(directory: str) -> str:
    """Where a local cluster's broker listens unless told: a unix socket in a private
    DIRECTORY (0700: no other user even reaches it, and no port can be taken
    from under it; a message costs less than over loopback TCP, 4% of a round trip
    measured side by side), else loopback TCP, a free port, where that path is too long
    for a unix socket's address (its relay's is 6 bytes longer still)."""
    path = os.path.join(directory, "broker.sock")
    if len(os.fsencode(path)) + len("-relay") > _SOCKET_PATH_MAX:
        return "tcp://127.0.0.1:0"
    return f"ipc://{path}"


def _known_address(address: str) -> str | None:
    """Where a broker told to listen on ADDRESS will be reached, before it starts: ADDRESS,
    with a port free now in place of a TCP port 0; None if that cannot be known."""
    if not address.startswith("tcp://"):
        return address if address.startswith("ipc://") else None
    host, _, port = address[len("tcp://"):].rpartition(":")
    if host.strip("[]") in ("*", "0.0.0.0", "::", ""):
        return None  # (every interface: which one the broker names, it says)
    if port != "0":
        return address
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.bind((host.strip("[]"), 0))
            free = sock.getsockname()[1]
    except OSError:
        return None  # (a host name, say: the broker picks its port)
    return f"tcp://{host}:{free}"


def _log_sink() -> Any:
    """Where local processes log: nowhere, unless ZRES_LOCAL_LOGS=1 (then our stderr)."""
    return None if os.environ.get("ZRES_LOCAL_LOGS") else subprocess.DEVNULL


def _log_args() -> list[str]:
    """How local processes log: JSON lines; only warnings up while they go nowhere (an
    info line rendered for /dev/null costs the loop as much as one kept)."""
    return ["--log-format", "json", *([] if os.environ.get("ZRES_LOCAL_LOGS")
                                      else ["--log-level", "warning"])]


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    """Stop PROCS: SIGTERM to all at once (each takes a moment to leave), then SIGKILL to
    any still there 10 s later."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        if not wait_ended(proc, 10):
            proc.kill()
            proc.wait()


def exit_with(pid: int, stop: Callable[[], None]) -> None:
    """Call STOP, from a daemon thread, once process PID has ended.

    LocalCluster gives its broker and agents its own pid: a program killed with SIGKILL
    runs no clean-up of its own, and its cluster must not run on with nobody to use it.
    """
    def watch() -> None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            pass  # ended already
        except (AttributeError, OSError):  # no pidfd here (not Linux 5.3+): look now and then
            while _alive(pid):
                time.sleep(0.5)
        else:
            select.select([fd], [], [])  # readable once the process has ended
            os.close(fd)
        stop()
    threading.Thread(target=watch, name="zres-exit-with", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process, but there
    return True


def request(address: str, kind: str, body: dict[str, Any], timeout: float = 10.0,
            keys_dir: str | None = None, who: str = "command") -> dict[str, Any]:
    """Send one request (status, resources) to a broker over a short-lived socket, with
    the key found for a command (``keys.find``, KEYS_DIR first): KeysError if the broker
    refuses it, naming WHO asked; Unanswered if no answer comes within TIMEOUT, or the
    broker closes the connection before answering (it went, or restarted: gone with it)."""
    from . import config
    key = config.find_key(keys_dir, ("admin", "client"), address)
    token = task_token()  # (a command run inside a task acts for the task's owner)
    if token:
        body = {**body, "token": token}
    try:
        return _request(address, key, kind, body, timeout, who)
    except keys.KeysError:
        if key is None:
            # A broker starting on this machine makes this user's keys before it listens:
            # looked for before they were there, they are there now (the request was
            # refused at the handshake, so it never reached the broker: send it again).
            key = config.find_key(keys_dir, ("admin", "client"), address)
            if key is not None:
                return _request(address, key, kind, body, timeout, who)
        raise


def _request(address: str, key: keys.PeerKey | None, kind: str, body: dict[str, Any],
             timeout: float, who: str = "command") -> dict[str, Any]:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    keys.secure(sock, key)
    monitor = sock.get_monitor_socket(keys.HANDSHAKES | zmq.EVENT_DISCONNECTED)
    handshakes = keys.Handshakes(address, key)
    spoke = False  # (a connection to the broker was made: the request went over it)

    def answered(seconds: float) -> bool:
        nonlocal spoke
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        ready = dict(poller.poll(int(seconds * 1000)))
        while monitor.poll(0):
            event = net.monitor_event(monitor)[0]
            why = handshakes.refused(event)
            if why is not None:
                raise keys.KeysError(f"the broker at {address} refused this {who}: {why}")
            spoke = spoke or event == zmq.EVENT_HANDSHAKE_SUCCEEDED
            if event == zmq.EVENT_DISCONNECTED and spoke and not sock.poll(0):
                # Its broker went (killed, restarted) before answering: nor will one
                # started again there, which never had it. Said now, not at TIMEOUT (a
                # command that waits for its broker asks the new one at once).
                raise Unanswered(f"the broker at {address} closed the connection before "
                                 "it answered")
        return sock in ready

    try:
        net.connect(sock, address)
        P.send(sock, P.encode(kind, body))
        # A refused connection (or key) is said at once, not after TIMEOUT.
        wait_for_answer(address, answered, timeout)
        msg = P.decode(P.recv(sock))  # it has arrived: poll said so
        if msg.kind == P.REFUSED:
            raise ZresError(f"the broker at {address} refused it: {msg.body.get('error')}")
        if msg.kind != kind + "_reply":
            raise ZresError(f"the broker answered {msg.kind!r} to a {kind} request")
        return msg.body
    finally:
        sock.disable_monitor()
        monitor.close(0)
        sock.close()
