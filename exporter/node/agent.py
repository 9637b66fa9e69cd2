"""The node agent's poll loop: one background thread that polls every `interval` seconds and
swaps the new exposition in with one reference assignment, so a scrape sees the old or the new
bytes, never a mix. The HTTP server reads `current`, `not_ready_reason` and `healthy` and
nothing else.

Readiness says whether this agent is deployed right, not whether the node is healthy: the
agent is ready after its first poll unless that poll found NVML unusable because of how the
agent is deployed (library not mounted, no permission on the device files, no driver since
start; `GpuInventory.deployment_errors`). Then /readyz answers 503 with the reason, so a bad
DaemonSet rollout stalls on its first nodes and says why, while metrics keep being served.

Series that are not the poller's (the health API's request counters) join each poll's
exposition through `extra`: appended to the poller's bytes, never rendered twice, so they are
as fresh as the poll, like every other series.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from exporter.core.exposition import EMPTY, Exposition, Family
from exporter.core.snapshot import NodeSnapshot
from exporter.node.poller import Poller

log = logging.getLogger(__name__)

KERNEL_LOG_PUMP_S = 0.25


class NodeAgent:
    """Owns the poll thread and the current exposition; the HTTP server reads from it."""

    def __init__(
        self,
        poller: Poller,
        interval: float,
        on_snapshot: Callable[[NodeSnapshot], None] | None = None,
        extra: Callable[[], Iterable[Family]] | None = None,
    ) -> None:
        self.poller = poller
        self.interval = interval
        self.on_snapshot = on_snapshot
        self.extra = extra
        self.current: Exposition = EMPTY
        self.last_poll_monotonic: float | None = None
        self._deployment_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> NodeSnapshot:
        snapshot, exposition = self.poller.poll()
        if self.extra is not None:
            exposition = appended(exposition, Exposition.build(self.extra()))
        self.current = exposition  # one reference swap: scrapes see old or new, never a mix
        self._deployment_error = deployment_error(snapshot)
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

    def request_stop(self) -> None:
        """Tell the poll thread to end, without waiting: it wakes from its wait between polls at
        once. Lets a caller stopping many agents signal them all before waiting for any."""
        self._stop.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the poll thread and wait up to `timeout` s for it (a poll under way finishes)."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, timeout))

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
            self._wait(next_at, delay)

    def _wait(self, next_at: float, delay: float) -> None:
        """Until the next poll; with a kernel log, draining it every KERNEL_LOG_PUMP_S on the
        way (Poller.pump_kernel_log), so a burst does not outrun the kernel's ring."""
        if not self.poller.reads_kernel_log:
            self._stop.wait(delay)
            return
        while delay > 0 and not self._stop.wait(min(delay, KERNEL_LOG_PUMP_S)):
            try:
                self.poller.pump_kernel_log()
            except Exception:
                log.exception("kernel log pump failed")
            delay = next_at - time.monotonic()

    @property
    def not_ready_reason(self) -> str | None:
        """Why the agent is not ready (no poll yet, a deployment error), or None when it is."""
        if self.last_poll_monotonic is None:
            return "no poll yet"
        return self._deployment_error

    @property
    def ready(self) -> bool:
        return self.not_ready_reason is None

    @property
    def healthy(self) -> bool:
        """Alive as long as polls keep coming; a wedged poll thread fails the liveness probe."""
        if self.last_poll_monotonic is None:
            return self._thread is not None and self._thread.is_alive()
        return time.monotonic() - self.last_poll_monotonic < 3 * self.interval + 30


OPENMETRICS_EOF = b"# EOF\n"


def appended(first: Exposition, more: Exposition) -> Exposition:
    """Both expositions' families in one: the text format concatenates, OpenMetrics keeps one
    `# EOF`, at the end."""
    head = first.openmetrics.removesuffix(OPENMETRICS_EOF)
    return Exposition(text=first.text + more.text, openmetrics=head + more.openmetrics)


def deployment_error(snapshot: NodeSnapshot) -> str | None:
    """One line on what in the agent's deployment keeps it from NVML, or None."""
    errors = snapshot.gpu.deployment_errors()
    if not errors:
        return None
    said = "; ".join(f"{sentence} (reason={reason})" for reason, sentence in errors)
    return f"deployment error, fix the agent's DaemonSet, not the node: {said}"
