"""JSON-ready answers built from the model: what the API serves and `explain` prints.

The same dicts back `/api/v1/...` and `topowatch explain`, so the live and the offline answer
cannot drift apart.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from exporter.cluster.analysis import PendingCause, workload_request
from exporter.cluster.ledger import PreemptionRecord
from exporter.cluster.model import ClusterModel, WorkloadState, is_live, is_pending
from exporter.cluster.objects import Workload
from exporter.topology.tree import LEVELS, level_of_label_key, render_tree


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def preemption_view(record: PreemptionRecord) -> dict[str, Any]:
    view = asdict(record)
    view["time"] = iso(record.time)
    view["victim"] = record.victim
    view["preemptor"] = record.preemptor
    return view


def status_of(workload: Workload) -> str:
    if workload.is_true("Finished"):
        return "finished"
    if not workload.active:
        return "inactive"
    if is_live(workload):
        return "admitted"
    if workload.is_true("QuotaReserved"):
        return "quota-reserved"
    if workload.is_true("Evicted"):
        return "evicted"
    return "pending"


def workload_view(model: ClusterModel, state: WorkloadState) -> dict[str, Any]:
    wl = state.workload
    loc = model.locality_of(state)
    pending = model.pending_cause(wl) if is_pending(wl) else None
    pods = sorted(model.pods_of(wl), key=lambda p: p.name)
    return {
        "namespace": wl.namespace,
        "name": wl.name,
        "uid": wl.uid,
        "job_uid": wl.job_uid,
        "owner": wl.owner,
        "api_version": wl.api_version,
        "status": status_of(wl),
        "local_queue": wl.queue_name,
        "cluster_queue": model.cluster_queue_of(wl),
        "priority_class": wl.priority_class,
        "priority": wl.priority,
        "gpus_requested": wl.gpus_requested,
        "requeue_count": wl.requeue_count,
        "timeline": [
            {"time": iso(e.time), "step": e.step, "reason": e.reason, "detail": e.detail}
            for e in state.timeline
        ],
        "request": [
            {
                "pod_set": ps.name,
                "count": ps.count,
                "gpus_per_pod": ps.gpus_per_pod,
                "topology": {
                    "mode": ps.topology.mode,
                    "level": ps.topology.level,
                    "slice_level": ps.topology.slice_level,
                    "slice_size": ps.topology.slice_size,
                },
            }
            for ps in wl.pod_sets
        ],
        "assignment": [
            {
                "pod_set": pl.name,
                "count": pl.count,
                "flavors": dict(pl.flavors),
                "levels": list(pl.levels),
                "domains": [{"values": list(d.values), "count": d.count} for d in pl.domains],
            }
            for pl in wl.placements
        ],
        "pods": [{"name": p.name, "node": p.node, "gpus": p.gpus, "phase": p.phase} for p in pods],
        "locality": {
            "pods": loc.pods,
            "nodes": list(loc.nodes),
            "domains": dict(loc.domains),
            "worst_pair_hops": loc.worst_pair_hops,
            "ultraserver": loc.ultraserver,
            "topology": {
                "mode": loc.topology_mode,
                "level": loc.topology_level,
                "met": loc.topology_met,
            },
        },
        "preemptions_suffered": [
            preemption_view(r) for r in model.ledger.suffered_by(wl.namespace, wl.name)
        ],
        "preemptions_caused": [preemption_view(r) for r in model.ledger.caused_by(wl.uid)]
        if wl.uid
        else [],
        "pending": _pending_view(pending),
        "would_run_if": would_run_if(model, wl, pending),
        "problems": list(wl.problems),
    }


def _pending_view(cause: PendingCause | None) -> dict[str, Any] | None:
    if cause is None:
        return None
    return {
        "cause": cause.cause,
        "quota_reason": cause.quota_reason,
        "quota_message": cause.quota_message,
        "topology_message": cause.topology_message,
        "summary": cause.summary,
    }


def would_run_if(model: ClusterModel, wl: Workload, pending: PendingCause | None) -> list[str]:
    """Concrete changes that would admit a pending workload, most direct first."""
    if pending is None:
        return []
    needed = wl.gpus_requested
    cq = model.cluster_queue_of(wl)
    out: list[str] = []
    if pending.cause == "inactive":
        out.append("it is reactivated (spec.active is false)")
    if pending.cause == "misconfigured":
        out.append(f"its queue configuration is fixed: {pending.quota_message}")
    request = workload_request(wl)
    level = level_of_label_key(request.level) if request and request.level else None
    if pending.cause == "topology" and level is not None:
        biggest = model.tree.largest_free(level)
        have = biggest.free if biggest is not None else 0
        where = f" (the best, {biggest.domain}, has {have})" if biggest is not None else ""
        out.append(f"one {level} domain had {needed} free GPUs{where}: {needed - have} more")
        if request is not None and request.mode == "required":
            out.append(f"its topology request were relaxed from required to preferred {level}")
    if pending.cause in ("quota", "topology"):
        headroom = model.headroom(cq)
        if headroom is not None and headroom < needed:
            queue = model.cluster_queues.get(cq)
            nominal = f" (nominal {queue.nominal}, in use {queue.used})" if queue else ""
            out.append(
                f"{cq} had {needed - headroom} more GPUs of quota{nominal}, by raising its "
                "nominal quota, borrowing from the cohort, or lower-priority workloads finishing"
            )
    if pending.cause == "waiting":
        out.append("Kueue evaluates it (no reason recorded yet)")
    return out


def topology_view(model: ClusterModel) -> dict[str, Any]:
    present = set(model.tree.levels_present())
    levels = [lvl for lvl in (*LEVELS, "ultraserver") if lvl in present]
    fragmentation = []
    for level in levels:
        frag = model.tree.fragmentation(level)
        fragmentation.append(
            {
                "level": level,
                "domains": frag.domains,
                "free": frag.free,
                "largest_free": frag.largest_free,
                "largest_domain": frag.largest_domain,
                "fragmentation_ratio": round(frag.ratio, 4),
            }
        )
    return {
        "levels": levels,
        "fragmentation": fragmentation,
        "tree": render_tree(model.tree),
        "ultraservers": [
            {"domain": u.domain, "nodes": u.nodes, "allocatable": u.allocatable, "free": u.free}
            for u in model.tree.ultraservers()
        ],
    }


def preemptions_view(model: ClusterModel, since: float) -> list[dict[str, Any]]:
    return [preemption_view(r) for r in model.ledger.since(since)]
