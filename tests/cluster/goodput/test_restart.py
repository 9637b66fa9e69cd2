"""A restart keeps the goodput ledger: interruptions, job totals, findings, GPU-seconds."""

from __future__ import annotations

from pathlib import Path

from exporter.cluster.goodput.attribution import SETTLE_S
from exporter.store.records import GoodputQuery
from exporter.store.sqlstore import SqlStore, open_store
from tests.cluster.goodput.harness import NS, T0, World, xid79


def restored(store: SqlStore) -> World:
    w = World()
    bad = w.book.restore(
        store.goodput_all("interruption"),
        store.goodput_all("job"),
        store.goodput_all("finding"),
        store.goodput_all("ledger"),
    )
    assert bad == 0
    return w


def test_a_restart_keeps_the_ledger_and_counts_nothing_twice(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'history.db'}")
    w = World()
    w.node("a")
    w.node("b")
    w.run_job("train", ["a", "b"])
    w.at(T0 + 100).node("a", findings=[xid79(T0 + 100)])
    w.delete_pod("train-0")
    w.delete_pod("train-1")
    w.at(T0 + 200)
    w.pod("train-2", "a", "train", "train")
    w.pod("train-3", "b", "train", "train")
    w.book.tick(T0 + 100 + SETTLE_S)
    store.write(w.book.dirty_rows(T0 + 300))
    before = w.book.job_goodput(NS, "train", T0 + 300)
    assert before is not None
    ledger_before = w.book.gpu_seconds(T0 + 300)
    # the process stops at T0 + 300; a new one starts at T0 + 400 and re-lists
    again = restored(store)
    again.at(T0 + 400)
    for name in ("a", "b"):
        again.apply("Node", w.nodes[name])
    again.workload("train", 2, created=T0)
    again.pod("train-2", "a", "train", "train")
    again.pod("train-3", "b", "train", "train")
    (entry,) = again.entries("train")
    assert (entry.cause, entry.component, entry.resumed_at) == ("node_fault", "gpu", T0 + 200)
    after = again.book.job_goodput(NS, "train", T0 + 500)
    assert after is not None
    assert after.phase == "running"
    assert after.seconds["unobserved"] == 100  # T0 + 300 .. T0 + 400: nobody watched
    assert after.seconds["running"] == before.seconds["running"] + 100
    assert after.first_admitted == T0
    assert after.interruptions == 1
    assert again.book.reliability_book.incidents("a")[0].time == T0 + 100
    ledger_after = again.book.gpu_seconds(T0 + 500)
    assert ledger_after.residual_ms() == 0
    assert ledger_after.capacity_ms == ledger_before.capacity_ms + 16 * 100 * 1000
    # writing again changes nothing: rows are upserts by key
    store.write(again.book.dirty_rows(T0 + 500))
    store.write(again.book.dirty_rows(T0 + 500))
    page = store.goodput(GoodputQuery("interruption", namespace=NS))
    assert len(page.items) == 1
    store.close()


def test_unreadable_documents_are_skipped_and_counted() -> None:
    w = World()
    bad = w.book.restore([{"id": ""}, {"nonsense": 1}], [{"kind": "Job"}], [{}], [{"x": 1}])
    assert bad == 5
