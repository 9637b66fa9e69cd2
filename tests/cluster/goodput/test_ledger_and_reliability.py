"""The GPU-second ledger adds up exactly; reliability counts incidents, MTBF, repeat offenders."""

from __future__ import annotations

import random

from exporter.cluster.goodput.gpu_seconds import GpuSecondLedger
from exporter.cluster.goodput.reliability import repeat_offender
from exporter.sim import synthetic as syn
from tests.cluster.goodput.harness import NS, T0, World, finding, xid79


def test_every_gpu_second_is_in_exactly_one_category() -> None:
    w = World()
    for name in ("a", "b", "c", "d"):
        w.node(name)
    w.run_job("run", ["a"])  # running: 8
    w.run_job("start", ["b"], ready=False)  # restarting: 8
    w.at(T0 + 60).node("c", health="UnschedulablePendingReboot")  # unavailable:remediation
    w.at(T0 + 90).node("d", findings=[xid79(T0 + 90)])  # unavailable:finding
    pending = syn.condition("QuotaReserved", "False", "Pending", syn.quota_message(8), T0)
    w.workload("waits", 1, admitted=False, conditions=[pending])
    w.at(T0 + 120).node("c")
    w.delete_pod("run-0")
    totals = w.book.gpu_seconds(T0 + 600)
    assert totals.residual_ms() == 0
    assert totals.capacity_ms == 4 * 8 * 600 * 1000
    assert totals.seconds("running") == 8 * 120
    assert totals.seconds("restarting") == 8 * 600
    assert totals.seconds("unavailable:remediation") == 8 * 60
    assert totals.seconds("unavailable:finding") == 8 * 510
    by_team = totals.by("team")
    assert by_team["llm"]["running"] == 8 * 120
    quota = totals.idle_reasons[("ml.p5.48xlarge", "quota")]
    assert quota == 8 * (600 - 120) * 1000  # 8 GPUs wait for quota once c is back


def test_the_ledger_is_exact_under_random_churn() -> None:
    rng = random.Random(7)
    ledger = GpuSecondLedger()
    now = T0 + 0.125
    categories = ("running", "restarting", "absorbed")
    pods: dict[str, list[tuple[tuple[str, str], int]]] = {}
    for _ in range(5000):
        now += rng.choice((0.001, 0.37, 1.0, 3.3, 17.0))
        node = f"n{rng.randrange(20)}"
        if rng.random() < 0.02:
            ledger.remove_node(node, now)
            continue
        if rng.random() < 0.2:
            ledger.set_demand(
                rng.randrange(5), "f", rng.choice(("claimable", "topology", "quota")), 8, now
            )
            continue
        if rng.random() < 0.3:
            why = rng.choice(("", "", "cordoned", "finding"))
            ledger.set_node(node, rng.choice(("f", "g")), f"d{rng.randrange(3)}", 8, why, now)
            continue
        slots = [(team, cat) for team in ("t1", "t2") for cat in categories]
        held = pods.setdefault(node, [])
        if held and rng.random() < 0.5:
            slot, gpus = held.pop(rng.randrange(len(held)))
            new = rng.choice([*slots, None])
            ledger.move(node, slot, new, gpus, now)
            if new is not None:
                held.append((new, gpus))
        else:
            slot, gpus = rng.choice(slots), rng.randrange(1, 5)
            ledger.move(node, None, slot, gpus, now)
            held.append((slot, gpus))
    totals = ledger.totals(now + 10)
    assert totals.residual_ms() == 0
    assert totals.capacity_ms > 0


def test_repeat_offenders_mtbf_and_rates() -> None:
    day = 86_400.0
    w = World()
    w.node("a")
    w.node("b")
    first = [xid79(T0 + 100)]
    w.at(T0 + 100).node("a", findings=first)
    # the same fault, a second finding seconds later: one incident
    both = [*first, finding("gpu_missing", "gpu3", T0 + 105, "fatal", "replace")]
    w.at(T0 + 105).node("a", findings=both)
    assert not w.book.is_repeat_offender("a", T0 + 200)
    again = [finding("ecc_uncorrectable", "gpu1", T0 + 3 * day, "critical", "reboot")]
    w.at(T0 + 3 * day).node("a", findings=again)
    # software faults and warnings with no action are not hardware incidents
    w.node("b", findings=[finding("xid_app_repeat", "gpu0", T0 + 3 * day, "critical", "none")])
    assert w.book.is_repeat_offender("a", T0 + 3 * day)
    assert not w.book.is_repeat_offender("b", T0 + 3 * day)
    assert not w.book.is_repeat_offender("a", T0 + 11 * day)  # out of the 7-day window
    (offender,) = w.book.repeat_offenders(T0 + 3 * day)
    assert (offender.node, offender.incidents) == ("a", 2)
    assert offender.components == ("gpu", "hbm")
    summary = w.book.reliability(T0 + 4 * day)
    assert abs(summary.node_days - 8.0) < 1e-6
    by_node = {m.name: m for m in summary.mtbf["node"]}
    assert by_node["a"].incidents == 2 and by_node["a"].mtbf_hours == 48.0
    assert by_node["b"].mtbf_hours is None
    (domain,) = summary.mtbf["domain"]
    assert domain.name == "nn-3a" and domain.incidents == 2
    assert repeat_offender([1.0, 2.0], 3.0, findings=3) is False


def test_interruptions_per_thousand_node_days() -> None:
    w = World()
    w.node("a")
    w.run_job("job", ["a"])
    w.at(T0 + 100).node("a", findings=[xid79(T0 + 100)])
    w.delete_pod("job-0")
    w.at(T0 + 400)
    w.book.tick(T0 + 400)
    summary = w.book.reliability(T0 + 86_400)
    assert summary.interruptions_by_component["gpu"] == 1
    assert abs(summary.interruptions_per_1000_node_days["gpu"] - 1000.0) < 1e-6
    assert w.book.interruptions(cause="node_fault")[0].namespace == NS
