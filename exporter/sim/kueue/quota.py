"""Kueue's quota arithmetic over ClusterQueues and a tree of Cohorts, per flavor and resource.

A line-by-line port of pkg/cache/scheduler/resource_node.go (kubernetes-sigs/kueue @ff69552):

- a ClusterQueue's SubtreeQuota is its nominal quota; a Cohort's is its own nominal plus, for
  each child, the child's SubtreeQuota less what the child keeps for itself (`localQuota`,
  SubtreeQuota - lendingLimit when a lending limit is set) (`accumulateFromChild`);
- usage counts against a node; what exceeds its localQuota is also stored in its parent
  (`addUsage` / `removeUsage` bubble it up);
- `available`: local capacity plus what the parent has left, capped by the borrowing limit and
  by what the node stores in its parent; `potential_available`: the same with no usage at all
  ("maximum capacity" in flavorassigner.go's messages);
- `fits_in_quota` (QuantitiesFitInQuota), `within_nominal` (IsWithinNominalInResources),
  `borrowing_with` (clusterqueue_snapshot.go / cohort_snapshot.go BorrowingWith) and
  `lowest_subtree_that_fits` (preemption/classical FindHeightOfLowestSubtreeThatFits).

Amounts are integers (resources.py); an unset limit is None.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from exporter.sim.kueue.resources import FlavorResource


@dataclass(frozen=True, slots=True)
class Quota:
    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    @property
    def lendable(self) -> int:
        if self.lending_limit is None:
            return self.nominal
        return min(self.lending_limit, self.nominal)


@dataclass(eq=False, slots=True)
class Node:
    """A ClusterQueue or a Cohort: its quotas, the subtree's quota and the usage against it."""

    name: str
    is_queue: bool
    quotas: dict[FlavorResource, Quota] = field(default_factory=dict)
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)
    subtree: dict[FlavorResource, int] = field(default_factory=dict)
    usage: dict[FlavorResource, int] = field(default_factory=dict)

    # --- resource_node.go -------------------------------------------------------------------

    def local_quota(self, fr: FlavorResource) -> int:
        quota = self.quotas.get(fr)
        if quota is not None and quota.lending_limit is not None:
            return max(0, self.subtree.get(fr, 0) - quota.lending_limit)
        return 0

    def local_available(self, fr: FlavorResource) -> int:
        return max(0, self.local_quota(fr) - self.usage.get(fr, 0))

    def raw_available(self, fr: FlavorResource) -> int:
        """resource_node.go `available` (may be negative when over-admitted)."""
        if self.parent is None:
            return self.subtree.get(fr, 0) - self.usage.get(fr, 0)
        parent_available = self.parent.raw_available(fr)
        quota = self.quotas.get(fr)
        if quota is not None and quota.borrowing_limit is not None:
            lq = self.local_quota(fr)
            stored_in_parent = self.subtree.get(fr, 0) - lq
            used_in_parent = max(0, self.usage.get(fr, 0) - lq)
            with_max = stored_in_parent - used_in_parent + quota.borrowing_limit
            parent_available = min(with_max, parent_available)
        return self.local_available(fr) + parent_available

    def available(self, fr: FlavorResource) -> int:
        """ClusterQueueSnapshot.Available: never below zero."""
        return max(0, self.raw_available(fr))

    def potential_available(self, fr: FlavorResource) -> int:
        if self.parent is None:
            return self.subtree.get(fr, 0)
        avail = self.local_quota(fr) + self.parent.potential_available(fr)
        quota = self.quotas.get(fr)
        if quota is not None and quota.borrowing_limit is not None:
            avail = min(self.subtree.get(fr, 0) + quota.borrowing_limit, avail)
        return avail

    def add_usage(self, fr: FlavorResource, value: int) -> None:
        local = self.local_available(fr)
        self.usage[fr] = self.usage.get(fr, 0) + value
        if self.parent is not None and value > local:
            self.parent.add_usage(fr, value - local)

    def remove_usage(self, fr: FlavorResource, value: int) -> None:
        stored_in_parent = self.usage.get(fr, 0) - self.local_quota(fr)
        self.usage[fr] = self.usage.get(fr, 0) - value
        if stored_in_parent <= 0 or self.parent is None:
            return
        self.parent.remove_usage(fr, min(value, stored_in_parent))

    # --- snapshots ----------------------------------------------------------------------------

    def nominal(self, fr: FlavorResource) -> int:
        quota = self.quotas.get(fr)
        return quota.nominal if quota is not None else 0

    def borrowing_with(self, fr: FlavorResource, value: int) -> bool:
        """A ClusterQueue compares with its nominal quota, a Cohort with its SubtreeQuota."""
        limit = self.nominal(fr) if self.is_queue else self.subtree.get(fr, 0)
        return limit < self.usage.get(fr, 0) + value

    def borrowing(self, fr: FlavorResource) -> bool:
        return self.borrowing_with(fr, 0)

    def within_nominal(self, frs: Iterable[FlavorResource]) -> bool:
        """IsWithinNominalInResources: usage within SubtreeQuota for every one of `frs`."""
        return all(self.subtree.get(fr, 0) >= self.usage.get(fr, 0) for fr in frs)

    def fits_in_quota(
        self, requests: Mapping[FlavorResource, int]
    ) -> tuple[bool, dict[FlavorResource, int]]:
        """QuantitiesFitInQuota: whether `requests` fit this node's SubtreeQuota, and what
        is left for the parent once the node's local quota is used."""
        fits = True
        remaining: dict[FlavorResource, int] = {}
        for fr, value in requests.items():
            if self.subtree.get(fr, 0) < self.usage.get(fr, 0) + value:
                fits = False
            remaining[fr] = max(0, value - self.local_available(fr))
        return fits, remaining

    def ancestors(self) -> Iterator[Node]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    def root(self) -> Node:
        node = self
        while node.parent is not None:
            node = node.parent
        return node

    def height(self) -> int:
        """getNodeHeight: the distance to the furthest leaf."""
        best = min(len(self.children), 1)
        for child in self.children:
            if not child.is_queue:
                best = max(best, child.height() + 1)
        return best

    def subtree_queues(self) -> Iterator[Node]:
        for child in self.children:
            if child.is_queue:
                yield child
        for child in self.children:
            if not child.is_queue:
                yield from child.subtree_queues()

    def path(self) -> str:
        """The path Kueue prints in preemption messages (preemption.go buildCQPath)."""
        parts = [self.name, *(a.name for a in self.ancestors())]
        return "/" + "/".join(reversed(parts))


def lowest_subtree_that_fits(queue: Node, fr: FlavorResource, value: int) -> tuple[int, bool]:
    """FindHeightOfLowestSubtreeThatFits: the borrowing level of a request (0: within the
    queue's nominal quota) and whether that subtree is smaller than the whole tree."""
    if not queue.borrowing_with(fr, value) or queue.parent is None:
        return 0, queue.parent is not None
    remaining = value - queue.local_available(fr)
    for node in queue.ancestors():
        if not node.borrowing_with(fr, remaining):
            return node.height(), node.parent is not None
        remaining -= node.local_available(fr)
    return queue.root().height(), False


class QuotaTree:
    """The forest of Cohorts and ClusterQueues with their quotas and usage."""

    def __init__(
        self,
        queues: Mapping[str, tuple[str, Mapping[FlavorResource, Quota]]],
        cohorts: Mapping[str, tuple[str, Mapping[FlavorResource, Quota]]],
    ) -> None:
        """`queues`: name -> (cohort, quotas); `cohorts`: name -> (parent, quotas). A cohort
        named by a queue or as a parent but not described has no quota and no parent."""
        self.queues: dict[str, Node] = {}
        self.cohorts: dict[str, Node] = {}
        for name, (_parent, quotas) in cohorts.items():
            self.cohorts[name] = Node(name, False, dict(quotas))
        for name, (parent, _quotas) in cohorts.items():
            if parent:
                self._attach(self.cohorts[name], self._cohort(parent))
        for name, (cohort, quotas) in queues.items():
            node = Node(name, True, dict(quotas))
            self.queues[name] = node
            if cohort:
                self._attach(node, self._cohort(cohort))
        self._check_cycles()
        for node in self.queues.values():
            if node.parent is None:
                _update(node)
        for node in self.cohorts.values():
            if node.parent is None:
                _update(node)

    def _cohort(self, name: str) -> Node:
        if name not in self.cohorts:
            self.cohorts[name] = Node(name, False)
        return self.cohorts[name]

    @staticmethod
    def _attach(child: Node, parent: Node) -> None:
        child.parent = parent
        parent.children.append(child)

    def _check_cycles(self) -> None:
        for node in self.cohorts.values():
            seen = {id(node)}
            for ancestor in node.ancestors():
                if id(ancestor) in seen:
                    raise ValueError(f"cohort {node.name} is in a cycle")
                seen.add(id(ancestor))

    def queue(self, name: str) -> Node:
        return self.queues[name]


def _update(node: Node) -> None:
    """updateCohortResourceNode / updateClusterQueueResourceNode, from the root down."""
    node.subtree = {fr: q.nominal for fr, q in node.quotas.items()}
    node.usage = {}
    for child in node.children:
        _update(child)
        for fr, child_quota in child.subtree.items():
            delta = child_quota - child.local_quota(fr)
            node.subtree[fr] = node.subtree.get(fr, 0) + delta
