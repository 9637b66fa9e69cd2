"""Elastic training jobs in the simulated cluster: the HyperPod training operator and Kueue's
elastic Jobs (ElasticJobsViaWorkloadSlices), played on top of `SimulatedCluster`'s Kueue.

Facts are from shared/reference/hyperpod/elastic-training-and-deep-health.md, section 1 ("the
reference" below, §1.x). The HyperPod training operator is closed source: its object shapes
come from the HyperPod CLI's pydantic mirror of the CRD (§1.2, §1.3) and its behaviour from the
AWS elastic-training doc and blog (§1.4). What the sources leave open is marked INFERENCE.

HyperPodPyTorchJob (one replica = one pod = one whole p5 node here):

- Base and scale-ups (§1.4): the job starts with one Workload for `minReplicas` pods at the
  job's priority; each growth step is one more Workload (`replicaIncrementStep` pods, or the
  difference to the next `replicaDiscreteValues` size) at the low `elastic-priority` class, so
  Kueue preempts scale-ups before bases (§1.2's base/elastic pattern; the blog's "minimum ...
  with high priority, then ... additional capacity with lower priority"). All are owned by
  the job, several admitted at once ("multiple active Workloads (one per world-size
  configuration)"). Names `hyperpodpytorchjob-<job>-<5 hex>` (INFERENCE: Kueue's
  `<lowercase kind>-<name>-<hash>` pattern, §1.6, applied per Workload).
- Scale up (§1.4): while the job is below maxReplicas, past its scale-up snooze
  (`scaleUpSnoozeTimeInSeconds` after its last restart, §1.2) and has no scale-up pending, the
  operator asks for one more; Kueue admits it or leaves it pending. `targetReplicas` is the
  size the operator scales to (the README's "target"), so it takes the new size when the
  operator asks, when it generates "an additional Kueue Workload object representing the new
  resource requirements" (§1.4), not when the scaling completes: one job reads one target on
  every page while its scale-up runs. Once all pods are Ready the job checkpoints and restarts at
  the new world size (a restart delay here), and `status.elasticScalingStatus` records
  `lastScalingTime` = `lastRestartTime` ("when the last scaling operation completed", §1.3).
  INFERENCE (the reference gives the field, not when it moves): the target is the replicas of
  every Workload the operator keeps asking Kueue for, admitted or pending, so a withdrawn or
  preempted scale-up takes its replicas out of it at once, and it is never below what Kueue
  admitted for the job.
- Scaling timeout and backoff (§1.2 `scalingTimeoutInSeconds`, §1.4 blog: "exponential
  backoff"): a scale-up still pending after the timeout is deleted, `consecutiveScalingFailures`
  rises and the snooze before the next try doubles per consecutive failure (capped); a
  successful scale-up resets the count. INFERENCE: the doc's wording ("wait before initiate
  scale-up") is vague; deleting the pending Workload is our reading.
- Preemption (§1.4): when Kueue evicts a scale-up, its pods go, the operator restarts the job
  at the smaller size and deletes that Workload a few seconds later. An evicted base suspends
  the whole job: every scale-up is deleted and the base is requeued like any Workload.
- Faulty pods (§1.2 `faultyScaleDownTimeoutInSeconds`, §1.3 `isFaultyPodScaleDown`): a pod of
  a scale-up fails (at random, about once per job per 30-60 simulated minutes, or by
  `fault_pod`); if it has not recovered within the timeout (it never does here), the operator
  removes that increment and restarts smaller with `isFaultyPodScaleDown: true`, which goes
  back to false at the next scale event.

Kueue-native elastic batch Job (§1.6): Workload slices named `job-<job>-<5 hex>`, annotated
`kueue.x-k8s.io/elastic-job: "true"` and `kueue.x-k8s.io/workload-slice-name: <origin slice>`.
Growing creates a new slice for the whole new size with
`kueue.x-k8s.io/workload-slice-replacement-for: <ns>/<old slice>`; the Job's new pods exist at
once but carry the `kueue.x-k8s.io/elastic-job` scheduling gate, removed (and the pods bound)
when the new slice is admitted. Then the old slice is Finished (`WorkloadSliceReplaced`), its
quota released: the new slice's admission covers every pod. The pods already running keep
running and now belong to the new slice: this simulation re-annotates them
(`kueue.x-k8s.io/workload` = the new slice), so "pods of a Workload" stays the set its
admission counts (INFERENCE: whether Kueue rewrites that annotation on running pods is not in
the reference). Shrinking changes the current slice's pod count in place.

Everything is drawn from the cluster's seeded generator in a fixed order and written through
its `ApiOutput`, so the same seed and the same `now`s give the same objects, uids included.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from exporter.sim import hyperpod_layout as layout
from exporter.sim.job_arrivals import JobRequest
from exporter.sim.kueue import objects as ko
from exporter.sim.kueue.output import ApiOutput
from exporter.sim.kueue.scheduler import GPU, ClusterState, Holding

Obj = dict[str, Any]

HYPERPOD_GROUP = "sagemaker.amazonaws.com"
HYPERPOD_API = f"{HYPERPOD_GROUP}/v1"
HYPERPOD_KIND = "HyperPodPyTorchJob"
HYPERPOD_PLURAL = "hyperpodpytorchjobs"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
ELASTIC_JOB_ANNOTATION = "kueue.x-k8s.io/elastic-job"
SLICE_NAME_ANNOTATION = "kueue.x-k8s.io/workload-slice-name"
REPLACEMENT_FOR_ANNOTATION = "kueue.x-k8s.io/workload-slice-replacement-for"
ELASTIC_GATE = "kueue.x-k8s.io/elastic-job"
SLICE_REPLACED = "WorkloadSliceReplaced"
SLICE_REPLACED_MESSAGE = "Replaced to accommodate a new workload slice"
REPLICA_SPEC = "pods"
CONTAINER = "pytorch"
IMAGE = "763104351884.dkr.ecr.us-east-2.amazonaws.com/pytorch-training:2.5.1-gpu-py311"
SCALE_UP_CLASS = layout.ELASTIC_PRIORITY_CLASS[0]

POD_START_S = (10.0, 30.0)  # image pull + container start, until the pod is Ready
RESTART_S = (20.0, 40.0)  # checkpoint and restart at the new world size
DELETE_AFTER_S = (2.0, 5.0)  # an evicted scale-up Workload's deletion by the operator
FAULT_EVERY_S = (1800.0, 3600.0)  # a random faulty pod, per job
BACKOFF_CAP = 8  # the snooze after failed scale-ups grows at most this many times
WARM_SNOOZE_S = (10.0, 40.0)  # bootstrap jobs: left of their snooze when the demo starts
RESIZE_EVERY_S = (300.0, 600.0)  # Kueue-native elastic Job: the user resizes it this often
MAX_SLICE_PODS = 6


@dataclass(frozen=True, slots=True)
class HyperPodSpec:
    """What a HyperPodPyTorchJob is submitted as: its replicas' bounds and scaling policy."""

    team: str
    name: str
    min_replicas: int
    max_replicas: int
    step: int | None = 1  # replicaIncrementStep; unused with `discrete` (exclusive, §1.2)
    discrete: tuple[int, ...] | None = None  # replicaDiscreteValues
    priority_class: str = "training-priority"
    runtime: float = 3600.0
    scaling_timeout: float = 120.0
    snooze: float = 60.0


@dataclass(slots=True)
class HyperPodJob:
    team: str
    namespace: str
    name: str
    uid: str
    created: float
    priority_class: str
    min_replicas: int
    max_replicas: int
    step: int | None
    discrete: tuple[int, ...] | None
    runtime: float
    scaling_timeout: float
    snooze: float
    graceful_timeout: float = 60.0
    faulty_timeout: float = 60.0
    workloads: list[str] = field(default_factory=list)  # keys; the base first
    target: int | None = None  # targetReplicas: the size the operator scales to
    world: int | None = None  # the size the job last (re)started at
    last_scaling: float | None = None
    last_restart: float | None = None
    last_updated: float | None = None
    faulty: bool = False
    faulty_pending: bool = False  # the next restart is a faulty-pod scale-down
    failures: int = 0
    snooze_until: float = 0.0
    restart_at: float | None = None
    fault: tuple[str, float] | None = None  # (workload key, failed at) awaiting scale-down
    next_fault: float = math.inf
    conditions: dict[str, Obj] = field(default_factory=dict)
    start_time: float | None = None
    completion_time: float | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def next_size(self, size: int) -> int:
        if self.discrete is not None:
            bigger = [v for v in self.discrete if size < v <= self.max_replicas]
            return min(bigger) if bigger else size
        return min(size + (self.step or 1), self.max_replicas)


@dataclass(slots=True)
class SliceJob:
    team: str
    namespace: str
    name: str
    uid: str
    priority_class: str
    gpus_per_pod: int
    runtime: float
    resize_after: float
    origin: str = ""  # the first slice's name
    active: str = ""  # key of the slice whose pods run (or wait, when not admitted)
    pending: str | None = None  # key of a replacement slice waiting for admission
    next_resize: float = math.inf
    ends_at: float = math.inf
    pod_seq: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _condition(type_: str, status: str, reason: str, message: str, now: float) -> Obj:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": ko.rfc3339(now),
    }


def _set(
    conditions: dict[str, Obj], type_: str, status: str, reason: str, message: str, now: float
) -> None:
    old = conditions.get(type_)
    if old is not None and old["status"] == status:
        return
    conditions[type_] = _condition(type_, status, reason, message, now)


class ClusterInternals(Protocol):
    """The parts of `SimulatedCluster` the operator works on (its Kueue state, its writer, its
    seeded generator): the operator is part of the simulation, not a client of it. A protocol
    rather than an import keeps exporter.sim.cluster -> exporter.sim.elastic one-way."""

    _shape: layout.ClusterShape
    _rng: random.Random
    _job_seq: int
    _clock: float
    _workloads: dict[str, ko.SimWorkload]
    _state: ClusterState
    _out: ApiOutput
    _gpu_owner: dict[str, list[tuple[str, str, str] | None]]
    _node_index: dict[str, int]

    def _uid(self) -> str: ...

    def _write_workload(self, w: ko.SimWorkload) -> None: ...

    def _release(self, w: ko.SimWorkload) -> None: ...

    def _finish(self, w: ko.SimWorkload) -> None: ...


class ElasticOperator:
    """The HyperPod training operator and Kueue's elastic-Job handling for one cluster."""

    def __init__(self, cluster: ClusterInternals, enabled: bool) -> None:
        self.enabled = enabled
        self._c = cluster
        self._jobs: dict[str, HyperPodJob] = {}
        self._slices: dict[str, SliceJob] = {}
        self._owner: dict[str, str] = {}  # workload key -> job key
        self._delete_at: dict[str, float] = {}  # evicted scale-up key -> deletion time
        self._last_tick = -math.inf

    # --- submission ---------------------------------------------------------------------------

    def bootstrap(self, t: float) -> None:
        """The shape's elastic jobs, already running when the cluster boots (warm: pods Ready,
        most of their snooze spent) so the demo shows scale events within its first minutes."""
        if not self.enabled:
            return
        teams = self._c._shape.teams
        shape = self._c._shape
        for i in range(shape.elastic_hyperpod_jobs):
            team = teams[i % len(teams)]
            self._c._job_seq += 1
            created = t - self._c._rng.uniform(120.0, 600.0)
            self._c._clock = created
            discrete = (2, 4, 6) if i % 2 else None
            runtime = self._c._rng.uniform(3600.0, 7200.0)
            name = f"{team}-elastic-{self._c._job_seq:04d}"
            self._hyperpod(HyperPodSpec(team, name, 2, 6, 1, discrete, runtime=runtime))
        for i in range(shape.elastic_batch_jobs):
            team = teams[(shape.elastic_hyperpod_jobs + i) % len(teams)]
            self._c._job_seq += 1
            self._c._clock = t - self._c._rng.uniform(60.0, 300.0)
            runtime = self._c._rng.uniform(3600.0, 7200.0)
            name = f"{team}-elastic-batch-{self._c._job_seq:04d}"
            resize = self._c._rng.uniform(45.0, 90.0)
            self._slice(team, name, 2, 4, "fine-tuning-priority", runtime, resize)
        self._c._clock = t

    def submit_random(self, job: JobRequest, name: str) -> None:
        """An elastic arrival from the random mix (layout.ELASTIC_MIX)."""
        t = job.template
        if t.elastic == "hyperpod":
            discrete = (2, 4, 6) if self._c._rng.random() < 0.3 else None
            self._hyperpod(
                HyperPodSpec(
                    job.team, name, job.pods, 6, 1, discrete, t.priority_class, job.runtime
                )
            )
            base = self._jobs[f"{layout.namespace(job.team)}/{name}"].workloads[0]
            self._c._workloads[base].scripted = False  # abandoned if never admitted
        else:
            resize = self._c._rng.uniform(60.0, 180.0)
            key = self._slice(
                job.team, name, job.pods, job.gpus_per_pod, t.priority_class, job.runtime, resize
            )
            self._c._workloads[key].scripted = False

    def submit_hyperpod(self, spec: HyperPodSpec) -> str:
        self._check(spec.team, spec.name, spec.priority_class)
        if not 1 <= spec.min_replicas <= spec.max_replicas:
            raise ValueError("an elastic job needs 1 <= minReplicas <= maxReplicas")
        discrete = spec.discrete
        if discrete is not None:  # exclusive with replicaIncrementStep (§1.2)
            if list(discrete) != sorted(set(discrete)) or discrete[0] != spec.min_replicas:
                raise ValueError("replicaDiscreteValues must rise from minReplicas")
        elif spec.step is None or spec.step < 1:
            raise ValueError("replicaIncrementStep must be at least 1")
        return self._hyperpod(spec).split("/", 1)[1]

    def submit_slice(
        self,
        team: str,
        name: str,
        pods: int,
        gpus_per_pod: int,
        priority_class: str,
        runtime: float,
        resize_after: float,
    ) -> str:
        self._check(team, name, priority_class)
        if not 1 <= pods <= MAX_SLICE_PODS or gpus_per_pod not in (1, 2, 4, 8):
            raise ValueError(f"an elastic batch Job needs 1-{MAX_SLICE_PODS} pods of 1-8 GPUs")
        key = self._slice(team, name, pods, gpus_per_pod, priority_class, runtime, resize_after)
        return key.split("/", 1)[1]

    def _check(self, team: str, name: str, priority_class: str) -> None:
        if not self.enabled:
            raise ValueError("elastic jobs are off in this simulation (elastic=False or no p5)")
        if team not in self._c._shape.teams:
            raise ValueError(f"unknown team {team!r}")
        if priority_class not in layout.PRIORITY:
            raise ValueError(f"unknown priority class {priority_class!r}")
        if not layout.JOB_NAME.fullmatch(name):
            raise ValueError(f"job name {name!r} is not a DNS label of at most 40 characters")
        key = f"{layout.namespace(team)}/{name}"
        taken = key in self._jobs or key in self._slices
        if taken or any(
            w.namespace == layout.namespace(team) and w.job == name
            for w in self._c._workloads.values()
        ):
            raise ValueError(f"a job named {name!r} already exists in {layout.namespace(team)}")

    def _hyperpod(self, spec: HyperPodSpec) -> str:
        now = self._c._clock
        job = HyperPodJob(
            team=spec.team,
            namespace=layout.namespace(spec.team),
            name=spec.name,
            uid=self._c._uid(),
            created=now,
            priority_class=spec.priority_class,
            min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas,
            step=None if spec.discrete is not None else spec.step,
            discrete=spec.discrete,
            runtime=spec.runtime,
            scaling_timeout=spec.scaling_timeout,
            snooze=spec.snooze,
        )
        _set(job.conditions, "Created", "True", "JobCreated", "HyperPodPyTorchJob created", now)
        self._jobs[job.key] = job
        self._write_job(job)
        base = self._workload(job, spec.min_replicas, spec.priority_class, spec.runtime)
        return base.key

    def _workload(
        self, job: HyperPodJob, pods: int, priority_class: str, runtime: float
    ) -> ko.SimWorkload:
        c = self._c
        w = ko.SimWorkload(
            team=job.team,
            namespace=job.namespace,
            job=job.name,
            job_uid=job.uid,
            name=f"hyperpodpytorchjob-{job.name}-{c._rng.getrandbits(20):05x}",
            uid=c._uid(),
            created=c._clock,
            local_queue=layout.local_queue(job.team),
            cluster_queue=layout.cluster_queue(job.team),
            priority_class=priority_class,
            priority=layout.PRIORITY[priority_class],
            flavor=layout.P5,
            pods=pods,
            gpus_per_pod=layout.GPUS[layout.P5],
            topology=None,
            remaining=runtime,
            queued_at=c._clock,
            scripted=True,
            owner_api=HYPERPOD_API,
            owner_kind=HYPERPOD_KIND,
            elastic="hyperpod",
            container=_container(layout.GPUS[layout.P5], _command(job)),
        )
        c._workloads[w.key] = w
        job.workloads.append(w.key)
        self._owner[w.key] = job.key
        c._write_workload(w)
        return w

    def _slice(
        self,
        team: str,
        name: str,
        pods: int,
        gpus_per_pod: int,
        priority_class: str,
        runtime: float,
        resize_after: float,
    ) -> str:
        job = SliceJob(
            team=team,
            namespace=layout.namespace(team),
            name=name,
            uid=self._c._uid(),
            priority_class=priority_class,
            gpus_per_pod=gpus_per_pod,
            runtime=runtime,
            resize_after=resize_after,
        )
        self._slices[job.key] = job
        w = self._new_slice(job, pods, None)
        return w.key

    def _new_slice(self, job: SliceJob, pods: int, old: ko.SimWorkload | None) -> ko.SimWorkload:
        """A workload slice for `pods` pods; with `old`, its replacement (§1.6), whose extra
        pods the Job creates at once, gated until the new slice is admitted."""
        c = self._c
        name = f"job-{job.name}-{c._rng.getrandbits(20):05x}"
        if not job.origin:
            job.origin = name
        annotations = {ELASTIC_JOB_ANNOTATION: "true", SLICE_NAME_ANNOTATION: job.origin}
        carried: tuple[tuple[str, int], ...] = ()
        if old is not None:
            annotations[REPLACEMENT_FOR_ANNOTATION] = old.key
            holding = c._state.holdings.get(old.key)
            carried = holding.placement if holding is not None else ()
        w = ko.SimWorkload(
            team=job.team,
            namespace=job.namespace,
            job=job.name,
            job_uid=job.uid,
            name=name,
            uid=c._uid(),
            created=c._clock,
            local_queue=layout.local_queue(job.team),
            cluster_queue=layout.cluster_queue(job.team),
            priority_class=job.priority_class,
            priority=layout.PRIORITY[job.priority_class],
            flavor=layout.P5,
            pods=pods,
            gpus_per_pod=job.gpus_per_pod,
            topology=None,
            remaining=math.inf,  # the Job ends when the operator says so (job.ends_at)
            queued_at=c._clock,
            scripted=True,
            annotations=annotations,
            elastic="slice",
            carried=carried,
            replaces=old.key if old is not None else None,
        )
        c._workloads[w.key] = w
        self._owner[w.key] = job.key
        if old is None:
            job.active = w.key
            gated = pods
        else:
            job.pending = w.key
            gated = pods - old.pods
        c._write_workload(w)
        for _ in range(gated):
            pod = self._slice_pod(job, w, "")
            w.sim_pods.append(pod)
            c._out.put("pods", self._render_slice_pod(job, w, pod))
        return w

    # --- the cluster's hooks ------------------------------------------------------------------

    def on_admitted(self, w: ko.SimWorkload, placement: tuple[tuple[str, int], ...]) -> None:
        """Kueue admitted `w` (the cluster has reserved `placement`, its new pods' nodes)."""
        if w.elastic == "hyperpod":
            job = self._jobs[self._owner[w.key]]
            for node, count in placement:
                for _ in range(count):
                    self._hyperpod_pod(job, w, node)
            return
        job_s = self._slices[self._owner[w.key]]
        old = self._c._workloads.get(w.replaces or "")
        if old is not None:  # the replaced slice's pods now belong to the new one
            self._finish_replaced(job_s, old, w)
        w.carried, w.replaces = (), None
        job_s.active, job_s.pending = w.key, None
        gated = [p for p in w.sim_pods if not p.node]
        for node, count in placement:  # the ungater lifts the gate; the pods are bound
            for _ in range(count):
                pod = gated.pop(0) if gated else self._slice_pod(job_s, w, "")
                if pod not in w.sim_pods:
                    w.sim_pods.append(pod)
                pod.node = node
                pod.gpu_indices = self._claim(
                    node, w.gpus_per_pod, (w.namespace, pod.name, ko.CONTAINER)
                )
        for pod in w.sim_pods:
            self._c._out.put("pods", self._render_slice_pod(job_s, w, pod))
        if job_s.next_resize == math.inf:
            job_s.next_resize = self._c._clock + job_s.resize_after
            job_s.ends_at = self._c._clock + job_s.runtime

    def on_evicted(self, w: ko.SimWorkload) -> None:
        """Kueue preempted `w` and the cluster has requeued it (its pods are gone)."""
        if w.elastic == "hyperpod":
            job = self._jobs[self._owner[w.key]]
            if job.workloads and w.key != job.workloads[0]:  # a scale-up: the operator deletes it
                w.phase = "deleting"
                self._delete_at[w.key] = self._c._clock + self._c._rng.uniform(*DELETE_AFTER_S)
                if job.fault is not None and job.fault[0] == w.key:
                    job.fault = None
            return
        job_s = self._slices[self._owner[w.key]]
        if job_s.pending is not None and w.key == job_s.active:
            self._drop_workload(self._c._workloads[job_s.pending])
            job_s.pending = None

    def on_finished(self, w: ko.SimWorkload) -> None:
        """A base Workload ran its course: the job completes, its scale-ups go."""
        if w.elastic != "hyperpod":
            return
        job = self._jobs[self._owner[w.key]]
        if w.key != job.workloads[0]:
            return
        for key in job.workloads[1:]:
            if key in self._c._workloads:
                self._drop_workload(self._c._workloads[key])
        del job.workloads[1:]
        now = self._c._clock
        _set(job.conditions, "Running", "False", "JobCompleted", "", now)
        _set(job.conditions, "Completed", "True", "JobCompleted", "Job completed", now)
        job.completion_time = now
        self._write_job(job)

    def on_deleted(self, w: ko.SimWorkload) -> None:
        """The cluster deleted `w` (finished long enough, or abandoned while pending)."""
        owner = self._owner.pop(w.key, None)
        if owner in self._jobs:
            job = self._jobs[owner]
            if job.workloads and w.key == job.workloads[0]:
                for key in job.workloads[1:]:
                    if key in self._c._workloads:
                        self._drop_workload(self._c._workloads[key])
                self._c._out.drop(HYPERPOD_PLURAL, job.namespace, job.name)
                del self._jobs[owner]
        elif owner in self._slices:
            job_s = self._slices[owner]
            if w.key == job_s.pending:
                job_s.pending = None
            if w.key == job_s.active:
                if job_s.pending is not None and job_s.pending in self._c._workloads:
                    self._drop_workload(self._c._workloads[job_s.pending])
                del self._slices[owner]

    # --- public actions -------------------------------------------------------------------------

    def fault_pod(self, namespace: str, name: str, now: float) -> str:
        job = self._jobs.get(f"{namespace}/{name}")
        if job is None:
            raise ValueError(f"no HyperPodPyTorchJob {namespace}/{name}")
        return self._fault(job, now)

    def resize_slice(self, namespace: str, name: str, pods: int, now: float) -> str:
        job = self._slices.get(f"{namespace}/{name}")
        if job is None:
            raise ValueError(f"no elastic batch Job {namespace}/{name}")
        if pods < 1:
            raise ValueError("an elastic Job needs at least one pod")
        if job.pending is not None:
            raise ValueError(f"{name} already waits for a new workload slice")
        active = self._c._workloads.get(job.active)
        if active is None or (pods > active.pods and active.phase != "admitted"):
            raise ValueError(f"{name} can grow only while its current slice is admitted")
        self._c._clock = now
        return self._resize(job, pods)

    # --- the operator loop ----------------------------------------------------------------------

    def tick(self, now: float, warm: bool = False) -> None:
        """One reconcile pass over every elastic job at `now` (after the scheduling cycle)."""
        if warm:  # bootstrap: the running jobs' pods started long ago
            for job in self._jobs.values():
                for key in job.workloads:
                    for pod in self._c._workloads[key].sim_pods:
                        pod.ready_at = min(pod.ready_at or now, now)
        for key, when in sorted(self._delete_at.items(), key=lambda kv: (kv[1], kv[0])):
            if when <= now:
                del self._delete_at[key]
                if key in self._c._workloads:
                    self._drop_workload(self._c._workloads[key])
        for job in list(self._jobs.values()):
            if job.completion_time is None:
                self._reconcile(job, now, warm)
            self._write_job(job)
        for job_s in list(self._slices.values()):
            self._reconcile_slice(job_s, now)
        self._last_tick = now

    def _reconcile(self, job: HyperPodJob, now: float, warm: bool) -> None:
        """The operator's pass over one running job, in the order its duties depend on each
        other: pods turning Ready, suspension (an evicted base), scale-ups past
        scalingTimeoutInSeconds (§1.2, with the blog's exponential backoff, §1.4), faulty pods
        past faultyScaleDownTimeoutInSeconds (§1.2/§1.3), the restart at a new size (§1.4),
        and last the next scale-up request (§1.4, after the §1.2 snooze)."""
        c = self._c
        workloads = [c._workloads[k] for k in job.workloads if k in c._workloads]
        job.workloads = [w.key for w in workloads]
        if not workloads:
            return
        base, ups = workloads[0], workloads[1:]
        for w in workloads:  # pods turning Ready since the last pass
            for pod in w.sim_pods:
                if pod.ready_at is not None and self._last_tick < pod.ready_at <= now:
                    c._out.put("pods", self._render_hyperpod_pod(job, w, pod, now))
        if base.phase != "admitted":  # suspended by Kueue: every scale-up goes with it
            for w in ups:
                self._drop_workload(w)
            job.workloads, job.restart_at, job.fault = [base.key], None, None
            if job.conditions.get("Running", {}).get("status") == "True":
                message = "Job suspended: its base Workload was preempted"
                _set(job.conditions, "Running", "False", "Suspended", message, now)
                _set(job.conditions, "Suspended", "True", "Suspended", message, now)
            self._retarget(job, now)
            return
        for w in ups:  # a scale-up Kueue could not admit in time is withdrawn
            if w.phase == "pending" and now - w.created >= job.scaling_timeout:
                self._drop_workload(w)
                job.workloads.remove(w.key)
                job.failures += 1
                backoff = min(2**job.failures, BACKOFF_CAP)
                job.snooze_until = now + job.snooze * backoff
                job.last_updated = now
        if job.fault is not None and now >= job.fault[1] + job.faulty_timeout:
            faulty = c._workloads.get(job.fault[0])
            job.fault = None
            if faulty is not None:
                self._drop_workload(faulty)
                job.workloads.remove(faulty.key)
                job.faulty_pending = True
        if now >= job.next_fault:
            job.next_fault = now + c._rng.uniform(*FAULT_EVERY_S)
            if job.fault is None and any(w.phase == "admitted" for w in ups):
                self._fault(job, now)
        self._restart(job, now, warm)
        ups = [c._workloads[k] for k in job.workloads[1:] if k in c._workloads]
        busy = any(w.phase in ("pending", "deleting") for w in ups)
        size = sum(w.pods for w in (base, *ups) if w.phase == "admitted")
        grow = job.next_size(size) - size
        if (
            job.world == size
            and job.restart_at is None
            and job.fault is None
            and not busy
            and grow > 0
            and now >= job.snooze_until
        ):
            self._workload(job, grow, SCALE_UP_CLASS, math.inf)
        self._retarget(job, now)

    def _retarget(self, job: HyperPodJob, now: float) -> None:
        """targetReplicas: what the operator scales to, the replicas of every Workload it
        still asks Kueue for (admitted or pending; not one it is deleting)."""
        if job.world is None:  # not started yet: the first start sets it
            return
        workloads = [self._c._workloads[k] for k in job.workloads if k in self._c._workloads]
        wanted = sum(w.pods for w in workloads if w.phase in ("admitted", "pending"))
        if wanted != job.target:
            job.target, job.last_updated = wanted, now

    def _restart(self, job: HyperPodJob, now: float, warm: bool) -> None:
        """Once every admitted pod is Ready the job restarts at its new size (§1.4)."""
        c = self._c
        admitted = [
            c._workloads[k]
            for k in job.workloads
            if k in c._workloads and c._workloads[k].phase == "admitted"
        ]
        size = sum(w.pods for w in admitted)
        pods = [p for w in admitted for p in w.sim_pods]
        ready = all(
            p.ready_at is not None and p.ready_at <= now and p.failed_at is None for p in pods
        )
        if size == job.world or not ready:  # nothing to restart for, or pods still starting
            job.restart_at = None
            return
        if job.restart_at is None:
            first = job.world is None
            job.restart_at = now if first or warm else now + c._rng.uniform(*RESTART_S)
        if now < job.restart_at:
            return
        at = job.restart_at
        if job.world is None:  # the first start: no scaling yet
            job.start_time = at
            since = "Job started" if not warm else "Job running"
            _set(job.conditions, "Running", "True", "JobRunning", since, at)
            job.snooze_until = at + (c._rng.uniform(*WARM_SNOOZE_S) if warm else job.snooze)
            job.next_fault = at + c._rng.uniform(*FAULT_EVERY_S)
        else:
            if size > job.world:
                job.failures = 0
            job.last_scaling = job.last_restart = at
            job.faulty, job.faulty_pending = job.faulty_pending, False
            job.snooze_until = at + job.snooze
            if job.conditions.get("Suspended", {}).get("status") == "True":
                _set(job.conditions, "Suspended", "False", "Resumed", "Job resumed", at)
                _set(job.conditions, "Running", "True", "JobRunning", "Job resumed", at)
        job.target, job.world, job.last_updated, job.restart_at = size, size, at, None

    def _fault(self, job: HyperPodJob, now: float) -> str:
        ups = [self._c._workloads[k] for k in job.workloads[1:] if k in self._c._workloads]
        admitted = [w for w in ups if w.phase == "admitted" and w.sim_pods]
        if not admitted:
            raise ValueError(f"{job.name} has no admitted scale-up to lose a pod from")
        w = admitted[-1]
        pod = w.sim_pods[-1]
        pod.failed_at = now
        job.fault = (w.key, now)
        self._c._out.put("pods", self._render_hyperpod_pod(job, w, pod, now))
        return pod.name

    def _reconcile_slice(self, job: SliceJob, now: float) -> None:
        """The user of a Kueue-native elastic Job: it resizes it now and then (§1.6 only says
        how a resize is carried out; when and by how much is this simulation's choice) and
        deletes it when its run is over."""
        c = self._c
        active = c._workloads.get(job.active)
        if active is None:
            return
        if now >= job.ends_at:
            if job.pending is not None and job.pending in c._workloads:
                self._drop_workload(c._workloads[job.pending])
                job.pending = None
            job.ends_at = job.next_resize = math.inf
            if active.phase == "admitted":
                c._clock = now
                c._finish(active)
            else:  # still waiting when its time is up: the user deletes it
                self._drop_workload(active)
                del self._slices[job.key]
            return
        if now < job.next_resize or job.pending is not None or active.phase != "admitted":
            return
        size = active.pods
        if size >= MAX_SLICE_PODS or (size > 1 and c._rng.random() < 0.35):
            pods = c._rng.randint(1, size - 1)
        else:
            pods = c._rng.randint(size + 1, MAX_SLICE_PODS)
        c._clock = now
        self._resize(job, pods)
        job.next_resize = now + c._rng.uniform(*RESIZE_EVERY_S)

    def _resize(self, job: SliceJob, pods: int) -> str:
        """Kueue's reaction to a new Job size (§1.6): a larger one gets a replacement slice,
        a smaller one changes the current slice's count (and admission) in place."""
        c = self._c
        active = c._workloads[job.active]
        if pods > active.pods:
            return self._new_slice(job, pods, active).name
        if pods < active.pods:  # in place (§1.6): the count drops, the last pods go
            keep, gone = active.sim_pods[:pods], active.sim_pods[pods:]
            for pod in gone:
                for gpu in pod.gpu_indices:
                    c._gpu_owner[pod.node][gpu] = None
                c._out.drop("pods", active.namespace, pod.name)
            active.sim_pods, active.pods = keep, pods
            holding = c._state.holdings.get(active.key)
            if holding is not None:
                per_node = Counter(p.node for p in keep)
                placement = tuple((n, per_node[n]) for n, _ in holding.placement if per_node[n])
                c._state.remove(holding)
                c._state.add(
                    Holding(
                        holding.key,
                        holding.queue,
                        holding.flavor,
                        holding.priority,
                        holding.reserved_at,
                        holding.gpus_per_pod,
                        placement,
                    )
                )
                active.admission = ko.admission_manifest(active, placement)
            c._write_workload(active)
        return active.name

    def _finish_replaced(self, job: SliceJob, old: ko.SimWorkload, new: ko.SimWorkload) -> None:
        """The replaced slice is Finished with WorkloadSliceReplaced (§1.6); its pods, quota
        already handed to `new` by the cluster, run on under `new`."""
        now = self._c._clock
        moved = old.sim_pods
        old.sim_pods = []
        new.sim_pods = [*moved, *new.sim_pods]  # same pods, same GPUs, now the new slice's
        ko.set_condition(
            old.conditions, "Finished", "True", SLICE_REPLACED, SLICE_REPLACED_MESSAGE, now
        )
        old.phase, old.finished_at, old.finish_at = "finished", now, None
        self._c._write_workload(old)

    # --- pods -----------------------------------------------------------------------------------

    def _claim(self, node: str, gpus: int, owner: tuple[str, str, str]) -> tuple[int, ...]:
        owners = self._c._gpu_owner[node]
        free = tuple([i for i, o in enumerate(owners) if o is None][:gpus])
        for gpu in free:
            owners[gpu] = owner
        return free

    def _suffix(self) -> str:
        return "".join(self._c._rng.choice(layout.POD_NAME_ALPHABET) for _ in range(5))

    def _hyperpod_pod(self, job: HyperPodJob, w: ko.SimWorkload, node: str) -> None:
        c = self._c
        rank = sum(len(c._workloads[k].sim_pods) for k in job.workloads if k in c._workloads)
        name = f"{job.name}-pods-{rank}-{self._suffix()}"
        now = c._clock
        pod = ko.SimPod(name, c._uid(), rank, node, (), now)
        pod.gpu_indices = self._claim(node, w.gpus_per_pod, (w.namespace, name, CONTAINER))
        pod.ready_at = now + c._rng.uniform(*POD_START_S)
        w.sim_pods.append(pod)
        c._out.put("pods", self._render_hyperpod_pod(job, w, pod, now))

    def _slice_pod(self, job: SliceJob, w: ko.SimWorkload, node: str) -> ko.SimPod:
        index = job.pod_seq
        job.pod_seq += 1
        return ko.SimPod(
            f"{job.name}-{index}-{self._suffix()}", self._c._uid(), index, node, (), self._c._clock
        )

    def _render_hyperpod_pod(
        self, job: HyperPodJob, w: ko.SimWorkload, pod: ko.SimPod, now: float
    ) -> Obj:
        return hyperpod_pod_manifest(job, w, pod, self._c._node_index[pod.node], now)

    def _render_slice_pod(self, job: SliceJob, w: ko.SimWorkload, pod: ko.SimPod) -> Obj:
        if pod.node:
            m = ko.pod_manifest(w, pod, layout.INSTANCE_TYPE, self._c._node_index[pod.node])
            m["metadata"]["annotations"][SLICE_NAME_ANNOTATION] = job.origin
            return m
        return gated_pod_manifest(w, pod, job.origin)

    # --- writing --------------------------------------------------------------------------------

    def _drop_workload(self, w: ko.SimWorkload) -> None:
        """The owner deletes a Workload: its pods first, then the object."""
        c = self._c
        c._release(w)
        c._out.drop("workloads", w.namespace, w.name)
        c._workloads.pop(w.key, None)
        self._owner.pop(w.key, None)
        self._delete_at.pop(w.key, None)

    def _write_job(self, job: HyperPodJob) -> None:
        self._c._out.put(HYPERPOD_PLURAL, hyperpod_job_manifest(job))


# --- rendering ---------------------------------------------------------------------------------


def _container(gpus: int, command: list[str]) -> Obj:
    quantity = {GPU: ko.quantity(gpus)}
    return {
        "name": CONTAINER,
        "image": IMAGE,
        "command": command,
        "resources": {"requests": dict(quantity), "limits": dict(quantity)},
    }


def _command(job: HyperPodJob) -> list[str]:
    """HyperPod's launcher with an elastic node range (INFERENCE: illustrative)."""
    return ["hyperpodrun", "--nnodes", f"{job.min_replicas}:{job.max_replicas}", "train.py"]


def hyperpod_job_manifest(job: HyperPodJob) -> Obj:
    """The HyperPodPyTorchJob as the operator keeps it (§1.2 spec, §1.3 status)."""
    m = ko.meta(job.name, job.uid, job.created, job.namespace)
    m["labels"] = {ko.QUEUE_LABEL: layout.local_queue(job.team), PRIORITY_LABEL: job.priority_class}
    policy: Obj = {"minReplicas": job.min_replicas, "maxReplicas": job.max_replicas}
    if job.discrete is not None:
        policy["replicaDiscreteValues"] = list(job.discrete)
    else:
        policy["replicaIncrementStep"] = job.step
    policy.update(
        {
            "scalingTimeoutInSeconds": int(job.scaling_timeout),
            "gracefulShutdownTimeoutInSeconds": int(job.graceful_timeout),
            "faultyScaleDownTimeoutInSeconds": int(job.faulty_timeout),
        }
    )
    spec = {
        "elasticPolicy": policy,
        "runPolicy": {"restartPolicy": {"scaleUpSnoozeTimeInSeconds": int(job.snooze)}},
        "replicaSpecs": [
            {
                "name": REPLICA_SPEC,
                "replicas": job.min_replicas,
                "maxReplicas": job.max_replicas,
                "spares": 0,
                "template": {
                    "spec": {"containers": [_container(layout.GPUS[layout.P5], _command(job))]}
                },
            }
        ],
    }
    status: Obj = {"conditions": list(job.conditions.values())}
    if job.start_time is not None:
        status["startTime"] = ko.rfc3339(job.start_time)
    if job.completion_time is not None:
        status["completionTime"] = ko.rfc3339(job.completion_time)
    if job.target is not None:
        scaling: Obj = {"targetReplicas": {REPLICA_SPEC: job.target}}
        if job.last_updated is not None:
            scaling["lastUpdated"] = ko.rfc3339(job.last_updated)
        if job.last_scaling is not None:
            scaling["lastScalingTime"] = ko.rfc3339(job.last_scaling)
        if job.last_restart is not None:
            scaling["lastRestartTime"] = ko.rfc3339(job.last_restart)
        scaling["isFaultyPodScaleDown"] = job.faulty
        scaling["consecutiveScalingFailures"] = job.failures
        status["elasticScalingStatus"] = scaling
    return {
        "apiVersion": HYPERPOD_API,
        "kind": HYPERPOD_KIND,
        "metadata": m,
        "spec": spec,
        "status": status,
    }


def hyperpod_pod_manifest(
    job: HyperPodJob, w: ko.SimWorkload, pod: ko.SimPod, node_index: int, now: float
) -> Obj:
    """A pod of a HyperPodPyTorchJob: bound at admission, Ready once its container started,
    Failed when faulted. Labels beyond Kueue's queue name are not documented; only `app`."""
    m = ko.meta(pod.name, pod.uid, pod.created, w.namespace)
    del m["generation"]
    m["labels"] = {ko.QUEUE_LABEL: w.local_queue, "app": job.name}
    m["annotations"] = {ko.WORKLOAD_ANNOTATION: w.name}
    m["ownerReferences"] = [
        {
            "apiVersion": HYPERPOD_API,
            "kind": HYPERPOD_KIND,
            "name": job.name,
            "uid": job.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    scheduled = ko.rfc3339(pod.created)
    conditions = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled},
        {"type": "Initialized", "status": "True", "lastTransitionTime": scheduled},
    ]
    status: Obj = {"hostIP": ko.node_ip(node_index), "startTime": scheduled}
    ready_at = pod.ready_at
    if pod.failed_at is not None and pod.failed_at <= now:
        failed = ko.rfc3339(pod.failed_at)
        status["phase"] = "Failed"
        for type_ in ("ContainersReady", "Ready"):
            conditions.append(
                {
                    "type": type_,
                    "status": "False",
                    "reason": "PodFailed",
                    "lastTransitionTime": failed,
                }
            )
        state: Obj = {
            "terminated": {
                "exitCode": 1,
                "reason": "Error",
                "startedAt": ko.rfc3339(ready_at or pod.created),
                "finishedAt": failed,
            }
        }
        ready = False
    elif ready_at is not None and ready_at <= now:
        since = ko.rfc3339(ready_at)
        status["phase"] = "Running"
        for type_ in ("ContainersReady", "Ready"):
            conditions.append({"type": type_, "status": "True", "lastTransitionTime": since})
        state = {"running": {"startedAt": since}}
        ready = True
    else:
        status["phase"] = "Pending"
        for type_ in ("ContainersReady", "Ready"):
            conditions.append(
                {
                    "type": type_,
                    "status": "False",
                    "reason": "ContainersNotReady",
                    "message": f"containers with unready status: [{CONTAINER}]",
                    "lastTransitionTime": scheduled,
                }
            )
        state = {"waiting": {"reason": "ContainerCreating"}}
        ready = False
    status["conditions"] = conditions
    status["containerStatuses"] = [
        {
            "name": CONTAINER,
            "ready": ready,
            "started": ready,
            "restartCount": 0,
            "image": IMAGE,
            "state": state,
        }
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": m,
        "spec": {
            "containers": [_container(w.gpus_per_pod, _command(job))],
            "nodeName": pod.node,
            "nodeSelector": {layout.INSTANCE_TYPE: w.flavor},
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
        },
        "status": {"phase": status.pop("phase"), **status},
    }


def gated_pod_manifest(w: ko.SimWorkload, pod: ko.SimPod, origin: str) -> Obj:
    """A pod of an elastic batch Job waiting for its workload slice: the elastic-job
    scheduling gate holds it unscheduled (§1.6)."""
    bound = ko.pod_manifest(
        w, ko.SimPod(pod.name, pod.uid, pod.index, "", (), pod.created), layout.INSTANCE_TYPE, 0
    )
    bound["metadata"]["annotations"][SLICE_NAME_ANNOTATION] = origin
    spec = bound["spec"]
    del spec["nodeName"]
    spec["nodeSelector"] = {layout.INSTANCE_TYPE: w.flavor}
    spec["schedulingGates"] = [{"name": ELASTIC_GATE}]
    created = ko.rfc3339(pod.created)
    bound["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "SchedulingGated",
                "message": "Scheduling is blocked due to non-empty scheduling gates",
                "lastTransitionTime": created,
            }
        ],
    }
    return bound
