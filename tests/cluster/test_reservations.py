"""The reservation book: which Workloads held quota at a past moment (exporter/cluster/
reservations.py), in the same second as a preemption too."""

from __future__ import annotations

from typing import Any

from exporter.cluster.parse.kueue import parse_workload
from exporter.cluster.reservations import ReservationBook
from exporter.sim import synthetic as s
from tests.crds import assert_valid_kueue

T = 1_795_000_000.0


def _workload(
    name: str, *, finished: float | None = None, evicted: float | None = None
) -> dict[str, Any]:
    conditions = s.admitted_conditions("a-cq", T - 100)
    if finished is not None:
        conditions.append(s.condition("Finished", "True", "Succeeded", "done", finished))
    if evicted is not None:
        conditions = [
            s.condition("QuotaReserved", "False", "Preempted", "Preempted", evicted),
            *s.preempted_conditions(
                "Preempted to accommodate a workload", "InClusterQueue", evicted
            ),
        ]
    obj = s.workload(
        "a",
        name,
        1,
        8,
        T - 200,
        conditions=conditions,
        cluster_queue="a-cq" if evicted is None else "",
        assignment=[(("n1",), 1)] if evicted is None else [],
    )
    assert_valid_kueue(obj)
    return obj


def test_a_release_written_before_the_victims_eviction_was_gone_when_kueue_decided() -> None:
    """`done` finished at T and `victim` was evicted at T, in that order on the Workload
    watch: Kueue's cycle at T saw `done`'s quota free. Without the victim's order (no
    `written_before`) a same-second release still counts as held, as before."""
    book = ReservationBook()
    for name in ("done", "victim", "other"):
        book.observe(parse_workload(_workload(name)), T - 50)
    held = book.held_at(T)
    assert {r.workload.name for r in held if r.workload} == {"done", "victim", "other"}
    assert all(r.workload and r.workload.placements for r in held)  # the assignment kept
    book.observe(parse_workload(_workload("done", finished=T)), T)
    book.observe(parse_workload(_workload("victim", evicted=T)), T)
    first = book.release_seq(("a", "victim"), T)
    assert first is not None
    names = {r.workload.name for r in book.held_at(T, written_before=first) if r.workload}
    assert names == {"victim", "other"}
    assert {r.workload.name for r in book.held_at(T) if r.workload} == {"done", "victim", "other"}
    # the victim's assignment is remembered after Kueue cleared status.admission
    (kept,) = [
        r
        for r in book.held_at(T, written_before=first)
        if r.workload and r.workload.name == "victim"
    ]
    assert kept.workload is not None and kept.workload.placements
