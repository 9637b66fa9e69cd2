"""How spread a set of nodes is across the network: the domains it spans per level, the hop
distance between its farthest pair, and whether a topology request was met.

Shared by every scheduler topowatch judges (Kueue's workloads in exporter.cluster, Slurm's jobs
in exporter.slurm), so it sits with the topology tree rather than in either of them. What was
asked arrives as anything with a `level` (a node label key) and a `mode`: Kueue's pod-set
request, or None for a Slurm job, which asks for nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from exporter.topology.tree import NETWORK_LEVELS, Placement, hops, level_of_label_key


class TopologyAsk(Protocol):
    """What a workload asked of the topology: a label key (or None) and Kueue's mode."""

    @property
    def level(self) -> str | None: ...

    @property
    def mode(self) -> str: ...


ZONE_LEVELS = ("region", "zone")
LOCALITY_LEVELS = (*ZONE_LEVELS, *NETWORK_LEVELS, "ultraserver", "node")


@dataclass(frozen=True, slots=True)
class Locality:
    """How spread a workload's pods are across the network."""

    pods: int  # pods that hold GPUs on some node
    nodes: tuple[str, ...]
    domains: Mapping[str, int]  # level -> distinct domains the pods span (levels with data)
    worst_pair_hops: int | None  # None when some node lacks network labels
    ultraserver: str  # the one UltraServer holding every pod, "" otherwise
    topology_level: str | None  # the level name the workload asked for
    topology_mode: str
    topology_met: bool | None  # None when nothing was asked or nothing is placed


def locality(
    placements: Mapping[str, Placement], request: TopologyAsk | None, pods: int
) -> Locality:
    """`placements` maps each node holding one of the workload's pods to its place."""
    nodes = tuple(sorted(placements))
    domains: dict[str, int] = {"node": len(nodes)} if nodes else {}
    for level in (*ZONE_LEVELS, *NETWORK_LEVELS, "ultraserver"):
        values = {p.domain_at(level) for p in placements.values()}
        values.discard(None)
        values.discard("")
        if values:
            domains[level] = len(values)
    ultraserver = ""
    if nodes and domains.get("ultraserver") == 1:
        ultras = {p.ultraserver for p in placements.values()}
        ultraserver = ultras.pop() if len(ultras) == 1 else ""
    asked = level_of_label_key(request.level) if request and request.level else None
    mode = request.mode if request else "none"
    return Locality(
        pods=pods,
        nodes=nodes,
        domains=domains,
        worst_pair_hops=worst_pair_hops(list(placements.values())),
        ultraserver=ultraserver,
        topology_level=asked,
        topology_mode=mode,
        topology_met=_topology_met(placements, request, asked),
    )


def worst_pair_hops(places: Sequence[Placement]) -> int | None:
    """The largest hop distance between any two of the nodes, in O(nodes * levels).

    The farthest pair is any pair that diverges at the highest level where the set has more
    than one domain, so one representative pair answers for all of them.
    """
    if len(places) < 2:
        return 0 if places else None
    for level in (*ZONE_LEVELS, *NETWORK_LEVELS):
        first = places[0].domain_at(level)
        for other in places[1:]:
            if other.domain_at(level) != first:
                return hops(places[0], other)
    return hops(places[0], places[1])


def _topology_met(
    placements: Mapping[str, Placement], request: TopologyAsk | None, level: str | None
) -> bool | None:
    if request is None or request.mode in ("none", "unconstrained") or level is None:
        return None
    if not placements:
        return None
    if level == "node":
        return len(placements) == 1
    values = {p.domain_at(level) for p in placements.values()}
    return len(values) == 1 and None not in values and "" not in values
