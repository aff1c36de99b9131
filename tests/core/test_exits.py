"""Waiting for a child process to end (``zres.core.exits``), with a pidfd or without."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from zres.core.exits import wait_ended


@pytest.mark.parametrize("pidfd", [True, False])
def test_a_process_is_reaped_once_it_ends_and_one_running_is_waited_for_no_longer(
        monkeypatch, pidfd: bool):
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)  # (as where there is none)
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(len(sys.stdin.read()))"],
                            stdin=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        assert not wait_ended(proc, 0.1) and proc.returncode is None  # (it waits for stdin)
        proc.stdin.write(b"abc")
        proc.stdin.close()  # it ends, exit status 3
        assert wait_ended(proc, 60) and proc.returncode == 3
        assert wait_ended(proc, 0)  # (ended already)
    finally:
        proc.kill()
        proc.wait()
