"""The broker's HTTP server beside a broker stepped in this thread: it answers from what
the loop publishes, wakes the loop for a fresh snapshot, and says when the loop is stuck."""

from __future__ import annotations

import json
import select
import socket
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
        assert report["counts"] == {}
        assert report["finished"] == {"finished": 0, "error": 0, "cancelled": 0}

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


def test_the_dashboard_on_every_address_as_zres_writes_it():
    """``--http *:PORT``: every address, as ``tcp://*`` (of both families where the kernel
    allows), never what a resolver makes of the name "*"."""
    broker = Broker("tcp://127.0.0.1:0")
    server = DashboardServer("*", 0, broker.snapshots, broker.metrics)
    try:
        assert server.url.startswith(("http://[::]:", "http://0.0.0.0:")), server.url
        port = int(server.url.rsplit(":", 1)[1].strip("/"))
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        server.close()
        broker.close()


def test_a_trickling_request_is_closed_when_its_time_is_up():
    """A request that never ends (one header line now and then, as slowloris sends) is
    closed once it has had the request timeout, however often it sends."""
    broker = Broker("tcp://127.0.0.1:0")
    server = DashboardServer("127.0.0.1", 0, broker.snapshots, broker.metrics,
                             request_timeout=1.0)
    host, port = server.url[len("http://"):].strip("/").rsplit(":", 1)
    try:
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(b"GET /health HTTP/1.1\r\n")

        def closed() -> bool:
            try:
                sock.sendall(b"X-More: yes\r\n")
                if not select.select([sock], [], [], 0.2)[0]:  # (the trickle's pace)
                    return False
                return sock.recv(1024) == b""
            except OSError:  # reset, or a broken pipe: closed
                return True
        wait_until(closed, timeout=10, message="the trickling connection to be closed")
        sock.close()
        assert get(server.url + "health")[0] in (200, 503)  # (the loop is not stepped)
    finally:
        server.close()
        broker.close()


def test_health_answers_while_every_request_thread_waits():
    """Status requests waiting for a loop that does not turn take every request thread:
    one more is told to come back (503), and /health is still answered."""
    broker = Broker("tcp://127.0.0.1:0")
    server = DashboardServer("127.0.0.1", 0, broker.snapshots, broker.metrics)
    stop = threading.Event()

    def ask_again_and_again() -> None:
        while not stop.is_set():
            get(server.url + "api/status")

    askers = [threading.Thread(target=ask_again_and_again) for _ in range(40)]
    try:
        broker.poll_once(time.monotonic())
        for asker in askers:
            asker.start()
        wait_until(lambda: get(server.url + "api/status") ==
                   (503, b"busy: try again in a moment\n"), message="every thread taken")
        assert get(server.url + "health") == (200, b"ok\n")
    finally:
        stop.set()
        while any(asker.is_alive() for asker in askers):
            broker.poll_once(time.monotonic(), timeout=0.05)  # answers those waiting
        server.close()
        broker.close()
