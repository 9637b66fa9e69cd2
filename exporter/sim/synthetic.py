"""Builders for Kubernetes and Kueue objects as the API returns them, and a synthetic cluster.

Tests build fixtures with these (and validate the Kueue ones against the real CRDs); the
benchmarks build a 2,000-node cluster with them. Kueue objects are in the storage version,
kueue.x-k8s.io/v1beta2, unless `v1beta1=True` asks for the older form.
"""

from __future__ import annotations

import random
import uuid as uuidlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from exporter.topology.labels import HEALTH_STATUS_KEY, HOSTNAME_KEY, ULTRASERVER_KEY

KUEUE_V1BETA2 = "kueue.x-k8s.io/v1beta2"
KUEUE_V1BETA1 = "kueue.x-k8s.io/v1beta1"
LAYER_KEY = "topology.k8s.aws/network-node-layer-{}"
GPU = "nvidia.com/gpu"


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def uid_for(*parts: object) -> str:
    """Deterministic UIDs, so fixtures and benchmark runs are repeatable."""
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, "/".join(map(str, parts))))


def node(
    name: str,
    layers: Sequence[str],
    gpus: int = 8,
    instance_type: str = "ml.p5.48xlarge",
    zone: str = "us-east-2a",
    ultraserver: str = "",
    unschedulable: bool = False,
    health: str = "Schedulable",
    rv: str = "1",
    findings: str | None = None,
    ready: bool = True,
) -> dict[str, Any]:
    """A Node; `findings` is its node agent's `topowatch.io/findings` annotation (as written,
    garbage included), `ready` its Ready condition."""
    labels = {
        "kubernetes.io/hostname": name,
        "node.kubernetes.io/instance-type": instance_type,
        "topology.kubernetes.io/region": zone[:-1],
        "topology.kubernetes.io/zone": zone,
        HEALTH_STATUS_KEY: health,
    }
    for i, layer in enumerate(layers, start=1):
        labels[LAYER_KEY.format(i)] = layer
    if ultraserver:
        labels[ULTRASERVER_KEY] = ultraserver
    metadata: dict[str, Any] = {
        "name": name,
        "uid": uid_for("node", name),
        "labels": labels,
        "resourceVersion": rv,
    }
    if findings is not None:
        metadata["annotations"] = {"topowatch.io/findings": findings}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": metadata,
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {
            "allocatable": {GPU: str(gpus), "cpu": "192", "memory": "2000Gi"},
            "capacity": {GPU: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(
    namespace: str,
    name: str,
    node_name: str,
    gpus: int,
    owner_uid: str,
    owner_name: str,
    workload: str = "",
    phase: str = "Running",
    rv: str = "1",
    ready_at: float | None = None,
) -> dict[str, Any]:
    """A Pod of a batch Job; `ready_at`: Ready since then (None: not Ready)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid_for("pod", namespace, name),
        "resourceVersion": rv,
        "labels": {"kueue.x-k8s.io/queue-name": f"{namespace}-localqueue"},
        "ownerReferences": [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": owner_name,
                "uid": owner_uid,
                "controller": True,
            }
        ],
    }
    if workload:
        meta["annotations"] = {"kueue.x-k8s.io/workload": workload}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node_name,
            "containers": [
                {
                    "name": "pytorch",
                    "resources": {"requests": {GPU: str(gpus)}, "limits": {GPU: str(gpus)}},
                }
            ],
        },
        "status": {"phase": phase}
        if ready_at is None
        else {
            "phase": phase,
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": rfc3339(ready_at)}
            ],
        },
    }


def condition(type_: str, status: str, reason: str, message: str, at: float) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": rfc3339(at),
    }


def slices_assignment(
    levels: Sequence[str], domains: Sequence[tuple[Sequence[str], int]]
) -> dict[str, Any]:
    """A v1beta2 topologyAssignment with one slice and individual values per level."""
    return {
        "levels": list(levels),
        "slices": [
            {
                "domainCount": len(domains),
                "valuesPerLevel": [
                    {"individual": {"roots": [values[i] for values, _ in domains]}}
                    for i in range(len(levels))
                ],
                "podCounts": {"individual": [count for _, count in domains]},
            }
        ],
    }


def domains_assignment(
    levels: Sequence[str], domains: Sequence[tuple[Sequence[str], int]]
) -> dict[str, Any]:
    """The same assignment in v1beta1's `domains` form."""
    return {
        "levels": list(levels),
        "domains": [{"values": list(values), "count": count} for values, count in domains],
    }


def workload(
    namespace: str,
    name: str,
    pods: int,
    gpus_per_pod: int,
    created: float,
    priority: int = 0,
    priority_class: str = "",
    topology: tuple[str, str] | None = None,
    job_uid: str | None = None,
    conditions: Sequence[Mapping[str, Any]] = (),
    cluster_queue: str = "",
    assignment: Sequence[tuple[Sequence[str], int]] = (),
    assignment_levels: Sequence[str] = (HOSTNAME_KEY,),
    flavor: str = "ml.p5.48xlarge",
    v1beta1: bool = False,
    rv: str = "1",
) -> dict[str, Any]:
    """A Workload owned by a batch/v1 Job named like the workload, as Kueue's job integration
    creates it; `topology` is (mode, level label key) for the pod set's topologyRequest."""
    job_uid = job_uid or uid_for("job", namespace, name)
    pod_set: dict[str, Any] = {
        "name": "main",
        "count": pods,
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "pytorch",
                        "image": "pytorch:latest",
                        "resources": {"requests": {GPU: str(gpus_per_pod)}},
                    }
                ],
                "restartPolicy": "Never",
            }
        },
    }
    if topology is not None:
        pod_set["topologyRequest"] = {topology[0]: topology[1]}
    spec: dict[str, Any] = {
        "queueName": f"{namespace}-localqueue",
        "podSets": [pod_set],
        "priority": priority,
        "active": True,
    }
    if priority_class:
        if v1beta1:
            spec["priorityClassName"] = priority_class
            spec["priorityClassSource"] = "kueue.x-k8s.io/workloadpriorityclass"
        else:
            spec["priorityClassRef"] = {
                "group": "kueue.x-k8s.io",
                "kind": "WorkloadPriorityClass",
                "name": priority_class,
            }
    status: dict[str, Any] = {}
    if conditions:
        status["conditions"] = [dict(c) for c in conditions]
    if cluster_queue:
        psa: dict[str, Any] = {
            "name": "main",
            "count": pods,
            "flavors": {GPU: flavor},
            "resourceUsage": {GPU: str(pods * gpus_per_pod)},
        }
        if assignment:
            form = domains_assignment if v1beta1 else slices_assignment
            psa["topologyAssignment"] = form(assignment_levels, assignment)
        status["admission"] = {"clusterQueue": cluster_queue, "podSetAssignments": [psa]}
    obj: dict[str, Any] = {
        "apiVersion": KUEUE_V1BETA1 if v1beta1 else KUEUE_V1BETA2,
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid_for("workload", namespace, name),
            "resourceVersion": rv,
            "creationTimestamp": rfc3339(created),
            "labels": {"kueue.x-k8s.io/job-uid": job_uid},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": job_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }
    if status:
        obj["status"] = status
    return obj


def admitted_conditions(cluster_queue: str, at: float) -> list[dict[str, Any]]:
    return [
        condition(
            "QuotaReserved",
            "True",
            "QuotaReserved",
            f"Quota reserved in ClusterQueue {cluster_queue}",
            at,
        ),
        condition("Admitted", "True", "Admitted", "The workload is admitted", at),
    ]


def cluster_queue(
    name: str,
    nominal: int,
    cohort: str = "hyperpod-cohort",
    used: int = 0,
    borrowed: int = 0,
    lending_limit: int | None = None,
    borrowing_limit: int | None = None,
    flavor: str = "ml.p5.48xlarge",
    v1beta1: bool = False,
    pending: int = 0,
    admitted: int = 0,
) -> dict[str, Any]:
    quota: dict[str, Any] = {"name": GPU, "nominalQuota": nominal}
    if lending_limit is not None:
        quota["lendingLimit"] = lending_limit
    if borrowing_limit is not None:
        quota["borrowingLimit"] = borrowing_limit
    spec: dict[str, Any] = {
        "resourceGroups": [
            {"coveredResources": [GPU], "flavors": [{"name": flavor, "resources": [quota]}]}
        ],
        "preemption": {
            "reclaimWithinCohort": "Any",
            "withinClusterQueue": "LowerPriority",
        },
        "namespaceSelector": {},
    }
    if cohort:
        spec["cohort" if v1beta1 else "cohortName"] = cohort
    usage = [
        {
            "name": flavor,
            "resources": [{"name": GPU, "total": str(used), "borrowed": str(borrowed)}],
        }
    ]
    return {
        "apiVersion": KUEUE_V1BETA1 if v1beta1 else KUEUE_V1BETA2,
        "kind": "ClusterQueue",
        "metadata": {"name": name, "uid": uid_for("cq", name), "resourceVersion": "1"},
        "spec": spec,
        "status": {
            "flavorsUsage": usage,
            "flavorsReservation": usage,
            "pendingWorkloads": pending,
            "admittedWorkloads": admitted,
        },
    }


def local_queue(namespace: str, cluster_queue_name: str) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_V1BETA2,
        "kind": "LocalQueue",
        "metadata": {
            "name": f"{namespace}-localqueue",
            "namespace": namespace,
            "uid": uid_for("lq", namespace),
            "resourceVersion": "1",
        },
        "spec": {"clusterQueue": cluster_queue_name},
    }


def preemption_event(
    victim_namespace: str, victim_name: str, message: str, at: float, count: int = 1
) -> dict[str, Any]:
    """The core/v1 Event Kueue records on a preempted Workload."""
    name = f"{victim_name}.{uid_for('ev', victim_name, at)[:16]}"
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": name,
            "namespace": victim_namespace,
            "uid": uid_for("event", name),
            "resourceVersion": "1",
            "creationTimestamp": rfc3339(at),
        },
        "involvedObject": {
            "apiVersion": KUEUE_V1BETA2,
            "kind": "Workload",
            "namespace": victim_namespace,
            "name": victim_name,
            "uid": uid_for("workload", victim_namespace, victim_name),
        },
        "reason": "Preempted",
        "message": message,
        "type": "Normal",
        "count": count,
        "firstTimestamp": rfc3339(at),
        "lastTimestamp": rfc3339(at),
        "source": {"component": "kueue-admission"},
        "reportingComponent": "kueue-admission",
    }


def quota_message(more_needed: int, flavor: str = "ml.p5.48xlarge") -> str:
    """Kueue's QuotaReserved=False message when quota is short."""
    return (
        "couldn't assign flavors to pod set main: insufficient unused quota for "
        f"{GPU} in flavor {flavor}, {more_needed} more needed"
    )


def preemption_message_v015(
    preemptor_uid: str, job_uid: str, preemptor_path: str, preemptee_path: str, cause: str
) -> str:
    """Kueue v0.15+'s message (pkg/scheduler/preemption/preemption.go)."""
    return (
        f"Preempted to accommodate a workload (UID: {preemptor_uid}, JobUID: {job_uid}) "
        f"due to {cause}; preemptor path: {preemptor_path}; preemptee path: {preemptee_path}"
    )


def preemption_message_by(
    preemptor: dict[str, Any], preemptor_path: str, preemptee_path: str, cause: str
) -> str:
    """v0.15's message naming the Workload `preemptor` (its UID and job-uid label)."""
    meta = preemptor["metadata"]
    job_uid = meta["labels"]["kueue.x-k8s.io/job-uid"]
    return preemption_message_v015(meta["uid"], job_uid, preemptor_path, preemptee_path, cause)


def preempted_conditions(message: str, reason: str, at: float) -> list[dict[str, Any]]:
    """What Kueue's scheduler sets on a victim (pkg/scheduler/preemption/preemption.go):
    Evicted with reason Preempted, and Preempted with the preemption's reason
    (InClusterQueue, InCohortReclamation, ...), both carrying the message."""
    return [
        condition("Evicted", "True", "Preempted", message, at),
        condition("Preempted", "True", reason, message, at),
    ]


# --- a synthetic large cluster ---------------------------------------------------------------


@dataclass(frozen=True)
class SyntheticShape:
    nodes: int = 2000
    nodes_per_layer3: int = 16
    layer3_per_layer2: int = 4
    layer2_per_layer1: int = 4
    gpus_per_node: int = 8
    workloads: int = 10_000
    pods: int = 50_000
    teams: int = 20


def synthetic_cluster(
    shape: SyntheticShape, seed: int = 0, start: float = 1_795_000_000.0
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind, object) pairs: queues, nodes, then workloads with their pods, most admitted and
    placed compactly, a fifth pending, a few preempted — what a busy cluster lists."""
    rng = random.Random(seed)
    teams = [f"team{i:02d}" for i in range(shape.teams)]
    total_gpus = shape.nodes * shape.gpus_per_node
    for team in teams:
        cq = f"hyperpod-ns-{team}-clusterqueue"
        yield "ClusterQueue", cluster_queue(cq, total_gpus // shape.teams)
        yield "LocalQueue", local_queue(f"hyperpod-ns-{team}", cq)
    node_names = []
    for i in range(shape.nodes):
        l3 = i // shape.nodes_per_layer3
        l2 = l3 // shape.layer3_per_layer2
        l1 = l2 // shape.layer2_per_layer1
        name = f"hyperpod-i-{i:017x}"
        node_names.append(name)
        yield (
            "Node",
            node(
                name, (f"nn-l1-{l1:04d}", f"nn-l2-{l2:04d}", f"nn-l3-{l3:05d}"), shape.gpus_per_node
            ),
        )
    yield from _synthetic_workloads(shape, rng, teams, node_names, start)


# (pods, GPUs per pod) of running jobs: whole-node jobs dominate, as on training clusters.
_RUNNING_SHAPES = ((8, 8), (4, 8), (2, 8), (16, 8), (4, 4), (8, 1), (4, 2))


def _synthetic_workloads(
    shape: SyntheticShape,
    rng: random.Random,
    teams: Sequence[str],
    node_names: Sequence[str],
    start: float,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Running jobs fill about 95 % of the GPUs, placed compactly; a tenth of the workloads
    pend; the rest finished and left Succeeded pods, up to `shape.pods` pods in all."""
    free = dict.fromkeys(node_names, shape.gpus_per_node)
    capacity = len(node_names) * shape.gpus_per_node
    used = 0
    cursor = 0
    pods_made = 0
    pending = shape.workloads // 10
    for w in range(shape.workloads):
        team = teams[w % len(teams)]
        ns = f"hyperpod-ns-{team}"
        cq = f"{ns}-clusterqueue"
        name = f"job-{w:05d}"
        created = start + w
        level = LAYER_KEY.format(3)
        topo = ("required", level) if w % 3 == 0 else ("preferred", level)
        count, gpus = rng.choice(_RUNNING_SHAPES)
        if w < pending:
            yield (
                "Workload",
                workload(
                    ns,
                    name,
                    count,
                    gpus,
                    created,
                    priority=100,
                    topology=topo,
                    conditions=[
                        condition(
                            "QuotaReserved",
                            "False",
                            "Pending",
                            quota_message(count * gpus),
                            created,
                        )
                    ],
                ),
            )
            continue
        placed: list[str] = []
        if used + count * gpus <= capacity * 0.95:
            for _ in range(count):
                for _ in range(len(node_names)):
                    candidate = node_names[cursor % len(node_names)]
                    if free[candidate] >= gpus:
                        free[candidate] -= gpus
                        placed.append(candidate)
                        break
                    cursor += 1
        if len(placed) == count:
            used += count * gpus
            counts: dict[str, int] = {}
            for n in placed:
                counts[n] = counts.get(n, 0) + 1
            wl = workload(
                ns,
                name,
                count,
                gpus,
                created,
                priority=100,
                topology=topo,
                conditions=admitted_conditions(cq, created + 5),
                cluster_queue=cq,
                assignment=[((n,), c) for n, c in counts.items()],
            )
            yield "Workload", wl
            job_uid = wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]
            for j, n in enumerate(placed):
                yield "Pod", pod(ns, f"{name}-{j}", n, gpus, job_uid, name)
            pods_made += count
            continue
        for n in placed:  # did not fit whole: give the GPUs back, the job finished instead
            free[n] += gpus
        remaining_workloads = shape.workloads - w
        finished_pods = max(0, (shape.pods - pods_made) // max(1, remaining_workloads))
        done = [
            *admitted_conditions(cq, created + 5),
            condition("Finished", "True", "Succeeded", "Job finished successfully", created + 600),
        ]
        wl = workload(
            ns,
            name,
            max(1, finished_pods),
            gpus,
            created,
            priority=100,
            topology=topo,
            conditions=done,
            cluster_queue=cq,
        )
        yield "Workload", wl
        job_uid = wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]
        for j in range(finished_pods):
            n = node_names[rng.randrange(len(node_names))]
            yield "Pod", pod(ns, f"{name}-{j}", n, gpus, job_uid, name, phase="Succeeded")
        pods_made += finished_pods
