"""Serve the last rendered exposition; poll in a background thread.

A scrape never touches NVML or sysfs: it picks the current `Exposition` (an immutable pair of
byte strings swapped in by the poll thread) and writes it. Gzip is computed at most once per
format per poll, on the first scrape that asks for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

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
    """Owns the poll thread and the current exposition; the aiohttp app reads from it."""

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


def make_app(agent: NodeAgent) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        om = wants_openmetrics(request.headers.get("Accept"))
        use_gzip = "gzip" in request.headers.get("Accept-Encoding", "")
        body = agent.current.body(om, use_gzip)
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = OPENMETRICS_CONTENT_TYPE if om else TEXT_CONTENT_TYPE
        if use_gzip:
            resp.headers["Content-Encoding"] = "gzip"
        return resp

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(
            text="ok\n" if agent.healthy else "poll loop stalled\n",
            status=200 if agent.healthy else 503,
        )

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(
            text="ready\n" if agent.ready else "no poll yet\n", status=200 if agent.ready else 503
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def serve(agent: NodeAgent, host: str, port: int) -> None:
    """Run until cancelled (SIGINT/SIGTERM handled by the caller's event loop runner)."""
    runner = web.AppRunner(make_app(agent), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("serving metrics on http://%s:%d/metrics", host, port)
    agent.start()
    try:
        await asyncio.Event().wait()
    finally:
        agent.stop()
        with contextlib.suppress(Exception):
            await runner.cleanup()
