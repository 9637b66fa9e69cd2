"""How fast the history store pages through a month of preemptions, on SQLite and PostgreSQL.

Inserts --rows preemptions (default 1,000,000) spread over --days (30) through the store's own
write path (batches of 10,000 rows, one transaction each: the bulk path the history writer
uses, which first looks up each batch's victims to merge copies of one preemption), then pages
newest first, 100 a page, through the whole 30-day window and through the same window filtered
by namespace, by verdict, by both, and by cluster queue (the victim's or the preemptor's),
printing p50/p99/max milliseconds per page. The target is 100 ms a page at p99.

PostgreSQL is a throwaway server from tests/postgres_harness.py (its default, durable settings);
SQLite a file in a temp dir. On PostgreSQL the fill runs ANALYZE every 100,000 rows, as after any
bulk load: a table grown a hundredfold since autovacuum last sampled it has statistics that send
the victims' lookup to a sequential scan (in service, rows arrive slowly and autovacuum keeps up).
Run from the repository root:

    python benchmarks/history_store.py                  # both, 1M rows: a few minutes
    python benchmarks/history_store.py --rows 50000     # a smoke run
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from exporter.store.records import PreemptionQuery, PreemptionRow
from exporter.store.sqlstore import SqlStore, open_store
from tests.postgres_harness import postgres_server

DAY = 86_400.0
NAMESPACES = [f"team-{n:02d}" for n in range(20)]
QUEUES = [f"cq-{n}" for n in range(8)]
VERDICTS = ["fair"] * 7 + ["unfair"] * 2 + ["unknown"]
REASONS = ["InClusterQueue", "InCohortReclamation", "InCohortFairSharing", "Unknown"]
BATCH = 10_000


def rows(count: int, now: float, days: float, seed: int = 7) -> Iterator[PreemptionRow]:
    rng = random.Random(seed)
    for i in range(count):
        t = now - rng.random() * days * DAY
        fields: dict[str, Any] = {
            "key": f"victim-{i}/preemptor-{i % 997}/{int(t)}",
            "time": t,
            "victim_namespace": rng.choice(NAMESPACES),
            "victim_name": f"train-{i}",
            "victim_uid": f"{i:08x}-0000-4000-8000-000000000000",
            "victim_cluster_queue": rng.choice(QUEUES),
            "preemptor_namespace": rng.choice(NAMESPACES),
            "preemptor_name": f"prod-{i % 997}",
            "preemptor_uid": f"{i % 997:08x}-1111-4000-8000-000000000000",
            "preemptor_cluster_queue": rng.choice(QUEUES),
            "reason": rng.choice(REASONS),
            "verdict": rng.choice(VERDICTS),
            "gpus_freed": rng.choice([8, 16, 32, 64]),
            "observed": "live",
        }
        document = {
            **fields,
            "verdict_detail": "the preemptor's queue was below its nominal quota",
            "message": "Preempted to accommodate a workload (UID: ...) due to reclamation",
            "source": "condition",
            "victim_priority": 100,
            "preemptor_priority": 1000,
        }
        yield PreemptionRow(document=document, **fields)


def fill(store: SqlStore, count: int, now: float, days: float, url: str) -> float:
    """Rows per second written."""
    started = time.perf_counter()
    batch: list[PreemptionRow] = []
    for n, row in enumerate(rows(count, now, days), start=1):
        batch.append(row)
        if len(batch) == BATCH:
            store.write(batch)
            batch = []
        if url.startswith("postgresql") and n % 100_000 == 0:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("ANALYZE preemptions")
    if batch:
        store.write(batch)
    return count / (time.perf_counter() - started)


def page_through(
    store: SqlStore, query: PreemptionQuery, max_pages: int
) -> tuple[int, list[float]]:
    """(rows seen, milliseconds per page)."""
    seen, timings, cursor = 0, [], None
    for _ in range(max_pages):
        started = time.perf_counter()
        page = store.preemptions(
            PreemptionQuery(
                since=query.since,
                namespace=query.namespace,
                queue=query.queue,
                verdict=query.verdict,
                cursor=cursor,
            )
        )
        timings.append((time.perf_counter() - started) * 1000)
        seen += len(page.items)
        cursor = page.next_cursor
        if cursor is None:
            break
    return seen, timings


def run(name: str, url: str, args: argparse.Namespace) -> None:
    now = time.time()
    store = open_store(url)
    rate = fill(store, args.rows, now, args.days, url)
    print(f"{name}: inserted {args.rows:,} rows at {rate:,.0f} rows/s", flush=True)
    since = now - args.days * DAY
    queries = {
        "30 days": PreemptionQuery(since=since),
        "namespace": PreemptionQuery(since=since, namespace=NAMESPACES[3]),
        "verdict=unfair": PreemptionQuery(since=since, verdict="unfair"),
        "namespace+verdict": PreemptionQuery(
            since=since, namespace=NAMESPACES[3], verdict="unfair"
        ),
        "queue (either)": PreemptionQuery(since=since, queue=QUEUES[5]),
    }
    print(f"  {'query':<18} {'rows':>9} {'pages':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}")
    for label, query in queries.items():
        seen, timings = page_through(store, query, args.max_pages)
        p50 = statistics.median(timings)
        p99 = (
            statistics.quantiles(timings, n=100, method="inclusive")[98]
            if len(timings) > 1
            else timings[0]
        )
        print(
            f"  {label:<18} {seen:>9,} {len(timings):>6} {p50:>7.2f} {p99:>7.2f}"
            f" {max(timings):>7.2f}",
            flush=True,
        )
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--max-pages", type=int, default=20_000, help="per query")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    args = parser.parse_args()
    if args.backend in ("sqlite", "both"):
        with tempfile.TemporaryDirectory(prefix="topowatch-bench-") as tmp:
            run("SQLite", f"sqlite:///{tmp}/history.db", args)
    if args.backend in ("postgresql", "both"):
        with postgres_server() as server:
            run("PostgreSQL", server.url(), args)


if __name__ == "__main__":
    main()
