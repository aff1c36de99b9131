"""A worker's task threads, with plain calls: made on demand, reused, bounded."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from tests.conftest import wait_until
from zres.agent.threads import TaskThreads

pytestmark = pytest.mark.timeout(30)


def test_calls_run_on_reused_threads_at_most_the_bound_at_once():
    threads = TaskThreads(2, "t")
    gate, ran, names = threading.Event(), [], set()

    def call(n):
        names.add(threading.current_thread().name)
        gate.wait(10)
        ran.append(n)

    for n in range(3):  # the third waits for a free thread
        threads.submit(call, n)
    wait_until(lambda: len(names) == 2, message="two calls running")
    assert not ran
    gate.set()
    wait_until(lambda: sorted(ran) == [0, 1, 2], message="every call run")
    threads.submit(call, 3)  # an idle thread takes it: no third thread
    wait_until(lambda: len(ran) == 4, message="the fourth call run")
    assert names == {"t_0", "t_1"}


def test_what_escapes_a_call_ends_the_process_rather_than_leave_a_task_unreported():
    """A task's own error is caught where it runs; what escapes a call is a bug of the
    worker's: the process ends (its agent fails its tasks as lost) instead of going on
    with an outcome never sent (dropped silently, a task's owner would wait for ever)."""
    code = ("import time; from zres.agent.threads import TaskThreads\n"
            "def fail(): raise RuntimeError('a bug')\n"
            "TaskThreads(1, 't').submit(fail)\n"
            "time.sleep(20)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=20,
                          text=True)
    assert done.returncode == 70, done.stderr
    assert "task_thread_failed" in done.stderr and "a bug" in done.stderr
