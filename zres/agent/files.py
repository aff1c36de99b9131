"""An agent's own files: a private state directory, held by one running agent at a time.

The state directory (``zres agent --state DIR``, else ``$XDG_STATE_HOME/zres/agent-NAME``,
else ``~/.local/state/zres/agent-NAME``) holds:

- ``lock``: locked while its agent runs, so a second agent given the same directory is
  refused, and whatever is found there at start was left by a dead one;
- ``jobs/``: the command jobs' logs, ``<cluster>/<job id>.log`` (removed a while after their
  jobs end: ``log_retention``), and the record of the jobs
  running (``running-NAME/<job id>``, one small file per job, so that starting or ending
  one never touches the others'), unless ``--job-logs`` names another directory;
- ``run/``: what the agent shares with its worker processes (the lease, their start logs,
  their ipc socket), removed when the agent stops, and at its next start after a kill.

An ipc socket's path has room for 107 bytes: when ``run/`` lies deeper, the socket goes in a
directory of its own made in the temporary directory, whose path ``run/elsewhere`` keeps so
that it is cleaned the same way.

Everything here is 0600 files in 0700 directories the agent owns, opened through its
directory's descriptor and never through a symbolic link: a directory already there that is
another user's, or that others may read or write, is refused, naming it. No user reads
another's job logs, and nobody makes the agent write through a link they planted.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import pwd
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Mapping

from ..core.errors import ZresError

SOCKET_PATH_MAX = 107  # bytes in an ipc:// path: sockaddr_un's sun_path, less its NUL
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeDirectory(ZresError, ValueError):
    """A directory the agent would keep its files in is not its own and private.

    A ValueError too: the command exits with status 2, as for any other configuration
    error, since restarting cannot cure it (the systemd unit does not restart on 2)."""


def safe_name(name: str) -> str:
    """NAME as a file name: other characters replaced, with a digest of NAME when any
    was (so two names never share a directory)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:100]
    return safe if safe == name else f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def default_state_dir(name: str, env: Mapping[str, str] = os.environ) -> str:
    """Where agent NAME keeps its files unless told: ``$XDG_STATE_HOME/zres/agent-NAME``
    (else under ``~/.local/state``), beside the brokers' ``broker-PORT``."""
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                     "state")
    return os.path.join(base, "zres", f"agent-{safe_name(name)}")


def private_dir(path: str, what: str, parent: int | None = None,
                shown: str | None = None) -> int:
    """Open the directory PATH (a name in directory PARENT, if given), made 0700 if missing
    (its missing parents too); return its descriptor. UnsafeDirectory, naming WHAT and
    SHOWN (PATH), if it is another user's or open to others, or (under PARENT) a link."""
    shown = shown or path
    try:
        if parent is None:
            _make_parents(path)
        os.mkdir(path, 0o700, dir_fd=parent)
    except FileExistsError:
        pass  # ours from an earlier run, or not: looked at below
    except OSError as exc:
        raise UnsafeDirectory(f"cannot make {what} {shown}: {exc.strerror} (name "
                              "another)") from None
    try:
        fd = os.open(path, _DIR | (0 if parent is None else os.O_NOFOLLOW), dir_fd=parent)
    except OSError as exc:
        why = "is not a directory (a link, say)" \
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) else exc.strerror
        raise UnsafeDirectory(f"{what} {shown} {why}") from None
    st = os.fstat(fd)
    why = None
    if st.st_uid != os.geteuid():
        why = f"belongs to {_user(st.st_uid)}, not to {_user(os.geteuid())}"
    elif st.st_mode & 0o077:
        why = f"is open to others (mode {stat.S_IMODE(st.st_mode):04o})"
    if why is not None:
        os.close(fd)
        raise UnsafeDirectory(f"{what} {shown} {why}: an agent keeps its files only in a "
                              "directory of its own that nobody else may read or write "
                              "(chmod 700 it, or name another)")
    return fd


def open_new(name: str, parent: int) -> int:
    """Create file NAME in directory PARENT, 0600, for writing; FileExistsError if any
    entry is there already (a link included: none is followed)."""
    return os.open(name, _NEW, 0o600, dir_fd=parent)


def open_existing(name: str, parent: int) -> int:
    """Open file NAME in directory PARENT for reading, never through a link."""
    return os.open(name, _READ, dir_fd=parent)


class AgentFiles:
    """An agent's state directory, locked while it runs, with its ``run/`` made afresh
    (what a killed agent left there removed first: ``left`` says whether there was any)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.fd = private_dir(self.path, "the agent's state directory")
        self._lock = os.open("lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600, dir_fd=self.fd)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._lock, 32, 0).decode(errors="replace").strip() or "?"
            self._close()
            raise ZresError(f"another agent (pid {holder}) runs with the state directory "
                            f"{self.path}: give each agent a --name (or --state) of its "
                            "own") from None
        except OSError:
            pass  # a file system without locks (an old NFS): nothing to learn from it
        try:
            os.ftruncate(self._lock, 0)
            os.pwrite(self._lock, f"{os.getpid()}\n".encode(), 0)
            self.left = self._remove_leftovers()
            self.run = os.path.join(self.path, "run")
            self._run_fd = private_dir("run", "the agent's run directory", self.fd, self.run)
        except BaseException:
            self._close()
            raise
        self.socket = os.path.join(self.run, "workers")
        self._elsewhere: str | None = None
        if len(os.fsencode(self.socket)) > SOCKET_PATH_MAX:
            self._elsewhere = _short_dir(open_new("elsewhere", self._run_fd))
            self.socket = os.path.join(self._elsewhere, "workers")

    def _remove_leftovers(self) -> bool:
        """Remove what a dead agent left in ``run/`` (and the socket's directory it names)."""
        try:
            run = os.open("run", _DIR | os.O_NOFOLLOW, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        except OSError:  # not a directory: whatever it is, it goes
            os.unlink("run", dir_fd=self.fd)
            return True
        try:
            fd = open_existing("elsewhere", run)
            with os.fdopen(fd, "rb") as fh:
                _remove_own_dir(os.fsdecode(fh.read(4096)))
        except OSError:
            pass
        finally:
            os.close(run)
        shutil.rmtree("run", dir_fd=self.fd)
        return True

    def close(self, logs: JobLogs | None = None) -> None:
        """Remove ``run/`` (and the socket's directory) and let the directory go (and
        LOGS')."""
        if logs is not None:
            logs.close()
        if self._elsewhere is not None:
            shutil.rmtree(self._elsewhere, ignore_errors=True)
        shutil.rmtree("run", dir_fd=self.fd, ignore_errors=True)
        os.close(self._run_fd)
        self._close()

    def _close(self) -> None:
        os.close(self._lock)  # (the lock goes with it)
        os.close(self.fd)


class JobLogs:
    """A directory of command jobs' logs, ``<cluster>/<job id>.log``, with the record of
    the jobs that agent AGENT runs: ``running-AGENT/<job id>``, a file per job holding its
    process group (made when it starts, removed when it ends: O(1) whatever else runs)."""

    def __init__(self, path: str, agent: str) -> None:
        self.path = os.path.abspath(path)
        self.fd = private_dir(self.path, "the job logs directory")
        # (Before the record was a directory, it was one file rewritten at each start.)
        self._legacy = f"running-{safe_name(agent)}.json"
        name = f"running-{safe_name(agent)}"
        try:
            self._running = private_dir(name, "the running jobs' record directory", self.fd,
                                        os.path.join(self.path, name))
        except BaseException:
            os.close(self.fd)
            raise

    def path_of(self, cluster: str, job_id: int) -> str:
        """Where job JOB_ID of CLUSTER logs: one directory per cluster, so the jobs of
        several brokers on one host never share a file."""
        return os.path.join(self.path, cluster, f"{int(job_id)}.log")

    def create(self, cluster: str, job_id: int, replace: bool = False) -> int:
        """Make JOB_ID's log (0600) and return it open for writing. FileExistsError if one
        is there, unless REPLACE (a later attempt of the job on this agent: the earlier
        one's log goes)."""
        name = f"{int(job_id)}.log"
        where = private_dir(cluster, "the cluster's job logs directory", self.fd,
                            os.path.join(self.path, cluster))
        try:
            if replace:
                try:
                    os.unlink(name, dir_fd=where)  # (a link itself, never what it names)
                except FileNotFoundError:
                    pass
            return open_new(name, where)
        finally:
            os.close(where)

    def open(self, cluster: str, job_id: int) -> int:
        """Open JOB_ID's log for reading; OSError (FileNotFoundError: none) if it cannot."""
        where = os.open(cluster, _DIR | os.O_NOFOLLOW, dir_fd=self.fd)
        try:
            return open_existing(f"{int(job_id)}.log", where)
        finally:
            os.close(where)

    def read(self, cluster: str, job_id: int, offset: int, limit: int = 256 * 1024) -> bytes:
        """Up to LIMIT bytes of JOB_ID's log from OFFSET; FileNotFoundError if none."""
        fd = self.open(cluster, job_id)
        try:
            return os.pread(fd, limit, offset)
        finally:
            os.close(fd)

    def tail(self, cluster: str, job_id: int, lines: int, limit: int = 64 * 1024) -> str:
        """The last LINES lines of JOB_ID's log (of its last LIMIT bytes); "" if none."""
        try:
            fd = self.open(cluster, job_id)
        except OSError:
            return ""
        try:
            data = os.pread(fd, limit, max(0, os.fstat(fd).st_size - limit))
        finally:
            os.close(fd)
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])

    # -- the record of running jobs ------------------------------------------------------
    def note_running(self, job_id: int, pgid: int, tag: str = "") -> None:
        """Record that job JOB_ID runs as process group PGID, its processes marked with TAG
        (``jobprocs``): its own file (0600, made anew, never through a link), nobody else's
        read or written. OSError if it cannot be."""
        name = str(int(job_id))
        data = json.dumps({"pgid": int(pgid), "tag": str(tag)}).encode()
        try:
            fd = open_new(name, self._running)
        except FileExistsError:  # an earlier attempt's, whose end was not recorded
            os.unlink(name, dir_fd=self._running)
            fd = open_new(name, self._running)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def forget_running(self, job_id: int | str) -> None:
        """Remove job JOB_ID's record (it ended, or was stopped); nothing if there is none."""
        try:
            os.unlink(str(job_id), dir_fd=self._running)
        except FileNotFoundError:
            pass

    def running_left(self) -> dict[str, tuple[int, str]]:
        """The jobs a previous agent of this name left recorded as running: job id ->
        (process group, tag: "" if none was recorded) (an unreadable record is dropped; an
        older version's file of all of them is read, then removed)."""
        left: dict[str, tuple[int, str]] = {}
        try:
            with os.fdopen(open_existing(self._legacy, self.fd), "rb") as fh:
                old = json.load(fh)
            left.update({str(k): (v, "") for k, v in old.items() if type(v) is int and v > 1}
                        if isinstance(old, dict) else {})
        except (OSError, ValueError):
            pass
        try:
            os.unlink(self._legacy, dir_fd=self.fd)
        except OSError:
            pass
        for name in os.listdir(self._running):
            try:
                with os.fdopen(open_existing(name, self._running), "rb") as fh:
                    record = json.load(fh)
                pgid, tag = record["pgid"], record.get("tag", "")
                if name.isdigit() and type(pgid) is int and pgid > 1 and type(tag) is str:
                    left[name] = (pgid, tag if len(tag) <= 100 else "")  # (ours: 30 bytes)
                    continue
            except (OSError, ValueError, TypeError, KeyError, AttributeError):
                pass
            try:
                os.unlink(name, dir_fd=self._running)  # not one to act on: only dropped
            except OSError:
                pass
        return left

    def close(self) -> None:
        os.close(self._running)
        os.close(self.fd)


def open_files(name: str, state: str | None,
               job_logs: str | None) -> tuple[AgentFiles, JobLogs]:
    """The files of agent NAME: its state directory (STATE, else the default one) and its
    job logs (JOB_LOGS, else STATE/jobs). UnsafeDirectory names one that is not private;
    ZresError says another agent runs with that state directory."""
    files = AgentFiles(state or default_state_dir(name))
    try:
        return files, JobLogs(job_logs or os.path.join(files.path, "jobs"), name)
    except BaseException:
        files.close()
        raise


def _make_parents(path: str) -> None:
    """Make PATH's missing parent directories, 0700 (makedirs gives them its umask's)."""
    missing = []
    head = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(head):
        missing.append(head)
        head = os.path.dirname(head)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass


def _short_dir(note: int) -> str:
    """Make a private directory whose socket path fits an ipc:// address, its path written
    to NOTE (a file, closed here) before it is made: a kill between the two leaves no
    directory that nothing names."""
    try:
        for base in (tempfile.gettempdir(), "/tmp"):
            if len(os.fsencode(os.path.join(base, "zres-12345678", "workers"))) \
                    <= SOCKET_PATH_MAX:
                break
        else:
            raise UnsafeDirectory("no directory short enough for the workers' socket: set "
                                  "TMPDIR to a short path")
        while True:
            path = os.path.join(base, f"zres-{secrets.token_hex(4)}")
            os.ftruncate(note, 0)
            os.pwrite(note, os.fsencode(path), 0)
            try:
                os.mkdir(path, 0o700)
                return path
            except FileExistsError:
                continue  # someone's, or a leftover not ours to remove: another name
    finally:
        os.close(note)


def _remove_own_dir(path: str) -> None:
    """Remove directory PATH if it is one of this user's (not a link: never followed)."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and os.path.isabs(path):
        shutil.rmtree(path, ignore_errors=True)


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
