"""The client's outbox, with plain data: releases gathered into one message, and sent
before any request that follows them."""

from __future__ import annotations

import concurrent.futures as cf
import itertools
from collections import deque
from typing import Any

import pytest

from zres.client.outbox import RELEASE_EVERY, OutboxSender
from zres.core import protocol as P
from zres.core.limits import Limits

pytestmark = pytest.mark.timeout(30)


class Sender(OutboxSender):
    """An I/O thread's state, recording what it sends instead of sending it."""

    def __init__(self) -> None:
        self.outbox: deque[tuple[str, Any, Any]] = deque()
        self.unacked: deque[tuple[str, Any, Any]] = deque()
        self.pending: dict[int, Any] = {}
        self.requests: dict[int, Any] = {}
        self.keeps = False
        self.limits = Limits()
        self.in_flight: deque[tuple[int, int]] = deque()
        self.flying = 0
        self.releases: list[int] = []
        self.released_at = 0.0
        self._request_ids = itertools.count(1)
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def _send(self, kind: str, body: dict[str, Any], frames: list[Any] = ()) -> None:  # type: ignore[assignment]
        self.sent.append((kind, body))

    def wake(self) -> None:
        pass


def test_releases_of_a_loop_go_together():
    """One future let go of per turn (a loop of submit-then-result): the broker gets one
    release message for those of RELEASE_EVERY, not one each."""
    sender = Sender()
    for task_id in range(1, 6):
        sender.outbox.append((P.RELEASE, task_id, ()))
        sender._send_outbox()
    # The first goes at once (none went for long); the next ones wait for the others.
    assert sender.sent == [(P.RELEASE, {"ids": [1]})]
    sender.released_at -= RELEASE_EVERY  # (that long later: a turn with nothing queued)
    sender._send_outbox()
    assert sender.sent == [(P.RELEASE, {"ids": [1]}), (P.RELEASE, {"ids": [2, 3, 4, 5]})]
    sender._send_outbox()
    assert len(sender.sent) == 2  # nothing more to send


def test_a_request_finds_the_releases_before_it_heard():
    """A request (status, say) is sent after every release gathered before it."""
    sender = Sender()
    sender.outbox.append((P.RELEASE, 1, ()))
    sender._send_outbox()
    sender.outbox.append((P.RELEASE, 2, ()))
    sender.outbox.append((P.STATUS, ({}, cf.Future()), ()))
    sender._send_outbox()
    assert [kind for kind, _ in sender.sent] == [P.RELEASE, P.RELEASE, P.STATUS]
    assert sender.sent[1] == (P.RELEASE, {"ids": [2]})
