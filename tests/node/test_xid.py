"""XIDs are counted per event (a repeat is an increase), named and classed by the catalog."""

from __future__ import annotations

import csv

from exporter.core.snapshot import PodRef, XidEvent
from exporter.core.xid import (
    RECOVERY_NAMES,
    XidLedger,
    catalog,
    describe,
    recovery_action_named,
)
from tests.conftest import reference


def test_repeated_xid_is_a_counter_increase_and_last_is_kept() -> None:
    ledger = XidLedger()
    ledger.record([XidEvent(3, "GPU-3", 79, 100.0)])
    ledger.record([XidEvent(3, "GPU-3", 79, 105.0), XidEvent(3, "GPU-3", 13, 104.0)])
    totals = ledger.totals()
    counts = {(c.gpu_index, c.xid): c.count for c in totals.counts}
    assert counts == {(3, 79): 2, (3, 13): 1}
    assert [(lx.xid, lx.timestamp) for lx in totals.last] == [(79, 105.0)]


def test_ledger_remembers_who_held_the_gpu_at_the_last_event_of_each_xid() -> None:
    """The holder changes with a new event of that XID only, never with the pod holding the GPU
    later; a late (older) event does not overwrite it."""
    trainer = PodRef("ns-a", "trainer-0", "pytorch")
    evaluator = PodRef("ns-b", "eval-0", "eval")
    ledger = XidLedger()
    ledger.record([XidEvent(3, "GPU-3", 79, 100.0)], {"GPU-3": trainer})
    ledger.record([], {"GPU-3": evaluator})  # the GPU changes hands: nothing about XIDs changes
    (c,) = ledger.totals().counts
    assert (c.count, c.last_timestamp, c.last_holder) == (1, 100.0, trainer)

    ledger.record(
        [XidEvent(3, "GPU-3", 79, 200.0), XidEvent(3, "GPU-3", 13, 201.0)], {"GPU-3": evaluator}
    )
    ledger.record([XidEvent(3, "GPU-3", 79, 150.0)], {"GPU-3": trainer})  # arrived late
    seen = {c.xid: (c.count, c.last_timestamp, c.last_holder) for c in ledger.totals().counts}
    assert seen == {79: (3, 200.0, evaluator), 13: (1, 201.0, evaluator)}

    idle = XidLedger()
    idle.record([XidEvent(7, "GPU-7", 79, 5.0)], {"GPU-3": trainer})  # GPU 7: no pod holds it
    idle.record([XidEvent(7, "GPU-7", 48, 6.0)])  # pods not read: none known
    assert {c.last_holder for c in idle.totals().counts} == {PodRef("", "", "")}


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


def test_xid_154_names_the_recovery_action_it_changed_to() -> None:
    """The driver's text, gpu.c gpuRefreshRecoveryAction: "GPU recovery action changed from
    0x%x (%s) to 0x%x (%s)", names from `_gpuRecoveryActionName`; nvml.h's values."""
    line = (
        "NVRM: Xid (PCI:0000:53:00): 154, GPU recovery action changed from 0x0 (None)"
        " to 0x{:x} ({})"
    )
    for value in (0, 1, 2, 3, 4, 5):
        assert recovery_action_named(line.format(value, RECOVERY_NAMES[value])) == value
    assert recovery_action_named("GPU recovery action changed to 0x2 (Node Reboot Required)") == 2
    assert recovery_action_named("NVRM: Xid (PCI:0000:53:00): 154") is None  # cut: names none
    assert recovery_action_named("GPU recovery action changed from 0x1 (GPU Reset") is None
    assert describe(154).action == "XID_154"
