"""Sending what a client's user threads queued: submits in batches within the broker's
limits, forced cancels, releases, and requests after what was queued before them.

Submits are sent at most ``WINDOW`` tasks ahead of the broker's acknowledgements (each
``accepted`` or refusal lets more go). Sent all at once, a large map waits as raw messages
in the broker's socket while the broker takes it (200,000 no-op tasks: 50 MB, left in its
allocator after; ingest 2.5 times slower): bounded, they cost the broker little, and what
the client holds it would hold anyway. Everything queued after a held submit waits behind
it, so that the broker still sees it all in order.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import msgpack
import zmq

from ..core import protocol as P
from ..core.errors import ZresError
from .outcomes import settle

STOP = "stop"  # an outbox entry: a task to cancel with force (sent batched, as CANCEL)


_RELEASES = 2_000   # task ids per release message
RELEASE_EVERY = 0.1  # seconds releases are gathered for, at most (see _send_releases)
WINDOW = 20_000     # tasks sent and not yet acknowledged, at most (a few seconds of a
#                     broker's work: it never waits for the next, nor holds a flood)
_LONE = 64          # queued entries at most, a submit and releases, a user thread sends


class OutboxSender:
    """Mixed into the client's I/O thread, which alone sends (see ``io``)."""

    if TYPE_CHECKING:  # (the I/O thread's own, used here)
        import threading
        sock: Any
        sock_lock: threading.Lock
        dead: bool
        _stop: bool
        _awake: bool
        _welcomed: bool
        outbox: deque[tuple[str, Any, Any]]
        unacked: deque[tuple[str, Any, Any]]
        pending: dict[int, Any]
        requests: dict[int, Any]
        keeps: bool
        limits: Any
        in_flight: deque[tuple[int, int]]   # sent submits: (last local id, tasks)
        flying: int                         # ... their tasks, in all
        releases: list[int]                 # let go of, not yet sent
        released_at: float                  # when releases were last sent
        _request_ids: itertools.count[int]

        def _send(self, kind: str, body: dict[str, Any], frames: list[Any] = ...) -> None: ...

        def wake(self) -> None: ...

    def send_submit_now(self) -> None:
        """Send the submit a user thread has just queued, from that thread, or wake the
        I/O thread to send it.

        Woken for every submit, the I/O thread costs a task's round trip a thread's
        wake-up, which the writer of the wake-up waits through too: 100-200 us in all on a
        VM whose idle CPUs halt. So the user thread sends it itself when the I/O thread is
        waiting (the socket's lock is free) and the submit is all that is queued, within
        the window and the broker's limits. Anything else (a map's batch, a cancel, a
        request, a submit over a limit) goes the I/O thread's way, in order."""
        if self._awake or not self.sock_lock.acquire(blocking=False):
            self.wake()
            return
        try:
            sent = self._send_lone_submit()
            # (a message that came meanwhile: our send may have taken the socket's news
            # of it, which the I/O thread's poll waits for: see io._turn)
            left = not sent or P.waiting(self.sock)
        finally:
            self.sock_lock.release()
        if left:
            self.wake()

    def _send_lone_submit(self) -> bool:
        """Send the one submit queued, if that is all there is and it may go now (under
        ``sock_lock``); return whether it went."""
        outbox = self.outbox
        if self.dead or self._stop or not self._welcomed or not 0 < len(outbox) <= _LONE:
            return False
        # (user threads only append: what is here stays, in order; a loop's futures let go
        # of are queued as releases ahead of its next submit)
        *before, (kind, item, frames) = list(outbox)  # (one C call: atomic under the GIL)
        if kind != P.SUBMIT or any(k != P.RELEASE for k, _, _ in before) \
                or self.flying >= WINDOW or _header_bytes(item) > self.limits.header_bytes \
                or sum(len(P.buffer(f)) for f in frames) > self.limits.payload_bytes:
            return False  # (the I/O thread waits, or refuses it saying why)
        try:
            self._send(P.SUBMIT, {"tasks": [item]}, list(frames))
        except zmq.ZMQError:
            return False  # (left queued: the I/O thread meets the error, and says so)
        for _ in before:
            self.releases.append(outbox.popleft()[1])  # (gathered: see _send_releases)
        outbox.popleft()
        self.in_flight.append((item[0], 1))
        self.flying += 1
        if self.keeps:
            self.unacked.append((kind, item, frames))
        self._send_releases()  # (if due: as the I/O thread's turn would have)
        return True

    def _send_outbox(self) -> None:
        """Send everything queued: submits in batches, then stops and releases."""
        if not self.outbox:
            self._send_releases()
            return
        submits: list[Any] = []
        frames: list[Any] = []
        stops: list[int] = []   # cancels with force
        size = [0, 0]  # the batch's header and payload bytes (bounds)
        limits = self.limits

        def flush_submits() -> None:
            if submits:
                self._send(P.SUBMIT, {"tasks": list(submits)}, list(frames))
                self.in_flight.append((submits[-1][0], len(submits)))
                self.flying += len(submits)
                submits.clear()
                frames.clear()
                size[:] = [0, 0]

        while self.outbox:
            kind, item, item_frames = self.outbox.popleft()
            if kind == P.SUBMIT and self.flying + len(submits) >= WINDOW:
                self.outbox.appendleft((kind, item, item_frames))  # (sent once some are
                break                                               # acknowledged)
            if kind == P.SUBMIT:
                # Batches stay within the broker's limits: a message over one is refused
                # whole, and one whose header is over cannot even say which tasks it held.
                head = _header_bytes(item)
                body = sum(len(P.buffer(f)) for f in item_frames)
                if head > limits.header_bytes or body > limits.payload_bytes:
                    self._too_big(item, head, body)
                    continue
                if len(submits) >= min(1000, limits.tasks) \
                        or size[0] + head > limits.header_bytes \
                        or size[1] + body > limits.payload_bytes:
                    flush_submits()
                submits.append(item)
                frames.extend(item_frames)
                if self.keeps:
                    self.unacked.append((kind, item, item_frames))
                size[0] += head
                size[1] += body
            elif kind == P.RELEASE:
                self.releases.append(item)
            elif kind == STOP:
                stops.append(item)
            else:  # a request: the broker must see what was queued before it first
                flush_submits()
                self._send_stops(stops)
                stops = []
                self._send_releases(now=True)
                body, reply = item
                req = next(self._request_ids)
                self.requests[req] = reply
                self._send(kind, {**body, "req": req})
        flush_submits()
        self._send_stops(stops)
        self._send_releases()

    def _send_releases(self, now: bool = False) -> None:
        """Send the releases gathered, if RELEASE_EVERY has passed since the last were
        sent (or NOW: a request must find the broker has heard them).

        A loop of submit-then-result lets go of one future a task: gathered, its releases
        cost the broker one message every RELEASE_EVERY, not one a task (a message is the
        bulk of what the broker spends on a release). The broker holds the results a
        fraction of a second longer."""
        releases = self.releases
        if not releases:
            return
        at = time.monotonic()
        if not now and at - self.released_at < RELEASE_EVERY and len(releases) < _RELEASES:
            return
        self.released_at = at
        self.releases = []
        # (in messages of at most 2,000: a million futures let go of at once is taken by
        # the broker over several turns, not in one that holds everyone else up; 10,000
        # of finished tasks took 130-160 ms of the broker's loop, measured at a million)
        for start in range(0, len(releases), _RELEASES):
            self._send(P.RELEASE, {"ids": releases[start:start + _RELEASES]})

    def _acknowledged(self, upto: int) -> None:
        """The broker has taken (kept or refused) our submitted tasks up to local id UPTO:
        send more, if some wait."""
        while self.in_flight and self.in_flight[0][0] <= upto:
            self.flying -= self.in_flight.popleft()[1]
        if self.outbox:
            self.wake()

    def _sent_again(self) -> None:
        """A (re)started conversation with the broker: what was in flight is either kept
        or sent again, and counted then."""
        self.in_flight.clear()
        self.flying = 0

    def _too_big(self, item: list[Any], head: int, body: int) -> None:
        future = self.pending.pop(item[0], None)
        if future is None:
            return
        limits = self.limits
        described = "its command line and environment take" \
            if len(item) > 8 and "job" in item[8] else \
            "its description (dependencies, name) takes"
        what = (f"its arguments are {body} bytes, more than the broker's limit of "
                f"{limits.payload_bytes} (max_payload_bytes)" if body > limits.payload_bytes
                else f"{described} about {head} bytes, more than the broker's limit of "
                f"{limits.header_bytes} (max_header_bytes)")
        settle(future, exception=ZresError(f"task {future.label} was not sent: {what}"))

    def _send_stops(self, stops: list[int]) -> None:
        if stops:
            self._send(P.CANCEL, {"ids": stops, "force": True})


def _header_bytes(item: list[Any]) -> int:
    """A bound on the bytes one submit item takes in a message's header (msgpack)."""
    size = 64 + 9 * len(item[4]) + 4 * len(item[6]) + sum(4 * len(n) + 14 for n in item[1])
    if len(item) > 8:  # an actor's, a call's or a job's description
        size += len(msgpack.packb(item[8], use_bin_type=True))
    return size
