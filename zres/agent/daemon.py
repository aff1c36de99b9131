"""The node daemon (``zres agent``): registers this node's capacity, runs what the broker
assigns, reports outcomes and losses.

It keeps one connection to its broker for its whole life, and a *session* (the broker's
record of it) that pauses and reconnections resume. A *lease* fences its work: it and its
workers start nothing once the broker may have given up on it; a session found ended is
stopped before the agent registers anew, except work a broker restarted on its state
takes back (``carry``). It routes tasks to ``running``, actors to ``actors``, command
jobs to ``jobs``; news goes out in ``reports``."""

from __future__ import annotations

import functools
import os
import re
import signal
import socket
import time
from typing import Any

import zmq

from ..core import keys, versions, wakeup
from ..core import protocol as P
from ..core.errors import ProtocolError
from ..core.resources import format_units, token_devices, units_to_float
from ..logs import get_logger
from .actors import ActorSupervisor
from .cancels import TakingBack
from .carry import CarryOver
from .connection import RECONNECTED, BrokerConnection
from .cpus import CoreBinder
from .data.node import NodeData
from .deferred import DeferredGrants
from .draining import Draining
from .fencing import Fencing
from .files import open_files
from .grants import Grant
from .heartbeat import HeartbeatThread
from .jobs import GRACE, JobRunner
from .memory.guard import Guard
from .memory.monitor import open_monitor
from .reports import Reports
from .running import TaskRunner
from .session import ReachWarning, Session
from .slots import SlotSpec
from .workers import WorkerPool

log = get_logger("zres.agent")
DRAIN_GRACE = 30.0   # seconds running work has to finish once the agent is told to stop


class Agent(Draining, Fencing, TakingBack):
    """Connect to the broker, register slots, run assigned tasks in worker processes."""

    def __init__(self, broker: str, slots: list[SlotSpec], name: str | None = None,
                 heartbeat_interval: float = 0.5, heartbeat_timeout: float = 3.0,
                 job_logs: str | None = None, job_grace: float = GRACE,
                 drain_grace: float = DRAIN_GRACE, key: keys.PeerKey | None = None,
                 state: str | None = None, data_listen: str | None = None,
                 store_memory: int | None = None, data_advertise: str | None = None,
                 memory_limits: str = "auto", memory_reserve: int | None = None,
                 bind_cpus: bool = False, job_log_keep: tuple[float, int | None] | None = None
                 ) -> None:
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.files, self.logs = open_files(self.name, state, job_logs)
        # Memory limits for work of its own process, and the node's reserve (see memory).
        self.memory = open_monitor(memory_limits, self.files.path, memory_reserve)
        self.slots = slots
        self.broker_address = broker
        self.ctx: zmq.Context[Any] = zmq.Context.instance()
        self.poller = zmq.Poller()
        self._connection = BrokerConnection(self.ctx, broker, key)  # (KEY: its, and the broker's)
        self.broker = self._connection.sock
        self.poller.register(self.broker, zmq.POLLIN)
        self.poller.register(self._connection.monitor, zmq.POLLIN)
        # (hand-offs wait for the broker's ack, and for the lease: see reports)
        self.reports = Reports(lambda: self.session.valid())
        self.pool = WorkerPool(slots, broker, self.logs.path, self.files, key)
        self.session = Session(self.pool.lease)
        # Its objects (big results, fetched inputs, uploads) and the port it serves them on.
        self.data = NodeData(self.files.path, slots, broker, key, data_listen, store_memory,
                             self.reports, data_advertise)
        self.pool.objects, self.pool.session = self.data.env, self.session
        self._reach = ReachWarning(broker)
        cpus = CoreBinder(len(slots)) if bind_cpus else None  # (cores of their own)
        self.runner = TaskRunner(slots, self.pool, self.reports, self.session.valid,
                                 memory=self.memory, cpus=cpus)
        self.actors = ActorSupervisor(self.pool, self.reports, self.runner.free,
                                      self.reports.exited, self.memory)
        self.jobs = JobRunner(self.logs, self.name, self._job_ended, job_grace,
                              watch=lambda fd: self.poller.register(fd, zmq.POLLIN),
                              unwatch=self.poller.unregister, memory=self.memory, cpus=cpus,
                              ranks=(broker, self.reports), keep=job_log_keep)
        self.guard = Guard(self.memory, self.name, self.runner, self.actors, self.jobs,
                           self.pool, resume=self._lease_came_back)
        self.carry = CarryOver(self.runner, self.jobs, self.reports, self.actors)
        self.poller.register(self.pool.links.fileno(), zmq.POLLIN)
        self.poller.register(self.data.server.stored_fd, zmq.POLLIN)  # (uploads stored)
        self.hb_interval, self.hb_timeout = heartbeat_interval, heartbeat_timeout
        # Beats that no busy turn of this loop can hold up; a loop stuck far longer than
        # the broker waits lets the broker give up on us, as for any silent agent.
        self.heartbeat = HeartbeatThread(self.ctx, broker, key, self.session,
                                         heartbeat_interval, stall=4 * heartbeat_timeout)
        self._leased = False                      # the lease held at the last turn
        self.drain_grace = drain_grace
        self._last_heard = time.monotonic()
        self._last_beat = 0.0
        self._last_reap = 0.0
        self._draining_until: float | None = None
        self._drain_asked = False
        self._silent = False
        self._deferred = DeferredGrants()        # grants that came while the lease lapsed
        self._stopping = False
        self._woken: int | None = None  # (see run)
        self.exit_code = 0
        self.refused: str | None = None  # why the broker refused our key, if it did

    # -- loop -----------------------------------------------------------------------
    def run(self) -> None:
        """Serve until stop() (SIGTERM, SIGINT: drain first); then stop the workers."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            # Only a flag: the loop sends; a handler must not interleave a message.
            signal.signal(sig, lambda *_: self._ask_drain())
        self._woken = wakeup.wake_on_signals(self.poller)  # (heard at once, not at the timeout)
        log.info("agent_started", agent=self.name, broker=self.broker_address,
                 slots=[format_units(s.units) for s in self.slots], state=self.files.path,
                 leftovers_removed=self.files.left)  # (an agent of this name was killed)
        self.jobs.stop_leftovers()
        self.memory.start()
        self.poller.register(self.memory.fd, zmq.POLLIN)  # (the node runs low, or is back)
        self.heartbeat.start()
        self.data.start()
        # One GPU-less worker per slot starts now, so the first task does not wait for it.
        for index in range(len(self.slots)):
            self.runner.worker(index, ())
        try:
            while not self._stopping:
                self.poll_once(time.monotonic(), timeout=self.hb_interval / 2)
        finally:
            self.shutdown()

    def stop(self) -> None:
        """Stop at once: what runs here is killed (and lost, for the broker)."""
        self._stopping = True

    def shutdown(self) -> None:
        self.heartbeat.stop()
        self.data.stop()
        self.jobs.stop_all()
        self.pool.close(self.actors.workers())
        self.memory.close()
        self.actors.by_id.clear()
        self._connection.close()
        self.files.close(self.logs)
        log.info("agent_stopped", agent=self.name)

    def poll_once(self, now: float, timeout: float = 0.0) -> None:
        """Move messages between broker and workers; heartbeat; reap dead workers."""
        events = dict(self.poller.poll(int(timeout * 1000)))
        if self._woken is not None and self._woken in events:
            wakeup.drain(self._woken)
        if self._connection.monitor in events:
            self._on_connection_events()
        if self.broker in events:
            self._drain_socket(self.broker, self._from_broker)
        if self.pool.links.fileno() in events:
            for ident, frames in self.pool.links.receive():
                self._handled(self._from_worker, ident, frames)
        if self._drain_asked and self._draining_until is None:
            self.drain()
        now = time.monotonic()
        if self.memory.fd in events:
            self.memory.drain()
        self.guard.turn(now)
        if self.jobs.exited(events) or now - self._last_reap >= 0.1:
            self._last_reap = now
            self.actors.reap()
            self.runner.reap()
            self.jobs.reap()
        if self._draining_until is not None:
            self._drain_step(now)
        leased = self.session.valid()
        if leased and not self._leased:  # (renewed by this loop or the heartbeat thread)
            self._lease_came_back()
        elif leased:
            self.reports.go_on()  # hand-offs a lapsed lease or a turn's budget held back
        self._leased = leased
        self.heartbeat.turned(now)
        self.data.turn()
        if self.session.registered:  # (numbered from the welcome) its hand-offs go once acked
            self._send_report()
        if now - self._last_beat >= self.hb_interval:
            self._last_beat = now
            # (with what its store holds, and its memory: limits, the node, each figure)
            P.send(self.broker, P.encode(P.HEARTBEAT, {
                "t": now, "session": self.session.id, "store": self.data.store.stats(),
                "memory": {**self.memory.describe(), "tasks": self.memory.figures()}}))
            silent = self.session.registered and now - self._last_heard > self.hb_timeout
            if silent and not self._silent:
                log.warning("broker_silent", seconds=round(now - self._last_heard, 1))
            self._silent = silent
        self._reach.update(now, self.session.registered)
        if not self.session.registered and not self._stopping and self.carry.ready() \
                and now - self.session.asked_at >= self.hb_timeout / 2:
            self._register(now)
        # The turn's tasks to the workers last, each worker's RUN the turn's last word: on
        # a machine of few cores the worker often waits for this process's CPU, and what
        # the turn did after the flush held it up (0.958-0.981 of the median side by side
        # against flushing before the rest of the turn).
        self.pool.flush()

    def _drain_socket(self, sock: zmq.Socket, handle: Any) -> None:
        for _ in range(1000):
            try:
                frames = P.recv(sock)
            except zmq.Again:
                return
            self._handled(handle, frames)
            if not P.waiting(sock):
                return

    @staticmethod
    def _handled(handle: Any, *args: Any) -> None:
        """HANDLE(*ARGS), one message: a bad one is logged and dropped, not fatal."""
        try:
            handle(*args)
        except ProtocolError as exc:
            log.warning("bad_message", error=str(exc))
        except Exception:  # a bug must not take the node's running work down
            log.exception("message_failed")

    def _on_connection_events(self) -> None:
        for event in self._connection.events():
            if event != RECONNECTED and not self._stopping:  # it refuses our key
                (log.info if self._connection.keyless else log.error)(  # (cli.cluster.agent)
                    "agent_refused", broker=self.broker_address, why=event)
                self.exit_code, self.refused = 1, event
                self.stop()
            elif event == RECONNECTED and self.session.registered:
                # A new connection: messages in flight on the old one may be lost. Resume
                # the session: the broker compares what it granted with what we hold.
                self._register(time.monotonic(), resume=True)

    # -- the session -------------------------------------------------------------------
    def _lease_came_back(self) -> None:
        """The lease holds again (or the node's memory is back): what waited starts."""
        if not self.session.valid():
            return
        for msg in self._deferred.take():
            self._on_assign(msg)
        self.runner.lease_renewed()
        self.reports.go_on()

    def _register(self, now: float, resume: bool = False) -> None:
        self.session.asked_at = now
        body: dict[str, Any] = {
            "name": self.name, "session": self.session.id, "host": socket.gethostname(),
            "pid": os.getpid(), "t": now, "versions": versions.mine(),
            "slots": [{"units": s.units, "gpus": s.gpus, "gpu_memory": s.gpu_memory}
                      for s in self.slots],
            **self.data.register_fields(new_session=not resume and self.session.epoch is None)}
        frames: list[Any] = []
        if resume or self.session.epoch is not None:  # (the broker says if it has it still)
            body["resume"] = True
            body["epoch"] = self.session.epoch
        elif self.session.epoch is None:  # a new session: offer the work still running
            offer, frames = self.carry.offer()
            body.update(offer)
        P.send(self.broker, P.encode(P.REGISTER, body, frames))

    def _on_welcome(self, msg: P.Message) -> None:
        epoch = msg.body.get("epoch")
        if msg.body.get("session") not in (None, self.session.id):
            return  # an answer to a session we have since left
        if self.session.epoch not in (None, epoch):
            # A new broker counts none of our work as running: stop it, or its resources
            # would be granted twice; but the work of a cluster that keeps its state runs
            # on, offered to it with the next session (it adopts it or stops it), with
            # the news the old broker did not acknowledge. (A new session either way:
            # its reports are numbered afresh.)
            self._fence("the broker restarted", keep=self.carry.adopts(msg))
            return
        self.data.welcomed(msg)
        cluster = msg.body.get("cluster")
        if isinstance(cluster, str) and re.fullmatch(r"[0-9a-f]{1,32}", cluster):
            self.jobs.cluster = cluster  # (it names a directory: nothing else is taken)
        starve = float(msg.body.get("starve", self.runner.starve))
        self.runner.starve = self.pool.starve = starve
        self.carry.clear()  # (offered with this session)
        first = self.session.welcomed(epoch, float(msg.body.get("lease", self.hb_timeout / 2)))
        self._last_heard = time.monotonic()
        self.session.renew(self.session.asked_at)
        self._acked(msg)
        if msg.body.get("resumed"):
            # Send again what it may not have had, then say what we hold, after it.
            for message in self.reports.unacked():
                P.send(self.broker, message)
            P.send(self.broker, P.encode(P.HOLDING, {
                "session": self.session.id, "tasks": self._holding(),
                "resumed": msg.body["resumed"]}))
            log.info("agent_resumed", agent=self.name, epoch=epoch)
        elif first:
            log.info("agent_registered", agent=self.name, epoch=epoch)

    def _holding(self) -> list[int]:
        return [*self.runner.holding(), *self.actors.holding(), *self.jobs.holding(),
                *self._deferred.ids()]

    def _acked(self, msg: P.Message) -> None:
        ack = msg.body.get("ack")
        if type(ack) is int:
            self.reports.acked(ack)

    def _send_report(self, last: bool = False) -> None:
        message = self.reports.take(self.session.id, last)
        if message is not None:
            P.send(self.broker, message)

    # -- broker side ------------------------------------------------------------------
    def _from_broker(self, frames: list[Any]) -> None:
        msg = P.decode(frames)
        self._last_heard = time.monotonic()
        session = msg.body.get("session")
        if session is not None and session != self.session.id \
                and msg.kind not in (P.WELCOME, P.UNKNOWN):
            return  # for a session we have left: its grants, acks and cancels are void
        if msg.kind == P.ASSIGN:
            self._acked(msg)
            self._on_assign(msg)
        elif msg.kind == P.HEARTBEAT or msg.kind == P.ACK:
            self._acked(msg)
            if msg.kind == P.HEARTBEAT and self.session.registered:
                if msg.body.get("epoch") != self.session.epoch:
                    self.session.ask_again()  # a new broker: register again
                elif isinstance(msg.body.get("echo"), float):
                    self.session.renew(msg.body["echo"])
        elif msg.kind == P.WELCOME:
            self._on_welcome(msg)
        elif msg.kind == P.UNKNOWN:
            self._on_unknown(msg)
        elif msg.kind == P.REFUSED:
            error = str(msg.body.get("error", "refused"))
            if msg.body.get("kind") == P.REGISTER:
                log.error("agent_refused", agent=self.name, why=error)
                self.exit_code = 1
                self.stop()
            else:
                log.warning("message_refused", kind=msg.body.get("kind"), why=error)
        elif msg.kind == P.CANCEL:
            self._on_cancel(msg)
        elif msg.kind == P.RECALL:
            self._on_recall(msg)
        elif msg.kind == P.CALL:
            self.actors.call(msg)
        elif msg.kind == P.LOGS:
            P.send(self.broker, P.encode(P.LOGS_REPLY, self.jobs.log_reply(msg)))
        elif msg.kind == P.KILL_ACTOR:
            self.actors.kill(P.field(msg, "ids", list))
        elif msg.kind == P.FREE:
            self.data.free(msg)
        elif msg.kind == P.RESOURCES:
            # Remember the new capacity, so a later re-registration offers it too.
            for spec, units in zip(self.slots, P.field(msg, "slots", list)):
                spec.units = P.check_units(units, "resources")
            self.runner.capacity_changed()
            log.info("agent_resources_changed", slots=[format_units(s.units)
                                                       for s in self.slots])

    def _on_assign(self, msg: P.Message) -> None:
        if (not self.session.valid() or self.guard.paused) and self._draining_until is None:
            # The broker may have given up on us: hold these until it is heard again (or
            # the session is found ended, and they go with it); or the node is low on
            # memory: until it is back.
            self._deferred.add(msg)
            return
        items = P.field(msg, "tasks", list)
        groups = P.split_frames(msg.frames, [i[4] + sum(max(c, 0) for c in i[5])
                                             for i in items])
        now = time.monotonic()
        grants: list[Grant] = []
        for (task_id, slot, units, gpus, nframes, dep_counts, *extra), frames in zip(items, groups):
            spec = self.slots[slot]
            opts = extra[0] if extra and isinstance(extra[0], dict) else {}
            devices = tuple(spec.gpus[pos] for pos in gpus) or token_devices(units)
            if self._draining_until is not None:
                self.reports.give_back(task_id)  # it crossed our goodbye
                continue
            context = {"agent": self.name, "resources": units_to_float(units),
                       "gpus": list(devices), "attempt": opts.get("attempt", 0)}
            if isinstance(opts.get("token"), str):  # (clients made in it act for its owner)
                context["token"] = opts["token"]
            if opts.get("refs"):  # inputs sent as references: its worker reads them itself
                context["refs"] = opts["refs"]
                context["payload"] = opts.get("payload", -1)  # (its call, if put: one of them)
                dep_counts = [max(count, 0) for count in dep_counts]
            item = [task_id, nframes, dep_counts, context]
            taken = P.check_units(opts.get("taken", units), "assign")
            if "actor" in opts:
                self.runner.hold(slot, task_id, taken)
                self.actors.start(opts, slot, devices, item, frames)
            elif "job" in opts:
                self.runner.hold(slot, task_id, taken)
                self.reports.held(task_id)
                self.reports.then(functools.partial(self._start_job, task_id, opts,
                                                    list(devices), (slot, gpus, taken)))
            else:
                grants.append(Grant(task_id, slot, taken, devices, item, frames,
                                    (-int(opts.get("priority", 0)), int(opts.get("seq", 0))),
                                    now, direct=not opts.get("queued")))
        self.runner.add(grants)

    def _start_job(self, task_id: int, opts: dict[str, Any], gpus: list[str],
                   place: tuple[int, list[int], dict[str, int]]) -> None:
        if task_id in self.runner.placements:  # (not cancelled while the broker heard)
            self.jobs.start(task_id, opts["job"], gpus, place, int(opts.get("attempt", 1)),
                            int(opts.get("priority", 0)))
            if task_id in self.jobs.jobs:
                self.reports.started(task_id)

    def _job_ended(self, task_id: int, outcome: str, frames: list[Any],
                   info: dict[str, Any]) -> None:
        self.runner.free(task_id)
        self.reports.result(task_id, outcome, frames, info)

    # -- worker side --------------------------------------------------------------------
    def _from_worker(self, ident: bytes, frames: list[Any]) -> None:
        worker = self.pool.by_ident.get(ident)
        if worker is None:
            return
        msg = P.decode(frames)
        if msg.kind == P.READY:
            self.pool.ready(worker)
        elif msg.kind == P.OUTPUT and self.session.registered and \
                time.monotonic() - self._last_heard < self.hb_timeout:  # (else lost)
            self._connection.send_or_drop(P.encode(P.OUTPUT, {
                "session": self.session.id, "items": msg.body["items"]}))
        elif msg.kind == P.DONE:
            items = msg.body["results"]
            results = P.split_frames(msg.frames, [i[2] for i in items])
            self.data.from_worker(msg.body)
            if worker.actor is not None:
                self.actors.done(worker, msg.body.get("started", []), items, results)
            else:
                self.runner.done(worker, msg.body, results)
