"""A loop's poll ends when a signal it handles arrives, and a thread's poll when it is told
to stop (``zres.core.wakeup``): brokers and agents stop at once rather than at a timeout."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import zmq

from zres.core.wakeup import Waker, drain, wake_on_signals

pytestmark = pytest.mark.timeout(60)


def test_a_handled_signal_ends_a_poll_that_waits_on_the_wakeup_descriptor():
    heard: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda number, _: heard.append(number))
    poller = zmq.Poller()
    fd = wake_on_signals(poller)
    try:
        assert fd is not None
        os.kill(os.getpid(), signal.SIGUSR1)
        events = dict(poller.poll(30_000))  # (without the descriptor: 30 s, and nothing)
        assert fd in events and heard == [signal.SIGUSR1]
        drain(fd)
        assert not dict(poller.poll(0)), "drained, it wakes the poll no more"
    finally:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGUSR1, previous)
        poller.unregister(fd)
        os.close(fd)


def test_signals_are_not_waited_for_from_another_thread():
    got: list[int | None] = [0]
    thread = threading.Thread(target=lambda: got.__setitem__(0, wake_on_signals(zmq.Poller())))
    thread.start()
    thread.join(10)
    assert got == [None]


def test_a_waker_ends_its_threads_poll_when_told_to_stop():
    waker = Waker()
    polling = threading.Event()

    def run() -> None:
        poller = zmq.Poller()
        poller.register(waker.fd, zmq.POLLIN)
        while not waker.stopped:
            polling.set()
            poller.poll(30_000)

    thread = threading.Thread(target=run)
    thread.start()
    assert polling.wait(10)
    waker.stop()
    thread.join(20)
    try:
        assert not thread.is_alive(), "the thread waited out its poll"
        assert waker.stopped
    finally:
        waker.close()
