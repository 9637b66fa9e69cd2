"""GPU capacity, use and free blocks per topology domain, kept up to date one event at a time.

The cluster model calls `set_node` and `add_used` on every Node and Pod event, so each update
walks only the node's own path (region -> zone -> network layers -> node, plus its UltraServer):
O(depth), never O(nodes). Queries read per-level dicts; the largest free domain of each level
is tracked as updates arrive and rescanned only when the tracked one shrinks or leaves.

Domains are keyed by label value (zone name, network-node id, node name). A node missing a
label does not count at that level; the domain below the gap gets parent "" (unknown) rather
than being glued to a guessed ancestor. Kubernetes and Kueue stay out of this module.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from exporter.topology.labels import (
    LABEL_KEY_OF_LEVEL,
    LEVELS,
    NETWORK_LEVELS,
    ULTRASERVER,
    Placement,
    hops,
    level_of_label_key,
)

__all__ = [
    "LABEL_KEY_OF_LEVEL",
    "LEVELS",
    "NETWORK_LEVELS",
    "ULTRASERVER",
    "DomainUsage",
    "LevelFragmentation",
    "Placement",
    "TopologyTree",
    "hops",
    "level_of_label_key",
    "render_tree",
]

log = logging.getLogger(__name__)

_K = TypeVar("_K")

_RANK: dict[str, int] = {level: rank for rank, level in enumerate((*LEVELS, ULTRASERVER))}
_NODE_LEVEL = "node"


@dataclass(frozen=True, slots=True)
class DomainUsage:
    """GPUs of one domain. `free` counts only what a new pod could get.

    `free` is the sum over the domain's schedulable nodes of max(0, allocatable - used): GPUs on
    cordoned or unhealthy nodes are not free, and an over-committed node does not eat into its
    neighbours' free GPUs, which is why it is kept rather than derived from the other totals.
    `unschedulable` is the allocatable GPUs on unschedulable nodes; `unavailable` the
    allocatable GPUs on nodes out for a deep health check or an EC2 scheduled event (never free,
    and not counted again as unschedulable: the two are disjoint). `parent` is the domain id
    one level up, "" when the node labels skip that level, None at the top and for UltraServers.
    """

    level: str
    domain: str
    parent: str | None
    nodes: int
    allocatable: int
    used: int
    unschedulable: int
    free: int
    unavailable: int = 0


@dataclass(frozen=True, slots=True)
class LevelFragmentation:
    """How scattered the free GPUs of one level are: `ratio` 0 means one domain holds them all."""

    level: str
    domains: int
    free: int
    largest_free: int
    largest_domain: str  # "" when nothing is free

    @property
    def ratio(self) -> float:
        return 0.0 if self.free <= 0 else 1.0 - self.largest_free / self.free


class _Level:
    __slots__ = ("best", "best_known", "domains", "free", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.domains: dict[str, _Domain] = {}
        self.free = 0
        # The domain with the most free GPUs (ties: smallest id), valid while best_known.
        self.best: _Domain | None = None
        self.best_known = True


class _Domain:
    __slots__ = (
        "allocatable",
        "children",
        "free",
        "id",
        "level",
        "members",
        "parents",
        "unavailable",
        "unschedulable",
        "used",
    )

    def __init__(self, level: _Level, domain_id: str) -> None:
        self.level = level
        self.id = domain_id
        self.members: dict[str, None] = {}  # node names, a set with cheap ordered iteration
        self.allocatable = 0
        self.used = 0
        self.unschedulable = 0
        self.unavailable = 0
        self.free = 0
        # Nodes reaching this domain through each parent id; more than one only when labels
        # disagree about where a network node sits.
        self.parents: dict[str, int] = {}
        self.children: dict[_Domain, int] = {}  # child domain -> nodes it shares with us


class _Node:
    __slots__ = ("allocatable", "available", "free", "links", "path", "placement", "schedulable")

    def __init__(
        self,
        placement: Placement,
        allocatable: int,
        schedulable: bool,
        available: bool,
        path: tuple[_Domain, ...],
        links: tuple[tuple[_Domain, str, _Domain | None], ...],
    ) -> None:
        self.placement = placement
        self.allocatable = allocatable
        self.schedulable = schedulable
        self.available = available
        self.free = 0
        self.path = path  # every domain this node counts in, its own "node" domain included
        self.links = links  # (domain, parent id, parent domain or None when the parent is "")


def _free_of(allocatable: int, used: int, schedulable: bool, available: bool = True) -> int:
    if not schedulable or not available or used >= allocatable:
        return 0
    return allocatable - used


def _split(allocatable: int, schedulable: bool, available: bool) -> tuple[int, int]:
    """(unschedulable, unavailable) GPUs of one node: an unavailable node counts only there."""
    if not available:
        return 0, allocatable
    return (0 if schedulable else allocatable), 0


def _whole_gpus(value: object, node: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        log.warning("node %s: allocatable GPUs %r is not an integer; counting 0", node, value)
        return 0
    if value < 0:
        log.warning("node %s: negative allocatable GPUs %d; counting 0", node, value)
        return 0
    return value


class TopologyTree:
    """Mutable, incrementally maintained: every update costs O(depth), never O(nodes).

    GPU use is remembered per node name whether or not the node is known, because an informer
    may deliver a Pod before its Node, or delete a Node before its Pods.
    """

    def __init__(self) -> None:
        self._levels: dict[str, _Level] = {name: _Level(name) for name in _RANK}
        self._nodes: dict[str, _Node] = {}
        self._used: dict[str, int] = {}
        self._version = 0

    @property
    def version(self) -> int:
        """Bumps on every change, so callers can cache derived views."""
        return self._version

    def __len__(self) -> int:
        return len(self._nodes)

    # -- updates ---------------------------------------------------------------------------

    def set_node(
        self,
        name: str,
        labels: Mapping[str, str],
        allocatable_gpus: int,
        schedulable: bool,
        available: bool = True,
    ) -> None:
        """Add or update a node; a node whose labels changed moves with its capacity and use.

        `available` False: the node is in a deep health check or has EC2 maintenance ahead;
        its GPUs count as unavailable, never free."""
        if not isinstance(name, str) or not name:
            log.warning("ignoring a node with no usable name: %r", name)
            return
        placement = Placement.from_labels(labels)
        allocatable = _whole_gpus(allocatable_gpus, name)
        schedulable = bool(schedulable)
        available = bool(available)
        node = self._nodes.get(name)
        if node is not None:
            if node.placement == placement:
                self._restate(name, node, allocatable, schedulable, available)
                return
            self._detach(name, node)
        self._nodes[name] = self._attach(name, placement, allocatable, schedulable, available)
        self._version += 1

    def set_state(
        self, name: str, allocatable_gpus: int, schedulable: bool, available: bool = True
    ) -> bool:
        """`set_node` for a node whose place is unchanged (no label `Placement.from_labels`
        reads moved): its capacity and schedulability only, without re-reading its labels.
        False, and nothing done, when the node is not known."""
        node = self._nodes.get(name)
        if node is None:
            return False
        self._restate(
            name, node, _whole_gpus(allocatable_gpus, name), bool(schedulable), bool(available)
        )
        return True

    def _restate(
        self, name: str, node: _Node, allocatable: int, schedulable: bool, available: bool
    ) -> None:
        """A node stays where it is: reweigh it where its capacity or schedulability moved."""
        if (
            node.allocatable != allocatable
            or node.schedulable != schedulable
            or node.available != available
        ):
            self._reweigh(name, node, allocatable, schedulable, available)
            self._version += 1

    def remove_node(self, name: str) -> None:
        """Forget a node; GPU use recorded against its name stays for its pods to release."""
        node = self._nodes.pop(name, None)
        if node is not None:
            self._detach(name, node)
            self._version += 1

    def add_used(self, node: str, delta_gpus: int) -> None:
        """Pods binding (+) or releasing (-) GPUs on `node`; use never goes below zero.

        This runs twice for every Pod event, so `_free_changed` is written out in the loop."""
        if type(delta_gpus) is not int and (
            isinstance(delta_gpus, bool) or not isinstance(delta_gpus, int)
        ):
            log.warning("node %s: GPU use change %r is not an integer; ignored", node, delta_gpus)
            return
        used = self._used
        old = used.get(node, 0)
        new = old + delta_gpus
        if new < 0:
            new = 0
        if new == old:
            return
        if new:
            used[node] = new
        else:
            del used[node]
        self._version += 1
        record = self._nodes.get(node)
        if record is None:
            return
        delta_used = new - old
        free = _free_of(record.allocatable, new, record.schedulable, record.available)
        delta_free = free - record.free
        if not delta_free:
            for domain in record.path:
                domain.used += delta_used
            return
        record.free = free
        for domain in record.path:
            domain.used += delta_used
            domain.free += delta_free
            level = domain.level  # _free_changed, written out
            level.free += delta_free
            if not level.best_known:
                continue
            best = level.best
            if domain is best:
                if delta_free < 0:
                    level.best, level.best_known = None, False
            elif (
                best is None
                or domain.free > best.free
                or (domain.free == best.free and domain.id < best.id)
            ):
                level.best = domain

    # -- queries ---------------------------------------------------------------------------

    def placement(self, node: str) -> Placement | None:
        record = self._nodes.get(node)
        return None if record is None else record.placement

    def node_free(self, node: str) -> int:
        record = self._nodes.get(node)
        return 0 if record is None else record.free

    def node_used(self, node: str) -> int:
        """GPUs in use on `node`, counted even while the node itself is unknown."""
        return self._used.get(node, 0)

    def usage(self, level: str, domain: str) -> DomainUsage | None:
        found = self._domain(level, domain)
        return None if found is None else _view(found)

    def domains(self, level: str) -> list[DomainUsage]:
        """Every domain at `level`, sorted by domain id."""
        found = self._levels.get(level)
        if found is None:
            return []
        return [_view(found.domains[key]) for key in sorted(found.domains)]

    def children(self, level: str, domain: str) -> list[DomainUsage]:
        """The domains directly below, sorted by level then id.

        A zone's children are its layer-1 network nodes and any nodes with no network labels;
        a network node's are the next layer down, or the instances for the deepest layer.
        """
        found = self._domain(level, domain)
        if found is None:
            return []
        below = sorted(found.children, key=lambda child: (_RANK[child.level.name], child.id))
        return [_view(child) for child in below]

    def nodes_in(self, level: str, domain: str) -> list[str]:
        """Names of the nodes counted in a domain, sorted."""
        found = self._domain(level, domain)
        return [] if found is None else sorted(found.members)

    def fragmentation(self, level: str) -> LevelFragmentation:
        found = self._levels.get(level)
        if found is None or not found.domains:
            return LevelFragmentation(level, 0, 0, 0, "")
        best = self._best(found)
        if best is None or best.free <= 0:
            return LevelFragmentation(level, len(found.domains), found.free, 0, "")
        return LevelFragmentation(level, len(found.domains), found.free, best.free, best.id)

    def largest_free(self, level: str) -> DomainUsage | None:
        """The domain with the most free GPUs (ties: smallest id); None when nothing is free."""
        found = self._levels.get(level)
        if found is None:
            return None
        best = self._best(found)
        return None if best is None or best.free <= 0 else _view(best)

    def ultraservers(self) -> list[DomainUsage]:
        return self.domains(ULTRASERVER)

    def levels_present(self) -> list[str]:
        """LEVELS some node has, in order, then "ultraserver" when any node belongs to one."""
        return [name for name, level in self._levels.items() if level.domains]

    # -- internals -------------------------------------------------------------------------

    def _domain(self, level: str, domain: str) -> _Domain | None:
        found = self._levels.get(level)
        return None if found is None else found.domains.get(domain)

    def _attach(
        self, name: str, placement: Placement, allocatable: int, schedulable: bool, available: bool
    ) -> _Node:
        path: list[_Domain] = []
        links: list[tuple[_Domain, str, _Domain | None]] = []
        parent_id: str | None = None  # None above the top level: regions have no parent
        parent: _Domain | None = None
        chain = (
            ("region", placement.region),
            ("zone", placement.zone),
            *zip(NETWORK_LEVELS, placement.layers, strict=False),
            (_NODE_LEVEL, name),
        )
        for level_name, value in chain:
            if not value:
                parent_id, parent = "", None
                continue
            domain = self._domain_or_new(level_name, value)
            path.append(domain)
            if parent_id is not None:
                links.append((domain, parent_id, parent))
            parent_id, parent = value, domain
        if placement.ultraserver:
            path.append(self._domain_or_new(ULTRASERVER, placement.ultraserver))

        used = self._used.get(name, 0)
        node = _Node(placement, allocatable, schedulable, available, tuple(path), tuple(links))
        node.free = _free_of(allocatable, used, schedulable, available)
        unschedulable, unavailable = _split(allocatable, schedulable, available)
        for domain in node.path:
            domain.members[name] = None
            domain.allocatable += allocatable
            domain.used += used
            domain.unschedulable += unschedulable
            domain.unavailable += unavailable
            domain.free += node.free
            self._free_changed(domain, node.free)  # also offers a new domain as the best
        for domain, pid, parent in node.links:
            domain.parents[pid] = domain.parents.get(pid, 0) + 1
            if parent is not None:
                parent.children[domain] = parent.children.get(domain, 0) + 1
        return node

    def _detach(self, name: str, node: _Node) -> None:
        used = self._used.get(name, 0)
        unschedulable, unavailable = _split(node.allocatable, node.schedulable, node.available)
        for domain, pid, parent in node.links:
            _decrement(domain.parents, pid)
            if parent is not None:
                _decrement(parent.children, domain)
        for domain in node.path:
            del domain.members[name]
            domain.allocatable -= node.allocatable
            domain.used -= used
            domain.unschedulable -= unschedulable
            domain.unavailable -= unavailable
            domain.free -= node.free
            if node.free:
                self._free_changed(domain, -node.free)
            if not domain.members:
                level = domain.level
                del level.domains[domain.id]
                if level.best is domain:
                    level.best, level.best_known = None, False

    def _reweigh(
        self, name: str, node: _Node, allocatable: int, schedulable: bool, available: bool
    ) -> None:
        """Capacity or schedulability changed in place: shift the difference along the path."""
        free = _free_of(allocatable, self._used.get(name, 0), schedulable, available)
        delta_allocatable = allocatable - node.allocatable
        new_split = _split(allocatable, schedulable, available)
        old_split = _split(node.allocatable, node.schedulable, node.available)
        delta_unschedulable = new_split[0] - old_split[0]
        delta_unavailable = new_split[1] - old_split[1]
        delta_free = free - node.free
        node.allocatable, node.schedulable, node.free = allocatable, schedulable, free
        node.available = available
        for domain in node.path:
            domain.allocatable += delta_allocatable
            domain.unschedulable += delta_unschedulable
            domain.unavailable += delta_unavailable
            if delta_free:
                domain.free += delta_free
                self._free_changed(domain, delta_free)

    def _domain_or_new(self, level_name: str, domain_id: str) -> _Domain:
        level = self._levels[level_name]
        domain = level.domains.get(domain_id)
        if domain is None:
            domain = level.domains[domain_id] = _Domain(level, domain_id)
        return domain

    @staticmethod
    def _free_changed(domain: _Domain, delta: int) -> None:
        """Keep the level's free total and its tracked best domain right after `delta`."""
        level = domain.level
        level.free += delta
        if not level.best_known:
            return
        best = level.best
        if domain is best:
            if delta < 0:
                level.best, level.best_known = None, False  # someone else may lead now
        elif (
            best is None
            or domain.free > best.free
            or (domain.free == best.free and domain.id < best.id)
        ):
            level.best = domain

    @staticmethod
    def _best(level: _Level) -> _Domain | None:
        if not level.best_known:
            best: _Domain | None = None
            for domain in level.domains.values():
                if (
                    best is None
                    or domain.free > best.free
                    or (domain.free == best.free and domain.id < best.id)
                ):
                    best = domain
            level.best, level.best_known = best, True
        return level.best


def _decrement(counts: dict[_K, int], key: _K) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


def _parent_id(domain: _Domain) -> str | None:
    parents = domain.parents
    if not parents:
        return None
    if len(parents) == 1:
        return next(iter(parents))
    # Labels disagree: report the parent most of the domain's nodes name.
    return min(parents.items(), key=lambda item: (-item[1], item[0]))[0]


def _view(domain: _Domain) -> DomainUsage:
    return DomainUsage(
        level=domain.level.name,
        domain=domain.id,
        parent=_parent_id(domain),
        nodes=len(domain.members),
        allocatable=domain.allocatable,
        used=domain.used,
        unschedulable=domain.unschedulable,
        free=domain.free,
        unavailable=domain.unavailable,
    )


def render_tree(tree: TopologyTree, level_limit: str | None = None) -> list[dict[str, Any]]:
    """A JSON-friendly nested view of the tree, for /api/v1/topology.

    Each entry is {level, domain, nodes, allocatable, used, unschedulable, unavailable, free,
    children}.
    Roots are the regions plus any domain whose parent label is missing, so every domain is
    shown. `level_limit` is the deepest level to show (e.g. "network-node-layer-3" to leave out
    the instances; their GPUs still count above). UltraServers are a flat grouping, not part of
    the tree: read them from `TopologyTree.ultraservers()`. Raises ValueError for an unknown
    level_limit.
    """
    if level_limit is None:
        deepest = len(LEVELS) - 1
    elif level_limit in LEVELS:
        deepest = LEVELS.index(level_limit)
    else:
        raise ValueError(f"unknown level {level_limit!r}; expected one of {', '.join(LEVELS)}")

    def render(domain: DomainUsage) -> dict[str, Any]:
        children = [
            render(child)
            for child in tree.children(domain.level, domain.domain)
            if _RANK[child.level] <= deepest
        ]
        return {
            "level": domain.level,
            "domain": domain.domain,
            "nodes": domain.nodes,
            "allocatable": domain.allocatable,
            "used": domain.used,
            "unschedulable": domain.unschedulable,
            "unavailable": domain.unavailable,
            "free": domain.free,
            "children": children,
        }

    return [
        render(domain)
        for level in LEVELS[: deepest + 1]
        for domain in tree.domains(level)
        if not domain.parent
    ]
