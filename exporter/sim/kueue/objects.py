"""API objects of the simulated HyperPod cluster, shaped as the real API server returns them.

Kueue objects are in the storage version (kueue.x-k8s.io/v1beta2) and carry only fields the
CRD schemas define; quantities are strings, times RFC 3339 in whole seconds, as the API server
serialises them. The simulation keeps its own mutable records (`SimWorkload`, `SimPod`); the
functions here only render them, so the same state always renders to the same dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from exporter.sim.kueue.checks import CheckSpec, strategy_manifest
from exporter.sim.kueue.resources import (
    CPU,
    KI,
    MEMORY,
    PODS,
    Taint,
    Toleration,
)
from exporter.sim.kueue.resources import quantity as res_quantity
from exporter.sim.kueue.scheduler import GPU, HOSTNAME, CohortSpec, Mode, QueuePolicy, Quota
from exporter.topology.labels import HEALTH_STATUS_KEY

KUEUE_API = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
WORKLOAD_ANNOTATION = "kueue.x-k8s.io/workload"
PODSET_LABEL = "kueue.x-k8s.io/podset"
TAS_LABEL = "kueue.x-k8s.io/tas"
RESOURCE_IN_USE = "kueue.x-k8s.io/resource-in-use"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
TOPOLOGY_ANNOTATIONS = {
    "required": "kueue.x-k8s.io/podset-required-topology",
    "preferred": "kueue.x-k8s.io/podset-preferred-topology",
}
HEALTH_LABEL = HEALTH_STATUS_KEY
ADMISSION = "kueue-admission"  # Kueue's scheduler records its events under this name
POD_SET = "main"
CONTAINER = "trainer"
Obj = dict[str, Any]


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(int(t), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def quantity(n: int) -> str:
    return str(n)


def node_ip(index: int) -> str:
    """The simulated private address of the index-th node."""
    return f"10.1.{index // 250}.{index % 250 + 4}"


# --- records the simulation mutates ---------------------------------------------------------


@dataclass(slots=True)
class SimPod:
    name: str
    uid: str
    index: int
    node: str
    gpu_indices: tuple[int, ...]
    created: float
    # Elastic jobs only (exporter/sim/elastic.py): when the container became ready (None:
    # still starting) and when it failed (a faulty pod awaiting the operator's scale-down).
    ready_at: float | None = None
    failed_at: float | None = None
    pod_set: str = "main"


@dataclass(frozen=True, slots=True)
class SimPodSet:
    """One pod set of a workload with several (or with more than GPUs to ask for): per-pod
    requests in Kueue's units (resources.py), its topology request and tolerations."""

    name: str
    count: int
    requests: Mapping[str, int]
    topology: tuple[Mode, str] | None = None
    tolerations: tuple[Toleration, ...] = ()


@dataclass(slots=True)
class SimWorkload:
    """One Job and its Workload, as the simulation tracks them."""

    team: str
    namespace: str
    job: str
    job_uid: str
    name: str
    uid: str
    created: float
    local_queue: str
    cluster_queue: str
    priority_class: str
    priority: int
    flavor: str
    pods: int
    gpus_per_pod: int
    topology: tuple[Mode, str] | None
    remaining: float  # seconds of running still needed to finish
    scripted: bool = False
    phase: str = "pending"  # pending | admitted | finished
    queued_at: float = 0.0  # ordering timestamp: creation, or the last eviction
    conditions: dict[str, Obj] = field(default_factory=dict)
    admission: Obj | None = None
    evaluated: bool = False  # the scheduler has looked at it (status.resourceRequests)
    pending_message: str = ""
    nominated: bool = False  # it preempted others and waits for their quota
    started: float | None = None
    finish_at: float | None = None
    finished_at: float | None = None
    requeue_count: int = 0
    requeue_at: float | None = None
    evictions: int = 0
    sim_pods: list[SimPod] = field(default_factory=list)
    # Elastic jobs (exporter/sim/elastic.py): who owns the Workload, its extra annotations,
    # which elastic kind it is ("" for a plain Job), the placement carried over from the
    # workload slice it replaces (only its other pods are asked of the scheduler) and that
    # slice's key.
    owner_api: str = "batch/v1"
    owner_kind: str = "Job"
    annotations: dict[str, str] = field(default_factory=dict)
    elastic: str = ""  # "" | "hyperpod" | "slice"
    carried: tuple[tuple[str, int], ...] = ()
    replaces: str | None = None
    container: Obj | None = None  # the pod template's container, when not the Job default
    # Pod sets beyond the default one (`pods` x `gpus_per_pod` GPUs, `topology`): when given
    # they are the workload's pod sets, in order. `any_flavor`: the pods name no instance
    # type, so Kueue may pick any flavor of the queue (`flavor` is then the one it assigned).
    pod_sets: tuple[SimPodSet, ...] = ()
    any_flavor: bool = False
    # Per pod set, the flavor Kueue assigned (set at admission).
    assigned: dict[str, str] = field(default_factory=dict)
    # The resources its ClusterQueue covers (status.admission lists those), set when written.
    covered: tuple[str, ...] = ()
    # Admission checks (exporter/sim/kueue/checks.py): status.admissionChecks entries, and
    # what the simulation last wrote of each (to tell a check controller's change from its
    # own); spec.active; a Retry's backoff (status.requeueState.requeueAt); evictions other
    # than preemptions by (reason, underlyingCause) for status.schedulingStats.
    checks: list[Obj] = field(default_factory=list)
    checks_written: dict[str, Obj] = field(default_factory=dict)
    active: bool = True
    backoff_until: float | None = None
    other_evictions: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def gpus(self) -> int:
        if self.pod_sets:
            return sum(ps.count * ps.requests.get(GPU, 0) for ps in self.pod_sets)
        return self.pods * self.gpus_per_pod

    def sets(self) -> tuple[SimPodSet, ...]:
        if self.pod_sets:
            return self.pod_sets
        return (SimPodSet(POD_SET, self.pods, {GPU: self.gpus_per_pod}, self.topology),)

    def pod_set(self, name: str) -> SimPodSet:
        for ps in self.sets():
            if ps.name == name:
                return ps
        return self.sets()[0]


def set_condition(
    conditions: dict[str, Obj], type_: str, status: str, reason: str, message: str, now: float
) -> bool:
    """apimeta.SetStatusCondition: the transition time moves only when the status does."""
    old = conditions.get(type_)
    since = rfc3339(now)
    if old is not None and old["status"] == status:
        since = old["lastTransitionTime"]
    new = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "observedGeneration": 1,
    }
    if old == new:
        return False
    conditions[type_] = new
    return True


# --- topology assignment (v1beta2 slices) ----------------------------------------------------


def _compact(values: Sequence[str]) -> Obj:
    """One level's values: `universal` when all equal, else common prefix/suffix + roots, as
    Kueue's singleCompactSliceEncoding writes them."""
    if all(v == values[0] for v in values):
        return {"universal": values[0]}
    prefix = values[0]
    suffix = values[0]
    for v in values[1:]:
        while not v.startswith(prefix):
            prefix = prefix[:-1]
        while not v.endswith(suffix):
            suffix = suffix[1:]
    shortest = min(len(v) for v in values)
    if len(prefix) + len(suffix) > shortest:
        prefix = prefix[: shortest - len(suffix)]
    individual: Obj = {}
    if prefix:
        individual["prefix"] = prefix
    if suffix:
        individual["suffix"] = suffix
    individual["roots"] = [v[len(prefix) : len(v) - len(suffix)] for v in values]
    return {"individual": individual}


def encode_topology_assignment(
    levels: Sequence[str], domains: Sequence[tuple[tuple[str, ...], int]]
) -> Obj:
    """The v1beta2 `topologyAssignment` for `domains` ((values per level, pod count) pairs).

    When the topology's lowest level is the hostname Kueue records only that level, since a
    node name identifies the domain; callers pass levels and values accordingly.
    """
    counts = [count for _, count in domains]
    pod_counts: Obj = (
        {"universal": counts[0]} if all(c == counts[0] for c in counts) else {"individual": counts}
    )
    return {
        "levels": list(levels),
        "slices": [
            {
                "domainCount": len(domains),
                "valuesPerLevel": [
                    _compact([values[i] for values, _ in domains]) for i in range(len(levels))
                ],
                "podCounts": pod_counts,
            }
        ],
    }


def node_assignment(placement: Iterable[tuple[str, int]]) -> Obj:
    return encode_topology_assignment([HOSTNAME], [((node,), pods) for node, pods in placement])


# --- cluster-scoped setup objects -------------------------------------------------------------

_NODE_RESOURCES = {  # allocatable besides GPUs, per instance type (illustrative figures)
    "ml.p5.48xlarge": {"cpu": "191450m", "memory": "2007812736Ki", "vpc.amazonaws.com/efa": "32"},
    "ml.p6e-gb200.36xlarge": {
        "cpu": "143450m",
        "memory": "963658048Ki",
        "vpc.amazonaws.com/efa": "8",
    },
}


def node_allocatable(instance_type: str, gpus: int) -> dict[str, int]:
    """The node's allocatable GPUs, cpu (millicores), memory (bytes) and pods, in Kueue's
    units: the same figures `node_manifest` writes."""
    figures = _NODE_RESOURCES.get(instance_type, {})
    out = {GPU: gpus, PODS: 110}
    cpu = figures.get(CPU, "")
    if cpu.endswith("m"):
        out[CPU] = int(cpu[:-1])
    memory = figures.get(MEMORY, "")
    if memory.endswith("Ki"):
        out[MEMORY] = int(memory[:-2]) * KI
    return out


def meta(name: str, uid: str, created: float, namespace: str | None = None) -> Obj:
    out: Obj = {"name": name}
    if namespace is not None:
        out["namespace"] = namespace
    out.update({"uid": uid, "creationTimestamp": rfc3339(created), "generation": 1})
    return out


def node_manifest(
    name: str,
    labels: Mapping[str, str],
    gpus: int,
    uid: str,
    created: float,
    health: str,
    index: int,
    taints: Sequence[Taint] = (),
) -> Obj:
    """A HyperPod worker Node; any health but Schedulable cordons it the way HyperPod does
    (spec.unschedulable plus a NoSchedule taint carrying the health status). `taints` are
    the node group's own (an EKS GPU node group's nvidia.com/gpu:NoSchedule)."""
    m = meta(name, uid, created)
    del m["generation"]
    m["labels"] = dict(labels)
    instance_type = labels.get("node.kubernetes.io/instance-type", "")
    zone = labels.get("topology.kubernetes.io/zone", "")
    spec: Obj = {"providerID": f"aws:///{zone}/{name.removeprefix('hyperpod-')}"}
    node_taints = [t.manifest() for t in taints]
    if health != "Schedulable":
        spec["unschedulable"] = True
        node_taints += [
            {"key": HEALTH_LABEL, "value": health, "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
        ]
    if node_taints:
        spec["taints"] = node_taints
    resources = {
        **_NODE_RESOURCES.get(instance_type, {}),
        GPU: quantity(gpus),
        "pods": "110",
    }
    since = rfc3339(created)
    pressure = [
        {
            "type": kind,
            "status": "False",
            "reason": f"KubeletHasNo{kind}" if kind != "PIDPressure" else "KubeletHasSufficientPID",
            "message": "kubelet is healthy",
            "lastHeartbeatTime": since,
            "lastTransitionTime": since,
        }
        for kind in ("MemoryPressure", "DiskPressure", "PIDPressure")
    ]
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": since,
        "lastTransitionTime": since,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": m,
        "spec": spec,
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [*pressure, ready],
            "addresses": [
                {"type": "InternalIP", "address": node_ip(index)},
                {"type": "Hostname", "address": name},
            ],
        },
    }


def namespace_manifest(name: str, uid: str, created: float) -> Obj:
    m = meta(name, uid, created)
    del m["generation"]
    m["labels"] = {
        "kubernetes.io/metadata.name": name,
        "sagemaker.amazonaws.com/sagemaker-managed-queue": "true",
        "sagemaker.amazonaws.com/activate-quota": "Enabled",
    }
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": m,
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def topology_manifest(name: str, levels: Sequence[str], uid: str, created: float) -> Obj:
    return {
        "apiVersion": KUEUE_API,
        "kind": "Topology",
        "metadata": meta(name, uid, created),
        "spec": {"levels": [{"nodeLabel": level} for level in levels]},
    }


def resource_flavor_manifest(
    name: str,
    node_labels: Mapping[str, str],
    topology: str,
    uid: str,
    created: float,
    node_taints: Sequence[Taint] = (),
    tolerations: Sequence[Toleration] = (),
) -> Obj:
    m = meta(name, uid, created)
    m["finalizers"] = [RESOURCE_IN_USE]
    spec: Obj = {"nodeLabels": dict(node_labels)}
    if node_taints:
        spec["nodeTaints"] = [t.manifest() for t in node_taints]
    if tolerations:
        spec["tolerations"] = [t.manifest() for t in tolerations]
    spec["topologyName"] = topology
    return {
        "apiVersion": KUEUE_API,
        "kind": "ResourceFlavor",
        "metadata": m,
        "spec": spec,
    }


def priority_class_manifest(
    name: str, value: int, description: str, uid: str, created: float
) -> Obj:
    return {
        "apiVersion": KUEUE_API,
        "kind": "WorkloadPriorityClass",
        "metadata": meta(name, uid, created),
        "value": value,
        "description": description,
    }


def cohort_manifest(name: str, uid: str, created: float, spec: CohortSpec | None = None) -> Obj:
    """A Cohort (v1beta2: `parentName`, and its own quota in `resourceGroups`)."""
    body: Obj = {}
    if spec is not None and spec.parent:
        body["parentName"] = spec.parent
    if spec is not None and spec.quotas:
        flavors: dict[str, dict[str, Quota]] = {}
        for (flavor, resource), q in spec.quotas.items():
            flavors.setdefault(flavor, {})[resource] = q
        covered = sorted({r for quotas in flavors.values() for r in quotas}, key=_resource_order)
        body["resourceGroups"] = [
            {
                "coveredResources": covered,
                "flavors": [
                    _flavor_quota(f, {r: quotas.get(r, Quota(0)) for r in covered})
                    for f, quotas in flavors.items()
                ],
            }
        ]
    return {
        "apiVersion": KUEUE_API,
        "kind": "Cohort",
        "metadata": meta(name, uid, created),
        "spec": body,
    }


def _resource_order(resource: str) -> tuple[int, str]:
    order = {GPU: 0, CPU: 1, MEMORY: 2, PODS: 3}
    return (order.get(resource, 4), resource)


def _flavor_quota(name: str, quotas: Mapping[str, Quota]) -> Obj:
    resources = []
    for resource, quota in quotas.items():
        entry: Obj = {"name": resource, "nominalQuota": res_quantity(resource, quota.nominal)}
        if quota.borrowing_limit is not None:
            entry["borrowingLimit"] = res_quantity(resource, quota.borrowing_limit)
        if quota.lending_limit is not None:
            entry["lendingLimit"] = res_quantity(resource, quota.lending_limit)
        resources.append(entry)
    return {"name": name, "resources": resources}


Usage = Mapping[tuple[str, str], tuple[int, int]]  # (flavor, resource) -> (total, borrowed)


def _usage_list(usage: Usage, with_borrowed: bool) -> list[Obj]:
    flavors: dict[str, list[Obj]] = {}
    for (flavor, resource), (total, borrowed) in usage.items():
        res: Obj = {"name": resource, "total": res_quantity(resource, total)}
        if with_borrowed:
            res["borrowed"] = res_quantity(resource, borrowed)
        flavors.setdefault(flavor, []).append(res)
    return [{"name": f, "resources": resources} for f, resources in flavors.items()]


@dataclass(frozen=True, slots=True)
class QueueCounts:
    pending: int
    reserving: int
    admitted: int


def cluster_queue_manifest(
    policy: QueuePolicy,
    namespace: str,
    usage: Usage,
    counts: QueueCounts,
    uid: str,
    created: float,
    checks: Sequence[CheckSpec] = (),
    inactive: tuple[str, str, float] | None = None,
    active_since: float | None = None,
) -> Obj:
    """A ClusterQueue; `checks` it lists in spec.admissionChecksStrategy, and `inactive`
    (reason, message, since) when a check it lists is missing or inactive
    (exporter/sim/kueue/checks.py `queue_inactive`); `active_since`: active again since."""
    name, cohort = policy.name, policy.cohort
    m = meta(name, uid, created)
    m["finalizers"] = [RESOURCE_IN_USE]
    preemption: Obj = {
        "reclaimWithinCohort": "Any" if policy.reclaim_within_cohort else "Never",
        "withinClusterQueue": "LowerPriority" if policy.preempt_within_queue else "Never",
    }
    if policy.borrow_within_cohort_max_priority is not None:
        preemption["borrowWithinCohort"] = {
            "policy": "LowerPriority",
            "maxPriorityThreshold": policy.borrow_within_cohort_max_priority,
        }
    active: Obj = {
        "type": "Active",
        "status": "True",
        "reason": "Ready",
        "message": "Can admit new workloads",
        "lastTransitionTime": rfc3339(active_since or created),
        "observedGeneration": 1,
    }
    if inactive is not None:
        reason, message, since = inactive
        active.update(status="False", reason=reason, message=message)
        active["lastTransitionTime"] = rfc3339(since)
    out: Obj = {
        "apiVersion": KUEUE_API,
        "kind": "ClusterQueue",
        "metadata": m,
        "spec": {
            "cohortName": cohort,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "queueingStrategy": "BestEffortFIFO",
            "preemption": preemption,
            "resourceGroups": [
                {
                    "coveredResources": list(group.covered),
                    "flavors": [
                        _flavor_quota(f.name, {r: f.quotas[r] for r in group.covered})
                        for f in group.flavors
                    ],
                }
                for group in policy.groups
            ],
            "stopPolicy": "None",
        },
        "status": {
            "conditions": [active],
            "flavorsReservation": _usage_list(usage, with_borrowed=True),
            "flavorsUsage": _usage_list(usage, with_borrowed=True),
            "pendingWorkloads": counts.pending,
            "reservingWorkloads": counts.reserving,
            "admittedWorkloads": counts.admitted,
        },
    }
    if checks:
        out["spec"]["admissionChecksStrategy"] = strategy_manifest(checks)
    return out


def local_queue_manifest(
    name: str,
    namespace: str,
    cluster_queue: str,
    usage: Usage,
    counts: QueueCounts,
    uid: str,
    created: float,
    inactive_since: float | None = None,
    active_since: float | None = None,
) -> Obj:
    """A LocalQueue; `inactive_since`: its ClusterQueue is inactive (localqueue_controller.go:
    Active False, ClusterQueueIsInactive, "Can't submit new workloads to clusterQueue")."""
    active: Obj = {
        "type": "Active",
        "status": "True",
        "reason": "Ready",
        "message": "Can submit new workloads to localQueue",
        "lastTransitionTime": rfc3339(active_since or created),
        "observedGeneration": 1,
    }
    if inactive_since is not None:
        active.update(
            status="False",
            reason="ClusterQueueIsInactive",
            message="Can't submit new workloads to clusterQueue",
            lastTransitionTime=rfc3339(inactive_since),
        )
    return {
        "apiVersion": KUEUE_API,
        "kind": "LocalQueue",
        "metadata": meta(name, uid, created, namespace),
        "spec": {"clusterQueue": cluster_queue, "stopPolicy": "None"},
        "status": {
            "conditions": [active],
            "flavorsReservation": _usage_list(usage, with_borrowed=False),
            "flavorsUsage": _usage_list(usage, with_borrowed=False),
            "pendingWorkloads": counts.pending,
            "reservingWorkloads": counts.reserving,
            "admittedWorkloads": counts.admitted,
        },
    }


# --- Job, Workload, Pod ----------------------------------------------------------------------


def _requests(per_pod: Mapping[str, int]) -> dict[str, str]:
    order = sorted(per_pod, key=_resource_order)
    return {r: res_quantity(r, per_pod[r]) for r in order if per_pod[r]}


def _container(w: SimWorkload, pod_set: SimPodSet | None = None) -> Obj:
    if w.container is not None and not w.pod_sets:
        return dict(w.container)
    ps = pod_set if pod_set is not None else w.sets()[0]
    requests = _requests(ps.requests)
    limits = {r: v for r, v in requests.items() if r == GPU}
    resources: Obj = {"requests": requests}
    if limits:
        resources["limits"] = limits
    command = ["torchrun", "--nnodes", str(ps.count), "train.py"]
    if not ps.requests.get(GPU):
        command = ["python", "launch.py"]
    return {
        "name": CONTAINER,
        "image": "public.ecr.aws/hpc-cloud/nccl-tests:latest",
        "command": command,
        "resources": resources,
    }


def _pod_template(w: SimWorkload, instance_label: str, pod_set: SimPodSet | None = None) -> Obj:
    ps = pod_set if pod_set is not None else w.sets()[0]
    annotations = {}
    if ps.topology is not None:
        annotations[TOPOLOGY_ANNOTATIONS[ps.topology[0]]] = ps.topology[1]
    metadata: Obj = {"labels": {QUEUE_LABEL: w.local_queue, "app": w.job}}
    if annotations:
        metadata["annotations"] = annotations
    spec: Obj = {"containers": [_container(w, ps)]}
    if not w.any_flavor:
        spec["nodeSelector"] = {instance_label: w.flavor}
    spec["restartPolicy"] = "Never"
    if ps.tolerations:
        spec["tolerations"] = [t.manifest() for t in ps.tolerations]
    return {"metadata": metadata, "spec": spec}


def _owner(w: SimWorkload) -> list[Obj]:
    return [
        {
            "apiVersion": w.owner_api,
            "kind": w.owner_kind,
            "name": w.job,
            "uid": w.job_uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def workload_manifest(w: SimWorkload, instance_label: str) -> Obj:
    m = meta(w.name, w.uid, w.created, w.namespace)
    m["labels"] = {JOB_UID_LABEL: w.job_uid}
    if w.annotations:
        m["annotations"] = dict(w.annotations)
    m["ownerReferences"] = _owner(w)
    if w.phase in ("admitted", "reserved"):
        m["finalizers"] = [RESOURCE_IN_USE]
    pod_sets = []
    for ps in w.sets():
        pod_set: Obj = {
            "name": ps.name,
            "count": ps.count,
            "template": _pod_template(w, instance_label, ps),
        }
        if ps.topology is not None:
            pod_set["topologyRequest"] = {
                ps.topology[0]: ps.topology[1],
                "podIndexLabel": COMPLETION_INDEX,
            }
        pod_sets.append(pod_set)
    status: Obj = {}
    if w.conditions:
        status["conditions"] = list(w.conditions.values())
    if w.admission is not None:
        status["admission"] = w.admission
    elif w.evaluated and w.phase == "pending":
        status["resourceRequests"] = [
            {"name": ps.name, "resources": _requests(_totals(w, ps))} for ps in w.sets()
        ]
    if w.checks:
        status["admissionChecks"] = [dict(c) for c in w.checks]
    requeue: Obj = {}
    if w.requeue_count and w.requeue_at is not None:
        requeue = {"count": w.requeue_count, "requeueAt": rfc3339(w.requeue_at)}
    later = w.requeue_at is None or not requeue or (w.backoff_until or 0.0) > w.requeue_at
    if w.backoff_until is not None and later:  # SetRequeueState: the later requeueAt wins
        requeue["requeueAt"] = rfc3339(w.backoff_until)
    if requeue:
        status["requeueState"] = requeue
    evictions = [{"reason": "Preempted", "underlyingCause": "", "count": w.evictions}]
    evictions = evictions if w.evictions else []
    for (reason, cause), count in sorted(w.other_evictions.items()):
        evictions.append({"reason": reason, "underlyingCause": cause, "count": count})
    if evictions:
        status["schedulingStats"] = {"evictions": evictions}
    return {
        "apiVersion": KUEUE_API,
        "kind": "Workload",
        "metadata": m,
        "spec": {
            "active": w.active,
            "queueName": w.local_queue,
            "priorityClassRef": {
                "group": "kueue.x-k8s.io",
                "kind": "WorkloadPriorityClass",
                "name": w.priority_class,
            },
            "priority": w.priority,
            "podSets": pod_sets,
        },
        "status": status,
    }


def _totals(w: SimWorkload, ps: SimPodSet) -> dict[str, int]:
    """A pod set's requests as Kueue counts them: per pod times count, plus one `pods` per
    pod when the ClusterQueue covers pods (flavorassigner.go assignFlavors)."""
    total = {r: v * ps.count for r, v in ps.requests.items() if v}
    if PODS in w.covered:
        total[PODS] = ps.count
    return total


def admission_manifest(
    w: SimWorkload,
    placement: Sequence[tuple[str, int]],
    placements: Mapping[str, Sequence[tuple[str, int]]] | None = None,
) -> Obj:
    """status.admission: per pod set, the flavor of each resource the queue covers, the
    usage, the count and the TAS assignment (`placements` by pod set; else `placement` is
    the first pod set's)."""
    covered = set(w.covered or (GPU,))
    assignments = []
    for i, ps in enumerate(w.sets()):
        where = placements.get(ps.name, ()) if placements is not None else ()
        if placements is None and i == 0:
            where = placement
        count = sum(n for _, n in where) if where else ps.count
        totals = {r: v for r, v in _totals(w, ps).items() if r in covered or r == GPU}
        if placements is None and i == 0:
            totals = {r: (v // ps.count) * count if r != PODS else count for r, v in totals.items()}
        flavor = w.assigned.get(ps.name, w.flavor)
        assignments.append(
            {
                "name": ps.name,
                "flavors": {r: flavor for r in sorted(totals, key=_resource_order)},
                "resourceUsage": _requests(totals),
                "count": count,
                "topologyAssignment": node_assignment(where),
            }
        )
    return {"clusterQueue": w.cluster_queue, "podSetAssignments": assignments}


def pod_manifest(w: SimWorkload, pod: SimPod, instance_label: str, node_index: int) -> Obj:
    ps = w.pod_set(pod.pod_set)
    flavor = w.assigned.get(ps.name, w.flavor)
    m = meta(pod.name, pod.uid, pod.created, w.namespace)
    del m["generation"]
    index = str(pod.index)
    m["labels"] = {
        "batch.kubernetes.io/controller-uid": w.job_uid,
        "batch.kubernetes.io/job-name": w.job,
        "controller-uid": w.job_uid,
        "job-name": w.job,
        COMPLETION_INDEX: index,
        QUEUE_LABEL: w.local_queue,
        PODSET_LABEL: ps.name,
        TAS_LABEL: "true",
        "app": w.job,
    }
    annotations = {COMPLETION_INDEX: index, WORKLOAD_ANNOTATION: w.name}
    if ps.topology is not None:
        annotations[TOPOLOGY_ANNOTATIONS[ps.topology[0]]] = ps.topology[1]
    m["annotations"] = annotations
    m["ownerReferences"] = _owner(w)
    started = rfc3339(pod.created)
    spec: Obj = {
        "containers": [_container(w, ps)],
        "nodeName": pod.node,
        "nodeSelector": {instance_label: flavor, HOSTNAME: pod.node},
        "restartPolicy": "Never",
        "schedulerName": "default-scheduler",
        "hostname": f"{w.job}-{index}",
    }
    if ps.tolerations:
        spec["tolerations"] = [t.manifest() for t in ps.tolerations]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": m,
        "spec": spec,
        "status": {
            "phase": "Running",
            "hostIP": node_ip(node_index),
            "startTime": started,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": started},
                {"type": "Initialized", "status": "True", "lastTransitionTime": started},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": started},
                {"type": "Ready", "status": "True", "lastTransitionTime": started},
            ],
            "containerStatuses": [
                {
                    "name": CONTAINER,
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "image": "public.ecr.aws/hpc-cloud/nccl-tests:latest",
                    "state": {"running": {"startedAt": started}},
                }
            ],
        },
    }


def event_manifest(
    name: str,
    uid: str,
    involved: Mapping[str, str],
    reason: str,
    message: str,
    type_: str,
    component: str,
    count: int,
    first: float,
    last: float,
) -> Obj:
    """A core/v1 Event as a client-go recorder writes it (source + reporting component)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": name,
            "namespace": involved["namespace"],
            "uid": uid,
            "creationTimestamp": rfc3339(first),
        },
        "involvedObject": dict(involved),
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": "",
        "firstTimestamp": rfc3339(first),
        "lastTimestamp": rfc3339(last),
        "count": count,
    }


def involved_workload(w: SimWorkload) -> dict[str, str]:
    return {
        "apiVersion": KUEUE_API,
        "kind": "Workload",
        "name": w.name,
        "namespace": w.namespace,
        "uid": w.uid,
    }
