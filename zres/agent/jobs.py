"""Command jobs, run by the agent itself, each in a process group of its own.

The agent, not a worker process, owns every job's process group: it starts the job with
CUDA_VISIBLE_DEVICES set to the granted devices and its output in a log file on the agent
(``<job logs>/<cluster>/<job id>.log``, 0600, made anew for each job and never written
through a link: see ``files``; kept after the job ends, for ``log_retention`` to remove
when its time comes), follows it, stops it on cancel
(SIGTERM to the group, SIGKILL once the grace has passed), and reports the job ended only
when no process of it is left, whatever else died meanwhile: a job's resources are never
granted to another while any of its processes runs. Its processes are its group's, and those
that left the group (a daemon's ``setsid``: found as ``jobprocs`` says); what the job leaves
behind when its leader exits is stopped the same way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core import protocol as P
from ..core.errors import CommandFailed
from ..core.exits import wait_ended
from ..core.resources import CPU, MEMORY, UNIT
from ..core.serialize import dumps, dumps_exception
from ..logs import get_logger
from .cpus import CoreBinder, born_on
from .files import JobLogs
from .jobprocs import TAG, Escapes, alive, group_alive, members, scan, send, signal_group
from .log_retention import RETENTION, LogRetention
from .memory.monitor import Monitor, memory_error
from .ranks import free_port, master_address, master_env

log = get_logger("zres.agent")

GRACE = 5.0          # seconds between SIGTERM and SIGKILL
_TAIL_LINES = 20

Report = Callable[[int, str, list[Any], dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a finished command job left: its id, exit code, where its log is."""

    job_id: int
    exit_code: int
    log: str
    agent: str


@dataclass(slots=True)
class Job:
    task: int
    argv: list[str]
    proc: subprocess.Popen[bytes]
    log: str
    cancelled: bool = False
    kill_at: float | None = None     # SIGKILL what is left of the group then
    group_gone: bool = False         # (its number is then free for another's: never used)
    slot: int = 0                    # where it was granted, on which GPU positions,
    positions: list[int] = field(default_factory=list)  # taking what: told to a
    taken: dict[str, int] = field(default_factory=dict)  # restarted broker
    cluster: str = ""                # the cluster it logs under
    priority: int = 0                # its grant's, and when it began: the newest of the
    began: float = 0.0               # lowest priority go first when the node runs low
    job_id: int = 0                  # its job's id (a multi-node job's rank: not TASK)
    label: str = ""                  # how it is named ("job 12", "job 12 rank 1")


RECENT = 1000  # job outcomes remembered for a restarted broker


class JobRunner:
    """The command jobs running on this node. REPORT(id, outcome, frames, info) gives a
    job's end to the broker; MEMORY watches each job's processes (limited to the MEMORY it
    asked for)."""

    def __init__(self, logs: JobLogs, agent: str, report: Report, grace: float = GRACE,
                 watch: Callable[[int], None] | None = None,
                 unwatch: Callable[[int], None] | None = None,
                 memory: Monitor | None = None, cpus: CoreBinder | None = None,
                 ranks: tuple[str, Any] | None = None,
                 keep: tuple[float, int | None] | None = None) -> None:
        self.logs = logs
        # KEEP: (retention, max bytes) of the ended jobs' logs (None: the defaults there).
        retention, max_bytes = keep or (RETENTION, None)
        self.retention = LogRetention(logs, agent, retention, max_bytes,
                                      running=lambda cluster, job: job in self.jobs)
        self.memory = memory or Monitor(None, False, 0)
        self.cpus = cpus  # (binds each job to cores of its own: see cpus)
        # RANKS: (the broker's address, the reports): rank 0 of a multi-node job says
        # where it listens (``ranks``).
        self._ranks = ranks
        self.cluster = "unknown"   # the broker's cluster id, once it has welcomed us
        self.agent = agent
        self.grace = grace
        self._report = report
        self.jobs: dict[int, Job] = {}
        # How the last jobs ended, for a restarted broker that may not have heard it.
        self.recent: OrderedDict[int, tuple[str, list[Any], dict[str, Any]]] = OrderedDict()
        # A descriptor per job leader that becomes readable when it exits (Linux 5.3+), so
        # the agent's loop wakes at once; elsewhere the loop looks every tenth of a second.
        self._watch, self._unwatch = watch, unwatch
        self._pidfds: dict[int, int] = {}    # job -> pidfd
        self.escapes = Escapes(self.memory)  # (what left a job's group: see jobprocs)
        # The running jobs' process groups are kept on disk (``logs``' record, a file per
        # job, written as it starts and removed as it ends: O(1) in the jobs running): an
        # agent killed outright leaves its jobs running; the next agent of this name stops
        # them before it offers anything.

    def stop_leftovers(self) -> int:
        """Stop the jobs a previous agent of this name left running; return how many. The
        logs earlier runs left are found, to be removed when their time comes."""
        stopped, killed = 0, {}
        left = self.logs.running_left()
        # (one walk for them all, each killed as it is found: it starts nothing unseen)
        escaped = scan({tag for _, tag in left.values() if tag}, sig=signal.SIGKILL)
        for job_id, (pgid, tag) in left.items():
            grouped = {pid: -1 for pid in members(pgid, job_id)}
            send(grouped, signal.SIGKILL)
            found = grouped | escaped.get(tag, {})
            killed.update(found)
            stopped += bool(found)
        # They go before anything is offered: a GPU's memory is freed as its process ends
        # (one that outlives SIGKILL that long is beyond the agent: said, not waited for)
        deadline = time.monotonic() + self.grace
        while (killed := alive(killed)) and time.monotonic() < deadline:
            time.sleep(0.02)
        for job_id in left:
            self.logs.forget_running(job_id)
        if stopped:
            log.warning("jobs_left_behind_stopped", count=stopped, still_running=len(killed))
        self.retention.found(left)
        return stopped

    def _note(self, job: Job) -> None:
        try:
            self.logs.note_running(job.task, job.proc.pid, self.escapes.tag(job.task))
        except OSError as exc:
            log.warning("jobs_record_failed", job=job.task, error=str(exc))

    def _unnote(self, task_id: int) -> None:
        try:
            self.logs.forget_running(task_id)
        except OSError as exc:
            log.warning("jobs_record_failed", job=task_id, error=str(exc))

    def start(self, task_id: int, spec: dict[str, Any], gpus: list[str],
              place: tuple[int, list[int], dict[str, int]] = (0, [], {}),
              attempt: int = 1, priority: int = 0) -> None:
        """Start TASK_ID's command as SPEC {argv, env, cwd} says, on GPUS (at PLACE: slot,
        GPU positions, what it takes); a job that cannot start is reported failed at once,
        naming what was missing. Its log is made anew: one already there fails it, unless
        this is a later ATTEMPT (the earlier one's log, on this agent, is replaced)."""
        argv = list(spec["argv"])
        path = self.logs.path_of(self.cluster, task_id)
        # (a multi-node job's rank runs under a grant of its own: its job's id is given)
        job_id = spec.get("job_id", task_id)
        env = {**os.environ, **spec.get("env", {}), "ZRES_JOB_ID": str(job_id),
               "ZRES_AGENT": self.agent, "ZRES_GPU_IDS": ",".join(gpus),
               "CUDA_VISIBLE_DEVICES": ",".join(gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
               TAG: self.escapes.tag(task_id)}  # (what finds it if it leaves its group)
        if job_id != task_id:
            env["ZRES_JOB_GRANT"] = str(task_id)  # (what finds it if left behind: members)
        if spec.get("master") is True and self._ranks is not None:
            address = master_address(self._ranks[0])
            port = free_port(address)
            env.update(master_env(address, port))
            self._ranks[1].master(task_id, address, port)
        try:
            out = self.logs.create(self.cluster, task_id, replace=attempt > 1)
        except (OSError, ValueError) as exc:  # a log there already (a link, say), no space
            reason = "it is there already (a job's log is never written over)" \
                if isinstance(exc, FileExistsError) else getattr(exc, "strerror", None) or exc
            self._cannot_start(task_id, f"cannot start {argv[0]!r}: its log {path}: {reason}",
                               path)
            return
        # (its cores, if bound: `nproc` there says how many)
        cores = self.cpus.take(place[0], task_id, place[2].get(CPU, 0)) if self.cpus else []
        self.escapes.started(task_id)  # (what it makes has ids handed out from now)
        try:
            with born_on(cores):
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, cwd=spec.get("cwd"),
                                        start_new_session=True)  # its own process group
        except Exception as exc:  # no such program or directory, a bad env
            self.escapes.forget(task_id)
            if self.cpus is not None:
                self.cpus.give(task_id)
            # Popen names the missing thing: the program, or the working directory.
            filename = getattr(exc, "filename", None)
            where = "" if filename in (None, argv[0]) else f": {filename}"
            reason = getattr(exc, "strerror", None) or exc
            why = f"cannot start {argv[0]!r}: {reason}{where}"
            try:
                os.write(out, f"zres: {why}\n".encode())
            except OSError:
                pass
            self.retention.ended(self.cluster, task_id)  # (its log: made, never run)
            self._cannot_start(task_id, why, path)
            return
        finally:
            os.close(out)
        self.escapes.groups[task_id] = proc.pid  # (its members: told as the group is)
        job = self.jobs[task_id] = Job(task_id, argv, proc, path, slot=place[0],
                                       positions=list(place[1]), taken=dict(place[2]),
                                       cluster=self.cluster, priority=priority,
                                       began=time.monotonic(), job_id=job_id,
                                       label=f"job {job_id}" + (f" rank {spec['rank']}" if
                                                               job_id != task_id else ""))
        # (moved into its cgroup as it starts, with what it started meanwhile: what they
        # allocated before is the node's)
        self.memory.watch(task_id, proc.pid, job.taken[MEMORY] // UNIT
                          if job.taken.get(MEMORY) else None, started=True)
        self._note(job)
        if self._watch is not None and hasattr(os, "pidfd_open"):
            try:
                fd = os.pidfd_open(proc.pid)
            except OSError:
                pass
            else:
                self._pidfds[task_id] = fd
                self._watch(fd)
        log.info("job_started", job=task_id, pid=proc.pid, gpus=",".join(gpus) or "-")

    def _cannot_start(self, task_id: int, why: str, path: str) -> None:
        self._ended(task_id, P.RAISED, dumps_exception(
            CommandFailed(f"job {task_id}: {why}", None, path, "")),
            {"error": why, "log": path})

    def exited(self, events: dict[Any, int]) -> bool:
        """Whether a job leader has exited, by the poller's EVENTS."""
        return any(fd in events for fd in self._pidfds.values())

    def _forget(self, task_id: int) -> None:
        fd = self._pidfds.pop(task_id, None)
        if fd is not None:
            if self._unwatch is not None:
                self._unwatch(fd)
            os.close(fd)

    def cancel(self, task_id: int) -> None:
        """SIGTERM the job's processes; SIGKILL what is left after the grace."""
        job = self.jobs.get(task_id)
        if job is not None and not job.cancelled:
            job.cancelled = True
            self._stop_group(job)

    def _stop_group(self, job: Job, look: bool = True) -> None:
        """SIGTERM the job's group and what left it (LOOK: found anew; else those known)."""
        if job.kill_at is None:
            job.kill_at = time.monotonic() + self.grace
            self._signal_group(job, signal.SIGTERM)
            self.escapes.signal([job.task], signal.SIGTERM, look)

    @staticmethod
    def _signal_group(job: Job, sig: int) -> None:
        """Send SIG to JOB's process group, unless it has gone (its number may be another
        group's by now: a process of this user's that made a group or session of its own,
        another job's)."""
        if not job.group_gone:
            signal_group(job.proc.pid, sig)

    def reap(self) -> None:
        """Report every job none of whose processes is left: of its group, or escaped."""
        now = time.monotonic()
        if self.jobs:
            self.escapes.tick()  # (once per turn: the ids never wrap round in one)
        for job in list(self.jobs.values()):
            leader_done = job.proc.poll() is not None  # also reaps the leader
            if not leader_done and job.kill_at is None:
                continue
            if leader_done:  # (its pidfd, readable from now on, would wake every turn)
                self._forget(job.task)
            # (what escaped is looked for once the group has gone: ``jobprocs`` says when;
            # gone once its leader was reaped, it is gone for good: never looked at again)
            group = not job.group_gone and group_alive(job.proc.pid)
            if leader_done and not group:
                job.group_gone = True
                self.escapes.groups.pop(job.task, None)
            if group or not leader_done or self.escapes.running(job.task):
                if leader_done:  # what it left behind must not hold the job's GPU
                    self._stop_group(job, look=group)
                if job.kill_at is not None and now >= job.kill_at:
                    self._signal_group(job, signal.SIGKILL)
                    self.escapes.signal([job.task], signal.SIGKILL, look=False)
                continue  # (a leader being killed is waited for)
            del self.jobs[job.task]
            self._unnote(job.task)
            self.escapes.forget(job.task)
            self._finished(job)
        self.retention.poll()  # (O(1) unless a log's time has come)

    def _finished(self, job: Job) -> None:
        code = job.proc.returncode
        self.retention.ended(job.cluster, job.task)
        log.info("job_ended", job=job.task, exit_code=code, cancelled=job.cancelled)
        info: dict[str, Any] = {"exit_code": code, "log": job.log}
        unit = self.memory.forget(job.task)
        if self.cpus is not None:
            self.cpus.give(job.task)
        if unit is not None:
            info["peak_memory"] = unit.peak
        if unit is not None and unit.killed:
            self._ended(job.task, P.FAILED, [], {**info, **memory_error(
                unit, f"job {job.task}", self.agent)})
        elif job.cancelled:
            self._ended(job.task, P.FAILED, [], {**info, "type": "CancelledError",
                                                 "message": "cancelled"})
        elif code == 0:
            self._ended(job.task, P.OK, dumps(CommandResult(job.job_id, 0, job.log,
                                                            self.agent)), info)
        else:
            tail = self.logs.tail(job.cluster, job.task, _TAIL_LINES)
            how = (f"was killed by signal {signal.Signals(-code).name}" if code < 0
                   else f"exited with code {code}")
            self._ended(job.task, P.RAISED, dumps_exception(CommandFailed(
                f"{job.label} ({' '.join(job.argv)}) {how}; the log's last lines:\n{tail}",
                code, job.log, tail)), info)

    def _ended(self, task_id: int, outcome: str, frames: list[Any],
               info: dict[str, Any]) -> None:
        self.recent[task_id] = (outcome, frames, info)
        while len(self.recent) > RECENT:
            self.recent.popitem(last=False)
        self._report(task_id, outcome, frames, info)

    def offer(self) -> list[list[Any]]:
        """The running jobs, for a restarted broker: [id, slot, GPU positions, taken]
        (``recent`` says how the last ones ended)."""
        return [[job.task, job.slot, job.positions, job.taken] for job in self.jobs.values()]

    def log_reply(self, msg: P.Message) -> dict[str, Any]:
        """Answer the broker's LOGS request: part of a job's log, or why there is none."""
        job, offset = P.field(msg, "job", int), P.field(msg, "offset", int)
        body: dict[str, Any] = {"token": msg.body.get("token"), "job": job}
        try:
            body["data"] = self.logs.read(self.cluster, job, max(offset, 0))
        except OSError as exc:
            why = self.retention.why_missing(self.cluster, job, msg.body.get("ended")) \
                if isinstance(exc, FileNotFoundError) else None
            body["error"] = f"job {job}: {why}" if why else \
                f"agent {self.agent} has no log for job {job}: {exc.strerror or exc}"
        return body

    def stop_all(self) -> None:
        """SIGKILL every job's processes and forget them (the broker no longer counts
        them)."""
        # The groups first: what leaves one after (setsid) is found by the walk then.
        for job in self.jobs.values():
            self._signal_group(job, signal.SIGKILL)
        self.escapes.signal(list(self.jobs), signal.SIGKILL)  # (one walk for them all)
        for job in self.jobs.values():
            wait_ended(job.proc, 5)
            self.memory.forget(job.task)
            if self.cpus is not None:
                self.cpus.give(job.task)
            self._forget(job.task)
            self._unnote(job.task)
            self.escapes.forget(job.task)
            self.retention.ended(job.cluster, job.task)  # (for the next start's walk)
        self.jobs.clear()
        self.recent.clear()  # (a broker that gets these is not the one they ran for)

    def holding(self) -> list[int]:
        return list(self.jobs)

