"""Health-gated admission over a simulated day (issue 30): workloads admitted onto a node with
an actionable finding, with topowatch's `topowatch.io/node-health` check off and on.

The same simulated day (same seed, same shape, same fault draw) runs twice, in-process:

- OFF: the ClusterQueues list no admission check; Kueue admits as soon as quota is reserved.
- ON: the ClusterQueues list `topowatch-node-health` (exporter/sim/kueue/checks.py); a
  reserved workload waits with the check Pending. topowatch's cluster service (a
  `ClusterService` over a fresh `ClusterModel`, with an `AdmissionController` in enforce mode)
  sees only the API objects, delivered as informers would, judges each reserved workload
  after every simulated step (`admission_cycle`) and merge-patches the Workload's
  status.admissionChecks back into the simulated API server (Ready admits; Retry releases
  quota and Kueue requeues it with its backoff).

Faults come from exporter/sim/node_faults.py (Meta's published rate and mix, times --scale
for a demo: at 1x a 34-node cluster sees ~0.1 faults a day); each puts an actionable finding
in the node agent, which writes it to the node's topowatch.io/findings annotation after a
report delay; HyperPod repairs the node later and the finding is cleared.

Ground truth, from the simulator's own state at the step the workload was admitted: the
workload's placement (its quota holding) and, for each node, whether an actionable finding
existed (annotated, or found by the agent but not yet reported: `pending report`), or the
node was being repaired. A bad admission with the check on is classified by why the check
let it through: the finding was not yet on the annotation at the decision (a race floor: a
check can only judge what has been reported), or the fault arrived between the Ready
decision and Kueue's admission, or neither (a real miss: printed in full).

    .venv/bin/python benchmarks/admission_day.py [--seed 0] [--hours 24] [--quick]

A benchmark: it prints figures and never fails.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._inprocess import Informers, StoreWriter
from exporter.cluster.admission.audit import AdmissionAudit
from exporter.cluster.admission.controller import AdmissionController
from exporter.cluster.admission.decide import Decision as CheckDecision
from exporter.cluster.admission.settings import AdmissionSettings
from exporter.cluster.informers import WATCHED
from exporter.cluster.model import ClusterModel
from exporter.cluster.service import ClusterService
from exporter.sim.cluster import ClusterShape, SimulatedCluster
from exporter.sim.kubeapi.store import ObjectStore
from exporter.sim.kueue.checks import AdmissionChecks
from exporter.sim.node_faults import FaultRates

START = 1_795_000_000.0
REQUIRED_KINDS = tuple(w.kind for w in WATCHED if not w.optional)
TEAMS = ("llm", "vision", "research")


def shape(quick: bool) -> ClusterShape:
    return ClusterShape(
        p5_nodes=16,
        ultraserver_nodes=18,
        teams=TEAMS,
        arrivals_per_minute=0.2 if quick else 0.3,
        initial_workloads=4,
        elastic_hyperpod_jobs=0,
        elastic_batch_jobs=0,
    )


class RecordingAudit(AdmissionAudit):
    """The audit, also keeping every decision with its judging time."""

    def __init__(self) -> None:
        super().__init__()
        self.all: list[tuple[CheckDecision, str, float]] = []

    def record(self, decision: CheckDecision, mode: str, written: str, seconds: float) -> bool:
        self.all.append((decision, written, seconds))
        return super().record(decision, mode, written, seconds)


@dataclass
class Bad:
    workload: str
    at: float
    nodes: dict[str, str]  # node -> what was wrong (truth)
    why: str = ""  # with the check on: why it got through


@dataclass
class Result:
    check: bool
    admissions: int = 0
    bad: list[Bad] = field(default_factory=list)
    retries: int = 0
    retry_waits: list[float] = field(default_factory=list)  # Retry -> next reservation, s
    decisions: int = 0
    by_state: Counter[str] = field(default_factory=Counter)
    decision_s: list[float] = field(default_factory=list)
    faults: int = 0
    fault_kinds: Counter[str] = field(default_factory=Counter)
    finished: int = 0
    seconds: float = 0.0


class Day:
    def __init__(self, seed: int, check: bool, scale: float, step_s: float, quick: bool) -> None:
        self.now = START
        self.step_s = step_s
        self.check = check
        self.store = ObjectStore(clock=lambda: self.now)
        self.cluster = SimulatedCluster(
            self.store,
            shape(quick),
            seed=seed,
            start=START,
            elastic=False,
            faults=FaultRates(scale=scale),
            admission_checks=AdmissionChecks() if check else None,
        )
        self.audit = RecordingAudit()
        self.writer = StoreWriter(self.store)
        admission = None
        if check:
            settings = AdmissionSettings(enabled=True, mode="enforce")
            admission = AdmissionController(settings, self.writer, self.audit)
        model = ClusterModel()
        self.service = ClusterService(model=model, clock=lambda: self.now, admission=admission)
        model.expect_lists(REQUIRED_KINDS, self.now)
        self.informers = Informers(self.store, random.Random(f"admission-day-{seed}"))
        self.seen = 0  # sim decisions examined
        self.ready_at: dict[str, float] = {}  # workload -> its last Ready decision
        self.retry_at: dict[str, float] = {}  # workload -> its last Retry written

    # ground truth ------------------------------------------------------------------------

    def node_truth(self) -> dict[str, str]:
        """Each node with an actionable finding now (the simulator's own state)."""
        c: Any = self.cluster
        out: dict[str, str] = {}
        for node, found in c._findings.items():
            live = [f for f in found if f.get("actionable")]
            if live:
                out[node] = "annotated: " + ", ".join(
                    f"{f['check']} {f['component']} action={f['action']}" for f in live
                )
        for node, found in c._reports.items():
            live = [f for f in found if f.get("actionable")]
            if live and node not in out:
                out[node] = "pending report: " + ", ".join(
                    f"{f['check']} {f['component']} action={f['action']}" for f in live
                )
        for node in c._repairing | c._down:
            out.setdefault(node, "under repair")
        return out

    def placed(self, key: str) -> set[str]:
        holding = self.cluster._state.holdings.get(key)  # type: ignore[attr-defined]
        if holding is None:
            return set()
        return {node for ps in holding.sets() for node, _ in ps.placement}

    def visible(self) -> dict[str, bool]:
        """Nodes whose actionable findings the controller saw (its parsed annotations)."""
        adm = self.service.admission
        if adm is None:
            return {}
        return {n: any(f.actionable for f in fs) for n, fs in adm._findings.items()}

    # the day -------------------------------------------------------------------------------

    def run(self, hours: float) -> Result:
        res = Result(self.check)
        started = time.perf_counter()
        self.cluster.bootstrap()
        self.informers.relist(self.service)
        end = START + hours * 3600.0
        while self.now < end:
            self.now += self.step_s
            before = self.node_truth()
            self.cluster.step(self.now)
            after = self.node_truth()
            self.examine(res, before, after)
            self.informers.deliver(self.service)
            if self.check:
                n0 = len(self.audit.all)
                self.service.admission_cycle()
                for decision, written, seconds in self.audit.all[n0:]:
                    if not decision.state:
                        continue
                    key = f"{decision.namespace}/{decision.name}"
                    res.decisions += 1
                    res.by_state[decision.state] += 1
                    res.decision_s.append(seconds)
                    if written != "written":
                        continue
                    if decision.state == "Ready":
                        self.ready_at[key] = self.now
                    elif decision.state == "Retry":
                        res.retries += 1
                        self.retry_at[key] = self.now
        assert self.cluster.truth is not None
        res.faults = len(self.cluster.truth.faults)
        res.fault_kinds = Counter(k for _, _, k in self.cluster.truth.faults)
        res.seconds = time.perf_counter() - started
        return res

    def examine(self, res: Result, before: dict[str, str], after: dict[str, str]) -> None:
        log = self.cluster.decisions.decisions
        new, self.seen = log[self.seen :], len(log)
        for d in new:
            if d.kind == "reserved" and d.workload in self.retry_at:
                res.retry_waits.append(d.time - self.retry_at.pop(d.workload))
            if d.kind != "admitted":
                continue
            res.admissions += 1
            nodes = self.placed(d.workload)
            # Bad at admission: bad after the step (a fault that struck during the step
            # counts against us; conservative) and among its nodes.
            hit = {n: after[n] for n in sorted(nodes) if n in after}
            if not hit:
                continue
            truth = self.cluster.truth
            assert truth is not None
            for n in hit:  # the latest fault on the node, relative to the admission
                last = max((t for t, node, _ in truth.faults if node == n), default=None)
                if last is not None:
                    hit[n] += f", fault {last - d.time:+.0f}s from admission"
            bad = Bad(d.workload, d.time, hit)
            if self.check:
                bad.why = self.why(d.workload, hit, before)
            res.bad.append(bad)

    def why(self, workload: str, hit: dict[str, str], before: dict[str, str]) -> str:
        ready = self.ready_at.get(workload)
        new = [n for n in hit if n not in before]
        if new:
            return f"race: fault struck after Ready at {ready} (during the admitting step)"
        if all(h.startswith("pending report") for h in hit.values()):
            return "race: finding found by the agent but not yet on the annotation"
        if all(h == "under repair" for h in hit.values()):
            return "node under repair (no finding on it): not the check's to see"
        if all("action=none" in h for h in hit.values()):
            return (
                "action none: the finding asks for no action (XID 13 RESTART_APP: the"
                " application's error, the node is fine), so the check rightly lets it run"
            )
        seen = self.visible()
        if not any(seen.get(n) for n in hit):
            return "race: annotation written after the Ready decision (check saw it clean)"
        return "MISS: the check saw the finding and still answered Ready (or no answer)"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--quick", action="store_true", help="6 simulated hours, smaller load")
    parser.add_argument("--scale", type=float, default=400.0, help="x Meta's fault rate")
    parser.add_argument("--step", type=float, default=30.0, help="simulated seconds a step")
    args = parser.parse_args(argv)
    hours = min(args.hours, 6.0) if args.quick else args.hours
    off = Day(args.seed, False, args.scale, args.step, args.quick).run(hours)
    on = Day(args.seed, True, args.scale, args.step, args.quick).run(hours)
    print(
        f"admission_day: seed {args.seed}, {hours:g} simulated hours, step {args.step:g}s,"
        f" faults at {args.scale:g} x Meta's published rate"
    )
    rows = [
        ("faults drawn", lambda r: f"{r.faults}"),
        ("admissions", lambda r: f"{r.admissions}"),
        ("admitted onto a bad node", lambda r: f"{len(r.bad)}"),
        (
            "  excl. action=none findings",
            lambda r: (
                f"{sum(1 for b in r.bad if any('action=none' not in v for v in b.nodes.values()))}"
            ),
        ),
        (
            "  missed (finding seen, answered Ready)",
            lambda r: f"{sum(1 for b in r.bad if b.why.startswith('MISS'))}" if r.check else "-",
        ),
        ("Retry written", lambda r: f"{r.retries}" if r.check else "-"),
        (
            "mean extra wait by Retry",
            lambda r: (
                f"{statistics.mean(r.retry_waits):.0f}s (n={len(r.retry_waits)})"
                if r.retry_waits
                else "-"
            ),
        ),
        ("decisions made", lambda r: f"{r.decisions} {dict(r.by_state)}" if r.check else "-"),
        (
            "decision time p50 / p99",
            lambda r: (
                f"{pct(r.decision_s, 0.5) * 1e3:.3f} / {pct(r.decision_s, 0.99) * 1e3:.3f} ms"
                if r.decision_s
                else "-"
            ),
        ),
        ("wall time", lambda r: f"{r.seconds:.1f}s"),
    ]
    print(f"{'':34} {'check OFF':>22} {'check ON':>40}")
    for label, fmt in rows:
        print(f"{label:34} {fmt(off):>22} {fmt(on):>40}")
    for name, r in (("OFF", off), ("ON", on)):
        if r.bad:
            print(f"\nbad admissions, check {name}:")
            for b in r.bad:
                nodes = "; ".join(f"{n} ({w})" for n, w in b.nodes.items())
                print(
                    f"  t+{b.at - START:7.0f}s {b.workload}: {nodes}"
                    + (f"\n    {b.why}" if b.why else "")
                )
    for name, r in (("OFF", off), ("ON", on)):
        print(f"\nfault kinds drawn, check {name}:", dict(r.fault_kinds.most_common()))
    if on.bad:
        print("\nwhy, check ON:", dict(Counter(b.why.split(":")[0] for b in on.bad)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
