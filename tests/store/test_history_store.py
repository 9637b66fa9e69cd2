"""The history store against real databases: an SQLite file, and a real PostgreSQL server
(tests/postgres_harness.py: initdb'd in a temp dir for the session, run as the `postgres` user
when the tests run as root). Every behaviour test runs on both backends."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from exporter.store.migrations import LATEST, SchemaTooNew
from exporter.store.records import (
    ADMISSION,
    AuditQuery,
    AuditRow,
    PreemptionQuery,
    PreemptionRow,
    ScaleEventRow,
    WorkloadRow,
)
from exporter.store.sqlstore import (
    SqlStore,
    StoreUnavailable,
    StoreUrlError,
    open_store,
    page_sql,
    victims_sql,
)
from tests.conftest import history_url, new_database
from tests.postgres_harness import PostgresServer, free_port

DAY = 86_400.0
NOW = 1_780_000_000.0


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return history_url(request, tmp_path, "history")


@pytest.fixture
def store(url: str) -> Iterator[SqlStore]:
    store = open_store(url)
    yield store
    store.close()


def peek(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """`sql` run on the store's database behind its back (qmark placeholders)."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite://")) as conn:
            return conn.execute(sql, params).fetchall()
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql.replace("?", "%s"), params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def preemption(i: int, t: float, **overrides: Any) -> PreemptionRow:
    fields: dict[str, Any] = {
        "key": f"victim-{i}/preemptor/{int(t)}",
        "time": t,
        "victim_namespace": f"team-{i % 3}",
        "victim_name": f"job-{i}",
        "victim_uid": f"uid-{i}",
        "victim_cluster_queue": f"cq-{i % 4}",
        "preemptor_namespace": "prod",
        "preemptor_name": f"big-{i}",
        "preemptor_uid": f"p-{i}",
        "preemptor_cluster_queue": "cq-prod" if i % 5 else "cq-0",
        "reason": "InCohortReclamation",
        "verdict": ("fair", "unfair", "unknown")[i % 3 - 1],
        "gpus_freed": 8,
        "observed": "live",
    }
    document = overrides.pop("document", {})
    fields.update(overrides)
    return PreemptionRow(document={"i": i, "time": t, **fields, **document}, **fields)


def everything(store: SqlStore, **query: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = store.preemptions(PreemptionQuery(**{"since": 0.0, **query}, cursor=cursor))
        items += page.items
        if page.next_cursor is None:
            return items
        cursor = page.next_cursor


def count(url: str, table: str) -> int:
    return int(peek(url, f"SELECT COUNT(*) FROM {table}")[0][0])


def test_each_row_type_round_trips(store: SqlStore, url: str) -> None:
    audit_doc = {"audit": "cordon", "node": "n1", "verdict": "done", "ladder": ["a", "b"]}
    store.write(
        [
            preemption(1, NOW),
            WorkloadRow("w-uid", "team-a", "train", "cq-a", NOW, False, {"timeline": [1, 2]}),
            AuditRow(NOW, "n1", "cordon", "done", "xid 79", "cordon", audit_doc),
            ScaleEventRow("s-1", NOW, "team-a", "elastic", "shrink", "preempted", {"to": 4}),
        ]
    )
    assert store.preemptions(PreemptionQuery(since=0)).items == (preemption(1, NOW).document,)
    assert store.workload("team-a", "train") == {"timeline": [1, 2]}
    assert store.workload("team-a", "nope") is None
    assert store.audit(AuditQuery(since=0)).items == (audit_doc,)
    assert peek(url, "SELECT key, job, document FROM scale_events") == [
        ("s-1", "elastic", '{"to":4}')
    ]


def test_writes_are_upserts_so_replays_change_nothing(store: SqlStore, url: str) -> None:
    batch = [preemption(i, NOW - i) for i in range(50)]
    audit = AuditRow(NOW, "n1", "drain", "done", "", "drain", {"x": 1})
    store.write([*batch, audit])
    store.write([*batch, audit])  # the writer replays a batch whose commit it did not see
    assert count(url, "preemptions") == 50
    assert count(url, "audit") == 1
    later = preemption(0, NOW, verdict="unfair", observed="history")
    store.write([later])
    assert count(url, "preemptions") == 50
    # the same key replaces (the new verdict), but a preemption once seen live stays live
    newest = {**later.document, "observed": "live"}
    assert store.preemptions(PreemptionQuery(since=0, limit=1)).items == (newest,)
    # the newest run of a workload name wins
    store.write([WorkloadRow("u1", "ns", "w", "cq", NOW - 10, True, {"run": 1})])
    store.write([WorkloadRow("u2", "ns", "w", "cq", NOW, False, {"run": 2})])
    store.write([WorkloadRow("u1", "ns", "w", "cq", NOW - 10, True, {"run": 1})])
    assert store.workload("ns", "w") == {"run": 2}


def test_filters(store: SqlStore) -> None:
    rows = [preemption(i, NOW - i * 60) for i in range(60)]
    store.write(rows)

    def ids(**query: Any) -> list[int]:
        return [item["i"] for item in everything(store, **query)]

    assert ids() == list(range(60))  # newest first
    assert ids(since=NOW - 600) == list(range(11))
    assert ids(since=NOW - 600, until=NOW - 120) == list(range(3, 11))
    assert ids(namespace="team-1") == [i for i in range(60) if i % 3 == 1]
    assert ids(verdict="fair") == [i for i in range(60) if i % 3 == 1]
    # a queue matches the victim's or the preemptor's, each row once
    assert ids(queue="cq-0") == [i for i in range(60) if i % 4 == 0 or i % 5 == 0]
    assert ids(queue="cq-prod", namespace="team-0", verdict="unknown") == [
        i for i in range(60) if i % 5 and i % 3 == 0
    ]
    assert ids(namespace="nobody") == []

    store.write([AuditRow(NOW - i, f"n{i % 2}", "k", "v", "", "a", {"i": i}) for i in range(9)])
    assert [d["i"] for d in store.audit(AuditQuery(since=0, node="n1")).items] == [1, 3, 5, 7]
    assert [d["i"] for d in store.audit(AuditQuery(since=NOW - 2)).items] == [0, 1, 2]


def test_keyset_pages_are_stable_under_inserts(store: SqlStore) -> None:
    # Ten rows a second: pages end in the middle of a run of equal times.
    original = [preemption(i, NOW - i // 10) for i in range(1_000)]
    store.write(original)
    seen: list[dict[str, Any]] = []
    cursor = None
    extra = itertools.count(10_000)
    for _ in range(100):
        page = store.preemptions(PreemptionQuery(since=0, limit=37, cursor=cursor))
        seen += page.items
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
        # Between pages: new rows, newer than all (a live cluster) and at the very time the
        # page ended on (ties), which the reader may or may not see but never twice.
        store.write([preemption(next(extra), NOW + 1), preemption(next(extra), seen[-1]["time"])])
    keys = [item["key"] for item in seen]
    assert len(keys) == len(set(keys)), "a row came twice"
    assert {r.key for r in original} <= set(keys), "a row was skipped"
    assert all(a["time"] >= b["time"] for a, b in itertools.pairwise(seen))
    assert all(item["time"] <= NOW for item in seen)  # nothing newer than page 1 sneaks in


def test_bad_queries_are_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        PreemptionQuery(since=0, limit=1001)
    with pytest.raises(ValueError, match="limit"):
        AuditQuery(since=0, limit=0)
    for cursor in ("not base64!", "WzEsMiwzXQ==", "eyJhIjoxfQ=="):
        with pytest.raises(ValueError, match="malformed cursor"):
            page_sql(PreemptionQuery(since=0, cursor=cursor))


def test_retention_by_age_and_by_count(store: SqlStore, url: str) -> None:
    store.write([preemption(i, NOW - i * DAY) for i in range(100)])
    store.write([AuditRow(NOW - i * DAY, "n", "k", "v", "", "a", {"i": i}) for i in range(100)])
    store.write(
        [WorkloadRow(f"u{i}", "ns", f"w{i}", "cq", NOW - i * DAY, False, {}) for i in range(5)]
    )
    # 90 days: days 0..89 stay (day 90 is exactly 90 days old: kept, older goes)
    assert store.prune(NOW, 90 * DAY, 1_000) == 9 + 9
    assert count(url, "preemptions") == 91
    assert store.prune(NOW, 90 * DAY, 1_000) == 0
    # by count: the newest 10 of each table stay
    assert store.prune(NOW, 90 * DAY, 10) == 81 + 81
    assert [d["i"] for d in everything(store)] == list(range(10))
    assert count(url, "workloads") == 5
    # ties at the bound: exactly max_rows stay
    store.write([preemption(1000 + i, NOW + 5) for i in range(20)])
    store.prune(NOW, 90 * DAY, 15)
    assert count(url, "preemptions") == 15


def test_migrations_from_empty_and_reopening(url: str) -> None:
    store = open_store(url)
    store.write([preemption(1, NOW)])
    store.close()
    assert peek(url, "SELECT version FROM schema_version") == [(v,) for v in range(1, LATEST + 1)]
    store = open_store(url)  # an existing database: nothing to apply, the data still there
    assert len(store.preemptions(PreemptionQuery(since=0)).items) == 1
    store.close()
    assert count(url, "schema_version") == LATEST


def test_a_newer_schema_is_refused_and_left_untouched(url: str) -> None:
    open_store(url).close()
    peek(url, "INSERT INTO schema_version VALUES (?, 'from the future', 0)", (LATEST + 1,))
    peek(url, "DROP TABLE scale_events")  # what version LATEST + 1 might do
    before = [peek(url, "SELECT * FROM schema_version ORDER BY version")]
    with pytest.raises(SchemaTooNew, match=f"version {LATEST + 1}.*up to {LATEST}"):
        open_store(url)
    assert [peek(url, "SELECT * FROM schema_version ORDER BY version")] == before
    with pytest.raises((sqlite3.OperationalError, psycopg.errors.UndefinedTable)):
        peek(url, "SELECT * FROM scale_events")  # not recreated


def test_queries_walk_an_index(store: SqlStore, url: str) -> None:
    # Selective filters (1 row in 100 or 50), where an index beats walking time and filtering.
    rare = [
        preemption(
            i,
            NOW - i,
            victim_namespace=f"team-{i % 100}",
            verdict="unfair" if i % 100 == 7 else "fair",
            victim_cluster_queue=f"cq-{i % 50}",
            preemptor_cluster_queue=f"cq-{(i + 1) % 50}",
        )
        for i in range(5_000)
    ]
    store.write(rare)
    store.write([AuditRow(NOW - i, f"n{i % 50}", "k", "v", "", "a", {}) for i in range(2_000)])
    store.write(
        [
            AuditRow(NOW - i, "n1", ADMISSION, "Retry", "", "written", {}, f"ns/w{i % 50}")
            for i in range(2_000)
        ]
    )
    cursor = store.preemptions(PreemptionQuery(since=0)).next_cursor
    queries: list[tuple[PreemptionQuery | AuditQuery, set[str]]] = [
        (PreemptionQuery(since=0), {"preemptions_time"}),
        (PreemptionQuery(since=0, cursor=cursor), {"preemptions_time"}),
        (PreemptionQuery(since=NOW - 30 * DAY, namespace="team-1"), {"preemptions_namespace"}),
        (PreemptionQuery(since=0, verdict="unfair", cursor=cursor), {"preemptions_verdict"}),
        (
            PreemptionQuery(since=0, queue="cq-1"),
            {"preemptions_victim_queue", "preemptions_preemptor_queue"},
        ),
        (AuditQuery(since=0, node="n7"), {"audit_node"}),
        (AuditQuery(since=0, admission=True), {"audit_kind"}),
        (AuditQuery(since=0, admission=True, workload="ns/w7"), {"audit_subject"}),
    ]
    if url.startswith("postgresql"):
        peek(url, "ANALYZE")
    for query, indexes in queries:
        sql, args = page_sql(query)
        if url.startswith("sqlite"):
            steps = [row[3] for row in peek(url, f"EXPLAIN QUERY PLAN {sql}", tuple(args))]
            plan = "\n".join(steps)
            assert not {"SCAN preemptions", "SCAN audit"} & set(steps), plan
        else:
            plan = "\n".join(row[0] for row in peek(url, f"EXPLAIN {sql}", tuple(args)))
            assert "Seq Scan" not in plan, plan
        assert "TEMP B-TREE FOR ORDER BY" not in plan or len(indexes) > 1, plan
        for index in indexes:
            assert index in plan, f"{query}: {plan}"
    # A write's lookup of its victims, to merge copies of one preemption (migration 2's index).
    names = ("job-7", "job-70", "job-700")
    if url.startswith("sqlite"):
        plan = "\n".join(r[3] for r in peek(url, f"EXPLAIN QUERY PLAN {victims_sql(3)}", names))
    else:
        plan = "\n".join(r[0] for r in peek(url, f"EXPLAIN {victims_sql(3)}", names))
    assert "preemptions_victim" in plan and "Seq Scan" not in plan, plan


def test_admission_decisions_share_the_audit_table_apart(store: SqlStore, url: str) -> None:
    """Issue 30: admission decisions are audit rows of kind "admission", by workload
    (`subject`); remediation's reads never see them, and a replayed row is one row."""
    remediation = AuditRow(NOW - 5, "n1", "decision", "act", "xid", "reboot", {"r": 1})
    decisions = [
        AuditRow(NOW - i, "n1", ADMISSION, "Retry", "unhealthy_node", "written", {"i": i}, w)
        for i, w in enumerate(["ns/a", "ns/b", "ns/a"])
    ]
    store.write([remediation, *decisions])
    store.write(decisions[:1])  # replayed: upserted by its digest

    def audit(**query: Any) -> list[dict[str, Any]]:
        return list(store.audit(AuditQuery(since=0, **query)).items)

    assert audit() == [{"r": 1}]
    assert audit(node="n1") == [{"r": 1}]
    assert audit(admission=True) == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert audit(admission=True, workload="ns/a") == [{"i": 0}, {"i": 2}]
    first = store.audit(AuditQuery(since=0, admission=True, limit=2))
    rest = store.audit(AuditQuery(since=0, admission=True, cursor=first.next_cursor))
    assert [*first.items, *rest.items] == audit(admission=True)
    assert count(url, "audit") == 4
    # a remediation row's digest is what it was before `subject` existed (migration 4)
    fields = {k: v for k, v in dataclasses.asdict(remediation).items() if k != "subject"}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode())
    assert peek(url, "SELECT digest, subject FROM audit WHERE kind = 'decision'") == [
        (digest.hexdigest(), "")
    ]


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("mysql://u@h/db", "unsupported scheme"),
        ("history.db", "unsupported scheme"),
        ("sqlite://host/history.db", "names no host"),
        ("sqlite://", "names no database file"),
        ("sqlite:///var/lib/", "names no database file"),
        ("sqlite:///x.db?mode=ro", "no parameters"),
        ("postgresql://u:hunter2@/db", "names no host"),
        ("postgresql://u@/db?password=hunter2", "names no host"),
        ("postgresql://u:hunter2@db.example:5432", "names no database"),
        ("postgresql://u:hunter2@db.example:54x2/db", "Port could not be cast"),
        ("postgresql://u:hunter2@db.example:99999/db", "out of range"),
        ("postgresql://u:hunter2@db.example:5432/a/b", "names no database"),
    ],
)
def test_malformed_urls_are_refused_naming_the_problem(bad: str, says: str) -> None:
    with pytest.raises(StoreUrlError, match=says) as raised:
        open_store(bad)
    assert "hunter2" not in str(raised.value)


def test_unreachable_postgres_is_unavailable_quickly() -> None:
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"PostgreSQL at .*unavailable") as raised:
        open_store(f"postgresql://topowatch:hunter2@127.0.0.1:{free_port()}/history")
    assert time.monotonic() - started < 5
    assert "hunter2" not in str(raised.value)
    assert "topowatch:***@127.0.0.1" in str(raised.value)


def test_a_postgres_outage_fails_writes_until_it_is_back(pg_server: PostgresServer) -> None:
    url = new_database(pg_server, "history")
    store = open_store(url)
    store.write([preemption(1, NOW)])
    pg_server.stop()
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            store.write([preemption(2, NOW)])
        with pytest.raises(StoreUnavailable):
            store.preemptions(PreemptionQuery(since=0))
        assert time.monotonic() - started < 15
    finally:
        pg_server.start()
    store.write([preemption(2, NOW)])  # a new connection to the restarted server
    assert len(store.preemptions(PreemptionQuery(since=0)).items) == 2
    # a connection that went stale while idle is replaced on its first use
    pg_server.stop()
    pg_server.start()
    store.write([preemption(3, NOW)])
    assert len(store.preemptions(PreemptionQuery(since=0)).items) == 3
    store.close()


def test_sqlite_disk_full_is_unavailable_and_rolled_back(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/history.db"
    store = open_store(url)
    store.write([preemption(1, NOW)])
    conn = store._conn  # the cap is a per-connection setting
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages + 2}")
    big = [preemption(i, NOW - i, document={"pad": "x" * 2_000}) for i in range(2, 200)]
    with pytest.raises(StoreUnavailable, match="full"):
        store.write(big)
    assert count(url, "preemptions") == 1  # all or nothing
    conn.execute("PRAGMA max_page_count = 1000000")  # space again: the same batch goes in
    store.write(big)
    assert count(url, "preemptions") == 199
    store.close()


def test_the_package_imports_and_runs_sqlite_without_psycopg(tmp_path: Path) -> None:
    script = f"""
import sys
sys.modules["psycopg"] = None  # as if not installed
from exporter.store.sqlstore import StoreUnavailable, open_store
open_store("sqlite:///{tmp_path}/h.db").close()
try:
    open_store("postgresql://u@127.0.0.1:5432/db")
except StoreUnavailable as exc:
    print(exc)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert "driver is not installed" in result.stdout


def copy(i: int, t: float, key: str, **overrides: Any) -> PreemptionRow:
    """A copy of preemption `i` as one writer's ledger entry `key` saw it at time `t`."""
    return preemption(i, t, key=key, **overrides)


# Each row: what was stored, what arrives, and what a reader must see. The rule is the ledger's
# (exporter/cluster/ledger.py `_same_preemption` / `_merge`): copies of one victim's preemption
# within SAME_PREEMPTION_WINDOW_S (10 s) naming no two preemptors are one preemption, with the
# earliest time, the first verdict unless "unknown", and "live" when either copy is.
MERGES = [
    pytest.param(
        [copy(1, NOW + 1, "a/7", verdict="unknown", observed="history")],
        [copy(1, NOW, "b/3", verdict="quota", observed="history")],
        [(NOW, "quota", "history", "a/7")],
        id="restart: the Event's earlier copy under a new key merges, an unknown verdict yields",
    ),
    pytest.param(
        [copy(1, NOW, "a/7", verdict="topology")],
        [copy(1, NOW + 2, "b/3", verdict="quota", observed="history")],
        [(NOW, "topology", "live", "a/7")],
        id="another writer's later copy keeps the first verdict and the live mark",
    ),
    pytest.param(
        [copy(1, NOW, "a/7", verdict="unknown")],
        [copy(1, NOW, "a/7", verdict="quota")],
        [(NOW, "quota", "live", "a/7")],
        id="the same key is the writer's newer view of its own entry: it replaces",
    ),
    pytest.param(
        [copy(1, NOW, "a/7", preemptor_uid="p-1")],
        [copy(1, NOW + 1, "b/3", preemptor_uid="p-2")],
        [(NOW + 1, "fair", "live", "b/3"), (NOW, "fair", "live", "a/7")],
        id="two preemptors within the window are two preemptions",
    ),
    pytest.param(
        [copy(1, NOW, "a/7")],
        [copy(1, NOW + 11, "b/3")],
        [(NOW + 11, "fair", "live", "b/3"), (NOW, "fair", "live", "a/7")],
        id="eleven seconds apart are two preemptions",
    ),
    pytest.param(
        [],
        [
            copy(1, NOW + 1, "a/7", preemptor_uid="", verdict="unknown"),
            copy(1, NOW, "b/3", verdict="quota"),
        ],
        [(NOW, "quota", "live", "a/7")],
        id="two copies in one batch: one row, the missing preemptor filled",
    ),
]


@pytest.mark.parametrize(("stored", "arriving", "expected"), MERGES)
def test_copies_of_one_preemption_are_one_row(
    store: SqlStore,
    url: str,
    stored: list[PreemptionRow],
    arriving: list[PreemptionRow],
    expected: list[tuple[float, str, str, str]],
) -> None:
    if stored:
        store.write(stored)
    store.write(arriving)
    store.write(arriving)  # a batch written twice changes nothing
    items = everything(store)
    keys = peek(url, "SELECT key FROM preemptions ORDER BY time DESC, id DESC")
    assert [(d["time"], d["verdict"], d["observed"]) for d in items] == [e[:3] for e in expected]
    assert [k for (k,) in keys] == [e[3] for e in expected]  # the first row's key stays
    assert all(d["preemptor_uid"] for d in items)  # a blank is filled from the other copy
