"""GPUs per topology level over one flavor's nodes: what /metrics and the topology page show.

A job runs on one ResourceFlavor, whose nodeLabels select its nodes (one instance type on
HyperPod), so free GPUs and free blocks of different flavors are never added together: a p5
job cannot use a GB200 UltraServer's GPUs, and a largest free block summed over both is no
block at all. Pure: the flavor's `Eligibility`, the topology tree and the nodes in, figures out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from exporter.cluster.capacity.placement import Eligibility
from exporter.cluster.objects import Node
from exporter.topology.tree import Placement, TopologyTree

__all__ = ["OUTSIDE_FLAVOR", "UNAVAILABLE", "LevelCapacity", "flavor_levels"]

# Why a node a flavor's nodeLabels select is still left out of the flavor's capacity: nodes
# without the levels of the flavor's Topology are not in Kueue's TAS tree for it.
OUTSIDE_FLAVOR: Final = frozenset({"flavor", "topology-label"})
# Exclusions that leave a node's GPUs unavailable (deep health check, EC2 scheduled event)
# rather than unschedulable: `placement.ExclusionCause`.
UNAVAILABLE: Final = frozenset({"deep-health-check", "scheduled-event"})


@dataclass(frozen=True, slots=True)
class LevelCapacity:
    """GPUs of one topology level over one flavor's nodes.

    `domains` maps each domain id to [allocatable, used, unschedulable, free, unavailable];
    `largest_free` is the free GPUs of the domain with the most, `largest_domain` its id (ties:
    smallest id), as the topology tree answers for the whole cluster."""

    level: str
    domains: Mapping[str, tuple[int, int, int, int, int]]
    free: int
    largest_free: int
    largest_domain: str = ""

    @property
    def ratio(self) -> float:
        return 0.0 if self.free <= 0 else 1.0 - self.largest_free / self.free


def flavor_levels(
    eligibility: Eligibility,
    tree: TopologyTree,
    nodes: Mapping[str, Node],
    levels: Sequence[str],
) -> list[LevelCapacity]:
    """Per level, the GPUs of the nodes a flavor selects (`eligibility`, the flavor's).

    A node the flavor's nodeLabels select (and that carries its Topology's levels) counts in
    allocatable and used; its free GPUs count only when the flavor's pods may use it now
    (Ready, not cordoned or marked unhealthy, every blocking taint tolerated), and otherwise
    its allocatable GPUs count as unschedulable, or as unavailable when a deep health check or
    an EC2 scheduled event keeps it out (never both). Free and used per node come from the
    topology tree (`node_free`, `node_used`), so they agree with the flavor-less figures.
    """
    usable = eligibility.nodes
    unavailable_nodes = {e.node for e in eligibility.excluded if e.cause in UNAVAILABLE}
    members = [
        *usable,
        *(e.node for e in eligibility.excluded if e.cause not in OUTSIDE_FLAVOR),
    ]
    sums: list[dict[str, list[int]]] = [{} for _ in levels]
    getters = [_domain_of(level) for level in levels]
    for name in members:
        node = nodes.get(name)
        place = tree.placement(name)
        if node is None or place is None:
            continue
        allocatable = max(0, node.allocatable_gpus)
        used = tree.node_used(name)
        unavailable = 0
        if name in usable:
            free, unschedulable = tree.node_free(name), 0
        elif name in unavailable_nodes:
            free, unschedulable, unavailable = 0, 0, allocatable
        else:
            free, unschedulable = 0, allocatable
        for per_domain, domain_of in zip(sums, getters, strict=True):
            domain = domain_of(name, place)
            if not domain:
                continue
            total = per_domain.get(domain)
            if total is None:
                per_domain[domain] = [allocatable, used, unschedulable, free, unavailable]
            else:
                total[0] += allocatable
                total[1] += used
                total[2] += unschedulable
                total[3] += free
                total[4] += unavailable
    out = []
    for level, per_domain in zip(levels, sums, strict=True):
        free_total = largest = 0
        largest_domain = ""
        for domain in sorted(per_domain):
            values = per_domain[domain]
            free_total += values[3]
            if values[3] > largest:
                largest, largest_domain = values[3], domain
        domains = {d: (v[0], v[1], v[2], v[3], v[4]) for d, v in sorted(per_domain.items())}
        out.append(LevelCapacity(level, domains, free_total, largest, largest_domain))
    return out


def _domain_of(level: str) -> Callable[[str, Placement], str]:
    """A node's domain id at `level` as the topology tree keys it: the node's name at "node",
    the label value elsewhere ("" when it has none)."""
    if level == "node":
        return lambda name, place: name
    return lambda name, place: place.domain_at(level) or ""
