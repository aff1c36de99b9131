"""One broker per state directory: the lock a broker holds on its directory while it runs.

Two brokers on one state directory (a second started by mistake, a supervisor starting the
new one before the old has gone) would hand out the same task ids and each overwrite what
the other keeps; a restarted broker would then replay a mixture of both. A broker
therefore holds an exclusive ``flock`` on ``broker.lock`` in its directory, taken before
it reads or discards anything there, and refuses to start, naming the holder's pid, while
another holds it. The kernel drops the lock when its holder ends, however it ends
(SIGKILL included): a restarted broker never finds a stale lock to clear by hand.

A broker killed a moment ago may still be exiting when its successor starts: the
successor waits for the lock a few seconds before it refuses.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time

from ..core.errors import ZresError
from ..logs import get_logger

log = get_logger("zres.broker")

FILENAME = "broker.lock"
# Seconds a starting broker waits for another to let go before it refuses: a killed
# process lets go as it exits, within milliseconds; a supervisor stopping one broker before
# it starts the next needs none of it.
WAIT = 3.0


class StateInUse(ZresError):
    """Another live broker holds the state directory."""


def hold(directory: str) -> int:
    """Take the lock on DIRECTORY (waiting up to WAIT seconds) and write our pid in it;
    return its descriptor, which holds the lock until closed. Raise StateInUse if another
    process holds it all that time."""
    path = os.path.join(directory, FILENAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        _take(fd, directory)
    except BaseException:
        os.close(fd)
        raise
    try:  # (what it says is for the refusal's message only: a full disk is no reason to stop)
        mine = f"{os.getpid()}\n".encode()
        os.pwrite(fd, mine, 0)
        os.ftruncate(fd, len(mine))
    except OSError:
        pass
    return fd


def _take(fd: int, directory: str) -> None:
    """Lock FD, waiting up to WAIT seconds for another holder to let go."""
    deadline = None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if deadline is None:
                deadline = time.monotonic() + WAIT
                holder = _holder(fd)
                log.debug("state_dir_busy", dir=directory, holder=holder, waiting=WAIT)
            if time.monotonic() >= deadline:
                holder = _holder(fd)
                raise StateInUse(
                    f"the state directory {directory} is in use by another broker"
                    f"{f' (pid {holder})' if holder else ''}: one broker per state "
                    "directory (stop that one first, or give this one --state of its "
                    "own)") from None
            time.sleep(0.05)
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            # (a file system without locks, as some network ones: run, unguarded, as before)
            log.warning("state_dir_not_locked", dir=directory, error=exc.strerror,
                        why="its file system has no locks: a second broker on it is not "
                        "refused")
            return
    if deadline is not None:  # (why this start took a moment)
        log.info("state_dir_taken_after_wait", dir=directory, holder=holder,
                 waited=round(time.monotonic() - deadline + WAIT, 3))


def _holder(fd: int) -> str:
    """The pid the lock's holder wrote, as written ('' if none could be read)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""
