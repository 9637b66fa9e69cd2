"""Pure analyses over model state: preemption verdicts, pending causes (locality is
exporter.topology.locality, shared with Slurm).

Each function takes plain values and returns plain values, so the rules can be read and tested
without a model, and the model stays a bookkeeper.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.cluster.capacity.flavors import QuotaAssignment, ResourceCheck
from exporter.cluster.capacity.placement import Fit, PlacementAnswer
from exporter.cluster.capacity.quota import Answer
from exporter.cluster.ledger import Verdict
from exporter.cluster.objects import TopologyRequest, Workload

# --- preemption verdicts ----------------------------------------------------------------------


def short_words(check: ResourceCheck) -> str:
    """One short resource as a person reads it: how much more, of what, where, and why.

    "500Gi more memory in flavor ml.p5.48xlarge than the queue can ever hold: the request
    (2Ti) exceeds its maximum capacity (1536Gi)" or "15 more nvidia.com/gpu in flavor
    ml.p5.48xlarge: 9 of its unused quota for the 24 requested" (Kueue's units,
    `kueue_quantity`)."""
    amount = check.amount
    if check.status == "maximum":
        return (
            f"{check.need} in flavor {check.flavor} than the queue can ever hold: the request"
            f" ({amount(check.requested)}) exceeds its maximum capacity"
            f" ({amount(check.potential.amount or 0)})"
        )
    if check.status == "unused":
        return (
            f"{check.need} in flavor {check.flavor}: {amount(check.available.amount or 0)} of"
            f" its unused quota for the {amount(check.requested)} requested"
        )
    return check.message


def preemption_verdict(
    gpus_needed: int,
    level: str | None,
    quota: Answer | None,
    fit: Fit | None,
    assignment: QuotaAssignment | None = None,
    placement: PlacementAnswer | None = None,
) -> tuple[Verdict, str]:
    """Quota-driven or topology-driven, judged as Kueue decided (flavorassigner.go
    `assignFlavors`: quota is checked per resource, `fitsResourceQuota`, before any pod is
    placed, and a workload that does not fit its flavor's quota for some resource preempts
    for quota; a TAS workload whose quota fits but whose pods no domain of the required level
    can hold preempts to make room there, tas_flavor_snapshot.go
    `FindTopologyAssignmentsForFlavor` with preemption).

    `assignment` is the preemptor's flavor assignment, every resource, on the quota held at
    the moment of the preemption (victims still holding theirs) and on the flavor Kueue gave
    it; `quota` its GPU answer there; `fit` the most pods of its shape one domain of its
    required level held then, on the nodes its flavor selects and its pods may use;
    `placement`, instead of `fit`, where TAS would have placed a pod set asking for another
    kind of topology (preferred, unconstrained, slices alone, or the request implied on a
    TAS-only ClusterQueue, tas_flavorassigner.go `isTASImplied`), `level` then its level
    name or "" (no `level` and no `placement`: no pod set of it goes through TAS). Nothing
    here reads the ClusterQueue status, so the verdict does not depend on which informer
    spoke first.
    """
    short = assignment.short if assignment is not None else ()
    known_short = [c for c in short if c.status in ("maximum", "unused")]
    if known_short:
        return "quota", "; ".join(_preemptor_short(c) for c in known_short)
    if assignment is None and gpus_needed <= 0:
        return "unknown", "the preemptor's GPU request is unknown"
    if level is None and placement is None:
        # Without TAS (no request, and not a TAS-only queue) Kueue preempts only for quota.
        return "quota", (
            "the preemptor asked for no topology and its queue is not TAS-only, so only quota"
            " could block it"
        )
    if quota is None:
        return "unknown", "the preemptor's ClusterQueue is not known to topowatch"
    if short:  # quota that cannot be judged for some resource
        return "unknown", "; ".join(c.message for c in short)
    if quota.amount is None:
        return "unknown", quota.reason
    if assignment is None and quota.amount < gpus_needed:
        return "quota", (
            f"its queue could reserve only {quota.amount} of the {gpus_needed} GPUs needed"
            f" ({quota.reason})"
        )
    needs = f"the {gpus_needed} GPUs needed" if gpus_needed > 0 else "what it requests"
    if fit is None and placement is not None:
        if placement.summary.startswith("cannot"):  # `place` could not judge the shape
            return "unknown", f"its queue had the quota, but {placement.summary}"
        if not placement.placeable:
            return "topology", (
                f"its queue could reserve {needs} ({quota.amount} GPUs available)"
                f"{_other_resources(assignment)}; {placement.summary}"
            )
        return "unknown", (
            f"its queue could reserve {needs} and TAS places it ({placement.summary}):"
            " neither quota nor topology explains the preemption as topowatch saw the cluster"
        )
    if fit is None or fit.status == "invalid":
        why = fit.reason if fit is not None else "its placement could not be judged"
        return "unknown", f"its queue had the quota, but {why}"
    if not fit.fits:
        return "topology", (
            f"its queue could reserve the {gpus_needed} GPUs needed ({quota.amount} available)"
            f"{_other_resources(assignment)}; {fit.summary}"
        )
    return "unknown", (
        f"its queue could reserve the {gpus_needed} GPUs needed and it {fit.summary}: neither"
        " quota nor topology explains the preemption as topowatch saw the cluster"
    )


def _preemptor_short(check: ResourceCheck) -> str:
    """ "its queue could reserve only 9 of the 24 GPUs needed, 15 more nvidia.com/gpu (...)"."""
    amount = check.amount
    what = "GPUs" if check.resource == "nvidia.com/gpu" else check.resource
    if check.status == "maximum":
        return (
            f"the {amount(check.requested)} {what} needed exceed its maximum capacity in"
            f" {check.flavor} ({amount(check.potential.amount or 0)}), {check.need}"
            f" ({check.potential.reason})"
        )
    return (
        f"its queue could reserve only {amount(check.available.amount or 0)} of the"
        f" {amount(check.requested)} {what} needed, {check.need} ({check.available.reason})"
    )


def _other_resources(assignment: QuotaAssignment | None) -> str:
    """ ", and its cpu, memory" when quota for other resources was judged too."""
    if assignment is None:
        return ""
    names = sorted(
        {
            c.resource
            for g in assignment.groups
            if g.chosen is not None
            for c in g.chosen.checks
            if c.resource != "nvidia.com/gpu"
        }
    )
    return f" and its {', '.join(names)}" if names else ""


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
    # Per resource: which quota keeps it out ("maximum capacity" beats "unused quota"), the
    # short resources on the flavors Kueue would have chosen, and the flavor its GPUs take.
    quota_limit: str = ""
    short: tuple[ResourceCheck, ...] = ()
    flavor: str = ""
    # Why the queue's flavors do not suit its pods at all ("flavor F doesn't match node
    # affinity"), and resources no resource group of the queue covers.
    mismatches: tuple[str, ...] = ()
    undeclared: tuple[str, ...] = ()
    # Quota that cannot be judged for some resource ("memory in flavor F: unknown: ..."), and
    # when its pods cannot be placed, which nodes they may use and what in the pod set's own
    # constraints cannot be read (a toleration operator core/v1 does not define).
    quota_unknown: tuple[str, ...] = ()
    nodes_note: str = ""
    node_problems: tuple[str, ...] = ()

    @property
    def quota_words(self) -> str:
        """The short resources as a person reads them (`short_words`), "" when none."""
        return "; ".join(short_words(c) for c in self.short if c.status != "fits")

    @property
    def label(self) -> str:
        """The cause with the kind of quota that binds: "quota (maximum capacity)"."""
        if self.cause == "quota" and self.quota_limit == "maximum capacity":
            return "quota (maximum capacity)"
        return self.cause

    @property
    def summary(self) -> str:
        return (
            self.topology_message
            or (self.quota_words if self.cause == "quota" else "")
            or self.quota_message
            or "; ".join(self.mismatches)
            or self.quota_reason
            or self.cause
        )


_MISCONFIGURED_REASONS = frozenset({"Misconfigured", "NoMatchingFlavor", "ClusterQueueStopped"})
_MISCONFIGURED_PHRASES = (
    "doesn't exist",
    "couldn't find matching flavor",
    "is inactive",
    "unavailable in clusterqueue",  # flavorassigner.go: a resource no resource group covers
)
_TOPOLOGY_PHRASES = ("allows to fit only", "doesn't allow to fit", "topology")
# Placements Kueue's TAS tries: every explicit request, and "none" for the implied one of a
# TAS-only ClusterQueue (tas_flavorassigner.go isTASImplied; the caller passes a placement
# for such a pod set only when TAS is implied).
_TAS_MODES = ("required", "preferred", "slices", "unconstrained", "none")


def pending_cause(
    workload: Workload,
    quota: Answer | None,
    placement: PlacementAnswer | None,
    unavailable_note: str = "",
    assignment: QuotaAssignment | None = None,
    flavor: str = "",
    nodes_note: str = "",
    node_problems: tuple[str, ...] = (),
) -> PendingCause:
    """Why a workload without quota waits, in Kueue's order (flavorassigner.go
    `assignFlavors`): quota first, resource by resource (`fitsResourceQuota` on each
    resource of each pod set's flavor, `assignment`), and only when every resource fits, the
    topology: whether Kueue's TAS could place its pods (`placement`: whole pods per node, on
    the flavor's nodes its pods may use, every resource they request counted; a required
    level never climbs, a preferred one climbs and then spreads, an unconstrained or implied
    one spreads over the lowest level, tas_flavor_snapshot.go).

    A resource whose request exceeds what the queue could ever hold ("insufficient quota
    for R in flavor F, ... > maximum capacity") or its unused quota ("insufficient unused
    quota for R in flavor F, N more needed") makes the cause quota, with that resource named
    and by how much in Kueue's units, never topology: no placement would start it. Kueue says
    the topology reason in its QuotaReserved message ("topology ... allows to fit only N out
    of M pod(s)"); that message alone makes the cause topology when topowatch's quota answer
    does not say the queue is short. `unavailable_note` says which nodes a deep health check
    or an EC2 scheduled event keeps out, when they are why it cannot be placed; it joins the
    topology message. Without an `assignment` (hand-built calls) the GPU `quota` answer alone
    decides whether quota is short."""
    cond = workload.condition("QuotaReserved")
    reason = cond.reason if cond is not None and cond.status == "False" else ""
    message = cond.message if cond is not None and cond.status == "False" else ""
    needed = workload.gpus_requested
    allowed = quota.amount if quota is not None else None
    short: tuple[ResourceCheck, ...] = ()
    limit = ""
    if assignment is not None:
        short = assignment.short
        limit = assignment.limit
        quota_short = limit in ("maximum capacity", "unused quota")
    else:
        quota_short = allowed is not None and allowed < needed
        limit = "unused quota" if quota_short else ""
    topo = ""
    if (
        placement is not None
        and not placement.placeable
        and placement.mode in _TAS_MODES
        and not quota_short
    ):
        room = f"quota allows {allowed} GPUs" if allowed is not None else "quota may allow it"
        topo = f"{room}; {placement.summary}"
        if unavailable_note:
            topo = f"{topo}; {unavailable_note}"
    asked = placement is not None and placement.mode in _TAS_MODES
    lowered = message.lower()
    if not workload.active:
        cause = "inactive"
    elif (
        reason in _MISCONFIGURED_REASONS
        or any(p in lowered for p in _MISCONFIGURED_PHRASES)
        or limit == "no matching flavor"
    ):
        cause = "misconfigured"
    elif quota_short and assignment is not None:
        cause = "quota"  # known short of some resource: placement is never tried
    elif topo or (asked and not quota_short and any(p in lowered for p in _TOPOLOGY_PHRASES)):
        cause = "topology"
    elif "quota" in lowered or reason in ("Pending", "WaitingForQuota", "ExceedsMaxQuota"):
        cause = "quota"
    else:
        cause = "waiting"
    mismatches = assignment.mismatches if assignment is not None else ()
    undeclared = tuple(dict.fromkeys(r for _, r in assignment.undeclared)) if assignment else ()
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
        quota_limit=limit if cause == "quota" else "",
        short=short if cause == "quota" else (),
        flavor=flavor,
        mismatches=mismatches,
        undeclared=undeclared,
        quota_unknown=tuple(c.message for c in short if c.status == "unknown"),
        nodes_note=nodes_note,
        node_problems=node_problems,
    )


def workload_request(workload: Workload) -> TopologyRequest | None:
    """The topology request that describes the workload: the first pod set that has one."""
    for pod_set in workload.pod_sets:
        if pod_set.topology.mode != "none":
            return pod_set.topology
    return None
