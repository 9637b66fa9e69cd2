"""Serve the last rendered exposition over HTTP: /metrics, /healthz, /readyz, and the node's
health findings on /api/v1/health for readers with no Kubernetes (`HealthApi`, health_api.py).

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
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Protocol

from exporter.core.exposition import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    Exposition,
    Family,
    wants_openmetrics,
)
from exporter.node import health_api
from exporter.node.health_api import (
    HEALTH_PATH,
    MAX_WAITERS,
    Evaluation,
    Response,
    Wait,
)

log = logging.getLogger(__name__)

# A handler's socket timeout: longer than the longest long-poll (`MAX_WAIT_S`, 25 s), so a
# held /api/v1/health answer is never cut by it (tests/node/test_node_host.py checks the order).
HANDLER_TIMEOUT_S = 30


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


class HealthEndpoint(Protocol):
    """What answers /api/v1/health: `HealthApi`, or a test's stand-in."""

    def respond(self, authorization: str | None, query: str = "") -> Response: ...

    def close(self) -> None:
        """Release every held request now: the server is closing."""
        ...


class TokenFile:
    """The bearer token in a file, read at start and again whenever the file's modification time
    or size changes, so a rotated token takes effect without a restart. A re-read that fails
    keeps the last token (a rotation writing the file in two steps must not lock readers out)
    and says so once. The token itself is never logged."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = self._stat()
        self._token = self._read()
        self._warned = False

    def _stat(self) -> tuple[int, int]:
        info = self.path.stat()
        return (info.st_mtime_ns, info.st_size)

    def _read(self) -> str:
        """`ValueError` naming the file when it is empty: an empty token must not be in use."""
        token = self.path.read_text(encoding="utf-8").strip()
        if not token:
            raise ValueError(f"health token file {self.path} is empty")
        return token

    def current(self) -> str:
        try:
            stamp = self._stat()
            if stamp != self._stamp:
                self._token, self._stamp = self._read(), stamp
                log.info("health token file %s changed: token re-read", self.path)
            self._warned = False
        except (OSError, UnicodeDecodeError, ValueError) as e:
            if not self._warned:
                log.warning("cannot re-read health token file (%s); keeping the last token", e)
                self._warned = True
        return self._token


class HealthApi:
    """The node's side of /api/v1/health: the latest published findings (set by the poll
    thread with `record`), the token, and a count of requests by outcome. `token` None leaves
    the endpoint off (404).

    Long-poll: an admitted request whose `?version=` is the current version and `?wait=` > 0
    is held on a condition that `record` notifies only when the version changes (the same
    findings found again wake no one), for at most `MAX_WAIT_S`; at most `MAX_WAITERS` are held
    at once, and one more is answered at once as if it had not asked to wait. `close` releases
    them all (server shutdown), and no request waits after it."""

    def __init__(
        self,
        node: str,
        token: TokenFile | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self._token = token
        self._clock = clock
        self._evaluation: Evaluation | None = None
        self._version = ""
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._waiting = 0
        self._closed = False

    @property
    def waiting(self) -> int:
        """How many requests are held now."""
        with self._lock:
            return self._waiting

    def record(self, evaluation: Evaluation) -> None:
        version = health_api.version_of(evaluation)
        with self._changed:
            changed = version != self._version
            self._evaluation, self._version = evaluation, version
            if changed:
                self._changed.notify_all()

    def respond(self, authorization: str | None, query: str = "") -> Response:
        token = self._token.current() if self._token is not None else None
        admitted = health_api.admit(token, authorization, query)
        if isinstance(admitted, Wait):
            evaluation = self._wait(admitted)
            outcome, response = health_api.answer(self.node, evaluation, self._clock())
        else:
            outcome, response = admitted
        with self._lock:
            self._counts[outcome] = self._counts.get(outcome, 0) + 1
        return response

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _wait(self, wait: Wait) -> Evaluation | None:
        """The evaluation to answer with: the current one, after holding the request while
        `wait` asks it and room is left."""
        with self._changed:
            if wait.holds(self._version) and self._waiting < MAX_WAITERS and not self._closed:
                self._waiting += 1
                try:
                    self._changed.wait_for(
                        lambda: self._closed or not wait.holds(self._version), wait.seconds
                    )
                finally:
                    self._waiting -= 1
            return self._evaluation

    def families(self) -> list[Family]:
        with self._lock:
            counts = dict(self._counts)
        return [health_api.requests_family(self.node, counts)]


class _MetricsHandler(BaseHTTPRequestHandler):
    """GET /metrics, /healthz, /readyz, /api/v1/health. Keep-alive, quiet, with a socket
    timeout so a slow or idle client cannot hold a thread forever."""

    protocol_version = "HTTP/1.1"
    timeout = HANDLER_TIMEOUT_S
    server: MetricsServer

    def do_GET(self) -> None:
        agent = self.server.agent
        path, _, query = self.path.partition("?")
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
        elif path == HEALTH_PATH:
            self._send_health(query)
        else:
            self._send(404, "text/plain", b"not found: try /metrics\n")

    def _send_health(self, query: str) -> None:
        endpoint = self.server.health
        authorization = self.headers.get("Authorization")
        if endpoint is None:
            _, answer = health_api.respond("", None, authorization, None, 0.0)
        else:
            answer = endpoint.respond(authorization, query)  # may wait (HealthApi)
        self.send_response(answer.status)
        for name, value in answer.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        self.wfile.write(answer.body)

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

    def __init__(
        self, agent: Published, host: str, port: int, health: HealthEndpoint | None = None
    ) -> None:
        self.agent = agent
        self.health = health
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _MetricsHandler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def server_close(self) -> None:
        """Release held health requests before closing (handler threads are daemons, so a
        shutdown never waits on them anyway)."""
        if self.health is not None:
            self.health.close()
        super().server_close()

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


def serve(agent: _Served, host: str, port: int, health: HealthEndpoint | None = None) -> None:
    """Serve until SIGTERM or SIGINT, polling in the background meanwhile."""
    server = MetricsServer(agent, host, port, health)
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
