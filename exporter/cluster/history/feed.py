"""The feed from the live model (and the remediation audit) to the history store.

The event path only marks what changed, O(1) and under the service lock it already holds: a
ledger entry's id, a workload that ended, a scale event opened. `pump`, on a timer off the event
loop, turns what was marked into rows (under the lock, since the views read the model) and hands
them to the history writer, which writes them in batches in its own thread. So a preemption
updated five times in a second is one row write, and the model's per-event cost does not depend
on the database at all (benchmarks/history_overhead.py measures it).

Only the leader writes (`leading`): two replicas writing one PostgreSQL would race each other's
merges for nothing. A standby keeps its marks instead (bounded: the ledger's entries, the last
MAX_ENDED ended workloads, MAX_OPEN_EVENTS scale events); when it becomes the leader it writes
them, so what the old leader had not yet written when it died is written by the new one:
writes are upserts, and copies of one preemption under two writers' keys merge in the store.
A backlog is written a slice per pump (MAX_*_PER_PUMP), so the lock is never held for long.

The admission check's decisions (issue 30) take the same path: `AdmissionAudit.on_record`
queues each recorded decision (only recorded ones: a changed outcome), and the pump writes it
as an audit row of kind "admission" (rows.admission_row). Only the leader judges, but marks are
kept, bounded (MAX_ADMISSION), until this replica leads and the store takes them; while the
store is away the writer queues them and says so (topowatch_history_store_up,
topowatch_history_write_failures_total), and the decision stays in the audit's ring.

What a kind's first list shows already finished is not written (the model does not report it):
whoever watched it finish wrote it, with a richer timeline than a restart can rebuild.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from exporter.cluster.elastic.scaling import ScaleEvent
from exporter.cluster.history.rows import (
    admission_row,
    audit_row,
    marked_deleted,
    preemption_row,
    scale_event_row,
    workload_row,
)
from exporter.cluster.model import ClusterModel, WorkloadState
from exporter.core.exposition import COUNTER, GAUGE, Family
from exporter.store.records import (
    MAX_LIMIT,
    AuditQuery,
    GoodputQuery,
    Page,
    PreemptionQuery,
    Row,
    WorkloadRow,
)
from exporter.store.sqlstore import StoreUnavailable
from exporter.store.writer import HistoryWriter
from healthcheck.remediation.audit import Auditor, AuditRecord

if TYPE_CHECKING:
    from exporter.cluster.goodput import GoodputBook

log = logging.getLogger(__name__)

DAY_S = 86_400.0
PRUNE_EVERY_S = 3600.0
MAX_OPEN_EVENTS = 10_000  # scale events followed until done; past it the oldest is let go
MAX_ENDED = 20_000  # ended workloads waiting for their view to be written (a standby's too)
# What one pump converts under the service lock, so that a backlog (a standby taking over)
# is written over a few seconds instead of holding the lock, and every event, for one long one.
MAX_PREEMPTIONS_PER_PUMP = 2_000
MAX_VIEWS_PER_PUMP = 200
SEEN_FINISH_KEEP = 100_000  # UIDs of workloads seen finishing, for their deletion
MAX_ADMISSION = 20_000  # admission decisions waiting to be written (a standby's too)
MAX_ADMISSION_PER_PUMP = 2_000


class HistoryStore(Protocol):
    """What the feed and the API need of the store (exporter.store.lazy.LazyStore)."""

    shown: str

    def preemptions(self, q: PreemptionQuery) -> Page: ...
    def audit(self, q: AuditQuery) -> Page: ...
    def workload(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def goodput(self, q: GoodputQuery) -> Page: ...
    def goodput_all(self, kind: str, since: float = 0.0) -> list[dict[str, Any]]: ...
    def prune(self, now: float, max_age_s: float, max_rows: int) -> int: ...
    def close(self) -> None: ...


class DecisionAudit(Protocol):
    """What the feed needs of the admission check's audit (exporter.cluster.admission.audit
    `AdmissionAudit`, a layer this one does not import): the hook it calls with each recorded
    decision's entry."""

    on_record: Callable[[dict[str, Any]], None] | None


class HistoryFeed:
    """The model's and the audit's changes, marked on the event path, written by `pump`.

    `leading` says whether this replica may write (the service sets it from its Leadership);
    `families` adds retention's counters and the ephemeral flag to the writer's metrics."""

    def __init__(
        self,
        store: HistoryStore,
        writer: HistoryWriter,
        identity: str,
        retention_s: float = 90 * DAY_S,
        max_rows: int = 10_000_000,
        ephemeral: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.writer = writer
        # Names this process's ledger entries in the store: a restarted process (new start
        # time) writes new keys, which the store merges with the old rows by the ledger's rule.
        self.writer_id = f"{identity}/{int(clock())}"
        self.retention_s = retention_s
        self.max_rows = max_rows
        self.ephemeral = ephemeral
        self.clock = clock
        self.leading: Callable[[], bool] = lambda: True
        self._model: ClusterModel | None = None
        self._goodput: GoodputBook | None = None
        self._goodput_clock: Callable[[], float] = clock
        self._dirty: set[int] = set()  # ledger entry ids
        self._ended: deque[tuple[WorkloadState, bool, float]] = deque(maxlen=MAX_ENDED)
        self._open: deque[ScaleEvent] = deque(maxlen=MAX_OPEN_EVENTS)
        self._seen_finish: dict[str, None] = {}  # insertion-ordered set, bounded
        self._admission: deque[dict[str, Any]] = deque(maxlen=MAX_ADMISSION)
        self._last_prune: float | None = None
        self._pump_lock = threading.Lock()
        self.pruned = 0
        self.prune_failures = 0

    def attach(
        self,
        model: ClusterModel,
        auditor: Auditor | None = None,
        goodput: GoodputBook | None = None,
        clock: Callable[[], float] | None = None,
        admission: DecisionAudit | None = None,
    ) -> None:
        """Listen to `model` (call before it applies anything), to `auditor`, to the admission
        check's `admission` audit, and write the goodput ledger's changed rows
        (`GoodputBook.dirty_rows`, which keeps its own marks) as of `clock` (the service's:
        the model's time)."""
        self._model = model
        self._goodput = goodput
        self._goodput_clock = clock or self.clock
        model.ledger.on_change = self._dirty.add
        model.on_workload_ended = self._workload_ended
        model.elastic.on_event = self._open.append
        if auditor is not None:
            auditor.on_record = self._audit
        if admission is not None:
            admission.on_record = self._admission.append

    # -- the event path: O(1), under the service lock (audit: the controller's thread) --

    def _workload_ended(self, state: WorkloadState, deleted: bool, now: float) -> None:
        self._ended.append((state, deleted, now))

    def _audit(self, record: AuditRecord) -> None:
        if self.leading():
            self.writer.submit(audit_row(record))

    # -- the timer --

    def pump(self, lock: threading.Lock) -> None:
        """Write what changed since the last pump (the leader only)."""
        with self._pump_lock:
            leading = self.leading()
            with lock:
                rows, deleted = self._collect(leading)
            rows += [self._deleted_row(row) for row in deleted]
            if leading:  # deque appends (the audit's thread) and poplefts are atomic
                for _ in range(min(len(self._admission), MAX_ADMISSION_PER_PUMP)):
                    rows.append(admission_row(self._admission.popleft()))
            for row in rows:
                self.writer.submit(row)
            if leading:
                self._maybe_prune()

    def _collect(self, leading: bool) -> tuple[list[Row], list[WorkloadRow]]:
        model = self._model
        if model is None:
            return [], []
        if not leading:  # a standby keeps its marks for the day it leads, bounded by the ledger
            if len(self._dirty) > model.ledger.capacity:
                self._dirty.intersection_update(rid for rid, _ in model.ledger.items())
            return [], []
        rows: list[Row] = []
        for rid in sorted(self._dirty)[:MAX_PREEMPTIONS_PER_PUMP]:
            self._dirty.discard(rid)
            record = model.ledger.get(rid)
            if record is not None:
                rows.append(preemption_row(record, f"{self.writer_id}/{rid}"))
        deleted: list[WorkloadRow] = []
        for _ in range(min(len(self._ended), MAX_VIEWS_PER_PUMP)):
            state, is_deleted, at = self._ended.popleft()
            uid = state.workload.uid
            if is_deleted and uid not in self._seen_finish:
                # Not seen finishing here (it finished before this process watched, or never
                # did): a stored view, richer than ours, only gets the deletion noted.
                deleted.append(workload_row(model, state, at, True))
                continue
            rows.append(workload_row(model, state, at, is_deleted))
            if not is_deleted:
                self._seen_finish[uid] = None
                if len(self._seen_finish) > SEEN_FINISH_KEEP:
                    del self._seen_finish[next(iter(self._seen_finish))]
        for event in self._open:
            rows.append(scale_event_row(event))
        if self._goodput is not None:  # interruptions, job totals, findings, the GPU-seconds
            rows.extend(self._goodput.dirty_rows(self._goodput_clock()))
        # Written once more after it settles, then no longer followed.
        self._open = deque((e for e in self._open if not (e.done and e.cause)), MAX_OPEN_EVENTS)
        return rows, deleted

    def goodput_documents(
        self,
    ) -> tuple[
        list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]
    ]:
        """What a previous process wrote of the goodput ledger, for `GoodputBook.restore`:
        (interruptions, jobs, findings, ledger); StoreUnavailable when the store is away."""
        return (
            self.store.goodput_all("interruption"),
            self.store.goodput_all("job"),
            self.store.goodput_all("finding"),
            self.store.goodput_all("ledger"),
        )

    def admission_documents(self, limit: int) -> list[dict[str, Any]]:
        """The newest `limit` admission decisions a previous process wrote, oldest first, for
        `AdmissionAudit.restore`; StoreUnavailable when the store is away."""
        found: list[dict[str, Any]] = []
        cursor = None
        while len(found) < limit:
            page = self.store.audit(
                AuditQuery(
                    since=0.0,
                    admission=True,
                    limit=min(MAX_LIMIT, limit - len(found)),
                    cursor=cursor,
                )
            )
            found.extend(page.items)
            cursor = page.next_cursor
            if cursor is None:
                break
        found.reverse()
        return found

    def _deleted_row(self, ours: WorkloadRow) -> Row:
        try:
            stored = self.store.workload(ours.namespace, ours.name)
        except StoreUnavailable:
            stored = None  # ours, then: the writer queues it until the store is back
        if stored is None or stored.get("uid") != ours.document.get("uid"):
            return ours
        return replace(
            ours,
            cluster_queue=str(stored.get("cluster_queue") or ""),
            document=marked_deleted(stored, ours.finished_at),
        )

    def _maybe_prune(self) -> None:
        now = self.clock()
        if self._last_prune is not None and now - self._last_prune < PRUNE_EVERY_S:
            return
        self._last_prune = now
        try:
            deleted = self.store.prune(now, self.retention_s, self.max_rows)
        except StoreUnavailable as exc:
            self.prune_failures += 1
            log.warning("history retention skipped: %s", exc)
            return
        self.pruned += deleted
        if deleted:
            log.info("history retention: %d rows older than the retention deleted", deleted)

    # -- outputs --

    def families(self) -> list[Family]:
        ephemeral = Family(
            "topowatch_history_ephemeral",
            GAUGE,
            "1 when the history store's volume does not outlive the pod (history is lost with it).",
        )
        ephemeral.add([], 1 if self.ephemeral else 0)
        pruned = Family(
            "topowatch_history_rows_pruned", COUNTER, "Rows deleted by retention (age, count)."
        )
        pruned.add([], self.pruned)
        prune_failed = Family(
            "topowatch_history_prune_failures",
            COUNTER,
            "Retention runs skipped because the store was unavailable.",
        )
        prune_failed.add([], self.prune_failures)
        return [*self.writer.families(), ephemeral, pruned, prune_failed]


class HistoryStartError(Exception):
    """The history store cannot be used as configured: refuse to start, say why."""


def open_history(
    url: str,
    identity: str,
    retention_s: float = 90 * DAY_S,
    max_rows: int = 10_000_000,
    queue_rows: int = 100_000,
    ephemeral: bool = False,
) -> HistoryFeed:
    """The feed for the store at `url`, its writer not started yet.

    A malformed URL, a missing driver or a schema from a newer topowatch refuse the start
    (HistoryStartError): they will not mend themselves. A database that cannot be reached now
    is only logged: the service starts, serves live answers, queues writes and connects when
    the database is back (exporter.store.lazy)."""
    from exporter.store.lazy import LazyStore
    from exporter.store.migrations import SchemaTooNew
    from exporter.store.sqlstore import StoreUrlError

    try:
        store = LazyStore(url)
    except (StoreUrlError, StoreUnavailable) as exc:
        raise HistoryStartError(str(exc)) from None
    try:
        store.open()
    except SchemaTooNew as exc:
        store.close()
        raise HistoryStartError(str(exc)) from None
    except StoreUnavailable as exc:
        log.error(
            "history store unavailable at start: %s; serving live answers, queueing up to %d"
            " rows, retrying",
            exc,
            queue_rows,
        )
    else:
        log.info("history store %s ready", store.shown)
    if ephemeral:
        log.warning(
            "HISTORY IS EPHEMERAL: %s is on a volume that does not outlive this pod; every"
            " preemption, finished workload and audit record is lost with it. Enable"
            " history.persistence (a PersistentVolumeClaim) or use PostgreSQL.",
            store.shown,
        )
    writer = HistoryWriter(store, max_rows=queue_rows)
    return HistoryFeed(
        store, writer, identity, retention_s=retention_s, max_rows=max_rows, ephemeral=ephemeral
    )
