"""Issue 30, "every decision audited", restart-safe: the admission check's recorded decisions
go to the history store through the history feed (audit rows of kind "admission"), outlive a
restart (served by /api/v1/admission/history, restored into /api/v1/admission and explain),
are written once, and a store that is away costs nothing but the store.

The production path throughout (AdmissionController + ClusterService + HistoryFeed +
HistoryWriter + the store) on a real SQLite file and a real PostgreSQL, as
tests/cluster/test_history_service.py does; the last test runs `serve_cluster` itself twice on
one database, through the simulated API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exporter.cluster.admission.audit import AdmissionAudit
from exporter.cluster.admission.controller import AdmissionController
from exporter.cluster.admission.settings import AdmissionSettings
from exporter.cluster.explain import explain_text
from exporter.cluster.history.feed import HistoryFeed, open_history
from exporter.cluster.history.rows import admission_row, live_admission_page
from exporter.cluster.service import ClusterService
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from exporter.store.records import ADMISSION, AuditQuery
from exporter.store.sqlstore import StoreUnavailable
from healthcheck.remediation.audit import Auditor
from tests.cluster.admission.test_admission_service import until
from tests.cluster.admission.world import (
    CHECK,
    NS,
    T0,
    FakeWriter,
    admission_check,
    cluster_queue,
    entry,
    node,
    workload,
    xid,
)
from tests.conftest import (
    Response,
    ServedCluster,
    fetch_json,
    free_port,
    history_url,
    metric_value,
    serving,
)

ENFORCE = AdmissionSettings(enabled=True, mode="enforce")


class Process:
    """One `topowatch cluster` process with the admission check on and a history store, wired
    as serve_cluster wires them (attach with the admission audit, then restore)."""

    def __init__(self, url: str, identity: str = "cluster-a") -> None:
        self.now = T0 + 20
        self.feed: HistoryFeed = open_history(url, identity)
        self.feed.writer.flush_s = 0.05
        self.feed.writer.max_backoff_s = 0.5
        self.writer = FakeWriter()
        self.controller = AdmissionController(ENFORCE, self.writer, AdmissionAudit())
        self.auditor = Auditor()
        self.service = ClusterService(
            clock=lambda: self.now, history=self.feed, admission=self.controller
        )
        self.feed.attach(self.service.model, self.auditor, admission=self.controller.audit)
        try:  # as run.py's _restore_admission: a store that is away is only logged
            self.restored: int | None = self.service.restore_admission()
        except StoreUnavailable:
            self.restored = None
        self.feed.writer.start()
        self.served: ServedCluster | None = None

    def world(self, entry_state: str = "Pending") -> dict[str, Any]:
        self.service.apply("ClusterQueue", "ADDED", cluster_queue())
        self.service.apply("Node", "ADDED", node("n1", findings=[xid()]))
        self.service.apply("Node", "ADDED", node("n2"))
        raw = workload(entries=[entry(CHECK, entry_state)])
        self.service.apply("Workload", "ADDED", raw)
        return raw

    def pump(self, written: bool = True) -> None:
        self.feed.pump(self.service.lock)
        if written:
            assert self.feed.writer.flush(10.0), "the history writer did not catch up"

    def stored(self, **query: Any) -> list[dict[str, Any]]:
        return list(self.feed.store.audit(AuditQuery(since=0, **query)).items)

    def get(self, path: str) -> Response:
        if self.served is None:
            self.served = ServedCluster(self.service)
        return fetch_json(self.served.port, path)

    def metric(self, name: str) -> float:
        return metric_value(self.service, name)

    def stop(self) -> None:
        if self.served is not None:
            self.served.stop()
        self.feed.writer.stop(timeout=2.0)
        self.feed.store.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return history_url(request, tmp_path, "admission")


def test_a_recorded_decision_is_an_audit_row_written_once(url: str) -> None:
    p = Process(url)
    try:
        p.world()
        p.service.admission_cycle()
        p.pump()
        [row] = p.stored(admission=True)
        assert row["workload"] == f"{NS}/train" and row["state"] == "Retry"
        assert row["node"] == "n1" and row["finding"] == "XID 79 on GPU 3"
        assert row["written"] == "written" and row["mode"] == "enforce"
        assert row == p.controller.audit.latest(NS, "train")  # the same entry as the ring's
        # the remediation audit's history does not mix them in
        assert p.stored() == []
        # judged again, unchanged, for a while: recorded once, so written once
        for _ in range(3):
            p.now += 2
            p.service.admission_cycle()
            p.pump()
        assert len(p.stored(admission=True)) == 1
        assert len(p.stored(admission=True, workload=f"{NS}/train")) == 1
        assert p.stored(admission=True, workload=f"{NS}/other") == []
        # a rewrite of the same row (a replayed batch) changes nothing either
        p.feed.store.write([admission_row(row)])
        assert len(p.stored(admission=True)) == 1
        assert p.metric("topowatch_history_store_up") == 1
    finally:
        p.stop()


def test_after_a_restart_the_decisions_are_served_and_explain_still_holds(url: str) -> None:
    first = Process(url)
    try:
        first.world()
        first.service.admission_cycle()
        first.pump()
    finally:
        first.stop()

    again = Process(url)  # a new process: new feed, new store objects, the same database
    try:
        assert again.restored == 1
        status, headers, page = again.get(f"/api/v1/admission/history?workload={NS}/train")
        assert status == 200 and headers["X-Topowatch-Source"] == "history"
        assert [(d["workload"], d["state"], d["node"]) for d in page] == [
            (f"{NS}/train", "Retry", "n1")
        ]
        again.now += 7200
        assert again.get("/api/v1/admission/history?since=1h")[2] == []  # since filters
        again.now -= 7200
        status, _, view = again.get(f"/api/v1/admission?workload={NS}/train")
        assert status == 200 and [d["state"] for d in view["decisions"]] == ["Retry"]
        # explain of the held workload (its entry as our write left it) says so, as before
        raw = again.world("Retry")
        text = explain_text(again.service.workload(NS, "train") or {})
        assert "admission held: node n1, XID 79 on GPU 3, since 10:56:40Z" in text
        # Kueue requeues it, the node is still bad: the same answer is not news, not rewritten
        raw["status"]["admissionChecks"][0].update(state="Pending")
        raw["metadata"]["resourceVersion"] = "7"
        again.service.apply("Workload", "MODIFIED", raw)
        again.service.admission_cycle()
        again.pump()
        assert len(again.stored(admission=True)) == 1
        # the restored decisions were not counted again as this process's own
        body = again.service.metrics_body(False).decode()
        assert 'state="Retry",reason="unhealthy_node"} 1' not in body
    finally:
        again.stop()


def test_pages_from_the_store_follow_the_cursor(tmp_path: Path) -> None:
    p = Process(f"sqlite:///{tmp_path}/history.db")
    try:
        audit = p.controller.audit
        assert audit.on_record is not None
        for i in range(5):  # as the audit hands recorded decisions on
            audit.on_record(
                {"workload": f"{NS}/w{i}", "uid": f"u{i}", "check": CHECK, "state": "Retry"}
                | {"message": f"case {i}", "node": "n1", "at": T0 + i, "written": "observe"}
            )
        p.pump()
        status, headers, page = p.get("/api/v1/admission/history?limit=3")
        assert status == 200 and [d["message"] for d in page] == ["case 4", "case 3", "case 2"]
        rest = p.get(f"/api/v1/admission/history?limit=3&cursor={headers['X-Next-Cursor']}")[2]
        assert [d["message"] for d in rest] == ["case 1", "case 0"]
        # the remediation history is not the admission history
        assert p.get("/api/v1/remediation/history")[2] == []
    finally:
        p.stop()


def test_a_store_that_is_away_costs_only_the_store() -> None:
    """No crash, the decision in the ring and on /api/v1/admission, the live page says the
    store is away, and the metrics say the rows wait."""
    p = Process(f"postgresql://topowatch@127.0.0.1:{free_port()}/history?connect_timeout=1")
    try:
        assert p.restored is None  # the restore was refused, the process runs on
        p.world()
        assert p.service.admission_cycle() == 1
        p.pump(written=False)
        until(lambda: p.metric("topowatch_history_store_up") == 0)
        assert p.metric("topowatch_history_queue_rows") >= 1
        assert p.metric("topowatch_history_write_failures_total") >= 1
        latest = p.controller.audit.latest(NS, "train")
        assert latest is not None and latest["state"] == "Retry"
        status, headers, page = p.get("/api/v1/admission/history")
        assert status == 200 and headers["X-Topowatch-Source"] == "live"
        assert "unavailable" in headers["X-Topowatch-History"]
        assert [d["state"] for d in page] == ["Retry"]
        assert [d["state"] for d in p.get("/api/v1/admission")[2]["decisions"]] == ["Retry"]
    finally:
        p.stop()


def test_the_live_page_pages_the_ring_like_the_store() -> None:
    recent = [
        {"workload": f"{NS}/w{i}", "node": f"n{i % 2}", "at": T0 + i, "state": "Retry"}
        for i in reversed(range(5))
    ]
    first = live_admission_page(recent, AuditQuery(since=0, admission=True, limit=2))
    assert [d["workload"] for d in first.items] == [f"{NS}/w4", f"{NS}/w3"]
    assert first.next_cursor is not None and first.next_cursor.startswith("live.")
    rest = live_admission_page(
        recent, AuditQuery(since=0, admission=True, limit=10, cursor=first.next_cursor)
    )
    assert [d["workload"] for d in rest.items] == [f"{NS}/w2", f"{NS}/w1", f"{NS}/w0"]
    mine = live_admission_page(recent, AuditQuery(since=0, admission=True, workload=f"{NS}/w1"))
    assert [d["workload"] for d in mine.items] == [f"{NS}/w1"]
    on_n0 = live_admission_page(recent, AuditQuery(since=T0 + 1, admission=True, node="n0"))
    assert [d["workload"] for d in on_n0.items] == [f"{NS}/w4", f"{NS}/w2"]


def test_restore_skips_what_is_not_a_decision() -> None:
    audit = AdmissionAudit()
    good = {"workload": f"{NS}/a", "uid": "u", "check": CHECK, "state": "Retry", "message": "m"}
    assert audit.restore([{"nothing": 1}, good]) == 1
    assert audit.recent() == [good] and not audit.decisions  # another process's: not counted
    assert admission_row(good | {"at": T0}).kind == ADMISSION


def test_serve_cluster_writes_decisions_and_a_restart_serves_them(tmp_path: Path) -> None:
    """run.py's wiring: the feed hears the admission audit; a second serve_cluster on the same
    database answers /api/v1/admission with the first one's decision."""
    url = f"sqlite:///{tmp_path}/history.db"
    with FakeApiServer(ObjectStore(), bookmark_interval=0.2) as server:
        store = server.store
        store.upsert("admissionchecks", admission_check())
        store.upsert("clusterqueues", cluster_queue())
        store.upsert("nodes", node("n1", findings=[xid()]))
        store.upsert("nodes", node("n2"))
        store.upsert("workloads", workload(entries=[entry(CHECK, "Pending")]))

        def serve(check: Any) -> Any:
            admission = AdmissionSettings(enabled=True, mode="observe", interval_seconds=0.2)
            history = open_history(url, "cluster-a")
            options = {"history": history, "history_flush_s": 0.1, "admission": admission}
            with serving(server.url, **options) as (port, _):
                return check(port)

        def stored(port: int) -> list[dict[str, Any]]:
            status, headers, page = fetch_json(port, "/api/v1/admission/history")
            if status != 200 or headers["X-Topowatch-Source"] != "history":
                return []
            return list(page)

        def retry_stored(port: int) -> list[dict[str, Any]]:
            # (before its model synced, the first answer may be "no answer yet", stored too)
            return [d for d in stored(port) if d["state"] == "Retry"]

        first = serve(lambda port: until(lambda: retry_stored(port)))
        assert [(d["state"], d["written"]) for d in first] == [("Retry", "observe")]

        def restored(port: int) -> list[dict[str, Any]]:
            view = fetch_json(port, f"/api/v1/admission?workload={NS}/train")[2]
            return list(view["decisions"])

        # the first process's decision, restored (this one's own first answers may be newer:
        # "no answer yet" until its model has synced)
        again = serve(restored)
        assert ("Retry", first[0]["at"]) in [(d["state"], d["at"]) for d in again]
