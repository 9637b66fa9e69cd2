"""What the cluster service writes to the history store: its live views, as store rows.

Each row's document is exactly what the live API answers for the same thing (a preemption's
`preemption_view`, a workload's explain view, a scale event's `event_view`, an audit record's
`as_dict`, an admission decision's /api/v1/admission entry), so a reader cannot tell history
from live but by the `history` note a finished workload carries. Pure functions: the feed
(feed.py) calls them under the service lock.
"""

from __future__ import annotations

from typing import Any

from exporter.cluster.elastic.scaling import ScaleEvent
from exporter.cluster.ledger import PreemptionLedger, PreemptionRecord
from exporter.cluster.model import ClusterModel, WorkloadState
from exporter.cluster.views.elastic import event_view, explained_workload
from exporter.cluster.views.workloads import iso, preemption_view
from exporter.store.records import (
    ADMISSION,
    AuditQuery,
    AuditRow,
    Page,
    PreemptionQuery,
    PreemptionRow,
    ScaleEventRow,
    WorkloadRow,
    decode_cursor,
    encode_cursor,
)
from healthcheck.remediation.audit import AuditRecord

# Cursors of pages from the live model carry this prefix: they page the same process's ledger
# or audit trail and mean nothing to the store (nor the store's to them).
LIVE_CURSOR = "live."


def preemption_row(record: PreemptionRecord, key: str) -> PreemptionRow:
    """`key` names the ledger entry (the writer's identity and the entry's id)."""
    return PreemptionRow(
        key=key,
        time=record.time,
        victim_namespace=record.victim_namespace,
        victim_name=record.victim_name,
        victim_uid=record.victim_uid,
        victim_cluster_queue=record.victim_cluster_queue,
        preemptor_namespace=record.preemptor_namespace,
        preemptor_name=record.preemptor_name,
        preemptor_uid=record.preemptor_uid,
        preemptor_cluster_queue=record.preemptor_cluster_queue,
        reason=record.reason,
        verdict=record.verdict,
        gpus_freed=record.gpus_freed,
        observed=record.observed,
        document=preemption_view(record),
    )


def workload_row(
    model: ClusterModel, state: WorkloadState, ended_at: float, deleted: bool
) -> WorkloadRow:
    """The workload's explain view as it ended, noted as history (when, deleted or finished)."""
    view = explained_workload(model, state, now=ended_at)
    view["history"] = {"ended_at": iso(ended_at), "deleted": deleted}
    workload = state.workload
    return WorkloadRow(
        uid=workload.uid or f"{workload.namespace}/{workload.name}",
        namespace=workload.namespace,
        name=workload.name,
        cluster_queue=model.cluster_queue_of(workload),
        finished_at=ended_at,
        deleted=deleted,
        document=view,
    )


def marked_deleted(document: dict[str, Any], deleted_at: float) -> dict[str, Any]:
    """A stored finished workload's view, now deleted too (its timeline is the richer one: it
    was written by whoever watched the workload run)."""
    history = {**document.get("history", {}), "deleted": True, "deleted_at": iso(deleted_at)}
    return {**document, "history": history}


def scale_event_row(event: ScaleEvent) -> ScaleEventRow:
    namespace, kind, job = event.job
    # ElasticBook's dedupe key (the Workload's UID and the direction) names one event in any
    # process that watches it, so a restart or another replica rewrites the same row.
    key = "/".join((namespace, kind, job, *event.dedupe))
    return ScaleEventRow(
        key=key,
        time=event.time,
        namespace=namespace,
        job=job,
        kind=event.direction,
        cause=event.cause or "unsettled",
        document={**event_view(event), "job": {"namespace": namespace, "kind": kind, "name": job}},
    )


def audit_row(record: AuditRecord) -> AuditRow:
    return AuditRow(
        time=record.at,
        node=record.node,
        kind=record.kind,
        verdict=record.verdict,
        reason=record.reason,
        action=record.action or "",
        document=record.as_dict(),
    )


def admission_row(entry: dict[str, Any]) -> AuditRow:
    """An admission decision (`exporter.cluster.admission.audit.as_dict`) as an audit row of
    kind "admission": `verdict` the state answered ("none": no answer yet), `action` what
    became of it (written, observe, unchanged, an error), `subject` the workload."""
    return AuditRow(
        time=float(entry["at"]),
        node=str(entry.get("node") or ""),
        kind=ADMISSION,
        verdict=str(entry.get("state") or "none"),
        reason=str(entry.get("reason") or ""),
        action=str(entry.get("written") or entry.get("mode") or ""),
        document=dict(entry),
        subject=str(entry["workload"]),
    )


# -- pages from the live model, when there is no store or it is unavailable --------------------


def live_cursor(cursor: str | None) -> tuple[float, int] | None:
    """The (time, id) in a live cursor; ValueError for a store's cursor or a malformed one."""
    if cursor is None:
        return None
    if not cursor.startswith(LIVE_CURSOR):
        raise ValueError("a cursor of the history store's pages; start again without it")
    return decode_cursor(cursor.removeprefix(LIVE_CURSOR))


def live_preemption_page(ledger: PreemptionLedger, q: PreemptionQuery) -> Page:
    """`q` over the in-memory ledger, in the store's order (newest first by time, then id) and
    with the store's filters: the namespace is the victim's, a queue either side's."""
    after = live_cursor(q.cursor)
    matches = sorted(
        (
            (record.time, rid, record)
            for rid, record in ledger.items()
            if record.time >= q.since
            and (q.until is None or record.time < q.until)
            and (q.namespace is None or record.victim_namespace == q.namespace)
            and (q.verdict is None or record.verdict == q.verdict)
            and (
                q.queue is None
                or q.queue in (record.victim_cluster_queue, record.preemptor_cluster_queue)
            )
            and (after is None or (record.time, rid) < after)
        ),
        key=lambda m: (m[0], m[1]),
        reverse=True,
    )
    page = matches[: q.limit]
    items = tuple(preemption_view(record) for _, _, record in page)
    if len(matches) <= q.limit:
        return Page(items, None)
    return Page(items, LIVE_CURSOR + encode_cursor(page[-1][0], page[-1][1]))


def live_audit_page(numbered: list[tuple[int, AuditRecord]], q: AuditQuery) -> Page:
    """`q` over the in-memory audit trail (`Auditor.numbered`), newest first by sequence."""
    after = live_cursor(q.cursor)
    matches = [
        (seq, record)
        for seq, record in reversed(numbered)
        if record.at >= q.since
        and (q.node is None or record.node == q.node)
        and (after is None or seq < after[1])
    ]
    page = matches[: q.limit]
    items = tuple(record.as_dict() for _, record in page)
    if len(matches) <= q.limit:
        return Page(items, None)
    seq, record = page[-1]
    return Page(items, LIVE_CURSOR + encode_cursor(record.at, seq))


def live_admission_page(recent: list[dict[str, Any]], q: AuditQuery) -> Page:
    """`q` over the admission audit's ring (`AdmissionAudit.recent`, newest first); a live
    cursor is the (time, position from the oldest) of the last entry seen."""
    after = live_cursor(q.cursor)
    total = len(recent)
    matches = [
        (total - i, entry)
        for i, entry in enumerate(recent)
        if float(entry.get("at", 0.0)) >= q.since
        and (q.workload is None or entry.get("workload") == q.workload)
        and (q.node is None or entry.get("node") == q.node)
        and (after is None or total - i < after[1])
    ]
    page = matches[: q.limit]
    items = tuple(dict(entry) for _, entry in page)
    if len(matches) <= q.limit:
        return Page(items, None)
    seq, entry = page[-1]
    return Page(items, LIVE_CURSOR + encode_cursor(float(entry.get("at", 0.0)), seq))
