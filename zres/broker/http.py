"""The broker's HTTP port: ``/metrics`` (Prometheus), ``/health`` (probes), ``/`` (the
dashboard page) and ``/api/status`` (what the page shows, as JSON). Read only.

It runs in threads of its own and reads only what the loop publishes for it
(``metrics.Snapshots``, counters, histograms): a slow or hostile HTTP client can neither
hold up the broker's loop nor change anything in it.

One thread reads every connection's request without blocking on any: a connection that has
not sent its whole request (line and headers) within ``REQUEST_TIMEOUT`` is closed, and one
idle or trickling connection costs a descriptor, never a thread. A complete request is then
answered by the standard library's ``BaseHTTPRequestHandler``: ``/health`` at once, by that
thread (a probe is answered however many connections are open or requests are being
served), anything else in a thread of its own, at most ``_HANDLERS`` at a time (past them:
503, try again).
"""

from __future__ import annotations

import io
import json
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from ..core.address import is_loopback
from ..core.errors import ZresError
from ..core.net import spelled, v6
from ..logs import get_logger
from .metrics import BrokerMetrics, Snapshots

log = get_logger("zres.broker")
STALLED = 15.0  # seconds without a loop turn after which /health says the broker is stuck
REQUEST_TIMEOUT = 5.0  # seconds a connection has to send its whole request
_HANDLERS = 32     # requests answered at once in threads of their own; more get 503
_PENDING = 128     # connections still sending their request; past it, the oldest is closed
_HEAD_MAX = 16 * 1024  # bytes of a request's line and headers
_SEND_TIMEOUT = 10.0   # seconds a reply may take to send (/health's: 1)
_STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
           "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
           "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8")}
_PAGES = Path(__file__).with_name("dashboard")


def _local_host(header: str) -> bool:
    """Whether a request's Host header names this machine by a loopback name or address."""
    host = header.rsplit("]", 1)[0].lstrip("[") if header.startswith("[") \
        else header.rsplit(":", 1)[0]
    return is_loopback(host.lower())


def _has_ipv6() -> bool:
    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        return False
    return True


class DashboardServer:
    """Serve the dashboard, metrics and health of one broker on HOST:PORT."""

    def __init__(self, host: str, port: int, snapshots: Snapshots,
                 metrics: BrokerMetrics, stalled: float = STALLED,
                 request_timeout: float = REQUEST_TIMEOUT) -> None:
        pages = {path: ((_PAGES / name).read_bytes(), kind)
                 for path, (name, kind) in _STATIC.items()}
        # STALLED: seconds without a loop turn after which /health says 503.
        # On loopback, only pages this machine asked for by a loopback name are answered: a
        # web page elsewhere that points its own host name here (DNS rebinding) is not.
        self._handler = type("Handler", (_Handler,), {
            "snapshots": snapshots, "metrics": metrics, "pages": pages, "stalled": stalled,
            "local_only": is_loopback(host)})
        self._request_timeout = request_timeout
        # (over IPv6 for an IPv6 address or a name with only those, as zres's zmq sockets
        # are: ``core.net``; "::" is every address of both families, and "*" too, as in
        # ``tcp://*``: IPv4's alone where the kernel has no IPv6)
        if host == "*":
            host = "::" if _has_ipv6() else "0.0.0.0"
        family = socket.AF_INET6 if v6(host) else socket.AF_INET
        try:
            self._listener = socket.socket(family)
        except OSError as exc:  # (no IPv6 here)
            raise ZresError(f"cannot serve HTTP on {spelled(host, port)}: "
                            f"{exc.strerror or exc}") from None
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if host == "::":
                self._listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            where = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0][4]
            self._listener.bind(where)
            self._listener.listen(128)
        except OSError as exc:
            self._listener.close()
            raise ZresError(f"cannot serve HTTP on {spelled(host, port)}: "
                            f"{exc.strerror or exc} (--http HOST:PORT for another address, "
                            "--http off for none)") from None
        self._listener.setblocking(False)
        self.url = f"http://{spelled(host, self._listener.getsockname()[1])}/"
        self._room = threading.BoundedSemaphore(_HANDLERS)
        self._pending: dict[socket.socket, _Pending] = {}  # oldest first
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._wake, self._waker = socket.socketpair()
        self._selector.register(self._wake, selectors.EVENT_READ)
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="zres-http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and free the port."""
        self._closing = True
        self._waker.send(b"\0")
        self._thread.join(10)
        for sock in [*self._pending, self._listener, self._wake, self._waker]:
            sock.close()
        self._pending.clear()
        self._selector.close()

    def _serve(self) -> None:
        while not self._closing:
            try:
                self._turn()
            except Exception:  # a bug here must not end the broker's probes for good
                log.exception("http_failed")

    def _turn(self) -> None:
        oldest = next(iter(self._pending.values()), None)
        timeout = None if oldest is None else max(0.0, oldest.deadline - time.monotonic())
        for key, _ in self._selector.select(timeout):
            if key.fileobj is self._listener:
                self._accept()
            elif key.fileobj in self._pending:  # (not dropped by this turn's accept)
                self._read(key.fileobj)  # type: ignore[arg-type]
        now = time.monotonic()
        while self._pending and next(iter(self._pending.values())).deadline <= now:
            self._drop(next(iter(self._pending)))  # too slow: its time is up

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: free one, or let the loop
                log.warning("http_accept_failed", error=str(exc))  # breathe, then again
                if self._pending:
                    self._drop(next(iter(self._pending)))
                else:
                    time.sleep(0.1)  # (the listener stays readable: no spinning on it)
                return
            sock.setblocking(False)
            self._pending[sock] = _Pending(peer, time.monotonic() + self._request_timeout)
            self._selector.register(sock, selectors.EVENT_READ)
            if len(self._pending) > _PENDING:
                self._drop(next(iter(self._pending)))

    def _read(self, sock: socket.socket) -> None:
        pending = self._pending[sock]
        try:
            data = sock.recv(_HEAD_MAX)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        pending.head += data
        if b"\r\n\r\n" in pending.head or b"\n\n" in pending.head:
            self._selector.unregister(sock)
            del self._pending[sock]
            self._answer(sock, pending)
        elif not data or len(pending.head) > _HEAD_MAX:
            self._drop(sock)  # gone, or more than any request of ours needs

    def _answer(self, sock: socket.socket, request: _Pending) -> None:
        """Answer REQUEST: /health here and now, the rest in a thread while there is room."""
        line = bytes(request.head.split(b"\n", 1)[0]).split()
        health = len(line) > 1 and line[1].split(b"?", 1)[0] == b"/health"
        sock.setblocking(True)
        if health or not self._room.acquire(blocking=False):
            request.busy = not health
            sock.settimeout(1.0)  # a few hundred bytes, into an empty send buffer
            self._respond(sock, request)
            return
        sock.settimeout(_SEND_TIMEOUT)
        threading.Thread(target=self._respond, args=(sock, request, True), daemon=True,
                         name="zres-http-request").start()

    def _respond(self, sock: socket.socket, request: _Pending, room: bool = False) -> None:
        try:
            request.sock = sock
            self._handler(request, request.peer, self)
        except Exception as exc:  # the peer left, or took too long to read
            log.debug("http_reply_failed", error=str(exc))
        finally:
            if room:
                self._room.release()
            _close(sock)

    def _drop(self, sock: socket.socket) -> None:
        self._selector.unregister(sock)
        del self._pending[sock]
        _close(sock)


@dataclass(slots=True)
class _Pending:
    """A connection whose request is being read: from whom, until when, what came."""

    peer: Any
    deadline: float
    head: bytearray = field(default_factory=bytearray)
    busy: bool = False               # every request thread is taken: answer 503
    sock: socket.socket | None = None


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    sock.close()


class _Handler(BaseHTTPRequestHandler):
    snapshots: Snapshots
    metrics: BrokerMetrics
    pages: dict[str, tuple[bytes, str]]
    stalled: float
    local_only: bool
    server_version = "zres"
    request: _Pending

    def setup(self) -> None:
        # The request was read whole already (``DashboardServer._read``); replies go out
        # on its socket.
        assert self.request.sock is not None
        self.connection = self.request.sock
        self.rfile = io.BytesIO(bytes(self.request.head))
        self.wfile = self.connection.makefile("wb")

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        path = self.path.split("?", 1)[0]
        if self.request.busy:
            self._reply(503, b"busy: try again in a moment\n", "text/plain",
                        {"Retry-After": "1"})
        elif self.local_only and not _local_host(self.headers.get("Host", "")):
            self._reply(421, b"this dashboard answers to localhost and loopback addresses "
                             b"only\n", "text/plain")
        elif path == "/health":
            stalled = time.monotonic() - self.snapshots.last_turn
            if stalled > self.stalled:
                self._reply(503, f"stalled: the broker's loop has not turned for "
                                 f"{stalled:.0f}s\n".encode(), "text/plain")
            else:
                self._reply(200, b"ok\n", "text/plain")
        elif path == "/metrics":
            self._reply(200, self.metrics.render(), CONTENT_TYPE_LATEST)
        elif path == "/api/status":
            snapshot = self.snapshots.get()
            if snapshot is None:
                self._reply(503, b'{"error": "the broker did not answer in time"}',
                            "application/json")
            else:
                self._reply(200, json.dumps(snapshot).encode(), "application/json")
        elif path in self.pages:
            self._reply(200, *self.pages[path])
        else:
            self._reply(404, b"not found: see /, /metrics, /health, /api/status\n",
                        "text/plain")

    def do_POST(self) -> None:  # noqa: N802
        self._reply(405, b"read only: nothing here changes the cluster\n", "text/plain",
                    {"Allow": "GET"})

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_POST  # noqa: N815

    def _reply(self, code: int, body: bytes, kind: str,
               headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "default-src 'self'")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":  # (a reply to HEAD has no body)
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("http_request", peer=self.client_address[0], line=format % args)
