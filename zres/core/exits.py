"""Waiting for a child process to end, heard the moment it does.

``Popen.wait(timeout)`` looks at the child now and then, sleeping between looks (from half a
millisecond, doubling, up to 50 ms): a process that takes 40 ms to leave is seen gone at
64 ms. Stopping a local cluster (each agent, then its broker) and an agent stopping its
worker processes waited that, per process. A pidfd (Linux 5.3 and later) is readable the
moment its process ends; elsewhere ``Popen.wait`` does as before.
"""

from __future__ import annotations

import os
import select
import subprocess
from typing import Any


def wait_ended(proc: subprocess.Popen[Any], timeout: float) -> bool:
    """Wait up to TIMEOUT seconds for PROC to end (reaping it); return whether it has."""
    if proc.poll() is not None:
        return True
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # (no pidfd here; or it has just been reaped)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        select.select([fd], [], [], timeout)  # (readable once it has ended)
    finally:
        os.close(fd)
    return proc.poll() is not None
