"""A from-scratch recount of idle GPUs by (flavor, domain, reason): the reference the cluster
model's incremental IdleAccountant is checked against (tests, benchmarks/cluster_model.py).

It shares only the pure rules with the model (node_state, flavor_of, demand_cause,
demand_flavor, split); everything the accountant keeps incrementally (used GPUs per node,
idle per domain, demand per flavor, the proportional share per domain) is recomputed here
from the model's objects."""

from __future__ import annotations

from collections import defaultdict

from exporter.cluster.elastic import idle
from exporter.cluster.model import ClusterModel, is_pending
from exporter.topology.labels import Placement


def recount(model: ClusterModel) -> dict[tuple[str, str, str], float]:
    """Idle GPUs right now by (flavor, domain, reason)."""
    used: dict[str, int] = defaultdict(int)
    for pod in model.pods.values():
        if pod.holds_gpus:
            used[pod.node] += pod.gpus
    schedulable: dict[tuple[str, str], int] = defaultdict(int)
    out: dict[tuple[str, str, str], float] = defaultdict(float)
    for name, node in model.nodes.items():
        free = max(0, node.allocatable_gpus - used[name])
        if not free:
            continue
        layers = Placement.from_labels(dict(node.labels)).layers
        domain = layers[-1] if layers else ""
        flavor = idle.flavor_of(node, model.flavors.values())
        state = idle.node_state(node)
        if state == "schedulable":
            schedulable[(flavor, domain)] += free
        else:
            out[(flavor, domain, state)] += free
    demand: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for state in model.workloads.values():
        workload = state.workload
        cause = idle.demand_cause(workload) if is_pending(workload) else None
        if cause is None:
            continue
        cq = model.cluster_queues.get(model.cluster_queue_of(workload))
        flavors = [q.flavor for q in cq.gpu_quotas] if cq is not None else []
        demand[idle.demand_flavor(workload, flavors)][cause] += workload.gpus_requested
    for job in model.elastic.jobs.values():
        high = job.max_replicas
        waiting = any(is_pending(w) for w in job.workloads.values())
        if high is None or job.unknown or waiting or not job.workloads:
            continue
        room = max(0, high - job.admitted) * job.gpus_per_replica
        demand[job.flavor]["claimable"] += room
    per_flavor: dict[str, int] = defaultdict(int)
    for (flavor, _), free in schedulable.items():
        per_flavor[flavor] += free
    for (flavor, domain), free in schedulable.items():
        total = per_flavor[flavor]
        shares = idle.split(total, demand.get(flavor, {}))
        for reason, share in zip(idle.REASONS[:4], shares, strict=True):
            if share:
                out[(flavor, domain, reason)] += free * share / total
    return dict(out)
