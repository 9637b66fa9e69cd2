"""Which flavor Kueue's flavor assigner gives a workload, resource by resource, and which
resource's quota keeps it out.

Kueue checks quota before it tries to place a single pod (pkg/scheduler/flavorassigner/
flavorassigner.go `assignFlavors`, at kubernetes-sigs/kueue@ff69552e79ad, `KUEUE`):

- pod set by pod set, resource group by resource group (`RGByResource`: the resources one
  spec.resourceGroups entry covers share one flavor choice; several groups choose apart), it
  tries the group's flavors in order (`findFlavorForPodSets`);
- a flavor the pod set cannot use is passed over (`checkFlavorForPodSets`): one whose
  spec.nodeTaints the pod's tolerations plus the flavor's do not tolerate ("untolerated taint
  ... in flavor F"), one whose spec.nodeLabels the pod's nodeSelector or required node
  affinity rule out, read only on the label keys the flavor sets (`flavorSelector`: "flavor
  F doesn't match node affinity"), and for a pod set asking for a topology, a flavor without
  a Topology ("does not support TopologyAwareScheduling") or a flavor whose Topology lacks
  the requested level ("does not contain the requested level", `TASFlavorSnapshot.HasLevel`),
  or for one asking for none, a TAS flavor in a queue whose flavors are not all TAS
  ("supports only TopologyAwareScheduling"; tas_flavorassigner.go
  `checkPodSetAndFlavorMatchForTAS`). In a queue whose flavors all have a Topology
  (clusterqueue.go `isTASOnly`) a pod set asking for none gets an implied request
  (`isTASImplied`): no flavor is ruled out for it, and TAS places it (`tas_pod_sets`);
- on a usable flavor every requested resource of the group is checked (`fitsResourceQuota`):
  the pod set's request plus what earlier pod sets of the workload took there, against the
  queue's maximum capacity (`PotentialAvailable`: more than that never fits, "insufficient
  quota for R in flavor F, ... > maximum capacity (M)") and its unused quota (`Available`:
  within it fits; beyond it "insufficient unused quota for R in flavor F, N more needed",
  which preemption may cure);
- flavor fungibility (`shouldTryNextFlavor`, the ClusterQueue's spec.flavorFungibility): a
  flavor where everything fits ends the search, unless it needs borrowing and whenCanBorrow
  is TryNextFlavor; one that needs preemption does not (whenCanPreempt defaults to
  TryNextFlavor in v1beta2); at the end the most preferred attempt is kept (fit without
  borrowing, fit borrowing, preemption, no fit);
- `pods` counts as a resource of the pod set (its pod count) when a group covers it; a
  requested resource no group covers is refused under Kueue's default quotaCheckStrategy
  BlockUndeclared ("resource R unavailable in ClusterQueue"), unless the manager's
  configuration excludes it (resources.excludeResourcePrefixes) or ignores undeclared
  resources: which one holds is not in any object topowatch reads, so such a resource is
  reported, never taken as the cause.

The amounts are Kueue's integers (`QuotaTree`), the words Kueue's own (`kueue_quantity`).
Pure: plain objects and a `QuotaTree` in, an answer out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from exporter.cluster.capacity.placement import (
    node_affinity_matches,
    unknown_operators,
    untolerated_taint,
)
from exporter.cluster.capacity.quota import Answer, QuotaTree, kueue_quantity
from exporter.cluster.objects import (
    GPU_RESOURCE,
    PODS_RESOURCE,
    ClusterQueue,
    Node,
    NodeSelectorTerm,
    PodSetRequest,
    ResourceFlavor,
    ResourceGroup,
    TopologyRequest,
    Workload,
)

__all__ = [
    "CheckStatus",
    "FlavorTry",
    "GroupAssignment",
    "QuotaAssignment",
    "ResourceCheck",
    "assign",
    "flavor_mismatch",
    "level_mismatches",
    "slice_requests",
    "tas_pod_sets",
]

CheckStatus = Literal["fits", "unused", "maximum", "unknown"]
# Kueue's preference among attempts (flavorassigner.go granularMode): lower is better.
_RANK: Final[Mapping[str, int]] = {"fits": 0, "unused": 2, "unknown": 3, "maximum": 4}
TRY_NEXT: Final = "TryNextFlavor"


@dataclass(frozen=True, slots=True)
class ResourceCheck:
    """One resource of one pod set on one flavor, as `fitsResourceQuota` judges it."""

    flavor: str
    resource: str
    requested: int  # this pod set's request plus earlier pod sets' on the same flavor
    status: CheckStatus
    available: Answer
    potential: Answer
    borrows: bool = False  # fits only by borrowing past its nominal quota
    previous: int = 0  # of `requested`, what earlier pod sets of the workload took

    @property
    def short(self) -> int:
        """How much more is needed: beyond the unused quota, or beyond the maximum capacity."""
        if self.status == "unused" and self.available.amount is not None:
            return max(0, self.requested - self.available.amount)
        if self.status == "maximum" and self.potential.amount is not None:
            return max(0, self.requested - self.potential.amount)
        return 0

    @property
    def need(self) -> str:
        """ "500Gi more memory", "15 more nvidia.com/gpu": the shortfall in Kueue's units."""
        return f"{kueue_quantity(self.resource, self.short)} more {self.resource}"

    @property
    def message(self) -> str:
        """Kueue's own sentence for it (flavorassigner.go `fitsResourceQuota`)."""
        what = f"{self.resource} in flavor {self.flavor}"
        if self.status == "maximum":
            return (
                f"insufficient quota for {what}, previously considered podsets requests"
                f" ({self.amount(self.previous)}) + current podset request"
                f" ({self.amount(self.requested - self.previous)}) > maximum capacity"
                f" ({self.amount(self.potential.amount or 0)})"
            )
        if self.status == "unused":
            return (
                f"insufficient unused quota for {what},"
                f" {kueue_quantity(self.resource, self.short)} more needed"
            )
        if self.status == "unknown":
            answer = self.available if self.available.amount is None else self.potential
            return f"{what}: {answer.reason}"
        return f"{what}: fits ({self.amount(self.requested)} of {self.available.reason})"

    def amount(self, value: int) -> str:
        return kueue_quantity(self.resource, value)


@dataclass(frozen=True, slots=True)
class FlavorTry:
    """One flavor tried for one group of one pod set."""

    flavor: str
    mismatch: str  # why the pod set cannot use the flavor at all, "" when it can
    checks: tuple[ResourceCheck, ...]

    @property
    def status(self) -> CheckStatus:
        """The worst of its checks ("maximum" for a flavor the pod set cannot use)."""
        if self.mismatch:
            return "maximum"
        worst: CheckStatus = "fits"
        for check in self.checks:
            if _RANK[check.status] > _RANK[worst]:
                worst = check.status
        return worst

    @property
    def borrows(self) -> bool:
        return any(c.borrows for c in self.checks)

    @property
    def rank(self) -> int:
        if self.mismatch:
            return 5  # not a candidate at all
        status = self.status
        if status == "fits":
            return 1 if self.borrows else 0
        return _RANK[status]

    @property
    def short(self) -> tuple[ResourceCheck, ...]:
        return tuple(c for c in self.checks if c.status != "fits")


@dataclass(frozen=True, slots=True)
class GroupAssignment:
    """One resource group of one pod set: the flavor Kueue would take, and what it tried."""

    pod_set: str
    resources: tuple[str, ...]  # what the pod set requests of the group's resources
    chosen: FlavorTry | None  # the assignment, or the most preferred failed attempt
    tried: tuple[FlavorTry, ...]

    @property
    def fits(self) -> bool:
        return self.chosen is not None and self.chosen.status == "fits"


@dataclass(frozen=True, slots=True)
class QuotaAssignment:
    """The whole workload: a `GroupAssignment` per pod set and resource group.

    `short`, `mismatches`, `limit` and `fits` are worked out once, at construction: many
    pending workloads of one shape share one assignment, and /metrics asks for each."""

    queue: str
    groups: tuple[GroupAssignment, ...]
    undeclared: tuple[tuple[str, str], ...] = ()  # (pod set, resource) no group covers
    assigned: bool = False  # read from the workload's admission, not chosen
    # Every flavor of the queue has a Topology (clusterqueue.go `isTASOnly`): TAS places
    # every pod set, a request implied where it asks for none. None: some flavor unknown.
    tas_only: bool | None = None
    # The resources that keep it out, on the flavors Kueue would have chosen: maximum
    # capacity first (nothing but a quota change cures them), then unused quota, unknown.
    short: tuple[ResourceCheck, ...] = field(init=False)
    # Why flavors were passed over, for groups where no flavor was usable at all.
    mismatches: tuple[str, ...] = field(init=False)
    # "no matching flavor", "maximum capacity", "unused quota", "unknown" or "" (it fits).
    limit: str = field(init=False)
    fits: bool = field(init=False)

    def __post_init__(self) -> None:
        short: list[ResourceCheck] = []
        mismatches: list[str] = []
        for group in self.groups:
            if group.chosen is None or group.fits:
                continue
            short.extend(group.chosen.short)
            if group.chosen.mismatch:
                mismatches.extend(t.mismatch for t in group.tried if t.mismatch)
        short.sort(key=lambda c: (-_RANK[c.status], c.resource != GPU_RESOURCE, c.resource))
        statuses = {c.status for c in short}
        if mismatches:
            limit = "no matching flavor"
        elif "maximum" in statuses:
            limit = "maximum capacity"
        elif "unused" in statuses:
            limit = "unused quota"
        elif "unknown" in statuses:
            limit = "unknown"
        else:
            limit = ""
        object.__setattr__(self, "short", tuple(short))
        object.__setattr__(self, "mismatches", tuple(dict.fromkeys(mismatches)))
        object.__setattr__(self, "limit", limit)
        object.__setattr__(self, "fits", all(g.fits for g in self.groups))

    def flavor_for(self, resource: str) -> str:
        """The flavor chosen (or best tried) for a resource, "" when none."""
        for group in self.groups:
            if resource in group.resources and group.chosen is not None:
                return group.chosen.flavor
        return ""

    def flavor_of(self, pod_set: str) -> str:
        """The flavor chosen (or best tried) for the pod set's first resource group."""
        for group in self.groups:
            if group.pod_set == pod_set and group.chosen is not None:
                return group.chosen.flavor
        return ""

    def check(self, resource: str) -> ResourceCheck | None:
        for group in self.groups:
            if group.chosen is None:
                continue
            for check in group.chosen.checks:
                if check.resource == resource:
                    return check
        return None

    @property
    def summary(self) -> str:
        """Kueue's words for what keeps it out, or "" when it fits."""
        short = self.short
        parts = [c.message for c in short]
        if not short:
            parts.extend(self.mismatches)
        return ", ".join(parts)


FlavorLookup = Callable[[str], ResourceFlavor | None]
# A Topology's levels (node label keys, highest first) by its name; None when not known.
LevelsLookup = Callable[[str], Sequence[str] | None]


_NO_LEVEL: Final = " does not contain the requested level"
_NO_LEVEL_RE: Final = re.compile(r'Flavor "((?:[^"\\]|\\.)*)" does not contain the requested level')


def level_mismatches(workload: Workload) -> frozenset[str]:
    """The flavors Kueue's own pending message says lack the requested level
    ('Flavor "F" does not contain the requested level', checkPodSetAndFlavorMatchForTAS):
    where the Topology is not known (a dump lists none), Kueue's word stands in."""
    cond = workload.condition("QuotaReserved")
    if cond is None or cond.status != "False" or _NO_LEVEL not in cond.message:
        return frozenset()
    return frozenset(_NO_LEVEL_RE.findall(cond.message))


def _go_quote(name: str) -> str:
    """Go's %q of a plain name: Kueue's messages quote flavor names so."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _has_level(request: TopologyRequest, levels: Sequence[str]) -> bool:
    """tas_flavor_snapshot.go `HasLevel`: the request's level (required or preferred; slices
    alone and unconstrained take the highest or lowest, which every Topology has) and its
    slice level are levels of the flavor's Topology."""
    if request.mode in ("required", "preferred") and request.level not in levels:
        return False
    return request.slice_level is None or request.slice_level in levels


def flavor_mismatch(
    flavor_name: str,
    flavor: ResourceFlavor | None,
    pod_set: PodSetRequest,
    tas_only: bool | None = None,
    levels: Sequence[str] | None = None,
) -> str:
    """Why `pod_set` cannot use the flavor at all, "" when it can (`checkFlavorForPodSets`).

    TAS first (tas_flavorassigner.go `checkPodSetAndFlavorMatchForTAS`): a pod set asking for
    a topology (required, preferred, unconstrained or slices) needs a flavor with a Topology,
    one that has the requested level (`HasLevel`; `levels` are the flavor's Topology's, None
    when it is not known: not ruled out); one asking for none may not use a TAS flavor unless
    every flavor of the queue is one (`tas_only`: TAS is then implied, `isTASImplied`, and no
    flavor is ruled out on TAS grounds). Then the flavor's nodeTaints against the pod's
    tolerations plus the flavor's, and its nodeLabels against the pod's nodeSelector and
    required node affinity read on the flavor's label keys (`flavorSelector`). A flavor whose
    spec is not known (a dump lists no ResourceFlavors) is not ruled out, and `tas_only` None
    (some flavor's spec unknown) skips the TAS rule."""
    if flavor is None:
        return ""
    request = pod_set.topology
    explicit = request.mode != "none" or request.slice_level is not None
    if tas_only is not None and (explicit or tas_only):
        if explicit and not flavor.topology_name:
            return f"Flavor {_go_quote(flavor_name)} does not support TopologyAwareScheduling"
        if explicit and levels is not None and not _has_level(request, levels):
            return f"Flavor {_go_quote(flavor_name)} does not contain the requested level"
    elif tas_only is not None and flavor.topology_name:
        return f"Flavor {_go_quote(flavor_name)} supports only TopologyAwareScheduling"
    tolerations = (*pod_set.tolerations, *flavor.tolerations)
    taint = untolerated_taint(flavor.node_taints, tolerations)
    if taint is not None:
        strange = unknown_operators(tolerations)
        note = (
            f" (a toleration with operator {strange[0].operator!r} tolerates nothing)"
            if strange
            else ""
        )
        value = f"={taint.value}" if taint.value else ""
        return f"untolerated taint {taint.key}{value}:{taint.effect} in flavor {flavor_name}{note}"
    allowed = {key for key, _ in flavor.node_labels}
    selector = [(k, v) for k, v in pod_set.node_selector if k in allowed]
    labels = dict(flavor.node_labels)
    if any(labels.get(k) != v for k, v in selector):
        return f"flavor {flavor_name} doesn't match node affinity"
    terms = _terms_for(pod_set.affinity, allowed)
    if terms and not node_affinity_matches(terms, _flavor_node(flavor)):
        return f"flavor {flavor_name} doesn't match node affinity"
    return ""


def _terms_for(
    terms: Sequence[NodeSelectorTerm], allowed: set[str]
) -> tuple[NodeSelectorTerm, ...]:
    """`flavorSelector`: each term keeps only the expressions on the flavor's label keys; a
    term left empty means the affinity matches any flavor (the terms are ORed)."""
    out = []
    for term in terms:
        kept = tuple(e for e in term.expressions if e.key in allowed)
        if not kept:
            return ()
        out.append(NodeSelectorTerm(kept))
    return tuple(out)


def _flavor_node(flavor: ResourceFlavor) -> Node:
    return Node(name="", labels=flavor.node_labels, allocatable_gpus=0, schedulable=True, health="")


def assign(
    workload: Workload,
    queue: ClusterQueue,
    tree: QuotaTree,
    flavor_spec: FlavorLookup,
    topology_levels: LevelsLookup | None = None,
    replaced: Workload | None = None,
) -> QuotaAssignment:
    """Kueue's flavor assignment for the workload in `queue`, with `tree`'s quota.

    An admitted (or quota-reserved) workload keeps the flavors of its admission: only those
    are checked, which is how a preemption's verdict stays in the preemptor's own world. A
    queue without spec.resourceGroups read (a hand-built object) is taken as one group per
    flavor of its quotas, covering the resources they name. `topology_levels` gives a
    Topology's levels by name (a flavor lacking a requested level is passed over; where
    they are not known, the flavors Kueue's pending message says lack it, `level_mismatches`).

    `replaced`: the slice a Kueue elastic Workload replaces, holding its quota in the same
    queue (workloadslicing.ReplacedWorkloadSlice). The new slice keeps its flavors ("could not
    assign F flavor since the original workload is assigned") and asks only for what it adds:
    each resource less the old slice's request for the pod set (flavorassigner.go
    `findFlavorForPodSets` and `findOldPodSetRequest`, "only the delta needed")."""
    groups = queue.resource_groups or _groups_from_quotas(queue)
    assigned: dict[tuple[str, str], str] = {}
    for placement in workload.placements:
        for resource, flavor in placement.flavors:
            assigned[(placement.name, resource)] = flavor
    old: dict[str, dict[str, int]] = {}
    fixed_by_old: dict[tuple[str, str], str] = {}
    if replaced is not None and not assigned:
        old = slice_requests(replaced)
        for placement in replaced.placements:
            for resource, flavor in placement.flavors:
                fixed_by_old[(placement.name, resource)] = flavor
    covers_pods = any(PODS_RESOURCE in g.covered for g in groups)
    specs = [flavor_spec(f) for g in groups for f in g.flavors]
    tas_only = (
        None
        if any(spec is None for spec in specs)
        else all(spec is not None and spec.topology_name for spec in specs)
    )
    no_level = level_mismatches(workload) if not assigned else frozenset()
    when_borrow = queue.flavor_fungibility[0]
    used: dict[tuple[str, str], int] = {}  # what earlier pod sets took, per (flavor, resource)
    out: list[GroupAssignment] = []
    undeclared: list[tuple[str, str]] = []
    for pod_set in workload.pod_sets:
        requests = {name: amount * pod_set.count for name, amount in pod_set.per_pod if amount}
        if covers_pods:
            requests[PODS_RESOURCE] = pod_set.count
        for name, amount in old.get(pod_set.name, {}).items():
            if name in requests:
                requests[name] = max(0, requests[name] - amount)
        covered: set[str] = set()
        for group in groups:
            asked = tuple(r for r in group.covered if requests.get(r, 0) > 0)
            covered.update(group.covered)
            if not asked:
                continue
            flavors = group.flavors
            fixed = [assigned[(pod_set.name, r)] for r in asked if (pod_set.name, r) in assigned]
            fixed += [
                fixed_by_old[(pod_set.name, r)] for r in asked if (pod_set.name, r) in fixed_by_old
            ]
            if fixed:
                flavors = (fixed[0],)
            tried: list[FlavorTry] = []
            chosen: FlavorTry | None = None
            for flavor in flavors:
                attempt = _try(
                    queue.name,
                    flavor,
                    flavor_spec,
                    pod_set,
                    asked,
                    requests,
                    tree,
                    used,
                    tas_only,
                    topology_levels,
                    no_level,
                )
                tried.append(attempt)
                if attempt.status == "fits" and not (attempt.borrows and when_borrow == TRY_NEXT):
                    chosen = attempt
                    break
            if chosen is None and tried:
                chosen = min(tried, key=lambda t: t.rank)  # first among equals
            if chosen is not None:
                for check in chosen.checks:
                    key = (chosen.flavor, check.resource)
                    used[key] = used.get(key, 0) + requests.get(check.resource, 0)
            out.append(GroupAssignment(pod_set.name, asked, chosen, tuple(tried)))
        undeclared.extend(
            (pod_set.name, r) for r in sorted(requests) if r not in covered and requests[r] > 0
        )
    return QuotaAssignment(queue.name, tuple(out), tuple(undeclared), bool(assigned), tas_only)


def _try(
    queue: str,
    flavor: str,
    flavor_spec: FlavorLookup,
    pod_set: PodSetRequest,
    asked: Sequence[str],
    requests: Mapping[str, int],
    tree: QuotaTree,
    used: Mapping[tuple[str, str], int],
    tas_only: bool | None = None,
    topology_levels: LevelsLookup | None = None,
    no_level: frozenset[str] = frozenset(),
) -> FlavorTry:
    spec = flavor_spec(flavor)
    levels = None
    if spec is not None and spec.topology_name and topology_levels is not None:
        levels = topology_levels(spec.topology_name)
    mismatch = flavor_mismatch(flavor, spec, pod_set, tas_only, levels)
    request = pod_set.topology
    explicit = request.mode != "none" or request.slice_level is not None
    if not mismatch and levels is None and explicit and flavor in no_level:
        mismatch = f"Flavor {_go_quote(flavor)} does not contain the requested level"
    if mismatch:
        return FlavorTry(flavor, mismatch, ())
    checks = []
    for resource in asked:
        previous = used.get((flavor, resource), 0)
        value = previous + requests[resource]
        available = tree.available(queue, flavor, resource)
        potential = tree.potential(queue, flavor, resource)
        status: CheckStatus
        borrows = False
        if available.amount is None or potential.amount is None:
            status = "unknown"
        elif value > potential.amount:
            status = "maximum"
        elif value <= available.amount:
            status = "fits"
            nominal, usage = tree.held(queue, flavor, resource)
            borrows = usage + value > nominal
        else:
            status = "unused"
        checks.append(
            ResourceCheck(flavor, resource, value, status, available, potential, borrows, previous)
        )
    return FlavorTry(flavor, "", tuple(checks))


def _groups_from_quotas(queue: ClusterQueue) -> tuple[ResourceGroup, ...]:
    by_flavor: dict[str, list[str]] = {}
    for quota in queue.quotas:
        by_flavor.setdefault(quota.flavor, []).append(quota.resource)
    if not by_flavor:
        for fq in queue.gpu_quotas:
            by_flavor.setdefault(fq.flavor, []).append(GPU_RESOURCE)
    resources = tuple(dict.fromkeys(r for names in by_flavor.values() for r in names))
    return (ResourceGroup(resources, tuple(by_flavor)),) if by_flavor else ()


def slice_requests(workload: Workload) -> dict[str, dict[str, int]]:
    """What an admitted slice's pod sets hold, per pod set and resource (`pods` its count):
    status.admission's resourceUsage, else the spec's per-pod request times the count
    (workload.go TotalRequests from the admission)."""
    out: dict[str, dict[str, int]] = {}
    for placement in workload.placements:
        pod_set = next((p for p in workload.pod_sets if p.name == placement.name), None)
        per_pod = dict(pod_set.per_pod) if pod_set is not None else {}
        written = dict(placement.usage)
        held = {name: amount * placement.count for name, amount in per_pod.items()}
        held.update(written)
        held[PODS_RESOURCE] = placement.count
        out[placement.name] = held
    return out


def tas_pod_sets(
    workload: Workload,
    assignment: QuotaAssignment | None,
    default_flavor: str = "",
    replaced: Workload | None = None,
) -> list[tuple[PodSetRequest, str]]:
    """The pod sets Kueue's TAS places, in order, each with the flavor it is placed on.

    tas_flavorassigner.go `WorkloadsTopologyRequests`: a pod set explicitly asking for a
    topology (required, preferred, unconstrained or slices), and on a TAS-only ClusterQueue
    (every flavor of it has a Topology, clusterqueue.go `isTASOnly`) every other pod set too,
    with an implied request (`isTASImplied`): unconstrained at the Topology's lowest level
    (tas_flavor_snapshot.go `levelKeyWithImpliedFallback`), every resource counted per node.
    Pod sets of no pods, and implied ones that request nothing, have nothing to place. The
    flavor is the one the assignment chose for the pod set, else `default_flavor`. A slice
    that replaces `replaced` places only the pods it adds: the old slice's stay where they
    are and hold their nodes (tas_elastic_workloads.go `handleScaleUp`)."""
    tas_only = assignment.tas_only if assignment is not None else None
    kept = {p.name: p.count for p in replaced.placements} if replaced is not None else {}
    out: list[tuple[PodSetRequest, str]] = []
    for pod_set in workload.pod_sets:
        if pod_set.name in kept and not workload.placements:
            pod_set = replace(pod_set, count=pod_set.count - kept[pod_set.name])
        request = pod_set.topology
        explicit = request.mode != "none" or request.slice_level is not None
        if pod_set.count <= 0 or not (explicit or tas_only):
            continue
        if not explicit and not any(amount > 0 for _, amount in pod_set.per_pod):
            continue
        flavor = assignment.flavor_of(pod_set.name) if assignment is not None else ""
        out.append((pod_set, flavor or default_flavor))
    return out
