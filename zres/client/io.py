"""The client's I/O thread: the thread that keeps the client's DEALER socket.

User threads append a message to ``outbox`` and wake this thread through a pipe (only
when it is not already awake). It sends everything queued as one batch per kind,
heartbeats, and resolves futures as results arrive. One exception: a user thread sends a
lone submit itself while this thread waits (``outbox.send_submit_now``). Whichever thread
uses the socket holds ``sock_lock`` (a lock's hand-over is the memory barrier ZeroMQ asks
of a socket that changes threads); this one waits on the socket's descriptor, not on the
socket, so that it never uses the socket while it waits.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import os
import threading
import time
import uuid
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from ..core import errors, keys, net, versions, wakeup
from ..core import protocol as P
from ..core.errors import BrokerLostError, ZresError
from ..core.limits import Limits
from ..logs import get_logger
from .futures import Future
from .outbox import OutboxSender
from .outcomes import resolve, settle
from .output import Printer
from .session import BrokerSession

log = get_logger("zres.client")


class InfeasibleWarning(UserWarning):
    """A task asks for resources that no connected agent could ever provide."""


class IOThread(OutboxSender, BrokerSession):
    """Owns the DEALER socket: sends batches, heartbeats, resolves futures."""

    def __init__(self, client_name: str, address: str, broker_timeout: float | None,
                 key: keys.PeerKey | None = None, forward_output: bool = True,
                 token: str = "") -> None:
        self.client_name = client_name
        self.token = token  # of the task it was made in: it acts for that task's owner
        self.forward_output = forward_output  # print what our tasks print (see output)
        self.printer = Printer()
        self.address = address
        self.ctx: zmq.Context[Any] = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.ROUTING_ID, uuid.uuid4().bytes)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.key = key
        keys.secure(self.sock, key)  # (KEY: this client's, and its broker's public key)
        self._handshakes = keys.Handshakes(address, key)
        self._monitor = self.sock.get_monitor_socket(keys.HANDSHAKES | zmq.EVENT_DISCONNECTED)
        net.connect(self.sock, address)
        self.outbox: deque[tuple[str, Any, Any]] = deque()
        self.pending: dict[int, Future] = {}
        # Ended tasks whose results the broker keeps for us (their futures not let go of):
        # told to a restarted broker, which drops what it restored that we let go of (a
        # release it heard but had not written before it died would be lost).
        self.held: set[int] = set()
        # Futures that ended before the broker told their ids (a cancel's answer can come
        # first): told later, by local id.
        self.unnamed: dict[int, weakref.ref[Future]] = {}
        # Submissions sent and not yet acknowledged as kept by a broker that keeps its
        # state: sent again should it restart before writing them.
        self.unacked: deque[tuple[str, Any, Any]] = deque()
        # Submits sent and not yet taken by the broker: (last local id, tasks), and their
        # tasks in all (at most ``outbox.WINDOW``).
        self.in_flight: deque[tuple[int, int]] = deque()
        self.flying = 0
        self.releases: list[int] = []   # let go of, sent within RELEASE_EVERY (outbox)
        self.released_at = 0.0
        self.keeps = True       # whether the broker keeps its state (says its welcome)
        self.cluster: str | None = None
        self.requests: dict[int, cf.Future] = {}  # type: ignore[type-arg]
        self._request_ids = itertools.count(1)
        self.connected = Flag()
        self.refused: str | None = None   # why the broker refused our hello, if it did
        self.epoch: int | None = None
        self.limits = Limits()  # the broker's, once it has welcomed us
        self.relay: tuple[str, str] | None = None
        self.hb_interval = 0.5
        # How long the broker may be gone (restarting) before pending work fails.
        self.broker_timeout = broker_timeout or float(os.environ.get(
            "ZRES_CLIENT__BROKER_TIMEOUT", 300.0))
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        # Closed only when nothing can use them any more: a user thread may still call
        # wake() as the I/O thread ends, and a closed descriptor's number can be reused.
        # Not at exit: the thread may still be running then (a client never closed).
        weakref.finalize(self, _close_fds, self._wake_r, self._wake_w).atexit = False
        self._awake = self._stop = False
        self.dead = False  # the thread has ended: nothing more is sent or received
        self.lock = threading.Lock()  # guards swapping `pending` against inserts
        # Held by whichever thread uses the socket (and what is sent's bookkeeping): this
        # one, but for its waits; a user thread sending its submit itself (outbox).
        self.sock_lock = threading.Lock()
        self._settle: deque[Callable[[], None]] = deque()  # results of this turn, in order
        self._last_heard = time.monotonic()
        self._welcomed, self._hello_at = False, 0.0
        self._thread = threading.Thread(target=self._run, name="zres-client-io", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        if not self._awake and not self.dead:
            self._awake = True
            os.write(self._wake_w, b"x")

    def ask(self, kind: str, body: dict[str, Any]) -> cf.Future:  # type: ignore[type-arg]
        """Send a request (after everything queued before it); its reply comes later."""
        reply: cf.Future = cf.Future()  # type: ignore[type-arg]
        if self._stop or self.dead:  # (nothing would send it: its caller waited it out)
            reply.set_exception(ZresError("this client is closed" if self.refused is None else
                                          f"the broker refused this client: {self.refused}"))
            return reply
        self.outbox.append((kind, (body, reply), ()))
        self.wake()
        return reply

    def on_thread(self) -> bool:
        """Whether the caller is this I/O thread (a done-callback), which must not wait."""
        return threading.current_thread() is self._thread

    def request(self, kind: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        reply = self.ask(kind, body)
        try:
            return reply.result(timeout)  # type: ignore[no-any-return]
        except cf.TimeoutError:
            raise ZresError(f"the broker did not answer {kind} within {timeout:g}s") from None

    def stop(self) -> None:
        self._stop = True
        self.wake()
        if not self.on_thread():  # (a done-callback closing its client: it ends after)
            self._thread.join(5)

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        # The socket's own descriptor, not the socket: a user thread may use the socket
        # while this thread waits (see outbox.send_submit_now), never while it polls it.
        poller.register(self.sock.get(zmq.FD), zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        with self.sock_lock:
            self._hello()
        last_beat, more = time.monotonic(), False
        try:
            while not self._stop:
                # (the pipe and the monitor are looked at only when the poll says so: a
                # turn woken by a message, as most are, makes no call for them)
                events = dict(poller.poll(0 if more else int(self.hb_interval * 500)))
                with self.sock_lock:
                    self._turn(events)
                    last_beat = self._beat(last_beat)
                    # (asked last: the socket's descriptor says only that its state changed,
                    # and any send above may have taken the news of a message that came)
                    more = P.waiting(self.sock)
                # Results are settled with the socket free: the user thread woken by one
                # may send its next submit at once (a thread's wake-up, the kernel's IPI
                # included, is tens of microseconds of the waker's time).
                self._run_settles()
            with self.sock_lock:
                if self._welcomed:
                    self._send_releases(now=True)  # (those gathered go before the goodbye)
                P.send_now(self.sock, P.encode(P.BYE))
                self.dead = True
        except Exception as exc:  # a bug: say so on every waiting future, never hang them
            log.exception("client_io_failed")
            while self._settle:  # (results read: no longer pending, so not lost_all's)
                try:
                    self._settle.popleft()()
                except Exception:
                    log.exception("client_settle_failed")
            self.lose_all(f"the client's I/O thread failed: {exc!r}", ZresError)
        finally:
            with self.sock_lock:
                self.dead = True
                self.sock.disable_monitor()
                self._monitor.close(0)
                self.sock.close(linger=200)

    def _turn(self, events: dict[Any, int]) -> None:
        """One turn of the thread, after its poll returned EVENTS (under ``sock_lock``)."""
        if self._wake_r in events:
            wakeup.drain(self._wake_r)
            # Only once the pipe is empty: a wake() after this writes a new byte (cleared
            # before, a wake() between the two would be swallowed until the next beat).
            self._awake = False
        if self._monitor in events:
            self._check_handshakes()
        if self._welcomed:
            self._send_outbox()
        if P.waiting(self.sock):
            self._receive()

    def _run_settles(self) -> None:
        """Settle the results read, in order, each after the output that came before it."""
        while self._settle:
            self.printer.after_output(self._settle.popleft())

    def _beat(self, last_beat: float) -> float:
        """Send a heartbeat if one is due; fail what waits on a broker silent too long."""
        now = time.monotonic()
        if now - last_beat < self.hb_interval:
            return last_beat
        P.send_now(self.sock, P.encode(P.HEARTBEAT))
        if not self._welcomed and now - self._hello_at > 2 * self.hb_interval:
            self._hello()  # (it may have been lost with a connection)
        if now - self._last_heard > self.broker_timeout and self.pending:
            lost = self.lose_all(f"no word from the broker for {self.broker_timeout:g}s (the "
                                 "client's reconnect window, broker_timeout)")
            # Should the same broker come back, it must not run them for nobody.
            if lost:  # nobody waits for the answer
                self.ask(P.CANCEL, {"ids": lost})
            for task_id in lost:
                self.outbox.append((P.RELEASE, task_id, ()))
        return now

    def _check_handshakes(self) -> None:
        """A refused key: say so at once, failing what waits; lost connection: await a welcome."""
        while self._monitor.poll(0):
            event = net.monitor_event(self._monitor)[0]
            if (event == zmq.EVENT_DISCONNECTED and self._welcomed) or (  # (back: at once)
                    event == zmq.EVENT_HANDSHAKE_SUCCEEDED and self.epoch is not None
                    and not self._welcomed):
                self._hello()
            why = self._handshakes.refused(event)
            if why is None:
                continue
            if self.refused is None and self.connected.is_set():
                # (while Client() connects, it raises it, or looks for keys made meanwhile)
                log.error("client_refused", broker=self.address, why=why)
            self.refused = why
            self.connected.set()
            self.lose_all(f"the broker at {self.address} refused this client: {why}",
                          ZresError)
            self._stop = True  # (nothing more to say to it: the thread ends)

    def _hello(self) -> None:
        """Say hello (again): nothing more is sent until the broker's welcome says which
        broker it is (a restarted one first gets again what it did not keep, in order)."""
        self._welcomed = False
        self._hello_at = time.monotonic()
        quiet = {} if self.forward_output else {"output": False}  # (then it sends none)
        P.send_now(self.sock, P.encode(P.HELLO, {"client": self.client_name, **quiet,
                                                "versions": versions.mine(), "token": self.token}))

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
            if not P.waiting(self.sock):
                return  # (asked: no zmq.Again at the end)

    def _handle(self, msg: P.Message) -> None:
        self._last_heard = time.monotonic()
        if self._settle and msg.kind != P.RESULTS:
            # (what this may end or print comes after the results read before it: a
            # cancel's answer never finds its task's result unsettled)
            self._run_settles()
        if msg.kind == P.RESULTS:
            if "upto" in msg.body:  # (an acknowledgement riding with them: see accepting)
                self._on_accepted(msg.body)
            self._on_results(msg)
        elif msg.kind == P.OUTPUT and self.forward_output:
            self.printer.output(msg.body.get("items", []))
        elif msg.kind == P.RUNNING:
            for task_id in msg.body.get("ids", ()):
                future = self.pending.get(task_id)
                if future is not None:
                    future._set_running()
        elif msg.kind == P.ACCEPTED:
            self._on_accepted(msg.body)
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
                          P.LOOKUP_REPLY, P.JOBS_REPLY, P.CANCEL_REPLY, P.LOCATE_REPLY,
                          P.PLACE_REPLY, P.GROUP_REPLY, P.TASK_CANCEL_REPLY):
            reply = self.requests.pop(msg.body.get("req", -1), None)
            if reply is not None:
                reply.set_result(msg.body)
        elif msg.kind == P.REFUSED:
            self._on_refused(msg)

    def _learn_ids(self, runs: Any) -> None:
        """The broker's ids of our tasks, as runs [first local id, first id, count]: what
        their futures show (``Future.id``)."""
        for run in runs if isinstance(runs, list) else ():
            if not (isinstance(run, list) and len(run) == 3
                    and all(type(v) is int for v in run)):
                continue
            local, task_id, count = run
            for offset in range(count):
                future = self.pending.get(local + offset)
                if future is None and self.unnamed:
                    ref = self.unnamed.pop(local + offset, None)
                    future = ref() if ref is not None else None
                if future is not None:
                    future._id = task_id + offset

    def ended_unnamed(self, future: Future) -> None:
        """FUTURE left ``pending`` before the broker told its id: it may still come."""
        if future._id is None:
            self.unnamed[future._local] = weakref.ref(future)

    def _on_refused(self, msg: P.Message) -> None:
        """The broker refused a message (over a limit, malformed, not ours): fail what it was."""
        kind = msg.body.get("kind")
        # Before its first welcome a client has sent only its hello (and heartbeats): a
        # refusal of a message the broker could not even read (over max_header_bytes) is
        # of the hello, and waiting longer cannot change the answer.
        unread = not kind and self.epoch is None and not self._welcomed
        why = (f"the broker refused {'its hello' if unread else 'it'}: "
               f"{msg.body.get('error', 'no reason given')}")
        if kind == P.HELLO or unread:
            self.refused = why
            self.connected.set()
            self.lose_all(f"the broker at {self.address} refused this client: {why}", ZresError)
            self._stop = True
            return
        ids = msg.body.get("ids")
        for task_id in ids if isinstance(ids, list) else []:
            future = self.pending.pop(task_id, None)
            if future is not None:
                settle(future, exception=ZresError(f"task {future.label}: {why}"))
        if kind == P.SUBMIT and isinstance(ids, list):  # (taken: more may go)
            self._acknowledged(max((i for i in ids if type(i) is int), default=-1))
        reply = self.requests.pop(msg.body.get("req", -1), None)
        if reply is not None:
            reply.set_exception(ZresError(why))
        if not ids and reply is None:
            log.warning("message_refused", kind=kind, why=why)

    def lose_all(self, why: str, error: type[ZresError] = BrokerLostError,
                 detached: str | None = None) -> list[int]:
        """Fail every pending future and request with ERROR(WHY) (a detached task's with
        DETACHED, if given: it goes on); return their local ids."""
        with self.lock:
            pending, self.pending = self.pending, {}
        for future in pending.values():
            said = detached if detached is not None and future.detached else why
            settle(future, exception=error(f"task {future.label}: {said}"))
        requests, self.requests = self.requests, {}
        for reply in requests.values():
            reply.set_exception(error(why))
        return list(pending)

    def _on_accepted(self, body: dict[str, Any]) -> None:
        """The broker has kept our submits up to local id UPTO, with these IDS."""
        upto = body.get("upto")
        while self.unacked and type(upto) is int and self.unacked[0][1][0] <= upto:
            self.unacked.popleft()
        self._learn_ids(body.get("ids"))
        if type(upto) is int:
            self._acknowledged(upto)

    def _on_results(self, msg: P.Message) -> None:
        items = msg.body["results"]
        with self.lock:  # (against a client letting go of them meanwhile: see forget)
            futures = [self.pending.pop(i[0], None) for i in items]
            for future in futures:
                if future is not None:
                    future._release_when_dropped = True
                    self.held.add(future._local)
                    self.ended_unnamed(future)
        batch = list(zip(futures, items, P.split_frames(msg.frames, [i[2] for i in items])))
        batch.reverse()
        del futures

        def settle_all() -> None:
            # (each let go of once settled: a caller that drops a result at once frees it,
            # while the rest of the batch is settled)
            while batch:
                future, (_, outcome, _, info), frames = batch.pop()
                if future is not None:
                    resolve(future, outcome, frames, info)
                del future, frames
        self._settle.append(settle_all)  # (once the turn lets go of the socket: see _run)

    def _on_warn(self, msg: P.Message) -> None:
        future = self.pending.get(msg.body.get("id", -1))
        reason = str(msg.body.get("reason"))
        name = future.label if future is not None else "a task"
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


class Flag(threading.Event):
    def wait_for(self, timeout: float) -> None:
        if not self.wait(timeout):
            raise TimeoutError
