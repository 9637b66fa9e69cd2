"""The GPU-second ledger adds up exactly; reliability counts incidents, MTBF, repeat offenders."""

from __future__ import annotations

import copy
import random
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import pytest

from exporter.cluster.elastic.idle import DemandCause, split
from exporter.cluster.goodput.gpu_seconds import GpuSecondLedger, GpuSecondTotals
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


Slot = tuple[str, str]


@dataclass
class _NaiveNode:
    flavor: str = ""
    domain: str = ""
    allocatable: int = 0
    unavailable: str = ""
    held: dict[Slot, int] = field(default_factory=dict)


class NaiveLedger:
    """The ledger's definitions, recounted from every node at every change: each piece of
    time between two changes is given, node by node, to what each GPU was during it (its
    capacity is max(allocatable, held); what is not held is idle, or unavailable with the
    node's reason), and each flavor's idle GPUs are split by its demand with `split`. No
    cells, no derivation, no short ways: what `GpuSecondLedger` must agree with."""

    def __init__(self) -> None:
        self.nodes: dict[str, _NaiveNode] = {}
        self.demand: dict[Hashable, tuple[str, DemandCause, int]] = {}
        self.ms = 0
        self.capacity: dict[tuple[str, str], int] = {}
        self.parts: dict[tuple[str, str, str, str], int] = {}
        self.reasons: dict[tuple[str, str], int] = {}

    def _upto(self, now: float) -> None:
        ms = max(self.ms, round(now * 1000))
        dt, self.ms = ms - self.ms, ms
        if not dt:
            return
        idle: dict[str, int] = {}
        for node in self.nodes.values():
            used = sum(node.held.values())
            capacity = max(node.allocatable, used)
            place = (node.flavor, node.domain)
            _put(self.capacity, place, capacity * dt)
            for (team, category), gpus in node.held.items():
                _put(self.parts, (*place, team, category), gpus * dt)
            free = f"unavailable:{node.unavailable}" if node.unavailable else "idle"
            _put(self.parts, (*place, "", free), (capacity - used) * dt)
            if not node.unavailable:
                idle[node.flavor] = idle.get(node.flavor, 0) + capacity - used
        for flavor, count in idle.items():
            wanted: dict[str, int] = {}
            for f, cause, gpus in self.demand.values():
                if f == flavor:
                    wanted[cause] = wanted.get(cause, 0) + gpus
            reasons = ("claimable", "topology", "quota", "no_demand")
            for reason, share in zip(reasons, split(count, wanted), strict=True):
                _put(self.reasons, (flavor, reason), share * dt)

    def set_node(self, name: str, f: str, d: str, alloc: int, why: str, now: float) -> None:
        self._upto(now)
        node = self.nodes.setdefault(name, _NaiveNode())
        node.flavor, node.domain, node.allocatable, node.unavailable = f, d, max(0, alloc), why

    def remove_node(self, name: str, now: float) -> None:
        self._upto(now)
        node = self.nodes.get(name)
        if node is not None:
            node.allocatable, node.unavailable = 0, ""
            if not node.held:
                del self.nodes[name]

    def move(self, name: str, old: Slot | None, new: Slot | None, gpus: int, now: float) -> None:
        self._upto(now)
        held = self.nodes.setdefault(name, _NaiveNode()).held
        if old is not None:
            held[old] -= gpus
            if not held[old]:
                del held[old]
        if new is not None:
            held[new] = held.get(new, 0) + gpus

    def set_demand(self, key: int, f: str, cause: DemandCause, gpus: int, now: float) -> None:
        self._upto(now)
        self.demand[key] = (f, cause, gpus)

    def remove_demand(self, key: int, now: float) -> None:
        self._upto(now)
        self.demand.pop(key, None)

    def totals(self, now: float) -> GpuSecondTotals:
        """As of `now`, which a read does not make the latest moment (the ledger's doesn't)."""
        read = copy.deepcopy(self)
        read._upto(now)
        return GpuSecondTotals(
            {k: v for k, v in read.capacity.items() if v},
            {k: v for k, v in read.parts.items() if v},
            {k: v for k, v in read.reasons.items() if v},
        )


def _put(into: dict[Any, int], key: Any, value: int) -> None:
    into[key] = into.get(key, 0) + value


@pytest.mark.parametrize("seed", range(6))
def test_the_ledger_agrees_with_a_naive_recount(seed: int) -> None:
    """Random churn (nodes re-placed, cordoned, filled past their allocatable, removed; pods
    held, re-slotted, bound anew; demand coming and going), with bursts in one millisecond:
    every total, idle reason and count as the naive recount has them, at random reads."""
    rng = random.Random(seed)
    fast, naive = GpuSecondLedger(), NaiveLedger()
    now = T0 + 0.25
    slots: list[Slot] = [(t, c) for t in ("t1", "t2") for c in ("running", "absorbed")]
    pods: list[tuple[str, Slot, int]] = []
    nodes = [f"n{i}" for i in range(8)]
    for _ in range(3000):
        if rng.random() < 0.4:
            now += rng.choice((0.0004, 0.001, 0.3, 2.0, 30.0))
        node, roll = rng.choice(nodes), rng.random()
        if roll < 0.02:
            fast.remove_node(node, now)
            naive.remove_node(node, now)
        elif roll < 0.1:
            key, gpus = rng.randrange(5), rng.choice((0, 2, 8, 24))
            cause: DemandCause = rng.choice(("claimable", "topology", "quota"))
            flavor = rng.choice("fg")
            if rng.random() < 0.25:
                fast.remove_demand(key, now)
                naive.remove_demand(key, now)
            else:
                fast.set_demand(key, flavor, cause, gpus, now)
                naive.set_demand(key, flavor, cause, gpus, now)
        elif roll < 0.22:
            state = (rng.choice("fg"), f"d{rng.randrange(2)}", rng.choice((0, 4, 8, 16)))
            why = rng.choice(("", "", "cordoned", "finding"))
            fast.set_node(node, *state, why, now)
            naive.set_node(node, *state, why, now)
        elif roll < 0.55 and pods:
            index = rng.randrange(len(pods))
            source, slot, gpus = pods[index]
            if rng.random() < 0.5:  # bound anew
                fast.transfer(source, node, slot, gpus, round(now * 1000))
                naive.move(source, slot, None, gpus, now)
                naive.move(node, None, slot, gpus, now)
                pods[index] = (node, slot, gpus)
            else:  # re-slotted, or gone
                new = rng.choice([*slots, None])
                fast.move(source, slot, new, gpus, now)
                naive.move(source, slot, new, gpus, now)
                if new is None:
                    pods.pop(index)
                else:
                    pods[index] = (source, new, gpus)
        elif len(pods) < 12:  # (more would fill every node past its allocatable for good)
            slot, gpus = rng.choice(slots), rng.choice((1, 4, 8))
            fast.move(node, None, slot, gpus, now)
            naive.move(node, None, slot, gpus, now)
            pods.append((node, slot, gpus))
        if rng.random() < 0.02:
            later = now + rng.choice((0.0, 0.001, 5.0))
            assert fast.totals(later).as_dict() == naive.totals(later).as_dict()
    end = fast.totals(now + 60)
    assert end.as_dict() == naive.totals(now + 60).as_dict()
    assert end.residual_ms() == 0
    assert end.idle_reasons and any(k[1] != "no_demand" for k in end.idle_reasons)
    categories = {k[3] for k in end.parts}
    assert {"idle", "unavailable:cordoned", "unavailable:finding"} <= categories
    held = {c for k, v in end.parts.items() for c in (k[3],) if k[2]}
    assert held == {"running", "absorbed"}


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
