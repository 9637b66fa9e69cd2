"""Normalized, immutable views of the Kubernetes and Kueue objects the cluster model keeps
(`record`s: immutable to the type checker, cheap to build; exporter/core/record.py).

Parsers (`exporter.cluster.parse.kueue`, `exporter.cluster.parse.core`) turn API dicts of any served
version into these; the model and the analyses never look at raw dicts. Times are Unix
seconds (float); absent values are None, never a sentinel.
"""

from __future__ import annotations

from dataclasses import field
from typing import Literal

from exporter.core.record import record
from exporter.core.ultraserver import NodeFabric

GPU_RESOURCE = "nvidia.com/gpu"
PODS_RESOURCE = "pods"  # the node's pod limit; Kueue counts one per pod (resources.OnePodRequest)

# Amounts per resource in Kueue's integer units (pkg/resources AmountFromQuantity, as
# `exporter.cluster.parse.core.quota_amount` reads them): millicores for cpu, whole units
# rounded up for everything else (bytes of memory, GPUs). Sorted by resource name.
Resources = tuple[tuple[str, int], ...]

# How the cluster model keys an object: (namespace, name) for a namespaced one, its name alone
# for a cluster-scoped one (a Node, a ClusterQueue).
ObjectKey = tuple[str, str] | str


def amount_of(resources: Resources, resource: str) -> int:
    """One resource's amount, 0 when absent."""
    for name, amount in resources:
        if name == resource:
            return amount
    return 0


HYPERPOD_QUEUE_PREFIX = "hyperpod-ns-"
HYPERPOD_QUEUE_SUFFIX = "-clusterqueue"


def team_of(cluster_queue: str) -> str:
    """HyperPod names a team's queue hyperpod-ns-<team>-clusterqueue; other queues are teams."""
    if cluster_queue.startswith(HYPERPOD_QUEUE_PREFIX) and cluster_queue.endswith(
        HYPERPOD_QUEUE_SUFFIX
    ):
        return cluster_queue[len(HYPERPOD_QUEUE_PREFIX) : -len(HYPERPOD_QUEUE_SUFFIX)]
    return cluster_queue


TopologyMode = Literal["required", "preferred", "unconstrained", "none"]


@record
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str
    last_transition: float | None


@record
class TopologyRequest:
    """What a pod set asked of the topology (spec.podSets[].topologyRequest or annotations)."""

    mode: TopologyMode
    level: str | None  # a node label key, e.g. topology.k8s.aws/network-node-layer-3
    slice_level: str | None = None
    slice_size: int | None = None


@record
class NodeSelectorRequirement:
    """One matchExpressions (or matchFields) entry of a core/v1 NodeSelectorTerm."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...]


@record
class NodeSelectorTerm:
    """A term of requiredDuringSchedulingIgnoredDuringExecution: every expression must hold
    (ANDed); the terms of a pod's required node affinity are ORed."""

    expressions: tuple[NodeSelectorRequirement, ...] = ()
    fields: tuple[NodeSelectorRequirement, ...] = ()  # matchFields: only metadata.name exists


@record
class PodSetRequest:
    """One pod set: `count` pods, each requesting `requests` (every resource, Kueue's units;
    `gpus_per_pod` is its nvidia.com/gpu entry), with the scheduling constraints of its pod
    template that decide which nodes its pods may use."""

    name: str
    count: int
    gpus_per_pod: int
    topology: TopologyRequest
    requests: Resources = ()  # per pod; when empty, {nvidia.com/gpu: gpus_per_pod} stands in
    tolerations: tuple[Toleration, ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()  # sorted
    affinity: tuple[NodeSelectorTerm, ...] = ()  # required node affinity, () when none

    @property
    def per_pod(self) -> Resources:
        """What one pod requests, every resource (GPUs only for a hand-built pod set)."""
        if self.requests:
            return self.requests
        return ((GPU_RESOURCE, self.gpus_per_pod),) if self.gpus_per_pod > 0 else ()

    @property
    def constraints(self) -> tuple[object, ...]:
        """What decides the nodes its pods may use, beyond the flavor: a cache key."""
        return (self.tolerations, self.node_selector, self.affinity)


@record
class DomainAssignment:
    """`count` pods in the domain whose label values (highest level first) are `values`."""

    values: tuple[str, ...]
    count: int


@record
class PodSetPlacement:
    """Where Kueue's TAS put one pod set: `levels` are node label keys, highest first."""

    name: str
    count: int
    flavors: tuple[tuple[str, str], ...]  # (resource, flavor)
    levels: tuple[str, ...]
    domains: tuple[DomainAssignment, ...]
    # status.admission.podSetAssignments[].resourceUsage: what the pod set charges, in all
    usage: Resources = ()


@record
class Workload:
    namespace: str
    name: str
    uid: str
    api_version: str
    created: float | None
    queue_name: str  # the LocalQueue
    priority_class: str
    priority: int
    job_uid: str  # label kueue.x-k8s.io/job-uid, "" when absent
    owner: str  # "Kind/name" of the controlling owner, "" when none
    owner_uid: str  # that owner's UID: pods name it in their own ownerReferences
    active: bool
    pod_sets: tuple[PodSetRequest, ...]
    cluster_queue: str  # status.admission.clusterQueue, "" when not admitted
    placements: tuple[PodSetPlacement, ...]
    conditions: tuple[Condition, ...]
    requeue_count: int
    problems: tuple[str, ...] = field(default=())  # malformed fields, kept for explain/logs
    # Kueue's elastic Jobs (ElasticJobsViaWorkloadSlices): annotation kueue.x-k8s.io/elastic-job
    # is "true", workload-slice-name names the origin slice, workload-slice-replacement-for the
    # "ns/name" of the slice this one replaces ("" when absent).
    elastic: bool = False
    slice_name: str = ""
    replacement_for: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def gpus_requested(self) -> int:
        return sum(p.count * p.gpus_per_pod for p in self.pod_sets)

    @property
    def total_requests(self) -> Resources:
        """Every resource the workload requests in all, pod count times per-pod request
        (what Kueue's flavor assigner charges against quota, workload.go TotalRequests)."""
        totals: dict[str, int] = {}
        for pod_set in self.pod_sets:
            for name, amount in pod_set.per_pod:
                totals[name] = totals.get(name, 0) + amount * pod_set.count
        return tuple(sorted(totals.items()))

    def condition(self, type_: str) -> Condition | None:
        for cond in self.conditions:
            if cond.type == type_:
                return cond
        return None

    def is_true(self, type_: str) -> bool:
        cond = self.condition(type_)
        return cond is not None and cond.status == "True"


@record
class PreemptionNote:
    """What a Kueue preemption message says, in any format Kueue has used (v0.4 to v0.20)."""

    preemptor_uid: str
    preemptor_job_uid: str  # "" before v0.11
    preemptor_path: tuple[str, ...]  # cohort/queue path, () before v0.15
    preemptee_path: tuple[str, ...]
    cause: str  # the phrase after "due to", e.g. "prioritization in the ClusterQueue"
    format: str  # "v0.10" | "v0.11" | "v0.15" — which family of message matched


@record
class FlavorQuota:
    flavor: str
    nominal: int  # GPUs
    borrowing_limit: int | None
    lending_limit: int | None


@record
class ResourceQuota:
    """One (flavor, resource) entry of a ClusterQueue's or Cohort's spec.resourceGroups.

    Amounts are Kueue's integers (pkg/resources AmountFromQuantity): milli-units for `cpu`, whole
    units rounded up for every other resource (GPUs, bytes of memory). None limits mean unset.
    When `cause` is not empty a field could not be read ("bad_quantity") or was negative
    ("negative_quantity"), `problem` says which, and the amounts must not be trusted.
    """

    flavor: str
    resource: str
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None
    cause: str = ""
    problem: str = ""


@record
class ResourceGroup:
    """One entry of spec.resourceGroups: the resources it covers and its flavors, in the
    order Kueue's flavor assigner tries them."""

    covered: tuple[str, ...]
    flavors: tuple[str, ...]


@record
class ClusterQueue:
    name: str
    cohort: str
    gpu_quotas: tuple[FlavorQuota, ...]
    used: int  # GPUs in status.flavorsUsage
    reserved: int  # GPUs in status.flavorsReservation
    borrowed: int  # GPUs borrowed from the cohort (status.flavorsUsage[].resources[].borrowed)
    pending_workloads: int
    admitted_workloads: int
    # (policy field, value), e.g. ("withinClusterQueue", "LowerPriority")
    preemption: tuple[tuple[str, str], ...]
    fair_share_weight: float = 1.0  # spec.fairSharing.weight
    # Every (flavor, resource) quota of spec.resourceGroups, in Kueue's integer units.
    quotas: tuple[ResourceQuota, ...] = ()
    # Why spec.resourceGroups could not be read whole (an entry without a flavor or resource
    # name, a list that is not a list): which quotas the queue has is then unknown.
    quota_problems: tuple[str, ...] = ()
    # status.flavorsReservation as (flavor, resource, total): the quota Kueue holds for the
    # workloads with a reservation (status.flavorsUsage counts the admitted ones only).
    reservation: tuple[tuple[str, str, int], ...] = ()
    # spec.resourceGroups: which resources share a flavor choice, flavors in order
    resource_groups: tuple[ResourceGroup, ...] = ()
    # spec.flavorFungibility (whenCanBorrow, whenCanPreempt); "" where unset (Kueue's defaults)
    flavor_fungibility: tuple[str, str] = ("", "")

    @property
    def nominal(self) -> int:
        return sum(q.nominal for q in self.gpu_quotas)

    @property
    def lendable(self) -> int:
        total = 0
        for q in self.gpu_quotas:
            total += q.nominal if q.lending_limit is None else min(q.lending_limit, q.nominal)
        return total


@record
class Cohort:
    """A Kueue Cohort object (v1beta1/v1beta2): its parent and the quota it adds to its tree.

    ClusterQueues may also name a cohort no Cohort object describes; that cohort exists all
    the same, with no quota, no limits and no parent.
    """

    name: str
    parent: str  # spec.parentName, "" for the root of a cohort tree
    quotas: tuple[ResourceQuota, ...] = ()
    quota_problems: tuple[str, ...] = ()  # as ClusterQueue.quota_problems
    fair_share_weight: float = 1.0  # spec.fairSharing.weight


@record
class LocalQueue:
    namespace: str
    name: str
    cluster_queue: str


@record
class Taint:
    """A core/v1 Taint (Node spec.taints, ResourceFlavor spec.nodeTaints)."""

    key: str
    value: str
    effect: str  # NoSchedule | PreferNoSchedule | NoExecute


@record
class Toleration:
    """A core/v1 Toleration (ResourceFlavor spec.tolerations, a pod template's tolerations).

    `operator` "" means Equal, as the API server defaults it.
    """

    key: str
    operator: str  # Equal | Exists | Lt | Gt
    value: str
    effect: str  # "" matches every effect


@record
class ResourceFlavor:
    name: str
    node_labels: tuple[tuple[str, str], ...]
    topology_name: str
    # Taints every node of the flavor carries, and tolerations Kueue adds to admitted pods.
    node_taints: tuple[Taint, ...] = ()
    tolerations: tuple[Toleration, ...] = ()


@record
class KueueTopology:
    name: str
    levels: tuple[str, ...]  # node label keys, highest first


@record
class PriorityClass:
    name: str
    value: int


@record
class EfaFinding:
    """An EFA finding (check id `efa_*`) the node agent published in its Node's
    `topowatch.io/findings` annotation (exporter.core.findings' JSON form); the cluster service
    keeps only these, for `exporter.cluster.efa_remotes`."""

    check: str  # "efa_remote_errors", "efa_link_down", "efa_missing", ...
    component: str  # "<efa device>:<port>", or "node"
    first_seen: float  # Unix seconds: the finding's onset on that node
    last_seen: float  # as of the agent's last write (it rewrites at least every 300 s)
    action: str = "none"  # none | reboot | replace
    evidence: str = ""


@record
class Node:
    name: str
    labels: tuple[tuple[str, str], ...]
    allocatable_gpus: int
    schedulable: bool  # not cordoned, Ready, and no HyperPod Unschedulable* health label
    health: str  # sagemaker.amazonaws.com/node-health-status, "" when absent
    # "TopowatchHealthy=False (reason: message)" while our node agent reports it unhealthy
    condition_note: str = ""
    taints: tuple[Taint, ...] = ()  # spec.taints
    cordoned: bool = False  # spec.unschedulable
    ready: bool = True  # its Ready condition is True (status.conditions)
    # sagemaker.amazonaws.com/deep-health-check-status as written, "" when absent
    deep_health: str = ""
    # True while that check is InProgress or Failed, or its value is unreadable
    deep_health_blocks: bool = False
    # An open EC2 scheduled event for the node's instance ("system-reboot from 2026-..."),
    # "" when none is known; set by the cluster model from the EC2 events source.
    scheduled_event: str = ""
    # The EC2 instance id from spec.providerID (aws:///<zone>/i-...), "" when not on EC2
    instance_id: str = ""
    # The EFA findings of our node agent's topowatch.io/findings annotation, and whether that
    # annotation was there and readable: only then does no finding mean the agent saw none.
    efa_findings: tuple[EfaFinding, ...] = ()
    findings_read: bool = False
    # status.allocatable, every resource in Kueue's units (`allocatable_gpus` is its GPUs)
    allocatable: Resources = ()
    # Our node agent's GPU fabric summary (topowatch.io/nvlink-fabric), None when absent or
    # unreadable: what its UltraServer's verdict is judged with (exporter/core/ultraserver.py).
    fabric: NodeFabric | None = None

    @property
    def unavailable(self) -> Literal["", "deep-health-check", "scheduled-event"]:
        """Why the node's GPUs are not offered as free although Kubernetes may still schedule
        there: a deep health check running, failed or unreadable, or EC2 maintenance ahead."""
        if self.deep_health_blocks:
            return "deep-health-check"
        if self.scheduled_event:
            return "scheduled-event"
        return ""

    @property
    def unavailable_detail(self) -> str:
        if self.deep_health_blocks:
            return f"deep health check {self.deep_health or 'status unreadable'}"
        return self.scheduled_event

    def label(self, key: str) -> str:
        for k, v in self.labels:
            if k == key:
                return v
        return ""


@record
class Pod:
    namespace: str
    name: str
    uid: str
    node: str  # spec.nodeName, "" while unscheduled
    phase: str
    gpus: int  # sum of container GPU requests (limits when no request)
    workload: str  # annotation kueue.x-k8s.io/workload, "" when absent
    job_uid: str  # label kueue.x-k8s.io/job-uid, "" when absent
    queue_name: str  # label kueue.x-k8s.io/queue-name
    owner: str  # "Kind/name" of the controlling owner
    owner_uid: str
    ready_since: float | None = None  # Ready condition True since (None: not Ready)
    gated: bool = False  # spec.schedulingGates not empty: the scheduler may not bind it yet
    # What the scheduler counts on its node: every resource, Kueue's units (`gpus` is its GPUs)
    requests: Resources = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def bound(self) -> bool:
        """On a node and not terminated: its requests count against the node's allocatable
        (the scheduler's and Kueue's non-TAS usage both skip terminated pods)."""
        return bool(self.node) and self.phase not in ("Succeeded", "Failed")

    @property
    def holds_gpus(self) -> bool:
        return bool(self.node) and self.phase not in ("Succeeded", "Failed") and self.gpus > 0


@record
class KubeEvent:
    namespace: str
    name: str
    uid: str
    involved_kind: str
    involved_namespace: str
    involved_name: str
    involved_uid: str
    reason: str
    message: str
    type: str  # Normal | Warning
    count: int
    first_seen: float | None
    last_seen: float | None


@record
class ReplicaSpec:
    """One entry of a HyperPodPyTorchJob's spec.replicaSpecs."""

    name: str
    replicas: int  # the initial count
    max_replicas: int | None
    gpus_per_replica: int  # from the pod template's containers, as the scheduler counts them


@record
class ElasticJob:
    """A HyperPod elastic training job (sagemaker.amazonaws.com/v1 HyperPodPyTorchJob).

    Fields follow the training operator's CRD as the SageMaker HyperPod CLI mirrors it
    (reference/hyperpod/elastic-training-and-deep-health.md, 1.2 and 1.3). There is no
    current-replicas field: the running size is derived from the job's pods and Workloads.
    `problems` that make the job's size unknowable (bounds that contradict each other, a
    scaling status naming replica specs the job does not have) are kept for "unknown: <why>".
    """

    namespace: str
    name: str
    uid: str
    created: float | None
    generation: int
    queue_name: str
    elastic: bool  # spec.elasticPolicy present
    min_replicas: int | None
    max_replicas: int | None
    increment_step: int | None
    discrete_values: tuple[int, ...]
    scaling_timeout_s: int | None
    snooze_s: int | None  # runPolicy.restartPolicy.scaleUpSnoozeTimeInSeconds
    replica_specs: tuple[ReplicaSpec, ...]
    target_replicas: tuple[tuple[str, int], ...]  # status.elasticScalingStatus.targetReplicas
    last_scaling: float | None
    last_restart: float | None
    faulty_scale_down: bool  # isFaultyPodScaleDown
    consecutive_failures: int  # consecutiveScalingFailures
    problems: tuple[str, ...] = ()  # what makes its size unknown
    notes: tuple[str, ...] = ()  # malformed fields that were read around

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def target(self) -> int | None:
        return sum(n for _, n in self.target_replicas) if self.target_replicas else None

    @property
    def gpus_per_replica(self) -> int:
        return max((r.gpus_per_replica for r in self.replica_specs), default=0)
