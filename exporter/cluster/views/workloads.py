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
from exporter.cluster.analysis import PendingCause, short_words, workload_request
from exporter.cluster.capacity.flavors import ResourceCheck
from exporter.cluster.capacity.levels import flavor_levels
from exporter.cluster.capacity.placement import Fit
from exporter.cluster.capacity.quota import kueue_quantity
from exporter.cluster.ledger import PreemptionRecord
from exporter.cluster.model import ClusterModel, WorkloadState, is_live, is_pending
from exporter.cluster.objects import GPU_RESOURCE, Node, Pod, Workload
from exporter.cluster.timeline import TimelineEntry, fold_preemptions
from exporter.cluster.views.ultraservers import ultraserver_waits, ultraservers_view
from exporter.topology.labels import HOSTNAME_KEY
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
                # every resource one pod requests, as Kueue writes quantities
                "per_pod": {name: kueue_quantity(name, amount) for name, amount in ps.per_pod},
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
        "ultraserver_waits": ultraserver_waits(model, pending),
        "efa_remote_errors": _efa_for(model, wl, now),
        "node_health": node_health(model, wl, pods),
        "problems": list(wl.problems),
    }


# HyperPod's node-health-status values that mean a remediation is asked for or under way.
_REMEDIATION = {
    "UnschedulablePendingReboot": "reboot requested",
    "UnschedulablePendingReplacement": "replacement requested",
}


def node_health(model: ClusterModel, wl: Workload, pods: Sequence[Pod]) -> list[dict[str, Any]]:
    """What is wrong with the nodes the workload runs on (its pods' nodes, and while it is
    admitted the nodes its topology assignment names, which a job stopped by a node fault
    still holds): the node agent's findings (its TopowatchHealthy condition, its EFA findings)
    and the remediation HyperPod's health label says is asked for. Only nodes with something
    to say."""
    on: dict[str, list[str]] = {}
    for pod in pods:
        if pod.node:
            on.setdefault(pod.node, []).append(pod.name)
    for placement in wl.placements if is_live(wl) else ():
        if placement.levels and placement.levels[-1] == HOSTNAME_KEY:
            for domain in placement.domains:
                if domain.values:
                    on.setdefault(domain.values[-1], [])
    out = []
    for name in sorted(on):
        node = model.nodes.get(name)
        if node is None:
            continue
        entry = _node_health(node)
        if entry is not None:
            out.append({"node": name, "pods": on[name], **entry})
    return out


def _node_health(node: Node) -> dict[str, Any] | None:
    condition = node.condition_note
    reported = ""
    if condition:  # "TopowatchHealthy=False (Reason: finding; finding)"
        _, _, inner = condition.partition(" (")
        _, colon, findings = inner.removesuffix(")").partition(": ")
        reported = findings if colon else inner.removesuffix(")")
    efa = [
        {
            "check": f.check,
            "component": f.component,
            "action": f.action,
            "evidence": f.evidence,
            "since": iso(f.first_seen),
        }
        for f in node.efa_findings
        if f.action != "none"
    ]
    remediation = _REMEDIATION.get(node.health, "")
    if not remediation and node.health.startswith("Unschedulable"):
        remediation = f"HyperPod {node.health}"
    unavailable = node.unavailable_detail if node.unavailable else ""
    if not (condition or efa or remediation or unavailable):
        return None
    return {
        "condition": condition,
        "reported": reported,
        "efa_findings": efa,
        "health_label": node.health,
        "remediation": remediation,
        "unavailable": unavailable,
        "schedulable": node.schedulable,
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


def _short_view(check: ResourceCheck) -> dict[str, Any]:
    """One short resource: Kueue's units as Kueue writes them, and its own sentence."""
    amount = check.amount
    return {
        "resource": check.resource,
        "flavor": check.flavor,
        "limit": "maximum capacity" if check.status == "maximum" else "unused quota",
        "requested": amount(check.requested),
        "available": None if check.available.amount is None else amount(check.available.amount),
        "maximum_capacity": (
            None if check.potential.amount is None else amount(check.potential.amount)
        ),
        "short": amount(check.short),
        "need": check.need,
        "kueue_message": check.message,
        "summary": short_words(check),
    }


def _pending_view(cause: PendingCause | None) -> dict[str, Any] | None:
    if cause is None:
        return None
    fit = cause.fit
    return {
        "cause": cause.cause,
        "label": cause.label,
        "quota_limit": cause.quota_limit,
        "quota_reason": cause.quota_reason,
        "quota_message": cause.quota_message,
        "topology_message": cause.topology_message,
        "summary": cause.summary,
        "flavor": cause.flavor,
        "quota_available_gpus": cause.quota_available,
        "quota_detail": cause.quota_detail,
        "short": [_short_view(c) for c in cause.short if c.status in ("maximum", "unused")],
        "flavor_mismatches": list(cause.mismatches),
        "undeclared_resources": list(cause.undeclared),
        "quota_unknown": list(cause.quota_unknown),
        "nodes": cause.nodes_note,
        "node_problems": list(cause.node_problems),
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
    """Concrete changes that would admit a pending workload, most direct first. Each is a
    change that would start it: no topology advice while its quota is short (Kueue never
    tries placement then), and for a topology wait the smallest change to free capacity
    that places it (`_smallest_room`)."""
    if pending is None:
        return []
    needed = wl.gpus_requested
    cq = model.cluster_queue_of(wl)
    out: list[str] = []
    if pending.cause == "inactive":
        out.append("it is reactivated (spec.active is false)")
    if pending.cause == "misconfigured":
        if pending.mismatches and not pending.quota_message:
            out.append(f"a flavor of its queue suited its pods: {'; '.join(pending.mismatches)}")
        else:
            out.append(f"its queue configuration is fixed: {pending.quota_message}")
    request = workload_request(wl)
    fit = pending.fit
    if pending.cause == "topology" and fit is not None and not fit.fits:
        if fit.domain:
            out.append(_smallest_room(fit))
        elif fit.status == "no-domain":
            out.append(f"its nodes carried a {fit.level} label ({fit.summary})")
        elif fit.status == "no-nodes" and pending.nodes_note:
            # No node is usable at all: what keeps them out is the change (a toleration, a
            # cordon lifted, a selector), never a label they may well carry.
            out.append(f"some of its flavor's nodes were usable by its pods ({pending.nodes_note})")
        placement = pending.placement
        if (
            request is not None
            and request.mode == "required"
            and placement is not None
            and _preferred_would_place(model, wl, pending)
        ):
            out.append(f"its topology request were relaxed from required to preferred {fit.level}")
    spread = pending.placement
    if (
        pending.cause == "topology"
        and fit is None
        and spread is not None
        and not spread.placeable
        and not spread.summary.startswith("cannot")
    ):
        # unconstrained, or the request a TAS-only queue implies (tas_flavorassigner.go
        # isTASImplied): pods on any nodes of its flavor, so the change is room, anywhere
        if spread.pods_fit == 0 and spread.summary.startswith("no eligible node"):
            if pending.nodes_note:
                out.append(
                    f"some of its flavor's nodes were usable by its pods ({pending.nodes_note})"
                )
        else:
            more = spread.pods_needed - spread.pods_fit
            per = f" of {spread.gpus_per_pod} GPUs" if spread.gpus_per_pod else ""
            out.append(
                f"its flavor's nodes had room for {more} more {'pod' if more == 1 else 'pods'}"
                f"{per} on whole nodes, any of them ({spread.pods_fit} of {spread.pods_needed}"
                " fit now)"
            )
    blocked = "blocked because "
    if pending.cause == "topology" and pending.unavailable_note.startswith(blocked):
        out.append(f"these nodes were back: {pending.unavailable_note.removeprefix(blocked)}")
    short = [c for c in pending.short if c.status in ("maximum", "unused")]
    if pending.cause == "quota" and short:
        for check in short:
            if check.status == "maximum":
                out.append(
                    f"{cq}'s maximum capacity for {check.resource} in {check.flavor} grew by"
                    f" {kueue_quantity(check.resource, check.short)}"
                    f" ({kueue_quantity(check.resource, check.potential.amount or 0)} now, from"
                    " its nominalQuota, borrowingLimit and its cohort's quota): no preemption"
                    " or finished workload can free that"
                )
            else:
                what = check.need
                if check.resource == GPU_RESOURCE:  # "8 more GPUs (8 more nvidia.com/gpu)"
                    what = f"{check.short} more GPUs ({check.need})"
                out.append(
                    f"{cq} could admit {what} in {check.flavor} ({check.available.reason}),"
                    " by raising its nominal quota, borrowing from the cohort, or lower-priority"
                    " workloads finishing"
                )
    elif pending.cause in ("quota", "topology"):
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


def _smallest_room(fit: Fit) -> str:
    """The smallest change to the best domain that places the pod set (`Fit.smallest_room`):
    for slices, room for the fewest pods in the slice-level domains closest to a whole slice
    ("1 more pod in network-node-layer-3 domain nn-a or nn-b"), not the pods of whole slices;
    otherwise room for the pods it lacks."""
    extra, where = fit.smallest_room()
    per = f" of {fit.gpus_per_pod} GPUs" if fit.gpus_per_pod else ""
    pods = "pod" if extra == 1 else "pods"
    if where and fit.slice_level is not None:
        missing = fit.slices_needed - fit.slices_fit
        if missing == 1:  # any one of them would do
            named = " or ".join(where[:4]) + (" or ..." if len(where) > 4 else "")
            what, slices = f"{fit.slice_level} domain {named}", "a slice"
        else:  # the ones closest to a whole slice, between them
            named = ", ".join(where[:4]) + (", ..." if len(where) > 4 else "")
            what, slices = f"{fit.slice_level} domains {named}", f"{missing} slices"
        return (
            f"{what} (in {fit.level} domain {fit.domain}) had room for {extra} more"
            f" {pods}{per} on whole nodes, completing {slices} of {fit.slice_size}"
            f" (it holds {fit.slices_fit} of {fit.slices_needed})"
        )
    return (
        f"one {fit.level} domain had room for {extra} more {pods}{per} on whole nodes"
        f" (the best, {fit.domain}, holds {fit.pods_fit} of {fit.pods_needed})"
    )


def _preferred_would_place(model: ClusterModel, wl: Workload, pending: PendingCause) -> bool:
    """Whether relaxing the required level to preferred would place the pod set now
    (`placement.place` climbs and spreads): only then is it advice that starts it."""
    return model.preferred_would_place(wl, pending.flavor)


def fragmentation_rows(model: ClusterModel, levels: Sequence[str]) -> list[dict[str, Any]]:
    """Free GPUs per level, per ResourceFlavor: a job runs on one flavor's nodes, so the free
    GPUs and the largest free block of different instance types are never added together
    (`exporter.cluster.capacity.levels`, the figures /metrics exports per flavor). A flavor
    that selects no node has no rows; with no ResourceFlavor known (a dump, a cluster
    without Kueue flavors) one set over every node, flavor "", from the topology tree."""
    rows: list[dict[str, Any]] = []
    if not model.flavors:
        for level in levels:
            frag = model.tree.fragmentation(level)
            rows.append(
                {
                    "flavor": "",
                    "level": level,
                    "domains": frag.domains,
                    "free": frag.free,
                    "largest_free": frag.largest_free,
                    "largest_domain": frag.largest_domain,
                    "fragmentation_ratio": round(frag.ratio, 4),
                }
            )
        return rows
    for flavor in sorted(model.flavors):
        eligibility = model.eligibility(flavor)
        for capacity in flavor_levels(eligibility, model.tree, model.nodes, levels):
            if not capacity.domains:
                continue
            rows.append(
                {
                    "flavor": flavor,
                    "level": capacity.level,
                    "domains": len(capacity.domains),
                    "free": capacity.free,
                    "largest_free": capacity.largest_free,
                    "largest_domain": capacity.largest_domain,
                    "fragmentation_ratio": round(capacity.ratio, 4),
                }
            )
    return rows


def topology_view(model: ClusterModel) -> dict[str, Any]:
    judged = {v["ultraserver"]: v for v in ultraservers_view(model)}
    present = set(model.tree.levels_present())
    levels = [lvl for lvl in (*LEVELS, "ultraserver") if lvl in present]
    return {
        "levels": levels,
        "fragmentation": fragmentation_rows(model, levels),
        "tree": render_tree(model.tree),
        "ultraservers": [
            {
                "domain": u.domain,
                "nodes": u.nodes,
                "allocatable": u.allocatable,
                "free": u.free,
                "unavailable": u.unavailable,
                # the NVLink domain's verdict (views.ultraservers, exporter/core/ultraserver.py)
                "health": judged.get(u.domain),
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
