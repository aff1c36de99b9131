"""An agent's worker processes: started on demand, fed over a unix socket (``link``), stopped.

One process serves one slot with one fixed device set (CUDA_VISIBLE_DEVICES is set when it
starts and never changes), so a CUDA context made by one task is never reused for another
device; an actor gets a process of its own, and so does a task that asked for MEMORY (a
*solo* process, started for it and stopped after it, limited to what it asked: see
``memory``). Own processes lead sessions of their own: their whole tree is found, and
stopped, together.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core import protocol as P
from ..core.context import TOKEN_ENV
from ..core.exits import wait_ended
from ..logs import get_logger
from .data.worker_side import ENV as OBJECTS_ENV
from .files import AgentFiles
from .link import WorkerLinks
from .memory import procs
from .shared import Lease, StartLog
from .slots import SlotSpec

if TYPE_CHECKING:
    from ..core.keys import PeerKey
    from .session import Session

log = get_logger("zres.agent")


@dataclass(slots=True)
class ActorProcess:
    """What an agent knows of the actor a worker process hosts.

    The process starts calls in the order sent, at most ``concurrency`` at once, logging
    each start; when it dies, the calls that had not started run on the next instance.
    """

    id: str
    placement: int               # the broker's id for this construction
    concurrency: int
    context: dict[str, Any]
    priority: int = 0            # its grant's, and when it began: the newest of the
    began: float = 0.0           # lowest priority go first when the node runs low
    sent: dict[int, int] = field(default_factory=dict)   # unfinished call -> run number
    begun: set[int] = field(default_factory=set)         # ... of those, said started
    delivered: set[int] = field(default_factory=set)     # ... of those, passed to it


@dataclass(slots=True)
class Worker:
    """One worker process: a slot and a fixed device set, or one actor."""

    ident: bytes
    slot: int
    gpus: tuple[str, ...]
    proc: subprocess.Popen[bytes]
    starts: StartLog                 # what it has started, readable after its death
    ready: bool = False
    backlog: list[tuple[list[Any], list[Any]]] = field(default_factory=list)
    running: set[int] = field(default_factory=set)
    actor: ActorProcess | None = None
    stopped_for: int = 0             # killed to stop this task (a forced cancel)
    task: int = 0                    # the one task a solo process serves
    retired: bool = False            # its task ended: stopped on purpose
    direct: bool = False             # told where the broker is (see direct)


class WorkerPool:
    """The processes of one agent, by slot and device set and by routing id.

    RUN items for a process are batched until ``flush`` (one message per process per loop
    turn); a process that has not said READY yet keeps them in its backlog.
    """

    def __init__(self, slots: list[SlotSpec], broker_address: str,
                 job_logs: str, files: AgentFiles, key: PeerKey | None = None) -> None:
        self._slots = slots
        self._broker_address = broker_address
        # Where a pooled process sends small results straight (``direct``): the broker,
        # with this agent's key, told over the agent's own socket; and under which of
        # this agent's sessions (the agent sets it), at that broker's epoch.
        self._direct = {"address": broker_address,
                        **({"key": [key.server, key.public, key.secret]} if key else {})}
        self.session: Session | None = None
        self._job_logs = job_logs
        self.objects = ""  # where the agent's store is, for its workers (the agent sets it)
        # The lease, start logs and socket live in the agent's run directory (``files``):
        # removed when it stops, and by its next start after a kill.
        self._run = files.run
        self.address = files.socket
        self.links = WorkerLinks(self.address, self._is_worker)
        self.lease = Lease(f"{self._run}/lease", create=True)  # lapsed until renewed
        self.by_slot: dict[tuple[int, tuple[str, ...]], Worker] = {}
        self.by_ident: dict[bytes, Worker] = {}
        self.solo: dict[bytes, Worker] = {}  # processes of one task each (see memory)
        self.paused = False  # the node is low on memory: delegates start nothing queued
        self._runs: dict[bytes, tuple[list[Any], list[Any]]] = defaultdict(lambda: ([], []))
        self._told: list[tuple[bytes, list[Any]]] = []
        self.starve = 5.0            # passed to workers: how long a queued grant is passed over

    def alive(self, slot: int, devices: tuple[str, ...]) -> Worker | None:
        """The running process that serves SLOT with DEVICES, if there is one."""
        worker = self.by_slot.get((slot, devices))
        return worker if worker is not None and worker.proc.poll() is None else None

    def start(self, slot: int, devices: tuple[str, ...], nthreads: int, actor: bool = False,
              keep: Worker | None = None, solo: int = 0) -> Worker:
        """Start a process for SLOT with DEVICES (or for an actor, or the task SOLO alone),
        NTHREADS threads.

        An idle process that used these devices may still hold their memory (a CUDA
        context, an allocator's cache): it is stopped first, unless it is KEEP.
        """
        if devices:
            for other in list(self.by_slot.values()):
                if (other.slot == slot and set(other.gpus) & set(devices) and not other.running
                        and other is not keep):
                    kill(other.proc)
                    self.forget(other)
        ident = uuid.uuid4().hex.encode()
        starts = StartLog(f"{self._run}/starts-{ident.decode()}", create=True)
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the order NVML numbers devices in
        env["ZRES_BROKER"] = self._broker_address
        env["ZRES_JOB_LOGS"] = self._job_logs
        env[OBJECTS_ENV] = self.objects  # (the agent's store: see data.worker_side)
        env.pop(TOKEN_ENV, None)  # (each task's token comes with it: never this agent's own)
        proc = subprocess.Popen(
            [sys.executable, "-m", "zres.agent.worker", self.address, ident.decode(),
             str(nthreads), str(os.getpid()), self.lease.path, starts.path,
             *(["actor"] if actor else [])], env=env, stdin=subprocess.DEVNULL,
            start_new_session=actor or bool(solo))
        # (a pooled process has no limit of its own: should the node run out before the
        # agent has stopped anything, the kernel takes it, never the agent)
        procs.kill_first(proc.pid)
        worker = Worker(ident, slot, devices, proc, starts, task=solo)
        self.by_ident[ident] = worker
        if solo:
            self.solo[ident] = worker
        elif not actor:
            self.by_slot[(slot, devices)] = worker
        log.info("worker_started", pid=proc.pid, slot=slot, gpus=",".join(devices) or "-",
                 actor=actor, **({"task": solo} if solo else {}))
        return worker

    def task_workers(self) -> list[Worker]:
        """Every process running tasks: pooled and solo ones (not actors')."""
        return [*self.by_slot.values(), *self.solo.values()]

    def forget(self, worker: Worker) -> None:
        """Stop routing to WORKER (it has ended, or is being stopped)."""
        if self.by_slot.get((worker.slot, worker.gpus)) is worker:
            del self.by_slot[(worker.slot, worker.gpus)]
        self.solo.pop(worker.ident, None)
        if self.by_ident.pop(worker.ident, None) is not None:
            worker.starts.close()
            try:
                os.unlink(worker.starts.path)
            except OSError:
                pass

    def _is_worker(self, ident: bytes, pid: int) -> bool:
        """Whether process PID is the worker this pool started as IDENT (see link)."""
        worker = self.by_ident.get(ident)
        return worker is not None and worker.proc.pid == pid

    def started_by(self, worker: Worker) -> set[int]:
        """The run numbers WORKER has started (readable after its death)."""
        return worker.starts.started()

    def send(self, worker: Worker, item: list[Any], frames: list[Any]) -> None:
        """Queue one RUN item for WORKER, sent at the next flush (or once it is ready)."""
        if worker.ready:
            batch = self._runs[worker.ident]
            batch[0].append(item)
            batch[1].extend(frames)
        else:
            worker.backlog.append(([item], frames))

    def touch(self, worker: Worker) -> None:
        """Send WORKER a RUN at the next flush even with no item: it carries the slot's
        current capacity."""
        if worker.ready:
            self._runs[worker.ident]

    def flush(self) -> None:
        """Send every batch of RUN items, then the control messages told since."""
        for ident, (items, frames) in self._runs.items():
            self.run_now(ident, items, frames)
        self._runs.clear()
        for ident, message in self._told:
            self.links.send(ident, message)
        self._told.clear()

    def drop_pending(self) -> None:
        """Forget the messages not sent yet."""
        self._runs.clear()
        self._told.clear()

    def ready(self, worker: Worker) -> None:
        """WORKER said READY: send it what waited."""
        worker.ready = True
        for items, frames in worker.backlog:
            self.run_now(worker.ident, items, frames)
        worker.backlog = []

    def tell(self, worker: Worker, kind: str, body: dict[str, Any]) -> None:
        """Send WORKER a control message at the next flush, after its RUN items."""
        self._told.append((worker.ident, P.encode(kind, body)))

    def run_now(self, ident: bytes, items: list[Any], frames: list[Any]) -> None:
        """Send the process IDENT one RUN of ITEMS at once."""
        body: dict[str, Any] = {"tasks": items}
        worker = self.by_ident.get(ident)
        if worker is not None and worker.actor is None:
            body["capacity"] = {} if self.paused else self._slots[worker.slot].units
            body["starve"] = self.starve
            session = self.session
            if session is not None and session.epoch is not None and not worker.task:
                # (a solo process's result is judged by the agent first: solo.ended)
                body["via"] = [session.id, session.epoch]
                if not worker.direct:
                    body["direct"], worker.direct = self._direct, True
        self.links.send(ident, P.encode(P.RUN, body, frames))

    def close(self, workers: list[Worker]) -> None:
        """Stop WORKERS and every pooled process; close the links (the agent's files
        then go: ``AgentFiles.close``)."""
        for worker in [*self.task_workers(), *workers]:
            kill(worker.proc)
            self.forget(worker)
        self.links.close()


def exit_cause(code: int) -> str:
    """Say how a process ended, from its exit status."""
    return (f"was killed by signal {signal.Signals(-code).name}" if code < 0
            else f"exited with code {code}")


def kill(proc: subprocess.Popen[bytes]) -> None:
    """Stop a worker process: SIGTERM (it takes its command jobs along), then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        if not wait_ended(proc, 1):
            proc.kill()
            wait_ended(proc, 5)
