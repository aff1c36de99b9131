"""The client's outbox, with plain data: releases gathered into one message, and sent
before any request that follows them."""

from __future__ import annotations

import concurrent.futures as cf
import itertools
from collections import deque
from typing import Any

import pytest

from zres.client.outbox import RELEASE_EVERY, WINDOW, OutboxSender
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
        self.dead = self._stop = False
        self._welcomed = True

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


def submit_item(local: int) -> list[Any]:
    return [local, {"CPU": 1}, 0, 0, [], 1, "f", False]


def test_a_lone_submit_goes_from_the_user_thread_and_anything_else_waits_its_turn():
    """A user thread sends its submit itself only when it is all that is queued and it may
    go now (the same bookkeeping as the I/O thread's); otherwise it stays queued, in order,
    for the I/O thread (which batches, waits for the window, or refuses it saying why)."""
    sender = Sender()
    sender.keeps = True
    sender.outbox.append((P.SUBMIT, submit_item(1), [b"call"]))
    assert sender._send_lone_submit()
    assert sender.sent == [(P.SUBMIT, {"tasks": [submit_item(1)]})]
    assert not sender.outbox and sender.flying == 1 and list(sender.in_flight) == [(1, 1)]
    assert [item for _, item, _ in sender.unacked] == [submit_item(1)]  # (sent again if lost)
    # Releases queued before it (a loop's futures let go of) go the releases' way: gathered,
    # and sent with it when due (as they are now: none went for long).
    sender.outbox.extend([(P.RELEASE, 5, ()), (P.SUBMIT, submit_item(2), [b"call"])])
    assert sender._send_lone_submit()
    assert sender.sent[1:] == [(P.SUBMIT, {"tasks": [submit_item(2)]}),
                               (P.RELEASE, {"ids": [5]})]
    sender.outbox.extend([(P.RELEASE, 6, ()), (P.SUBMIT, submit_item(3), [b"call"])])
    assert sender._send_lone_submit()  # (one within RELEASE_EVERY: kept for later)
    assert sender.sent[3:] == [(P.SUBMIT, {"tasks": [submit_item(3)]})]
    assert not sender.outbox and sender.releases == [6]

    waits = [
        ("two queued", lambda s: s.outbox.append((P.SUBMIT, submit_item(3), [b"c"]))),
        ("a cancel first", lambda s: s.outbox.appendleft(("stop", 9, ()))),
        ("not welcomed", lambda s: setattr(s, "_welcomed", False)),
        ("stopping", lambda s: setattr(s, "_stop", True)),
        ("the window full", lambda s: setattr(s, "flying", WINDOW)),
        ("a long queue", lambda s: s.outbox.extendleft((P.RELEASE, i, ()) for i in range(99))),
        ("over the header limit", lambda s: setattr(s, "limits", Limits(header_bytes=10))),
        ("over the payload limit", lambda s: setattr(s, "limits", Limits(payload_bytes=1))),
    ]
    for why, make in waits:
        sender = Sender()
        sender.outbox.append((P.SUBMIT, submit_item(2), [b"call"]))
        make(sender)
        queued = list(sender.outbox)
        assert not sender._send_lone_submit(), why
        assert sender.sent == [] and list(sender.outbox) == queued, why
