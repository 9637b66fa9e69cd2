"""Where a pod set of one shape can go: the nodes its flavor selects, counted in whole pods.

Kueue's Topology-Aware Scheduling (TAS) does not place GPUs, it places pods: a node offers
as many pods as every requested resource and its pod limit allow (floor(free GPUs / GPUs per
pod) when GPUs bind), a topology domain offers the sum over its nodes, and a required
topology needs every pod (or every slice) in one domain of the level. A domain of 4 nodes
with 4 free GPUs each holds 16 free GPUs and not one pod of 8 GPUs. This module answers, for
one pod set shape on one ResourceFlavor:

- which nodes it may use (`screen_nodes`, `eligible_nodes`): the flavor's nodeLabels and the
  Topology's level labels, Ready and not cordoned, every NoSchedule/NoExecute taint tolerated
  by the pod's and the flavor's tolerations (an operator core/v1 does not define tolerates
  nothing, and is reported), the pod's nodeSelector and required node affinity;
- how many of its pods the best domain of one level holds (`fit`);
- whether and where Kueue could place it under a required, preferred, unconstrained or
  slice topology request (`place`).

The rules follow Kueue at kubernetes-sigs/kueue@ff69552e79ad (`KUEUE`); each function's
docstring names the rule and the file it comes from. A node holds as many pods as every
resource a pod requests allows, the pod count included (`requests`, with a capacity that
knows every resource: `NodeResourcesFree`); given only GPUs it counts GPUs. What is not
modelled: leader/worker pod set groups, multi-layer slice constraints, balanced placement
(alpha, off by default), preferred node affinity (a score, not a filter), and usage Kueue has
assumed for admitted workloads whose pods are not bound yet: free capacity comes from the
caller (the topology tree and the model count bound pods).

Pure functions over plain values: nothing here reads the model or the API.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple, Protocol, runtime_checkable

from exporter.cluster.objects import (
    GPU_RESOURCE,
    PODS_RESOURCE,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceFlavor,
    Resources,
    Taint,
    Toleration,
    TopologyRequest,
)
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
    "NodeResourcesFree",
    "PlacementAnswer",
    "ResourceCapacity",
    "eligible_nodes",
    "fit",
    "level_name",
    "node_affinity_matches",
    "place",
    "screen_nodes",
    "tolerates",
    "unknown_operators",
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


_KNOWN_OPERATORS: Final = frozenset({"", "Equal", "Exists", "Lt", "Gt"})


def unknown_operators(tolerations: Iterable[Toleration]) -> list[Toleration]:
    """Tolerations whose operator core/v1 does not define: they tolerate nothing, and an
    answer that leaves a node out for a taint one of them names must say so."""
    return [t for t in tolerations if t.operator not in _KNOWN_OPERATORS]


def _taint_text(taint: Taint) -> str:
    value = f"={taint.value}" if taint.value else ""
    return f"{taint.key}{value}:{taint.effect}"


# --- node affinity ---------------------------------------------------------------------------

_SELECTOR_OPERATORS: Final = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


def _requirement_holds(req: NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    """One matchExpressions entry (k8s.io/component-helpers/scheduling/corev1/nodeaffinity,
    labels.Selector): In / NotIn against the values (NotIn and DoesNotExist hold for an absent
    label), Exists / DoesNotExist, Gt / Lt comparing one integer value with the label's."""
    present = req.key in labels
    value = labels.get(req.key, "")
    operator = req.operator
    if operator == "In":
        return present and value in req.values
    if operator == "NotIn":
        return not present or value not in req.values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if len(req.values) != 1 or not present:
        return False
    limit, number = _decimal(req.values[0]), _decimal(value)
    if limit is None or number is None:
        return False
    return number > limit if operator == "Gt" else number < limit


def node_affinity_matches(terms: Sequence[NodeSelectorTerm], node: Node) -> bool:
    """Whether a node satisfies a pod's required node affinity (`terms`; () is none).

    Rule (nodeaffinity.NewNodeSelector, as Kueue's TAS applies it in scheduling_simulator_
    default.go `FindFeasibleNodes` step 3 and its flavor assigner in `flavorSelector`): the
    terms are ORed, a term's expressions and fields ANDed; an empty term matches no node;
    matchFields knows only metadata.name. A requirement with an operator core/v1 does not
    define makes the whole selector invalid: Kueue answers "invalid affinity node
    selectors" and places nothing, so no node matches.
    """
    if not terms:
        return True
    for term in terms:
        for req in (*term.expressions, *term.fields):
            if req.operator not in _SELECTOR_OPERATORS:
                return False
    labels = dict(node.labels)
    fields = {"metadata.name": node.name}
    for term in terms:
        if not term.expressions and not term.fields:
            continue
        if all(_requirement_holds(r, labels) for r in term.expressions) and all(
            _requirement_holds(r, fields) for r in term.fields
        ):
            return True
    return False


def affinity_text(terms: Sequence[NodeSelectorTerm]) -> str:
    """The terms as people write them: "a In (x, y) and b Exists, or c NotIn (z)"."""
    words = []
    for term in terms:
        parts = [
            f"{r.key} {r.operator}" + (f" ({', '.join(r.values)})" if r.values else "")
            for r in (*term.expressions, *term.fields)
        ]
        words.append(" and ".join(parts) or "(empty term)")
    return ", or ".join(words)


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
    "node-affinity",  # the pod's required node affinity does not match
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
    "node-affinity": "not matching the required node affinity",
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
    # What in the pod set's own constraints cannot be read as written (a toleration or a node
    # affinity operator core/v1 does not define): said, never guessed around.
    problems: tuple[str, ...] = ()

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
    affinity: Sequence[NodeSelectorTerm] = (),
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
       the flavor's (`untolerated_taint`; pkg/cache/scheduler/scheduling_simulator_default.go
       `FindFeasibleNodes` step 1, with the tolerations `findTopologyAssignment` in
       tas_flavor_snapshot.go gathers: `info.Tolerations` plus the flavor's).
    5. The pod's nodeSelector must match the node's labels (step 2 there, and kube-scheduler).
    6. The pod's required node affinity must match (`node_affinity_matches`, step 3 there).

    Kueue applies 4 to 6 per node only when the Topology's lowest level is
    kubernetes.io/hostname (as HyperPod's is); kube-scheduler enforces them anyway, so they
    always apply here. `flavor` None means no flavor constraint (rules 1-2 are skipped).
    A toleration whose operator core/v1 does not define tolerates nothing; the answer's
    `problems` say so, and so does the detail of every node left out for a taint it names.
    """
    selector = sorted((node_selector or {}).items())
    flavor_labels = flavor.node_labels if flavor is not None else ()
    all_tolerations = (*tolerations, *(flavor.tolerations if flavor is not None else ()))
    flavor_block = (
        untolerated_taint(flavor.node_taints, all_tolerations) if flavor is not None else None
    )
    levels = tuple(topology_levels)
    terms = tuple(affinity)
    selected = ", ".join(f"{k}={v}" for k, v in flavor_labels)
    usable: set[str] = set()
    excluded: list[Exclusion] = []
    strange = unknown_operators(all_tolerations)
    problems = [
        f"toleration {_toleration_text(t)} has operator {t.operator!r}, which core/v1 does not"
        " define: it tolerates no taint"
        for t in strange
    ]
    if terms and _invalid_affinity(terms):
        problems.append(
            f"required node affinity {affinity_text(terms)} uses an operator core/v1 does not"
            " define: Kueue answers 'invalid affinity node selectors' and no node matches"
        )
    # only readiness and taints to check
    plain = not (levels or selector or flavor_block or terms)
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
            found = _exclusion(node, levels, flavor_block, all_tolerations, selector, terms)
            if found is None:
                usable.add(node.name)
            else:
                cause, detail = found
                if strange and cause in ("taint", "flavor-taint"):
                    detail += (
                        f" (a toleration with operator {strange[0].operator!r} tolerates nothing)"
                    )
                excluded.append(Exclusion(node.name, cause, detail))
    excluded.sort()  # by node name first
    name = flavor.name if flavor is not None else ""
    return Eligibility(name, frozenset(usable), tuple(excluded), tuple(problems))


def _invalid_affinity(terms: Sequence[NodeSelectorTerm]) -> bool:
    return any(
        r.operator not in _SELECTOR_OPERATORS for t in terms for r in (*t.expressions, *t.fields)
    )


def _toleration_text(toleration: Toleration) -> str:
    key = toleration.key or "(every key)"
    value = f"={toleration.value}" if toleration.value else ""
    effect = f":{toleration.effect}" if toleration.effect else ""
    return f"{key}{value}{effect}"


def _exclusion(
    node: Node,
    levels: Sequence[str],
    flavor_block: Taint | None,
    tolerations: Sequence[Toleration],
    selector: Sequence[tuple[str, str]],
    affinity: Sequence[NodeSelectorTerm] = (),
) -> tuple[ExclusionCause, str] | None:
    """Rules 1 (Topology labels) to 6 of `screen_nodes` for a node the flavor selects."""
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
    if affinity and not node_affinity_matches(affinity, node):
        return "node-affinity", affinity_text(affinity)
    return None


def eligible_nodes(
    flavor: ResourceFlavor | None,
    nodes: Iterable[Node] | Mapping[str, Node],
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Toleration] = (),
    topology_levels: Sequence[str] = (),
    affinity: Sequence[NodeSelectorTerm] = (),
) -> set[str]:
    """Names of the nodes a pod set may use on `flavor`: `screen_nodes` without the reasons
    (the same Kueue rules apply; see there)."""
    return set(
        screen_nodes(flavor, nodes, node_selector, tolerations, topology_levels, affinity).nodes
    )


# --- free capacity -------------------------------------------------------------------------


class FreeCapacity(Protocol):
    """Free GPUs and topology place per node. `exporter.topology.tree.TopologyTree` is one."""

    def node_free(self, node: str) -> int: ...

    def placement(self, node: str) -> Placement | None: ...


@runtime_checkable
class ResourceCapacity(FreeCapacity, Protocol):
    """A `FreeCapacity` that also knows every resource: per node, allocatable minus what the
    pods on it request, the pod count included (`NodeResourcesFree` is one)."""

    def free_resources(self, node: str) -> Mapping[str, int]: ...


class NodeResourcesFree:
    """Every resource free per node, as Kueue's TAS snapshot counts a leaf's free capacity:
    the node's allocatable minus the requests of the pods on it, and minus one per pod of its
    `pods` allocatable (pkg/cache/scheduler/tas_flavor_snapshot.go `addNonTASUsage`,
    `updateTASUsage`, and tas_non_tas_pod_cache.go). GPUs come from `gpus` (the topology
    tree, or a view of it at an earlier moment), so both answers agree on them.

    `used(node)` gives what the pods on the node request ("pods": how many); a node whose
    allocatable does not list `pods` (kubelet always reports it; a trimmed object may not)
    is not limited by a pod count rather than holding none.
    """

    __slots__ = ("_gpus", "_nodes", "_used")

    def __init__(
        self,
        gpus: FreeCapacity,
        nodes: Mapping[str, Node],
        used: Callable[[str], Mapping[str, int]],
    ) -> None:
        self._gpus = gpus
        self._nodes = nodes
        self._used = used

    def node_free(self, node: str) -> int:
        return self._gpus.node_free(node)

    def placement(self, node: str) -> Placement | None:
        return self._gpus.placement(node)

    def free_resources(self, node: str) -> Mapping[str, int]:
        spec = self._nodes.get(node)
        if spec is None:
            return {}
        used = self._used(node)
        free = {name: max(0, amount - used.get(name, 0)) for name, amount in spec.allocatable}
        free[GPU_RESOURCE] = max(0, self._gpus.node_free(node))
        return free


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
    __slots__ = (
        "free",
        "gpu_pods",
        "limits",
        "max_node_free",
        "nodes",
        "pods",
        "slice_pods",
        "slices",
    )

    def __init__(self) -> None:
        self.nodes = 0
        self.free = 0
        self.max_node_free = 0
        self.pods = 0
        self.gpu_pods = 0  # pods its GPUs alone would hold
        self.slices = 0
        self.slice_pods: dict[str, int] = {}
        self.limits: dict[str, int] = {}  # resource -> nodes it held below their GPUs' count


PodCounter = Callable[[str, int], tuple[int, str]]


def _pod_counter(
    capacity: FreeCapacity, gpus_per_pod: int, requests: Resources | None
) -> PodCounter | None:
    """How many pods of the shape a node holds, and the resource that binds when it is not
    the GPUs: None when only GPUs count (a capacity that knows nothing else, or a request of
    GPUs only on one that does not count pods).

    Rule: `CountInWithLimitingResource` (pkg/resources/requests.go) of the pod's requests
    plus one pod (`resources.OnePodRequest`, added in tas_flavor_snapshot.go
    `findTopologyAssignment`) against the leaf's remaining capacity (`fillLeafCounts`): the
    minimum over requested resources of floor(free / request), a resource the node does not
    list holding none; ties go to the resource name that sorts first.
    """
    if not isinstance(capacity, ResourceCapacity):
        return None
    asked = [(name, amount) for name, amount in (requests or ()) if amount > 0]
    if not asked and gpus_per_pod > 0:
        asked = [(GPU_RESOURCE, gpus_per_pod)]
    if not any(name == PODS_RESOURCE for name, _ in asked):
        asked.append((PODS_RESOURCE, 1))
    asked.sort()
    free_of = capacity.free_resources

    def count(node: str, free_gpus: int) -> tuple[int, str]:
        free = free_of(node)
        best = -1
        limiting = ""
        for name, amount in asked:
            if name == PODS_RESOURCE and name not in free:
                continue  # no pod limit reported: not limiting (see NodeResourcesFree)
            have = free_gpus if name == GPU_RESOURCE else free.get(name, 0)
            fits = max(0, have // amount)
            if best < 0 or fits < best:
                best, limiting = fits, name
        return max(0, best), limiting

    return count


def _tally(
    capacity: FreeCapacity,
    eligible: Collection[str],
    level: str,
    gpus_per_pod: int,
    slice_level: str | None,
    slice_size: int,
    requests: Resources | None = None,
) -> tuple[dict[str, _Tally], int, int]:
    """Per domain of `level`: pods and slices of the shape that fit, counted Kueue's way.

    Rule: a node holds as many pods as its remaining capacity allows (`_pod_counter`:
    `fillLeafCounts` -> `CountInWithLimitingResource`; floor(free GPUs / GPUs per pod) when
    GPUs are all that is known), a domain the sum of its children's pods, and a domain at or
    above the slice level the sum over its slice-level domains of floor(pods / slice size)
    (`fillInCountsHelper`), all in pkg/cache/scheduler/tas_flavor_snapshot.go.
    Returns (tallies, nodes known to `capacity`, known nodes without a label at `level`).
    """
    tallies: dict[str, _Tally] = {}
    known = unlabeled = 0
    sliced = slice_level is not None and slice_size > 1
    domain_of = _domain_getter(level)
    inner_of = _domain_getter(slice_level) if sliced and slice_level is not None else None
    placement_of, free_of = capacity.placement, capacity.node_free
    counter = _pod_counter(capacity, gpus_per_pod, requests)
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
        by_gpus = free // gpus_per_pod if gpus_per_pod > 0 else 0
        limiting = ""
        if counter is None:
            pods = by_gpus
        else:
            pods, limiting = counter(name, free)
            if gpus_per_pod <= 0:
                by_gpus = pods
        tally = tallies.get(domain)
        if tally is None:
            tally = tallies[domain] = _Tally()
        tally.nodes += 1
        tally.free += free
        if free > tally.max_node_free:
            tally.max_node_free = free
        tally.pods += pods
        tally.gpu_pods += by_gpus
        if counter is not None and pods < by_gpus:
            tally.limits[limiting] = tally.limits.get(limiting, 0) + 1
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
    # In that domain: pods its free GPUs alone would hold, and the resources (other than GPUs)
    # that held nodes below that, with how many nodes each (Kueue's limiting resource).
    domain_gpu_pods: int = 0
    limited_by: tuple[tuple[str, int], ...] = ()
    # With slices: pods of the shape each slice-level domain of that domain holds.
    slice_pods: tuple[tuple[str, int], ...] = ()

    def smallest_room(self) -> tuple[int, tuple[str, ...]]:
        """The fewest more pods that would make this domain hold every slice, and the
        slice-level domains where they would go (those closest to a whole slice), by
        `fillInCountsHelper`'s count: sum over slice-level domains of floor(pods / size).
        Without slices: the pods it lacks, and no domains."""
        short = max(0, self.pods_needed - self.pods_fit)
        if self.slice_level is None or self.slice_size <= 1 or not self.slice_pods:
            return short, ()
        missing = max(0, self.slices_needed - self.slices_fit)
        size = self.slice_size
        gaps = sorted((size - pods % size, name) for name, pods in self.slice_pods)
        if missing == 0 or len(gaps) < missing:
            return short, ()
        extra = sum(gap for gap, _ in gaps[:missing])
        if extra >= short:
            return short, ()
        cutoff = gaps[missing - 1][0]
        return extra, tuple(name for gap, name in gaps if gap <= cutoff)

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
        elif self.limited_by and self.domain_gpu_pods >= self.pods_needed:
            named = " and ".join(
                f"{resource} on {_plural(count, 'node')}" for resource, count in self.limited_by
            )
            detail = (
                f"{free}, room for {_plural(self.domain_gpu_pods, 'pod')} by GPUs, but {named}"
                f" (allocatable minus what its pods request) leave room for"
                f" {_plural(self.domain_pods, 'pod')}"
            )
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
    pods: int,
    gpus_per_pod: int,
    slice_level: str | None,
    slice_size: int | None,
    requests: Resources | None = None,
) -> str:
    """Why a shape cannot be judged, "" when it can.

    Rules: a slice needs both a level and a size ≥ 1, and the size may not exceed the pod
    count (pkg/controller/jobframework/tas_validation.go `validateSliceSizeAnnotation`,
    `ValidateSliceSizeAnnotationUpperBound`).
    """
    if pods < 1:
        return f"{pods} pods requested"
    if gpus_per_pod < 1 and not any(amount > 0 for _, amount in requests or ()):
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
    requests: Resources | None = None,
) -> Fit:
    """The most pods of this shape one domain of `level` holds, and whether that is all.

    `level` is a level name or a node label key; `eligible` the nodes the pod set may use
    (`eligible_nodes`). Rules (pkg/cache/scheduler/tas_flavor_snapshot.go):

    - a node holds floor(free GPUs / GPUs per pod) whole pods, or with `requests` (every
      resource a pod asks for) on a capacity that knows every resource, the fewest any
      requested resource and the pod count allow; a domain the sum over its nodes
      (`fillLeafCounts`, `fillInCountsHelper`);
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
    problem = _check_shape(pods, gpus_per_pod, slice_level, slice_size, requests)
    if problem:
        return _invalid(name, pods, gpus_per_pod, problem)
    inner = level_name(slice_level) if slice_level is not None else None
    size = slice_size if inner is not None and slice_size is not None else 1
    if inner is not None and _rank(inner) < _rank(name):
        return _invalid(
            name, pods, gpus_per_pod, f"slice level {inner} is above the pod set level {name}"
        )
    tallies, known, unlabeled = _tally(
        capacity, eligible, name, gpus_per_pod, inner, size, requests
    )
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
        domain_gpu_pods=tally.gpu_pods,
        limited_by=tuple(sorted(tally.limits.items(), key=lambda item: (-item[1], item[0]))),
        slice_pods=tuple(sorted(tally.slice_pods.items())) if inner is not None else (),
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
    requests: Resources | None = None

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
            requests=self.requests,
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
            self.capacity,
            self.eligible,
            level,
            self.gpus_per_pod,
            slice_level,
            self.size,
            self.requests,
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
    requests: Resources | None = None,
) -> PlacementAnswer:
    """Whether and where Kueue TAS could place `pods` pods of `gpus_per_pod` GPUs now
    (`requests`: every resource one pod asks for, counted against each node's remaining
    capacity when `capacity` knows every resource, `ResourceCapacity`; see `fit`).

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
        capacity,
        eligible,
        mode,
        pods,
        gpus_per_pod,
        request.slice_level,
        request.slice_size,
        requests,
    )
    problem = _check_shape(pods, gpus_per_pod, request.slice_level, request.slice_size, requests)
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
        # "none": the implied request of a TAS-only ClusterQueue (isTASImplied)
        label = f"{what} at {level}" if what else f"implied request (TAS-only queue) at {level}"
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
