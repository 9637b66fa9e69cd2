"""A small, pure imitation of Kueue's admission decisions for the simulated cluster.

It answers one question per pending workload: admit it here, preempt these workloads for it,
or keep it waiting with this message, and says why (`Verdict`: the cause in the cluster
service's vocabulary, the short resource and how much, the flavor, the domains), so the
simulation can serve as an oracle for the service's judgments. The rules are Kueue's classical
(non fair-sharing) scheduler, kubernetes-sigs/kueue @ff69552 (main after v0.19.2):

- quota (`quota.py`, a port of pkg/cache/scheduler/resource_node.go): every resource of a
  ClusterQueue's resourceGroups, per flavor, nominal / borrowingLimit / lendingLimit, in a tree
  of Cohorts with their own quotas;
- flavor assignment (pkg/scheduler/flavorassigner/flavorassigner.go): per pod set and
  resource group, the flavors in order; a flavor is skipped when the pod set asks for a
  topology level it lacks (tas_flavorassigner.go `checkPodSetAndFlavorMatchForTAS`), when a
  NoSchedule/NoExecute taint of its nodeTaints is not tolerated by the pods' tolerations plus
  its own, or when the pods' nodeSelector does not match its nodeLabels
  (`checkFlavorForPodSets`); each requested resource is checked by `fitsResourceQuota`
  ("maximum capacity" first, then "unused quota"), earlier pod sets' requests counted, and
  `FlavorFungibility` (whenCanBorrow MayStopSearch, whenCanPreempt TryNextFlavor) picks the
  flavor; a ClusterQueue that covers `pods` counts one per pod;
- Topology-Aware Scheduling (`tas.py`, tas_flavor_snapshot.go) once quota fits: required,
  preferred, and the implied unconstrained request of a TAS-only ClusterQueue; every resource
  plus the pod count against each node; taints against tolerations; a pod set that TAS cannot
  place makes the workload preempt for topology, unless it could not fit the empty cluster;
- preemption (pkg/scheduler/preemption/preemption.go `classicalPreemptions`,
  classical/hierarchical_preemption.go, classical/candidate_generator.go,
  common/ordering.go): candidates that use a flavor-resource needing preemption, hierarchical
  reclaim and priority candidates from borrowing queues of the cohort tree and lower-priority
  ones of the queue itself, in Kueue's order; removed one by one until the workload fits
  (quota and TAS), then put back in reverse order when not needed.

Admission checks are not the scheduler's business in Kueue either: an `Admit` here is a quota
reservation; the ClusterQueue's AdmissionChecks then decide whether it is admitted, evicted or
deactivated (`checks.py`, run by exporter/sim/cluster.py).

Deliberate simplifications, each noted where it applies: no fair sharing, no partial
admission, no slices/leaders in TAS, flavor search restarts at the first flavor every time
(Kueue resumes after the last tried one, `LastTriedFlavorIdx`).

Everything here is plain data in, plain data out: no clocks, no randomness, no API objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from exporter.sim.kueue.quota import Node, Quota, QuotaTree, lowest_subtree_that_fits
from exporter.sim.kueue.resources import (
    GPU,
    HOSTNAME,
    PODS,
    FlavorResource,
    Taint,
    Toleration,
    add_into,
    matches,
    quantity,
    untolerated,
)
from exporter.sim.kueue.tas import Leaf, Miss, Placed, largest_domains
from exporter.sim.kueue.tas import place as tas_place
from exporter.topology.labels import INSTANCE_TYPE_KEY

__all__ = [
    "GPU",
    "HOSTNAME",
    "Admit",
    "ClusterState",
    "CohortSpec",
    "Decision",
    "Demand",
    "FlavorQuotas",
    "FlavorSpec",
    "HeldPodSet",
    "Holding",
    "Mode",
    "NodeSlot",
    "PodSetSpec",
    "Preempt",
    "PreemptionReason",
    "QueuePolicy",
    "Quota",
    "ResourceGroup",
    "Verdict",
    "Wait",
    "decide",
]

Mode = Literal["required", "preferred", "unconstrained"]
PreemptionReason = Literal["InClusterQueue", "InCohortReclamation", "InCohortReclaimWhileBorrowing"]
DEFAULT_POD_CAPACITY = 110  # kubelet --max-pods default


# --- the cluster's shape ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FlavorSpec:
    """A ResourceFlavor and the Topology it is scheduled with."""

    name: str
    topology: str
    levels: tuple[str, ...]  # node label keys, highest first; the last is the hostname
    node_labels: Mapping[str, str] | None = None  # None: {instance-type: name}
    node_taints: tuple[Taint, ...] = ()
    tolerations: tuple[Toleration, ...] = ()

    @property
    def labels(self) -> Mapping[str, str]:
        return self.node_labels if self.node_labels is not None else {INSTANCE_TYPE_KEY: self.name}


@dataclass(frozen=True, slots=True)
class NodeSlot:
    name: str
    flavor: str
    gpus: int
    domain: tuple[str, ...]  # the node's value for each level of its flavor's topology
    allocatable: Mapping[str, int] | None = None  # None: the GPUs and 110 pods
    taints: tuple[Taint, ...] = ()
    labels: Mapping[str, str] | None = None

    def capacity(self) -> dict[str, int]:
        out = dict(self.allocatable) if self.allocatable is not None else {GPU: self.gpus}
        out.setdefault(PODS, DEFAULT_POD_CAPACITY)
        return out


@dataclass(frozen=True, slots=True)
class FlavorQuotas:
    name: str
    quotas: Mapping[str, Quota]  # resource -> quota


@dataclass(frozen=True, slots=True)
class ResourceGroup:
    covered: tuple[str, ...]
    flavors: tuple[FlavorQuotas, ...]


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """One ClusterQueue: its quota per flavor and resource, and its preemption policy.

    `quotas` alone (flavor -> GPU quota) is one resource group covering nvidia.com/gpu;
    `resource_groups`, when given, replaces it."""

    name: str
    cohort: str
    quotas: Mapping[str, Quota]
    preempt_within_queue: bool = True  # withinClusterQueue: LowerPriority (else Never)
    reclaim_within_cohort: bool = True  # reclaimWithinCohort: Any (else Never)
    borrow_within_cohort_max_priority: int | None = None  # borrowWithinCohort LowerPriority
    resource_groups: tuple[ResourceGroup, ...] = ()
    when_can_borrow: str = "MayStopSearch"
    when_can_preempt: str = "TryNextFlavor"

    @property
    def groups(self) -> tuple[ResourceGroup, ...]:
        if self.resource_groups:
            return self.resource_groups
        flavors = tuple(FlavorQuotas(f, {GPU: q}) for f, q in self.quotas.items())
        return (ResourceGroup((GPU,), flavors),)

    def group_for(self, resource: str) -> ResourceGroup | None:
        for group in self.groups:
            if resource in group.covered:
                return group
        return None

    def covers(self, resource: str) -> bool:
        return self.group_for(resource) is not None

    def flavor_names(self) -> list[str]:
        return [f.name for g in self.groups for f in g.flavors]

    def quota_map(self) -> dict[FlavorResource, Quota]:
        return {(f.name, r): q for g in self.groups for f in g.flavors for r, q in f.quotas.items()}


@dataclass(frozen=True, slots=True)
class CohortSpec:
    """A Cohort object: its parent and its own quota (v1beta2 Cohort spec)."""

    name: str
    parent: str = ""
    quotas: Mapping[FlavorResource, Quota] = field(default_factory=dict)


# --- workloads ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodSetSpec:
    name: str
    count: int
    requests: Mapping[str, int]  # per pod, Kueue's units (resources.py)
    mode: Mode = "unconstrained"
    level: str | None = None
    tolerations: tuple[Toleration, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Demand:
    """What a pending workload asks for: one pod set from the legacy fields (`flavor` is the
    instance type its nodeSelector names), or `pod_sets`."""

    key: str
    queue: str
    flavor: str
    pods: int
    gpus_per_pod: int
    priority: int
    mode: Mode = "unconstrained"
    level: str | None = None
    pod_sets: tuple[PodSetSpec, ...] = ()

    @property
    def gpus(self) -> int:
        return sum(ps.count * ps.requests.get(GPU, 0) for ps in self.sets())

    def sets(self) -> tuple[PodSetSpec, ...]:
        if self.pod_sets:
            return self.pod_sets
        selector = {INSTANCE_TYPE_KEY: self.flavor} if self.flavor else {}
        return (
            PodSetSpec(
                "main",
                self.pods,
                {GPU: self.gpus_per_pod},
                self.mode,
                self.level,
                (),
                selector,
            ),
        )


@dataclass(frozen=True, slots=True)
class HeldPodSet:
    name: str
    flavor: str
    per_pod: Mapping[str, int]
    placement: tuple[tuple[str, int], ...]  # (node, pods)

    @property
    def count(self) -> int:
        return sum(p for _, p in self.placement)


@dataclass(frozen=True, slots=True)
class Holding:
    """An admitted workload's claim on quota and on the resources of particular nodes."""

    key: str
    queue: str
    flavor: str
    priority: int
    reserved_at: float
    gpus_per_pod: int
    placement: tuple[tuple[str, int], ...]  # (node, pods) of the first pod set
    pod_sets: tuple[HeldPodSet, ...] = ()

    @property
    def gpus(self) -> int:
        return sum(ps.count * ps.per_pod.get(GPU, 0) for ps in self.sets())

    def sets(self) -> tuple[HeldPodSet, ...]:
        if self.pod_sets:
            return self.pod_sets
        return (HeldPodSet("main", self.flavor, {GPU: self.gpus_per_pod}, self.placement),)


# --- decisions -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why: the cause in the cluster service's vocabulary ("" for an admission; "quota",
    "topology" or "misconfigured"), the short resource and how much is missing in Kueue's
    units, the flavor, the requested level and its domains (where the pods landed; for a
    topology cause, the domains that came closest)."""

    cause: str = ""
    resource: str = ""
    amount: str = ""
    flavor: str = ""
    level: str = ""
    domains: tuple[str, ...] = ()
    detail: str = ""  # "maximum capacity" | "unused quota" | "no preemption candidates" | ...


@dataclass(frozen=True, slots=True)
class Admit:
    placement: tuple[tuple[str, int], ...]  # the first pod set's
    borrowing: bool
    pod_sets: tuple[HeldPodSet, ...] = ()
    verdict: Verdict = Verdict()


@dataclass(frozen=True, slots=True)
class Preempt:
    victims: tuple[tuple[Holding, PreemptionReason], ...]
    message: str  # why the workload could not be admitted without preempting
    topology_driven: bool  # quota had room; only the topology forced the preemption
    verdict: Verdict = Verdict()
    borrowing: bool = False  # the assignment borrows (scheduler.go orders such entries last)


@dataclass(frozen=True, slots=True)
class Wait:
    message: str
    verdict: Verdict = Verdict()
    borrowing: bool = False


Decision = Admit | Preempt | Wait


# --- the scheduler's snapshot --------------------------------------------------------------


@dataclass(slots=True)
class ClusterState:
    """Nodes, their free resources and the quota in use: the scheduler's snapshot."""

    flavors: Mapping[str, FlavorSpec]
    nodes: Mapping[str, NodeSlot]
    queues: Mapping[str, QueuePolicy]
    unschedulable: set[str] = field(default_factory=set)
    free: dict[str, int] = field(default_factory=dict)  # node -> free GPUs
    usage: dict[tuple[str, str], int] = field(default_factory=dict)  # (queue, flavor) -> GPUs
    holdings: dict[str, Holding] = field(default_factory=dict)
    cohorts: Mapping[str, CohortSpec] = field(default_factory=dict)
    node_free: dict[str, dict[str, int]] = field(default_factory=dict)
    tree: QuotaTree | None = None
    epoch: int = 0  # bumped on every change a decision depends on
    # Admitted in the scheduling cycle under way: they hold quota and capacity, but are no
    # preemption candidates yet (Kueue's candidates are the workloads of the cycle's snapshot;
    # what the cycle admits only adds usage, scheduler.go `cq.AddUsage`).
    fresh: set[str] = field(default_factory=set)
    _held: dict[str, dict[FlavorResource, int]] = field(default_factory=dict)
    _leaves: dict[str, tuple[Leaf, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, node in self.nodes.items():
            self.free.setdefault(name, node.gpus)
            self.node_free.setdefault(name, node.capacity())
        if self.tree is None:
            self.tree = QuotaTree(
                {q.name: (q.cohort, q.quota_map()) for q in self.queues.values()},
                {c.name: (c.parent, dict(c.quotas)) for c in self.cohorts.values()},
            )
        for holding in list(self.holdings.values()):
            del self.holdings[holding.key]
            self.add(holding)

    @property
    def quota(self) -> QuotaTree:
        assert self.tree is not None
        return self.tree

    def copy(self) -> ClusterState:
        return ClusterState(
            flavors=self.flavors,
            nodes=self.nodes,
            queues=self.queues,
            unschedulable=set(self.unschedulable),
            holdings=dict(self.holdings),
            cohorts=self.cohorts,
        )

    def touch(self) -> None:
        self.epoch += 1

    def quota_usage(self, holding: Holding) -> dict[FlavorResource, int]:
        """What the holding counts against its queue: each covered resource it requests, and
        one `pods` per pod when the queue covers pods (flavorassigner.go assignFlavors)."""
        policy = self.queues.get(holding.queue)
        out: dict[FlavorResource, int] = {}
        for ps in holding.sets():
            for resource, value in ps.per_pod.items():
                if value and (policy is None or policy.covers(resource)):
                    key = (ps.flavor, resource)
                    out[key] = out.get(key, 0) + value * ps.count
            if policy is not None and policy.covers(PODS) and PODS not in ps.per_pod:
                key = (ps.flavor, PODS)
                out[key] = out.get(key, 0) + ps.count
        return out

    def add(self, holding: Holding) -> None:
        for ps in holding.sets():
            for node, pods in ps.placement:
                self.free[node] = self.free.get(node, 0) - pods * ps.per_pod.get(GPU, 0)
                free = self.node_free.setdefault(node, {})
                add_into(free, {r: v * pods for r, v in ps.per_pod.items()}, -1)
                free[PODS] = free.get(PODS, 0) - pods
        usage = self.quota_usage(holding)
        if holding.queue in self.quota.queues:
            queue = self.quota.queue(holding.queue)
            for fr, value in usage.items():
                queue.add_usage(fr, value)
        for (flavor, resource), value in usage.items():
            if resource == GPU:
                slot = (holding.queue, flavor)
                self.usage[slot] = self.usage.get(slot, 0) + value
        self._held[holding.key] = usage
        self.holdings[holding.key] = holding
        self.touch()

    def remove(self, holding: Holding) -> None:
        held = self.holdings.pop(holding.key)
        for ps in held.sets():
            for node, pods in ps.placement:
                self.free[node] = self.free.get(node, 0) + pods * ps.per_pod.get(GPU, 0)
                free = self.node_free.setdefault(node, {})
                add_into(free, {r: v * pods for r, v in ps.per_pod.items()})
                free[PODS] = free.get(PODS, 0) + pods
        usage = self._held.pop(held.key)
        if held.queue in self.quota.queues:
            queue = self.quota.queue(held.queue)
            for fr, value in usage.items():
                queue.remove_usage(fr, value)
        for (flavor, resource), value in usage.items():
            if resource == GPU:
                slot = (held.queue, flavor)
                self.usage[slot] = self.usage.get(slot, 0) - value
        self.touch()

    def cordon(self, node: str, unschedulable: bool) -> None:
        if unschedulable:
            self.unschedulable.add(node)
        else:
            self.unschedulable.discard(node)
        self._leaves.clear()
        self.touch()

    def used(self, queue: str, flavor: str, resource: str = GPU) -> int:
        node = self.quota.queues.get(queue)
        return node.usage.get((flavor, resource), 0) if node is not None else 0

    def borrowed(self, queue: str, flavor: str, resource: str = GPU) -> int:
        node = self.quota.queues.get(queue)
        if node is None:
            return 0
        return max(0, self.used(queue, flavor, resource) - node.nominal((flavor, resource)))

    def available(self, queue: str, flavor: str, resource: str = GPU) -> int:
        """What `queue` could still reserve (ClusterQueueSnapshot.Available)."""
        node = self.quota.queues.get(queue)
        return node.available((flavor, resource)) if node is not None else 0

    def potential(self, queue: str, flavor: str, resource: str = GPU) -> int:
        """The most `queue` could ever hold (PotentialAvailable, "maximum capacity")."""
        node = self.quota.queues.get(queue)
        return node.potential_available((flavor, resource)) if node is not None else 0

    def queue_path(self, queue: str) -> str:
        node = self.quota.queues.get(queue)
        return node.path() if node is not None else f"/{queue}"

    def schedulable_nodes(self, flavor: str) -> list[NodeSlot]:
        return [
            n
            for n in self.nodes.values()
            if n.flavor == flavor and n.name not in self.unschedulable
        ]

    def leaves(self, flavor: str) -> tuple[Leaf, ...]:
        """The flavor's TAS candidates: its schedulable nodes (tas_nodes_cache.go)."""
        cached = self._leaves.get(flavor)
        if cached is None:
            default = self.flavors[flavor].labels if flavor in self.flavors else {}
            cached = tuple(
                Leaf(n.name, n.domain, n.taints, n.labels if n.labels is not None else default)
                for n in self.schedulable_nodes(flavor)
            )
            self._leaves[flavor] = cached
        return cached


# --- flavor assignment (flavorassigner.go) ---------------------------------------------------

NO_FIT, NO_CANDIDATES, PREEMPT, RECLAIM, FIT = range(5)  # preemptionMode, worst first


@dataclass(frozen=True, slots=True)
class _Mode:
    mode: int
    borrow: int

    def preemptive(self) -> bool:
        return self.mode in (PREEMPT, RECLAIM)


def _preferred(a: _Mode, b: _Mode) -> bool:
    """isPreferred with the default preference (BorrowingOverPreemption)."""
    if a.mode == NO_FIT:
        return False
    if b.mode == NO_FIT:
        return True
    if (a.mode == NO_CANDIDATES) != (b.mode == NO_CANDIDATES):
        return a.mode != NO_CANDIDATES
    if a.mode != b.mode:
        return a.mode > b.mode
    return a.borrow < b.borrow


@dataclass(slots=True)
class _Short:
    """One resource that did not fit, as fitsResourceQuota reported it."""

    flavor: str
    resource: str
    amount: int
    kind: str  # "maximum capacity" | "unused quota"


@dataclass(slots=True)
class _PodSetAssignment:
    spec: PodSetSpec
    requests: dict[str, int]  # the pod set's total, `pods` included when covered
    flavors: dict[str, str] = field(default_factory=dict)  # resource -> flavor
    modes: dict[str, int] = field(default_factory=dict)  # resource -> preemptionMode
    reasons: list[str] = field(default_factory=list)
    shorts: list[_Short] = field(default_factory=list)
    matched_any: bool = False  # some flavor passed the affinity/taint/level checks
    error: str = ""
    tas_reason: str = ""
    tas_miss: Miss | None = None
    placed: Placed | None = None

    @property
    def fit(self) -> bool:
        return not self.reasons and not self.error

    def mode(self) -> int:
        """PodSetAssignment.RepresentativeMode as FIT / PREEMPT / NO_FIT."""
        if self.fit:
            return FIT
        if not self.flavors:
            return NO_FIT
        worst = FIT
        for m in self.modes.values():
            worst = min(worst, NO_FIT if m == NO_FIT else PREEMPT if m != FIT else FIT)
        return worst

    @property
    def flavor(self) -> str:
        return next(iter(self.flavors.values()), "")


@dataclass(slots=True)
class _Assignment:
    pod_sets: list[_PodSetAssignment]
    usage: dict[FlavorResource, int] = field(default_factory=dict)
    borrowing: bool = False
    tas_driven: bool = False  # quota fit; TAS made it Preempt (or NoFit when empty fails)

    def mode(self) -> int:
        return min((ps.mode() for ps in self.pod_sets), default=FIT)

    def message(self) -> str:
        """Assignment.Message: per pod set that is not Fit, its sorted reasons."""
        parts = []
        for ps in self.pod_sets:
            if ps.fit:
                continue
            if ps.error:
                return f"failed to assign flavors to pod set {ps.spec.name}: {ps.error}"
            parts.append(
                f"couldn't assign flavors to pod set {ps.spec.name}: "
                + ", ".join(sorted(ps.reasons))
            )
        return "; ".join(parts)

    def needing_preemption(self) -> set[FlavorResource]:
        """flavorResourcesNeedPreemption: every flavor-resource whose mode is Preempt."""
        out = set()
        for ps in self.pod_sets:
            for resource, flavor in ps.flavors.items():
                if ps.modes.get(resource) not in (FIT, NO_FIT):
                    out.add((flavor, resource))
        return out


def _explicit(spec: PodSetSpec) -> bool:
    """workload.IsExplicitlyRequestingTAS: the pod set names a required or preferred level
    (the simulation writes no other kind of topologyRequest; "unconstrained" is none)."""
    return spec.level is not None and spec.mode in ("required", "preferred")


def _tas_only(state: ClusterState, queue: str) -> bool:
    """clusterqueue.go isTASOnly: every flavor of every resource group has a Topology (a
    flavor the cluster does not define is no TAS flavor). The simulation's flavors all have
    one, so its ClusterQueues are TAS-only and every pod set goes through TAS (`_place_all`):
    the implied request of tas_flavorassigner.go isTASImplied where it asks for none."""
    policy = state.queues[queue]
    return all(
        name in state.flavors and bool(state.flavors[name].topology)
        for name in policy.flavor_names()
    )


def _flavor_check(
    state: ClusterState, spec: PodSetSpec, flavor: FlavorSpec, tas_only: bool
) -> str | None:
    """checkFlavorForPodSets, TAS first (tas_flavorassigner.go
    checkPodSetAndFlavorMatchForTAS: an implied request matches every flavor of a TAS-only
    queue; an explicit one needs a flavor with a Topology that has its level, `HasLevel`; a
    pod set without one may not use a TAS flavor of a queue that is not TAS-only), then the
    flavor's taints and node labels: why the flavor cannot serve the pod set, or None."""
    explicit = _explicit(spec)
    if explicit or tas_only:
        if explicit and not flavor.topology:
            return f'Flavor "{flavor.name}" does not support TopologyAwareScheduling'
        if explicit and spec.level not in flavor.levels:
            return f'Flavor "{flavor.name}" does not contain the requested level'
    elif flavor.topology:
        return f'Flavor "{flavor.name}" supports only TopologyAwareScheduling'
    tolerations = (*spec.tolerations, *flavor.tolerations)
    taint = untolerated(flavor.node_taints, tolerations)
    if taint is not None:
        return f"untolerated taint {taint.go_value()} in flavor {flavor.name}"
    labels = flavor.labels
    relevant = {k: v for k, v in spec.node_selector.items() if k in labels}
    if not matches(relevant, labels):
        return f"flavor {flavor.name} doesn't match node affinity"
    return None


def _should_try_next(mode: _Mode, policy: QueuePolicy) -> bool:
    if mode.mode in (NO_FIT, NO_CANDIDATES):
        return True
    if mode.preemptive() and policy.when_can_preempt == "TryNextFlavor":
        return True
    return mode.borrow != 0 and policy.when_can_borrow == "TryNextFlavor"


def _can_preempt_while_borrowing(policy: QueuePolicy) -> bool:
    return policy.borrow_within_cohort_max_priority is not None


def _fits_resource_quota(
    state: ClusterState,
    demand: Demand,
    fr: FlavorResource,
    assumed: int,
    request: int,
) -> tuple[int, int, str, _Short | None]:
    """flavorassigner.go fitsResourceQuota: (mode, borrowing level, reason, shortfall)."""
    queue = state.quota.queue(demand.queue)
    policy = state.queues[demand.queue]
    flavor, resource = fr
    available = queue.available(fr)
    max_capacity = queue.potential_available(fr)
    value = assumed + request
    if value > max_capacity:
        reason = (
            f"insufficient quota for {resource} in flavor {flavor}, previously considered "
            f"podsets requests ({quantity(resource, assumed)}) + current podset request "
            f"({quantity(resource, request)}) > maximum capacity "
            f"({quantity(resource, max_capacity)})"
        )
        return NO_FIT, 0, reason, _Short(flavor, resource, value - max_capacity, "maximum capacity")
    borrow, may_reclaim = lowest_subtree_that_fits(queue, fr, value)
    if value <= available:
        return FIT, borrow, "", None
    reason = (
        f"insufficient unused quota for {resource} in flavor {flavor}, "
        f"{quantity(resource, value - available)} more needed"
    )
    short = _Short(flavor, resource, value - available, "unused quota")
    if queue.nominal(fr) >= value or may_reclaim or _can_preempt_while_borrowing(policy):
        targets = _targets(state, demand, {fr}, {fr: value}, tas=None)
        if not targets:
            borrow_after, _ = lowest_subtree_that_fits(queue, fr, value)
            return NO_CANDIDATES, borrow_after, reason, short
        victims = [h for h, _ in targets]
        for h in victims:
            state.remove(h)
        borrow_after, _ = lowest_subtree_that_fits(queue, fr, value)
        for h in victims:
            state.add(h)
        if any(h.queue == demand.queue for h in victims):
            return PREEMPT, borrow_after, reason, short
        return RECLAIM, borrow_after, reason, short
    return NO_FIT, borrow, reason, short


def _pod_set_requests(policy: QueuePolicy, spec: PodSetSpec) -> dict[str, int]:
    total = {r: v * spec.count for r, v in spec.requests.items() if v}
    if policy.covers(PODS):
        total[PODS] = spec.count
    return total


def _assign_flavors(state: ClusterState, demand: Demand) -> _Assignment:
    """FlavorAssigner.assignFlavors, without TAS."""
    policy = state.queues[demand.queue]
    assignment = _Assignment([])
    for spec in demand.sets():
        requests = _pod_set_requests(policy, spec)
        psa = _PodSetAssignment(spec, requests)
        assignment.pod_sets.append(psa)
        done: set[str] = set()
        for resource in sorted(requests):
            if resource in done:
                continue
            group = policy.group_for(resource)
            if group is None:
                psa.reasons.append(f"resource {resource} unavailable in ClusterQueue")
                psa.flavors.clear()
                break
            covered = {r: v for r, v in requests.items() if r in group.covered}
            done.update(covered)
            chosen = _find_flavor(state, demand, spec, group, covered, assignment.usage, psa)
            if chosen is None:
                psa.flavors.clear()
                break
        if psa.mode() == NO_FIT:
            return assignment
        for resource, flavor in psa.flavors.items():
            key = (flavor, resource)
            assignment.usage[key] = assignment.usage.get(key, 0) + requests[resource]
    queue = state.quota.queue(demand.queue)
    assignment.borrowing = any(queue.borrowing_with(fr, v) for fr, v in assignment.usage.items())
    return assignment


def _find_flavor(
    state: ClusterState,
    demand: Demand,
    spec: PodSetSpec,
    group: ResourceGroup,
    requests: Mapping[str, int],
    assumed: Mapping[FlavorResource, int],
    psa: _PodSetAssignment,
) -> str | None:
    """findFlavorForPodSets for one resource group: the chosen flavor, or None."""
    policy = state.queues[demand.queue]
    best: tuple[str, dict[str, int], list[_Short]] | None = None
    best_mode = _Mode(NO_FIT, 1 << 30)
    reasons: list[str] = []
    all_shorts: list[_Short] = []
    for fq in group.flavors:
        flavor = state.flavors.get(fq.name)
        if flavor is None:
            reasons.append(f"flavor {fq.name} not found")
            continue
        problem = _flavor_check(state, spec, flavor, _tas_only(state, demand.queue))
        if problem is not None:
            reasons.append(problem)
            continue
        psa.matched_any = True
        representative = _Mode(FIT, 0)
        modes: dict[str, int] = {}
        shorts: list[_Short] = []
        for resource in sorted(requests):
            fr = (fq.name, resource)
            mode, borrow, reason, short = _fits_resource_quota(
                state, demand, fr, assumed.get(fr, 0), requests[resource]
            )
            if reason:
                reasons.append(reason)
            if short is not None:
                shorts.append(short)
                all_shorts.append(short)
            granular = _Mode(mode, borrow)
            if _preferred(representative, granular):
                representative = granular
            if representative.mode == NO_FIT:
                continue
            modes[resource] = mode
        if not _should_try_next(representative, policy):
            best, best_mode = (fq.name, modes, shorts), representative
            break
        if _preferred(representative, best_mode):
            best, best_mode = (fq.name, modes, shorts), representative
    if best is None:
        psa.reasons.extend(reasons)
        psa.shorts.extend(all_shorts)
        return None
    name, modes, shorts = best
    for resource in requests:
        psa.flavors[resource] = name
        psa.modes[resource] = modes.get(resource, NO_FIT)
    if best_mode.mode != FIT:
        psa.reasons.extend(reasons)
        psa.shorts.extend(shorts)
    return name


# --- TAS -------------------------------------------------------------------------------------


def _place_all(
    state: ClusterState, pod_sets: Sequence[_PodSetAssignment], empty: bool = False
) -> tuple[list[Placed], _PodSetAssignment | None, Miss | None]:
    """FindTopologyAssignmentsForWorkload: each pod set in order on its flavor, earlier ones'
    placements assumed; with `empty`, as if every TAS workload were preempted."""
    assumed: dict[str, dict[str, int]] = {}
    out: list[Placed] = []
    for psa in pod_sets:
        flavor = state.flavors[psa.flavor]
        spec = psa.spec
        leaves = state.leaves(flavor.name)
        if empty:
            free = {leaf.name: state.nodes[leaf.name].capacity() for leaf in leaves}
        else:
            free = state.node_free
        if assumed:
            free = {n: dict(v) for n, v in free.items()}
            for node, used in assumed.items():
                add_into(free.setdefault(node, {}), used, -1)
        tolerations = (*spec.tolerations, *flavor.tolerations)
        selector = dict(spec.node_selector)
        mode = spec.mode if spec.level is not None else "unconstrained"
        result = tas_place(
            leaves,
            free,
            spec.requests,
            spec.count,
            flavor.levels,
            mode,
            spec.level,
            tolerations,
            selector,
        )
        if isinstance(result, Miss):
            return out, psa, result
        out.append(result)
        for node, pods in result.nodes:
            used = assumed.setdefault(node, {})
            add_into(used, {r: v * pods for r, v in spec.requests.items()})
            used[PODS] = used.get(PODS, 0) + pods
    return out, None, None


def _workload_fits(
    state: ClusterState,
    demand: Demand,
    usage: Mapping[FlavorResource, int],
    allow_borrowing: bool,
    tas: Sequence[_PodSetAssignment] | None,
) -> bool:
    """preemption.go workloadFits."""
    queue = state.quota.queue(demand.queue)
    for fr, value in usage.items():
        if not allow_borrowing and queue.borrowing_with(fr, value):
            return False
        if value > queue.available(fr):
            return False
    if not tas:
        return True
    _, failed, _ = _place_all(state, tas)
    return failed is None


# --- preemption ------------------------------------------------------------------------------

_WITHIN_CQ, _HIERARCHICAL, _WITHOUT_BORROWING, _WHILE_BORROWING = range(4)
_REASON: dict[int, PreemptionReason] = {
    _WITHIN_CQ: "InClusterQueue",
    _HIERARCHICAL: "InCohortReclamation",
    _WITHOUT_BORROWING: "InCohortReclamation",
    _WHILE_BORROWING: "InCohortReclaimWhileBorrowing",
}


@dataclass(frozen=True, slots=True)
class _Candidate:
    holding: Holding
    lca: Node | None
    variant: int


def _uses(state: ClusterState, holding: Holding, frs: set[FlavorResource]) -> bool:
    """WorkloadUsesResources: the holding was assigned one of `frs`."""
    return any(fr in frs for fr in state._held.get(holding.key, {}))


def _classify(
    state: ClusterState,
    demand: Demand,
    holding: Holding,
    frs: set[FlavorResource],
    advantage: bool,
) -> int | None:
    """classifyPreemptionVariant (None: Never)."""
    if not _uses(state, holding, frs):
        return None
    policy = state.queues[demand.queue]
    if holding.queue == demand.queue:
        if not (policy.preempt_within_queue and demand.priority > holding.priority):
            return None
        return _WITHIN_CQ
    if not policy.reclaim_within_cohort:
        return None
    if advantage:
        return _HIERARCHICAL
    threshold = policy.borrow_within_cohort_max_priority
    if threshold is None:
        return _WITHOUT_BORROWING
    if holding.priority >= demand.priority or holding.priority > threshold:
        return _WITHOUT_BORROWING
    return _WHILE_BORROWING


def _queue_holdings(state: ClusterState, queue: str) -> list[Holding]:
    return [h for h in state.holdings.values() if h.queue == queue and h.key not in state.fresh]


def _candidates(
    state: ClusterState,
    demand: Demand,
    frs: set[FlavorResource],
    requests: Mapping[FlavorResource, int],
) -> tuple[list[_Candidate], bool, bool]:
    """NewCandidateIterator: the candidates in Kueue's order, whether none comes from another
    queue, and whether none is a hierarchical-reclaim candidate."""
    policy = state.queues[demand.queue]
    queue = state.quota.queue(demand.queue)
    same: list[_Candidate] = []
    if policy.preempt_within_queue:
        for h in _queue_holdings(state, demand.queue):
            variant = _classify(state, demand, h, frs, False)
            if variant is not None:
                same.append(_Candidate(h, None, variant))
    hierarchy: list[_Candidate] = []
    priority: list[_Candidate] = []
    if queue.parent is not None and policy.reclaim_within_cohort:
        previous: Node | None = None
        advantage, remaining = queue.fits_in_quota(requests)
        for root in queue.ancestors():
            target = hierarchy if advantage else priority
            _collect(state, demand, frs, root, root, previous, advantage, target)
            fits, remaining = root.fits_in_quota(remaining)
            advantage = advantage or fits
            previous = root

    def order(c: _Candidate) -> tuple[bool, int, float, str]:
        # CandidatesOrdering: other queues first, lower priority, most recently admitted.
        h = c.holding
        return (h.queue == demand.queue, h.priority, -h.reserved_at, h.key)

    out = sorted(hierarchy, key=order) + sorted(priority, key=order) + sorted(same, key=order)
    return out, not hierarchy and not priority, not hierarchy


def _collect(
    state: ClusterState,
    demand: Demand,
    frs: set[FlavorResource],
    current: Node,
    subtree_root: Node,
    skip: Node | None,
    advantage: bool,
    out: list[_Candidate],
) -> None:
    """collectCandidatesInSubtree."""
    for child in current.children:
        if child.is_queue or child is skip or child.within_nominal(frs):
            continue
        _collect(state, demand, frs, child, subtree_root, skip, advantage, out)
    for child in current.children:
        if not child.is_queue or child.name == demand.queue:
            continue
        if not child.within_nominal(frs):
            for h in _queue_holdings(state, child.name):
                variant = _classify(state, demand, h, frs, advantage)
                if variant is not None:
                    out.append(_Candidate(h, subtree_root, variant))


def _valid(
    state: ClusterState, demand: Demand, c: _Candidate, frs: set[FlavorResource], borrow: bool
) -> bool:
    """candidateIterator.candidateIsValid."""
    if c.holding.queue == demand.queue:
        return True
    if borrow and c.variant == _WITHOUT_BORROWING:
        return False
    queue = state.quota.queue(c.holding.queue)
    if queue.within_nominal(frs):
        return False
    for node in queue.ancestors():
        if node is c.lca:
            break
        if node.within_nominal(frs):
            return False
    return True


def _targets(
    state: ClusterState,
    demand: Demand,
    frs: set[FlavorResource],
    usage: Mapping[FlavorResource, int],
    tas: Sequence[_PodSetAssignment] | None,
) -> list[tuple[Holding, PreemptionReason]]:
    """classicalPreemptions: the fewest workloads whose eviction lets `demand` in, with
    Kueue's reason for each. `state` is changed while searching and restored."""
    policy = state.queues[demand.queue]
    queue = state.quota.queue(demand.queue)
    candidates, none_from_others, none_hierarchical = _candidates(state, demand, frs, usage)
    if not candidates:
        return []
    forbidden = not _can_preempt_while_borrowing(policy)
    under_nominal = all(queue.nominal(fr) > queue.usage.get(fr, 0) for fr in frs)
    if none_from_others or (forbidden and not under_nominal):
        attempts = [True]
    elif forbidden and none_hierarchical:
        attempts = [False, True]
    else:
        attempts = [True, False]
    for borrow in attempts:
        removed: list[_Candidate] = []
        for c in candidates:
            if c.holding.key not in state.holdings or not _valid(state, demand, c, frs, borrow):
                continue
            state.remove(c.holding)
            removed.append(c)
            if _workload_fits(state, demand, usage, borrow, tas):
                kept = _fill_back(state, demand, usage, borrow, tas, removed)
                for k in kept:
                    state.add(k.holding)
                return [(k.holding, _REASON[k.variant]) for k in kept]
        for c in removed:
            state.add(c.holding)
    return []


def _fill_back(
    state: ClusterState,
    demand: Demand,
    usage: Mapping[FlavorResource, int],
    borrow: bool,
    tas: Sequence[_PodSetAssignment] | None,
    targets: list[_Candidate],
) -> list[_Candidate]:
    """fillBackWorkloads: in reverse order, put back each target the workload does not need
    (Kueue's O(1) deletion moves the last target into the freed slot)."""
    targets = list(targets)
    for i in range(len(targets) - 2, -1, -1):
        state.add(targets[i].holding)
        if _workload_fits(state, demand, usage, borrow, tas):
            targets[i] = targets[-1]
            targets.pop()
        else:
            state.remove(targets[i].holding)
    return targets


# --- the decision ----------------------------------------------------------------------------


def pod_set_message(reasons: Iterable[str], pod_set: str = "main") -> str:
    return f"couldn't assign flavors to pod set {pod_set}: " + ", ".join(sorted(reasons))


def _quota_verdict(assignment: _Assignment, detail: str = "") -> Verdict:
    shorts = [s for ps in assignment.pod_sets for s in ps.shorts]
    chosen = {(ps.flavor, r) for ps in assignment.pod_sets for r in ps.flavors}
    preferred = [s for s in shorts if (s.flavor, s.resource) in chosen] or shorts
    if not preferred:
        flavor = next((ps.flavor for ps in assignment.pod_sets if ps.flavor), "")
        return Verdict("quota", flavor=flavor, detail=detail)
    # Kueue's message lists the reasons sorted: the first one names the short resource.
    short = min(preferred, key=lambda s: (s.kind != "maximum capacity", s.resource, s.flavor))
    return Verdict(
        "quota",
        short.resource,
        quantity(short.resource, short.amount),
        short.flavor,
        detail=detail or short.kind,
    )


def _topology_verdict(state: ClusterState, psa: _PodSetAssignment, detail: str) -> Verdict:
    flavor = state.flavors[psa.flavor]
    spec = psa.spec
    level = spec.level or flavor.levels[-1]
    tolerations = (*spec.tolerations, *flavor.tolerations)
    _, domains = largest_domains(
        state.leaves(flavor.name), state.node_free, spec.requests, flavor.levels, level, tolerations
    )
    return Verdict("topology", flavor=flavor.name, level=level, domains=domains, detail=detail)


def _admitted_verdict(state: ClusterState, assignment: _Assignment) -> Verdict:
    for psa in assignment.pod_sets:
        if psa.placed is None:
            continue
        flavor = state.flavors[psa.flavor]
        return Verdict(
            flavor=flavor.name,
            level=psa.spec.level or flavor.levels[-1],
            domains=psa.placed.domains,
        )
    return Verdict()


def decide(state: ClusterState, demand: Demand) -> Decision:
    """Admit, preempt for, or keep waiting one workload against `state` (left as it was:
    the preemption search removes and restores holdings, and the epoch with them)."""
    epoch = state.epoch
    try:
        return _decide(state, demand)
    finally:
        state.epoch = epoch


def _decide(state: ClusterState, demand: Demand) -> Decision:
    if demand.queue not in state.queues:
        return Wait(f"ClusterQueue {demand.queue} doesn't exist", Verdict("misconfigured"))
    assignment = _assign_flavors(state, demand)
    mode = assignment.mode()
    if mode == NO_FIT:
        message = assignment.message()
        if any(ps.shorts for ps in assignment.pod_sets):
            return Wait(message, _quota_verdict(assignment))
        return Wait(message, Verdict("misconfigured", detail="no flavor matches"))
    if mode == FIT:
        placed, failed, miss = _place_all(state, assignment.pod_sets)
        if failed is None:
            for psa, where in zip(assignment.pod_sets, placed, strict=True):
                psa.placed = where
            held = tuple(
                HeldPodSet(psa.spec.name, psa.flavor, dict(psa.spec.requests), psa.placed.nodes)
                for psa in assignment.pod_sets
                if psa.placed is not None
            )
            verdict = _admitted_verdict(state, assignment)
            return Admit(held[0].placement, assignment.borrowing, held, verdict)
        assert miss is not None
        topology = state.flavors[failed.flavor].topology
        failed.tas_reason = miss.message(topology)
        failed.tas_miss = miss
        failed.reasons.append(failed.tas_reason)
        for resource in failed.modes:
            failed.modes[resource] = PREEMPT
        assignment.tas_driven = True
    # Preempt: can TAS place it at all? (assignFlavors with WithSimulateEmpty)
    _, empty_failed, _ = _place_all(state, assignment.pod_sets, empty=True)
    if empty_failed is not None:
        if assignment.tas_driven:
            verdict = _topology_verdict(state, empty_failed, "does not fit the empty cluster")
        else:
            verdict = _quota_verdict(assignment)
        return Wait(assignment.message(), verdict, assignment.borrowing)
    frs = assignment.needing_preemption()
    tas = [ps for ps in assignment.pod_sets]
    victims = _targets(state, demand, frs, assignment.usage, tas)
    if assignment.tas_driven:
        failed_ps = next(ps for ps in assignment.pod_sets if ps.tas_reason)
        detail = "preempting" if victims else "no preemption candidates"
        verdict = _topology_verdict(state, failed_ps, detail)
    else:
        verdict = _quota_verdict(assignment)
        if not victims:
            verdict = Verdict(
                verdict.cause,
                verdict.resource,
                verdict.amount,
                verdict.flavor,
                detail="no preemption candidates",
            )
    message = assignment.message()
    if victims:
        if assignment.tas_driven:
            verdict = _landing(state, demand, assignment, victims, verdict)
        return Preempt(
            tuple(victims), message, assignment.tas_driven, verdict, assignment.borrowing
        )
    return Wait(message, verdict, assignment.borrowing)


def _landing(
    state: ClusterState,
    demand: Demand,
    assignment: _Assignment,
    victims: Sequence[tuple[Holding, PreemptionReason]],
    verdict: Verdict,
) -> Verdict:
    """For a topology-driven preemption: the domains the preemptor will land in once its
    victims are gone (where Kueue made room)."""
    for h, _ in victims:
        state.remove(h)
    try:
        placed, failed, _ = _place_all(state, assignment.pod_sets)
    finally:
        for h, _ in victims:
            state.add(h)
    failed_ps = next(ps for ps in assignment.pod_sets if ps.tas_reason)
    index = assignment.pod_sets.index(failed_ps)
    if failed is not None or index >= len(placed):
        return verdict
    return Verdict(
        verdict.cause,
        flavor=verdict.flavor,
        level=verdict.level,
        domains=placed[index].domains,
        detail="preempting",
    )


def topology_message(topology: str, miss: Miss) -> str:
    return miss.message(topology)


def quantity_of(resource: str, value: int) -> str:
    return quantity(resource, value)
