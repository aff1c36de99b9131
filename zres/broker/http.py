"""The broker's HTTP port: ``/metrics`` (Prometheus), ``/health`` (probes), ``/`` (the
dashboard page) and ``/api/status`` (what the page shows, as JSON). Read only.

It runs in threads of its own (the standard library's ``ThreadingHTTPServer``) and reads
only what the loop publishes for it (``metrics.Snapshots``, counters, histograms): a slow
or hostile HTTP client can neither hold up the broker's loop nor change anything in it.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from ..core.address import is_loopback
from ..core.errors import ZresError
from ..logs import get_logger
from .metrics import BrokerMetrics, Snapshots

log = get_logger("zres.broker")
DEFAULT_HTTP = "127.0.0.1:8787"
STALLED = 15.0  # seconds without a loop turn after which /health says the broker is stuck
_CONNECTIONS = 32  # connections served at once; more are closed at once
_STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
           "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
           "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8")}
_PAGES = Path(__file__).with_name("dashboard")


def _local_host(header: str) -> bool:
    """Whether a request's Host header names this machine by a loopback name or address."""
    host = header.rsplit("]", 1)[0].lstrip("[") if header.startswith("[") \
        else header.rsplit(":", 1)[0]
    return is_loopback(host.lower())


class DashboardServer:
    """Serve the dashboard, metrics and health of one broker on HOST:PORT."""

    def __init__(self, host: str, port: int, snapshots: Snapshots,
                 metrics: BrokerMetrics, stalled: float = STALLED) -> None:
        pages = {path: ((_PAGES / name).read_bytes(), kind)
                 for path, (name, kind) in _STATIC.items()}
        # STALLED: seconds without a loop turn after which /health says 503.
        # On loopback, only pages this machine asked for by a loopback name are answered: a
        # web page elsewhere that points its own host name here (DNS rebinding) is not.
        handler = type("Handler", (_Handler,), {"snapshots": snapshots, "metrics": metrics,
                                                 "pages": pages, "stalled": stalled,
                                                 "local_only": is_loopback(host)})
        server = _Server6 if ":" in host else _Server
        try:
            self._httpd = server((host, port), handler)
        except OSError as exc:
            raise ZresError(f"cannot serve HTTP on {host}:{port}: {exc.strerror or exc} "
                            "(--http HOST:PORT for another address, --http off for "
                            "none)") from None
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self._httpd.server_address[1]}/"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="zres-http",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and free the port."""
        self._httpd.shutdown()
        self._httpd.server_close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True   # a client that never finishes its request never holds us up

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Connections served at once, at most: one thread each, so more are closed at once
        # rather than let a peer pile up threads in the broker's process.
        self._room = threading.BoundedSemaphore(_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._room.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._room.release()


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    snapshots: Snapshots
    metrics: BrokerMetrics
    pages: dict[str, tuple[bytes, str]]
    stalled: float
    local_only: bool
    server_version = "zres"
    timeout = 30  # seconds a connection may take to send its request

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        path = self.path.split("?", 1)[0]
        if self.local_only and not _local_host(self.headers.get("Host", "")):
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

    do_PUT = do_DELETE = do_PATCH = do_POST  # noqa: N815

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
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("http_request", peer=self.client_address[0], line=format % args)
