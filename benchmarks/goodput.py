"""The goodput ledger against the simulator's ground truth: a simulated week, in-process.

The simulated cluster (exporter/sim/cluster.py) runs with node faults (exporter/sim/
node_faults.py): faults arrive at Meta's published rate and mix (Llama 3: 419 interruptions in
54 days on 2,048 nodes; faulty GPU 30 %, HBM 17 %, software 13 %, network 8 %, host
maintenance 8 %, SRAM 5 %, ...), scaled up for a demo, HyperPod marks and repairs or replaces
the nodes, its operator auto-resumes the jobs they stopped, and now and then it reboots a node
with a pending warning (a proactive remediation). Kueue preempts and jobs complete as usual.
The simulator records each interruption's true cause and each job's true running time.

The cluster service (a `ClusterService` over a fresh `ClusterModel`, its `GoodputBook`
attached) sees only the API objects, delivered as informers would (each kind's watch events in
order, the kinds interleaved at random), on the simulated clock. At the end it prints:

- cause attribution accuracy: each true interruption matched to the ledger's entry for the
  same job at the same time, right when the cause (and, for a node, the component) agree;
  entries the truth does not have are listed as spurious;
- ETTR error per job, in points, against the truth's running time over wall time;
- the GPU-second ledger's conservation residual (capacity x time minus every part), which must
  be 0, and its breakdown;
- the fleet's reliability as the ledger sees it.

    .venv/bin/python benchmarks/goodput.py [--days 7] [--seed 0] [--scale 400] [--step 30]

A benchmark: it prints figures and never fails (tests/sim/test_goodput_truth.py gates a short
run).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._inprocess import Informers
from exporter.cluster.goodput import CATEGORIES, GoodputBook, GoodputConfig, Interruption
from exporter.cluster.informers import WATCHED
from exporter.cluster.model import ClusterModel
from exporter.cluster.service import ClusterService
from exporter.sim.cluster import ClusterShape, SimulatedCluster
from exporter.sim.kubeapi.store import ObjectStore
from exporter.sim.node_faults import FaultRates, GroundTruth

START = 1_795_000_000.0
DAY = 86_400.0
REQUIRED_KINDS = tuple(w.kind for w in WATCHED if not w.optional)
TEAMS = ("llm", "vision", "research")
MATCH_S = 1.0  # a ledger entry this close to the truth's time (same job) is its record
LONG_JOBS = 8  # long training jobs kept submitted (beside the random short ones)
LONG_RUNTIME_S = (4 * 3600.0, 16 * 3600.0)


def shape() -> ClusterShape:
    return ClusterShape(
        p5_nodes=16,
        ultraserver_nodes=18,
        teams=TEAMS,
        arrivals_per_minute=0.06,
        initial_workloads=4,
        elastic_hyperpod_jobs=0,
        elastic_batch_jobs=0,
    )


@dataclass
class Report:
    seed: int
    days: float
    nodes: int
    scale: float
    truth: int = 0
    correct: int = 0
    by_cause: Counter[str] = field(default_factory=Counter)
    wrong: list[str] = field(default_factory=list)
    # Wrong causes the ledger itself said were uncertain (two causes at one moment): the
    # justified tolerance of tests/sim/test_goodput_truth.py.
    flagged: list[str] = field(default_factory=list)
    spurious: list[str] = field(default_factory=list)
    ettr_errors: list[tuple[float, str]] = field(default_factory=list)  # (points, job)
    residual_ms: int = 0
    uncertain: int = 0  # entries whose evidence was uncertain (late, skewed, garbled, ...)
    lines: list[str] = field(default_factory=list)
    seconds: float = 0.0
    events: int = 0

    @property
    def accuracy(self) -> float:
        return self.correct / self.truth if self.truth else 1.0

    @property
    def max_ettr_error(self) -> float:
        return max((e for e, _ in self.ettr_errors), default=0.0)


class Run:
    def __init__(self, seed: int, scale: float, step_s: float) -> None:
        self.seed = seed
        self.rng = random.Random(f"goodput-{seed}")
        self.now = START
        self.step_s = step_s
        self.store = ObjectStore(clock=lambda: self.now)
        self.cluster = SimulatedCluster(
            self.store,
            shape(),
            seed=seed,
            start=START,
            elastic=False,
            faults=FaultRates(scale=scale),
        )
        self.book = GoodputBook(GoodputConfig(retain_s=30 * DAY))
        model = ClusterModel()
        self.service = ClusterService(model=model, clock=lambda: self.now, goodput=self.book)
        model.expect_lists(REQUIRED_KINDS, self.now)
        self.informers = Informers(self.store, self.rng)
        self.long_seq = 0
        self.long: list[tuple[tuple[str, str, str], str]] = []
        self.events = 0

    @property
    def truth(self) -> GroundTruth:
        assert self.cluster.truth is not None
        return self.cluster.truth

    def start(self) -> None:
        self.cluster.bootstrap()
        self._submit_long()
        self.informers.relist(self.service)

    def step(self) -> None:
        self.now += self.step_s
        self._submit_long()
        self.cluster.step(self.now)
        self.events += self.informers.deliver(self.service)
        self.book.tick(self.now)

    def _submit_long(self) -> None:
        """Keep LONG_JOBS long training jobs submitted and unfinished: what goodput is about
        (the random arrivals beside them are short)."""
        truth = self.truth.jobs
        self.long = [
            (key, workload)
            for key, workload in self.long
            if self.cluster.has_workload(workload)
            and not (key in truth and truth[key].finished_at is not None)
        ]
        while len(self.long) < LONG_JOBS:
            self.long_seq += 1
            team = self.rng.choice(TEAMS)
            name = f"train-{self.long_seq:04d}"
            ultra = self.rng.random() < 0.4
            workload = self.cluster.submit(
                team,
                name,
                gpus_per_pod=4 if ultra else 8,
                pods=self.rng.randint(2, 6) if ultra else self.rng.randint(1, 3),
                priority_class="training-priority",
                instance_type="ml.p6e-gb200.36xlarge" if ultra else "ml.p5.48xlarge",
                runtime_s=self.rng.uniform(*LONG_RUNTIME_S),
                now=self.now,
            )
            namespace = f"hyperpod-ns-{team}"
            self.long.append(((namespace, "Job", name), f"{namespace}/{workload}"))

    # --- judging ----------------------------------------------------------------------------

    def report(self, days: float) -> Report:
        end = self.now
        self.book.tick(end + 3600)  # settle what is still open
        report = Report(self.seed, days, len(self.cluster.nodes()), 0.0)
        ledger: dict[tuple[str, str, str], list[Interruption]] = {}
        for entry in self.book.interruptions():
            ledger.setdefault(entry.key, []).append(entry)
        matched: set[str] = set()
        for truth in self.truth.interruptions:
            report.truth += 1
            report.by_cause[truth.cause] += 1
            found = [
                e
                for e in ledger.get(truth.job, [])
                if abs(e.stopped_at - truth.time) <= MATCH_S and e.id not in matched
            ]
            if not found:
                report.wrong.append(
                    f"missed: {truth.job[0]}/{truth.job[2]} at {truth.time - START:.0f}s"
                    f" ({truth.cause} {truth.component} {truth.fault} on {truth.node})"
                )
                continue
            entry = found[0]
            matched.add(entry.id)
            ok = entry.cause == truth.cause and (
                truth.cause not in ("node_fault", "remediation")
                or entry.component == truth.component
            )
            if ok:
                report.correct += 1
            else:
                (report.flagged if entry.uncertain else report.wrong).append(
                    f"{entry.id} at {truth.time - START:.0f}s: truth {truth.cause}"
                    f" {truth.component} ({truth.fault} on {truth.node}), ledger {entry.cause}"
                    f" {entry.component}: {entry.detail} {entry.uncertain}"
                )
        report.uncertain = sum(1 for e in self.book.interruptions() if e.uncertain)
        for entries in ledger.values():
            for entry in entries:
                if entry.id not in matched:
                    report.spurious.append(
                        f"{entry.id} at {entry.stopped_at - START:.0f}s: {entry.cause}"
                        f" {entry.component} {entry.detail}"
                    )
        for key, job in self.truth.jobs.items():
            expected = job.ettr(end)
            good = self.book.job_goodput(key[0], key[2], end)
            if expected is None:
                continue
            if good is None or good.ettr is None:
                report.ettr_errors.append((100.0, f"{key[0]}/{key[2]}: no ledger ETTR"))
                continue
            report.ettr_errors.append((abs(good.ettr - expected) * 100, f"{key[0]}/{key[2]}"))
        totals = self.book.gpu_seconds(end)
        report.residual_ms = totals.residual_ms()
        report.lines = self._breakdown(totals, end)
        report.events = self.events
        return report

    def _breakdown(self, totals: Any, end: float) -> list[str]:
        capacity = totals.capacity_ms / 3_600_000
        lines = [f"capacity {capacity:,.0f} GPU-hours:"]
        for category in CATEGORIES:
            hours = totals.seconds(category) / 3600
            if hours:
                lines.append(
                    f"  {category:<30} {hours:>10,.1f} GPU-h  {100 * hours / capacity:5.1f} %"
                )
        idle: Counter[str] = Counter()
        for (_, reason), ms in totals.idle_reasons.items():
            idle[reason] += ms
        lines.append(
            "  idle by reason: "
            + ", ".join(f"{r} {v / 3_600_000:,.1f} GPU-h" for r, v in sorted(idle.items()))
        )
        summary = self.book.reliability(end)
        lines.append(f"reliability over {summary.node_days:,.1f} node-days:")
        rates = ", ".join(
            f"{c} {v:,.0f}" for c, v in summary.interruptions_per_1000_node_days.items() if v
        )
        lines.append(f"  interruptions per 1,000 node-days: {rates}")
        for scope in ("instance_type", "ultraserver"):
            shown = [
                f"{m.name or '(none)'} {m.mtbf_hours:,.1f} h"
                for m in summary.mtbf[scope]
                if m.mtbf_hours is not None
            ]
            lines.append(f"  MTBF (hardware incidents) by {scope}: {', '.join(shown)}")
        lines.append(
            f"  repeat offenders (2 in 7 days): {len(summary.repeat_offenders)} of"
            f" {len(self.cluster.nodes())} nodes"
        )
        groups = self.book.goodput_by("team", end)
        lines.append(
            "  ETTR by team: " + ", ".join(f"{g.name} {100 * (g.ettr or 0):.1f} %" for g in groups)
        )
        return lines


def run(seed: int = 0, days: float = 7.0, scale: float = 400.0, step_s: float = 30.0) -> Report:
    started = time.perf_counter()
    sim = Run(seed, scale, step_s)
    sim.start()
    end = START + days * DAY
    while sim.now < end:
        sim.step()
    report = sim.report(days)
    report.scale = scale
    report.seconds = time.perf_counter() - started
    return report


def lines_of(report: Report, show: int = 10) -> list[str]:
    within = sum(1 for e, _ in report.ettr_errors if e <= 1.0)
    mean = sum(e for e, _ in report.ettr_errors) / max(1, len(report.ettr_errors))
    out = [
        f"goodput vs ground truth: seed {report.seed}, {report.days:g} simulated days,"
        f" {report.nodes} nodes, faults at {report.scale:g} x Meta's rate"
        f" ({report.seconds:.0f} s, {report.events:,} watch events)",
        f"interruptions (truth): {report.truth} "
        + "("
        + ", ".join(f"{c} {n}" for c, n in report.by_cause.most_common())
        + ")",
        f"cause attribution accuracy: {100 * report.accuracy:.2f} %"
        f" ({report.correct}/{report.truth}; target >= 99 %; of the"
        f" {len(report.wrong) + len(report.flagged)} wrong, {len(report.flagged)} flagged"
        " uncertain by the ledger), spurious entries:"
        f" {len(report.spurious)}; {report.uncertain} entries say what was uncertain"
        " (a finding stamped after the pods' end, a garbled annotation, no finding)",
        f"ETTR error per job: max {report.max_ettr_error:.3f} points, mean {mean:.3f};"
        f" {within}/{len(report.ettr_errors)} jobs within +-1 point",
        f"GPU-second conservation residual: {report.residual_ms} GPU-ms (must be 0)",
        *report.lines,
    ]
    for line in (report.wrong + report.flagged + report.spurious)[:show]:
        out.append(f"  ! {line}")
    worst = sorted(report.ettr_errors, reverse=True)[:3]
    if worst and worst[0][0] > 1.0:
        out += [f"  ! ETTR {e:.2f} points off: {job}" for e, job in worst if e > 1.0]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--scale", type=float, default=400.0, help="x Meta's fault rate")
    parser.add_argument("--step", type=float, default=30.0, help="simulated seconds a step")
    parser.add_argument("--show", type=int, default=10, help="disagreements to print")
    args = parser.parse_args(argv)
    logging.getLogger("exporter").setLevel(logging.ERROR)  # garbled annotations are on purpose
    report = run(args.seed, args.days, args.scale, args.step)
    print("\n".join(lines_of(report, args.show)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
