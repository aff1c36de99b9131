"""A worker's task threads, with plain calls: made on demand, reused, bounded."""

from __future__ import annotations

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


def test_a_call_that_raises_leaves_its_thread_serving():
    threads = TaskThreads(1, "t")
    ran = []

    def fail():
        raise SystemExit(3)

    threads.submit(fail)
    threads.submit(ran.append, 1)
    wait_until(lambda: ran == [1], message="the call after the failing one")
