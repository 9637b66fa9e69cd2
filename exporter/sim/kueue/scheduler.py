"""A small, pure imitation of Kueue's admission decisions for the simulated cluster.

It answers one question per pending workload: admit it here, preempt these workloads for it,
or keep it waiting with this message. The rules follow Kueue's classical (non fair-sharing)
scheduler closely enough that the objects the simulation writes read like a real cluster's:

- quota: nominal quota per ClusterQueue and flavor, a flat cohort in which each queue lends
  up to its lendingLimit and borrows up to its borrowingLimit;
- Topology-Aware Scheduling: a pod set is placed in one domain at its required level (the
  fullest domain that still fits, Kueue's best fit), or, when only preferred, at the lowest
  level that fits and otherwise spread; capacity is counted in whole pods per node;
- preemption: candidates from other (borrowing) queues first, then lower priority, then the
  most recently admitted; victims are removed one by one until the workload fits (quota and
  topology), then those not needed are put back, as Kueue's classical preemption does.

Everything here is plain data in, plain data out: no clocks, no randomness, no API objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from exporter.topology.labels import HOSTNAME_KEY

GPU = "nvidia.com/gpu"
HOSTNAME = HOSTNAME_KEY

Mode = Literal["required", "preferred", "unconstrained"]
PreemptionReason = Literal["InClusterQueue", "InCohortReclamation", "InCohortReclaimWhileBorrowing"]


@dataclass(frozen=True, slots=True)
class FlavorSpec:
    """A ResourceFlavor and the Topology it is scheduled with."""

    name: str
    topology: str
    levels: tuple[str, ...]  # node label keys, highest first; the last is the hostname


@dataclass(frozen=True, slots=True)
class NodeSlot:
    name: str
    flavor: str
    gpus: int
    domain: tuple[str, ...]  # the node's value for each level of its flavor's topology


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


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """One ClusterQueue: its quota per flavor and its preemption policy."""

    name: str
    cohort: str
    quotas: Mapping[str, Quota]
    preempt_within_queue: bool = True  # withinClusterQueue: LowerPriority
    reclaim_within_cohort: bool = True  # reclaimWithinCohort: Any
    borrow_within_cohort_max_priority: int | None = None  # borrowWithinCohort threshold


@dataclass(frozen=True, slots=True)
class Demand:
    """What a pending workload asks for (one pod set)."""

    key: str
    queue: str
    flavor: str
    pods: int
    gpus_per_pod: int
    priority: int
    mode: Mode = "unconstrained"
    level: str | None = None

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod


@dataclass(frozen=True, slots=True)
class Holding:
    """An admitted workload's claim on quota and on GPUs of particular nodes."""

    key: str
    queue: str
    flavor: str
    priority: int
    reserved_at: float
    gpus_per_pod: int
    placement: tuple[tuple[str, int], ...]  # (node, pods)

    @property
    def gpus(self) -> int:
        return self.gpus_per_pod * sum(pods for _, pods in self.placement)


@dataclass(frozen=True, slots=True)
class Admit:
    placement: tuple[tuple[str, int], ...]
    borrowing: bool


@dataclass(frozen=True, slots=True)
class Preempt:
    victims: tuple[tuple[Holding, PreemptionReason], ...]
    message: str  # why the workload could not be admitted without preempting
    topology_driven: bool  # quota had room; only the topology forced the preemption


@dataclass(frozen=True, slots=True)
class Wait:
    message: str


Decision = Admit | Preempt | Wait


@dataclass(slots=True)
class ClusterState:
    """Nodes, their free GPUs and the quota in use: the scheduler's snapshot of the cluster."""

    flavors: Mapping[str, FlavorSpec]
    nodes: Mapping[str, NodeSlot]
    queues: Mapping[str, QueuePolicy]
    unschedulable: set[str] = field(default_factory=set)
    free: dict[str, int] = field(default_factory=dict)
    usage: dict[tuple[str, str], int] = field(default_factory=dict)  # (queue, flavor) -> GPUs
    holdings: dict[str, Holding] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, node in self.nodes.items():
            self.free.setdefault(name, node.gpus)

    def copy(self) -> ClusterState:
        return ClusterState(
            flavors=self.flavors,
            nodes=self.nodes,
            queues=self.queues,
            unschedulable=set(self.unschedulable),
            free=dict(self.free),
            usage=dict(self.usage),
            holdings=dict(self.holdings),
        )

    def add(self, holding: Holding) -> None:
        for node, pods in holding.placement:
            self.free[node] -= pods * holding.gpus_per_pod
        slot = (holding.queue, holding.flavor)
        self.usage[slot] = self.usage.get(slot, 0) + holding.gpus
        self.holdings[holding.key] = holding

    def remove(self, holding: Holding) -> None:
        for node, pods in holding.placement:
            self.free[node] += pods * holding.gpus_per_pod
        slot = (holding.queue, holding.flavor)
        self.usage[slot] = self.usage.get(slot, 0) - holding.gpus
        del self.holdings[holding.key]

    def used(self, queue: str, flavor: str) -> int:
        return self.usage.get((queue, flavor), 0)

    def borrowed(self, queue: str, flavor: str) -> int:
        quota = self.queues[queue].quotas.get(flavor)
        nominal = quota.nominal if quota else 0
        return max(0, self.used(queue, flavor) - nominal)

    def cohort_members(self, queue: str) -> list[QueuePolicy]:
        cohort = self.queues[queue].cohort
        if not cohort:
            return [self.queues[queue]]
        return [q for q in self.queues.values() if q.cohort == cohort]

    def available(self, queue: str, flavor: str) -> int:
        """GPUs `queue` could still reserve in `flavor`: its unlent share plus what the cohort
        pool has left, capped by its borrowing limit (Kueue's ClusterQueue.Available)."""
        quota = self.queues[queue].quotas.get(flavor)
        if quota is None:
            return 0
        used = self.used(queue, flavor)
        pool = pool_used = 0
        for member in self.cohort_members(queue):
            q = member.quotas.get(flavor)
            if q is None:
                continue
            guaranteed = q.nominal - q.lendable
            pool += q.lendable
            pool_used += max(0, self.used(member.name, flavor) - guaranteed)
        local = max(0, quota.nominal - quota.lendable - used)
        total = local + max(0, pool - pool_used)
        if quota.borrowing_limit is not None:
            total = min(total, quota.nominal + quota.borrowing_limit - used)
        return max(0, total)

    def potential(self, queue: str, flavor: str) -> int:
        """The most `queue` could ever hold in `flavor` with everything else idle."""
        quota = self.queues[queue].quotas.get(flavor)
        if quota is None:
            return 0
        pool = sum(q.lendable for m in self.cohort_members(queue) if (q := m.quotas.get(flavor)))
        total = quota.nominal - quota.lendable + pool
        if quota.borrowing_limit is not None:
            total = min(total, quota.nominal + quota.borrowing_limit)
        return total

    def schedulable_nodes(self, flavor: str) -> list[NodeSlot]:
        return [
            n
            for n in self.nodes.values()
            if n.flavor == flavor and n.name not in self.unschedulable
        ]


# --- topology ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Domain:
    key: tuple[str, ...]
    members: tuple[NodeSlot, ...]
    capacity: int  # pods


def _domains(members: Iterable[NodeSlot], depth: int, caps: Mapping[str, int]) -> list[_Domain]:
    grouped: dict[tuple[str, ...], list[NodeSlot]] = {}
    for node in members:
        grouped.setdefault(node.domain[: depth + 1], []).append(node)
    return [
        _Domain(key, tuple(nodes), sum(caps[n.name] for n in nodes))
        for key, nodes in sorted(grouped.items())
    ]


def _best_fit(domains: Sequence[_Domain], count: int) -> _Domain | None:
    fitting = [d for d in domains if d.capacity >= count]
    return min(fitting, key=lambda d: (d.capacity, d.key)) if fitting else None


def _distribute(
    members: Sequence[NodeSlot], depth: int, count: int, caps: Mapping[str, int]
) -> list[tuple[str, int]]:
    """Spread `count` pods over `members` (one domain at level depth-1) using as few child
    domains as possible: the largest children first, the tightest fit for the remainder."""
    if depth >= len(members[0].domain):  # node level: one node per hostname, normally
        leaves: list[tuple[str, int]] = []
        for node in members:
            take = min(caps[node.name], count - sum(p for _, p in leaves))
            if take > 0:
                leaves.append((node.name, take))
        return leaves
    children = sorted(_domains(members, depth, caps), key=lambda d: (-d.capacity, d.key))
    placed: list[tuple[str, int]] = []
    remaining = count
    while remaining > 0 and children:
        best = _best_fit(children, remaining)
        if best is not None:
            placed.extend(_distribute(best.members, depth + 1, remaining, caps))
            break
        largest = children.pop(0)
        if largest.capacity == 0:
            break
        placed.extend(_distribute(largest.members, depth + 1, largest.capacity, caps))
        remaining -= largest.capacity
    return placed


@dataclass(frozen=True, slots=True)
class TopologyMiss:
    fit: int  # pods that fit in the best domain (or in all, when spreading is allowed)
    total_nodes: int
    full_nodes: int  # nodes that cannot take even one pod


def place(state: ClusterState, demand: Demand) -> tuple[tuple[str, int], ...] | TopologyMiss:
    """Where the pods would go right now, or how close the topology came."""
    flavor = state.flavors[demand.flavor]
    nodes = state.schedulable_nodes(demand.flavor)
    caps = {n.name: max(0, state.free[n.name]) // max(1, demand.gpus_per_pod) for n in nodes}
    full = sum(1 for n in nodes if caps[n.name] == 0)
    total = sum(caps.values())
    if demand.mode == "unconstrained" or demand.level is None:
        if total >= demand.pods:
            return tuple(_distribute(nodes, 0, demand.pods, caps))
        return TopologyMiss(total, len(nodes), full)
    index = flavor.levels.index(demand.level)
    best_fit_count = max((d.capacity for d in _domains(nodes, index, caps)), default=0)
    lowest_tried = index if demand.mode == "required" else 0
    for depth in range(index, lowest_tried - 1, -1):
        chosen = _best_fit(_domains(nodes, depth, caps), demand.pods)
        if chosen is not None:
            return tuple(_distribute(chosen.members, depth + 1, demand.pods, caps))
    if demand.mode == "preferred" and total >= demand.pods:
        return tuple(_distribute(nodes, 0, demand.pods, caps))
    fit = best_fit_count if demand.mode == "required" else total
    return TopologyMiss(fit, len(nodes), full)


def topology_message(topology: str, miss: TopologyMiss, pods: int) -> str:
    """Kueue's TAS not-fit message (tas_flavor_snapshot.go notFitMessage)."""
    if miss.fit <= 0:
        text = f'topology "{topology}" doesn\'t allow to fit any of {pods} pod(s)'
    else:
        text = f'topology "{topology}" allows to fit only {miss.fit} out of {pods} pod(s)'
    if miss.full_nodes:
        text += f'. Total nodes: {miss.total_nodes}; excluded: resource "{GPU}": {miss.full_nodes}'
    return text


# --- decisions ---------------------------------------------------------------------------------


def pod_set_message(reasons: Iterable[str], pod_set: str = "main") -> str:
    return f"couldn't assign flavors to pod set {pod_set}: " + ", ".join(sorted(reasons))


def _affinity_reasons(state: ClusterState, demand: Demand) -> list[str]:
    """Kueue lists every other flavor of the queue that the pods' node selector rules out."""
    return [
        f"flavor {name} doesn't match node affinity"
        for name in state.queues[demand.queue].quotas
        if name != demand.flavor
    ]


def decide(state: ClusterState, demand: Demand) -> Decision:
    """Admit, preempt for, or keep waiting one workload against `state` (not modified)."""
    if demand.queue not in state.queues or demand.flavor not in state.flavors:
        return Wait(f"ClusterQueue {demand.queue} doesn't exist")
    if demand.flavor not in state.queues[demand.queue].quotas:
        return Wait("couldn't find matching flavor for pod set main")
    if demand.level is not None and demand.level not in state.flavors[demand.flavor].levels:
        return Wait(
            pod_set_message(
                [
                    f"flavor {demand.flavor} does not contain the requested level",
                    *_affinity_reasons(state, demand),
                ]
            )
        )
    potential = state.potential(demand.queue, demand.flavor)
    if demand.gpus > potential:
        reason = (
            f"insufficient quota for {GPU} in flavor {demand.flavor}, previously considered "
            f"podsets requests (0) + current podset request ({demand.gpus}) > maximum capacity "
            f"({potential})"
        )
        return Wait(pod_set_message([reason, *_affinity_reasons(state, demand)]))
    available = state.available(demand.queue, demand.flavor)
    if demand.gpus <= available:
        placed = place(state, demand)
        if not isinstance(placed, TopologyMiss):
            quota = state.queues[demand.queue].quotas[demand.flavor]
            borrowing = state.used(demand.queue, demand.flavor) + demand.gpus > quota.nominal
            return Admit(placed, borrowing)
        topology = state.flavors[demand.flavor].topology
        message = pod_set_message([topology_message(topology, placed, demand.pods)])
        topology_driven = True
    else:
        lack = demand.gpus - available
        reason = (
            f"insufficient unused quota for {GPU} in flavor {demand.flavor}, {lack} more needed"
        )
        message = pod_set_message([reason, *_affinity_reasons(state, demand)])
        topology_driven = False
    victims = plan_preemption(state, demand)
    if victims:
        return Preempt(victims, message, topology_driven)
    return Wait(message)


def _fits(state: ClusterState, demand: Demand, allow_borrowing: bool) -> bool:
    if demand.gpus > state.available(demand.queue, demand.flavor):
        return False
    nominal = state.queues[demand.queue].quotas[demand.flavor].nominal
    if not allow_borrowing and state.used(demand.queue, demand.flavor) + demand.gpus > nominal:
        return False
    return not isinstance(place(state, demand), TopologyMiss)


def _ordered(candidates: Iterable[Holding], own_queue: str) -> list[Holding]:
    """Kueue's candidate order: other queues first, lower priority, most recently admitted."""
    return sorted(
        candidates,
        key=lambda h: (h.queue == own_queue, h.priority, -h.reserved_at, h.key),
    )


def plan_preemption(
    state: ClusterState, demand: Demand
) -> tuple[tuple[Holding, PreemptionReason], ...]:
    """The fewest workloads whose eviction lets `demand` in, with the reason for each."""
    policy = state.queues[demand.queue]
    same_flavor = [h for h in state.holdings.values() if h.flavor == demand.flavor]
    own = [
        h
        for h in same_flavor
        if h.queue == demand.queue and policy.preempt_within_queue and h.priority < demand.priority
    ]
    cohort = {q.name for q in state.cohort_members(demand.queue)} - {demand.queue}
    others = [h for h in same_flavor if h.queue in cohort]
    strategies: list[tuple[list[Holding], bool, PreemptionReason]] = []
    reclaimable = others if policy.reclaim_within_cohort else []
    strategies.append((own + reclaimable, False, "InCohortReclamation"))
    threshold = policy.borrow_within_cohort_max_priority
    if threshold is not None:
        lower = [h for h in others if h.priority < demand.priority and h.priority <= threshold]
        strategies.append((own + lower, True, "InCohortReclaimWhileBorrowing"))
    strategies.append((own, True, "InCohortReclamation"))
    for candidates, allow_borrowing, cohort_reason in strategies:
        chosen = _greedy_victims(state, demand, _ordered(candidates, demand.queue), allow_borrowing)
        if chosen:
            return tuple(
                (h, "InClusterQueue" if h.queue == demand.queue else cohort_reason) for h in chosen
            )
    return ()


def _greedy_victims(
    state: ClusterState, demand: Demand, candidates: Sequence[Holding], allow_borrowing: bool
) -> list[Holding]:
    sim = state.copy()
    removed: list[Holding] = []
    for candidate in candidates:
        if candidate.queue != demand.queue and sim.borrowed(candidate.queue, demand.flavor) <= 0:
            continue  # a queue within its nominal quota cannot be reclaimed from
        sim.remove(candidate)
        removed.append(candidate)
        if _fits(sim, demand, allow_borrowing):
            for earlier in reversed(removed[:-1]):
                sim.add(earlier)
                if _fits(sim, demand, allow_borrowing):
                    removed.remove(earlier)
                else:
                    sim.remove(earlier)
            return removed
    return []
