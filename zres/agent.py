"""The node daemon: registers this node's capacity, runs what the broker assigns.

The agent keeps no queue of tasks waiting for resources: the broker assigns a task only
when it fits. The agent's job is to start and supervise worker processes, one per slot
and GPU device set, hand each task to the right one, and report results and losses.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import structlog
import zmq

from . import commands
from . import gpu as gpu_mod
from . import protocol as P
from .errors import ProtocolError, ResourceSpecError
from .resources import (
    CPU,
    GPU,
    MEMORY,
    UNIT,
    Units,
    format_amount,
    format_units,
    token_devices,
    units_to_float,
)
from .scheduler import GPU_MEMORY

log = structlog.get_logger("zres.agent")


# A grant waiting for room: task id, taken units, devices, RUN item, payload frames.
QueuedGrant = tuple[int, Units, tuple[str, ...], list[Any], list[Any]]


@dataclass(slots=True)
class SlotSpec:
    units: Units
    gpus: list[str]        # device ids for CUDA_VISIBLE_DEVICES, one per whole GPU
    nthreads: int
    gpu_memory: list[int] = field(default_factory=list)   # units per device, if detected
    # What runs here now (the broker's grants, as taken) and grants waiting for room, in
    # the order granted: the broker applies the same start rule to the same events.
    used: dict[str, int] = field(default_factory=dict)
    queue: deque[QueuedGrant] = field(default_factory=deque)
    # The head of the queue, handed to the one worker process that runs everything this
    # slot runs, which starts them by the same rule with no round trip (see zres.worker);
    # kept here until they start, to requeue them if that process dies.
    delegated: dict[int, QueuedGrant] = field(default_factory=dict)
    delegate: Worker | None = None
    cancelling: set[int] = field(default_factory=set)  # delegated, cancel sent, not answered

    def fits(self, taken: Units) -> bool:
        return all(self.units.get(n, 0) - self.used.get(n, 0) >= a for n, a in taken.items())


@dataclass(slots=True)
class Worker:
    """One worker process: a slot and a fixed device set, or one actor."""

    ident: bytes
    slot: int
    gpus: tuple[str, ...]
    proc: subprocess.Popen[bytes]
    ready: bool = False
    backlog: list[tuple[list[Any], list[Any]]] = field(default_factory=list)
    running: set[int] = field(default_factory=set)
    actor: ActorProcess | None = None


@dataclass(slots=True)
class ActorProcess:
    """What an agent knows of the actor a worker process hosts.

    The process starts calls in the order sent, at most ``concurrency`` at once, and
    reports each result before it starts the call that takes its place; so when the
    process dies, the calls that had started are at most the oldest ``concurrency``
    unfinished ones, and the rest can run on the next instance.
    """

    id: str
    placement: int               # the broker's id for this construction
    concurrency: int
    context: dict[str, Any]
    sent: dict[int, None] = field(default_factory=dict)   # unfinished, in the order sent

    def started(self) -> list[int]:
        if self.placement in self.sent:
            return [self.placement]
        return list(self.sent)[:self.concurrency]


def plan_slots(declared: Units, nworkers: int, nthreads: int | None,
               detect: bool = True) -> list[SlotSpec]:
    """Work out each slot's capacity: detected CPU, MEMORY, GPU, overridden by DECLARED.

    Declared amounts are offered in full by every slot (as Dask's --resources); detected
    memory and GPUs are split between slots so the node is never offered twice over.
    """
    if nworkers < 1:
        raise ResourceSpecError("nworkers must be at least 1")
    threads = nthreads or max(1, (os.cpu_count() or 1) // nworkers)
    tokens = [name for name in declared if token_devices({name: 1})]
    if tokens and GPU in declared:
        raise ResourceSpecError(f"invalid resource spec: declare GPU=k or per-device tokens "
                                f"({', '.join(tokens)}), not both")
    # Per-device tokens stand for the devices: offering detected GPUs too would offer
    # each device twice.
    devices = gpu_mod.discover() if detect and not tokens else []
    memory = _total_memory() // nworkers if detect else 0
    if declared.get(GPU, 0) % UNIT:
        raise ResourceSpecError(f"invalid resource spec 'GPU={format_amount(GPU, declared[GPU])}'"
                                ": an agent's GPU must be a whole number of devices")
    slots = []
    for index in range(nworkers):
        units: Units = {CPU: threads * UNIT}
        if memory:
            units[MEMORY] = memory * UNIT
        mine = devices[index::nworkers]
        if GPU in declared:
            # Each slot gets devices of its own, never the same physical GPU twice.
            count = declared[GPU] // UNIT
            if devices and len(devices) < count * nworkers:
                raise ResourceSpecError(
                    f"invalid resource spec 'GPU={count}': {nworkers} worker(s) of {count} "
                    f"GPU(s) need {count * nworkers} devices, this node has {len(devices)}")
            mine = devices[index * count:(index + 1) * count]
            ids = [d.id for d in mine] or [str(index * count + i) for i in range(count)]
        else:
            ids = [d.id for d in mine]
        if ids:
            units[GPU] = len(ids) * UNIT
        gpu_mem = [d.memory * UNIT for d in mine] if GPU_MEMORY not in declared else []
        if sum(gpu_mem):
            units[GPU_MEMORY] = sum(gpu_mem)
        else:
            gpu_mem = []
        units.update(declared)
        if not units.get(GPU):
            units.pop(GPU, None)
            ids, gpu_mem = [], []
        slots.append(SlotSpec(units, ids, threads, gpu_mem))
    return slots


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


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
        self._tmp = tempfile.mkdtemp(prefix="zres-agent-")
        self.workers_sock = self.ctx.socket(zmq.ROUTER)
        self.workers_sock.setsockopt(zmq.LINGER, 0)
        self.workers_address = f"ipc://{self._tmp}/workers"
        self.workers_sock.bind(self.workers_address)
        self.hb_interval = heartbeat_interval
        self.hb_timeout = heartbeat_timeout
        self.workers: dict[tuple[int, tuple[str, ...]], Worker] = {}
        self.by_ident: dict[bytes, Worker] = {}
        self.task_worker: dict[int, Worker] = {}
        self.held: dict[int, tuple[int, Units]] = {}   # task or actor placement -> slot, taken
        self._runs: dict[bytes, tuple[list[Any], list[Any]]] = defaultdict(lambda: ([], []))
        self.actors: dict[str, Worker] = {}
        self.epoch: int | None = None
        self.registered = False
        self._last_heard = time.monotonic()
        self._last_beat = 0.0
        self._last_register = 0.0
        self._last_reap = 0.0
        self._stopping = False
        self.exit_code = 0
        self._done: tuple[list[Any], list[Any]] = ([], [])
        self.poller.register(self.workers_sock, zmq.POLLIN)

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
            self._worker(index, ())
        try:
            while not self._stopping:
                self.poll_once(time.monotonic(), timeout=self.hb_interval / 2)
        finally:
            self.shutdown()

    def stop(self) -> None:
        self._stopping = True

    def shutdown(self) -> None:
        for worker in [*self.workers.values(), *self.actors.values()]:
            _kill(worker.proc)
        self.workers.clear()
        self.actors.clear()
        self.broker.close(0)
        self.workers_sock.close(0)
        try:
            os.unlink(f"{self._tmp}/workers")
            os.rmdir(self._tmp)
        except OSError:
            pass
        log.info("agent_stopped", agent=self.name)

    def poll_once(self, now: float, timeout: float = 0.0) -> None:
        """Move messages between broker and workers; heartbeat; reap dead workers."""
        events = dict(self.poller.poll(int(timeout * 1000)))
        if self.broker in events:
            self._drain(self.broker, self._from_broker)
        if self.workers_sock in events:
            self._drain(self.workers_sock, self._from_worker)
        self._flush_runs()
        now = time.monotonic()
        if now - self._last_reap >= 0.1:
            self._last_reap = now
            self._reap()
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
            self._on_cancel(msg)
        elif msg.kind == P.CALL:
            self._on_call(msg)
        elif msg.kind == P.LOGS:
            self._on_logs(msg)
        elif msg.kind == P.KILL_ACTOR:
            for actor_id in P.field(msg, "ids", list):
                worker = self.actors.pop(str(actor_id), None)
                if worker is not None:
                    log.info("actor_killed", actor=actor_id, pid=worker.proc.pid)
                    _kill(worker.proc)
                    self.by_ident.pop(worker.ident, None)
                    self._free(worker.actor.placement if worker.actor else -1)
        elif msg.kind == P.RESOURCES:
            # Remember the new capacity, so a later re-registration offers it too.
            for index, (spec, units) in enumerate(zip(self.slots, P.field(msg, "slots", list))):
                spec.units = P.check_units(units, "resources")
                if spec.delegate is not None and spec.delegate.ready:
                    self._runs[spec.delegate.ident]  # a RUN carries the new capacity
                self._start_queued(index)
            log.info("agent_resources_changed", slots=[format_units(s.units)
                                                       for s in self.slots])

    def _on_welcome(self, msg: P.Message) -> None:
        epoch = msg.body.get("epoch")
        if (self.task_worker or self.actors) and not (msg.body.get("kept")
                                                      and epoch == self.epoch):
            # The broker that welcomes us (a new one, or the old one that gave us up for
            # lost and retried our tasks) counts none of them as running: stop them, or
            # their resources would be granted twice.
            self._abandon_running("broker restarted")
        self.epoch = epoch
        self.registered = True
        log.info("agent_registered", agent=self.name, epoch=epoch)

    def _abandon_running(self, why: str) -> None:
        holding = {id(spec.delegate) for spec in self.slots}
        for worker in list(self.workers.values()):
            if worker.running or worker.backlog or id(worker) in holding:
                log.warning("worker_stopped", pid=worker.proc.pid, why=why,
                            tasks=len(worker.running) + len(worker.backlog))
                _kill(worker.proc)
                self._forget(worker)
        for worker in self.actors.values():
            log.warning("actor_stopped", pid=worker.proc.pid, why=why)
            _kill(worker.proc)
            self.by_ident.pop(worker.ident, None)
        self.actors.clear()
        for spec in self.slots:
            spec.used.clear()
            spec.queue.clear()
            spec.delegated.clear()
            spec.delegate = None
        self.held.clear()
        self._runs.clear()
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
                self._hold(slot, task_id, taken)
                self._start_actor(opts, slot, devices, item, frames)
            elif opts.get("queued"):
                spec.queue.append((task_id, taken, devices, item, frames))
                self._start_queued(slot)
            else:  # the broker started it: it fits here by the same accounting
                self._hold(slot, task_id, taken)
                self._run(slot, devices, item, frames)

    def _hold(self, slot: int, task_id: int, taken: Units) -> None:
        used = self.slots[slot].used
        for name, amount in taken.items():
            used[name] = used.get(name, 0) + amount
        self.held[task_id] = (slot, taken)

    def _free(self, task_id: int) -> None:
        """TASK_ID has ended here: return what it took and start what now fits."""
        held = self.held.pop(task_id, None)
        if held is None:
            return
        slot, taken = held
        used = self.slots[slot].used
        for name, amount in taken.items():
            used[name] -= amount
        self._start_queued(slot)

    def _start_queued(self, slot: int) -> None:
        """Start SLOT's queued grants in order while the head fits (the broker's rule)."""
        spec = self.slots[slot]
        if spec.delegated:
            return  # ahead of the rest; the worker holding them starts them
        while spec.queue and spec.fits(spec.queue[0][1]):
            task_id, taken, devices, item, frames = spec.queue.popleft()
            self._hold(slot, task_id, taken)
            self._run(slot, devices, item, frames)
        while spec.queue:
            worker = self._delegate_to(slot, spec.queue[0][2])
            if worker is None:
                return
            entry = spec.queue.popleft()
            task_id, taken, _, item, frames = entry
            spec.delegated[task_id] = entry
            spec.delegate = worker
            self._send_to(worker, [item[0], item[1], item[2],
                                   {**item[3], "taken": taken, "queued": True}], frames)

    def _delegate_to(self, slot: int, devices: tuple[str, ...]) -> Worker | None:
        """Return the process that may hold SLOT's queue: the one running all it runs."""
        spec = self.slots[slot]
        worker = self.workers.get((slot, devices))
        if worker is None or worker.proc.poll() is not None or (
                spec.delegate is not None and spec.delegate is not worker):
            return None
        for task_id, (held_slot, _) in self.held.items():
            if held_slot == slot and self.task_worker.get(task_id) is not worker:
                return None  # an actor, or a process with other devices, shares the slot
        return worker

    def _run(self, slot: int, devices: tuple[str, ...], item: list[Any],
             frames: list[Any]) -> None:
        worker = self._worker(slot, devices)
        self.task_worker[item[0]] = worker
        worker.running.add(item[0])
        # What it took, for the worker's accounting of the slot should it hold the queue.
        held = self.held.get(item[0])
        if held is not None:
            item[3]["taken"] = held[1]
        self._send_to(worker, item, frames)

    def _send_to(self, worker: Worker, item: list[Any], frames: list[Any]) -> None:
        if worker.ready:
            batch = self._runs[worker.ident]
            batch[0].append(item)
            batch[1].extend(frames)
        else:
            worker.backlog.append(([item], frames))

    def _flush_runs(self) -> None:
        for ident, (items, frames) in self._runs.items():
            self._send_run(ident, items, frames)
        self._runs.clear()

    def _on_cancel(self, msg: P.Message) -> None:
        # A task still in a starting worker's backlog is dropped; a running command job's
        # process group is stopped by its worker; a running Python call cannot be
        # interrupted safely. Either way the broker has already failed it.
        for task_id in P.field(msg, "ids", list):
            for slot, spec in enumerate(self.slots):
                delegate = spec.delegate
                if task_id not in spec.delegated or delegate is None:
                    pass
                elif delegate.ready and delegate.proc.poll() is None:
                    # The worker drops it unless it has started it, and says which.
                    self._flush_runs()
                    P.send(self.workers_sock, [delegate.ident, *P.encode(
                        P.CANCEL, {"ids": [task_id]})])
                    spec.cancelling.add(task_id)
                else:
                    # Nobody to ask: a starting process has not been sent it yet, and a
                    # dead one's queue is taken back, so it has not started: drop it here.
                    del spec.delegated[task_id]
                    delegate.backlog = [(i, f) for i, f in delegate.backlog
                                        if i[0][0] != task_id]
                    self._report_cancelled(task_id)
                    self._end_delegation_if_done(slot)
                if any(entry[0] == task_id for entry in spec.queue):  # granted, not started
                    spec.queue = deque(e for e in spec.queue if e[0] != task_id)
                    self._report_cancelled(task_id)
                    self._start_queued(slot)
            worker = self.task_worker.get(task_id)
            if worker is None:
                continue
            self._flush_runs()  # the cancel must reach the worker after the task
            if worker.ready:
                P.send(self.workers_sock, [worker.ident, *P.encode(P.CANCEL,
                                                                          {"ids": [task_id]})])
            kept = [(i, f) for i, f in worker.backlog if i[0][0] != task_id]
            if len(kept) != len(worker.backlog):
                worker.backlog = kept
                worker.running.discard(task_id)
                self._report_cancelled(task_id)
                self._free(task_id)

    def _on_logs(self, msg: P.Message) -> None:
        job, offset = P.field(msg, "job", int), P.field(msg, "offset", int)
        body: dict[str, Any] = {"token": msg.body.get("token"), "job": job}
        try:
            body["data"] = commands.read_log(self.job_logs, job, max(offset, 0))
        except OSError as exc:
            body["error"] = f"agent {self.name} has no log for job {job}: {exc.strerror or exc}"
        P.send(self.broker, P.encode(P.LOGS_REPLY, body))

    # -- actors ---------------------------------------------------------------------------
    def _start_actor(self, spec: dict[str, Any], slot: int, devices: tuple[str, ...],
                     item: list[Any], frames: list[Any]) -> None:
        """Start a process of its own for an actor; it constructs the instance first."""
        if not isinstance(spec.get("actor"), str):
            raise ProtocolError("assign: malformed actor")
        actor_id = spec["actor"]
        old = self.actors.pop(actor_id, None)
        if old is not None:  # a restart placed here before we saw the old one end
            _kill(old.proc)
            self.by_ident.pop(old.ident, None)
        concurrency = max(1, int(spec.get("concurrency", 1)))
        worker = self._start_process(slot, devices, concurrency, actor=True)
        context = {**item[3], "create": True}
        worker.actor = ActorProcess(actor_id, item[0], concurrency, item[3])
        worker.actor.sent[item[0]] = None
        worker.backlog.append(([[item[0], item[1], item[2], context]], frames))
        self.actors[actor_id] = worker
        log.info("actor_starting", actor=actor_id, pid=worker.proc.pid,
                 gpus=",".join(devices) or "-")

    def _on_call(self, msg: P.Message) -> None:
        items = P.field(msg, "calls", list)
        groups = P.split_frames(msg.frames, [i[2] + sum(i[3]) for i in items])
        batches: dict[bytes, tuple[list[Any], list[Any]]] = defaultdict(lambda: ([], []))
        for (call_id, actor_id, nframes, dep_counts), frames in zip(items, groups):
            worker = self.actors.get(actor_id)
            if worker is None or worker.actor is None:
                continue  # it ended; the broker requeues or fails the call
            worker.actor.sent[call_id] = None
            item = [call_id, nframes, dep_counts, worker.actor.context]
            if worker.ready:
                batch = batches[worker.ident]
                batch[0].append(item)
                batch[1].extend(frames)
            else:
                worker.backlog.append(([item], frames))
        for ident, (run_items, run_frames) in batches.items():
            self._send_run(ident, run_items, run_frames)

    def _actor_done(self, worker: Worker, items: list[Any], results: list[list[Any]]) -> None:
        actor = worker.actor
        assert actor is not None
        for item, result in zip(items, results):
            actor.sent.pop(item[0], None)
            if item[0] == actor.placement and item[1] != P.OK:
                # __init__ raised: the instance never existed; the broker fails its calls.
                log.warning("actor_init_failed", actor=actor.id)
                self.actors.pop(actor.id, None)
                self.by_ident.pop(worker.ident, None)
                _kill(worker.proc)
                self._free(actor.placement)
            self._report(item[0], item[1], result, item[3])

    def _reap_actors(self) -> None:
        for worker in list(self.actors.values()):
            code = worker.proc.poll()
            if code is None or worker.actor is None:
                continue
            cause = _exit_cause(code)
            log.warning("actor_process_died", actor=worker.actor.id, pid=worker.proc.pid,
                        cause=cause)
            self._flush_done()  # results it sent before dying go first
            P.send(self.broker, P.encode(P.ACTOR_EXIT, {
                "actor": worker.actor.id, "placement": worker.actor.placement, "cause": cause,
                "running": worker.actor.started()}))
            del self.actors[worker.actor.id]
            self.by_ident.pop(worker.ident, None)
            self._free(worker.actor.placement)

    # -- worker side --------------------------------------------------------------------
    def _worker(self, slot: int, devices: tuple[str, ...]) -> Worker:
        worker = self.workers.get((slot, devices))
        if worker is not None and worker.proc.poll() is None:
            return worker
        if worker is not None:  # died while idle (or about to be reaped): start afresh
            self._reap()  # may itself start this slot's queued grants on a new process
            worker = self.workers.get((slot, devices))
            if worker is not None and worker.proc.poll() is None:
                return worker
        worker = self._start_process(slot, devices, self.slots[slot].nthreads)
        self.workers[(slot, devices)] = worker
        return worker

    def _start_process(self, slot: int, devices: tuple[str, ...], nthreads: int,
                       actor: bool = False) -> Worker:
        # An idle process that used these devices may still hold their memory (a CUDA
        # context, an allocator's cache): stop it before another process uses them.
        if devices:
            for other in list(self.workers.values()):
                if (other.slot == slot and set(other.gpus) & set(devices) and not other.running
                        and self.slots[slot].delegate is not other):
                    _kill(other.proc)
                    self._forget(other)
        ident = uuid.uuid4().hex.encode()
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the order NVML numbers devices in
        env["ZRES_BROKER"] = self.broker_address
        env["ZRES_JOB_LOGS"] = self.job_logs
        proc = subprocess.Popen(
            [sys.executable, "-m", "zres.worker", self.workers_address, ident.decode(),
             str(nthreads), str(os.getpid()), *(["actor"] if actor else [])], env=env,
            stdin=subprocess.DEVNULL)
        worker = Worker(ident, slot, devices, proc)
        self.by_ident[ident] = worker
        log.info("worker_started", pid=proc.pid, slot=slot, gpus=",".join(devices) or "-",
                 actor=actor)
        return worker

    def _send_run(self, ident: bytes, items: list[Any], frames: list[Any]) -> None:
        body: dict[str, Any] = {"tasks": items}
        worker = self.by_ident.get(ident)
        if worker is not None and worker.actor is None:
            body["capacity"] = self.slots[worker.slot].units
        P.send(self.workers_sock, [ident, *P.encode(P.RUN, body, frames)])

    def _from_worker(self, frames: list[Any]) -> None:
        worker = self.by_ident.get(frames[0].bytes)
        if worker is None:
            return
        msg = P.decode(frames[1:])
        if msg.kind == P.READY:
            worker.ready = True
            for items, task_frames in worker.backlog:
                self._send_run(worker.ident, items, task_frames)
            worker.backlog = []
        elif msg.kind == P.DONE and worker.actor is not None:
            items = msg.body["results"]
            self._actor_done(worker, items, P.split_frames(msg.frames, [i[2] for i in items]))
        elif msg.kind == P.DONE:
            spec = self.slots[worker.slot]
            for task_id in msg.body.get("started", ()):  # queued grants it has started
                spec.cancelling.discard(task_id)
                entry = spec.delegated.pop(task_id, None)
                if entry is not None:
                    self._hold(worker.slot, task_id, entry[1])
                    self.task_worker[task_id] = worker
                    worker.running.add(task_id)
            items = msg.body["results"]
            for item, result in zip(items, P.split_frames(msg.frames, [i[2] for i in items])):
                worker.running.discard(item[0])
                self._free(item[0])
                if self.task_worker.pop(item[0], None) is not None:
                    self._report(item[0], item[1], result, item[3])
            for task_id in msg.body.get("dropped", ()):  # cancelled before it started
                spec.cancelling.discard(task_id)
                if spec.delegated.pop(task_id, None) is not None:
                    self._report_cancelled(task_id)
            self._end_delegation_if_done(worker.slot)

    def _end_delegation_if_done(self, slot: int) -> None:
        """Once SLOT's worker holds none of its queue, the agent starts the rest itself."""
        spec = self.slots[slot]
        if not spec.delegated:
            spec.delegate = None
            self._start_queued(slot)

    def _report_cancelled(self, task_id: int) -> None:
        self._report(task_id, P.FAILED, [], {"type": "CancelledError", "message": "cancelled"})

    def _report(self, task_id: int, outcome: str, frames: list[Any],
                info: dict[str, Any]) -> None:
        self.task_worker.pop(task_id, None)
        self._done[0].append([task_id, outcome, len(frames), info])
        self._done[1].extend(frames)

    def _flush_done(self) -> None:
        if self._done[0]:
            P.send(self.broker, P.encode(P.DONE, {"results": self._done[0]}, self._done[1]))
            self._done = ([], [])

    def _reap(self) -> None:
        self._reap_actors()
        for worker in list(self.workers.values()):
            code = worker.proc.poll()
            if code is None:
                continue
            cause = _exit_cause(code)
            log.warning("worker_died", pid=worker.proc.pid, cause=cause,
                        tasks=len(worker.running))
            for task_id in sorted(worker.running):
                self._report(task_id, P.FAILED, [], {
                    "type": "WorkerLostError",
                    "message": f"the worker process running the task {cause}"})
            self._forget(worker)
            for spec in self.slots:
                if spec.delegate is worker:  # not reported started: they run on a new process
                    for task_id in sorted(spec.cancelling):  # ... unless cancelled meanwhile
                        if spec.delegated.pop(task_id, None) is not None:
                            self._report_cancelled(task_id)
                    spec.queue.extendleft(reversed(spec.delegated.values()))
                    spec.delegated.clear()
                    spec.cancelling.clear()
                    spec.delegate = None
            for task_id in sorted(worker.running):
                self._free(task_id)
            self._start_queued(worker.slot)

    def _forget(self, worker: Worker) -> None:
        self.workers.pop((worker.slot, worker.gpus), None)
        self.by_ident.pop(worker.ident, None)
        for task_id in worker.running:
            self.task_worker.pop(task_id, None)


def _exit_cause(code: int) -> str:
    return (f"was killed by signal {signal.Signals(-code).name}" if code < 0
            else f"exited with code {code}")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Stop a worker process: SIGTERM (it takes its command jobs along), then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
