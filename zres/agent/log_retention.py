"""How long an agent keeps the logs of command jobs that have ended, and how much of them.

A job's log (``<job logs>/<cluster>/<job id>.log``: ``files``) stays after the job ends, so
``zres logs`` can read it; it is removed RETENTION seconds after the job ended
(``[agent] job_log_retention``, default 7 days; ``inf``: never), and, past MAX_BYTES of
ended jobs' logs (``[agent] job_log_max_bytes``, default none), the oldest ended first.

Cheap on the loop: the ended logs are kept in the order they ended, so a turn looks at the
first one only, and removes at most a batch. When the agent starts, one walk of the
directory finds what earlier runs left (a log's end is its modification time: the agent
sets it as the job ends, so a job silent for days before it ended is not taken for an old
one), after the jobs an agent killed outright left running are stopped.

Never removed: the log of a job running here, nor of one that any agent sharing the
directory (``--job-logs`` given to several) records as running (``running-NAME/``), nor
a log written since its job ended (a later attempt's, perhaps on another agent). Nothing
is written before a removal, so an agent killed midway loses nothing that should stay: its
next start finds the rest again. A log removed here is remembered (the last ``REMEMBERED``)
so that ``zres logs`` says why it is gone; for one removed by an earlier run, the broker
gives the job's end, and the retention says whether that explains it.
"""

from __future__ import annotations

import math
import os
import stat
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

from ..logs import get_logger
from .files import JobLogs

log = get_logger("zres.agent")

RETENTION = 7 * 24 * 3600.0  # seconds an ended job's log is kept, by default
BATCH = 200       # logs removed per turn at most (the loop has messages to move too)
REMEMBERED = 10_000  # removed logs whose reason is kept for ``zres logs``
_SLACK = 1.0      # seconds a log's time may differ from its recorded end (file systems)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW

Key = tuple[str, int]  # (cluster, job id)


def duration(seconds: float) -> str:
    """SECONDS in words: "7 days", "3 hours", "1.5 s"."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = seconds / size
            text = f"{count:.0f}" if abs(count - round(count)) < 0.05 else f"{count:.1f}"
            return f"{text} {unit}{'' if text == '1' else 's'}"
    return f"{seconds:.3g} s"


class LogRetention:
    """The ended jobs' logs of LOGS, removed RETENTION seconds after their end (and past
    MAX_BYTES, the oldest first); RUNNING(cluster, job id) says whether a job runs here."""

    def __init__(self, logs: JobLogs, agent: str, retention: float = RETENTION,
                 max_bytes: int | None = None,
                 running: Callable[[str, int], bool] = lambda cluster, job: False) -> None:
        self.logs, self.agent = logs, agent
        self.retention, self.max_bytes = retention, max_bytes
        self._running = running
        self._ended: deque[tuple[float, str, int]] = deque()  # (end, cluster, job), in order
        self._latest: dict[Key, tuple[float, int]] = {}  # job -> its last end, log's size
        self.bytes = 0    # the ended logs' bytes, all told
        self.removed: OrderedDict[Key, str] = OrderedDict()  # -> why, the last REMEMBERED
        self._off = math.isinf(retention) and max_bytes is None

    # -- what is kept ----------------------------------------------------------------------
    def ended(self, cluster: str, job_id: int, now: float | None = None) -> None:
        """Job JOB_ID of CLUSTER ended (NOW, wall clock): its log's time is set to it, and
        it is removed once its time has come."""
        if self._off:
            return
        now = time.time() if now is None else now
        try:
            where = os.open(cluster, _DIR, dir_fd=self.logs.fd)
        except OSError:
            return  # (no log: it could not be made)
        try:
            name = f"{int(job_id)}.log"
            os.utime(name, (now, now), dir_fd=where, follow_symlinks=False)
            size = os.lstat(name, dir_fd=where).st_size
        except OSError:
            return
        finally:
            os.close(where)
        self._add(now, cluster, int(job_id), size)

    def _add(self, at: float, cluster: str, job_id: int, size: int) -> None:
        key = (cluster, job_id)
        earlier = self._latest.get(key)
        if earlier is not None:  # (an earlier attempt's: its entry goes stale)
            self.bytes -= earlier[1]
        self._latest[key] = (at, size)
        self.bytes += size
        self.removed.pop(key, None)
        self._ended.append((at, cluster, job_id))

    def found(self, stopped: Iterable[str] = (), now: float | None = None) -> int:
        """Walk the directory once (at start) for the logs earlier runs left: each is
        removed when its time comes. Those of jobs STOPPED (left running by an agent killed
        outright, stopped just now) ended NOW. Return how many were found."""
        if self._off:
            return 0
        now = time.time() if now is None else now
        ended_now, running = {int(j) for j in stopped}, self._running_anywhere()
        found: list[tuple[float, str, int, int]] = []
        for cluster in os.listdir(self.logs.fd):
            if cluster.startswith("running-"):
                continue
            try:
                where = os.open(cluster, _DIR, dir_fd=self.logs.fd)
            except OSError:
                continue  # (a file, a link: not a cluster's directory)
            try:
                for name in os.listdir(where):
                    job = _job_of(name)
                    if job is None or job in running or self._running(cluster, job):
                        continue
                    try:
                        st = os.lstat(name, dir_fd=where)
                    except OSError:
                        continue
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    at = st.st_mtime
                    if job in ended_now:  # (its time set to its end, as for any job's)
                        at = now
                        try:
                            os.utime(name, (now, now), dir_fd=where, follow_symlinks=False)
                        except OSError:
                            pass
                    found.append((at, cluster, job, st.st_size))
            finally:
                os.close(where)
        found.sort()  # (the order they ended in: a turn looks at the first only)
        for at, cluster, job, size in found:
            if (cluster, job) not in self._latest:
                self._add(at, cluster, job, size)
        return len(found)

    # -- what goes ------------------------------------------------------------------------
    def poll(self, now: float | None = None, batch: int = BATCH) -> int:
        """Remove up to BATCH logs whose time has come (NOW, wall clock); return how many.
        O(1) when none has: only the oldest ended log is looked at."""
        if not self._ended:
            return 0
        now = time.time() if now is None else now
        if self._ended[0][0] > now - self.retention and not self._over():
            return 0
        removed, running = 0, self._running_anywhere()
        while self._ended and removed < batch:
            at, cluster, job = self._ended[0]
            expired = at <= now - self.retention
            if not expired and not self._over():
                break
            self._ended.popleft()
            if self._latest.get((cluster, job), (None, 0))[0] != at:
                continue  # (a later attempt ended since: its entry is the one that counts)
            _, size = self._latest.pop((cluster, job))
            self.bytes -= size
            if job in running or self._running(cluster, job):
                continue  # (it runs again: its end will be recorded anew)
            why = (f"{duration(now - at)} after the job ended (job_log_retention is "
                   f"{duration(self.retention)})") if expired else (
                f"to keep its ended jobs' logs under job_log_max_bytes ({self.max_bytes} "
                "bytes), the oldest first")
            if self._remove(cluster, job, at):
                removed += 1
                self.removed[(cluster, job)] = why
                while len(self.removed) > REMEMBERED:
                    self.removed.popitem(last=False)
        if removed:
            log.info("job_logs_removed", count=removed, kept=len(self._ended),
                     kept_bytes=self.bytes)
        return removed

    def _over(self) -> bool:
        return self.max_bytes is not None and self.bytes > self.max_bytes

    def _remove(self, cluster: str, job_id: int, at: float) -> bool:
        """Unlink JOB_ID's log if it is still the one that ended AT (not written since)."""
        try:
            where = os.open(cluster, _DIR, dir_fd=self.logs.fd)
        except OSError:
            return False
        try:
            name = f"{job_id}.log"
            st = os.lstat(name, dir_fd=where)
            if not stat.S_ISREG(st.st_mode) or st.st_mtime > at + _SLACK:
                return False  # (written since: a later attempt's, here or elsewhere)
            os.unlink(name, dir_fd=where)
            return True
        except OSError:
            return False  # (gone already: another agent sharing the directory took it)
        finally:
            os.close(where)

    def _running_anywhere(self) -> set[int]:
        """The jobs that any agent keeping its logs here records as running (its own
        among them): their logs stay, whatever their age."""
        jobs: set[int] = set()
        for entry in os.listdir(self.logs.fd):
            if not entry.startswith("running-"):
                continue
            try:
                where = os.open(entry, _DIR, dir_fd=self.logs.fd)
            except OSError:
                continue  # (an older version's file of them: read at its agent's start)
            try:
                jobs.update(int(name) for name in os.listdir(where) if name.isdigit())
            finally:
                os.close(where)
        return jobs

    def why_missing(self, cluster: str, job_id: int, ended: object = None,
                    now: float | None = None) -> str | None:
        """Why JOB_ID's log is not here, if it was removed (ENDED: when the job ended, as
        the broker says, for a log removed before this agent last started)."""
        why = self.removed.get((cluster, int(job_id)))
        if why is not None:
            return f"its log was removed by agent {self.agent} {why}"
        now = time.time() if now is None else now
        if isinstance(ended, (int, float)) and not isinstance(ended, bool) \
                and now - ended >= self.retention:
            return (f"its log was removed by agent {self.agent}: the job ended "
                    f"{duration(now - ended)} ago, and job_log_retention is "
                    f"{duration(self.retention)}")
        return None


def _job_of(name: str) -> int | None:
    """The job id of log file NAME (``12.log``); None for anything else."""
    stem, dot, ext = name.partition(".")
    return int(stem) if dot and ext == "log" and stem.isdigit() else None
