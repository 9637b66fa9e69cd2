"""The history store as the cluster service holds it: opened when the database can be reached.

A database that is down when the service starts must not stop the service (its live answers do
not need history) nor make it crash-loop. So the service checks the URL at once (a malformed one
is refused at start-up), tries to open the store once, and on failure starts anyway with this
wrapper: every call first tries to connect and migrate, raising `StoreUnavailable` until that
works; the history writer queues meanwhile and readers answer from the live model. A read does
not try again within `retry_s` of a failed attempt, so a down database costs each API request
nothing, not a connect timeout.

A schema from a newer topowatch, found when the database comes up later, is an outage too (the
same error, logged by the writer once an outage): this release must not write to it, and
nothing it queued is lost until the queue's bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from exporter.store.migrations import SchemaTooNew
from exporter.store.records import (
    AuditQuery,
    GoodputQuery,
    Page,
    PreemptionQuery,
    Row,
)
from exporter.store.sqlstore import (
    SqlStore,
    StoreUnavailable,
    redact,
    store_for,
)


class LazyStore:
    """`SqlStore`'s interface over a store migrated on the first call that reaches it."""

    def __init__(
        self, url: str, retry_s: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.shown = redact(url)
        self._store: SqlStore = store_for(url)  # StoreUrlError now, not at the first write
        self._ready = False
        self._lock = threading.Lock()
        self._failed_at: float | None = None
        self.retry_s = retry_s
        self.clock = clock
        self.last_error = ""

    def open(self) -> None:
        """Migrate now, at start-up: StoreUnavailable when the database cannot be reached,
        SchemaTooNew (as itself, so the caller can refuse to start) when it is too new."""
        with self._lock:
            self._migrate()

    def write(self, batch: Sequence[Row]) -> None:
        self._ensure(force=True)  # the writer has its own backoff
        self._store.write(batch)

    def preemptions(self, q: PreemptionQuery) -> Page:
        self._ensure()
        return self._store.preemptions(q)

    def audit(self, q: AuditQuery) -> Page:
        self._ensure()
        return self._store.audit(q)

    def workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._ensure()
        return self._store.workload(namespace, name)

    def goodput(self, q: GoodputQuery) -> Page:
        self._ensure()
        return self._store.goodput(q)

    def goodput_all(self, kind: str, since: float = 0.0) -> list[dict[str, Any]]:
        self._ensure()
        return self._store.goodput_all(kind, since)

    def prune(self, now: float, max_age_s: float, max_rows: int) -> int:
        self._ensure(force=True)
        return self._store.prune(now, max_age_s, max_rows)

    def close(self) -> None:
        self._store.close()

    def _ensure(self, force: bool = False) -> None:
        """Migrated, or StoreUnavailable; within `retry_s` of a failure only `force` tries."""
        if self._ready:
            return
        with self._lock:
            if self._ready:
                return
            recent = self._failed_at is not None and self.clock() - self._failed_at < self.retry_s
            if recent and not force:
                raise StoreUnavailable(self.last_error)
            try:
                self._migrate()
            except SchemaTooNew as exc:
                raise StoreUnavailable(self.last_error) from exc

    def _migrate(self) -> None:
        """Under the lock: migrate once, remembering when and why it last failed."""
        if self._ready:
            return
        try:
            self._store.migrate()
        except (StoreUnavailable, SchemaTooNew) as exc:
            self._failed_at = self.clock()
            self.last_error = str(exc)
            raise
        self._ready = True
        self._failed_at = None
