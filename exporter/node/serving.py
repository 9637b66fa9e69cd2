"""Serve the last rendered exposition over HTTP: /metrics, /healthz, /readyz.

A scrape never touches NVML or sysfs: it picks the current `Exposition` (an immutable pair of
byte strings swapped in by the poll thread) and writes it. The server knows only "something that
gives me the latest bytes" (`Published`); who polls, and how, is `exporter.node.agent`'s business.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from exporter.exposition import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    Exposition,
    wants_openmetrics,
)

log = logging.getLogger(__name__)


class Published(Protocol):
    """What the server needs from whatever produces expositions: the latest bytes, whether they
    are fresh, and why not ready if not. The node agent's poll loop is one; a test can pass
    anything with these."""

    @property
    def current(self) -> Exposition: ...

    @property
    def not_ready_reason(self) -> str | None: ...

    @property
    def healthy(self) -> bool: ...


class Startable(Protocol):
    """A background producer `serve` runs for as long as it serves."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class _MetricsHandler(BaseHTTPRequestHandler):
    """GET /metrics, /healthz, /readyz. Keep-alive, quiet, with a socket timeout so a slow or
    idle client cannot hold a thread forever."""

    protocol_version = "HTTP/1.1"
    timeout = 30
    server: MetricsServer

    def do_GET(self) -> None:
        agent = self.server.agent
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            om = wants_openmetrics(self.headers.get("Accept"))
            use_gzip = "gzip" in self.headers.get("Accept-Encoding", "")
            body = agent.current.body(om, use_gzip)
            ctype = OPENMETRICS_CONTENT_TYPE if om else TEXT_CONTENT_TYPE
            self._send(200, ctype, body, gzip_encoded=use_gzip)
        elif path == "/healthz":
            ok = agent.healthy
            self._send(200 if ok else 503, "text/plain", b"ok\n" if ok else b"poll loop stalled\n")
        elif path == "/readyz":
            reason = agent.not_ready_reason
            if reason is None:
                self._send(200, "text/plain", b"ready\n")
            else:
                self._send(503, "text/plain; charset=utf-8", f"{reason}\n".encode())
        else:
            self._send(404, "text/plain", b"not found: try /metrics\n")

    def _send(self, status: int, ctype: str, body: bytes, gzip_encoded: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if gzip_encoded:
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class MetricsServer(ThreadingHTTPServer):
    """The node agent's HTTP server. The standard library's threading server, not aiohttp:
    serving one cached byte string needs no event loop, and aiohttp costs ~12 MiB of RSS on
    every GPU node."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, agent: Published, host: str, port: int) -> None:
        self.agent = agent
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _MetricsHandler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def handle_error(self, request: object, client_address: object) -> None:
        """A scraper hanging up mid-request is routine; anything else is logged, never printed
        raw to stderr as socketserver does by default."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            log.debug("client %s went away: %s", client_address, exc)
        else:
            log.warning("error serving %s", client_address, exc_info=True)


class _Served(Published, Startable, Protocol):
    pass


def serve(agent: _Served, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT, polling in the background meanwhile."""
    server = MetricsServer(agent, host, port)
    log.info("serving metrics on http://%s:%d/metrics", host, server.port)

    def stop(signum: int, _frame: object) -> None:
        log.info("signal %d: shutting down", signum)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.start()
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        agent.stop()
        server.server_close()
