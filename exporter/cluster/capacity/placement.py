"""Where a pod set of one shape can go: the nodes its flavor selects, counted in whole pods.

Kueue's Topology-Aware Scheduling (TAS) does not place GPUs, it places pods: a node offers
floor(free GPUs / GPUs per pod) pods, a topology domain offers the sum over its nodes, and a
required topology needs every pod (or every slice) in one domain of the level. A domain of
4 nodes with 4 free GPUs each holds 16 free GPUs and not one pod of 8 GPUs. This module
answers, for one pod set shape on one ResourceFlavor:

- which nodes it may use (`screen_nodes`, `eligible_nodes`): the flavor's nodeLabels and the
  Topology's level labels, Ready and not cordoned, every NoSchedule/NoExecute taint tolerated
  by the pod's and the flavor's tolerations, the pod's nodeSelector;
- how many of its pods the best domain of one level holds (`fit`);
- whether and where Kueue could place it under a required, preferred, unconstrained or
  slice topology request (`place`).

The rules follow Kueue at kubernetes-sigs/kueue@ff69552e79ad (`KUEUE`); each function's
docstring names the rule and the file it comes from. What is not modelled: resources other
than GPUs (Kueue counts every requested resource and the node's pod limit), required node
affinity, leader/worker pod set groups, multi-layer slice constraints, balanced placement
(alpha, off by default), and usage Kueue has assumed for admitted workloads whose pods are not
bound yet: free GPUs come from the caller (the topology tree counts bound pods).

Pure functions over plain values: nothing here reads the model or the API.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple, Protocol

from exporter.cluster.objects import Node, ResourceFlavor, Taint, Toleration, TopologyRequest
from exporter.topology.labels import (
    LABEL_KEY_OF_LEVEL,
    LEVELS,
    NETWORK_LEVELS,
    ULTRASERVER,
    ULTRASERVER_KEY,
    Placement,
    level_of_label_key,
)

__all__ = [
    "BLOCKING_EFFECTS",
    "KUEUE",
    "Eligibility",
    "Exclusion",
    "Fit",
    "FreeCapacity",
    "NodeFreeMap",
    "PlacementAnswer",
    "eligible_nodes",
    "fit",
    "level_name",
    "place",
    "screen_nodes",
    "tolerates",
    "untolerated_taint",
]

KUEUE: Final = "kubernetes-sigs/kueue@ff69552e79ad"

# Taint effects that keep a pod off a node (Kueue pkg/util/taints/taints.go IsSchedulingTaint).
BLOCKING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})

_NODE = "node"
_LABEL_KEY: Final[Mapping[str, str]] = {**LABEL_KEY_OF_LEVEL, ULTRASERVER: ULTRASERVER_KEY}
_ALL_LEVELS: Final = frozenset((*LEVELS, ULTRASERVER))
_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)")
_INT64 = 2**63


# --- taints and tolerations ----------------------------------------------------------------


def _decimal(value: str) -> int | None:
    if _DECIMAL.fullmatch(value) is None:
        return None
    number = int(value)
    return number if -_INT64 <= number < _INT64 else None


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """Whether one toleration tolerates one taint.

    Rule (core/v1 `Toleration.ToleratesTaint`, k8s.io/component-helpers/scheduling/corev1/
    helpers.go): an empty effect matches every effect, otherwise the effects must be equal; an
    empty key matches every key; operator Equal (or empty) needs equal values, Exists matches
    any value, Lt/Gt compare decimal integers (the taint's value below / above the
    toleration's); any other operator tolerates nothing. Kueue enables Lt/Gt: it calls
    `FindMatchingUntoleratedTaint(..., true)` in pkg/cache/scheduler/
    scheduling_simulator_default.go (ResourceFlavor tolerations themselves may only use
    Equal and Exists: a CEL rule of the CRD).
    """
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    operator = toleration.operator
    if operator in ("", "Equal"):
        return toleration.value == taint.value
    if operator == "Exists":
        return True
    if operator in ("Lt", "Gt"):
        limit, value = _decimal(toleration.value), _decimal(taint.value)
        if limit is None or value is None:
            return False
        return value < limit if operator == "Lt" else value > limit
    return False


def untolerated_taint(taints: Iterable[Taint], tolerations: Sequence[Toleration]) -> Taint | None:
    """The first NoSchedule/NoExecute taint that no toleration tolerates, None when none.

    Rule: `FindMatchingUntoleratedTaint` filtered by `IsSchedulingTaint` (NoSchedule or
    NoExecute; PreferNoSchedule never excludes a node), as Kueue applies it to node taints in
    pkg/cache/scheduler/scheduling_simulator_default.go (`FindFeasibleNodes`, step 1) and to a
    flavor's spec.nodeTaints in pkg/scheduler/flavorassigner/flavorassigner.go
    (`checkFlavorForPodSets`), both against the pod's tolerations plus the flavor's.
    """
    for taint in taints:
        if taint.effect in BLOCKING_EFFECTS and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def _taint_text(taint: Taint) -> str:
    value = f"={taint.value}" if taint.value else ""
    return f"{taint.key}{value}:{taint.effect}"


# --- which nodes a pod set may use ---------------------------------------------------------

ExclusionCause = Literal[
    "flavor",  # the flavor's nodeLabels do not select the node
    "topology-label",  # the node lacks a label of the flavor's Topology levels
    "flavor-taint",  # the flavor's own nodeTaints are not tolerated: no node of it is usable
    "deep-health-check",  # HyperPod deep health check InProgress, Failed or unreadable
    "scheduled-event",  # EC2 maintenance, reboot or retirement due on its instance
    "cordoned",  # spec.unschedulable
    "unhealthy",  # HyperPod's health agent marked it Unschedulable*
    "not-ready",  # Ready is not True
    "taint",  # a NoSchedule/NoExecute taint the pod set does not tolerate
    "node-selector",  # the pod's nodeSelector does not match
]

_CAUSE_WORDS: Final[Mapping[str, str]] = {
    "flavor": "not selected by the flavor",
    "topology-label": "missing a Topology level label",
    "flavor-taint": "behind the flavor's untolerated nodeTaints",
    "deep-health-check": "in a deep health check",
    "scheduled-event": "with an EC2 scheduled event",
    "cordoned": "cordoned",
    "unhealthy": "marked Unschedulable by HyperPod",
    "not-ready": "not Ready",
    "taint": "tainted without a toleration",
    "node-selector": "not matching the nodeSelector",
}


class Exclusion(NamedTuple):
    """One node a pod set may not use, and the first reason found (in Kueue's order)."""

    node: str
    cause: ExclusionCause
    detail: str


@dataclass(frozen=True, slots=True)
class Eligibility:
    """The nodes a pod set may use on one flavor, and why the others are left out."""

    flavor: str  # "" when no flavor was given
    nodes: frozenset[str]
    excluded: tuple[Exclusion, ...]  # sorted by node name

    def count(self, cause: ExclusionCause) -> int:
        return sum(1 for e in self.excluded if e.cause == cause)

    @property
    def summary(self) -> str:
        """E.g. "6 of 10 nodes usable on flavor p5; left out: 3 not selected by the flavor
        (node.kubernetes.io/instance-type=ml.p5.48xlarge), 1 cordoned"."""
        total = len(self.nodes) + len(self.excluded)
        where = f" on flavor {self.flavor}" if self.flavor else ""
        head = f"{len(self.nodes)} of {total} nodes usable{where}"
        if not self.excluded:
            return head
        parts = []
        for cause in _CAUSE_WORDS:
            found = [e for e in self.excluded if e.cause == cause]
            if not found:
                continue
            details = sorted({e.detail for e in found if e.detail})
            extra = f" ({'; '.join(details[:3])}{'; ...' if len(details) > 3 else ''})"
            parts.append(f"{len(found)} {_CAUSE_WORDS[cause]}{extra if details else ''}")
        return f"{head}; left out: {', '.join(parts)}"


def screen_nodes(
    flavor: ResourceFlavor | None,
    nodes: Iterable[Node] | Mapping[str, Node],
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Toleration] = (),
    topology_levels: Sequence[str] = (),
) -> Eligibility:
    """Which nodes a pod set may use on `flavor`, and the first reason each other node fails.

    Rules, checked in Kueue's order:

    1. The flavor's spec.nodeLabels must all be on the node with equal values, and when the
       flavor's Topology levels are given (`topology_levels`, node label keys) the node must
       carry every one of them: `NodeMatchesFlavor` (pkg/util/tas/node.go) as the TAS node
       cache applies it (pkg/cache/scheduler/tas_nodes_cache.go `find`). Nodes lacking a level
       label are not in the flavor's TAS tree at all.
    2. The flavor's spec.nodeTaints must be tolerated by the pod's tolerations plus the
       flavor's spec.tolerations, or the flavor is not usable at all
       (pkg/scheduler/flavorassigner/flavorassigner.go `checkFlavorForPodSets`).
    3. The node must be Ready and not cordoned (spec.unschedulable): the TAS node cache drops
       the others (tas_nodes_cache.go `sync`; "Capacity calculation" in Kueue's
       site/content/en/docs/concepts/topology_aware_scheduling.md). `Node.schedulable` also
       counts HyperPod's Unschedulable* health label, which HyperPod backs with a taint.
       Before that, topowatch's own rule: a node in a deep health check (InProgress, Failed or
       unreadable) or with an EC2 scheduled event due (`Node.unavailable`) is left out, since
       its GPUs are not capacity a job can count on, whatever Kubernetes says.
    4. Every NoSchedule/NoExecute node taint must be tolerated by the pod's tolerations plus
       the flavor's (`untolerated_taint`; scheduling_simulator_default.go step 1).
    5. The pod's nodeSelector must match the node's labels (step 2 there, and kube-scheduler).

    Kueue applies 4 and 5 per node only when the Topology's lowest level is
    kubernetes.io/hostname (as HyperPod's is); kube-scheduler enforces both anyway, so they
    always apply here. `flavor` None means no flavor constraint (rules 1-2 are skipped).
    """
    selector = sorted((node_selector or {}).items())
    flavor_labels = flavor.node_labels if flavor is not None else ()
    all_tolerations = (*tolerations, *(flavor.tolerations if flavor is not None else ()))
    flavor_block = (
        untolerated_taint(flavor.node_taints, all_tolerations) if flavor is not None else None
    )
    levels = tuple(topology_levels)
    selected = ", ".join(f"{k}={v}" for k, v in flavor_labels)
    usable: set[str] = set()
    excluded: list[Exclusion] = []
    plain = not (levels or selector or flavor_block)  # only readiness and taints to check
    for node in nodes.values() if isinstance(nodes, Mapping) else nodes:
        # Node.label gives "" for an absent label, as a Go map lookup does in NodeMatchesFlavor.
        for key, value in flavor_labels:
            if node.label(key) != value:
                excluded.append(Exclusion(node.name, "flavor", selected))
                break
        else:
            if plain and node.schedulable and not node.taints and not node.unavailable:
                usable.add(node.name)
                continue
            found = _exclusion(node, levels, flavor_block, all_tolerations, selector)
            if found is None:
                usable.add(node.name)
            else:
                excluded.append(Exclusion(node.name, *found))
    excluded.sort()  # by node name first
    name = flavor.name if flavor is not None else ""
    return Eligibility(name, frozenset(usable), tuple(excluded))


def _exclusion(
    node: Node,
    levels: Sequence[str],
    flavor_block: Taint | None,
    tolerations: Sequence[Toleration],
    selector: Sequence[tuple[str, str]],
) -> tuple[ExclusionCause, str] | None:
    """Rules 1 (Topology labels) to 5 of `screen_nodes` for a node the flavor selects."""
    labels = dict(node.labels) if levels or selector else {}
    if levels and (missing := [key for key in levels if key not in labels]):
        return "topology-label", f"no {', '.join(missing)}"
    if flavor_block is not None:
        return "flavor-taint", f"nodeTaint {_taint_text(flavor_block)} not tolerated"
    if node.unavailable:
        return node.unavailable, node.unavailable_detail
    if not node.schedulable:
        if node.cordoned:
            return "cordoned", ""
        if node.health.startswith("Unschedulable"):
            return "unhealthy", node.health
        return "not-ready", ""
    if node.taints and (taint := untolerated_taint(node.taints, tolerations)) is not None:
        return "taint", f"{_taint_text(taint)} not tolerated"
    if selector and (mismatch := [f"{k}={v}" for k, v in selector if labels.get(k) != v]):
        return "node-selector", ", ".join(mismatch)
    return None


def eligible_nodes(
    flavor: ResourceFlavor | None,
    nodes: Iterable[Node] | Mapping[str, Node],
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Toleration] = (),
    topology_levels: Sequence[str] = (),
) -> set[str]:
    """Names of the nodes a pod set may use on `flavor`: `screen_nodes` without the reasons
    (the same Kueue rules apply; see there)."""
    return set(screen_nodes(flavor, nodes, node_selector, tolerations, topology_levels).nodes)


# --- free capacity -------------------------------------------------------------------------


class FreeCapacity(Protocol):
    """Free GPUs and topology place per node. `exporter.topology.tree.TopologyTree` is one."""

    def node_free(self, node: str) -> int: ...

    def placement(self, node: str) -> Placement | None: ...


@dataclass(frozen=True, slots=True)
class NodeFreeMap:
    """A `FreeCapacity` from plain maps, for offline answers and tests."""

    free: Mapping[str, int]
    places: Mapping[str, Placement]

    @classmethod
    def from_nodes(
        cls, nodes: Iterable[Node] | Mapping[str, Node], used: Mapping[str, int] | None = None
    ) -> NodeFreeMap:
        """Free GPUs = allocatable - used on schedulable, available nodes, 0 elsewhere (as the
        tree)."""
        used = used or {}
        free: dict[str, int] = {}
        places: dict[str, Placement] = {}
        for node in nodes.values() if isinstance(nodes, Mapping) else nodes:
            left = node.allocatable_gpus - used.get(node.name, 0)
            usable = node.schedulable and not node.unavailable
            free[node.name] = left if usable and left > 0 else 0
            places[node.name] = Placement.from_labels(dict(node.labels))
        return cls(free, places)

    def node_free(self, node: str) -> int:
        return self.free.get(node, 0)

    def placement(self, node: str) -> Placement | None:
        return self.places.get(node)


# --- levels --------------------------------------------------------------------------------


def level_name(level: str) -> str | None:
    """topowatch's name for a level given by name ("network-node-layer-3", "node") or by the
    node label key a Kueue Topology and a topology request use; None when unknown."""
    if level in _ALL_LEVELS:
        return level
    return level_of_label_key(level)


_DomainOf = Callable[[str, Placement], str]


def _domain_getter(level: str) -> _DomainOf:
    """A function giving a node's domain id at `level` ("" when it has none).

    Domains are keyed by label value, as in the topology tree (EC2's network node ids are
    unique); Kueue keys them by the values of every level down to this one, which names the
    same groups on nodes that carry all levels (the only ones in its TAS tree).
    """
    if level == _NODE:
        return lambda name, place: name
    if level in NETWORK_LEVELS:
        index = NETWORK_LEVELS.index(level)
        return lambda name, place: place.layers[index] if index < len(place.layers) else ""
    return lambda name, place: place.domain_at(level) or ""


class _Tally:
    __slots__ = ("free", "max_node_free", "nodes", "pods", "slice_pods", "slices")

    def __init__(self) -> None:
        self.nodes = 0
        self.free = 0
        self.max_node_free = 0
        self.pods = 0
        self.slices = 0
        self.slice_pods: dict[str, int] = {}


def _tally(
    capacity: FreeCapacity,
    eligible: Collection[str],
    level: str,
    gpus_per_pod: int,
    slice_level: str | None,
    slice_size: int,
) -> tuple[dict[str, _Tally], int, int]:
    """Per domain of `level`: pods and slices of the shape that fit, counted Kueue's way.

    Rule: a node holds floor(free / per-pod request) pods (`fillLeafCounts` ->
    `CountInWithLimitingResource`), a domain the sum of its children's pods, and a domain at
    or above the slice level the sum over its slice-level domains of floor(pods / slice size)
    (`fillInCountsHelper`), all in pkg/cache/scheduler/tas_flavor_snapshot.go.
    Returns (tallies, nodes known to `capacity`, known nodes without a label at `level`).
    """
    tallies: dict[str, _Tally] = {}
    known = unlabeled = 0
    sliced = slice_level is not None and slice_size > 1
    domain_of = _domain_getter(level)
    inner_of = _domain_getter(slice_level) if sliced and slice_level is not None else None
    placement_of, free_of = capacity.placement, capacity.node_free
    for name in eligible:
        place = placement_of(name)
        if place is None:
            continue
        known += 1
        domain = domain_of(name, place)
        if not domain:
            unlabeled += 1
            continue
        free = max(0, free_of(name))
        pods = free // gpus_per_pod
        tally = tallies.get(domain)
        if tally is None:
            tally = tallies[domain] = _Tally()
        tally.nodes += 1
        tally.free += free
        if free > tally.max_node_free:
            tally.max_node_free = free
        tally.pods += pods
        if inner_of is not None:
            inner = inner_of(name, place)
            if inner:  # a node without the slice label holds no slice
                tally.slice_pods[inner] = tally.slice_pods.get(inner, 0) + pods
    for tally in tallies.values():
        if sliced:
            tally.slices = sum(p // slice_size for p in tally.slice_pods.values())
        else:
            tally.slices = tally.pods
    return tallies, known, unlabeled


def _kueue_order(tallies: Mapping[str, _Tally], least_free_first: bool) -> list[str]:
    """Domains in the order Kueue tries them (`sortedDomains`, tas_flavor_snapshot.go).

    BestFit (required, preferred): most slices first; LeastFreeCapacity (unconstrained, with
    the TASProfileMixed gate, on by default since v0.15): fewest slices first; then fewest
    pods, then domain id.
    """
    sign = 1 if least_free_first else -1
    return sorted(tallies, key=lambda d: (sign * tallies[d].slices, tallies[d].pods, d))


def _best_fit(order: Sequence[str], tallies: Mapping[str, _Tally], needed: int) -> str:
    """The first domain, in Kueue's order, with the fewest slices that still hold `needed`
    (`findBestFitDomainBy`, tas_flavor_snapshot.go); the first domain when none holds them."""
    best, best_count = order[0], None
    for domain in order:
        count = tallies[domain].slices
        if count >= needed and (best_count is None or count < best_count):
            best, best_count = domain, count
    return best


def _spread(
    tallies: Mapping[str, _Tally], needed: int, least_free_first: bool
) -> tuple[list[str], int]:
    """Domains Kueue fills when no single one must hold everything, and the slices left over.

    Rule (`findLevelWithFitDomains`, tas_flavor_snapshot.go): with LeastFreeCapacity take the
    first single domain that holds all; otherwise take domains in Kueue's order, and under
    BestFit swap the last one for the best fit of the rest.
    """
    order = _kueue_order(tallies, least_free_first)
    if least_free_first:
        for domain in order:
            if tallies[domain].slices >= needed:
                return [domain], 0
    chosen: list[str] = []
    remaining = needed
    for index, domain in enumerate(order):
        if remaining <= 0:
            break
        pick = domain
        if tallies[pick].slices <= 0:
            continue
        if not least_free_first and tallies[pick].slices >= remaining:
            pick = _best_fit(order[index:], tallies, remaining)
        chosen.append(pick)
        remaining -= tallies[pick].slices
    return chosen, max(0, remaining)


# --- one level -----------------------------------------------------------------------------

FitStatus = Literal["fits", "too-small", "no-domain", "no-nodes", "invalid"]


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _domains(count: int, level: str) -> str:
    return _plural(count, "node" if level == _NODE else f"{level} domain")


def _shape(pods: int, gpus_per_pod: int) -> str:
    return f"{_plural(pods, 'pod')} of {_plural(gpus_per_pod, 'GPU')}"


@dataclass(frozen=True, slots=True)
class Fit:
    """How much of one pod set shape the best domain of one level holds.

    `domain` is the domain Kueue would choose when the shape fits (its best fit: the one with
    the fewest pods, or slices, that still holds them all), else the one holding the most (the
    "largest free" domain, counted in pods, not GPUs); "" when the level has no domain.
    `pods_fit` counts whole pods on that domain (whole slices when sliced); `free_gpus` and
    `max_node_free` are that domain's free GPUs on eligible nodes and the most on one node.
    """

    status: FitStatus
    level: str  # topowatch's level name, or the level as given when unknown
    domain: str
    pods_fit: int
    pods_needed: int
    gpus_per_pod: int
    free_gpus: int = 0
    max_node_free: int = 0
    domain_nodes: int = 0
    domain_pods: int = 0  # pods of the shape on that domain, slices aside
    domains: int = 0  # domains of the level among the eligible nodes
    eligible: int = 0  # eligible nodes known to the capacity view
    unlabeled: int = 0  # of those, nodes without a label at this level
    slice_level: str | None = None
    slice_size: int = 1
    slices_fit: int = 0
    slices_needed: int = 0
    reason: str = ""  # why, for "invalid"

    @property
    def fits(self) -> bool:
        return self.status == "fits"

    @property
    def gpus_needed(self) -> int:
        return self.pods_needed * self.gpus_per_pod

    @property
    def summary(self) -> str:
        """One sentence that never contradicts itself: pods and GPUs, the domain, and when the
        domain's GPUs would cover the job but its nodes hold too few each, that too."""
        shape = _shape(self.pods_needed, self.gpus_per_pod)
        if self.status == "invalid":
            return f"cannot judge {shape}: {self.reason}"
        if self.status == "no-nodes":
            return f"no eligible node for {shape}"
        if self.status == "no-domain":
            nodes = _plural(self.eligible, "eligible node")
            key = _LABEL_KEY.get(self.level, self.level)
            return (
                f"no {self.level} domain to place {shape} in:"
                f" none of the {nodes} carries the label {key}"
            )
        sliced = ""
        if self.slice_level is not None and self.slice_size > 1:
            sliced = (
                f" ({self.slices_fit} of {self.slices_needed} slices of"
                f" {_plural(self.slice_size, 'pod')}, each in one {self.slice_level} domain)"
            )
        head = f"fits {self.pods_fit} of {shape}{sliced}"
        if self.fits:
            return f"{head} in {self.level} domain {self.domain}"
        where = f"in the largest free {self.level} domain {self.domain}"
        free = f"{_plural(self.free_gpus, 'free GPU')} there"
        nodes = _plural(self.domain_nodes, "node")
        if self.free_gpus < self.gpus_needed:
            detail = free
        elif self.max_node_free < self.gpus_per_pod:
            detail = (
                f"{free}, but no node has {self.gpus_per_pod} free:"
                f" at most {self.max_node_free} on any of its {nodes}"
            )
        elif self.domain_pods < self.pods_needed:
            detail = f"{free}, but in whole pods per node its {nodes} hold {self.domain_pods}"
        else:  # enough pods, too few whole slices
            detail = (
                f"{free}, room for {_plural(self.domain_pods, 'pod')}, but only"
                f" {self.slices_fit} whole slices of {self.slice_size} within one"
                f" {self.slice_level} domain"
            )
        return f"{head} {where} ({detail})"


def _invalid(level: str, pods: int, gpus_per_pod: int, reason: str) -> Fit:
    return Fit("invalid", level, "", 0, pods, gpus_per_pod, reason=reason)


def _check_shape(
    pods: int, gpus_per_pod: int, slice_level: str | None, slice_size: int | None
) -> str:
    """Why a shape cannot be judged, "" when it can.

    Rules: a slice needs both a level and a size ≥ 1, and the size may not exceed the pod
    count (pkg/controller/jobframework/tas_validation.go `validateSliceSizeAnnotation`,
    `ValidateSliceSizeAnnotationUpperBound`).
    """
    if pods < 1:
        return f"{pods} pods requested"
    if gpus_per_pod < 1:
        return "its pods request no GPUs, so GPU capacity does not bound them"
    if slice_size is not None and slice_level is None:
        return f"slice size {slice_size} without a slice level"
    if slice_level is not None:
        if slice_size is None or slice_size < 1:
            return f"slice level {slice_level} without a slice size of 1 or more"
        if slice_size > pods:
            return f"slice size {slice_size} exceeds the pod count {pods}"
        if level_name(slice_level) is None:
            return f"unknown slice level {slice_level!r}"
    return ""


def fit(
    capacity: FreeCapacity,
    eligible: Collection[str],
    level: str,
    pods: int,
    gpus_per_pod: int,
    *,
    slice_level: str | None = None,
    slice_size: int | None = None,
) -> Fit:
    """The most pods of this shape one domain of `level` holds, and whether that is all.

    `level` is a level name or a node label key; `eligible` the nodes the pod set may use
    (`eligible_nodes`). Rules (pkg/cache/scheduler/tas_flavor_snapshot.go):

    - a node holds floor(free GPUs / GPUs per pod) whole pods, a domain the sum over its
      nodes (`fillLeafCounts`, `fillInCountsHelper`);
    - with `slice_level`/`slice_size` (podset-slice-required-topology/-size) the pod set is
      floor(pods / size) slices, each within one domain of the slice level; a domain holds
      the sum over its slice-level domains of floor(pods there / size) (`fillInCountsHelper`);
    - the shape fits when the first domain in Kueue's order (most slices, then fewest pods,
      then id) holds all slices; Kueue then picks the best fit, the domain with the fewest
      slices that still holds them (`findLevelWithFitDomains`, `findBestFitDomainBy`);
    - a level no eligible node carries has no domain: Kueue answers "no topology domains at
      level" and places nothing (`findLevelWithFitDomains`), and so does this ("no-domain").
    """
    name = level_name(level)
    if name is None:
        return _invalid(level, pods, gpus_per_pod, f"unknown topology level {level!r}")
    problem = _check_shape(pods, gpus_per_pod, slice_level, slice_size)
    if problem:
        return _invalid(name, pods, gpus_per_pod, problem)
    inner = level_name(slice_level) if slice_level is not None else None
    size = slice_size if inner is not None and slice_size is not None else 1
    if inner is not None and _rank(inner) < _rank(name):
        return _invalid(
            name, pods, gpus_per_pod, f"slice level {inner} is above the pod set level {name}"
        )
    tallies, known, unlabeled = _tally(capacity, eligible, name, gpus_per_pod, inner, size)
    needed = pods // size  # Kueue: count / sliceSize
    status: FitStatus
    if not tallies:
        status, chosen, tally = ("no-nodes" if known == 0 else "no-domain"), "", _Tally()
    else:
        order = _kueue_order(tallies, least_free_first=False)
        fits = tallies[order[0]].slices >= needed
        status = "fits" if fits else "too-small"
        # Short of room, report the domain holding the most (slices, then pods): Kueue's own
        # order puts fewer pods first among equal slice counts, which suits best fit, not a
        # "largest free" figure; its not-fit message gives only the slice count, the same.
        largest = min(tallies, key=lambda d: (-tallies[d].slices, -tallies[d].pods, d))
        chosen = _best_fit(order, tallies, needed) if fits else largest
        tally = tallies[chosen]
    return Fit(
        status=status,
        level=name,
        domain=chosen,
        pods_fit=pods if status == "fits" else min(pods, tally.slices * size),
        pods_needed=pods,
        gpus_per_pod=gpus_per_pod,
        free_gpus=tally.free,
        max_node_free=tally.max_node_free,
        domain_nodes=tally.nodes,
        domain_pods=tally.pods,
        domains=len(tallies),
        eligible=known,
        unlabeled=unlabeled,
        slice_level=inner,
        slice_size=size,
        slices_fit=min(needed, tally.slices),
        slices_needed=needed,
    )


# --- a whole topology request --------------------------------------------------------------

_ORDER: Final = (*LEVELS[:-1], ULTRASERVER, LEVELS[-1])  # HyperPod: UltraServer above node


def _rank(level: str) -> int:
    return _ORDER.index(level) if level in _ORDER else len(_ORDER)


@dataclass(frozen=True, slots=True)
class PlacementAnswer:
    """Whether Kueue could place a pod set now, at which level and in which domains.

    `level` and `domains` say where (several domains when the request allows spreading);
    both are empty when it cannot be placed. `tried` holds each level's `Fit`, the requested
    level first.
    """

    mode: str  # "required" | "preferred" | "unconstrained" | "slices" | "none"
    placeable: bool
    level: str
    domains: tuple[str, ...]
    pods_fit: int  # pods (whole slices) the answer's domains hold, at most the pods needed
    pods_needed: int
    gpus_per_pod: int
    tried: tuple[Fit, ...]
    summary: str


def _chain(levels: Sequence[str] | None) -> list[str]:
    """The Topology's levels as topowatch names, highest first; unknown keys are dropped."""
    if levels is None:
        return list(_ORDER)
    names = [level_name(level) for level in levels]
    return [name for name in names if name is not None]


@dataclass(frozen=True, slots=True)
class _Job:
    """One pod set shape on one set of eligible nodes: what `place` asks level by level."""

    capacity: FreeCapacity
    eligible: Collection[str]
    mode: str
    pods: int
    gpus_per_pod: int
    slice_level: str | None
    slice_size: int | None

    @property
    def shape(self) -> str:
        return _shape(self.pods, self.gpus_per_pod)

    @property
    def size(self) -> int:
        return self.slice_size if self.slice_level is not None and self.slice_size else 1

    def at(self, level: str) -> Fit:
        return fit(
            self.capacity,
            self.eligible,
            level,
            self.pods,
            self.gpus_per_pod,
            slice_level=self.slice_level,
            slice_size=self.slice_size,
        )

    def answer(
        self,
        placeable: bool,
        level: str,
        domains: Sequence[str],
        pods_fit: int,
        tried: Sequence[Fit],
        summary: str,
    ) -> PlacementAnswer:
        return PlacementAnswer(
            mode=self.mode,
            placeable=placeable,
            level=level if placeable else "",
            domains=tuple(domains) if placeable else (),
            pods_fit=pods_fit,
            pods_needed=self.pods,
            gpus_per_pod=self.gpus_per_pod,
            tried=tuple(tried),
            summary=summary,
        )

    def spread(self, level: str, least_free_first: bool) -> tuple[list[str], int, int]:
        """(domains Kueue would fill, pods they take, domains of the level) when the pod set
        may span several domains of `level` (`_spread`)."""
        slice_level = level_name(self.slice_level) if self.slice_level is not None else None
        tallies, _, _ = _tally(
            self.capacity, self.eligible, level, self.gpus_per_pod, slice_level, self.size
        )
        needed = self.pods // self.size
        if not tallies:
            return [], 0, 0
        chosen, short = _spread(tallies, needed, least_free_first)
        pods_fit = self.pods if short == 0 else (needed - short) * self.size
        return chosen, pods_fit, len(tallies)


def place(
    capacity: FreeCapacity,
    eligible: Collection[str],
    request: TopologyRequest,
    pods: int,
    gpus_per_pod: int,
    *,
    levels: Sequence[str] | None = None,
) -> PlacementAnswer:
    """Whether and where Kueue TAS could place `pods` pods of `gpus_per_pod` GPUs now.

    `levels` are the flavor's Topology levels (label keys or names, highest first); without
    them topowatch's own levels stand in, and levels no eligible node carries are passed
    over. Rules (Kueue's TAS docs, site/content/en/docs/concepts/topology_aware_scheduling.md
    "User-facing APIs", and pkg/cache/scheduler/tas_flavor_snapshot.go):

    - required (`podset-required-topology`): every pod in one domain of the level, else not
      placed (`findLevelWithFitDomains` returns the not-fit reason when `state.required`);
    - preferred (`podset-preferred-topology`): try the level, then each level up; when not
      even the highest level has one domain that holds all, spread over several of its
      domains (`findLevelWithFitDomains` recursing to `searchLevelIdx-1`, then its greedy
      multi-domain pass, BestFit);
    - slices (`podset-slice-required-topology` + `podset-slice-size`): each slice of N pods
      in one domain of the slice level; with required/preferred the whole follows that
      mode at its level; alone it spreads over the highest level (`levelKey`:
      `isSliceTopologyOnlyRequest` -> highest level, `isUnconstrained`);
    - unconstrained (`podset-unconstrained-topology`) and no request (implied TAS on a TAS
      flavor): pods on any nodes, at the lowest level (`levelKey`, `isUnconstrained`),
      domains taken fewest-free first (LeastFreeCapacity, TASProfileMixed on since v0.15).

    A requested level the Topology does not have, or that no eligible node carries, places
    nothing: Kueue answers "no requested topology level" / "no topology domains at level".
    The slice level must be at or below the requested level ("podset slice topology ... is
    above the podset topology", `findTopologyAssignment`).
    """
    chain = _chain(levels)
    mode: str
    if request.mode in ("required", "preferred"):
        mode = request.mode
    elif request.slice_level is not None:
        mode = "slices"
    else:
        mode = request.mode  # "unconstrained" | "none"
    job = _Job(
        capacity, eligible, mode, pods, gpus_per_pod, request.slice_level, request.slice_size
    )
    problem = _check_shape(pods, gpus_per_pod, request.slice_level, request.slice_size)
    if (
        not problem
        and request.slice_level is not None
        and level_name(request.slice_level) not in chain
    ):
        problem = f"slice level {request.slice_level} is not a level of the flavor's Topology"
    if problem:
        return job.answer(False, "", (), 0, (), f"cannot judge {job.shape}: {problem}")
    if mode in ("required", "preferred"):
        requested = level_name(request.level or "")
        if requested is None or requested not in chain:
            why = f"{request.level or '(no level)'} is not a level of the flavor's Topology"
            return job.answer(False, "", (), 0, (), f"cannot place {job.shape}: {why}")
        first = job.at(requested)
        if mode == "required" or first.status not in ("fits", "too-small"):
            return job.answer(
                first.fits,
                first.level,
                (first.domain,),
                first.pods_fit,
                (first,),
                f"{mode} {requested}: {first.summary}",
            )
        return _preferred(job, chain, first)
    return _anywhere(job, chain)


def _preferred(job: _Job, chain: Sequence[str], first: Fit) -> PlacementAnswer:
    """Preferred topology: the requested level, then each level up, then spread at the top."""
    tried = [first]
    if first.fits:
        summary = f"preferred {first.level}: {first.summary}"
        return job.answer(True, first.level, (first.domain,), first.pods_fit, tried, summary)
    top = first
    for level in reversed(chain[: chain.index(first.level)]):
        attempt = job.at(level)
        if attempt.status == "no-domain":  # a level no eligible node carries: passed over
            continue
        tried.append(attempt)
        top = attempt
        if attempt.fits:
            summary = (
                f"preferred {first.level}: {first.summary}; one level up"
                if len(tried) == 2
                else f"preferred {first.level}: {first.summary}; {len(tried) - 1} levels up"
            )
            summary += f", {attempt.summary}"
            return job.answer(
                True, attempt.level, (attempt.domain,), attempt.pods_fit, tried, summary
            )
    chosen, pods_fit, _ = job.spread(top.level, least_free_first=False)
    head = f"preferred {first.level}: no single domain up to {top.level} holds {job.shape}"
    if pods_fit >= job.pods:
        names = ", ".join(chosen[:4]) + (", ..." if len(chosen) > 4 else "")
        summary = f"{head}; spread over {_domains(len(chosen), top.level)} ({names})"
        return job.answer(True, top.level, chosen, pods_fit, tried, summary)
    summary = f"{head}; even spread over every {top.level} domain only {pods_fit} fit"
    return job.answer(False, "", (), pods_fit, tried, summary)


def _anywhere(job: _Job, chain: Sequence[str]) -> PlacementAnswer:
    """Unconstrained, implied, or slice-only: spread over one level's domains, no climbing.

    The level is the lowest (pods anywhere) or, for slices alone, the highest the eligible
    nodes carry (`levelKey`); domains are taken fewest-free first (`_spread`).
    """
    if not chain:
        return job.answer(False, "", (), 0, (), f"cannot place {job.shape}: no Topology levels")
    candidates = chain if job.mode == "slices" else list(reversed(chain))
    what = "slices" if job.mode == "slices" else "unconstrained" if job.mode != "none" else ""
    for level in candidates:
        chosen, pods_fit, domains = job.spread(level, least_free_first=True)
        if domains == 0:
            continue
        label = f"{what} at {level}" if what else f"no topology request, at {level}"
        sliced = ""
        if job.mode == "slices" and job.slice_level is not None:
            sliced = f" in slices of {job.size} within one {level_name(job.slice_level)} each"
        if pods_fit >= job.pods:
            summary = f"{label}: fits {job.shape}{sliced} on {_domains(len(chosen), level)}"
            return job.answer(True, level, chosen, pods_fit, (), summary)
        summary = (
            f"{label}: only {pods_fit} of {job.shape}{sliced} fit on all {_domains(domains, level)}"
        )
        return job.answer(False, "", (), pods_fit, (), summary)
    return job.answer(False, "", (), 0, (), f"no eligible node for {job.shape}")
