"""What a ClusterQueue can still admit, per flavor and resource, by Kueue's own quota rules.

Kueue keeps one `resourceNode` per ClusterQueue and per Cohort and answers every quota question
from three numbers per (flavor, resource): the node's `SubtreeQuota`, its `Usage`, and its
`localQuota` (what a lendingLimit keeps back from the parent). This module rebuilds those nodes
from the parsed ClusterQueues and Cohorts and the model's own usage, and answers with Kueue's
functions:

- `available` (`available()`): own unused quota plus what the cohort tree can still lend,
  every lendingLimit and borrowingLimit on the way respected, net of what others borrow;
- `potential` (`potentialAvailable()`): the most the queue could hold with nothing in use;
- `borrowed`: usage past nominalQuota, as Kueue writes status.flavorsReservation[].borrowed;
- `lent`: the part of the queue's own unused nominal quota others are using now.

The rules follow kubernetes-sigs/kueue@ff69552e79ad (`KUEUE`): pkg/cache/scheduler/
resource_node.go, resource.go, clusterqueue.go, cohort.go, cache.go, snapshot.go and
pkg/cache/hierarchy/cycle.go, with the worked examples of site/content/en/docs/concepts/
cluster_queue.md and cohort.md, keps/79-hierarchical-cohorts and keps/1224-lending-limit.
Each function's docstring names its rule and source.

Usage is the caller's accounting of the workloads holding a quota reservation, so an answer
does not depend on which informer event arrived first; ClusterQueue status.flavorsReservation
is an optional fallback (`status_fallback`). Amounts are Kueue's integers: millicores for cpu,
whole units for everything else (`exporter.cluster.parse.kueue.quota_amount`); usage must be
in the same units.

Bad input never raises. A ClusterQueue naming a missing ResourceFlavor, a cohort cycle, a
quota that is not a quantity or is negative: every answer that depends on it is "unknown:
<why>" (`Answer.amount` None), the other answers stay exact, and a `QuotaProblem` with a
`cause` a counter can use as a label is recorded in `QuotaTree.problems`.

Pure: objects in, answers out; nothing here reads the model or the API.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from exporter.cluster.objects import ClusterQueue, Cohort, ResourceQuota

__all__ = [
    "KUEUE",
    "Answer",
    "Available",
    "FlavorResource",
    "QuotaLine",
    "QuotaProblem",
    "QuotaTree",
    "kueue_quantity",
]

KUEUE: Final = "kubernetes-sigs/kueue@ff69552e79ad"

FlavorResource = tuple[str, str]  # (ResourceFlavor name, resource name)
NodeKind = Literal["ClusterQueue", "Cohort"]
UsageSource = Literal["workloads", "status", "none"]

# QuotaProblem causes, stable: they label a counter.
UNKNOWN_FLAVOR: Final = "unknown_flavor"
COHORT_CYCLE: Final = "cohort_cycle"
BAD_QUANTITY: Final = "bad_quantity"
NEGATIVE_QUANTITY: Final = "negative_quantity"
MALFORMED_QUOTA: Final = "malformed_quota"
BAD_USAGE: Final = "bad_usage"
DUPLICATE_QUOTA: Final = "duplicate_quota"
UNKNOWN_QUEUE: Final = "unknown_queue"


@dataclass(frozen=True, slots=True)
class Answer:
    """An amount with a short reason, or None with "unknown: <why>" and the problem's cause."""

    amount: int | None
    reason: str
    cause: str = ""

    @property
    def known(self) -> bool:
        return self.amount is not None

    def __str__(self) -> str:
        return self.reason


Available = Answer  # what `QuotaTree.available` returns


@dataclass(frozen=True, slots=True)
class QuotaProblem:
    """Input the quota model cannot use; `cause` is one of the module's cause constants."""

    cause: str
    kind: str  # "ClusterQueue" | "Cohort" | "usage"
    name: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name!r}: {self.detail}"


@dataclass(frozen=True, slots=True)
class QuotaLine:
    """Everything about one queue's (flavor, resource): its spec, usage and the answers."""

    queue: str
    flavor: str
    resource: str
    quota: ResourceQuota | None  # None when the queue has no quota for the pair
    usage: int
    usage_source: UsageSource
    borrowed: Answer
    lent: Answer
    available: Answer
    potential: Answer


@dataclass(slots=True, eq=False)
class _Node:
    """Kueue's resourceNode (resource_node.go) plus the problems that make its answers unknown."""

    kind: NodeKind
    name: str
    quotas: dict[FlavorResource, ResourceQuota] = field(default_factory=dict)
    parent: _Node | None = None
    children: list[_Node] = field(default_factory=list)
    subtree: dict[FlavorResource, int] = field(default_factory=dict)  # SubtreeQuota
    usage: dict[FlavorResource, int] = field(default_factory=dict)  # Usage
    usage_source: UsageSource = "none"
    # Problems in this node's own data, then in its whole subtree (filled bottom-up).
    bad: dict[FlavorResource, QuotaProblem] = field(default_factory=dict)
    bad_all: QuotaProblem | None = None
    subtree_bad: dict[FlavorResource, QuotaProblem] = field(default_factory=dict)
    subtree_bad_all: QuotaProblem | None = None
    # A ClusterQueue Kueue keeps inactive (missing flavor), or any node under a cohort cycle.
    inactive: QuotaProblem | None = None

    def local_quota(self, fr: FlavorResource) -> int:
        """localQuota(): SubtreeQuota - lendingLimit, at least 0; 0 with no lendingLimit.

        The part of a node's quota only its own subtree sees (resource_node.go localQuota).
        """
        quota = self.quotas.get(fr)
        if quota is None or quota.lending_limit is None:
            return 0
        return max(0, self.subtree.get(fr, 0) - quota.lending_limit)

    def local_available(self, fr: FlavorResource) -> int:
        """LocalAvailable(): localQuota - Usage, at least 0 (resource_node.go)."""
        return max(0, self.local_quota(fr) - self.usage.get(fr, 0))

    def root(self) -> _Node:
        """The root of the node's tree (the last node before a repeat, under a cycle)."""
        node = self
        seen = {id(node)}
        while node.parent is not None and id(node.parent) not in seen:
            node = node.parent
            seen.add(id(node))
        return node

    def path(self) -> list[_Node]:
        """The node and its ancestors, root first (as `root`, safe under a cycle)."""
        top = self.root()
        nodes = [self]
        while nodes[-1] is not top:
            parent = nodes[-1].parent
            assert parent is not None
            nodes.append(parent)
        nodes.reverse()
        return nodes


_DECIMAL_SUFFIXES: Final = ("m", "", "k", "M", "G", "T", "P", "E")  # 10^-3 .. 10^18
_BINARY_SUFFIXES: Final = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_BINARY_RESOURCES: Final = frozenset({"memory", "ephemeral-storage"})


def kueue_quantity(resource: str, amount: int) -> str:
    """An amount in Kueue's units written as Kueue writes it in its messages.

    pkg/resources/resource_formatter.go `ResourceQuantityString`: cpu is a milli-quantity in
    DecimalSI ("500m", "16", "2k"); memory, ephemeral-storage and hugepages-* are BinarySI,
    canonicalized ("500Gi", "1536Mi"; an amount below 1024 or not a multiple of 1024 falls
    back to DecimalSI, "1G"); everything else DecimalSI ("15", "2k"). resource.Quantity's
    String() picks the largest suffix that keeps the mantissa a whole number.
    """
    sign = "-" if amount < 0 else ""
    value = abs(amount)
    if resource.startswith("hugepages-") or resource in _BINARY_RESOURCES:
        if value >= 1024:
            index = 0
            while value % 1024 == 0 and index < len(_BINARY_SUFFIXES) - 1:
                value //= 1024
                index += 1
            if index > 0:
                return f"{sign}{value}{_BINARY_SUFFIXES[index]}"
        value = abs(amount)
    index = 1  # whole units
    if resource == "cpu":
        index = 0  # millicores
    if value == 0:
        return "0"
    while value % 1000 == 0 and index < len(_DECIMAL_SUFFIXES) - 1:
        value //= 1000
        index += 1
    return f"{sign}{value}{_DECIMAL_SUFFIXES[index]}"


def _fmt(resource: str, amount: int) -> str:
    """An amount in Kueue's units as Kueue prints it (`kueue_quantity`)."""
    return kueue_quantity(resource, amount)


def _unknown(problem: QuotaProblem) -> Answer:
    return Answer(None, f"unknown: {problem}", problem.cause)


class QuotaTree:
    """Kueue's cohort forest for one moment: ClusterQueues as leaves, Cohorts as inner nodes.

    Build with `QuotaTree.build`; then ask `available`, `potential`, `borrowed`, `lent` or
    `line` per (queue, flavor, resource). Immutable after build.
    """

    def __init__(
        self,
        queues: dict[str, _Node],
        cohorts: dict[str, _Node],
        problems: list[QuotaProblem],
    ) -> None:
        self._queues = queues
        self._cohorts = cohorts
        self.problems: tuple[QuotaProblem, ...] = tuple(problems)

    # --- building ---------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        cluster_queues: Iterable[ClusterQueue],
        cohorts: Iterable[Cohort] = (),
        usage_by_queue: Mapping[str, Mapping[FlavorResource, int]] | None = None,
        *,
        flavors: Collection[str] | None = None,
        status_fallback: bool = False,
    ) -> QuotaTree:
        """The cohort forest with Kueue's SubtreeQuota and Usage on every node.

        Structure (pkg/cache/hierarchy, cohort.go; Cohort CRD spec.parentName): a ClusterQueue
        joins the cohort its spec.cohortName (v1beta2) or spec.cohort (v1beta1) names; a
        Cohort hangs under spec.parentName. A cohort named but not defined by a Cohort object
        exists anyway "with no borrowing/lending limits" and no quota (CRD parentName doc;
        cluster_queue.md "Cohort"). A cohort whose parent chain reaches a cycle is left out of
        the computation and every ClusterQueue under it is unknown: Kueue "disable[s] all
        members of the Cohort, including ClusterQueues, until the cycle is removed"
        (hierarchy/cycle.go HasCycle; snapshot.go skipInactiveCQReason "HasCycle").

        Quotas (resource.go createResourceQuotas): one entry per (flavor, resource); a later
        duplicate replaces an earlier one, as Kueue's map does (the webhook forbids them).

        Usage: `usage_by_queue[queue][(flavor, resource)]`, the quota held by the queue's
        workloads with a reservation (clusterqueue.go updateWorkloadUsage adds every reserving
        workload, admitted or not). A queue absent from it has none, or, with
        `status_fallback`, what its status.flavorsReservation says (cache.go Usage, written by
        the ClusterQueue controller). `flavors`, when given, are the ResourceFlavors that
        exist: a ClusterQueue naming another is inactive in Kueue (clusterqueue.go
        updateQueueStatus, reason FlavorNotFound) and its answers are unknown; its quota still
        counts in its cohort, as the cache builds the tree from every ClusterQueue.
        """
        problems: list[QuotaProblem] = []
        queue_nodes: dict[str, _Node] = {}
        cohort_nodes: dict[str, _Node] = {}
        cohort_specs: dict[str, Cohort] = {}
        for cohort in cohorts:
            if cohort.name:
                cohort_specs[cohort.name] = cohort

        def cohort_node(name: str) -> _Node:
            node = cohort_nodes.get(name)
            if node is None:
                node = cohort_nodes[name] = _Node("Cohort", name)
            return node

        for name, spec in cohort_specs.items():
            node = cohort_node(name)
            _read_quotas(node, spec.quotas, spec.quota_problems, problems)
            if spec.parent:
                node.parent = cohort_node(spec.parent)

        usage = usage_by_queue or {}
        for cq in cluster_queues:
            if not cq.name:
                continue
            node = _Node("ClusterQueue", cq.name)
            queue_nodes[cq.name] = node
            _read_quotas(node, cq.quotas, cq.quota_problems, problems)
            if cq.cohort:
                node.parent = cohort_node(cq.cohort)
            if cq.name in usage:
                _read_usage(node, usage[cq.name], problems)
                node.usage_source = "workloads"
            elif status_fallback:
                for flavor, resource, total in cq.reservation:
                    fr = (flavor, resource)
                    node.usage[fr] = node.usage.get(fr, 0) + total
                node.usage_source = "status"
            if flavors is not None:
                missing = sorted({q.flavor for q in cq.quotas} - set(flavors))
                if missing:
                    node.inactive = QuotaProblem(
                        UNKNOWN_FLAVOR,
                        "ClusterQueue",
                        cq.name,
                        f"references missing ResourceFlavor(s) {', '.join(missing)}; Kueue"
                        " keeps it inactive (FlavorNotFound) until they exist",
                    )
                    problems.append(node.inactive)
        for name in usage:
            if name not in queue_nodes:
                problems.append(
                    QuotaProblem(UNKNOWN_QUEUE, "usage", name, "usage for no known ClusterQueue")
                )

        for node in [*cohort_nodes.values(), *queue_nodes.values()]:
            if node.parent is not None:
                node.parent.children.append(node)
        for node in cohort_nodes.values():  # the same answer and reason in any informer order
            node.children.sort(key=lambda child: (child.kind, child.name))
        _mark_cycles(cohort_nodes, problems)
        for node in queue_nodes.values():  # a queue under a cycle is as its cohort
            if node.parent is not None and node.parent.inactive is not None:
                node.inactive = node.inactive or node.parent.inactive
        for node in [*cohort_nodes.values(), *queue_nodes.values()]:
            if node.parent is None:  # a root; nothing under a cycle is reached from one
                _update_tree(node)
        return cls(queue_nodes, cohort_nodes, problems)

    # --- the answers ------------------------------------------------------------------------

    def queues(self) -> tuple[str, ...]:
        """Every ClusterQueue's name, sorted."""
        return tuple(sorted(self._queues))

    def quotas(self, queue: str) -> tuple[FlavorResource, ...]:
        """The (flavor, resource) pairs the queue has a quota for, in spec order."""
        node = self._queues.get(queue)
        return tuple(node.quotas) if node is not None else ()

    def cohort_path(self, queue: str) -> tuple[str, ...]:
        """The queue's cohort, its parent, ... up to the root; () without a cohort."""
        node = self._queues.get(queue)
        path: list[str] = []
        seen: set[str] = set()
        parent = node.parent if node is not None else None
        while parent is not None and parent.name not in seen:
            seen.add(parent.name)
            path.append(parent.name)
            parent = parent.parent
        return tuple(path)

    def _blocker(self, queue: str, fr: FlavorResource, tree: bool) -> Answer | _Node:
        """The queue's node, or why an answer about `fr` cannot be given.

        `tree`: the answer rests on the whole cohort tree (and on the queue being active),
        not only on the queue's own quota and usage.
        """
        node = self._queues.get(queue)
        if node is None:
            return _unknown(QuotaProblem(UNKNOWN_QUEUE, "ClusterQueue", queue, "not known"))
        if tree and node.inactive is not None:
            return _unknown(node.inactive)
        if node.bad_all is not None:
            return _unknown(node.bad_all)
        if fr in node.bad:
            return _unknown(node.bad[fr])
        if tree and fr in node.quotas:
            root = node.root()
            if root.subtree_bad_all is not None:
                return _unknown(root.subtree_bad_all)
            if fr in root.subtree_bad:
                return _unknown(root.subtree_bad[fr])
        return node

    def available(self, queue: str, flavor: str, resource: str) -> Answer:
        """What `queue` can still admit of `resource` in `flavor` before preempting anything.

        Kueue's available() (pkg/cache/scheduler/resource_node.go), which
        ClusterQueueSnapshot.Available clamps at 0: for a node without a parent,
        SubtreeQuota - Usage; otherwise LocalAvailable(node) (its quota kept back by its
        lendingLimit, unused) plus what its parent has available, which, when the node has a
        borrowingLimit, is capped at SubtreeQuota - localQuota - (Usage beyond localQuota) +
        borrowingLimit. Up the chain every cohort applies the same rule, so every
        lendingLimit (through localQuota and the parent's SubtreeQuota, accumulateFromChild)
        and every borrowingLimit on the way is respected, and whatever another queue already
        borrows is in the root's Usage. This is cluster_queue.md's "sum of unused
        nominalQuota ... in the cohort" and "unused nominalQuota + borrowingLimit", made
        hierarchical by keps/79-hierarchical-cohorts ("T(x,r) >= -borrowingLimit(x,r) at all
        elements of the hierarchy").

        A pair the queue has no quota for is 0: "A ClusterQueue can only borrow quota for
        flavors that the ClusterQueue defines" (cluster_queue.md), it "must define nominal
        quota for the desired Resource and Flavor - even if this value is 0" (cohort.md).
        """
        fr = (flavor, resource)
        found = self._blocker(queue, fr, tree=True)
        if isinstance(found, Answer):
            return found
        node = found
        if fr not in node.quotas:
            return Answer(
                0,
                f"0: ClusterQueue {queue!r} has no {resource} quota in flavor {flavor!r}"
                " (Kueue admits only into flavors its resourceGroups list)",
            )
        amount, caps = _available(node, fr)
        return Answer(max(0, amount), self._explain(node, fr, amount, caps))

    def potential(self, queue: str, flavor: str, resource: str) -> Answer:
        """The most `queue` could hold of the pair if nothing in its cohort tree were in use.

        Kueue's potentialAvailable() (resource_node.go): SubtreeQuota at the root; below it
        localQuota + the parent's potential, capped at SubtreeQuota + borrowingLimit when the
        node has one. A workload larger than this can never be admitted by the queue.
        """
        fr = (flavor, resource)
        found = self._blocker(queue, fr, tree=True)
        if isinstance(found, Answer):
            return found
        node = found
        if fr not in node.quotas:
            return Answer(0, f"0: no {resource} quota in flavor {flavor!r}")
        amount = _potential(node, fr)
        scope = "its cohort tree" if node.parent is not None else "its own quota"
        return Answer(amount, f"{_fmt(resource, amount)} at most, from {scope}")

    def borrowed(self, queue: str, flavor: str, resource: str) -> Answer:
        """How much of the pair `queue` uses beyond its nominalQuota.

        Kueue's status.flavorsReservation[].resources[].borrowed (cache.go getUsage): usage -
        nominalQuota when positive, and 0 for a queue without a cohort ("Enforce borrowed=0
        if the clusterQueue doesn't belong to a cohort"). Borrowing is from the cohort tree
        as a whole: "There is no concept of A is borrowing from B" (keps/1224-lending-limit).
        It rests on the queue's own quota and usage only, so an inactive queue has one too.
        """
        fr = (flavor, resource)
        found = self._blocker(queue, fr, tree=False)
        if isinstance(found, Answer):
            return found
        node = found
        quota = node.quotas.get(fr)
        nominal = quota.nominal if quota is not None else 0
        used = node.usage.get(fr, 0)
        if node.parent is None:
            return Answer(0, "0: no cohort to borrow from")
        amount = max(0, used - nominal)
        return Answer(
            amount,
            f"{_fmt(resource, amount)}: {_fmt(resource, used)} in use of a nominal"
            f" {_fmt(resource, nominal)}",
        )

    def lent(self, queue: str, flavor: str, resource: str) -> Answer:
        """How much of `queue`'s own unused nominal quota other queues are using now.

        Kueue does not record who borrows from whom (keps/1224-lending-limit: "we cannot
        precisely calculate this value"), so this is what follows from its balances: the
        queue's unused nominal quota (nominalQuota - usage, at least 0) minus what it could
        still admit (`available`), at least 0. It is the quota the queue cannot use without
        reclaiming it from borrowers (preemption.md, reclaimWithinCohort). A lendingLimit
        bounds it: the quota kept back (localQuota) is never lent.
        """
        fr = (flavor, resource)
        found = self._blocker(queue, fr, tree=True)
        if isinstance(found, Answer):
            return found
        node = found
        quota = node.quotas.get(fr)
        if quota is None or node.parent is None:
            return Answer(0, "0: nothing to lend" if quota is None else "0: no cohort")
        unused = max(0, quota.nominal - node.usage.get(fr, 0))
        amount = max(0, unused - max(0, _available(node, fr)[0]))
        return Answer(
            amount,
            f"{_fmt(resource, amount)} of its {_fmt(resource, unused)} unused nominal quota"
            " is in use by other queues",
        )

    def held(self, queue: str, flavor: str, resource: str) -> tuple[int, int]:
        """(nominalQuota, usage) of one pair of one queue, 0 where it has none."""
        node = self._queues.get(queue)
        if node is None:
            return 0, 0
        fr = (flavor, resource)
        quota = node.quotas.get(fr)
        return (quota.nominal if quota is not None else 0), node.usage.get(fr, 0)

    def line(self, queue: str, flavor: str, resource: str) -> QuotaLine:
        """Everything about one pair of one queue, for explain and the quota advisor."""
        node = self._queues.get(queue)
        fr = (flavor, resource)
        return QuotaLine(
            queue=queue,
            flavor=flavor,
            resource=resource,
            quota=node.quotas.get(fr) if node is not None else None,
            usage=node.usage.get(fr, 0) if node is not None else 0,
            usage_source=node.usage_source if node is not None else "none",
            borrowed=self.borrowed(queue, flavor, resource),
            lent=self.lent(queue, flavor, resource),
            available=self.available(queue, flavor, resource),
            potential=self.potential(queue, flavor, resource),
        )

    def problems_of(self, queue: str) -> tuple[QuotaProblem, ...]:
        """The recorded problems that make some answer about `queue` unknown."""
        node = self._queues.get(queue)
        if node is None:
            return ()
        found: list[QuotaProblem] = []
        root = node.root()
        for problem in (
            node.inactive,
            node.bad_all,
            root.subtree_bad_all,
            *node.bad.values(),
            *root.subtree_bad.values(),
        ):
            if problem is not None and problem not in found:
                found.append(problem)
        return tuple(found)

    def _explain(self, node: _Node, fr: FlavorResource, amount: int, caps: list[str]) -> str:
        flavor, resource = fr
        quota = node.quotas[fr]
        used = node.usage.get(fr, 0)
        total = max(0, amount)
        unused = max(0, quota.nominal - used)
        own = min(total, unused)
        parts = [
            f"{_fmt(resource, own)} of its own unused nominal quota"
            f" ({_fmt(resource, quota.nominal)} nominal, {_fmt(resource, used)} in use)"
        ]
        if node.parent is None:
            parts.append("no cohort to borrow from")
        else:
            root = node.root().name
            parts.append(f"{_fmt(resource, total - own)} more from cohort tree {root!r}")
            if used > quota.nominal:
                parts.append(f"it already borrows {_fmt(resource, used - quota.nominal)}")
            if unused > own:
                parts.append(f"others use {_fmt(resource, unused - own)} of its unused quota")
        parts.extend(caps)
        if amount < 0:
            parts.append(f"over-admitted by {_fmt(resource, -amount)}")
        return f"{_fmt(resource, total)} {resource} in {flavor}: " + "; ".join(parts)


# --- the arithmetic, as Kueue does it --------------------------------------------------------


def _available(node: _Node, fr: FlavorResource) -> tuple[int, list[str]]:
    """available() of resource_node.go, unclamped, with the borrowingLimits that bound it.

    Walks root to leaf instead of recursing leaf to root; the same sums.
    """
    path = node.path()
    root = path[0]
    amount = root.subtree.get(fr, 0) - root.usage.get(fr, 0)
    caps: list[str] = []
    for below in path[1:]:
        parent_available = amount
        quota = below.quotas.get(fr)
        if quota is not None and quota.borrowing_limit is not None:
            local = below.local_quota(fr)
            stored_in_parent = below.subtree.get(fr, 0) - local
            used_in_parent = max(0, below.usage.get(fr, 0) - local)
            with_max = stored_in_parent - used_in_parent + quota.borrowing_limit
            if with_max < parent_available:
                caps.append(
                    f"capped by the borrowingLimit {_fmt(fr[1], quota.borrowing_limit)}"
                    f" of {below.kind} {below.name!r}"
                )
                parent_available = with_max
        amount = below.local_available(fr) + parent_available
    return amount, caps


def _potential(node: _Node, fr: FlavorResource) -> int:
    """potentialAvailable() of resource_node.go, walked root to leaf."""
    path = node.path()
    amount = path[0].subtree.get(fr, 0)
    for below in path[1:]:
        amount = below.local_quota(fr) + amount
        quota = below.quotas.get(fr)
        if quota is not None and quota.borrowing_limit is not None:
            amount = min(below.subtree.get(fr, 0) + quota.borrowing_limit, amount)
    return amount


def _update_tree(root: _Node) -> None:
    """SubtreeQuota and Usage of every node under `root`, children first.

    updateCohortResourceNode and accumulateFromChild (resource_node.go): a ClusterQueue's
    SubtreeQuota is its nominalQuota; a Cohort's is its own nominalQuota plus, per child, the
    child's SubtreeQuota - localQuota (what the child lends up). A Cohort's Usage is, per child,
    the child's Usage beyond its localQuota. The problems of the subtree are gathered on the
    way, so the root knows which of its pairs no answer can rest on.
    """
    order: list[_Node] = []
    stack = [root]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(node.children)
    for node in reversed(order):  # children before parents
        node.subtree = {fr: q.nominal for fr, q in node.quotas.items()}
        if node.kind == "Cohort":
            node.usage = {}
        node.subtree_bad = dict(node.bad)
        node.subtree_bad_all = node.bad_all
        for child in node.children:
            for fr, quota in child.subtree.items():
                lent_up = quota - child.local_quota(fr)
                node.subtree[fr] = node.subtree.get(fr, 0) + lent_up
            for fr, used in child.usage.items():
                beyond = max(0, used - child.local_quota(fr))
                node.usage[fr] = node.usage.get(fr, 0) + beyond
            for fr, problem in child.subtree_bad.items():
                node.subtree_bad.setdefault(fr, problem)
            node.subtree_bad_all = node.subtree_bad_all or child.subtree_bad_all


def _mark_cycles(cohorts: Mapping[str, _Node], problems: list[QuotaProblem]) -> None:
    """Mark every cohort whose parent chain reaches a cycle, and record each cycle once.

    hierarchy/cycle.go HasCycle walks a cohort's parents and reports a cycle when a name comes
    back; it is true for the cycle's members and for every cohort below them.
    """
    recorded: dict[frozenset[str], QuotaProblem] = {}
    for start in sorted(cohorts.values(), key=lambda node: node.name):
        seen: list[_Node] = []
        node: _Node | None = start
        while node is not None and node not in seen:
            seen.append(node)
            node = node.parent
        if node is None:
            continue
        members = seen[seen.index(node) :]
        key = frozenset(m.name for m in members)
        problem = recorded.get(key)
        if problem is None:
            first = min(range(len(members)), key=lambda i: members[i].name)
            members = members[first:] + members[:first]
            ring = " -> ".join([*(m.name for m in members), members[0].name])
            problem = QuotaProblem(
                COHORT_CYCLE,
                "Cohort",
                members[0].name,
                f"cohort cycle {ring}; Kueue admits nothing in this tree until it is removed",
            )
            recorded[key] = problem
            problems.append(problem)
        start.inactive = problem


def _read_quotas(
    node: _Node,
    quotas: Iterable[ResourceQuota],
    structure: Iterable[str],
    problems: list[QuotaProblem],
) -> None:
    """The node's quota map, as createResourceQuotas (resource.go) builds it, and its problems.

    A quota that is not a quantity or is negative makes every answer about its pair in its
    tree unknown (Kueue's webhook refuses negatives, validateResourceQuantity; the CRD pattern
    refuses non-quantities, so such objects come only from a bypassed webhook or a damaged
    dump). An unreadable resourceGroups makes every answer in the tree unknown.
    """
    for note in structure:
        problem = QuotaProblem(MALFORMED_QUOTA, node.kind, node.name, note)
        node.bad_all = node.bad_all or problem
        problems.append(problem)
    for quota in quotas:
        fr = (quota.flavor, quota.resource)
        if fr in node.quotas:
            problems.append(
                QuotaProblem(
                    DUPLICATE_QUOTA,
                    node.kind,
                    node.name,
                    f"flavor {quota.flavor!r} lists {quota.resource} twice; the last one counts",
                )
            )
        node.quotas[fr] = quota
        if quota.cause:
            problem = QuotaProblem(quota.cause, node.kind, node.name, quota.problem)
            node.bad[fr] = problem
            problems.append(problem)
        else:
            node.bad.pop(fr, None)


def _read_usage(
    node: _Node, usage: Mapping[FlavorResource, int], problems: list[QuotaProblem]
) -> None:
    """The queue's usage per pair; a negative or non-integer amount makes the pair unknown."""
    for fr, amount in usage.items():
        if (
            not isinstance(fr, tuple)
            or len(fr) != 2
            or not all(isinstance(part, str) for part in fr)
        ):
            problem = QuotaProblem(BAD_USAGE, "ClusterQueue", node.name, f"usage key {fr!r:.60}")
            node.bad_all = node.bad_all or problem
            problems.append(problem)
            continue
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
            problem = QuotaProblem(
                BAD_USAGE, "ClusterQueue", node.name, f"usage of {fr[1]} in {fr[0]}: {amount!r:.40}"
            )
            node.bad[fr] = problem
            problems.append(problem)
            continue
        node.usage[fr] = amount
