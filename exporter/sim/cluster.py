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

Deliberate simplifications: evicted and finished pods vanish at once (no Terminating phase);
Jobs are not written (the store serves no batch/v1), Workloads and Pods still name their Job
and its uid; a preempted workload counts the eviction in `status.requeueState.count` (real
Kueue counts there only PodsReady-timeout and admission-check requeues).
"""

from __future__ import annotations

import math
import random
import uuid

from exporter.sim import hyperpod_layout as layout
from exporter.sim.elastic import ElasticOperator, HyperPodSpec
from exporter.sim.hyperpod_layout import ClusterShape, SimNode, default_shape
from exporter.sim.job_arrivals import JobArrivals, JobRequest
from exporter.sim.kueue import objects as ko
from exporter.sim.kueue import status as ks
from exporter.sim.kueue.output import ApiOutput, ClusterWriter
from exporter.sim.kueue.scheduler import (
    Admit,
    ClusterState,
    Demand,
    FlavorSpec,
    Holding,
    Mode,
    NodeSlot,
    Preempt,
    PreemptionReason,
    decide,
)

__all__ = ["ClusterShape", "ClusterWriter", "SimNode", "SimulatedCluster", "default_shape"]

DEFAULT_SHAPE = default_shape()
DEFAULT_START = 1_795_000_000.0  # a fixed epoch (2026-11-18) keeps default runs repeatable
FINISHED_RETENTION_S = 300.0  # finished Workloads are deleted this long after finishing
ABANDON_AFTER_S = 900.0  # a random job still pending this long is deleted by its owner
MIN_RUN_S = 30.0  # a requeued job still needs at least this long to finish
JOB_NAME = layout.JOB_NAME
POD_NAME_ALPHABET = layout.POD_NAME_ALPHABET


class SimulatedCluster:
    def __init__(
        self,
        writer: ClusterWriter,
        shape: ClusterShape = DEFAULT_SHAPE,
        seed: int = 0,
        start: float = DEFAULT_START,
        elastic: bool | None = None,
    ) -> None:
        """`elastic`: run elastic training jobs (exporter.sim.elastic): the shape's bootstrap
        elastic jobs and elastic arrivals. None (the default) turns them on for a living
        cluster (random arrivals or initial workloads) and off for a fully scripted one, whose
        tests expect an empty cluster; True or False decides outright."""
        if elastic is None:
            elastic = shape.arrivals_per_minute > 0 or shape.initial_workloads > 0
        self._shape = shape
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
        self._policies = layout.queue_policies(shape, self._nodes)
        slots = {n.name: _slot(n, flavors) for n in self._nodes}
        self._state = ClusterState(flavors=flavors, nodes=slots, queues=self._policies)
        self._workloads: dict[str, ko.SimWorkload] = {}
        self._uids: dict[str, str] = {}
        self._job_seq = 0
        templates = layout.JOB_MIX + (layout.ELASTIC_MIX if elastic else ())
        mix = [t for t in templates if t.flavor in flavors]
        self._arrivals = JobArrivals(shape, mix, self._rng, start)
        self._booted = False
        self._elastic = ElasticOperator(self, enabled=elastic and layout.P5 in flavors)

    # --- public API -------------------------------------------------------------------------

    def nodes(self) -> list[SimNode]:
        return list(self._nodes)

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
            labels = {layout.INSTANCE_TYPE: f.name}
            rf = ko.resource_flavor_manifest(f.name, labels, f.topology, self._uid_of(f.name), t)
            self._out.put("resourceflavors", rf)
        for name, value, text in layout.PRIORITY_CLASSES:
            pc = ko.priority_class_manifest(name, value, text, self._uid_of(name), t)
            self._out.put("workloadpriorityclasses", pc)
        if self._elastic.enabled:
            name, value, text = layout.ELASTIC_PRIORITY_CLASS
            pc = ko.priority_class_manifest(name, value, text, self._uid_of(name), t)
            self._out.put("workloadpriorityclasses", pc)
        cohort = ko.cohort_manifest(layout.COHORT, self._uid_of(layout.COHORT), t)
        self._out.put("cohorts", cohort)
        if self._elastic.enabled:  # elastic jobs were running before the queued random ones
            self._elastic.bootstrap(t)
            self._clock = t
            self._schedule()
        for _ in range(self._shape.initial_workloads):
            job = self._arrivals.sample(t - self._rng.uniform(30.0, 600.0))
            if job is not None:
                self._submit_random(job)
        self._clock = t
        self._schedule()
        self._elastic.tick(t, warm=True)
        self._write_queues()

    def step(self, now: float) -> None:
        """Advance to `now`: finish jobs, take arrivals, run one scheduling cycle. A `now` not
        after the last one does nothing; a non-finite one raises ValueError."""
        if not math.isfinite(now):
            raise ValueError(f"step needs a finite time, not {now!r}")
        self.bootstrap()
        if now <= self._now:
            return
        admitted = [w for w in self._workloads.values() if w.phase == "admitted"]
        for w in sorted(admitted, key=lambda w: (w.finish_at or 0.0, w.key)):
            if w.finish_at is not None and w.finish_at <= now:
                self._clock = w.finish_at
                self._finish(w)
        for job in self._arrivals.until(now):
            self._submit_random(job)
        self._now = self._clock = now
        self._schedule()
        self._elastic.tick(now)
        self._collect_garbage()
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
    ) -> str:
        """Submit Job `name` for `team` (scripted scenarios, the demo); returns its Workload's
        name. `topology` is ("required"|"preferred", node label key). The flavor defaults to
        the UltraServer one when the topology names the UltraServer level, else p5.
        Raises ValueError for a bad name, unknown team, priority class, mode or flavor."""
        if not JOB_NAME.fullmatch(name):
            raise ValueError(f"job name {name!r} is not a DNS label of at most 40 characters")
        self.bootstrap()
        if team not in self._shape.teams:
            raise ValueError(f"unknown team {team!r}; teams: {', '.join(self._shape.teams)}")
        if priority_class not in layout.PRIORITY:
            raise ValueError(f"unknown priority class {priority_class!r}")
        if pods < 1 or gpus_per_pod < 1:
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
            team, name, flavor, pods, gpus_per_pod, priority_class, request, runtime_s
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
        return self._elastic.resize_slice(namespace, job, pods, self._now)

    def fault_pod(self, namespace: str, job: str) -> str:
        """Make one pod of HyperPodPyTorchJob `job`'s newest admitted scale-up fail now; the
        operator scales that increment down after faultyScaleDownTimeoutInSeconds. Returns the
        pod's name; raises ValueError for an unknown job or one with no admitted scale-up."""
        self.bootstrap()
        return self._elastic.fault_pod(namespace, job, self._now)

    def cordon(self, node: str, health: str = "UnschedulablePendingReplacement") -> None:
        """Set HyperPod's health label on `node`; anything but Schedulable also cordons it, so
        no new pods land there (running ones stay until their job ends)."""
        if node not in self._node_index:
            raise ValueError(f"no node named {node!r}")
        self.bootstrap()
        self._health[node] = health
        if health == "Schedulable":
            self._state.unschedulable.discard(node)
        else:
            self._state.unschedulable.add(node)
        self._write_node(self._nodes[self._node_index[node]])

    # --- Kueue --------------------------------------------------------------------------------

    def _schedule(self) -> None:
        """One scheduling cycle: pending workloads, nominated preemptors first, then by priority
        and queue order; at most one preemption per cohort and flavor per cycle."""
        pending = sorted(
            (w for w in self._workloads.values() if w.phase == "pending"),
            key=lambda w: (not w.nominated, -w.priority, w.queued_at, w.created, w.key),
        )
        preempting: set[tuple[str, str]] = set()
        for w in pending:
            pool = (self._policies[w.cluster_queue].cohort, w.flavor)
            if pool in preempting:
                continue
            decision = decide(self._state, _demand(w))
            if isinstance(decision, Admit):
                self._admit(w, decision.placement)
            elif isinstance(decision, Preempt):
                preempting.add(pool)
                for holding, reason in decision.victims:
                    self._evict(self._workloads[holding.key], w, reason)
                w.nominated = True
                count = len(decision.victims)
                waiting = f"{decision.message}. Pending the preemption of {count} workload(s)"
                self._set_pending(w, waiting)
            else:
                w.nominated = False
                self._set_pending(w, decision.message)

    def _admit(self, w: ko.SimWorkload, placement: tuple[tuple[str, int], ...]) -> None:
        now, cq = self._clock, w.cluster_queue
        new_pods = placement
        if w.carried:  # a workload slice: its admission covers the pods it takes over too
            placement = _merge(w.carried, placement)
            replaced = self._workloads.get(w.replaces or "")
            if replaced is not None and replaced.key in self._state.holdings:
                self._state.remove(self._state.holdings[replaced.key])
        self._state.add(Holding(w.key, cq, w.flavor, w.priority, now, w.gpus_per_pod, placement))
        ks.mark_admitted(w, placement, now)
        waited = now - w.queued_at
        w.phase, w.nominated, w.pending_message = "admitted", False, ""
        w.started, w.finish_at = now, now + w.remaining
        if w.elastic:
            self._elastic.on_admitted(w, new_pods)
        else:
            for node, count in placement:
                for _ in range(count):
                    self._start_pod(w, node)
        self._write_workload(w)
        self._out.event(w, "QuotaReserved", ks.quota_reserved_note(cq, waited), now)
        self._out.event(w, "Admitted", ks.admitted_note(cq), now)

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
        # The Job controller suspends the Job and its pods go; Kueue then releases the quota.
        self._release(victim)
        ks.mark_requeued(victim, message, now)
        victim.phase, victim.queued_at, victim.pending_message = "pending", now, message
        ran = now - (victim.started if victim.started is not None else now)
        victim.remaining = max(MIN_RUN_S, victim.remaining - ran)
        victim.started = victim.finish_at = None
        self._write_workload(victim)
        if victim.elastic:
            self._elastic.on_evicted(victim)

    def _finish(self, w: ko.SimWorkload) -> None:
        self._release(w)
        ks.mark_finished(w, self._clock)
        w.phase, w.finished_at, w.finish_at = "finished", self._clock, None
        self._write_workload(w)
        if w.elastic:
            self._elastic.on_finished(w)

    def _release(self, w: ko.SimWorkload) -> None:
        if w.key in self._state.holdings:
            self._state.remove(self._state.holdings[w.key])
        for pod in w.sim_pods:
            for gpu in pod.gpu_indices:
                self._gpu_owner[pod.node][gpu] = None
            self._out.drop("pods", w.namespace, pod.name)
        w.sim_pods = []

    def _set_pending(self, w: ko.SimWorkload, message: str) -> None:
        ks.mark_pending(w, message, self._clock)
        if message != w.pending_message:
            w.pending_message = message
            self._out.event(w, "Pending", message, self._clock, type_="Warning")
        self._write_workload(w)

    def _queue_path(self, cluster_queue: str) -> str:
        """The cohort path Kueue prints in preemption messages (buildCQPath)."""
        cohort = self._policies[cluster_queue].cohort
        return f"/{cohort}/{cluster_queue}" if cohort else f"/{cluster_queue}"

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
        self._new_workload(
            job.team,
            name,
            t.flavor,
            job.pods,
            job.gpus_per_pod,
            t.priority_class,
            t.topology,
            job.runtime,
        )

    def _start_pod(self, w: ko.SimWorkload, node: str) -> None:
        owners = self._gpu_owner[node]
        gpus = tuple([i for i, owner in enumerate(owners) if owner is None][: w.gpus_per_pod])
        index = len(w.sim_pods)
        suffix = "".join(self._rng.choice(POD_NAME_ALPHABET) for _ in range(5))
        name = f"{w.job}-{index}-{suffix}"
        pod = ko.SimPod(name, self._uid(), index, node, gpus, self._clock)
        for gpu in gpus:
            owners[gpu] = (w.namespace, pod.name, ko.CONTAINER)
        w.sim_pods.append(pod)
        manifest = ko.pod_manifest(w, pod, layout.INSTANCE_TYPE, self._node_index[node])
        self._out.put("pods", manifest)

    def _collect_garbage(self) -> None:
        now = self._now
        for key, w in list(self._workloads.items()):
            done = w.finished_at is not None and w.finished_at + FINISHED_RETENTION_S <= now
            abandoned = (
                w.phase == "pending" and not w.scripted and now - w.created >= ABANDON_AFTER_S
            )
            if done or abandoned:
                self._out.drop("workloads", w.namespace, w.name)
                del self._workloads[key]
                if w.elastic:
                    self._release(w)  # an abandoned slice's gated pods go with it
                    self._elastic.on_deleted(w)
        self._out.expire_events(now)

    # --- writing ------------------------------------------------------------------------------

    def _write_workload(self, w: ko.SimWorkload) -> None:
        self._out.put("workloads", ko.workload_manifest(w, layout.INSTANCE_TYPE))

    def _write_node(self, node: SimNode) -> None:
        health = self._health[node.name]
        labels = {**node.labels, layout.HEALTH: health}
        uid = self._uid_of(f"node/{node.name}")
        index = self._node_index[node.name]
        manifest = ko.node_manifest(node.name, labels, node.gpus, uid, self._start, health, index)
        self._out.put("nodes", manifest)

    def _write_queues(self) -> None:
        for team in self._shape.teams:
            cq, lq, ns = (
                layout.cluster_queue(team),
                layout.local_queue(team),
                layout.namespace(team),
            )
            policy = self._policies[cq]
            usage = {
                f: (self._state.used(cq, f), self._state.borrowed(cq, f)) for f in policy.quotas
            }
            members = [w for w in self._workloads.values() if w.cluster_queue == cq]
            admitted = sum(1 for w in members if w.phase == "admitted")
            pending = sum(1 for w in members if w.phase == "pending")
            counts = ko.QueueCounts(pending=pending, reserving=admitted, admitted=admitted)
            self._out.put(
                "clusterqueues",
                ko.cluster_queue_manifest(
                    cq,
                    policy.cohort,
                    ns,
                    policy.quotas,
                    policy.borrow_within_cohort_max_priority,
                    usage,
                    counts,
                    self._uid_of(cq),
                    self._start,
                ),
            )
            lq_uid = self._uid_of(f"{ns}/{lq}")
            self._out.put(
                "localqueues",
                ko.local_queue_manifest(lq, ns, cq, usage, counts, lq_uid, self._start),
            )

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


def _slot(node: SimNode, flavors: dict[str, FlavorSpec]) -> NodeSlot:
    levels = flavors[node.instance_type].levels
    return NodeSlot(node.name, node.instance_type, node.gpus, tuple(node.labels[k] for k in levels))


def _demand(w: ko.SimWorkload) -> Demand:
    """What `w` asks of the scheduler; a workload slice asks only for the pods its replaced
    slice does not already hold (Kueue counts the old slice's usage as the new one's)."""
    mode: Mode = w.topology[0] if w.topology else "unconstrained"
    level = w.topology[1] if w.topology else None
    pods = w.pods - sum(count for _, count in w.carried)
    return Demand(w.key, w.cluster_queue, w.flavor, pods, w.gpus_per_pod, w.priority, mode, level)


def _merge(
    first: tuple[tuple[str, int], ...], second: tuple[tuple[str, int], ...]
) -> tuple[tuple[str, int], ...]:
    """Two placements as one: pods per node, nodes in first-seen order."""
    merged: dict[str, int] = {}
    for node, count in (*first, *second):
        merged[node] = merged.get(node, 0) + count
    return tuple(merged.items())
