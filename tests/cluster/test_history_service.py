"""Issue 18 through the cluster service: history that outlives a restart, a database that is
down at start or goes away, and two replicas of which only the leader writes.

Every test runs the production path (ClusterService + HistoryFeed + HistoryWriter + the store)
against a real SQLite file and a real PostgreSQL (tests/postgres_harness.py), and reads through the
HTTP API as a user would. The Kueue objects are the ones tests/cluster/test_preemption_counters.py
validates against Kueue's CRDs."""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.cli import main
from exporter.cluster.history.feed import HistoryFeed, HistoryStartError, open_history
from exporter.cluster.history.rows import live_audit_page
from exporter.cluster.run import explain_live
from exporter.cluster.service import ClusterService
from exporter.cluster.views.workloads import iso
from exporter.sim import synthetic as s
from exporter.store.migrations import LATEST
from exporter.store.records import AuditQuery
from healthcheck.remediation.audit import Auditor
from tests.cluster.test_preemption_counters import (
    CQ,
    NS,
    S,
    kueue,
    preempt,
    start_up,
    urgent,
    victim,
)
from tests.conftest import Response, ServedCluster, fetch_json, metric_value
from tests.postgres_harness import PostgresServer, find_bindir

DAY = 86_400.0


def eventually(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Replica:
    """One `topowatch cluster` process's worth: its model, a feed on `url`, its API."""

    def __init__(self, url: str, identity: str, now: list[float], queue_rows: int = 100_000):
        self.now = now
        self.feed: HistoryFeed = open_history(url, identity, queue_rows=queue_rows)
        self.feed.writer.flush_s = 0.05
        self.feed.writer.max_backoff_s = 0.5  # retries come quickly in tests
        self.leads = True
        self.feed.leading = lambda: self.leads
        self.auditor = Auditor()
        self.service = ClusterService(clock=lambda: self.now[0], history=self.feed)
        self.feed.attach(self.service.model, self.auditor)
        self.feed.writer.start()
        self.served = ServedCluster(self.service)

    def get(self, path: str) -> Response:
        return fetch_json(self.served.port, path)

    def pump(self, written: bool = True) -> None:
        self.feed.pump(self.service.lock)
        if written:
            assert self.feed.writer.flush(10.0), "the history writer did not catch up"

    def metric(self, name: str) -> float:
        return metric_value(self.service, name)

    def stop(self) -> None:
        self.served.stop()
        self.feed.writer.stop(timeout=2.0)
        self.feed.store.close()


@pytest.fixture
def pg_cluster_db(pg_server: PostgresServer, request: pytest.FixtureRequest) -> str:
    return pg_server.create_database(f"service_{abs(hash(request.node.name)) % 10**9}")


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/history.db"
    return str(request.getfixturevalue("pg_cluster_db"))


def finished(name: str, at: float) -> dict[str, Any]:
    """An admitted workload whose Job finished at `at`."""
    workload = victim(name, at - 600)
    workload["metadata"] = {**workload["metadata"], "resourceVersion": f"{at:.0f}"}
    workload["status"] = {
        **workload["status"],
        "conditions": [
            *workload["status"]["conditions"],
            s.condition("Finished", "True", "Succeeded", "Job finished successfully", at),
        ],
    }
    return kueue(workload)


def live_preemption(replica: Replica, name: str, at: float) -> None:
    """A victim admitted, its preemptor arriving, the preemption's condition and Event."""
    v, u = victim(name, at - 300), urgent(f"{name}-urgent", at - 5)
    replica.service.apply("Workload", "ADDED", v)
    replica.service.apply("Workload", "ADDED", u)
    p = preempt(v, u, at)
    replica.service.apply("Workload", "MODIFIED", p.workload)
    replica.service.apply("Event", "ADDED", p.event)


def test_a_restarted_service_finds_yesterdays_preemptions_and_deleted_workloads(url: str) -> None:
    now = [S]
    first = Replica(url, "cluster-a", now)
    try:
        start_up(first.service.model, [], [])
        now[0] = S + 60
        live_preemption(first, "v1", S + 60)
        done = finished("done", S + 120)
        now[0] = S + 120
        first.service.apply("Workload", "ADDED", victim("done", S - 480))
        first.service.apply("Workload", "MODIFIED", done)
        now[0] = S + 180
        first.service.apply("Workload", "DELETED", done)
        first.pump()
        status, _, seen = first.get("/api/v1/preemptions")
        assert status == 200 and [p["victim_name"] for p in seen] == ["v1"]
    finally:
        first.stop()

    # A day later a new process starts; Kueue still shows the preemption (condition, Event).
    now[0] = S + DAY
    second = Replica(url, "cluster-b", now)
    try:
        v, u = victim("v1", S - 240), urgent("v1-urgent", S + 55)
        p = preempt(v, u, S + 60)
        start_up(second.service.model, [p.workload, u], [p.event])
        second.pump()
        status, headers, stored = second.get("/api/v1/preemptions?since=2d")
        assert status == 200 and headers["X-Topowatch-Source"] == "history"
        # one preemption, as the process that saw it happen judged it: the restart's copy
        # ("history", another key) merged into it by the ledger's rule
        assert [(r["victim_name"], r["observed"], r["verdict"]) for r in stored] == [
            ("v1", "live", seen[0]["verdict"])
        ]
        assert second.get("/api/v1/preemptions?since=1h")[2] == []
        assert second.get(f"/api/v1/preemptions?since=2d&namespace={NS}&queue={CQ}")[2] == stored
        assert second.get("/api/v1/preemptions?since=2d&namespace=other")[2] == []

        status, headers, ended = second.get(f"/api/v1/workloads/{NS}/done")
        assert status == 200 and headers["X-Topowatch-Source"] == "history"
        assert ended["history"]["deleted"] is True and ended["status"] == "finished"
        text = explain_live(f"http://127.0.0.1:{second.served.port}", f"{NS}/done", False, False)
        assert "From history: deleted" in text
        assert second.get(f"/api/v1/workloads/{NS}/never")[0] == 404
    finally:
        second.stop()


def test_pages_follow_the_cursor_and_say_where_they_came_from(url: str) -> None:
    now = [S]
    replica = Replica(url, "cluster-a", now)
    try:
        start_up(replica.service.model, [], [])
        for i in range(5):
            now[0] = S + 60 * (i + 1)
            live_preemption(replica, f"v{i}", now[0])
        replica.pump()
        names, path = [], "/api/v1/preemptions?limit=2"
        while True:
            status, headers, page = replica.get(path)
            assert status == 200 and len(page) <= 2
            names += [p["victim_name"] for p in page]
            if "X-Next-Cursor" not in headers:
                break
            assert headers["Link"].endswith('; rel="next"')
            path = headers["Link"][1 : headers["Link"].index(">")]
        assert names == ["v4", "v3", "v2", "v1", "v0"]  # newest first, each once
        assert replica.get("/api/v1/preemptions?limit=0")[0] == 400
        assert replica.get("/api/v1/preemptions?cursor=bogus")[0] == 400
        assert replica.get("/api/v1/preemptions?since=yesterday-ish")[0] == 400
    finally:
        replica.stop()


def test_the_remediation_audit_is_history_too(url: str) -> None:
    now = [S]
    replica = Replica(url, "cluster-a", now)
    try:
        for i in range(5):
            replica.auditor.problem(f"node-{i % 2}", "malformed_findings", f"case {i}", S + i)
        replica.pump()
        status, headers, page = replica.get("/api/v1/remediation/history?limit=3")
        assert status == 200 and headers["X-Topowatch-Source"] == "history"
        assert [r["detail"] for r in page] == ["case 4", "case 3", "case 2"]
        cursor = headers["X-Next-Cursor"]
        rest = replica.get(f"/api/v1/remediation/history?limit=3&cursor={cursor}")[2]
        assert [r["detail"] for r in rest] == ["case 1", "case 0"]
        node = replica.get("/api/v1/remediation/history?node=node-1")[2]
        assert [r["detail"] for r in node] == ["case 3", "case 1"]
    finally:
        replica.stop()


def test_without_a_store_the_live_audit_trail_pages_the_same_way() -> None:
    auditor = Auditor(keep=4)
    for i in range(6):  # the first two have left the bounded trail
        auditor.problem("n1" if i % 2 else "n0", "malformed_state", f"case {i}", S + i)
    first = live_audit_page(auditor.numbered(), AuditQuery(since=0, limit=3))
    assert [r["detail"] for r in first.items] == ["case 5", "case 4", "case 3"]
    assert first.next_cursor is not None and first.next_cursor.startswith("live.")
    rest = live_audit_page(auditor.numbered(), AuditQuery(since=0, cursor=first.next_cursor))
    assert [r["detail"] for r in rest.items] == ["case 2"] and rest.next_cursor is None
    assert [
        r["detail"] for r in live_audit_page(auditor.numbered(), AuditQuery(since=S + 4)).items
    ] == [
        "case 5",
        "case 4",
    ]


@pytest.fixture
def idle_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL initialised but not started: a database that is down."""
    root = Path(tempfile.mkdtemp(prefix="topowatch-pg-down-"))
    server = PostgresServer(root, find_bindir(), ["-c fsync=off"])
    server.init()
    try:
        yield server
    finally:
        if (server.data / "postmaster.pid").exists():
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_a_database_down_at_start_then_back(idle_postgres: PostgresServer) -> None:
    now = [S]
    replica = Replica(idle_postgres.url(), "cluster-a", now)  # starts: no crash, no refusal
    try:
        start_up(replica.service.model, [], [])
        live_preemption(replica, "v1", S + 10)
        replica.pump(written=False)
        eventually(lambda: replica.metric("topowatch_history_store_up") == 0, "store_up 0")
        # live answers go on, and say the history is not in them
        status, headers, page = replica.get("/api/v1/preemptions")
        assert status == 200 and [p["victim_name"] for p in page] == ["v1"]
        assert headers["X-Topowatch-Source"] == "live"
        assert "unavailable" in headers["X-Topowatch-History"]
        assert replica.metric("topowatch_history_queue_rows") >= 1

        idle_postgres.start()
        eventually(lambda: replica.metric("topowatch_history_store_up") == 1, "store_up 1")
        assert replica.feed.writer.flush(10.0)
        assert replica.metric("topowatch_history_rows_dropped_total") == 0
        eventually(
            lambda: replica.get("/api/v1/preemptions")[1]["X-Topowatch-Source"] == "history",
            "reads from the store again",
        )
        assert [p["victim_name"] for p in replica.get("/api/v1/preemptions")[2]] == ["v1"]
    finally:
        replica.stop()


def test_a_database_that_goes_away_queues_to_a_bound_counts_the_rest_and_recovers(
    idle_postgres: PostgresServer,
) -> None:
    idle_postgres.start()
    now = [S]
    replica = Replica(idle_postgres.url(), "cluster-a", now, queue_rows=3)
    try:
        start_up(replica.service.model, [], [])
        live_preemption(replica, "before", S + 10)
        replica.pump()
        idle_postgres.stop()
        for i in range(6):
            now[0] = S + 60 * (i + 1)
            live_preemption(replica, f"during-{i}", now[0])
            replica.pump(written=False)
        eventually(lambda: replica.metric("topowatch_history_store_up") == 0, "store_up 0")
        eventually(
            lambda: replica.metric("topowatch_history_rows_dropped_total") >= 3, "drops counted"
        )
        assert replica.metric("topowatch_history_queue_rows") <= 3
        # the live model still answers everything, the store's absence said
        status, headers, page = replica.get("/api/v1/preemptions?limit=1000")
        assert status == 200 and len(page) == 7 and headers["X-Topowatch-Source"] == "live"
        assert replica.get(f"/api/v1/workloads/{NS}/during-5")[0] == 200

        idle_postgres.start()
        eventually(lambda: replica.metric("topowatch_history_store_up") == 1, "store_up 1")
        assert replica.feed.writer.flush(10.0)
        stored = [p["victim_name"] for p in replica.get("/api/v1/preemptions?limit=1000")[2]]
        # what was written before, and the newest rows the bound kept; the oldest were dropped
        assert stored[-1] == "before" and stored[0] == "during-5"
        dropped = replica.metric("topowatch_history_rows_dropped_total")
        assert len(stored) == 7 - dropped
    finally:
        replica.stop()


def test_only_the_leader_writes_and_a_new_leader_writes_what_the_old_one_had_not(
    pg_cluster_db: str,
) -> None:
    now = [S]
    leader = Replica(pg_cluster_db, "cluster-a", now)
    standby = Replica(pg_cluster_db, "cluster-b", now)
    standby.leads = False
    try:
        for replica in (leader, standby):
            start_up(replica.service.model, [], [])
        for name, at in (("v1", S + 10), ("v2", S + 70)):
            now[0] = at
            for replica in (leader, standby):
                live_preemption(replica, name, at)
            standby.pump()  # a standby keeps its marks and writes nothing
            if name == "v1":
                leader.pump()
        # v2 happened, but the leader dies before its next pump
        assert [p["victim_name"] for p in standby.get("/api/v1/preemptions")[2]] == ["v1"]
        leader.stop()
        standby.leads = True
        standby.pump()
        names = [p["victim_name"] for p in standby.get("/api/v1/preemptions")[2]]
        assert names == ["v2", "v1"]  # v2 written by the new leader; v1 still once
    finally:
        standby.stop()


def test_bad_history_settings_refuse_to_start_with_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for bad, words in (
        ("mysql://db/x", "unsupported scheme"),
        ("sqlite://host/x.db", "names no host"),
        ("postgresql://user:hunter2@/x", "names no host"),
    ):
        with pytest.raises(HistoryStartError, match=words) as caught:
            open_history(bad, "cluster-a")
        assert "hunter2" not in str(caught.value)
    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER, description TEXT, at REAL)")
        conn.execute("INSERT INTO schema_version VALUES (?, 'from the future', 0)", (LATEST + 1,))
    with pytest.raises(HistoryStartError, match="newer release"):
        open_history(f"sqlite:///{newer}", "cluster-a")
    rc = main(["cluster", "--simulate", "--database-url", "postgresql://u:hunter2@/nodb"])
    err = capsys.readouterr().err
    assert rc == 2 and "history store" in err and "hunter2" not in err


def test_a_scale_event_is_written_as_its_phases_fill_in_and_then_let_go(tmp_path: Path) -> None:
    from tests.cluster.test_elastic import T0, cluster, increment, running_base, scale_up

    path = tmp_path / "history.db"
    feed = open_history(f"sqlite:///{path}", "cluster-a")
    model = cluster()
    feed.attach(model)
    lock = threading.Lock()
    feed.writer.start()
    try:
        running_base(model)
        model.apply("Workload", "ADDED", increment("llama-up1", 1, T0 + 100), T0 + 100)
        feed.pump(lock)
        assert feed.writer.flush(10.0)

        def stored() -> list[dict[str, Any]]:
            with sqlite3.connect(path) as conn:
                found = conn.execute("SELECT key, document FROM scale_events").fetchall()
            return [{"key": key, **json.loads(document)} for key, document in found]

        [opened] = stored()
        assert (opened["direction"], opened["done"]) == ("up", False)
        scale_up(model)  # admitted, scheduled, ready, restarted: done
        feed.pump(lock)
        assert feed.writer.flush(10.0)
        [done] = stored()
        assert done["key"] == opened["key"]  # the same row, rewritten
        assert done["done"] is True and done["cause"] == "capacity_freed"
        assert set(done["phases"]) >= {"requested", "admitted", "ready", "restarted"}
        assert done["job"] == {
            "namespace": opened["job"]["namespace"],
            "kind": "HyperPodPyTorchJob",
            "name": "llama",
        }
        written = sum(feed.writer.written.values())
        feed.pump(lock)  # settled: no longer followed
        assert feed.writer.flush(10.0) and sum(feed.writer.written.values()) == written
    finally:
        feed.writer.stop()
        feed.store.close()


def test_deleting_a_workload_finished_before_a_restart_keeps_the_richer_stored_view(
    url: str,
) -> None:
    now = [S]
    first = Replica(url, "cluster-a", now)
    try:
        start_up(first.service.model, [], [])
        now[0] = S + 120
        first.service.apply("Workload", "ADDED", victim("done", S - 480))
        first.service.apply("Workload", "MODIFIED", finished("done", S + 120))
        first.pump()
        watched = first.get(f"/api/v1/workloads/{NS}/done")[2]
    finally:
        first.stop()

    # After a restart the finished workload is in the first list (not written again: the
    # timeline rebuilt from its conditions is poorer), then someone deletes it.
    now[0] = S + DAY
    second = Replica(url, "cluster-b", now)
    try:
        done = finished("done", S + 120)
        start_up(second.service.model, [done], [])
        second.pump()
        assert second.feed.writer.written["WorkloadRow"] == 0
        second.service.apply("Workload", "DELETED", done)
        second.pump()
        status, headers, ended = second.get(f"/api/v1/workloads/{NS}/done")
        assert status == 200 and headers["X-Topowatch-Source"] == "history"
        # the first process's view (its timeline), noted deleted, not the restart's rebuild
        assert ended["timeline"] == watched["timeline"]
        assert ended["history"]["deleted"] is True and ended["history"]["deleted_at"]
        assert ended["history"]["ended_at"] == iso(S + 120)  # when the first process saw it end
    finally:
        second.stop()
