"""The broker's HTTP server beside a broker stepped in this thread: it answers from what
the loop publishes, wakes the loop for a fresh snapshot, and says when the loop is stuck."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

from tests.conftest import wait_until
from zres.broker.http import DashboardServer
from zres.broker.server import Broker


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_a_snapshot_is_made_when_asked_and_a_stuck_loop_is_reported():
    broker = Broker("tcp://127.0.0.1:0")
    server = DashboardServer("127.0.0.1", 0, broker.snapshots, broker.metrics, stalled=0.5)
    try:
        broker.poll_once(time.monotonic())
        replies: list[tuple[int, bytes]] = []
        asking = threading.Thread(target=lambda: replies.append(get(server.url + "api/status")))
        asking.start()
        # The request wakes the loop from its poll at once (its timeout here: 60 s).
        began = time.monotonic()
        while not replies and time.monotonic() - began < 10:
            broker.poll_once(time.monotonic(), timeout=60)
        asking.join(10)
        assert time.monotonic() - began < 5
        code, body = replies[0]
        assert code == 200
        report = json.loads(body)
        assert report["address"] == broker.address and report["agents"] == []
        assert report["counts"] == {} and report["finished"] == {"done": 0, "failed": 0}

        assert get(server.url + "health") == (200, b"ok\n")
        # The loop stops turning (a handler stuck, say): /health says so, for a probe to act.
        code, body = wait_until(lambda: (r := get(server.url + "health"))[0] == 503 and r,
                                message="/health to report the stuck loop")
        assert body.startswith(b"stalled: the broker's loop has not turned for ")
        broker.poll_once(time.monotonic())
        assert get(server.url + "health") == (200, b"ok\n")
    finally:
        server.close()
        broker.close()
