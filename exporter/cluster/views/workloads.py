"""JSON-ready answers built from the model: what the API serves and `explain` prints.

The same dicts back `/api/v1/...` and `topowatch explain`, so the live and the offline answer
cannot drift apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from exporter.cluster import efa_remotes
from exporter.cluster.analysis import PendingCause, workload_request
from exporter.cluster.ledger import PreemptionRecord
from exporter.cluster.model import ClusterModel, WorkloadState, is_live, is_pending
from exporter.cluster.objects import Pod, Workload
from exporter.cluster.timeline import TimelineEntry, fold_preemptions
from exporter.topology.tree import (
    LEVELS,
    ULTRASERVER,
    Placement,
    render_tree,
)

# The levels a placement is named at, widest first; nodes are named pod by pod.
PLACE_LEVELS: tuple[str, ...] = (*(lvl for lvl in LEVELS if lvl != "node"), ULTRASERVER)


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


def workload_view(
    model: ClusterModel, state: WorkloadState, now: float | None = None
) -> dict[str, Any]:
    """`now` judges which node findings are current (`efa_remotes`); None: as of the newest."""
    wl = state.workload
    loc = model.locality_of(state)
    pending = model.pending_cause(wl) if is_pending(wl) else None
    pods = sorted(model.pods_of(wl), key=lambda p: p.name)
    places = _placements(model, pods)
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
        "timeline": [timeline_entry_view(e) for e in fold_preemptions(state.timeline)],
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
            "worst_pair": worst_pair(places) if loc.worst_pair_hops else None,
            "ultraserver": loc.ultraserver,
            "where": where(pods, places),
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
        "efa_remote_errors": _efa_for(model, wl, now),
        "problems": list(wl.problems),
    }


def efa_remote_view(found: efa_remotes.Correlation) -> dict[str, Any]:
    """One workload's EFA remote-error correlation (`exporter.cluster.efa_remotes`)."""
    return {
        "namespace": found.namespace,
        "workload": found.workload,
        "nodes": list(found.nodes),
        "reporters": list(found.reporters),
        "correlated": found.correlated,
        "since": iso(found.since),
        "basis": found.basis if found.correlated else None,
        "suspects": [
            {"node": s.node, "basis": s.basis, "detail": s.detail} for s in found.suspects
        ],
        "not_reporting": list(found.silent),
        "no_findings": list(found.unknown),
        "summary": found.summary,
    }


def efa_remotes_view(model: ClusterModel, now: float | None = None) -> list[dict[str, Any]]:
    """Every live workload with a node reporting EFA remote errors, correlated ones first."""
    return [efa_remote_view(c) for c in efa_remotes.from_model(model, now)]


def _efa_for(model: ClusterModel, wl: Workload, now: float | None) -> dict[str, Any] | None:
    if not is_live(wl):
        return None
    for found in efa_remotes.from_model(model, now):
        if found.key == wl.key:
            return efa_remote_view(found)
    return None


def timeline_entry_view(entry: TimelineEntry) -> dict[str, Any]:
    """One step; a folded preemption lists the records it stands for under `folded`."""
    return {
        "time": iso(entry.time),
        "step": entry.step,
        "reason": entry.reason,
        "detail": entry.detail,
        "folded": [{"step": f.step, "time": iso(f.time), "reason": f.reason} for f in entry.folded],
    }


def _placements(model: ClusterModel, pods: Sequence[Pod]) -> dict[str, Placement]:
    """Each node holding one of the pods' GPUs, with its place (nodes the model knows)."""
    out: dict[str, Placement] = {}
    for pod in pods:
        if pod.holds_gpus and pod.node not in out:
            place = model.tree.placement(pod.node)
            if place is not None:
                out[pod.node] = place
    return out


def where(pods: Sequence[Pod], places: Mapping[str, Placement]) -> list[dict[str, Any]]:
    """Per level, the domains the pods landed in with how many pods and nodes each holds.

    Most pods first, then by id. Pods on nodes without the level's label are counted under
    domain None, listed only when some node of the workload has the label.
    """
    pods_on: Counter[str] = Counter(p.node for p in pods if p.holds_gpus and p.node in places)
    out: list[dict[str, Any]] = []
    for level in PLACE_LEVELS:
        pods_in: Counter[str | None] = Counter()
        nodes_in: Counter[str | None] = Counter()
        for node, count in pods_on.items():
            domain = places[node].domain_at(level)
            pods_in[domain] += count
            nodes_in[domain] += 1
        if set(pods_in) <= {None}:
            continue
        ranked = sorted(pods_in, key=lambda d: (d is None, -pods_in[d], d or ""))
        out.append(
            {
                "level": level,
                "domains": [
                    {"domain": d, "pods": pods_in[d], "nodes": nodes_in[d]} for d in ranked
                ],
            }
        )
    return out


def worst_pair(places: Mapping[str, Placement]) -> list[str] | None:
    """Two nodes as far apart as any two of these: the first node (by name) and the first that
    leaves its domain at the widest level where the nodes differ
    (exporter.topology.locality.worst_pair_hops)."""
    nodes = sorted(places)
    if len(nodes) < 2:
        return None
    first = places[nodes[0]]
    for level in (lvl for lvl in LEVELS if lvl != "node"):
        for other in nodes[1:]:
            if places[other].domain_at(level) != first.domain_at(level):
                return [nodes[0], other]
    return [nodes[0], nodes[1]]


def _pending_view(cause: PendingCause | None) -> dict[str, Any] | None:
    if cause is None:
        return None
    fit = cause.fit
    return {
        "cause": cause.cause,
        "quota_reason": cause.quota_reason,
        "quota_message": cause.quota_message,
        "topology_message": cause.topology_message,
        "summary": cause.summary,
        "quota_available_gpus": cause.quota_available,
        "quota_detail": cause.quota_detail,
        "fit": None
        if fit is None
        else {
            "level": fit.level,
            "status": fit.status,
            "domain": fit.domain,
            "pods_fit": fit.pods_fit,
            "pods_needed": fit.pods_needed,
            "gpus_per_pod": fit.gpus_per_pod,
            "free_gpus": fit.free_gpus,
            "summary": fit.summary,
        },
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
    fit = pending.fit
    if pending.cause == "topology" and fit is not None and not fit.fits:
        short = fit.pods_needed - fit.pods_fit
        if fit.domain:
            out.append(
                f"one {fit.level} domain had room for {short} more"
                f" {'pod' if short == 1 else 'pods'} of {fit.gpus_per_pod} GPUs on whole nodes"
                f" (the best, {fit.domain}, holds {fit.pods_fit} of {fit.pods_needed})"
            )
        else:
            out.append(f"its nodes carried a {fit.level} label ({fit.summary})")
        if request is not None and request.mode == "required":
            out.append(f"its topology request were relaxed from required to preferred {fit.level}")
    blocked = "blocked because "
    if pending.cause == "topology" and pending.unavailable_note.startswith(blocked):
        out.append(f"these nodes were back: {pending.unavailable_note.removeprefix(blocked)}")
    if pending.cause in ("quota", "topology"):
        available = pending.quota_available
        if available is not None and available < needed:
            out.append(
                f"{cq} could admit {needed - available} more GPUs ({pending.quota_detail}), by"
                " raising its nominal quota, borrowing from the cohort, or lower-priority"
                " workloads finishing"
            )
        elif available is None and pending.quota_detail:
            out.append(f"its queue's quota could be judged: {pending.quota_detail}")
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
            {
                "domain": u.domain,
                "nodes": u.nodes,
                "allocatable": u.allocatable,
                "free": u.free,
                "unavailable": u.unavailable,
            }
            for u in model.tree.ultraservers()
        ],
        # Nodes whose GPUs are unavailable, not free: a deep health check, an EC2 event.
        "unavailable_nodes": [
            {
                "node": name,
                "cause": node.unavailable,
                "detail": node.unavailable_detail,
                "gpus": node.allocatable_gpus,
            }
            for name, node in sorted(model.nodes.items())
            if node.unavailable
        ],
    }


def preemptions_view(model: ClusterModel, since: float) -> list[dict[str, Any]]:
    return [preemption_view(r) for r in model.ledger.since(since)]
