"""The node daemon (``zres agent``): registers this node's capacity, runs what the broker
assigns, reports outcomes and losses.

The agent keeps no queue of tasks waiting for resources: the broker assigns a task only
when it fits (or queues it on a slot, see ``running``). The daemon holds the link to the
broker and routes its messages: tasks to the ``running`` slots, actors to ``actors``,
processes live in the ``workers`` pool.
"""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from typing import Any

import structlog
import zmq

from ..core import protocol as P
from ..core.errors import ProtocolError
from ..core.resources import format_units, token_devices, units_to_float
from . import commands
from .actors import ActorSupervisor
from .running import TaskRunner
from .slots import SlotSpec
from .workers import WorkerPool

log = structlog.get_logger("zres.agent")


class Agent:
    """Connect to the broker, register slots, run assigned tasks in worker processes."""

    def __init__(self, broker: str, slots: list[SlotSpec], name: str | None = None,
                 heartbeat_interval: float = 0.5, heartbeat_timeout: float = 3.0,
                 job_logs: str | None = None) -> None:
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.job_logs = job_logs or commands.default_log_dir()
        os.makedirs(self.job_logs, exist_ok=True)
        self.slots = slots
        self.broker_address = broker
        self.ctx: zmq.Context[Any] = zmq.Context.instance()
        self.poller = zmq.Poller()
        self.broker = self._connect()
        self.pool = WorkerPool(self.ctx, slots, broker, self.job_logs)
        self.runner = TaskRunner(slots, self.pool, self._report)
        self.actors = ActorSupervisor(self.pool, self._report, self.runner.free,
                                      self._actor_exited)
        self.hb_interval = heartbeat_interval
        self.hb_timeout = heartbeat_timeout
        self.epoch: int | None = None
        self.registered = False
        self._last_heard = time.monotonic()
        self._last_beat = 0.0
        self._last_register = 0.0
        self._last_reap = 0.0
        self._stopping = False
        self.exit_code = 0
        self._done: tuple[list[Any], list[Any]] = ([], [])
        self.poller.register(self.pool.sock, zmq.POLLIN)

    def _connect(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, uuid.uuid4().bytes)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.broker_address)
        self.poller.register(sock, zmq.POLLIN)
        return sock

    def _reconnect(self) -> None:
        """Start over with a fresh socket, so no stale queued message reaches the broker."""
        self.poller.unregister(self.broker)
        self.broker.close(0)
        self.broker = self._connect()

    # -- loop -----------------------------------------------------------------------
    def run(self) -> None:
        """Serve until stop() or SIGINT/SIGTERM; then stop the worker processes."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.stop())
        log.info("agent_started", agent=self.name, broker=self.broker_address,
                 slots=[format_units(s.units) for s in self.slots])
        # One GPU-less worker per slot starts now, so the first task does not wait for it.
        for index in range(len(self.slots)):
            self.runner.worker(index, ())
        try:
            while not self._stopping:
                self.poll_once(time.monotonic(), timeout=self.hb_interval / 2)
        finally:
            self.shutdown()

    def stop(self) -> None:
        self._stopping = True

    def shutdown(self) -> None:
        self.pool.close(self.actors.workers())
        self.actors.by_id.clear()
        self.broker.close(0)
        log.info("agent_stopped", agent=self.name)

    def poll_once(self, now: float, timeout: float = 0.0) -> None:
        """Move messages between broker and workers; heartbeat; reap dead workers."""
        events = dict(self.poller.poll(int(timeout * 1000)))
        if self.broker in events:
            self._drain(self.broker, self._from_broker)
        if self.pool.sock in events:
            self._drain(self.pool.sock, self._from_worker)
        self.pool.flush()
        now = time.monotonic()
        if now - self._last_reap >= 0.1:
            self._last_reap = now
            self.actors.reap()
            self.runner.reap()
        self._flush_done()
        if now - self._last_beat >= self.hb_interval:
            self._last_beat = now
            P.send(self.broker, P.encode(P.HEARTBEAT))
        silent = now - self._last_heard > self.hb_timeout
        if (not self.registered or silent) and now - self._last_register >= self.hb_timeout / 2:
            if silent:
                if self.registered:
                    log.warning("broker_silent", seconds=round(now - self._last_heard, 1))
                self._reconnect()
            self._register(now)

    def _drain(self, sock: zmq.Socket, handle: Any) -> None:
        for _ in range(1000):
            try:
                frames = P.recv(sock)
            except zmq.Again:
                return
            try:
                handle(frames)
            except ProtocolError as exc:
                log.warning("bad_message", error=str(exc))
            except Exception:  # a bug must not take the node's running work down
                log.exception("message_failed")

    # -- broker side ------------------------------------------------------------------
    def _register(self, now: float) -> None:
        self._last_register = now
        self.registered = False
        P.send(self.broker, P.encode(P.REGISTER, {
            "name": self.name, "host": socket.gethostname(), "pid": os.getpid(),
            "slots": [{"units": s.units, "gpus": s.gpus, "gpu_memory": s.gpu_memory}
                      for s in self.slots]}))

    def _from_broker(self, frames: list[Any]) -> None:
        msg = P.decode(frames)
        self._last_heard = time.monotonic()
        if msg.kind == P.ASSIGN:
            self._on_assign(msg)
        elif msg.kind == P.WELCOME:
            self._on_welcome(msg)
        elif msg.kind == P.UNKNOWN:
            if msg.body.get("replaced"):
                log.error("agent_replaced", agent=self.name,
                          why="another agent registered with the same name; stopping")
                self.exit_code = 1
                self.stop()
            elif self.registered:
                log.warning("broker_forgot_us")
                self.registered = False
                self._last_register = 0.0
        elif msg.kind == P.HEARTBEAT:
            if self.registered and msg.body.get("epoch") != self.epoch:
                self.registered = False
                self._last_register = 0.0
        elif msg.kind == P.CANCEL:
            for task_id in P.field(msg, "ids", list):
                self.runner.cancel(task_id)
        elif msg.kind == P.CALL:
            self.actors.call(msg)
        elif msg.kind == P.LOGS:
            self._on_logs(msg)
        elif msg.kind == P.KILL_ACTOR:
            self.actors.kill(P.field(msg, "ids", list))
        elif msg.kind == P.RESOURCES:
            # Remember the new capacity, so a later re-registration offers it too.
            for spec, units in zip(self.slots, P.field(msg, "slots", list)):
                spec.units = P.check_units(units, "resources")
            self.runner.capacity_changed()
            log.info("agent_resources_changed", slots=[format_units(s.units)
                                                       for s in self.slots])

    def _on_welcome(self, msg: P.Message) -> None:
        epoch = msg.body.get("epoch")
        if (self.runner.busy() or self.actors.by_id) and not (msg.body.get("kept")
                                                              and epoch == self.epoch):
            # The broker that welcomes us (a new one, or the old one that gave us up for
            # lost and retried our tasks) counts none of them as running: stop them, or
            # their resources would be granted twice.
            self._abandon_running("broker restarted")
        self.epoch = epoch
        self.registered = True
        log.info("agent_registered", agent=self.name, epoch=epoch)

    def _abandon_running(self, why: str) -> None:
        self.runner.abandon(why)
        self.actors.stop_all(why)
        self.pool.drop_pending()
        self._done = ([], [])

    def _on_assign(self, msg: P.Message) -> None:
        items = P.field(msg, "tasks", list)
        groups = P.split_frames(msg.frames, [i[4] + sum(i[5]) for i in items])
        for (task_id, slot, units, gpus, nframes, dep_counts, *extra), frames in zip(
                items, groups):
            spec = self.slots[slot]
            opts = extra[0] if extra and isinstance(extra[0], dict) else {}
            devices = tuple(spec.gpus[pos] for pos in gpus) or token_devices(units)
            context = {"agent": self.name, "resources": units_to_float(units),
                       "gpus": list(devices)}
            item = [task_id, nframes, dep_counts, context]
            taken = P.check_units(opts.get("taken", units), "assign")
            if "actor" in opts:
                self.runner.hold(slot, task_id, taken)
                self.actors.start(opts, slot, devices, item, frames)
            elif opts.get("queued"):
                self.runner.queue(slot, (task_id, taken, devices, item, frames))
            else:  # the broker started it: it fits here by the same accounting
                self.runner.hold(slot, task_id, taken)
                self.runner.run(slot, devices, item, frames)

    def _on_logs(self, msg: P.Message) -> None:
        job, offset = P.field(msg, "job", int), P.field(msg, "offset", int)
        body: dict[str, Any] = {"token": msg.body.get("token"), "job": job}
        try:
            body["data"] = commands.read_log(self.job_logs, job, max(offset, 0))
        except OSError as exc:
            body["error"] = f"agent {self.name} has no log for job {job}: {exc.strerror or exc}"
        P.send(self.broker, P.encode(P.LOGS_REPLY, body))

    def _actor_exited(self, body: dict[str, Any]) -> None:
        self._flush_done()  # results it sent before dying go first
        P.send(self.broker, P.encode(P.ACTOR_EXIT, body))

    # -- worker side --------------------------------------------------------------------
    def _from_worker(self, frames: list[Any]) -> None:
        worker = self.pool.by_ident.get(frames[0].bytes)
        if worker is None:
            return
        msg = P.decode(frames[1:])
        if msg.kind == P.READY:
            self.pool.ready(worker)
        elif msg.kind == P.DONE:
            items = msg.body["results"]
            results = P.split_frames(msg.frames, [i[2] for i in items])
            if worker.actor is not None:
                self.actors.done(worker, items, results)
            else:
                self.runner.done(worker, msg.body, results)

    def _report(self, task_id: int, outcome: str, frames: list[Any],
                info: dict[str, Any]) -> None:
        self._done[0].append([task_id, outcome, len(frames), info])
        self._done[1].extend(frames)

    def _flush_done(self) -> None:
        if self._done[0]:
            P.send(self.broker, P.encode(P.DONE, {"results": self._done[0]}, self._done[1]))
            self._done = ([], [])
