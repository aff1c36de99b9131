"""Every process of a command job: its process group, and those that left it.

A job runs in a process group of its own, which finds most of what it starts. A process
that calls ``setsid()`` or ``setpgid()`` leaves it (a double-forked daemon, ``setsid CMD &``,
``start-stop-daemon``, a server started with ``--daemon``), yet it is still the job's: it
may hold the job's GPU. The agent finds such *escaped* processes, holds the job's resources
while any runs, and stops them as it stops what the job leaves in its group.

How they are found. Where the job has a cgroup of its own (the memory limits' cgroup mode:
see ``memory``), its process list is the job's: nothing leaves a cgroup without privilege.
Elsewhere (no cgroups, the common case) the agent marks the job's environment with a tag,
``ZRES_JOB_TAG=<nonce>-<grant id>``, the nonce drawn at each agent start (a tag is never
another agent's, nor an earlier run's). Every process the job starts inherits it, whatever
group or session it moves to, and a walk of /proc finds those that carry it among the
processes whose environment the agent may read (its user's: the others it could not signal
anyway). A process that replaced its environment (started with an empty or rebuilt one,
``env -i``, ``sudo``) or wrote over it (``setproctitle``) is not found; a cgroup finds it.

Why not a child subreaper (``PR_SET_CHILD_SUBREAPER``), orphans coming to the agent rather
than to init? A process that left the group while its parent still runs is no orphan; an
orphan says nothing of which job (or task, or actor) it came from; every orphan would become
the agent's child, for it to reap (``waitpid(-1)`` would take the exit statuses that
``subprocess`` waits for); and a restarted agent is no longer their parent. The tag names
the job, costs nothing while the job runs, and outlives the agent: it is kept in the job's
record on disk (``files``), so an agent killed outright and started again finds what
escaped then.

When. A walk is made only when needed: once a job's leader has exited and its group has
emptied (one walk per job, when nothing escaped), when the job is stopped (cancelled, or its
leader gone with its group still there), and when the agent stops. It reads only the
processes made since the job started: the kernel hands out process ids in turn (``procs``'
``last_pid``), so they are those with the ids after the last one handed out as the job
started, wrapping round once past ``pid_max`` (the agent looks at every turn, and counts
the wraps; after a turn seconds long, the agent stopped, it cannot tell how often they
wrapped); a short job's are a few, tried one by one. Where the kernel does not say, or the
ids have wrapped round past where the job started, every process is read: about 6
microseconds each, 20 for one whose environment is read (the agent's user's; all, as root).
The processes made while a walk goes are read after it, round after round, until none is
made during one: a process of the job that forks and exits as the walk passes it (a
daemon's double fork) leaves a child with a newer id; one found is told its signal at once.
Processes found are then followed by their ids, one read of ``/proc/PID/stat`` each per turn
(their start time tells a reused id); the walk is made again only once all of them have
gone (they may have started others), and the job ends only after a walk that finds none.
What is found after the job was told to stop is told then (SIGTERM, and SIGKILL with the
rest once the grace is over). Without /proc (not Linux) nothing that left the group is
found: a job ends when its group has, as before.

A signal goes only to the process found, and once: each is told through a descriptor of
its own (a pidfd) once its start time is seen to be the one found, so an id reused meanwhile
(by any process of the user's) is never signalled; a thread's id found reads as its
process; the members of the job's group, which carry its tag too, are told by the group's
signal alone (to some programs a second SIGTERM means "stop now, skip the clean-up"). A
job's group, once gone, is never signalled or looked at again (``jobs``): its number may be
another's by then.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Collection, Iterable, Mapping

from .memory import procs
from .memory.monitor import Monitor

TAG = "ZRES_JOB_TAG"
_MARK = f"\0{TAG}=".encode()
# Seconds between two looks at the last id handed out past which the wraps are not known (a
# turn takes a tenth of a second; one of seconds is an agent stopped, or starved).
_STALL = 2.0
_ROUNDS = 16  # walks of the ids handed out during the one before, at most


class Escapes:
    """The processes of this agent's jobs outside their groups, each job by its grant's id.
    MEMORY: the agent's monitor (a job it keeps in a cgroup is found there)."""

    def __init__(self, memory: Monitor) -> None:
        self.memory = memory
        self.nonce = secrets.token_hex(8)
        self.found: dict[int, dict[int, int]] = {}  # job -> {pid: start}, being followed
        self.stopping: set[int] = set()  # jobs told to stop: what is found later is told too
        # Each job's process group while it is there (``jobs`` says): its members are told
        # by the group's signal, never once more as escaped (a second SIGTERM may mean "stop
        # now, skip the clean-up" to some programs).
        self.groups: dict[int, int] = {}
        # The process ids handed out since a job started are the job's candidates: the last
        # one handed out (``procs.last_pid``) as each job starts, and how often the ids have
        # wrapped round since the agent started (seen at every turn: no turn is that long).
        self.born: dict[int, tuple[int, int]] = {}  # job -> (wraps, last id) at its start
        self._last, self._wraps, self._at = procs.last_pid(), 0, time.monotonic()

    def tag(self, task_id: int) -> str:
        """The tag that marks job TASK_ID's processes (set in its environment)."""
        return f"{self.nonce}-{int(task_id)}"

    def started(self, task_id: int) -> None:
        """Note that job TASK_ID starts now (before its leader is made)."""
        self.tick()
        if self._last is not None:
            self.born[task_id] = (self._wraps, self._last)

    def tick(self) -> None:
        """Look at the last process id handed out (at least once per wrap of the ids)."""
        now, at = procs.last_pid(), time.monotonic()
        if now is None or self._last is None or at - self._at > _STALL:
            # (the kernel no longer says; or the ids may have wrapped round more than once
            # since the last look, unseen: every process is read for the jobs running now)
            self.born.clear()
        elif now < self._last:
            self._wraps += 1
        self._last, self._at = now, at

    def made_since(self, task_ids: Collection[int]) -> tuple[int, int] | None:
        """The process ids handed out since the first of TASK_IDS started: after the first
        id, up to the second (wrapping round once past ``pid_max``); None where the kernel
        does not say, or the ids have wrapped round past where one started."""
        self.tick()
        marks = [self.born.get(task_id) for task_id in task_ids]
        if self._last is None or not marks or None in marks:
            return None
        wraps, first = min(mark for mark in marks if mark is not None)
        if wraps == self._wraps and first <= self._last or \
                wraps + 1 == self._wraps and self._last < first:
            return first, self._last
        return None

    def running(self, task_id: int) -> bool:
        """Whether any process of job TASK_ID outside its group still runs (its leader has
        exited, its group has emptied): those known are looked at; once they have all gone,
        a walk finds any others."""
        known = self.found[task_id] = alive(self.found.get(task_id, {}))
        if not known or self._cgroup(task_id):
            self.found[task_id] = now = self.look([task_id])[task_id]
            if task_id in self.stopping:
                send({pid: at for pid, at in now.items() if pid not in known}, signal.SIGTERM)
            known = now
        return bool(known)

    def look(self, task_ids: Collection[int], sig: int | None = None
             ) -> dict[int, dict[int, int]]:
        """Find the processes of TASK_IDS outside their groups now (cgroups are read; the
        others' take one walk together), sending SIG to each as it is found: job -> {pid:
        start}."""
        found: dict[int, dict[int, int]] = {}
        tags = {}
        for task_id in task_ids:
            path = self._cgroup(task_id)
            group = self.groups.get(task_id)
            if path and self.memory.cgroups is not None:
                found[task_id] = {pid: stat[0] for pid in self.memory.cgroups.pids(path)
                                  if (stat := _stat(pid)) is not None and stat[1] != group}
                if sig is not None:
                    send(found[task_id], sig)
            else:
                tags[self.tag(task_id)] = task_id
        groups = {tag: self.groups[task_id] for tag, task_id in tags.items()
                  if task_id in self.groups}
        walked = scan(tags, self.made_since(list(tags.values())) if tags else None, sig,
                      groups)
        for tag, task_id in tags.items():
            found[task_id] = walked.get(tag, {})
        return found

    def signal(self, task_ids: Collection[int], sig: int, look: bool = True) -> None:
        """Send SIG to the processes of TASK_IDS outside their groups: found anew (LOOK:
        each told as it is found, before it can start another unseen), and those known."""
        told: set[int] = set()
        if look:
            for task_id, pids in self.look(task_ids, sig).items():
                self.found[task_id] = {**self.found.get(task_id, {}), **pids}
                told.update(pids)
        for task_id in task_ids:  # (each once: a second SIGTERM may mean "now" to some)
            send({pid: at for pid, at in self.found.get(task_id, {}).items()
                  if pid not in told}, sig)
        self.stopping.update(task_ids)

    def forget(self, task_id: int) -> None:
        self.found.pop(task_id, None)
        self.stopping.discard(task_id)
        self.born.pop(task_id, None)
        self.groups.pop(task_id, None)

    def _cgroup(self, task_id: int) -> str:
        unit = self.memory.get(task_id)
        return unit.cgroup if unit is not None and self.memory.cgroups is not None else ""


def scan(tags: Collection[str], made: tuple[int, int] | None = None,
         sig: int | None = None, groups: Mapping[str, int] | None = None
         ) -> dict[str, dict[int, int]]:
    """The running processes whose environment carries one of TAGS (``ZRES_JOB_TAG=tag``),
    among those this process may read (its user's; all, as root): tag -> {pid: start}, a
    thread's process by its own id. MADE (first, last): only those with the ids handed out
    after first up to last (last: the last one handed out just now). SIG: sent to each as
    it is found. GROUPS: tag -> a process group whose members are left out (its signal
    reaches them). Then those made while the walk went, round after round until none is
    made during one (the module's docstring says why)."""
    wanted = {tag.encode(): tag for tag in tags}
    found: dict[str, dict[int, int]] = {}
    if not wanted or not procs.usable():
        return found
    mark = made[1] if made is not None else procs.last_pid()
    for _ in range(_ROUNDS):
        _read(_candidates(made), wanted, found, sig, groups or {})
        now = procs.last_pid()
        if mark is None or now is None or now == mark:
            break
        made, mark = (mark, now), now
    return found


def _read(pids: Iterable[int], wanted: Mapping[bytes, str], found: dict[str, dict[int, int]],
          sig: int | None, groups: Mapping[str, int]) -> None:
    """Put in FOUND those of PIDS whose tag is WANTED's, out of its GROUPS' group, each
    process once (and send them SIG)."""
    me = os.getpid()
    for pid in pids:
        if pid == me:
            continue
        try:
            with open(f"{procs.PROC}/{pid}/environ", "rb") as fh:
                data = b"\0" + fh.read()
        except OSError:
            continue  # another user's, or gone meanwhile, or none
        at = data.find(_MARK)
        if at < 0:
            continue
        value = data[at + len(_MARK):].partition(b"\0")[0]
        tag = wanted.get(value)
        # (a thread's id, tried one by one, reads as its process: told once, by its own id)
        if tag is None or (pid := _process(pid)) in found.get(tag, ()) \
                or (stat := _stat(pid)) is None or stat[1] == groups.get(tag):
            continue
        found.setdefault(tag, {})[pid] = stat[0]
        if sig is not None:
            send({pid: stat[0]}, sig)


_FEW = 32  # ids: fewer are tried one by one (5 us each), more found in the listing


def _candidates(made: tuple[int, int] | None) -> Iterable[int]:
    """The processes with ids handed out after MADE[0] up to MADE[1] (None: all of them)."""
    if made is not None and made[0] <= made[1] and made[1] - made[0] <= _FEW:
        return range(made[0] + 1, made[1] + 1)  # (threads' ids too: see _read)
    pids = (int(entry) for entry in os.listdir(procs.PROC) if entry.isdigit())
    if made is None:
        return pids
    first, last = made
    return (pid for pid in pids
            if (first < pid <= last if first <= last else pid > first or pid <= last))


def started(pid: int) -> int | None:
    """When PID started (clock ticks after boot), or None if it has ended (a zombie
    counts as ended once no thread of it is left)."""
    stat = _stat(pid)
    return None if stat is None else stat[0]


def _stat(pid: int) -> tuple[int, int] | None:
    """When PID started and its process group, or None if it has ended (as ``started``)."""
    try:
        fields = procs.stat(pid)
        if fields is None:
            return None
        if fields[0] in (b"Z", b"X") and os.listdir(f"{procs.PROC}/{pid}/task") == [str(pid)]:
            return None
        return int(fields[19]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def _process(pid: int) -> int:
    """The process whose thread PID is (PID if it is one's first, or unknown)."""
    try:
        with open(f"{procs.PROC}/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return pid


def alive(pids: dict[int, int]) -> dict[int, int]:
    """Those of PIDS {pid: start} still running, not an id reused since (start -1: any)."""
    found = {}
    for pid, start in pids.items():
        now = started(pid)
        if now is not None and start in (now, -1):
            found[pid] = now
    return found


def send(pids: Mapping[int, int], sig: int) -> None:
    """Send SIG to each of PIDS {pid: start} that is still the process found (start -1:
    whichever has the id now): told through a pidfd once its start is checked, so an id
    that another process has taken since is never signalled."""
    for pid, start in pids.items():
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # gone
        except (AttributeError, OSError):  # no pidfds here (before Linux 5.3); a thread's id
            fd = -1
        try:
            if start != -1 and started(pid) != start:
                continue  # (ended: its id is nobody's, or another's)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if fd >= 0:
                    signal.pidfd_send_signal(fd, sig)
                else:
                    os.kill(pid, sig)
        finally:
            if fd >= 0:
                os.close(fd)


def group_alive(pgid: int) -> bool:
    """Whether any process of group PGID is left that has not ended. One that has is a
    zombie until its parent reaps it: an orphan's parent is init, which may take seconds
    (every 2 s on some machines), or an agent that is its container's PID 1, which reaps
    no orphan: the job would never end. It holds nothing (``started`` says so too)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, though not ours to signal
    if not os.path.isdir(procs.PROC):
        return True  # (as the signal says)
    for entry in os.listdir(procs.PROC):  # (the group's own: ``Escapes`` follows the rest)
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid and started(int(entry)) is not None:
                    return True
            except OSError:
                continue  # (gone meanwhile)
    return False


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def members(pgid: int, job_id: str) -> list[int]:
    """The processes of group PGID that belong to job JOB_ID (their environment says so:
    a reused group number is never taken for the job's)."""
    markers = {f"ZRES_JOB_ID={job_id}".encode(), f"ZRES_JOB_GRANT={job_id}".encode()}
    found = []
    for entry in os.listdir(procs.PROC) if os.path.isdir(procs.PROC) else []:
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != pgid:
                continue
            with open(f"{procs.PROC}/{entry}/environ", "rb") as fh:
                if markers & set(fh.read().split(b"\0")):
                    found.append(int(entry))
        except (OSError, ProcessLookupError):
            continue
    return found

