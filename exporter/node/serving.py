"""Serve the last rendered exposition; poll in a background thread.

A scrape never touches NVML or sysfs: it picks the current `Exposition` (an immutable pair of
byte strings swapped in by the poll thread) and writes it. Gzip is computed at most once per
format per poll, on the first scrape that asks for it.
"""

from __future__ import annotations

import gzip
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from exporter.node.exposition import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    Family,
    encode_openmetrics,
    encode_text,
    wants_openmetrics,
)

if TYPE_CHECKING:
    from exporter.node.poller import Poller
    from exporter.node.snapshot import NodeSnapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Exposition:
    text: bytes
    openmetrics: bytes
    _gzipped: dict[bool, bytes] = field(default_factory=dict, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @classmethod
    def build(cls, families: Iterable[Family]) -> Exposition:
        fams = list(families)
        return cls(text=encode_text(fams), openmetrics=encode_openmetrics(fams))

    def body(self, openmetrics: bool, use_gzip: bool) -> bytes:
        raw = self.openmetrics if openmetrics else self.text
        if not use_gzip:
            return raw
        with self._lock:
            packed = self._gzipped.get(openmetrics)
            if packed is None:
                packed = self._gzipped[openmetrics] = gzip.compress(raw, compresslevel=1)
            return packed


EMPTY = Exposition(text=b"", openmetrics=b"# EOF\n")


class NodeAgent:
    """Owns the poll thread and the current exposition; the HTTP server reads from it."""

    def __init__(
        self,
        poller: Poller,
        interval: float,
        on_snapshot: Callable[[NodeSnapshot], None] | None = None,
    ) -> None:
        self.poller = poller
        self.interval = interval
        self.on_snapshot = on_snapshot
        self.current: Exposition = EMPTY
        self.last_poll_monotonic: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> NodeSnapshot:
        snapshot, exposition = self.poller.poll()
        self.current = exposition  # one reference swap: scrapes see old or new, never a mix
        self.last_poll_monotonic = time.monotonic()
        if self.on_snapshot is not None:
            try:
                self.on_snapshot(snapshot)
            except Exception:
                log.exception("snapshot subscriber failed")
        return snapshot

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="topowatch-poll", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # never let the loop die; the stale-poll check will tell
                log.exception("poll failed")
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (slow NVML): skip missed ticks rather than burst
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    @property
    def ready(self) -> bool:
        return self.last_poll_monotonic is not None

    @property
    def healthy(self) -> bool:
        """Alive as long as polls keep coming; a wedged poll thread fails the liveness probe."""
        if self.last_poll_monotonic is None:
            return self._thread is not None and self._thread.is_alive()
        return time.monotonic() - self.last_poll_monotonic < 3 * self.interval + 30


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
            ok = agent.ready
            self._send(200 if ok else 503, "text/plain", b"ready\n" if ok else b"no poll yet\n")
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

    def __init__(self, agent: NodeAgent, host: str, port: int) -> None:
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


def serve(agent: NodeAgent, host: str, port: int) -> None:
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
