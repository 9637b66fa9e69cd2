"""Writes to the history store off the event path: a bounded queue, batches, one thread.

The model applies thousands of watch events a second; a database write on that path would make
every event wait for a disk or a network round trip, and a database that is down would stop the
live answers. So the event path only appends to a queue (O(1), never blocks, never raises) and
one thread writes what has gathered, up to `batch_max` rows a transaction, at least every
`flush_s` seconds.

When the store fails (down, unreachable, disk full) the batch goes back to the head of the queue
and the thread retries with a backoff (1 s doubling to 30 s), logging once per outage and once
on recovery. The queue is bounded (`max_rows`): past it the OLDEST rows are dropped (the newest
history is what people ask about) and counted, so a long outage costs memory up to the bound and
loses only what the counter says. Rows are upserts by key, so a batch written twice (the store
failed after committing) is harmless.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from exporter.core.exposition import COUNTER, GAUGE, Family
from exporter.store.records import Row
from exporter.store.sqlstore import StoreUnavailable

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0


class Sink(Protocol):
    """Where batches go: `SqlStore.write`. `StoreUnavailable` when the store cannot take them
    now (kept and retried); anything else means a row it will never take (dropped, counted)."""

    def write(self, batch: Sequence[Row]) -> None: ...


class HistoryWriter:
    def __init__(
        self,
        sink: Sink,
        max_rows: int = 100_000,
        batch_max: int = 500,
        flush_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        max_backoff_s: float = MAX_BACKOFF_S,
    ) -> None:
        self.sink = sink
        self.max_backoff_s = max_backoff_s
        self.max_rows = max_rows
        self.batch_max = batch_max
        self.flush_s = flush_s
        self.clock = clock
        self._queue: collections.deque[Row] = collections.deque()
        self._lock = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._busy = False  # a batch is out of the queue, being written
        self.written: collections.Counter[str] = collections.Counter()  # by row type
        self.dropped = 0
        self.rejected = 0  # rows the store refused for themselves (not an outage)
        self.failures = 0
        self.up = True
        self.last_error = ""

    # -- the event path --

    def submit(self, row: Row) -> None:
        """Queue one row; never blocks, never raises. Past `max_rows` the oldest is dropped."""
        with self._lock:
            if len(self._queue) >= self.max_rows:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(row)
            if len(self._queue) >= self.batch_max:
                self._lock.notify()

    # -- the writer thread --

    def start(self) -> HistoryWriter:
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="topowatch-history", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued (for up to `timeout` seconds), then stop."""
        self.flush(timeout)
        with self._lock:
            self._stopping = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            self._thread = None

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far is written; False if the time ran out."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._lock.notify()
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    return False
                self._lock.wait(min(left, 0.05))
        return True

    def _run(self) -> None:
        backoff = 1.0
        while True:
            with self._lock:
                if not self._queue and not self._stopping:
                    self._lock.wait(self.flush_s)
                if self._stopping and not self._queue:
                    return
                batch = [
                    self._queue.popleft() for _ in range(min(self.batch_max, len(self._queue)))
                ]
                self._busy = bool(batch)
            if not batch:
                continue
            try:
                self.sink.write(batch)
            except StoreUnavailable as exc:  # down, unreachable, disk full: retry, keep it all
                self._failed(batch, exc)
                if self._wait(backoff):
                    return
                backoff = min(self.max_backoff_s, backoff * 2)
                continue
            except Exception as exc:  # a row the store will never take: find it, keep the rest
                batch = self._without_rejected(batch, exc)
            backoff = 1.0
            with self._lock:
                self._busy = False
                for row in batch:
                    self.written[type(row).__name__] += 1
                if not self.up:
                    log.warning("history store is back; %d rows queued", len(self._queue))
                self.up = True
                self._lock.notify_all()

    def _without_rejected(self, batch: list[Row], exc: Exception) -> list[Row]:
        """Write the batch row by row; the rows the store refuses for themselves are dropped
        and counted (one bad row must not hold up every row behind it). A store that goes away
        meanwhile puts the rest back in the queue."""
        log.error("history store refused a batch (%s); writing it row by row", exc)
        kept: list[Row] = []
        for index, row in enumerate(batch):
            try:
                self.sink.write([row])
            except StoreUnavailable as gone:
                self._failed(batch[index:], gone)
                return kept
            except Exception as bad:
                with self._lock:
                    self.rejected += 1
                log.error("history row dropped, the store refuses it: %s", bad)
                continue
            kept.append(row)
        return kept

    def _failed(self, batch: list[Row], exc: Exception) -> None:
        with self._lock:
            self._busy = False
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            if self.up:
                log.error("history store write failed, queueing: %s", self.last_error)
            self.up = False
            self._queue.extendleft(reversed(batch))  # back at the head, in order
            while len(self._queue) > self.max_rows:
                self._queue.popleft()
                self.dropped += 1
            self._lock.notify_all()

    def _wait(self, seconds: float) -> bool:
        """Sleep before a retry; True when stopping (what is queued stays unwritten)."""
        with self._lock:
            self._lock.wait_for(lambda: self._stopping, timeout=seconds)
            return self._stopping

    # -- outputs --

    @property
    def queued(self) -> int:
        """Rows waiting to be written (a batch being written counts until it is)."""
        with self._lock:
            return len(self._queue)

    def families(self) -> list[Family]:
        with self._lock:
            queued, dropped, failures, up = len(self._queue), self.dropped, self.failures, self.up
            rejected = self.rejected
            written = dict(self.written)
        queue = Family("topowatch_history_queue_rows", GAUGE, "Rows waiting to be written.")
        queue.add([], queued)
        store_up = Family(
            "topowatch_history_store_up", GAUGE, "1 while the last write to the store succeeded."
        )
        store_up.add([], 1 if up else 0)
        wrote = Family("topowatch_history_rows_written", COUNTER, "Rows written, by kind.")
        for kind in sorted(written):
            wrote.add([("kind", kind)], written[kind])
        lost = Family(
            "topowatch_history_rows_dropped",
            COUNTER,
            "Rows dropped because the queue was full while the store could not take them.",
        )
        lost.add([], dropped)
        failed = Family(
            "topowatch_history_write_failures",
            COUNTER,
            "Batches that could not be written because the store was unavailable.",
        )
        failed.add([], failures)
        refused = Family(
            "topowatch_history_rows_rejected",
            COUNTER,
            "Rows dropped because the store refused them (not an outage).",
        )
        refused.add([], rejected)
        return [queue, store_up, wrote, lost, failed, refused]
