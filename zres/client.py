"""``Client``: submits work to a broker and resolves futures, with one I/O thread.

User threads never touch the socket: they pickle the call, append a message to a deque
and wake the I/O thread through a pipe (only when it is not already awake). The I/O
thread sends everything queued as one batch per kind, and resolves futures as results
arrive. The newest open client is the default for ``zres.submit`` and friends.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import inspect
import itertools
import os
import pickle
import shlex
import threading
import time
import uuid
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog
import zmq

from . import errors
from . import protocol as P
from .commands import run_command
from .context import current_annotations
from .errors import BrokerLostError, InfeasibleError, ZresError
from .futures import Future
from .handles import ActorHandle
from .resources import mapping_to_units, task_request, units_to_float
from .serialize import CallPickler, loads, loads_exception

log = structlog.get_logger("zres.client")
_INFEASIBLE_MODES = ("warn", "error")
_clients: list[Client] = []
_clients_lock = threading.Lock()


class InfeasibleWarning(UserWarning):
    """A task asks for resources that no connected agent could ever provide."""


class Client(cf.Executor):
    """Connect to a broker, or start a private local cluster when none is named.

    ``Client()`` uses ``$ZRES_BROKER`` if set, else starts a broker and one agent with
    this machine's resources (a ``LocalCluster``) that it stops on ``close()``.
    """

    def __init__(self, address: str | None = None, *, name: str | None = None,
                 infeasible: str = "warn", connect_timeout: float = 30.0,
                 broker_timeout: float | None = None) -> None:
        _check_infeasible(infeasible)
        self.infeasible = infeasible
        self.cluster = None
        address = address or os.environ.get("ZRES_BROKER")
        if not address:
            from .local import LocalCluster
            self.cluster = LocalCluster()
            address = self.cluster.address
        self.address = address
        self.name = name or f"client-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._ids = itertools.count(1)
        self._pickler = CallPickler(Future)
        self._io = _IOThread(self, address, broker_timeout)
        self._closed = False
        try:
            self._io.connected.wait_for(connect_timeout)
        except TimeoutError:
            self.close()
            raise ZresError(f"no zres broker answered at {address} within "
                            f"{connect_timeout:g}s") from None
        with _clients_lock:
            _clients.append(self)

    # -- submitting ---------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], /, *args: Any,  # type: ignore[override]
               resources: Mapping[str, Any] | None = None, retries: int | None = None,
               priority: int | None = None, infeasible: str | None = None,
               key: str | None = None,
               **kwargs: Any) -> Future:
        """Run FN(*ARGS, **KWARGS) on an agent whose free resources cover RESOURCES.

        KEY names the task in status and errors (default: the function's name and id).
        """
        opts = self._options(resources, retries, priority, infeasible, key)
        deps: list[Any] = []
        index: dict[int, int] = {}
        fn_frame = self._pickler.function(fn, deps, index)
        frames = self._pickler.call(fn_frame, args, kwargs, deps, index)
        future = self._make_future(fn, key, frames, deps, opts)
        self._io.wake()
        return future

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any],  # type: ignore[override]
            resources: Mapping[str, Any] | None = None, retries: int | None = None,
            priority: int | None = None, infeasible: str | None = None,
            key: str | None = None, **kwargs: Any) -> list[Future]:
        """Submit FN over zipped ITERABLES in one batch; return the futures (as Dask does)."""
        opts = self._options(resources, retries, priority, infeasible, key)
        fn_deps: list[Any] = []
        fn_index: dict[int, int] = {}
        fn_frame = self._pickler.function(fn, fn_deps, fn_index)
        futures = []
        for args in zip(*iterables):
            deps, index = list(fn_deps), dict(fn_index)
            frames = self._pickler.call(fn_frame, args, kwargs, deps, index)
            futures.append(self._make_future(fn, key, frames, deps, opts))
            if len(futures) % 256 == 0:
                self._io.wake()  # the first tasks start while the rest are pickled
        self._io.wake()
        return futures

    def _options(self, resources: Mapping[str, Any] | None, retries: int | None,
                 priority: int | None, infeasible: str | None,
                 key: str | None) -> dict[str, Any]:
        self._check_open()
        ann = current_annotations()
        resources = ann.get("resources") if resources is None else resources
        retries = ann.get("retries", 0) if retries is None else retries
        priority = ann.get("priority", 0) if priority is None else priority
        infeasible = ann.get("infeasible", self.infeasible) if infeasible is None else infeasible
        for label, value in (("retries", retries), ("priority", priority)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{label} must be an int, not {type(value).__name__}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        _check_infeasible(infeasible)
        if key is not None and not isinstance(key, str):
            raise TypeError(f"key must be a str, not {type(key).__name__}")
        return {"units": task_request(resources), "retries": retries, "priority": priority,
                "strict": infeasible == "error"}

    def _make_future(self, fn: Any, name: str | None, frames: list[Any],
                     deps: list[Future], opts: dict[str, Any],
                     extra: dict[str, Any] | None = None) -> Future:
        for dep in deps:
            if dep.client is not self:
                raise ValueError(f"{dep!r} belongs to another client; pass its result instead")
        task_id = next(self._ids)
        label = name or f"{getattr(fn, '__name__', fn)}-{task_id}"
        future = Future(self, task_id, label)
        item = [task_id, opts["units"], opts["priority"], opts["retries"],
                [d.id for d in deps], len(frames), label, opts["strict"]]
        if extra:
            item.append(extra)
        with self._io.lock:  # against close() and a broker loss failing what is pending
            self._check_open()
            self._io.pending[task_id] = future
            self._io.outbox.append((P.SUBMIT, item, frames))
        return future

    # -- command jobs -----------------------------------------------------------------------
    def submit_command(self, argv: str | Iterable[str], *,
                       resources: Mapping[str, Any] | None = None,
                       env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None
                       = None, name: str | None = None, retries: int | None = None,
                       priority: int | None = None, infeasible: str | None = None,
                       detached: bool = False) -> Future:
        """Queue a shell command as a job; return a future of its ``CommandResult``.

        It runs on an agent with RESOURCES free, in a process group of its own, with
        CUDA_VISIBLE_DEVICES set to the granted devices and ZRES_JOB_ID, ZRES_GPU_IDS in
        its environment; its output goes to a log on that agent (``zres logs``). A
        non-zero exit fails the future with ``CommandFailed``. A string ARGV is split as a
        shell would (no shell runs it). A DETACHED job outlives this client.
        """
        args = shlex.split(argv) if isinstance(argv, str) else list(argv)
        if not args or not all(isinstance(a, str) for a in args):
            raise ValueError(f"argv must be a non-empty list of strings, got {argv!r}")
        extra_env = dict(env or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in extra_env.items()):
            raise TypeError("env must map strings to strings")
        opts = self._options(resources, retries, priority, infeasible, name)
        deps: list[Any] = []
        index: dict[int, int] = {}
        frames = self._pickler.call(self._pickler.function(run_command, deps, index),
                                    (args, extra_env, None if cwd is None else os.fspath(cwd)),
                                    {}, deps, index)
        label = name or os.path.basename(args[0])
        future = self._make_future(run_command, f"{label}", frames, deps, opts,
                                   {"job": {"argv": args, "detached": bool(detached)}})
        self._io.wake()
        return future

    def job_ids(self, futures: Iterable[Future], timeout: float = 10.0) -> list[int | None]:
        """Return the broker's job id of each command-job future (None if unknown)."""
        ids = [f.id for f in futures]
        return list(self._io.request(P.JOBS, {"ids": ids, "jobs": []}, timeout)["ids"])

    def jobs(self, all: bool = False, timeout: float = 10.0) -> list[dict[str, Any]]:  # noqa: A002
        """Return the job table: queued and running jobs, finished ones too with ALL."""
        return list(self._io.request(P.JOBS, {"all": all}, timeout)["jobs"])

    # -- actors ---------------------------------------------------------------------------
    def actor(self, cls: type, /, *args: Any, resources: Mapping[str, Any] | None = None,
              max_concurrency: int = 1, restarts: int = 0, name: str | None = None,
              priority: int | None = None, infeasible: str | None = None,
              **kwargs: Any) -> ActorHandle:
        """Start CLS(*ARGS, **KWARGS) on an agent with RESOURCES free; return its handle.

        The actor holds RESOURCES until it ends. Its methods run in its own process, calls
        from one client in the order made, up to MAX_CONCURRENCY at once (threads; coroutine
        methods on its event loop). If its process or agent dies it is started again, up
        to RESTARTS times (-1: no limit). A NAMEd actor can be found with ``get_actor`` and
        outlives this client; an unnamed one ends when this client disconnects.
        """
        if not inspect.isclass(cls):
            raise TypeError(f"actor() needs a class, not {type(cls).__name__}")
        for label, value, low in (("max_concurrency", max_concurrency, 1),
                                  ("restarts", restarts, -1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{label} must be an int >= {low}, got {value!r}")
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        opts = self._options(resources, 0, priority, infeasible, None)
        actor_id = uuid.uuid4().hex
        methods = sorted(m for m in dir(cls)
                         if not m.startswith("__") and callable(getattr(cls, m, None)))
        deps: list[Any] = []
        index: dict[int, int] = {}
        frames = self._pickler.call(self._pickler.function(cls, deps, index), args, kwargs,
                                    deps, index)
        spec = {"id": actor_id, "name": name or "", "cls": cls.__qualname__,
                "methods": methods, "restarts": restarts, "concurrency": max_concurrency}
        ready = self._make_future(cls, f"{cls.__qualname__}.__init__-{name or actor_id[:8]}",
                                  frames, deps, opts, {"actor": spec})
        self._io.wake()
        if name is not None:
            # Sent after the construction, so the broker answers with the name's owner.
            owner = self._io.request(P.LOOKUP, {"name": name}, 30.0).get("actor") or {}
            if owner.get("id", actor_id) != actor_id:
                raise ValueError(f"an actor named {name!r} already exists")
        return ActorHandle(actor_id, cls.__qualname__, methods, name or "", self, ready)

    def get_actor(self, name: str, timeout: float = 10.0) -> ActorHandle:
        """Return a handle to the live actor called NAME; ValueError if there is none."""
        found = self._io.request(P.LOOKUP, {"name": name}, timeout).get("actor")
        if not found:
            raise ValueError(f"no live actor named {name!r}")
        return ActorHandle(found["id"], found["cls"], found["methods"], found["name"], self)

    def kill(self, actor: ActorHandle, timeout: float = 10.0) -> None:
        """End ACTOR now: its resources are free when this returns; later calls fail
        with ActorDiedError."""
        if not isinstance(actor, ActorHandle):
            raise TypeError(f"kill() needs an ActorHandle, not {type(actor).__name__}")
        self._io.request(P.KILL, {"actor": actor._zres_id}, timeout)

    def _call(self, actor: ActorHandle, method: str, args: tuple[Any, ...],
              kwargs: dict[str, Any], retries: int, key: str | None) -> Future:
        opts = self._options({}, retries, 0, "warn", key)
        deps: list[Any] = []
        frames = self._pickler.call(pickle.dumps(method, protocol=5), args, kwargs, deps, {})
        label = key or f"{actor._zres_cls}.{method}"
        future = self._make_future(label, key, frames, deps, opts, {"call": actor._zres_id})
        self._io.wake()
        return future

    def _check_open(self) -> None:
        if self._closed:
            raise ZresError("this client is closed")
        if self._io.dead:
            raise ZresError("this client's connection thread has stopped; make a new Client")

    # -- other requests -------------------------------------------------------------------
    def gather(self, futures: Any, timeout: float | None = None) -> Any:
        """Return the results of FUTURES, keeping their list/tuple/dict structure."""
        from .futures import gather
        return gather(futures, timeout)

    def why(self, future: Future, timeout: float = 10.0) -> str:
        """Ask the broker why FUTURE's task is not running yet."""
        if future.done():
            return "finished"
        return str(self._io.request(P.WHY, {"id": future.id}, timeout)["reason"])

    def status(self, timeout: float = 10.0) -> dict[str, Any]:
        """Return the broker's view: agents with total and free resources, task counts."""
        return self._io.request(P.STATUS, {}, timeout)

    def set_resources(self, agent: str, resources: Mapping[str, Any],
                      timeout: float = 10.0) -> list[dict[str, float]]:
        """Change AGENT's capacity while it runs: names given are set, 0 removes one.

        Waiting tasks that now fit start at once; lowering below what is in use lets
        running tasks finish and starts no new ones there until they fit.
        """
        reply = self._io.request(P.RESOURCES, {"agent": agent,
                                               "units": mapping_to_units(resources)}, timeout)
        if "error" in reply:
            raise ZresError(reply["error"])
        return [units_to_float(units) for units in reply["slots"]]

    def _cancel(self, future: Future) -> None:
        self._io.pending.pop(future.id, None)
        self._io.outbox.append((P.CANCEL, future.id, ()))
        future._release_when_dropped = True
        self._io.wake()

    def _release(self, task_id: int) -> None:
        if not self._closed:
            self._io.outbox.append((P.RELEASE, task_id, ()))
            self._io.wake()

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Disconnect; tasks still pending fail; stop the local cluster if this client owns one."""
        with self._io.lock:
            if self._closed:
                return
            self._closed = True
        with _clients_lock:
            if self in _clients:
                _clients.remove(self)
        self._io.stop()
        self._io.lose_all("the client was closed before the task finished", ZresError)
        if self.cluster is not None:
            self.cluster.close()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<zres.Client {self.address}{' closed' if self._closed else ''}>"


def _check_infeasible(mode: str) -> None:
    if mode not in _INFEASIBLE_MODES:
        raise ValueError(f"infeasible must be 'warn' or 'error', not {mode!r}")


def _set(future: Future, result: Any = None, exception: BaseException | None = None) -> None:
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
    except cf.InvalidStateError:
        pass  # cancelled meanwhile


_ERRORS: dict[str, type[BaseException]] = {
    "AgentLostError": errors.AgentLostError, "WorkerLostError": errors.WorkerLostError,
    "InfeasibleError": InfeasibleError, "BrokerLostError": BrokerLostError,
    "ActorDiedError": errors.ActorDiedError, "ValueError": ValueError,
    "CommandFailed": errors.CommandFailed,
    "CancelledError": cf.CancelledError, "ZresError": ZresError,
}


class _IOThread:
    """Owns the DEALER socket: sends batches, heartbeats, resolves futures."""

    def __init__(self, client: Client, address: str, broker_timeout: float | None) -> None:
        self.client_name = client.name
        self.ctx: zmq.Context[Any] = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.ROUTING_ID, uuid.uuid4().bytes)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.connect(address)
        self.outbox: deque[tuple[str, Any, Any]] = deque()
        self.pending: dict[int, Future] = {}
        self.requests: dict[int, cf.Future] = {}  # type: ignore[type-arg]
        self._request_ids = itertools.count(1)
        self.connected = _Flag()
        self.epoch: int | None = None
        self.hb_interval = 0.5
        self.broker_timeout = broker_timeout or float(os.environ.get(
            "ZRES_CLIENT__BROKER_TIMEOUT", 30.0))
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        # Closed only when nothing can use them any more: a user thread may still call
        # wake() as the I/O thread ends, and a closed descriptor's number can be reused.
        # Not at exit: the thread may still be running then (a client never closed).
        weakref.finalize(self, _close_fds, self._wake_r, self._wake_w).atexit = False
        self._awake = False
        self._stop = False
        self.dead = False  # the thread has ended: nothing more is sent or received
        self.lock = threading.Lock()  # guards swapping `pending` against inserts
        self._last_heard = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="zres-client-io", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        if not self._awake and not self.dead:
            self._awake = True
            os.write(self._wake_w, b"x")

    def request(self, kind: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        reply: cf.Future = cf.Future()  # type: ignore[type-arg]
        self.outbox.append((kind, (body, reply), ()))
        self.wake()
        try:
            return reply.result(timeout)  # type: ignore[no-any-return]
        except cf.TimeoutError:
            raise ZresError(f"the broker did not answer {kind} within {timeout:g}s") from None

    def stop(self) -> None:
        self._stop = True
        self.wake()
        self._thread.join(5)

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        self._hello()
        last_beat = time.monotonic()
        try:
            while not self._stop:
                poller.poll(int(self.hb_interval * 500))
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                # Only once the pipe is empty: a wake() after this writes a new byte (cleared
                # before, a wake() between the two would be swallowed until the next beat).
                self._awake = False
                self._send_outbox()
                self._receive()
                now = time.monotonic()
                if now - last_beat >= self.hb_interval:
                    last_beat = now
                    P.send(self.sock, P.encode(P.HEARTBEAT))
                    if now - self._last_heard > self.broker_timeout and self.pending:
                        lost = self.lose_all(
                            f"no word from the broker for {self.broker_timeout:g}s")
                        # Should the same broker come back, it must not run them for nobody.
                        for task_id in lost:
                            self.outbox.append((P.CANCEL, task_id, ()))
                            self.outbox.append((P.RELEASE, task_id, ()))
            P.send(self.sock, P.encode(P.BYE))
        except Exception as exc:  # a bug: say so on every waiting future, never hang them
            log.exception("client_io_failed")
            self.lose_all(f"the client's I/O thread failed: {exc!r}", ZresError)
        finally:
            self.dead = True
            self.sock.close(linger=200)

    def _hello(self) -> None:
        P.send(self.sock, P.encode(P.HELLO, {"client": self.client_name}))

    def _send_outbox(self) -> None:
        """Send everything queued: submits in batches, then cancels and releases."""
        submits: list[Any] = []
        frames: list[Any] = []
        releases: list[int] = []
        cancels: list[int] = []

        def flush_submits() -> None:
            if submits:
                self._send(P.SUBMIT, {"tasks": list(submits)}, list(frames))
                submits.clear()
                frames.clear()

        while self.outbox:
            kind, item, item_frames = self.outbox.popleft()
            if kind == P.SUBMIT:
                submits.append(item)
                frames.extend(item_frames)
                if len(submits) >= 1000:
                    flush_submits()
            elif kind == P.RELEASE:
                releases.append(item)
            elif kind == P.CANCEL:
                cancels.append(item)
            else:  # a request: the broker must see what was queued before it first
                flush_submits()
                if cancels:
                    self._send(P.CANCEL, {"ids": cancels})
                    cancels = []
                body, reply = item
                req = next(self._request_ids)
                self.requests[req] = reply
                self._send(kind, {**body, "req": req})
        flush_submits()
        if cancels:
            self._send(P.CANCEL, {"ids": cancels})
        if releases:
            self._send(P.RELEASE, {"ids": releases})

    def _send(self, kind: str, body: dict[str, Any], frames: list[Any] = ()) -> None:  # type: ignore[assignment]
        P.send(self.sock, P.encode(kind, body, frames))

    def _receive(self) -> None:
        while True:
            try:
                frames = P.recv(self.sock)
            except zmq.Again:
                return
            try:
                self._handle(P.decode(frames))
            except errors.ProtocolError as exc:
                log.warning("bad_message", error=str(exc))

    def _handle(self, msg: P.Message) -> None:
        self._last_heard = time.monotonic()
        if msg.kind == P.RESULTS:
            self._on_results(msg)
        elif msg.kind == P.WELCOME:
            self._on_welcome(msg)
        elif msg.kind == P.HEARTBEAT:
            if self.epoch is not None and msg.body.get("epoch") != self.epoch:
                self._hello()
        elif msg.kind == P.UNKNOWN:
            self._hello()
        elif msg.kind == P.WARN:
            self._on_warn(msg)
        elif msg.kind in (P.STATUS_REPLY, P.WHY_REPLY, P.RESOURCES_REPLY, P.KILL_REPLY,
                          P.LOOKUP_REPLY, P.JOBS_REPLY):
            reply = self.requests.pop(msg.body.get("req", -1), None)
            if reply is not None:
                reply.set_result(msg.body)

    def _on_welcome(self, msg: P.Message) -> None:
        epoch = msg.body.get("epoch")
        self.hb_interval = float(msg.body.get("heartbeat", 0.5))
        if self.epoch is not None and epoch != self.epoch:
            self.lose_all("the broker restarted and lost the task")
        elif self.epoch is not None and msg.body.get("new"):
            self.lose_all("the broker had dropped this client (silent too long) and "
                          "cancelled its tasks")
        self.epoch = epoch
        self.connected.set()

    def lose_all(self, why: str, error: type[ZresError] = BrokerLostError) -> list[int]:
        """Fail every pending future and request with ERROR(WHY); return the task ids."""
        with self.lock:
            pending, self.pending = self.pending, {}
        for future in pending.values():
            _set(future, exception=error(f"task {future.name}: {why}"))
        requests, self.requests = self.requests, {}
        for reply in requests.values():
            reply.set_exception(error(why))
        return list(pending)

    def _on_results(self, msg: P.Message) -> None:
        items = msg.body["results"]
        for (task_id, outcome, _, info), frames in zip(
                items, P.split_frames(msg.frames, [i[2] for i in items])):
            future = self.pending.pop(task_id, None)
            if future is None:
                continue
            future.agent = info.get("agent")
            future._release_when_dropped = True
            if outcome == P.OK:
                try:
                    _set(future, loads(frames))
                except Exception as exc:
                    _set(future, exception=errors.RemoteError(
                        f"the result of {future.name} cannot be unpickled here: {exc!r}"))
            elif outcome == P.RAISED:
                _set(future, exception=loads_exception(frames))
            else:
                error = _ERRORS.get(str(info.get("type")), ZresError)
                _set(future, exception=error(info.get("message", "task failed")))

    def _on_warn(self, msg: P.Message) -> None:
        future = self.pending.get(msg.body.get("id", -1))
        reason = str(msg.body.get("reason"))
        name = future.name if future is not None else "a task"
        if future is not None:
            future.infeasible = reason
        try:
            warnings.warn(f"zres: {name} cannot run on any connected agent: {reason}",
                          InfeasibleWarning, stacklevel=1)
        except Exception:  # warnings made errors: nobody can catch them in this thread
            log.warning("task_infeasible", task=name, reason=reason)


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


class _Flag(threading.Event):
    def wait_for(self, timeout: float) -> None:
        if not self.wait(timeout):
            raise TimeoutError


def default_client() -> Client:
    """Return the newest open client, starting one (and maybe a local cluster) if none."""
    with _clients_lock:
        if _clients:
            return _clients[-1]
    client = Client()
    atexit.register(client.close)
    return client
