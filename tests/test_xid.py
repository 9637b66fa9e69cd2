"""XIDs are counted per event (a repeat is an increase), named and classed by the catalog."""

from __future__ import annotations

import csv

from exporter.node.xid import XidLedger, catalog, describe
from exporter.snapshot import XidEvent
from tests.conftest import reference


def test_repeated_xid_is_a_counter_increase_and_last_is_kept() -> None:
    ledger = XidLedger()
    ledger.record([XidEvent(3, "GPU-3", 79, 100.0)])
    ledger.record([XidEvent(3, "GPU-3", 79, 105.0), XidEvent(3, "GPU-3", 13, 104.0)])
    totals = ledger.totals()
    counts = {(c.gpu_index, c.xid): c.count for c in totals.counts}
    assert counts == {(3, 79): 2, (3, 13): 1}
    assert [(lx.xid, lx.timestamp) for lx in totals.last] == [(79, 105.0)]


def test_catalog_matches_reference_actions() -> None:
    assert describe(79).action == "RESTART_BM"
    assert describe(48).action == "WORKFLOW_XID_48"
    assert describe(13).action == "RESTART_APP"
    assert describe(119).severity == "FATAL"
    with reference("nvidia/xid-catalog.csv").open(newline="") as f:
        ref = {int(r["xid"]): r for r in csv.DictReader(f)}
    assert set(ref) == set(catalog())
    for code, row in ref.items():
        assert row["recommended_action"].startswith(catalog()[code].action)
        assert row["name"].startswith(catalog()[code].name)


def test_unknown_xid_is_reported_not_dropped() -> None:
    info = describe(4242)
    assert info.name == "XID_4242"
    assert info.action == "UNKNOWN"
