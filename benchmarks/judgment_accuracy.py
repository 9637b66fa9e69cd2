"""How often topowatch's judgments agree with the simulator's ground truth.

The simulated cluster (exporter/sim/cluster.py, with `Fidelity()`: every resource in the
ClusterQueues' resource groups, a tainted GB200 pool, mixed p5/GB200 flavors, several pod sets,
a cohort tree, elastic jobs, node cordons) runs in-process on a simulated clock and writes its
API objects into the simulated API server's object store (exporter/sim/kubeapi/store.py). The
cluster service (a `ClusterService` over a fresh `ClusterModel`) sees them only as informers
would: each kind's watch events in that kind's order, the kinds interleaved at random, Kueue
objects at v1beta2 (or at v1beta1 on odd seeds, as an older Kueue serves them), and now and
then a restart: a fresh service fed a relist of every kind, in random order.

Every decision the simulated Kueue and HyperPod operator make is logged with its cause
(exporter/sim/kueue/decisions.py). After each step the service's answer is compared:

- pending cause: `ClusterModel.pending_cause` for each workload the simulator (re)judged;
- quota short resource: for a quota cause (not a preemptor's, whose victims' quota is free by
  then), whether the service's `short` checks name the resource and flavor Kueue's first
  reason names;
- preemption verdict: the ledger entry of each victim, against its preemptor's cause;
- scale event kind and cause: each elastic scale event, once settled, against the service's
  scale events of that job (a scale-up that failed counts as its own kind; a Workload removed
  with its completed job must make no event), and every live service event without a match.
- admission: the ClusterQueues list the `topowatch-node-health` AdmissionCheck and the
  service runs its controller in enforce mode, writing into the simulated API server after
  each step's delivery. Each verdict it writes (Ready / Retry) is logged by the simulation
  with the truth at that moment (`SimulatedCluster.note_check_verdicts`, decision kind
  `admission`): Retry when a node of the workload's TAS assignment carries what the service
  could see on its Node object (an actionable finding asking for an action on the
  topowatch.io/findings annotation, a HyperPod Unschedulable* label, which cordons it, or
  Ready gone: exporter/cluster/admission/decide.py), Ready otherwise. The truth is what was
  published, not what happened: a fault the agent has not reported yet is invisible to any
  check, and counting it would score a race, not a judgment (benchmarks/admission_day.py
  measures those races). Node faults are on (exporter/sim/node_faults.py, scaled up), so
  findings reach the Nodes, as do the HyperPod cordons below.

Prints agreement per judgment and every disagreement with the line that replays it:

    .venv/bin/python benchmarks/judgment_accuracy.py [--seeds 0,1,2,3] [--decisions 3000]
    .venv/bin/python benchmarks/judgment_accuracy.py --seed 2 --until 417   # replay one step

A benchmark: it prints figures and never fails (tests/sim/test_judgment_accuracy.py gates a
short run).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._inprocess import Informers, StoreWriter
from exporter.cluster.admission.controller import AdmissionController
from exporter.cluster.admission.settings import AdmissionSettings
from exporter.cluster.elastic.scaling import ScaleEvent
from exporter.cluster.informers import WATCHED
from exporter.cluster.model import ClusterModel
from exporter.cluster.service import ClusterService
from exporter.sim.cluster import ClusterShape, Fidelity, SimulatedCluster
from exporter.sim.kubeapi.store import ObjectStore
from exporter.sim.kueue.checks import AdmissionChecks
from exporter.sim.kueue.decisions import Decision, ScaleTruth
from exporter.sim.node_faults import FaultRates

START = 1_795_000_000.0
REQUIRED_KINDS = tuple(w.kind for w in WATCHED if not w.optional)
JUDGMENTS = (
    "pending cause",
    "quota short resource",
    "preemption verdict",
    "scale event kind",
    "scale event cause",
    "admission",
)
# Node faults at Meta's rate times FAULT_SCALE (a few a simulated hour), and HyperPod's
# proactive reboots (a warning finding on a node still schedulable until the reboot: what
# Kueue can place work on and the check must answer Retry for) about 20 a simulated hour.
FAULT_SCALE = 2000.0
PROACTIVE_PER_1000_NODE_DAYS = 8.0
MATCH_WINDOW_S = 10.0  # a service scale event this close to the truth's time is its record
SETTLE_DOWN_S = 90.0  # the service settles a scale-down's cause within 60 s (scaling.SETTLE_S)
SETTLE_UP_S = 15.0
TEAMS = ("llm", "vision", "research", "audio")


def shape() -> ClusterShape:
    return ClusterShape(
        p5_nodes=16,
        ultraserver_nodes=18,
        teams=TEAMS,
        arrivals_per_minute=5.0,
        initial_workloads=12,
        elastic_hyperpod_jobs=2,
        elastic_batch_jobs=1,
    )


@dataclass(frozen=True, slots=True)
class Disagreement:
    judgment: str
    seed: int
    step: int
    subject: str
    oracle: str
    service: str
    detail: str = ""
    group: str = ""  # what disagreements of one class share, when not (oracle, service)

    @property
    def key(self) -> tuple[str, str, str]:
        if self.group:
            return (self.judgment, self.group, "")
        return (self.judgment, self.oracle, self.service)

    def replay(self) -> str:
        return f"--seed {self.seed} --until {self.step}"

    def line(self) -> str:
        text = (
            f"[{self.judgment}] {self.replay()}  {self.subject}: "
            f"oracle={self.oracle!r} service={self.service!r}"
        )
        return f"{text}\n      {self.detail}" if self.detail else text


@dataclass
class Result:
    agree: Counter[str] = field(default_factory=Counter)
    total: Counter[str] = field(default_factory=Counter)
    disagreements: list[Disagreement] = field(default_factory=list)
    unjudged: Counter[str] = field(default_factory=Counter)
    decisions: int = 0
    decision_kinds: Counter[str] = field(default_factory=Counter)
    scale_events: int = 0
    steps: int = 0
    restarts: int = 0
    seconds: float = 0.0
    sim_seconds: float = 0.0

    def merge(self, other: Result) -> None:
        self.agree.update(other.agree)
        self.total.update(other.total)
        self.disagreements += other.disagreements
        self.unjudged.update(other.unjudged)
        self.decisions += other.decisions
        self.decision_kinds.update(other.decision_kinds)
        self.scale_events += other.scale_events
        self.steps += other.steps
        self.restarts += other.restarts
        self.seconds += other.seconds
        self.sim_seconds += other.sim_seconds


class Run:
    """One seed: the simulation, the service watching it, and the judge."""

    def __init__(
        self,
        seed: int,
        restart_every: tuple[float, float] = (600.0, 1500.0),
        log: Callable[[str], None] | None = None,
        admission: bool = True,
    ) -> None:
        self.seed = seed
        self.admission = admission
        self.rng = random.Random(f"judge-{seed}")
        self.now = START
        self.store = ObjectStore(clock=lambda: self.now)
        self.cluster = SimulatedCluster(
            self.store,
            shape(),
            seed=seed,
            start=START,
            elastic=True,
            fidelity=Fidelity(),
            faults=(
                FaultRates(
                    scale=FAULT_SCALE, remediation_per_1000_node_days=PROACTIVE_PER_1000_NODE_DAYS
                )
                if admission
                else None
            ),
            admission_checks=AdmissionChecks() if admission else None,
        )
        kueue_version = "v1beta1" if seed % 2 else "v1beta2"
        self.informers = Informers(self.store, self.rng, kueue_version, shuffle_lists=True)
        self.result = Result()
        self.restart_every = restart_every
        self.next_restart = START + self.rng.uniform(*restart_every)
        self.next_cordon = START + self.rng.uniform(300.0, 900.0)
        self.cordoned: dict[str, float] = {}
        self.log = log
        self.service = self._fresh_service()
        self.pending_scale: list[ScaleTruth] = []
        self.scale_seen = 0
        self.decision_seen = 0
        self.service_born = START
        self.matched: set[int] = set()  # ids of the service's scale events judged

    def _fresh_service(self) -> ClusterService:
        admission = None
        if self.admission:
            admission = AdmissionController(
                AdmissionSettings(enabled=True, mode="enforce"), StoreWriter(self.store)
            )
        service = ClusterService(model=ClusterModel(), clock=lambda: self.now, admission=admission)
        service.model.expect_lists(REQUIRED_KINDS, self.now)
        # Every scale event the service opens, as its history feed is told of them: a job's
        # events leave the live model with the job, not from what it reported.
        self.service_events: dict[int, ScaleEvent] = {}
        service.model.elastic.on_event = self._opened
        return service

    def _opened(self, event: ScaleEvent) -> None:
        self.service_events[event.id] = event

    # --- driving --------------------------------------------------------------------------

    def start(self) -> None:
        self.cluster.bootstrap()
        self.informers.relist(self.service)
        self.decision_seen = len(self.cluster.decisions.decisions)
        self.scale_seen = len(self.cluster.decisions.scale)

    def step(self) -> list[Decision]:
        self.now += self.rng.randint(2, 8)
        self._faults()
        self.cluster.step(self.now)
        self.informers.deliver(self.service)
        # The check's controller judges what it was just told and writes; the simulation logs
        # each verdict with the truth before anything else changes (note_check_verdicts).
        self.service.admission_cycle()
        self.cluster.note_check_verdicts()
        self.result.steps += 1
        log = self.cluster.decisions
        new = log.decisions[self.decision_seen :]
        self.decision_seen = len(log.decisions)
        self.pending_scale += log.scale[self.scale_seen :]
        self.scale_seen = len(log.scale)
        return new

    def _faults(self) -> None:
        """HyperPod's health agent now and then marks a node for replacement (cordoned and
        tainted) and brings it back a few minutes later."""
        for node, until in list(self.cordoned.items()):
            if self.now >= until:
                self.cluster.cordon(node, "Schedulable")
                del self.cordoned[node]
        if self.now >= self.next_cordon:
            self.next_cordon = self.now + self.rng.uniform(600.0, 1500.0)
            names = [n.name for n in self.cluster.nodes() if n.name not in self.cordoned]
            node = self.rng.choice(names)
            self.cluster.cordon(node, "UnschedulablePendingReplacement")
            self.cordoned[node] = self.now + self.rng.uniform(300.0, 900.0)

    def maybe_restart(self) -> None:
        if self.now < self.next_restart:
            return
        self.judge_scale(final=True)
        self.next_restart = self.now + self.rng.uniform(*self.restart_every)
        self.service = self._fresh_service()
        self.informers.relist(self.service)
        self.service_born = self.now
        self.result.restarts += 1

    # --- judging --------------------------------------------------------------------------

    def judge(self, decisions: Iterable[Decision]) -> None:
        for d in decisions:
            self.result.decisions += 1
            self.result.decision_kinds[d.kind] += 1
            if d.kind == "pending":
                self._pending(d)
            elif d.kind == "preempted":
                self._preemption(d)
            elif d.kind == "admission":
                self._admission(d)
        self.judge_scale(final=False)

    def _count(self, judgment: str, ok: bool, disagreement: Disagreement | None) -> None:
        self.result.total[judgment] += 1
        if ok:
            self.result.agree[judgment] += 1
        elif disagreement is not None:
            self.result.disagreements.append(disagreement)
            if self.log is not None:
                self.log(disagreement.line())

    def _pending(self, d: Decision) -> None:
        if not self.cluster.has_workload(d.workload):
            self.result.unjudged["pending cause (the Workload was deleted in the same step)"] += 1
            return
        model = self.service.model
        namespace, name = d.workload.split("/", 1)
        state = model.workload_state(namespace, name)
        cause = None
        if state is None:
            service, summary = "absent", ""
        else:
            try:
                cause = model.pending_cause(state.workload)
            except Exception as exc:  # a judgment that raises is a wrong judgment
                service, summary = "error", f"{type(exc).__name__}: {exc}"
            else:
                service = cause.cause if cause is not None else "not pending"
                summary = cause.summary if cause is not None else ""
        oracle = d.cause
        if d.cause == "quota" and d.resource:
            if "Pending the preemption of" in d.message:
                self.result.unjudged[
                    "quota short resource (a preemptor: its victims' quota is free)"
                ] += 1
            else:
                self._short(d, cause)
        self._count(
            "pending cause",
            service == oracle,
            Disagreement(
                "pending cause",
                d.seed,
                d.step,
                d.workload,
                oracle,
                service,
                _oracle_detail(d) + f"\n      service: {summary}",
            ),
        )

    def _short(self, d: Decision, cause: Any) -> None:
        """Which resource is short: the service's `short` checks (resource, flavor) against the
        oracle's, Kueue's first reason."""
        shorts = getattr(cause, "short", None) if cause is not None else None
        if shorts is None:
            self.result.unjudged["quota short resource (the service names none)"] += 1
            return
        named = [(getattr(c, "resource", ""), getattr(c, "flavor", "")) for c in shorts]
        needs = [str(getattr(c, "need", "")) for c in shorts]
        said = sorted({f"{r} in {f}" for r, f in named}) or ["none"]
        group = f"oracle={d.resource} in {d.flavor} service={', '.join(said)}"
        self._count(
            "quota short resource",
            (d.resource, d.flavor) in named,
            Disagreement(
                "quota short resource",
                d.seed,
                d.step,
                d.workload,
                f"{d.amount} more {d.resource} in {d.flavor}",
                "; ".join(f"{n} in {f}" for n, (_, f) in zip(needs, named, strict=True)) or "none",
                _oracle_detail(d),
                group,
            ),
        )

    def _preemption(self, d: Decision) -> None:
        namespace, name = d.workload.split("/", 1)
        found = [
            r
            for r in self.service.model.ledger
            if r.victim_namespace == namespace
            and r.victim_name == name
            and r.preemptor_uid == d.preemptor_uid
            and abs(r.time - d.time) <= 5.0
        ]
        if not found:
            service, detail = "no ledger entry", ""
        else:
            record = found[-1]
            service, detail = record.verdict, record.verdict_detail
        self._count(
            "preemption verdict",
            service == d.cause,
            Disagreement(
                "preemption verdict",
                d.seed,
                d.step,
                f"{d.workload} preempted by {d.preemptor} ({d.reason})",
                d.cause,
                service,
                _oracle_detail(d) + f"\n      service: {detail}",
            ),
        )

    def _admission(self, d: Decision) -> None:
        """The controller's verdict (what it wrote) against the truth the simulation logged
        with it: Ready when every assigned node was fit as published, Retry otherwise."""
        self._count(
            "admission",
            d.verdict == d.cause,
            Disagreement(
                "admission",
                d.seed,
                d.step,
                d.workload,
                d.cause,
                d.verdict,
                f"oracle: {d.detail}\n      service: {d.message}",
            ),
        )

    def judge_scale(self, final: bool) -> None:
        """Judge each scale event once it has settled (a scale-down's cause within a minute,
        a scale-up once it is done or failed); at a restart or the end, judge what settled
        and set aside what the next process cannot have seen happen."""
        keep: list[ScaleTruth] = []
        for truth in self.pending_scale:
            if truth.time < self.service_born or truth.step < 1:
                self.result.unjudged["scale event (before the service watched)"] += 1
                continue
            settled = self._settled(truth)
            if not settled:
                if final:
                    self.result.unjudged["scale event (unsettled at a restart or the end)"] += 1
                else:
                    keep.append(truth)
                continue
            self._scale(truth)
        self.pending_scale = keep
        if final:
            self._spurious()

    def _settled(self, truth: ScaleTruth) -> bool:
        age = self.now - truth.time
        if truth.direction == "down":
            return age >= SETTLE_DOWN_S
        if not truth.outcome:
            return False
        return age >= SETTLE_UP_S

    def _scale(self, truth: ScaleTruth) -> None:
        self.result.scale_events += 1
        events = [e for e in self.service_events.values() if e.job == truth.job]
        match = sorted(
            (
                e
                for e in events
                if e.workload == truth.workload
                and e.direction == truth.direction
                and e.id not in self.matched
                and abs(e.time - truth.time) <= MATCH_WINDOW_S
            ),
            key=lambda e: abs(e.time - truth.time),
        )
        event = match[0] if match else None
        if event is not None:
            self.matched.add(event.id)
        oracle_kind = _truth_kind(truth)
        service_kind = "none"
        if event is not None:
            service_kind = event.direction + (" (failed)" if event.failed else "")
        subject = f"{truth.job[0]}/{truth.job[2]} {truth.workload}"
        earlier = sum(
            1
            for t in self.cluster.decisions.scale
            if (t.job, t.workload, t.direction) == (truth.job, truth.workload, truth.direction)
            and t.time < truth.time
        )
        kind = "HyperPodPyTorchJob" if truth.job[1] == "HyperPodPyTorchJob" else "Kueue slice"
        group = f"oracle={oracle_kind!r} service={service_kind!r} ({kind}"
        group += f", the Workload's scale-{truth.direction} #{earlier + 1})" if earlier else ")"
        detail = (
            f"oracle: {truth.direction} {truth.from_replicas}->{truth.to_replicas} "
            f"cause={truth.cause or '-'} outcome={truth.outcome or '-'} {truth.failed}"
        )
        if event is not None:
            detail += (
                f"\n      service: {event.direction} {event.from_replicas}->{event.to_replicas} "
                f"cause={event.cause or '-'} failed={event.failed or '-'} "
                f"phases={sorted(event.phases)}"
            )
        self._count(
            "scale event kind",
            oracle_kind == service_kind,
            Disagreement(
                "scale event kind",
                truth.seed,
                truth.step,
                subject,
                oracle_kind,
                service_kind,
                detail,
                group if earlier < 2 else group.replace(f"#{earlier + 1}", "#3+"),
            ),
        )
        if truth.kind == "scale" and event is not None:
            self._count(
                "scale event cause",
                event.cause == truth.cause,
                Disagreement(
                    "scale event cause",
                    truth.seed,
                    truth.step,
                    subject,
                    truth.cause,
                    event.cause,
                    detail,
                ),
            )

    def _spurious(self) -> None:
        """Live scale events the service shows with no event of the simulated operator."""
        truths: dict[tuple[tuple[str, str, str], str, str], list[float]] = {}
        for t in self.cluster.decisions.scale:
            truths.setdefault((t.job, t.workload, t.direction), []).append(t.time)
        for event in self.service_events.values():
            if not event.live or event.time < self.service_born + 1 or event.id in self.matched:
                continue
            times = truths.get((event.job, event.workload, event.direction), [])
            if any(abs(t - event.time) <= MATCH_WINDOW_S for t in times):
                continue  # judged, or not judged for a reason counted elsewhere
            namespace, _, name = event.job
            self._count(
                "scale event kind",
                False,
                Disagreement(
                    "scale event kind",
                    self.seed,
                    self._step_at(event.time),
                    f"{namespace}/{name} {event.workload}",
                    "none",
                    event.direction,
                    f"service: {event.direction} {event.from_replicas}->{event.to_replicas}"
                    f" cause={event.cause or '-'}",
                ),
            )
        self.matched = set()

    def _step_at(self, when: float) -> int:
        steps = [d.step for d in self.cluster.decisions.decisions if d.time <= when]
        return steps[-1] if steps else self.cluster.step_index


def _truth_kind(truth: ScaleTruth) -> str:
    if truth.kind == "finished":
        return "none"
    if truth.direction == "up" and truth.outcome == "failed":
        return "up (failed)"
    return truth.direction


def _oracle_detail(d: Decision) -> str:
    parts = [f"oracle: {d.cause}"]
    if d.resource:
        parts.append(f"{d.amount} more {d.resource} ({d.detail})" if d.amount else d.resource)
    elif d.detail:
        parts.append(d.detail)
    if d.flavor:
        parts.append(f"flavor {d.flavor}")
    if d.domains:
        level = d.level.rsplit("/", 1)[-1]
        parts.append(f"{level} {', '.join(d.domains[:3])}")
    text = "; ".join(parts)
    if d.message:
        text += f"\n      kueue: {d.message[:300]}"
    return text


def run_seed(
    seed: int,
    decisions: int,
    until: int | None = None,
    log: Callable[[str], None] | None = None,
    max_steps: int = 100_000,
    restart_every: tuple[float, float] = (600.0, 1500.0),
    admission: bool = True,
) -> tuple[Result, Run]:
    """Run one seed until `decisions` decisions (or step `until`), judging as it goes.
    `admission` False: no AdmissionCheck, no node faults (the cluster the other judgments
    were first measured on)."""
    started = time.perf_counter()
    run = Run(seed, restart_every=restart_every, log=log, admission=admission)
    run.start()
    while run.result.steps < max_steps:
        if until is not None and run.cluster.step_index >= until:
            break
        if until is None and run.result.decisions >= decisions:
            break
        new = run.step()
        run.judge(new)
        run.maybe_restart()
    run.judge_scale(final=True)
    run.result.seconds = time.perf_counter() - started
    run.result.sim_seconds = run.now - START
    return run.result, run


def summary(result: Result) -> list[str]:
    lines = [
        f"decisions: {result.decisions} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(result.decision_kinds.items()))}), "
        f"scale events judged: {result.scale_events}, steps: {result.steps}, "
        f"service restarts: {result.restarts}, simulated {result.sim_seconds / 3600:.1f} h "
        f"in {result.seconds:.0f} s",
        "",
        f"{'judgment':<22} {'agree':>7} {'total':>7} {'agreement':>10}",
    ]
    for judgment in JUDGMENTS:
        total = result.total[judgment]
        agree = result.agree[judgment]
        ratio = f"{100.0 * agree / total:.1f} %" if total else "-"
        lines.append(f"{judgment:<22} {agree:>7} {total:>7} {ratio:>10}")
    if result.unjudged:
        lines.append("")
        for why, count in sorted(result.unjudged.items()):
            lines.append(f"not judged: {count} {why}")
    return lines


def classes(disagreements: Iterable[Disagreement]) -> list[str]:
    """Disagreements grouped by (judgment, oracle, service), largest first, one replay each."""
    groups: dict[tuple[str, str, str], list[Disagreement]] = {}
    for d in disagreements:
        groups.setdefault(d.key, []).append(d)
    lines = []
    for (judgment, a, b), items in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        first = items[0]
        what = a if not b else f"oracle={a!r} service={b!r}"
        lines.append(
            f"{len(items):>5} x [{judgment}] {what}  e.g. {first.replay()} ({first.subject})"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2,3", help="comma-separated seeds")
    parser.add_argument("--decisions", type=int, default=3000, help="decisions per seed")
    parser.add_argument("--seed", type=int, help="replay one seed")
    parser.add_argument("--until", type=int, help="with --seed: stop after this step")
    parser.add_argument("--jsonl", help="write the decision log(s) here as JSON lines")
    parser.add_argument("--all", action="store_true", help="list every disagreement")
    parser.add_argument(
        "--no-admission", action="store_true", help="no admission check and no node faults"
    )
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else [int(s) for s in args.seeds.split(",")]
    total = Result()
    logs = []
    for seed in seeds:
        result, run = run_seed(
            seed, args.decisions, until=args.until, admission=not args.no_admission
        )
        logs.extend(run.cluster.decisions.records())
        version = "v1beta1" if seed % 2 else "v1beta2"
        print(f"seed {seed} (Kueue objects at {version}): " + summary(result)[0], flush=True)
        total.merge(result)
        if args.until is not None:
            print(f"\nthe decisions of step {args.until}:")
            for d in run.cluster.decisions.decisions:
                if d.step == args.until:
                    print(f"  {d.kind:<9} {d.workload} cause={d.cause!r} {_oracle_detail(d)}")
            for t in run.cluster.decisions.scale:
                if t.step == args.until:
                    print(f"  scale {t.direction} {t.job} {t.workload} cause={t.cause!r}")
    if args.jsonl:
        with Path(args.jsonl).open("w", encoding="utf-8") as out:
            for record in logs:
                out.write(json.dumps(record, sort_keys=True) + "\n")
    print()
    print("\n".join(summary(total)))
    if total.disagreements:
        print("\ndisagreement classes (judgment, oracle, service):")
        print("\n".join(classes(total.disagreements)))
        print("\ndisagreements (replay with --seed S --until STEP):")
        shown = total.disagreements if args.all else _first_per_class(total.disagreements, 5)
        for disagreement in shown:
            print("  " + disagreement.line())
        if not args.all:
            print(f"  ... ({len(total.disagreements)} in all; --all lists every one)")
    return 0


def _first_per_class(disagreements: list[Disagreement], n: int) -> list[Disagreement]:
    seen: Counter[tuple[str, str, str]] = Counter()
    out = []
    for d in disagreements:
        key = d.key
        if seen[key] < n:
            out.append(d)
        seen[key] += 1
    return out


if __name__ == "__main__":
    sys.exit(main())
