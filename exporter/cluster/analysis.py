"""Pure analyses over model state: preemption verdicts, pending causes (locality is
exporter.topology.locality, shared with Slurm).

Each function takes plain values and returns plain values, so the rules can be read and tested
without a model, and the model stays a bookkeeper.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.cluster.capacity.placement import Fit, PlacementAnswer
from exporter.cluster.capacity.quota import Answer
from exporter.cluster.ledger import Verdict
from exporter.cluster.objects import TopologyRequest, Workload

# --- preemption verdicts ----------------------------------------------------------------------


def preemption_verdict(
    gpus_needed: int, level: str | None, quota: Answer | None, fit: Fit | None
) -> tuple[Verdict, str]:
    """Quota-driven or topology-driven, judged as Kueue decided (scheduler.go: a workload that
    does not fit its flavors' quota preempts for quota; a TAS workload whose quota fits but
    whose pods no domain of the required level can hold preempts to make room there,
    tas_flavor_snapshot.go `FindTopologyAssignmentsForFlavor` with preemption).

    `quota` is what the preemptor's ClusterQueue could still admit at the moment of the
    preemption (the cohort tree's `available`, with the victims still holding theirs); `fit`
    is the most pods of its shape one domain of its required level held then, on the nodes its
    flavor selects. Nothing here reads the ClusterQueue status, so the verdict does not depend
    on which informer spoke first.
    """
    if gpus_needed <= 0:
        return "unknown", "the preemptor's GPU request is unknown"
    if level is None:
        # Without a required topology Kueue preempts only to free quota (any resource's:
        # topowatch counts GPUs; a cpu or memory quota can be the short one).
        return "quota", "the preemptor asked for no topology, so only quota could block it"
    if quota is None:
        return "unknown", "the preemptor's ClusterQueue is not known to topowatch"
    if quota.amount is None:
        return "unknown", quota.reason
    if quota.amount < gpus_needed:
        return "quota", (
            f"its queue could reserve only {quota.amount} of the {gpus_needed} GPUs needed"
            f" ({quota.reason})"
        )
    if fit is None or fit.status == "invalid":
        why = fit.reason if fit is not None else "its placement could not be judged"
        return "unknown", f"its queue had the quota, but {why}"
    if not fit.fits:
        return "topology", (
            f"its queue could reserve the {gpus_needed} GPUs needed ({quota.amount} available);"
            f" {fit.summary}"
        )
    return "unknown", (
        f"its queue could reserve the {gpus_needed} GPUs needed and it {fit.summary}: neither"
        " quota nor topology explains the preemption as topowatch saw the cluster"
    )


# --- pending causes ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PendingCause:
    cause: str  # quota | topology | misconfigured | inactive | waiting
    quota_reason: str
    quota_message: str
    topology_message: str
    quota_available: int | None = None  # what the queue could still admit, None if unknown
    quota_detail: str = ""  # how that was reached, or "unknown: <why>"
    fit: Fit | None = None  # the requested level's best domain, when judged
    placement: PlacementAnswer | None = None  # the whole request (preferred climbs, spreads)
    # "blocked because 2 nodes of nn-a are in a deep health check (...)", "also unavailable:
    # ...", or "" (part of topology_message too)
    unavailable_note: str = ""

    @property
    def summary(self) -> str:
        return self.topology_message or self.quota_message or self.quota_reason or self.cause


_MISCONFIGURED_REASONS = frozenset({"Misconfigured", "NoMatchingFlavor", "ClusterQueueStopped"})
_MISCONFIGURED_PHRASES = ("doesn't exist", "couldn't find matching flavor", "is inactive")
_TOPOLOGY_PHRASES = ("allows to fit only", "doesn't allow to fit", "topology")


def pending_cause(
    workload: Workload,
    quota: Answer | None,
    placement: PlacementAnswer | None,
    unavailable_note: str = "",
) -> PendingCause:
    """Why a workload without quota waits: Kueue's own reason, plus the topology reason when
    its queue has the quota (`quota`, the cohort tree's `available`) but Kueue's TAS could not
    place its pods (`placement`: whole pods per node, on the flavor's nodes; a required level
    never climbs, a preferred one climbs and then spreads, tas_flavor_snapshot.go).

    Kueue says the same in its QuotaReserved message ("topology ... allows to fit only N out of
    M pod(s)"); that message alone makes the cause topology when topowatch's quota answer does
    not say the queue is short. `unavailable_note` says which nodes a deep health check or an
    EC2 scheduled event keeps out, when they are why it cannot be placed; it joins the topology
    message."""
    cond = workload.condition("QuotaReserved")
    reason = cond.reason if cond is not None and cond.status == "False" else ""
    message = cond.message if cond is not None and cond.status == "False" else ""
    needed = workload.gpus_requested
    allowed = quota.amount if quota is not None else None
    quota_short = allowed is not None and allowed < needed
    topo = ""
    if (
        placement is not None
        and not placement.placeable
        and placement.mode in ("required", "preferred", "slices")
        and not quota_short
    ):
        room = f"quota allows {allowed} GPUs" if allowed is not None else "quota may allow it"
        topo = f"{room}; {placement.summary}"
        if unavailable_note:
            topo = f"{topo}; {unavailable_note}"
    asked = placement is not None and placement.mode in ("required", "preferred", "slices")
    lowered = message.lower()
    if not workload.active:
        cause = "inactive"
    elif reason in _MISCONFIGURED_REASONS or any(p in lowered for p in _MISCONFIGURED_PHRASES):
        cause = "misconfigured"
    elif topo or (asked and not quota_short and any(p in lowered for p in _TOPOLOGY_PHRASES)):
        cause = "topology"
    elif "quota" in lowered or reason in ("Pending", "WaitingForQuota"):
        cause = "quota"
    else:
        cause = "waiting"
    return PendingCause(
        cause,
        reason,
        message,
        topo,
        quota_available=allowed,
        quota_detail=quota.reason if quota is not None else "",
        fit=placement.tried[0] if placement is not None and placement.tried else None,
        placement=placement,
        unavailable_note=unavailable_note if topo else "",
    )


def workload_request(workload: Workload) -> TopologyRequest | None:
    """The topology request that describes the workload: the first pod set that has one."""
    for pod_set in workload.pod_sets:
        if pod_set.topology.mode != "none":
            return pod_set.topology
    return None
