"""The simulated SageMaker HyperPod cluster behind `topowatch cluster --simulate` and the demo.

It plays the Job controller, Kueue (with Topology-Aware Scheduling) and the kube-scheduler on a
small HyperPod-shaped cluster and writes every object those would write through a
`ClusterWriter` (the simulated API server's store), so the cluster service's informers read the
simulation exactly as they would read a real cluster.

Time is passed in: `step(now)` advances the simulation to `now`. Given the seed and the
sequence of `now`s, the objects written are always the same, uids and names included.

Elastic training jobs (HyperPodPyTorchJobs and Kueue-native elastic batch Jobs) are played by
`exporter.sim.elastic.ElasticOperator`; this class hands it the admissions, evictions,
finishes and deletions of their Workloads.

Every decision is logged with its cause (`decisions`, exporter/sim/kueue/decisions.py): the
ground truth topowatch's judgments are measured against (benchmarks/judgment_accuracy.py).
A step runs one scheduling cycle (admissions and preemptions, nominated preemptors first),
the elastic operator, garbage collection, and last a status pass that writes each pending
workload's reason against the state the step ends in, as Kueue's next cycle would (workloads
in a pool where a preemption is under way keep theirs, as Kueue skips them). `fidelity`
(exporter/sim/fidelity.py) turns on every resource, tainted pools, mixed flavors,
several pod sets and a cohort tree.

Admission checks (`admission_checks`, exporter/sim/kueue/checks.py; off by default): the
ClusterQueues list AdmissionChecks, and a quota reservation leaves the workload QuotaReserved
but not Admitted, its Job suspended (no pods), until every check is Ready. A check controller
decides by patching the Workload's status.admissionChecks in the API server; each step reads
that back before Kueue's workload controller acts on it: all Ready admits, a Retry evicts and
requeues after the Retry's requeueAfterSeconds, a Rejected deactivates. As the oracle of
topowatch's node-health check, `note_check_verdicts` logs each verdict a controller wrote with
the truth of that moment, judged from what the Node objects show (`observable_problem`);
`stand_in_checks` answers the checks from that truth where no controller watches (a past).

Deliberate simplifications: evicted and finished pods vanish at once (no Terminating phase);
Jobs are not written (the store serves no batch/v1), Workloads and Pods still name their Job
and its uid; a preempted workload counts the eviction in `status.requeueState.count` (real
Kueue counts there only PodsReady-timeout and admission-check requeues).
"""

from __future__ import annotations

import json
import math
import random
import uuid
from collections.abc import Callable
from typing import Any

from exporter.core.findings import FINDINGS_ANNOTATION, format_time
from exporter.core.ultraserver import FABRIC_ANNOTATION, NodeFabric
from exporter.sim import fidelity as fid
from exporter.sim import hyperpod_layout as layout
from exporter.sim.elastic import HYPERPOD_KIND, ElasticOperator, HyperPodSpec
from exporter.sim.fidelity import Fidelity
from exporter.sim.hyperpod_layout import ClusterShape, SimNode, default_shape
from exporter.sim.job_arrivals import JobArrivals, JobRequest
from exporter.sim.kueue import checks as kc
from exporter.sim.kueue import objects as ko
from exporter.sim.kueue import status as ks
from exporter.sim.kueue.checks import AdmissionChecks
from exporter.sim.kueue.decisions import Decision, DecisionLog, ScaleTruth
from exporter.sim.kueue.output import ApiOutput, ClusterWriter
from exporter.sim.kueue.scheduler import (
    GPU,
    Admit,
    ClusterState,
    CohortSpec,
    Demand,
    FlavorSpec,
    HeldPodSet,
    Holding,
    Mode,
    NodeSlot,
    PodSetSpec,
    Preempt,
    PreemptionReason,
    Verdict,
    Wait,
    decide,
)
from exporter.sim.kueue.scheduler import Decision as KueueDecision
from exporter.sim.node_faults import PROACTIVE, FaultDraw, FaultKind, FaultRates, GroundTruth

__all__ = [
    "ClusterShape",
    "ClusterWriter",
    "DecisionLog",
    "Fidelity",
    "SimNode",
    "SimulatedCluster",
    "default_shape",
]

DEFAULT_SHAPE = default_shape()
DEFAULT_START = 1_795_000_000.0  # a fixed epoch (2026-11-18) keeps default runs repeatable
FINISHED_RETENTION_S = 300.0  # finished Workloads are deleted this long after finishing
ABANDON_AFTER_S = 900.0  # a random job still pending this long is deleted by its owner
MIN_RUN_S = 30.0  # a requeued job still needs at least this long to finish
JOB_NAME = layout.JOB_NAME
# Elastic Workloads by key: (phase, pods, kind, job, namespace, every pod has been Ready); and
# each HyperPodPyTorchJob's (Workload being faulted, faulty restart pending, completed, the size
# it last restarted at).
ElasticState = tuple[
    dict[str, tuple[str, int, str, str, str, bool]],
    dict[str, tuple[str | None, bool, float | None, int | None]],
]
POD_NAME_ALPHABET = layout.POD_NAME_ALPHABET


class SimulatedCluster:
    def __init__(
        self,
        writer: ClusterWriter,
        shape: ClusterShape = DEFAULT_SHAPE,
        seed: int = 0,
        start: float = DEFAULT_START,
        elastic: bool | None = None,
        fidelity: Fidelity | None = None,
        faults: FaultRates | None = None,
        admission_checks: AdmissionChecks | None = None,
    ) -> None:
        """`elastic`: run elastic training jobs (exporter.sim.elastic): the shape's bootstrap
        elastic jobs and elastic arrivals. None (the default) turns them on for a living
        cluster (random arrivals or initial workloads) and off for a fully scripted one, whose
        tests expect an empty cluster; True or False decides outright. `fidelity`: the oracle's
        richer cluster (every resource, tainted pools, mixed flavors, several pod sets, a
        cohort tree); None keeps the demo's GPU-only one. `faults`: nodes fail at these rates
        and HyperPod recovers them and auto-resumes the jobs they stopped
        (exporter/sim/node_faults.py); `truth` then records what really happened.
        `admission_checks`: the ClusterQueues list these AdmissionChecks and Kueue runs them
        (exporter/sim/kueue/checks.py): a workload with quota reserved waits, its Job
        suspended, until a check controller sets every check Ready in the API server
        (`writer` must then also read: `get(plural, namespace, name)`). Elastic jobs' Workloads
        are not held by checks (a simplification)."""
        if elastic is None:
            elastic = shape.arrivals_per_minute > 0 or shape.initial_workloads > 0
        self._shape = shape
        self._fidelity = fidelity
        self._rng = random.Random(seed)
        self._out = ApiOutput(writer, self._uid)
        self._start = self._now = self._clock = start  # _clock: the time stamped on writes
        self._nodes = layout.build_nodes(shape, self._rng)
        self._node_index = {n.name: i for i, n in enumerate(self._nodes)}
        self._health = {n.name: "Schedulable" for n in self._nodes}
        self._gpu_owner: dict[str, list[tuple[str, str, str] | None]] = {
            n.name: [None] * n.gpus for n in self._nodes
        }
        flavors = layout.flavors_in(self._nodes)
        cohorts: dict[str, CohortSpec] = {layout.COHORT: CohortSpec(layout.COHORT)}
        if fidelity is not None:
            flavors = fid.flavors(fidelity, flavors)
            self._policies, cohorts = fid.policies(fidelity, shape, self._nodes)
        else:
            self._policies = layout.queue_policies(shape, self._nodes)
        self._cohorts = cohorts
        slots = {n.name: _slot(n, flavors, fidelity) for n in self._nodes}
        self._state = ClusterState(
            flavors=flavors, nodes=slots, queues=self._policies, cohorts=cohorts
        )
        self._workloads: dict[str, ko.SimWorkload] = {}
        self._uids: dict[str, str] = {}
        self._job_seq = 0
        base = fid.job_mix(fidelity) if fidelity is not None else layout.JOB_MIX
        templates = base + (layout.ELASTIC_MIX if elastic else ())
        mix = [t for t in templates if t.flavor in flavors]
        self._arrivals = JobArrivals(shape, mix, self._rng, start)
        self._booted = False
        self._elastic = ElasticOperator(self, enabled=elastic and layout.P5 in flavors)
        # The ground truth (exporter/sim/kueue/decisions.py) and what it needs between steps.
        self.decisions = DecisionLog(seed)
        self.step_index = 0
        self._cache: dict[str, tuple[int, Demand, KueueDecision]] = {}
        self._skipped: set[str] = set()  # pending workloads in a pool being preempted for
        self._preempting: set[tuple[str, str]] = set()  # those pools (root cohort, flavor)
        self._preemptors: set[str] = set()  # workloads that preempted in this step
        self._open_ups: dict[str, ScaleTruth] = {}  # scale-up Workload key -> its event
        self._hp_base: dict[tuple[str, str], str] = {}  # (namespace, job) -> base Workload
        self._seen: set[str] = set()  # Workload keys written at least once
        self._ticked = -math.inf  # the operator's last pass
        # Node faults (exporter/sim/node_faults.py): the draw, the ground truth, each node's
        # findings annotation and NotReady state, HyperPod's pending actions, the jobs waiting
        # to be restarted (workload key -> not before) and those whose pods are starting.
        self._fault_draw = FaultDraw(faults, seed) if faults is not None else None
        self.truth: GroundTruth | None = GroundTruth() if faults is not None else None
        self._findings: dict[str, list[dict[str, object]]] = {}
        self._reports: dict[str, list[dict[str, object]]] = {}  # findings not yet written
        self._garbled: set[str] = set()  # nodes whose annotation was last written garbled
        self._down: set[str] = set()
        self._repairing: set[str] = set()
        self._actions: list[tuple[float, int, str, str, FaultKind]] = []
        self._action_seq = 0
        self._restarts: dict[str, float] = {}
        self._starting: dict[str, float] = {}
        self._faults_at = start
        self._boots: dict[str, int] = {}  # node -> reboots and replacements so far (boot ID)
        # Admission checks (exporter/sim/kueue/checks.py): the config, where the check
        # controllers' verdicts are read back, each check's Active state, and each inactive
        # ClusterQueue's (reason, message, since).
        self._ac = admission_checks
        getter = getattr(writer, "get", None)
        self._get: Callable[[str, str, str], dict[str, Any] | None] | None = (
            getter if admission_checks is not None and callable(getter) else None
        )
        self._verdicts_noted: set[tuple[str, str, str, str]] = set()  # note_check_verdicts
        self._check_active: dict[str, bool] = {}
        self._cq_inactive: dict[str, tuple[str, str, float]] = {}
        self._cq_active_since: dict[str, float] = {}  # active again since
        self._reserved_at: dict[str, float] = {}  # reserved, checks not all Ready -> since
        self._reserved_verdict: dict[str, Verdict] = {}  # ... and where it was placed

    # --- public API -------------------------------------------------------------------------

    def nodes(self) -> list[SimNode]:
        return list(self._nodes)

    def has_workload(self, key: str) -> bool:
        """Whether Workload `key` ("namespace/name") exists now."""
        return key in self._workloads

    def gpu_pods(self, node: str) -> dict[int, tuple[str, str, str]]:
        """GPU index -> (namespace, pod, container) of the pods holding GPUs on `node`."""
        owners = self._gpu_owner.get(node, [])
        return {i: owner for i, owner in enumerate(owners) if owner is not None}

    def bootstrap(self) -> None:
        """Write nodes, namespaces and the Kueue setup, then admit the jobs already queued."""
        if self._booted:
            return
        self._booted = True
        t = self._start
        for team in self._shape.teams:
            ns = layout.namespace(team)
            self._out.put("namespaces", ko.namespace_manifest(ns, self._uid_of(ns), t))
        for node in self._nodes:
            self._write_node(node)
        for f in self._state.flavors.values():
            topology = ko.topology_manifest(f.topology, f.levels, self._uid_of(f.topology), t)
            self._out.put("topologies", topology)
            rf = ko.resource_flavor_manifest(
                f.name, f.labels, f.topology, self._uid_of(f.name), t, f.node_taints, f.tolerations
            )
            self._out.put("resourceflavors", rf)
        for name, value, text in layout.PRIORITY_CLASSES:
            pc = ko.priority_class_manifest(name, value, text, self._uid_of(name), t)
            self._out.put("workloadpriorityclasses", pc)
        if self._elastic.enabled:
            name, value, text = layout.ELASTIC_PRIORITY_CLASS
            pc = ko.priority_class_manifest(name, value, text, self._uid_of(name), t)
            self._out.put("workloadpriorityclasses", pc)
        for spec in self._cohorts.values():
            cohort = ko.cohort_manifest(spec.name, self._uid_of(spec.name), t, spec)
            self._out.put("cohorts", cohort)
        self._write_admission_checks(t)
        if self._elastic.enabled:  # elastic jobs were running before the queued random ones
            before = self._elastic_state()
            self._elastic.bootstrap(t)
            self._scale_diff(before, "tick")
            self._clock = t
            self._schedule()
        for _ in range(self._shape.initial_workloads):
            job = self._arrivals.sample(t - self._rng.uniform(30.0, 600.0))
            if job is not None:
                self._submit_random(job)
        self._clock = t
        self._schedule()
        self._tick(t, warm=True)
        self._settle_pending()
        self._write_queues()

    def step(self, now: float) -> None:
        """Advance to `now`: finish jobs, take arrivals, run one scheduling cycle. A `now` not
        after the last one does nothing; a non-finite one raises ValueError."""
        if not math.isfinite(now):
            raise ValueError(f"step needs a finite time, not {now!r}")
        self.bootstrap()
        if now <= self._now:
            return
        self.step_index += 1
        admitted = [w for w in self._workloads.values() if w.phase == "admitted"]
        for w in sorted(admitted, key=lambda w: (w.finish_at or 0.0, w.key)):
            if w.finish_at is not None and w.finish_at <= now:
                # With node faults on, a job ends at the step that passes its end, so the time
                # every watcher sees its pods go is the time it ended (the ground truth's).
                self._clock = now if self._fault_draw is not None else w.finish_at
                self._finish(w)
        if self._fault_draw is not None:
            self._now = self._clock = now
            self._node_faults(now)
        for job in self._arrivals.until(now):
            self._submit_random(job)
        self._now = self._clock = now
        self._run_checks(now)
        self._schedule()
        self._tick(now)
        before = self._elastic_state()
        self._collect_garbage()
        self._scale_diff(before, "gc")
        self._settle_pending()
        self._write_queues()

    def submit(
        self,
        team: str,
        name: str,
        gpus_per_pod: int,
        pods: int,
        priority_class: str,
        topology: tuple[str, str] | None = None,
        now: float | None = None,
        instance_type: str | None = None,
        runtime_s: float = 3600.0,
        pod_sets: tuple[ko.SimPodSet, ...] = (),
        any_flavor: bool = False,
    ) -> str:
        """Submit Job `name` for `team` (scripted scenarios, the demo); returns its Workload's
        name. `topology` is ("required"|"preferred", node label key). The flavor defaults to
        the UltraServer one when the topology names the UltraServer level, else p5.
        `pod_sets` (per-pod requests in Kueue's units, exporter/sim/kueue/resources.py)
        replace the one pod set of `pods` x `gpus_per_pod` GPUs; `any_flavor`: the pods name
        no instance type, so Kueue picks the flavor.
        Raises ValueError for a bad name, unknown team, priority class, mode or flavor."""
        if not JOB_NAME.fullmatch(name):
            raise ValueError(f"job name {name!r} is not a DNS label of at most 40 characters")
        self.bootstrap()
        if team not in self._shape.teams:
            raise ValueError(f"unknown team {team!r}; teams: {', '.join(self._shape.teams)}")
        if priority_class not in layout.PRIORITY:
            raise ValueError(f"unknown priority class {priority_class!r}")
        if not pod_sets and (pods < 1 or gpus_per_pod < 1):
            raise ValueError("a job needs at least one pod and one GPU per pod")
        request: tuple[Mode, str] | None = None
        if topology is not None:
            mode, level = topology
            if mode == "required":
                request = ("required", level)
            elif mode == "preferred":
                request = ("preferred", level)
            else:
                raise ValueError(f"topology mode must be required or preferred, not {mode!r}")
        flavor = instance_type or self._default_flavor(request)
        if flavor not in self._state.flavors:
            raise ValueError(f"this cluster has no {flavor} nodes")
        self._clock = self._now if now is None else now
        w = self._new_workload(
            team,
            name,
            flavor,
            pods,
            gpus_per_pod,
            priority_class,
            request,
            runtime_s,
            pod_sets,
            any_flavor,
        )
        w.scripted = True
        return w.name

    def submit_elastic(
        self,
        team: str,
        name: str,
        min_replicas: int,
        max_replicas: int,
        step: int | None = 1,
        discrete: tuple[int, ...] | None = None,
        priority_class: str = "training-priority",
        now: float | None = None,
        runtime_s: float = 3600.0,
        scaling_timeout_s: float = 120.0,
        snooze_s: float = 60.0,
    ) -> str:
        """Submit HyperPodPyTorchJob `name` (one replica = one pod = one whole p5 node), which
        starts at `min_replicas` and grows by `step` replicas (or through the `discrete`
        sizes) up to `max_replicas`; returns its base Workload's name. See
        exporter.sim.elastic for what the simulated training operator does with it.
        Raises ValueError for a bad name, team, class or bounds, or with elastic jobs off."""
        self.bootstrap()
        self._clock = self._now if now is None else now
        return self._elastic.submit_hyperpod(
            HyperPodSpec(
                team,
                name,
                min_replicas,
                max_replicas,
                step,
                discrete,
                priority_class,
                runtime_s,
                scaling_timeout_s,
                snooze_s,
            )
        )

    def submit_elastic_batch(
        self,
        team: str,
        name: str,
        pods: int,
        gpus_per_pod: int = 4,
        priority_class: str = "fine-tuning-priority",
        now: float | None = None,
        runtime_s: float = 3600.0,
        resize_after_s: float = 60.0,
    ) -> str:
        """Submit a Kueue-native elastic batch Job (ElasticJobsViaWorkloadSlices) of `pods`
        pods; it first resizes `resize_after_s` after its first admission, and again every
        few minutes; returns its first (origin) slice's name. Use `resize_elastic_batch` to
        resize it by hand. Raises ValueError as `submit_elastic` does."""
        self.bootstrap()
        self._clock = self._now if now is None else now
        return self._elastic.submit_slice(
            team, name, pods, gpus_per_pod, priority_class, runtime_s, resize_after_s
        )

    def resize_elastic_batch(self, namespace: str, job: str, pods: int) -> str:
        """Resize the Kueue-native elastic Job `job` to `pods` pods now: a larger size makes a
        new workload slice (returned), a smaller one changes the current slice in place
        (returned too). Raises ValueError for an unknown job, a size below one, or while a
        replacement slice still waits for admission."""
        self.bootstrap()
        before = self._elastic_state()
        name = self._elastic.resize_slice(namespace, job, pods, self._now)
        self._scale_diff(before, "tick")
        return name

    def fault_pod(self, namespace: str, job: str) -> str:
        """Make one pod of HyperPodPyTorchJob `job`'s newest admitted scale-up fail now; the
        operator scales that increment down after faultyScaleDownTimeoutInSeconds. Returns the
        pod's name; raises ValueError for an unknown job or one with no admitted scale-up."""
        self.bootstrap()
        return self._elastic.fault_pod(namespace, job, self._now)

    def boot_id(self, node: str) -> str:
        """The Node's status.nodeInfo.bootID: a new one after each reboot or replacement."""
        boots = self._boots.get(node, 0)
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"topowatch-sim/{node}/boot/{boots}"))

    def hyperpod_label(
        self, node: str, health: str, kind: FaultKind, start_s: tuple[float, float]
    ) -> bool:
        """HyperPod's health label on `node` reads `health`, written by someone else
        (topowatch's remediation controller, through its HyperPod provider): HyperPod acts on
        it as on a label of its own. The node is cordoned now; `start_s` later it is rebooted
        or replaced (`kind.repair`) and the jobs on it stop (true cause: remediation,
        `kind.component`); `kind.repair_s` after that it is back, Schedulable, with a new
        boot ID, and the operator resumes the jobs. True when this starts a remediation;
        False for the label the simulation wrote itself or a node under repair already.
        Raises ValueError with faults off (the repair path is theirs) or an unknown node."""
        if self._fault_draw is None:
            raise ValueError("node repairs need faults on: build the cluster with FaultRates()")
        if node not in self._node_index:
            raise ValueError(f"no node named {node!r}")
        self.bootstrap()
        if not kind.repair or node in self._repairing or self._health[node] == health:
            return False
        self._clock = self._now
        self.cordon(node, health)
        self._plan(self._now + self._fault_draw.between(start_s), "remediate", node, kind)
        return True

    def cordon(self, node: str, health: str = "UnschedulablePendingReplacement") -> None:
        """Set HyperPod's health label on `node`; anything but Schedulable also cordons it, so
        no new pods land there (running ones stay until their job ends)."""
        if node not in self._node_index:
            raise ValueError(f"no node named {node!r}")
        self.bootstrap()
        self._health[node] = health
        self._state.cordon(node, health != "Schedulable")
        self._write_node(self._nodes[self._node_index[node]])

    # --- Kueue --------------------------------------------------------------------------------

    def _schedule(self) -> None:
        """One scheduling cycle: pending workloads, nominated preemptors first, then by priority
        and queue order. A workload that preempts holds its pools (root cohort and flavor)
        for the rest of the cycle: Kueue skips workloads whose preemption targets overlap or
        that no longer fit (scheduler.go processEntry); here every other workload of the pool
        waits for the next step. The status pass brings waiting workloads' reasons up to date
        with the state the step ends in."""
        self._state.fresh.clear()
        pending = [w for w in self._workloads.values() if self._queued(w)]
        # scheduler.go makeClassicalIterator: preemptors nominated last cycle first, then
        # entries within nominal quota before borrowing ones (as assigned against the cycle's
        # snapshot), then higher priority, then FIFO.
        nominated = {w.key: self._decide(w)[0] for w in pending}
        pending.sort(
            key=lambda w: (
                not w.nominated,
                _borrows(nominated[w.key]),
                -w.priority,
                w.queued_at,
                w.created,
                w.key,
            )
        )
        preempting = self._preempting = set()
        self._skipped = set()
        self._preemptors = set()
        for w in pending:
            if w.phase != "pending":  # an elastic hook removed or admitted it meanwhile
                continue
            pools = self._pools(w)
            if pools & preempting:
                self._skipped.add(w.key)
                continue
            decision, _ = self._decide(w)
            if isinstance(decision, Admit):
                self._admit(w, decision)
                self._state.fresh.add(w.key)
                if w.phase == "reserved":  # quota reserved; its admission checks decide
                    pending_checks = ", ".join(c["name"] for c in w.checks)
                    verdict = Verdict(
                        kc.CAUSE,
                        flavor=decision.verdict.flavor,
                        level=decision.verdict.level,
                        domains=decision.verdict.domains,
                        detail=f"admission checks pending: {pending_checks}",
                    )
                    self._record(w, "reserved", verdict, kc.UNSATISFIED_MESSAGE)
                    self._reserved_verdict[w.key] = decision.verdict
                else:
                    self._record(w, "admitted", decision.verdict)
            elif isinstance(decision, Preempt):
                preempting |= pools
                self._preemptors.add(w.key)
                count = len(decision.victims)
                waiting = f"{decision.message}. Pending the preemption of {count} workload(s)"
                for holding, reason in decision.victims:
                    victim = self._workloads[holding.key]
                    self._record(
                        victim, "preempted", decision.verdict, waiting, preemptor=w, reason=reason
                    )
                    self._evict(victim, w, reason)
                w.nominated = True
                self._set_pending(w, waiting)
                self._record(w, "pending", decision.verdict, waiting)
            else:
                w.nominated = False
                self._set_pending(w, decision.message)
        if self._state.fresh:  # the next cycle's snapshot holds them as any other workload
            self._state.fresh.clear()
            self._state.touch()

    def _settle_pending(self) -> None:
        """The status pass: every pending workload not part of a preemption under way gets
        the reason the state the step ends in gives it, as Kueue's next cycle would write it;
        one it could admit or preempt for now keeps its old one until the next step."""
        pending = sorted(
            (w for w in self._workloads.values() if self._queued(w)),
            key=lambda w: (not w.nominated, -w.priority, w.queued_at, w.created, w.key),
        )
        for w in pending:
            if w.key in self._skipped or w.key in self._preemptors:
                continue
            if self._pools(w) & self._preempting:  # victims and newcomers of a pool in flux
                continue
            decision, fresh = self._decide(w)
            if not isinstance(decision, Wait):
                continue
            w.nominated = False
            self._set_pending(w, decision.message)
            if fresh:
                self._record(w, "pending", decision.verdict, decision.message)

    def _decide(self, w: ko.SimWorkload) -> tuple[KueueDecision, bool]:
        """Kueue's decision for `w` now, and whether it was made anew (the cluster changed
        since the last one: Kueue's BestEffortFIFO requeues inadmissible workloads then)."""
        demand = _demand(w)
        cached = self._cache.get(w.key)
        if cached is not None and cached[0] == self._state.epoch and cached[1] == demand:
            return cached[2], False
        decision = decide(self._state, demand)
        self._cache[w.key] = (self._state.epoch, demand, decision)
        return decision, True

    def _pools(self, w: ko.SimWorkload) -> set[tuple[str, str]]:
        root = self._state.quota.queue(w.cluster_queue).root().name
        if w.any_flavor:
            return {(root, f) for f in self._policies[w.cluster_queue].flavor_names()}
        return {(root, w.flavor)}

    def _record(
        self,
        w: ko.SimWorkload,
        kind: str,
        verdict: Verdict,
        message: str = "",
        preemptor: ko.SimWorkload | None = None,
        reason: str = "",
    ) -> None:
        self.decisions.add(
            Decision(
                seed=self.decisions.seed,
                step=self.step_index,
                time=self._clock,
                kind=kind,
                workload=w.key,
                uid=w.uid,
                cluster_queue=w.cluster_queue,
                cause=verdict.cause,
                resource=verdict.resource,
                amount=verdict.amount,
                flavor=verdict.flavor,
                level=verdict.level,
                domains=verdict.domains,
                detail=verdict.detail,
                message=message,
                preemptor=preemptor.key if preemptor is not None else "",
                preemptor_uid=preemptor.uid if preemptor is not None else "",
                reason=reason,
            )
        )

    def _admit(self, w: ko.SimWorkload, decision: Admit) -> None:
        now, cq = self._clock, w.cluster_queue
        placement = decision.placement
        held = decision.pod_sets or (
            HeldPodSet("main", w.flavor, {GPU: w.gpus_per_pod}, placement),
        )
        new_pods = placement
        if w.carried:  # a workload slice: its admission covers the pods it takes over too
            placement = _merge(w.carried, placement)
            first = held[0]
            held = (HeldPodSet(first.name, first.flavor, first.per_pod, placement), *held[1:])
            replaced = self._workloads.get(w.replaces or "")
            if replaced is not None and replaced.key in self._state.holdings:
                self._state.remove(self._state.holdings[replaced.key])
        for ps in held:
            w.assigned[ps.name] = ps.flavor
        w.flavor = held[-1].flavor if w.any_flavor else w.flavor
        pod_sets = held if (len(held) > 1 or w.pod_sets) else ()
        self._state.add(
            Holding(w.key, cq, w.flavor, w.priority, now, w.gpus_per_pod, placement, pod_sets)
        )
        placements = {ps.name: ps.placement for ps in held} if w.pod_sets else None
        waited = now - w.queued_at
        if self._sync_checks(w, reserved=True):  # scheduler.go prepareWorkload
            ks.mark_reserved(w, placement, now, placements)
            w.phase, w.nominated, w.pending_message = "reserved", False, ""
            self._reserved_at[w.key] = now
            self._write_workload(w)
            self._out.event(w, "QuotaReserved", ks.quota_reserved_note(cq, waited), now)
            return
        ks.mark_admitted(w, placement, now, placements)
        self._unsuspend(w, held, new_pods, now)
        self._write_workload(w)
        self._out.event(w, "QuotaReserved", ks.quota_reserved_note(cq, waited), now)
        self._out.event(w, "Admitted", ks.admitted_note(cq), now)

    def _unsuspend(
        self,
        w: ko.SimWorkload,
        held: tuple[HeldPodSet, ...],
        new_pods: tuple[tuple[str, int], ...],
        now: float,
    ) -> None:
        """Admitted: the Job is unsuspended and its pods start."""
        w.phase, w.nominated, w.pending_message = "admitted", False, ""
        w.started, w.finish_at = now, now + w.remaining
        up = self._open_ups.get(w.key)
        if up is not None and up.admitted_at is None:
            up.admitted_at = now
            if w.elastic == "slice":  # a batch Job's scale-up is done once its pods run
                self._close(up, "done")
        if w.elastic:
            self._elastic.on_admitted(w, new_pods)
        else:
            for ps in held:
                for node, count in ps.placement:
                    for _ in range(count):
                        self._start_pod(w, node, ps.name)
            if self.truth is not None:  # a plain Job's pods run at once
                self.truth.admitted(_job_key(w), now)
                self.truth.started(_job_key(w), now)

    def _evict(
        self, victim: ko.SimWorkload, preemptor: ko.SimWorkload, reason: PreemptionReason
    ) -> None:
        now = self._clock
        paths = (self._queue_path(preemptor.cluster_queue), self._queue_path(victim.cluster_queue))
        message = ks.preemption_message(preemptor.uid, preemptor.job_uid, reason, paths)
        ks.mark_evicted(victim, reason, message, now)
        self._write_workload(victim)
        note = ks.priority_note(preemptor.priority, victim.priority)
        self._out.event(victim, "EvictedDueToPreempted", message, now)
        self._out.event(victim, "Preempted", message + note, now)
        self._out.event(
            preemptor, "PreemptedWorkload", ks.preempted_workload_note(victim, note), now
        )
        if victim.elastic:
            self._scale_preempted(victim)
        if self.truth is not None and not victim.elastic and victim.phase == "admitted":
            self.truth.stopped(_job_key(victim), victim.name, now, "preempted")
            self._restarts.pop(victim.key, None)
            self._starting.pop(victim.key, None)
        # The Job controller suspends the Job and its pods go; Kueue then releases the quota.
        self._release(victim)
        victim.checks = kc.reset_on_eviction(victim.checks, ko.rfc3339(now))
        self._reserved_at.pop(victim.key, None)
        self._reserved_verdict.pop(victim.key, None)
        ks.mark_requeued(victim, message, now)
        victim.phase, victim.queued_at, victim.pending_message = "pending", now, message
        ran = now - (victim.started if victim.started is not None else now)
        victim.remaining = max(MIN_RUN_S, victim.remaining - ran)
        victim.started = victim.finish_at = None
        self._write_workload(victim)
        if victim.elastic:
            before = self._elastic_state()
            self._elastic.on_evicted(victim)
            self._scale_diff(before, "evict")

    def _finish(self, w: ko.SimWorkload) -> None:
        if self.truth is not None and not w.elastic:
            self.truth.stopped(_job_key(w), w.name, self._clock, "completed")
        self._release(w)
        ks.mark_finished(w, self._clock)
        w.phase, w.finished_at, w.finish_at = "finished", self._clock, None
        self._write_workload(w)
        if w.elastic:
            before = self._elastic_state()
            self._elastic.on_finished(w)
            self._scale_diff(before, "finish")

    def _release(self, w: ko.SimWorkload) -> None:
        if w.key in self._state.holdings:
            self._state.remove(self._state.holdings[w.key])
        for pod in w.sim_pods:
            for gpu in pod.gpu_indices:
                self._gpu_owner[pod.node][gpu] = None
            self._out.drop("pods", w.namespace, pod.name)
        w.sim_pods = []

    def _set_pending(self, w: ko.SimWorkload, message: str, reason: str = "Pending") -> None:
        ks.mark_pending(w, message, self._clock, reason)
        if message != w.pending_message:
            w.pending_message = message
            self._out.event(w, "Pending", message, self._clock, type_="Warning")
        self._write_workload(w)

    def _queue_path(self, cluster_queue: str) -> str:
        """The cohort path Kueue prints in preemption messages (buildCQPath)."""
        return self._state.queue_path(cluster_queue)

    # --- admission checks (exporter/sim/kueue/checks.py) -------------------------------------

    def _queued(self, w: ko.SimWorkload) -> bool:
        """In Kueue's queue: pending, past any admission-check backoff (workload_controller.go
        keeps it out until requeueAt), in an active ClusterQueue."""
        return (
            w.phase == "pending"
            and w.backoff_until is None
            and w.cluster_queue not in self._cq_inactive
        )

    def _write_admission_checks(self, now: float) -> None:
        """The AdmissionCheck objects, as an admin creates them; a check's `Active` condition
        is its controller's to set (written here only when the config says so)."""
        if self._ac is None:
            return
        for check in self._ac.checks if self._ac.create else ():
            uid = self._uid_of(f"admissioncheck/{check.name}")
            manifest = kc.admission_check_manifest(check, uid, ko.rfc3339(now))
            self._out.put("admissionchecks", manifest)
        self._refresh_check_objects(now)

    def _refresh_check_objects(self, now: float) -> None:
        """Which checks exist and are Active (read back: their controllers set `Active`), and
        so which ClusterQueues are inactive (clusterqueue.go updateWithAdmissionChecks)."""
        assert self._ac is not None
        exists: dict[str, bool] = {}
        for check in self._ac.checks:
            if self._get is not None:
                obj = self._get("admissionchecks", "", check.name)
                exists[check.name] = obj is not None
                self._check_active[check.name] = obj is not None and kc.is_active(obj)
            else:
                exists[check.name] = self._ac.create
                self._check_active[check.name] = self._ac.create and check.active
        for cq in self._policies:
            names = [c.name for c in self._ac.for_queue(cq)]
            missing = [n for n in names if not exists[n]]
            inactive = [n for n in names if exists[n] and not self._check_active[n]]
            blocked = kc.queue_inactive(missing, inactive)
            old = self._cq_inactive.get(cq)
            if blocked is None:
                if self._cq_inactive.pop(cq, None) is not None:
                    self._cq_active_since[cq] = now
            elif old is None or old[:2] != blocked:
                self._cq_inactive[cq] = (*blocked, now)

    def _sync_checks(self, w: ko.SimWorkload, reserved: bool) -> bool:
        """Bring `w.checks` in step with its ClusterQueue (syncAdmissionCheckConditions,
        AdmissionChecksForWorkload); True when it has checks and not all are Ready."""
        if self._ac is None or w.elastic:
            return False
        specs = self._ac.for_queue(w.cluster_queue)
        if not specs and not w.checks:
            return False
        policy = self._policies.get(w.cluster_queue)
        flavors = policy.flavor_names() if policy is not None else []
        assigned = {w.assigned.get(ps.name, w.flavor) for ps in w.sets()} if reserved else None
        wanted = kc.checks_for_workload(specs, flavors, assigned)
        w.checks = kc.sync_entries(w.checks, wanted, ko.rfc3339(self._clock))
        return bool(w.checks) and not kc.all_ready(w.checks)

    def _pull_checks(self, w: ko.SimWorkload) -> bool:
        """Take each check entry a check controller changed in the API server since the
        simulation last wrote it (a three-way merge per entry, keyed by name); True when one
        was taken."""
        if self._get is None or not w.checks:
            return False
        stored = self._get("workloads", w.namespace, w.name)
        status = stored.get("status") if isinstance(stored, dict) else None
        entries = status.get("admissionChecks") if isinstance(status, dict) else None
        if not isinstance(entries, list):
            return False
        taken = False
        theirs = {e["name"]: e for e in entries if kc.valid_entry(e)}
        merged = []
        for ours in w.checks:
            name = ours["name"]
            other, base = theirs.get(name), w.checks_written.get(name)
            # Theirs when they changed it and the simulation did not (an eviction's reset,
            # not yet written, wins, as Kueue's retried patch would).
            if other is not None and base is not None and other != base and ours == base:
                merged.append(dict(other))
                w.checks_written[name] = dict(other)  # seen: the base of the next merge
                taken = True
            else:
                merged.append(ours)
        w.checks = merged
        return taken

    def _run_checks(self, now: float) -> None:
        """Kueue's workload controller on every workload its checks concern: read the check
        controllers' verdicts; a Retry's requeueAfterSeconds sets requeueAt
        (NeedsRequeueAtUpdate); any Rejected deactivates, else any Retry evicts
        (reconcileCheckBasedEviction); all Ready admits (SyncAdmittedCondition); a backoff
        that has run out requeues; a ClusterQueue's inactive check holds its queue."""
        if self._ac is None:
            return
        self._refresh_check_objects(now)
        for w in sorted(self._workloads.values(), key=lambda w: w.key):
            if w.elastic:
                continue
            if w.phase in ("reserved", "admitted") and w.checks:
                taken = self._pull_checks(w)
                at = kc.max_retry_time(w.checks)
                if at is not None and at > now and (w.backoff_until or 0.0) < at:
                    w.backoff_until = at
                if kc.states(w.checks, kc.REJECTED):
                    self._deactivate(w, now)
                elif kc.states(w.checks, kc.RETRY):
                    self._check_evict(w, now)
                elif w.phase == "reserved" and kc.all_ready(w.checks):
                    self._checks_ready(w, now)
                elif taken:  # a verdict that changes nothing yet (a Pending message, say)
                    self._write_workload(w)
            elif w.phase == "pending" and w.backoff_until is not None and w.backoff_until <= now:
                ks.mark_backoff_finished(w, now)
                self._write_workload(w)
            elif w.phase == "pending" and w.cluster_queue in self._cq_inactive:
                message = f"ClusterQueue {w.cluster_queue} is inactive"
                if message != w.pending_message:  # the workload controller's, no event
                    reason, detail, _ = self._cq_inactive[w.cluster_queue]
                    verdict = Verdict("misconfigured", detail=f"{reason}: {detail}")
                    self._record(w, "pending", verdict, message)
                    ks.mark_pending(w, message, now, "Inadmissible")
                    w.pending_message = message
                    self._write_workload(w)

    def _checks_ready(self, w: ko.SimWorkload, now: float) -> None:
        """Every check Ready: Admitted, the Job unsuspended, its pods start."""
        holding = self._state.holdings.get(w.key)
        if holding is None:  # cannot happen: a reserved workload holds its quota
            return
        since = self._reserved_at.pop(w.key, now)
        ks.mark_checks_ready(w, now)
        self._unsuspend(w, holding.sets(), holding.placement, now)
        self._write_workload(w)
        self._out.event(w, "Admitted", ks.admitted_note(w.cluster_queue, now - since), now)
        placed = self._reserved_verdict.pop(w.key, Verdict(flavor=w.flavor))
        ready = "admission checks Ready: " + ", ".join(c["name"] for c in w.checks)
        verdict = Verdict(
            flavor=placed.flavor, level=placed.level, domains=placed.domains, detail=ready
        )
        self._record(w, "admitted", verdict)

    def _check_stop(self, w: ko.SimWorkload, now: float) -> None:
        """The Job is suspended: its pods go, then Kueue releases the quota."""
        if w.phase == "admitted":
            if self.truth is not None:
                self.truth.stopped(_job_key(w), w.name, now, kc.CAUSE)
                self._restarts.pop(w.key, None)
                self._starting.pop(w.key, None)
            ran = now - (w.started if w.started is not None else now)
            w.remaining = max(MIN_RUN_S, w.remaining - ran)
        w.started = w.finish_at = None
        self._release(w)
        self._reserved_at.pop(w.key, None)
        self._reserved_verdict.pop(w.key, None)

    def _check_evict(self, w: ko.SimWorkload, now: float) -> None:
        """A check is Retry: evicted (reason AdmissionCheck), quota released, checks reset to
        Pending, requeued once requeueAt (a Retry's requeueAfterSeconds) has passed."""
        message = "Evicted due to " + kc.checks_message(kc.states(w.checks, kc.RETRY), kc.RETRY)
        detail = "Retry: " + ", ".join(c["name"] for c in kc.states(w.checks, kc.RETRY))
        self._record(
            w, "evicted", Verdict(kc.CAUSE, detail=detail), message, reason=kc.EVICTED_BY_CHECK
        )
        self._check_stop(w, now)
        ks.mark_check_evicted(w, kc.EVICTED_BY_CHECK, message, now)
        self._out.event(w, "EvictedDueToAdmissionCheck", message, now)
        w.phase, w.queued_at, w.pending_message, w.nominated = "pending", now, message, False
        if w.backoff_until is None or w.backoff_until <= now:
            ks.mark_backoff_finished(w, now)
        self._write_workload(w)

    def _deactivate(self, w: ko.SimWorkload, now: float) -> None:
        """A check is Rejected: DeactivationTarget, spec.active false, then evicted (reason
        DeactivatedDueToAdmissionCheck, requeueState cleared), quota released; it stays
        inactive until someone sets spec.active again (not simulated)."""
        rejected = kc.checks_message(kc.states(w.checks, kc.REJECTED), kc.REJECTED)
        message = "The workload is deactivated due to " + rejected
        detail = "Rejected: " + ", ".join(c["name"] for c in kc.states(w.checks, kc.REJECTED))
        self._record(
            w, "deactivated", Verdict(kc.CAUSE, detail=detail), message, reason=kc.EVICTED_BY_CHECK
        )
        self._out.event(
            w, "AdmissionCheckRejected", f"Deactivated due to {rejected}", now, "Warning"
        )
        self._check_stop(w, now)
        ks.mark_check_evicted(w, kc.DEACTIVATED_BY_CHECK, message, now)
        self._out.event(w, "EvictedDueToDeactivatedDueToAdmissionCheck", message, now)
        w.active, w.phase, w.pending_message, w.nominated = False, "inactive", message, False
        w.backoff_until = w.requeue_at = None
        w.requeue_count = 0
        self._write_workload(w)

    # --- the admission check's oracle -----------------------------------------------------------

    def observable_problem(self, node: str) -> str | None:
        """Why `node` is unfit for new work as its published Node object shows it, or None.

        Only what the simulation has written onto the Node counts, the same facts topowatch's
        check judges (exporter/cluster/admission/decide.py, and Kueue leaves the judgment to
        the check's controller): an actionable finding that asks for an action on the
        `topowatch.io/findings` annotation, HyperPod's `Unschedulable*` health label (which
        also cordons the node here), the Ready condition gone. A fault the node agent has
        found but not yet reported (`_reports`), or one not yet found, is not observable: a
        check that answers Ready then is right, and benchmarks/admission_day.py counts such
        admissions as races, not misses."""
        found = [] if node in self._garbled else self._findings.get(node, [])
        live = [f for f in found if f.get("actionable") and f.get("action") not in (None, "none")]
        if live:
            return "finding on the Node: " + ", ".join(
                f"{f.get('check')} {f.get('component')} action={f.get('action')}" for f in live
            )
        health = self._health.get(node, "Schedulable")
        if health != "Schedulable":
            return f"HyperPod health {health} (cordoned)"
        if node in self._down:
            return "not Ready"
        return None

    def placement(self, key: str) -> list[str]:
        """The nodes workload `key` holds quota on (its TAS assignment), sorted; [] if none."""
        holding = self._state.holdings.get(key)
        return sorted({n for ps in holding.sets() for n, _ in ps.placement}) if holding else []

    def admission_truth(self, key: str) -> tuple[str, str, tuple[str, ...]]:
        """(Ready or Retry, why, the unfit nodes) for workload `key` now: Retry when any node
        of its placement (the TAS assignment Kueue wrote) is unfit by `observable_problem`."""
        nodes = self.placement(key)
        bad = [(n, p) for n in nodes if (p := self.observable_problem(n)) is not None]
        if bad:
            return kc.RETRY, "; ".join(f"node {n}: {p}" for n, p in bad), tuple(n for n, _ in bad)
        return kc.READY, f"{len(nodes)} assigned node(s) fit", ()

    def note_check_verdicts(self) -> list[Decision]:
        """Log (kind `admission`) each verdict of the node-health check a controller wrote in
        the API server since the simulation last wrote the entry, with the truth at this
        moment (`admission_truth`): call it right after the controller's cycle, before the
        next step, so the truth is what the controller could see when it decided. `cause` is
        the truth's state, `verdict` the controller's, `detail` why, `domains` the unfit
        nodes, `message` the controller's message."""
        if self._ac is None or self._get is None:
            return []
        ours = {c.name for c in self._ac.checks if c.controller == kc.NODE_HEALTH_CONTROLLER}
        out: list[Decision] = []
        for w in sorted(self._workloads.values(), key=lambda w: w.key):
            if w.phase not in ("reserved", "admitted") or not w.checks:
                continue
            stored = self._get("workloads", w.namespace, w.name)
            status = stored.get("status") if isinstance(stored, dict) else None
            entries = status.get("admissionChecks") if isinstance(status, dict) else None
            for e in entries if isinstance(entries, list) else ():
                if not kc.valid_entry(e) or e["name"] not in ours or e["state"] == kc.PENDING:
                    continue
                if e == w.checks_written.get(e["name"]):
                    continue  # as the simulation wrote it (or already took it)
                mark = (w.uid, e["name"], e["state"], str(e.get("lastTransitionTime", "")))
                if mark in self._verdicts_noted:
                    continue
                self._verdicts_noted.add(mark)
                truth, why, nodes = self.admission_truth(w.key)
                decision = Decision(
                    seed=self.decisions.seed,
                    step=self.step_index,
                    time=self._now,
                    kind="admission",
                    workload=w.key,
                    uid=w.uid,
                    cluster_queue=w.cluster_queue,
                    cause=truth,
                    domains=nodes,
                    detail=why,
                    message=str(e.get("message", "")),
                    verdict=e["state"],
                )
                self.decisions.add(decision)
                out.append(decision)
        return out

    def stand_in_checks(self, backoff_s: int = 30, max_backoff_s: int = 600) -> int:
        """Answer every Pending node-health check as its controller would, from the truth
        (`admission_truth`): Ready, or Retry with requeueAfterSeconds `backoff_s` doubled per
        earlier Retry up to `max_backoff_s`. For a cluster's past, before a real controller
        watches (the demo's history). Returns the entries answered."""
        if self._ac is None:
            return 0
        ours = {c.name for c in self._ac.checks if c.controller == kc.NODE_HEALTH_CONTROLLER}
        answered = 0
        for w in sorted(self._workloads.values(), key=lambda w: w.key):
            if w.phase != "reserved" or not w.checks:
                continue
            changed = False
            for entry in w.checks:
                if entry.get("name") not in ours or entry.get("state") != kc.PENDING:
                    continue
                truth, why, _ = self.admission_truth(w.key)
                entry.update(state=truth, lastTransitionTime=ko.rfc3339(self._now))
                entry["message"] = why[:1024]
                if truth == kc.RETRY:
                    count = entry.get("retryCount")
                    wait = backoff_s * 2 ** (count if isinstance(count, int) else 0)
                    entry["requeueAfterSeconds"] = min(wait, max_backoff_s)
                changed = True
                answered += 1
            if changed:
                self._write_workload(w)
        return answered

    # --- elastic jobs: the operator's scale events, as it caused them --------------------------

    def _tick(self, now: float, warm: bool = False) -> None:
        before = self._elastic_state()
        self._elastic.tick(now, warm=warm)
        self._ticked = now  # the operator writes a pod Ready at its first pass after ready_at
        self._scale_diff(before, "tick")

    def _was_ready(self, w: ko.SimWorkload) -> bool:
        """Every pod of `w` has been Ready, as its Pod objects said (a HyperPod pod is written
        Ready at the operator's first pass after it started; a slice's bound pods run at
        once)."""
        if not w.sim_pods:
            return False
        return all(
            (p.ready_at is not None and p.ready_at <= self._ticked)
            or (w.elastic == "slice" and bool(p.node))
            for p in w.sim_pods
        )

    def _elastic_state(self) -> ElasticState:
        """Elastic Workloads (phase, pods, kind, job, namespace) and each HyperPodPyTorchJob's
        operator state (the Workload it is faulting, the faulty-restart flag, completion,
        target), read from the operator without changing it: it keeps no log of its own."""
        workloads = {
            k: (w.phase, w.pods, w.elastic, w.job, w.namespace, self._was_ready(w))
            for k, w in self._workloads.items()
            if w.elastic
        }
        jobs: dict[str, tuple[str | None, bool, float | None, int | None]] = {}
        for key, job in getattr(self._elastic, "_jobs", {}).items():
            fault = job.fault[0] if job.fault is not None else None
            # The size it last (re)started at: `world` where the operator keeps it apart from
            # the size it scales to, else `target` (both read, never written).
            world = getattr(job, "world", job.target)
            jobs[key] = (fault, job.faulty_pending, job.completion_time, world)
        return workloads, jobs

    def _job_size(self, namespace: str, job: str, kind: str) -> int:
        return sum(
            w.pods
            for w in self._workloads.values()
            if w.namespace == namespace
            and w.job == job
            and w.elastic == kind
            and w.phase == "admitted"
        )

    def _scale(
        self,
        w_namespace: str,
        kind: str,
        job: str,
        workload: str,
        direction: str,
        start: int | None,
        end: int | None,
        cause: str,
        truth_kind: str = "scale",
    ) -> ScaleTruth:
        job_kind = HYPERPOD_KIND if kind == "hyperpod" else "Job"
        return self.decisions.add_scale(
            ScaleTruth(
                seed=self.decisions.seed,
                step=self.step_index,
                time=self._clock,
                job=(w_namespace, job_kind, job),
                workload=workload,
                direction=direction,
                from_replicas=start,
                to_replicas=end,
                cause=cause,
                kind=truth_kind,
            )
        )

    def _close(self, up: ScaleTruth, outcome: str, why: str = "") -> None:
        if up.outcome:
            return
        up.outcome, up.failed, up.closed_step = outcome, why, self.step_index
        for key, open_up in list(self._open_ups.items()):
            if open_up is up:
                del self._open_ups[key]

    def _scale_requested(self, w: ko.SimWorkload) -> None:
        """A new elastic Workload: a HyperPod scale-up (any but the job's first) or a Kueue
        slice replacing another."""
        if w.elastic == "hyperpod":
            job_key = (w.namespace, w.job)
            if job_key not in self._hp_base:
                self._hp_base[job_key] = w.key
                return
            size = self._job_size(w.namespace, w.job, "hyperpod")
            up = self._scale(
                w.namespace, "hyperpod", w.job, w.name, "up", size, size + w.pods, "capacity_freed"
            )
            self._open_ups[w.key] = up
        elif w.elastic == "slice" and w.replaces:
            old = self._workloads.get(w.replaces)
            start = old.pods if old is not None else None
            up = self._scale(
                w.namespace, "slice", w.job, w.name, "up", start, w.pods, "user_change"
            )
            self._open_ups[w.key] = up

    def _scale_preempted(self, victim: ko.SimWorkload) -> None:
        """Kueue preempts an elastic Workload: the job shrinks by its pods."""
        kind = victim.elastic
        if kind == "hyperpod":
            size = self._job_size(victim.namespace, victim.job, kind)
            self._scale(
                victim.namespace, kind, victim.job, victim.name, "down", size,
                size - victim.pods, "preemption",
            )  # fmt: skip
        else:
            self._scale(
                victim.namespace, kind, victim.job, victim.name, "down", victim.pods, 0,
                "preemption",
            )  # fmt: skip
        up = self._open_ups.get(victim.key)
        if up is not None:  # issue 16: admitted, then preempted: ended, unless before Ready
            if self._was_ready(victim):
                self._close(up, "ended", "preempted after its pods were Ready")
            else:
                self._close(up, "failed", "preempted before its pods were Ready")

    def _scale_diff(self, before: ElasticState, context: str) -> None:
        """What the operator did since `before`: Workloads it removed (a scale-down and its
        cause, or a failed scale-up), slices it shrank, restarts that completed scale-ups."""
        workloads, jobs = before
        after, jobs_after = self._elastic_state()
        sizes: dict[tuple[str, str], int] = {}
        for phase, pods, kind, job, ns, _ in workloads.values():
            if kind == "hyperpod" and phase == "admitted":
                sizes[(ns, job)] = sizes.get((ns, job), 0) + pods
        for key, (phase, pods, kind, job, ns, ready) in workloads.items():
            now_state = after.get(key)
            if now_state is not None:
                if kind == "slice" and phase == "admitted" == now_state[0] and now_state[1] < pods:
                    name = key.split("/", 1)[1]
                    self._scale(ns, kind, job, name, "down", pods, now_state[1], "user_change")
                continue
            name = key.split("/", 1)[1]
            up = self._open_ups.get(key)
            if kind == "hyperpod" and phase == "admitted":
                fault, _, completed, _ = jobs.get(f"{ns}/{job}", (None, False, None, None))
                base = self._hp_base.get((ns, job), "")
                base_phase = workloads.get(base, ("",))[0]
                size = sizes.get((ns, job), 0)
                sizes[(ns, job)] = size - pods
                if fault == key:
                    self._scale(ns, kind, job, name, "down", size, size - pods, "faulty_pod")
                elif context == "finish" or completed is not None:
                    self._scale(ns, kind, job, name, "down", size, size - pods, "", "finished")
                elif base_phase != "admitted":
                    self._scale(ns, kind, job, name, "down", size, size - pods, "preemption")
                else:
                    self._scale(ns, kind, job, name, "down", size, size - pods, "unknown")
            if up is not None:
                if phase == "admitted" and ready:  # issue 16: it ran; its removal is a down
                    self._close(up, "ended", "removed after its pods were Ready")
                elif phase == "admitted":
                    self._close(up, "failed", "removed before its pods were Ready")
                else:
                    self._close(up, "failed", "withdrawn before admission")
        for key, (_, _, _, world) in jobs_after.items():  # restarts at a new world size
            if world is None or world == jobs.get(key, (None, None, None, None))[3]:
                continue
            ns, job = key.split("/", 1)
            for up in list(self._open_ups.values()):
                same = up.job == (ns, HYPERPOD_KIND, job)
                if same and up.admitted_at is not None and (up.to_replicas or 0) <= world:
                    self._close(up, "done")

    # --- jobs and pods ------------------------------------------------------------------------

    def _new_workload(
        self,
        team: str,
        job: str,
        flavor: str,
        pods: int,
        gpus_per_pod: int,
        priority_class: str,
        topology: tuple[Mode, str] | None,
        runtime: float,
        pod_sets: tuple[ko.SimPodSet, ...] = (),
        any_flavor: bool = False,
    ) -> ko.SimWorkload:
        ns = layout.namespace(team)
        if any(w.namespace == ns and w.job == job for w in self._workloads.values()):
            raise ValueError(f"a job named {job!r} already exists in {ns}")
        w = ko.SimWorkload(
            team=team,
            namespace=ns,
            job=job,
            job_uid=self._uid(),
            name=f"job-{job}-{self._rng.getrandbits(20):05x}",  # Kueue: job-<name>-<hash>
            uid=self._uid(),
            created=self._clock,
            local_queue=layout.local_queue(team),
            cluster_queue=layout.cluster_queue(team),
            priority_class=priority_class,
            priority=layout.PRIORITY[priority_class],
            flavor=flavor,
            pods=pods,
            gpus_per_pod=gpus_per_pod,
            topology=topology,
            remaining=runtime,
            queued_at=self._clock,
            pod_sets=pod_sets,
            any_flavor=any_flavor,
        )
        self._workloads[w.key] = w
        self._write_workload(w)
        return w

    def _submit_random(self, job: JobRequest) -> None:
        self._clock = job.time
        self._job_seq += 1
        t = job.template
        name = f"{job.team}-{t.stem}-{self._job_seq:04d}"
        if t.elastic:
            self._elastic.submit_random(job, name)
            return
        pod_sets: tuple[ko.SimPodSet, ...] = ()
        any_flavor = False
        if self._fidelity is not None:
            pod_sets, any_flavor = fid.pod_sets_for(t, job.pods, job.gpus_per_pod, self._rng)
            if not self._fidelity.resources:
                pod_sets = fid.strip_resources(pod_sets)
        self._new_workload(
            job.team,
            name,
            t.flavor,
            job.pods,
            job.gpus_per_pod,
            t.priority_class,
            t.topology,
            job.runtime,
            pod_sets,
            any_flavor,
        )

    def _start_pod(
        self, w: ko.SimWorkload, node: str, pod_set: str = ko.POD_SET, ready: bool = True
    ) -> None:
        owners = self._gpu_owner[node]
        gpus_needed = w.pod_set(pod_set).requests.get(GPU, 0)
        gpus = tuple([i for i, owner in enumerate(owners) if owner is None][:gpus_needed])
        index = len(w.sim_pods)
        suffix = "".join(self._rng.choice(POD_NAME_ALPHABET) for _ in range(5))
        name = f"{w.job}-{index}-{suffix}"
        pod = ko.SimPod(name, self._uid(), index, node, gpus, self._clock, pod_set=pod_set)
        for gpu in gpus:
            owners[gpu] = (w.namespace, pod.name, ko.CONTAINER)
        w.sim_pods.append(pod)
        manifest = ko.pod_manifest(w, pod, layout.INSTANCE_TYPE, self._node_index[node])
        if not ready:
            _not_ready(manifest)
        self._out.put("pods", manifest)

    def _collect_garbage(self) -> None:
        now = self._now
        for key, w in list(self._workloads.items()):
            done = w.finished_at is not None and w.finished_at + FINISHED_RETENTION_S <= now
            abandoned = (
                w.phase in ("pending", "inactive")
                and not w.scripted
                and now - w.created >= ABANDON_AFTER_S
            )
            if done or abandoned:
                if self.truth is not None and not w.elastic:
                    self.truth.ended(_job_key(w), now)
                self._out.drop("workloads", w.namespace, w.name)
                del self._workloads[key]
                self._cache.pop(key, None)
                if w.elastic:
                    self._release(w)  # an abandoned slice's gated pods go with it
                    self._elastic.on_deleted(w)
        self._out.expire_events(now)

    # --- writing ------------------------------------------------------------------------------

    def _write_workload(self, w: ko.SimWorkload) -> None:
        if not w.covered:
            policy = self._policies.get(w.cluster_queue)
            w.covered = tuple(r for g in policy.groups for r in g.covered) if policy else (GPU,)
        if w.key not in self._seen:
            self._seen.add(w.key)
            if w.elastic:
                self._scale_requested(w)
        if self._ac is not None and not w.elastic:
            self._pull_checks(w)
            self._sync_checks(w, reserved=w.phase in ("reserved", "admitted"))
        self._out.put("workloads", ko.workload_manifest(w, layout.INSTANCE_TYPE))
        w.checks_written = {c["name"]: dict(c) for c in w.checks}

    def _write_node(self, node: SimNode) -> None:
        health = self._health[node.name]
        labels = {**node.labels, layout.HEALTH: health}
        uid = self._uid_of(f"node/{node.name}")
        index = self._node_index[node.name]
        taints = fid.node_taints(self._fidelity, node.instance_type)
        manifest = ko.node_manifest(
            node.name, labels, node.gpus, uid, self._start, health, index, taints
        )
        manifest["status"]["nodeInfo"] = self._node_info(node)
        if node.name in self._findings or node.name in self._garbled:  # the agent's annotation
            text = json.dumps(self._findings.get(node.name, []), separators=(",", ":"))
            if node.name in self._garbled:
                text = text[: len(text) // 2] + "\u0000{"
            manifest["metadata"]["annotations"] = {FINDINGS_ANNOTATION: text}
        us = node.labels.get(layout.ULTRASERVER, "")
        if us:  # the agent's NVLink fabric summary (issue 30); it stays while the node is down
            fabric = NodeFabric(
                node.gpus, node.gpus, str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{us}.fabric")), 32766
            )  # the cluster UUID the simulated NVML gives the UltraServer's GPUs
            manifest["metadata"].setdefault("annotations", {})[FABRIC_ANNOTATION] = fabric.to_json()
        if node.name in self._down:
            for cond in manifest["status"]["conditions"]:
                if cond["type"] == "Ready":
                    cond.update(
                        status="Unknown",
                        reason="NodeStatusUnknown",
                        message="Kubelet stopped posting node status.",
                        lastTransitionTime=ko.rfc3339(self._clock),
                    )
        self._out.put("nodes", manifest)

    def _node_info(self, node: SimNode) -> dict[str, str]:
        """status.nodeInfo as the kubelet of a HyperPod EKS node reports it (every field the
        API requires); bootID changes with each reboot or replacement."""
        machine = uuid.uuid5(uuid.NAMESPACE_URL, f"topowatch-sim/{node.name}/machine")
        arm = node.instance_type == layout.GB200
        return {
            "architecture": "arm64" if arm else "amd64",
            "bootID": self.boot_id(node.name),
            "containerRuntimeVersion": "containerd://1.7.27",
            "kernelVersion": f"6.1.134-152.225.amzn2023.{'aarch64' if arm else 'x86_64'}",
            "kubeProxyVersion": "v1.32.3-eks-473151a",
            "kubeletVersion": "v1.32.3-eks-473151a",
            "machineID": machine.hex,
            "operatingSystem": "linux",
            "osImage": "Amazon Linux 2023.7.20250527",
            "systemUUID": str(machine),
        }

    def _write_queues(self) -> None:
        for team in self._shape.teams:
            cq, lq, ns = (
                layout.cluster_queue(team),
                layout.local_queue(team),
                layout.namespace(team),
            )
            policy = self._policies[cq]
            usage = {
                (f.name, r): (self._state.used(cq, f.name, r), self._state.borrowed(cq, f.name, r))
                for g in policy.groups
                for f in g.flavors
                for r in g.covered
            }
            members = [w for w in self._workloads.values() if w.cluster_queue == cq]
            admitted = sum(1 for w in members if w.phase == "admitted")
            reserving = admitted + sum(1 for w in members if w.phase == "reserved")
            pending = sum(1 for w in members if w.phase == "pending")
            counts = ko.QueueCounts(pending=pending, reserving=reserving, admitted=admitted)
            checks = self._ac.for_queue(cq) if self._ac is not None else ()
            manifest = ko.cluster_queue_manifest(
                policy,
                ns,
                usage,
                counts,
                self._uid_of(cq),
                self._start,
                checks,
                self._cq_inactive.get(cq),
                self._cq_active_since.get(cq),
            )
            self._out.put("clusterqueues", manifest)
            lq_uid = self._uid_of(f"{ns}/{lq}")
            blocked = self._cq_inactive.get(cq)
            lq_manifest = ko.local_queue_manifest(
                lq,
                ns,
                cq,
                usage,
                counts,
                lq_uid,
                self._start,
                blocked[2] if blocked else None,
                self._cq_active_since.get(cq),
            )
            self._out.put("localqueues", lq_manifest)

    # --- node faults (exporter/sim/node_faults.py) ----------------------------------------------

    def inject_node_fault(self, node: str, kind: str) -> None:
        """A fault of kind `kind` (a `FaultKind` name of the mix, or "proactive_reboot") on
        `node` now, as if drawn: the jobs on it stop, HyperPod repairs it, the operator
        resumes them. Raises ValueError without faults on, for an unknown node or kind."""
        if self._fault_draw is None or self.truth is None:
            raise ValueError("node faults are off: build the cluster with faults=FaultRates()")
        if node not in self._node_index:
            raise ValueError(f"no node named {node!r}")
        kinds = {k.name: k for k in (*self._fault_draw.rates.mix, PROACTIVE)}
        if kind not in kinds:
            raise ValueError(f"unknown fault {kind!r}; known: {', '.join(sorted(kinds))}")
        self.bootstrap()
        self._clock = self._now
        self._fault(node, kinds[kind], self._now)

    def _node_faults(self, now: float) -> None:
        """HyperPod's actions that are due, then new faults, then the operator restarting
        the jobs faults stopped, then their pods turning Ready."""
        draw = self._fault_draw
        assert draw is not None and self.truth is not None
        dt, self._faults_at = now - self._faults_at, now
        self._actions.sort()
        while self._actions and self._actions[0][0] <= now:
            _, _, what, node, kind = self._actions.pop(0)
            self._node_action(what, node, kind, now)
        healthy = [n.name for n in self._nodes if n.name not in self._repairing]
        for node, kind in draw.faults(healthy, dt):
            self._fault(node, kind, now)
        for key, not_before in sorted(self._restarts.items()):
            w = self._workloads.get(key)
            holding = self._state.holdings.get(key)
            if w is None or w.phase != "admitted" or holding is None:
                del self._restarts[key]
                continue
            sets = holding.sets()
            nodes = {node for ps in sets for node, _ in ps.placement}
            if now < not_before or nodes & (self._repairing | self._down):
                continue
            del self._restarts[key]
            for ps in sets:
                for node, count in ps.placement:
                    for _ in range(count):
                        self._start_pod(w, node, ps.name, ready=False)
            self._starting[key] = now + draw.between(draw.rates.startup_s)
        for key, ready_at in sorted(self._starting.items()):
            w = self._workloads.get(key)
            if w is None or w.phase != "admitted":
                del self._starting[key]
                continue
            if now < ready_at:
                continue
            del self._starting[key]
            for pod in w.sim_pods:
                manifest = ko.pod_manifest(w, pod, layout.INSTANCE_TYPE, self._node_index[pod.node])
                _ready(manifest, now)
                self._out.put("pods", manifest)
            w.started, w.finish_at = now, now + w.remaining
            self.truth.started(_job_key(w), now)

    def _fault(self, node: str, kind: FaultKind, now: float) -> None:
        draw = self._fault_draw
        assert draw is not None and self.truth is not None
        self.truth.faults.append((now, node, kind.name))
        if kind.check:
            if kind.where == "gpu":
                gpus = self._nodes[self._node_index[node]].gpus
                component = f"gpu{draw.rng.randrange(gpus)}"
            elif kind.where == "efa":
                component = f"rdmap{draw.rng.randrange(16, 200)}s27:1"
            else:
                component = "node"
            # The agent's clock may be a little off the API server's, and it writes the
            # annotation at its next report: the finding can arrive after the pods' end.
            stamp = format_time(now + draw.between(draw.rates.agent_skew_s))
            self._reports.setdefault(node, []).append(
                {
                    "check": kind.check,
                    "component": component,
                    "severity": kind.severity,
                    "action": kind.action,
                    "evidence": kind.evidence,
                    "firstSeen": stamp,
                    "lastSeen": stamp,
                    "actionable": True,
                }
            )
            self._plan(now + draw.between(draw.rates.report_delay_s), "report", node, kind)
        if kind.node_down:
            self._down.add(node)
        if kind.repair and kind is not PROACTIVE:
            self._repairing.add(node)
            self._state.cordon(node, True)  # no new pods on a broken node
        self._write_node(self._nodes[self._node_index[node]])
        if kind is PROACTIVE:  # nothing stops yet: HyperPod reboots the node a while later
            self._plan(now + draw.between(draw.rates.remediation_after_s), "remediate", node, kind)
            return
        self._stop_jobs_on(node, now, "node_fault", kind)
        if kind.repair:
            label = now + draw.between(draw.rates.detect_to_action_s)
            self._plan(label, "label", node, kind)
            self._plan(label + draw.between(kind.repair_s), "back", node, kind)
        else:
            self._plan(now + 600.0, "clear", node, kind)  # the agent's finding ages out

    def _node_action(self, what: str, node: str, kind: FaultKind, now: float) -> None:
        draw = self._fault_draw
        assert draw is not None
        sim_node = self._nodes[self._node_index[node]]
        if what == "label":
            health = (
                "UnschedulablePendingReplacement"
                if kind.repair == "replace"
                else ("UnschedulablePendingReboot")
            )
            self.cordon(node, health)
        elif what == "remediate":
            if node in self._repairing:
                return  # a fault got there first: its repair clears the warning too
            self._repairing.add(node)
            replacing = kind.repair == "replace"
            self.cordon(
                node,
                "UnschedulablePendingReplacement" if replacing else "UnschedulablePendingReboot",
            )
            self._stop_jobs_on(node, now, "remediation", kind)
            self._plan(now + draw.between(kind.repair_s), "back", node, kind)
        elif what == "report":
            waiting = self._reports.pop(node, [])
            if waiting and draw.rng.random() < draw.rates.garbled_report_p:
                self._garbled.add(node)  # this write is garbage; the next one is right
                self._reports[node] = waiting
                self._plan(now + draw.between(draw.rates.report_delay_s), "report", node, kind)
            else:
                self._garbled.discard(node)
                self._findings.setdefault(node, []).extend(waiting)
            self._write_node(sim_node)
        elif what == "back":
            if node in self._findings:  # the node agent starts afresh: nothing found yet
                self._findings[node] = []
            if kind.repair:  # rebooted, or a new instance: a new boot ID
                self._boots[node] = self._boots.get(node, 0) + 1
            self._down.discard(node)
            self._repairing.discard(node)
            self.cordon(node, "Schedulable")
        elif what == "clear":
            found = self._findings.get(node, [])
            self._findings[node] = [f for f in found if f["check"] != kind.check]
            self._write_node(sim_node)

    def _plan(self, when: float, what: str, node: str, kind: FaultKind) -> None:
        self._action_seq += 1
        self._actions.append((when, self._action_seq, what, node, kind))

    def _stop_jobs_on(self, node: str, now: float, cause: str, kind: FaultKind) -> None:
        """Every plain Job with a pod on `node` stops; the operator will restart it."""
        draw = self._fault_draw
        assert draw is not None and self.truth is not None
        hit = [
            w
            for w in self._workloads.values()
            if w.phase == "admitted" and not w.elastic and any(p.node == node for p in w.sim_pods)
        ]
        for w in sorted(hit, key=lambda w: w.key):
            self.truth.stopped(_job_key(w), w.name, now, cause, kind.component, node, kind.name)
            if w.started is not None:
                w.remaining = max(MIN_RUN_S, w.remaining - (now - w.started))
            w.started = w.finish_at = None
            for pod in w.sim_pods:
                for gpu in pod.gpu_indices:
                    self._gpu_owner[pod.node][gpu] = None
                self._out.drop("pods", w.namespace, pod.name)
            w.sim_pods = []
            self._starting.pop(w.key, None)
            self._restarts[w.key] = now + draw.between(draw.rates.restart_delay_s)

    # --- helpers ------------------------------------------------------------------------------

    def _uid(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def _uid_of(self, name: str) -> str:
        """A stable uid for a long-lived object, drawn the first time it is written."""
        if name not in self._uids:
            self._uids[name] = self._uid()
        return self._uids[name]

    def _default_flavor(self, topology: tuple[Mode, str] | None) -> str:
        if topology is not None and topology[1] == layout.ULTRASERVER:
            return layout.GB200
        return layout.P5 if layout.P5 in self._state.flavors else layout.GB200


def _borrows(decision: KueueDecision) -> bool:
    return decision.borrowing


def _slot(node: SimNode, flavors: dict[str, FlavorSpec], fidelity: Fidelity | None) -> NodeSlot:
    levels = flavors[node.instance_type].levels
    return NodeSlot(
        node.name,
        node.instance_type,
        node.gpus,
        tuple(node.labels[k] for k in levels),
        allocatable=ko.node_allocatable(node.instance_type, node.gpus),
        taints=fid.node_taints(fidelity, node.instance_type),
        labels=dict(node.labels),
    )


def _demand(w: ko.SimWorkload) -> Demand:
    """What `w` asks of the scheduler; a workload slice asks only for the pods its replaced
    slice does not already hold (Kueue counts the old slice's usage as the new one's)."""
    mode: Mode = w.topology[0] if w.topology else "unconstrained"
    level = w.topology[1] if w.topology else None
    if not w.pod_sets and not w.any_flavor:
        pods = w.pods - sum(count for _, count in w.carried)
        return Demand(
            w.key, w.cluster_queue, w.flavor, pods, w.gpus_per_pod, w.priority, mode, level
        )
    selector = {} if w.any_flavor else {layout.INSTANCE_TYPE: w.flavor}
    sets = tuple(
        PodSetSpec(
            ps.name,
            ps.count,
            dict(ps.requests),
            ps.topology[0] if ps.topology else "unconstrained",
            ps.topology[1] if ps.topology else None,
            ps.tolerations,
            selector,
        )
        for ps in w.sets()
    )
    flavor = "" if w.any_flavor else w.flavor
    return Demand(
        w.key, w.cluster_queue, flavor, w.pods, w.gpus_per_pod, w.priority, mode, level, sets
    )


def _merge(
    first: tuple[tuple[str, int], ...], second: tuple[tuple[str, int], ...]
) -> tuple[tuple[str, int], ...]:
    """Two placements as one: pods per node, nodes in first-seen order."""
    merged: dict[str, int] = {}
    for node, count in (*first, *second):
        merged[node] = merged.get(node, 0) + count
    return tuple(merged.items())


def _job_key(w: ko.SimWorkload) -> tuple[str, str, str]:
    """The job a Workload belongs to, as the goodput ledger keys it (its owner)."""
    return (w.namespace, w.owner_kind, w.job)


def _not_ready(manifest: dict[str, object]) -> None:
    """A pod bound and starting: Pending, its containers not Ready yet."""
    status = manifest["status"]
    assert isinstance(status, dict)
    status["phase"] = "Pending"
    for cond in status["conditions"]:
        if cond["type"] in ("ContainersReady", "Ready"):
            cond.update(status="False", reason="ContainersNotReady")
    for container in status["containerStatuses"]:
        container.update(
            ready=False, started=False, state={"waiting": {"reason": "ContainerCreating"}}
        )


def _ready(manifest: dict[str, object], now: float) -> None:
    """The pod's containers started and Ready since `now`."""
    status = manifest["status"]
    assert isinstance(status, dict)
    since = ko.rfc3339(now)
    for cond in status["conditions"]:
        if cond["type"] in ("ContainersReady", "Ready"):
            cond["lastTransitionTime"] = since
    for container in status["containerStatuses"]:
        container["state"] = {"running": {"startedAt": since}}
