"""Building blocks for task functions in the end-to-end tests.

Tests observe order through files, never through sleeps: a task announces that it started
by creating a marker, and blocks until the test creates a release file. These run inside
worker processes (the tests package travels by value, see conftest.py).
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def wait_for_file(path: str, timeout: float = 60.0) -> bool:
    """Block until PATH exists or TIMEOUT passes; return whether it exists."""
    deadline = time.time() + timeout
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.01)
    return os.path.exists(path)


def announce_and_wait(release: str, marker: str, timeout: float = 60.0) -> bool:
    """Create MARKER, then block until RELEASE exists; return whether it was released."""
    Path(marker).touch()
    return wait_for_file(release, timeout)


def hold(release: str, marker: str) -> str:
    """Announce the start by creating MARKER, then block until RELEASE exists."""
    announce_and_wait(release, marker)
    return "released"


def ledgered(ledger: str, key: str, seconds: float = 0.0) -> str:
    """Append KEY's start to LEDGER, run SECONDS, append its end; return KEY.

    One line a write (O_APPEND: lines from several processes never interleave), so a test
    can count how many times each body began and how many ran at once.
    """
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"start {key} {os.getpid()} {time.time():.6f}\n".encode())
        if seconds:
            time.sleep(seconds)
        os.write(fd, f"end {key} {os.getpid()} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)
    return key


def starts(ledger: str) -> dict[str, int]:
    """How many times each key's body began, by LEDGER."""
    counts: dict[str, int] = {}
    if os.path.exists(ledger):
        for line in open(ledger):
            kind, key, *_ = line.split()
            if kind == "start":
                counts[key] = counts.get(key, 0) + 1
    return counts


class FileEvent:
    """A threading.Event that a test and its tasks (in other processes) share: set is a
    file that exists. Picklable, so it can be an argument of a task."""

    def __init__(self, path: str) -> None:
        self.path = path

    def set(self) -> None:
        Path(self.path).touch()

    def is_set(self) -> bool:
        return os.path.exists(self.path)

    def wait(self, timeout: float | None = None) -> bool:
        return wait_for_file(self.path, 120.0 if timeout is None else timeout)
