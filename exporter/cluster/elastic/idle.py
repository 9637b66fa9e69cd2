"""Idle and absorbed GPU-seconds, integrated exactly as the cluster changes.

Every quantity here is piecewise constant between watch events, so its integral is exact when
each piece is closed at the moment it changes. Closing must stay O(1) per event on a
2,000-node cluster, which rules out re-splitting every domain at every event. The trick is in
`_Share`: the share of a flavor's schedulable idle GPUs that each demand reason gets is the
same for all of the flavor's domains, so one running integral of those shares per flavor
(`phi`) lets a domain close its own piece with `idle * (phi(now) - phi(then))` whenever its idle
count changes, and only then.

Reasons an idle GPU has, in the order they are decided:
- the node is not offered at all: `health` (cordoned, not Ready, HyperPod's Unschedulable*
  label), `deep_health_check` (HyperPod's deep health check InProgress, Failed or unreadable:
  its GPUs are held by the check), `maintenance` (an EC2 scheduled event is due);
- otherwise the flavor's schedulable idle GPUs are matched against what waits for that flavor,
  by the cause Kueue gave the waiting work: first `claimable` (a pending Workload Kueue has not
  refused for quota or topology, or an elastic job below its maximum with no scale-up asked
  yet: either could use the GPU now), then `topology` (Kueue's TAS found no domain that fits,
  although quota allows), then `quota` (the queue's quota and the cohort's lendable GPUs are
  used up), and what is left is `no_demand`.
`absorbed` GPU-seconds are an elastic job's GPUs above its minimum: idle capacity the job
took instead of leaving it idle.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Generic, Literal, TypeVar

from exporter.cluster.objects import Node, ResourceFlavor, Workload
from exporter.topology.labels import INSTANCE_TYPE_KEY

NodeState = Literal["schedulable", "health", "deep_health_check", "maintenance"]
DemandCause = Literal["claimable", "topology", "quota"]
DEMAND_ORDER: Final[tuple[DemandCause, ...]] = ("claimable", "topology", "quota")
REASONS: Final = (
    "claimable",
    "topology",
    "quota",
    "no_demand",
    "health",
    "deep_health_check",
    "maintenance",
)
_TOPOLOGY_PHRASES = ("allows to fit only", "doesn't allow to fit", "topology")
_NOT_DEMAND_PHRASES = ("doesn't exist", "couldn't find matching flavor", "is inactive")
# Either list as one search (this runs for every pending Workload's event)
_TOPOLOGY = re.compile("|".join(map(re.escape, _TOPOLOGY_PHRASES)))
_NOT_DEMAND = re.compile("|".join(map(re.escape, _NOT_DEMAND_PHRASES)))
_NOT_DEMAND_REASONS = frozenset({"Misconfigured", "NoMatchingFlavor", "ClusterQueueStopped"})

K = TypeVar("K", bound=Hashable)
_NO_DEMAND: Final = (0.0, 0.0, 0.0, 1.0)  # the shares when no idle GPU has demand


def node_state(node: Node) -> NodeState:
    """Whether the node's idle GPUs are offered, and if not, why (placement.screen_nodes'
    causes, folded: a deep health check first, then Kubernetes' and HyperPod's own marks,
    then EC2 maintenance)."""
    if node.deep_health_blocks:
        return "deep_health_check"
    if not node.schedulable or node.cordoned:
        return "health"
    if node.scheduled_event:
        return "maintenance"
    return "schedulable"


def flavor_of(node: Node, flavors: Iterable[ResourceFlavor]) -> str:
    """The ResourceFlavor whose nodeLabels select the node (first by name), else its instance
    type, which is how HyperPod names its flavors."""
    for flavor in sorted(flavors, key=lambda f: f.name):
        if flavor.node_labels and all(node.label(k) == v for k, v in flavor.node_labels):
            return flavor.name
    return node.label(INSTANCE_TYPE_KEY)


def demand_cause(workload: Workload) -> DemandCause | None:
    """What a pending Workload's QuotaReserved=False condition says kept it out, in Kueue's
    own words (the scheduler's verdict at its last attempt, which is what held the GPUs idle):
    topology when TAS could not fit it, quota when the queue or cohort lacked GPUs, claimable
    otherwise (not tried yet, or admissible at the next cycle). Inactive and misconfigured
    Workloads are no demand: no capacity could have started them."""
    if not workload.active or workload.gpus_requested <= 0:
        return None
    cond = workload.condition("QuotaReserved")
    if cond is None or cond.status != "False":
        return "claimable"
    lowered = cond.message.lower()
    if cond.reason in _NOT_DEMAND_REASONS or _NOT_DEMAND.search(lowered):
        return None
    if _TOPOLOGY.search(lowered):
        return "topology"
    if "quota" in lowered:
        return "quota"
    return "claimable"


def demand_flavor(workload: Workload, queue_flavors: Iterable[str]) -> str:
    """The flavor a pending Workload waits for: the one Kueue's message names ("... in flavor
    X"), else the first GPU flavor of its ClusterQueue, else "" (unknown)."""
    cond = workload.condition("QuotaReserved")
    message = cond.message if cond is not None else ""
    marker = " in flavor "
    at = message.find(marker)
    if at >= 0:
        rest = message[at + len(marker) :]
        name = rest.split(",", 1)[0].split(" ", 1)[0].strip().strip("\"'")
        if name:
            return name
    return next(iter(queue_flavors), "")


def split(idle: int, demand: Mapping[str, int]) -> tuple[int, int, int, int]:
    """`idle` schedulable GPUs of one flavor shared out by demand, in DEMAND_ORDER:
    (claimable, topology, quota, no_demand)."""
    left = idle if idle > 0 else 0
    # DEMAND_ORDER, unrolled: this runs for every Pod event that moves a node's idle GPUs
    claimable = demand.get("claimable", 0)
    claimable = 0 if claimable <= 0 else claimable if claimable < left else left
    left -= claimable
    topology = demand.get("topology", 0)
    topology = 0 if topology <= 0 else topology if topology < left else left
    left -= topology
    quota = demand.get("quota", 0)
    quota = 0 if quota <= 0 else quota if quota < left else left
    return claimable, topology, quota, left - quota


class Integrator(Generic[K]):
    """The integral of value dt per key, for values that change only when `set` says so."""

    def __init__(self) -> None:
        self._now: dict[K, tuple[float, float]] = {}  # key -> (value, since)
        self._done: dict[K, float] = {}

    def set(self, key: K, value: float, now: float) -> None:
        held = self._now.get(key)
        if held is not None:
            old, since = held
            if old == value:
                return
            if now > since:
                self._done[key] = self._done.get(key, 0.0) + old * (now - since)
        self._now[key] = (value, now if held is None or now > held[1] else held[1])

    def totals(self, now: float) -> dict[K, float]:
        out = dict(self._done)
        for key, (value, since) in self._now.items():
            if value and now > since:
                out[key] = out.get(key, 0.0) + value * (now - since)
        return out


@dataclass(slots=True)
class _Share:
    """One flavor's running integral phi of the demand shares (claimable, topology, quota,
    no_demand) of its schedulable idle GPUs: phi(t) = cumulative + fractions * (t - since).

    The shares follow the flavor's idle GPUs and demand, which move at nearly every Pod event,
    often twice in one moment (a pod leaves one node and binds on another). They are re-split
    lazily: a change only sets `stale_at`, and the first reading at a later moment folds it in
    (`IdleAccountant._phi`), so a moment's changes cost one split, not one each."""

    fractions: tuple[float, float, float, float] = _NO_DEMAND
    since: float = 0.0
    cumulative: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    # When idle or demand last changed while `fractions` may no longer match them; None: current
    stale_at: float | None = None

    def at(self, now: float) -> tuple[float, float, float, float]:
        """phi at `now`, with `fractions` as they are (folded in or not: see `_fold`)."""
        dt = now - self.since
        c = self.cumulative
        if dt <= 0:
            return c
        f = self.fractions
        return (c[0] + f[0] * dt, c[1] + f[1] * dt, c[2] + f[2] * dt, c[3] + f[3] * dt)


@dataclass(slots=True)
class _Piece:
    idle: int
    mark: tuple[float, float, float, float]  # phi when `idle` last changed
    done: list[float]


class _NodeIdle:
    """One node as last told: where its idle GPUs count, and (while it is schedulable) the
    piece of its (flavor, domain) they count in, held here so that a Pod event, which moves
    only its idle GPUs (`set_used`), finds everything it touches in one object."""

    __slots__ = ("allocatable", "domain", "flavor", "idle", "piece", "share", "state")

    def __init__(
        self,
        flavor: str,
        domain: str,
        state: NodeState,
        allocatable: int,
        piece: _Piece | None,
        share: _Share | None,
    ) -> None:
        self.flavor = flavor
        self.domain = domain
        self.state: NodeState = state
        self.allocatable = allocatable
        self.idle = 0
        self.piece = piece  # None unless schedulable
        self.share = share  # its flavor's, None unless schedulable


class IdleAccountant:
    """Idle GPU-seconds by (flavor, domain, reason) and absorbed GPU-seconds by (flavor, team).

    The model tells it each node's idle GPUs and state, each pending demand, and each elastic
    job's GPUs above its minimum, whenever one changes; `totals` integrates up to `now`.
    Times must not go backwards; an earlier `now` is treated as the latest seen."""

    def __init__(self) -> None:
        self._nodes: dict[str, _NodeIdle] = {}
        self._offline: Integrator[tuple[str, str, str]] = Integrator()
        self._offline_sum: dict[tuple[str, str, str], int] = {}
        self._pieces: dict[tuple[str, str], _Piece] = {}
        self._idle_by_flavor: dict[str, int] = {}
        self._demand: dict[Hashable, tuple[str, DemandCause, int]] = {}
        self._demand_by_flavor: dict[str, dict[str, int]] = {}
        self._shares: dict[str, _Share] = {}
        self._absorbed: Integrator[tuple[str, str]] = Integrator()
        self._absorbed_by_job: dict[Hashable, tuple[str, str, int]] = {}
        self._absorbed_sum: dict[tuple[str, str], int] = {}
        self._latest = 0.0

    def _clock(self, now: float) -> float:
        if now > self._latest:
            self._latest = now
        return self._latest

    # --- what changed ---------------------------------------------------------------------

    def set_node(
        self,
        name: str,
        flavor: str,
        domain: str,
        state: NodeState,
        allocatable: int,
        used: int,
        now: float,
    ) -> None:
        """The node's place (flavor, domain), state, allocatable and used GPUs: its idle GPUs
        are what its pods leave of its allocatable."""
        now = self._clock(now)
        entry = self._nodes.get(name)
        if (
            entry is None
            or entry.flavor != flavor
            or entry.domain != domain
            or entry.state != state
        ):
            if entry is not None:  # it leaves its old place
                self._move(entry, -entry.idle, now)
            if state == "schedulable":
                share = self._shares.get(flavor)
                if share is None:
                    share = self._shares[flavor] = _Share(since=now)
                piece = self._pieces.get((flavor, domain))
                if piece is None:
                    piece = self._pieces[(flavor, domain)] = _Piece(0, share.at(now), [0.0] * 4)
                entry = _NodeIdle(flavor, domain, state, allocatable, piece, share)
            else:
                entry = _NodeIdle(flavor, domain, state, allocatable, None, None)
            self._nodes[name] = entry
        entry.allocatable = allocatable
        self._set_idle(entry, allocatable - used, now)

    def set_used(self, name: str, used: int, now: float) -> bool:
        """Only the GPUs the node's pods use changed (its place, state and allocatable are as
        last told): the cheap path of `set_node`, for every Pod event. False, and nothing done,
        when the node was never told."""
        entry = self._nodes.get(name)
        if entry is None:
            return False
        if now > self._latest:  # `_clock`, in line
            self._latest = now
        self._set_idle(entry, entry.allocatable - used, self._latest)
        return True

    def _set_idle(self, entry: _NodeIdle, idle: int, now: float) -> None:
        if idle < 0:
            idle = 0
        delta = idle - entry.idle
        if delta:
            entry.idle = idle
            self._move(entry, delta, now)

    def remove_node(self, name: str, now: float) -> None:
        entry = self._nodes.pop(name, None)
        if entry is not None:
            self._move(entry, -entry.idle, self._clock(now))

    def set_demand(
        self, key: Hashable, flavor: str, cause: DemandCause, gpus: int, now: float
    ) -> None:
        now = self._clock(now)
        entry = (flavor, cause, max(0, gpus))
        old = self._demand.get(key)
        if old == entry:
            return
        if old is not None:
            self._add_demand(old, -1, now)
        self._demand[key] = entry
        self._add_demand(entry, +1, now)

    def remove_demand(self, key: Hashable, now: float) -> None:
        old = self._demand.pop(key, None)
        if old is not None:
            self._add_demand(old, -1, self._clock(now))

    def set_absorbed(self, key: Hashable, flavor: str, team: str, gpus: int, now: float) -> None:
        now = self._clock(now)
        old = self._absorbed_by_job.pop(key, None)
        if old is not None:
            self._add_absorbed((old[0], old[1]), -old[2], now)
        if gpus > 0:
            self._absorbed_by_job[key] = (flavor, team, gpus)
            self._add_absorbed((flavor, team), gpus, now)

    # --- readings -------------------------------------------------------------------------

    def totals(self, now: float) -> dict[tuple[str, str, str], float]:
        """GPU-seconds by (flavor, domain, reason) since this accountant began."""
        now = max(now, self._latest)
        out: dict[tuple[str, str, str], float] = dict(self._offline.totals(now))
        for (flavor, domain), piece in self._pieces.items():
            share = self._shares.get(flavor)
            phi = self._phi(share, flavor, now) if share is not None else piece.mark
            for i, reason in enumerate(REASONS[:4]):
                value = piece.done[i] + piece.idle * (phi[i] - piece.mark[i])
                if value:
                    out[(flavor, domain, reason)] = value
        return out

    def absorbed(self, now: float) -> dict[tuple[str, str], float]:
        return self._absorbed.totals(max(now, self._latest))

    def idle_now(self) -> dict[str, int]:
        """Idle GPUs at this moment by reason (for the JSON endpoint's "now" column)."""
        out = dict.fromkeys(REASONS, 0)
        for (_, _, state), n in self._offline_sum.items():
            out[state] += n
        for flavor, idle in self._idle_by_flavor.items():
            shares = split(idle, self._demand_by_flavor.get(flavor, {}))
            for reason, n in zip(REASONS[:4], shares, strict=True):
                out[reason] += n
        return out

    # --- bookkeeping ----------------------------------------------------------------------

    def _move(self, entry: _NodeIdle, delta: int, now: float) -> None:
        """`delta` idle GPUs join (+) or leave (-) where the node's count: its piece of its
        flavor's shares while schedulable, else the (flavor, domain) of nodes in its state."""
        if not delta:  # (a node with no idle GPUs leaving its place, or removed)
            return
        piece, share = entry.piece, entry.share
        if piece is None or share is None:
            key = (entry.flavor, entry.domain, entry.state)
            total = self._offline_sum.get(key, 0) + delta
            self._offline_sum[key] = total
            self._offline.set(key, total, now)
            return
        flavor = entry.flavor
        stale_at = share.stale_at  # `_phi`, in line: this runs twice per Pod event
        if stale_at is not None and now > stale_at:
            self._fold(share, flavor, stale_at)
        phi = share.cumulative if now <= share.since else share.at(now)
        if piece.idle and piece.mark != phi:  # the piece's integral, closed up to now
            n, mark, done = piece.idle, piece.mark, piece.done
            done[0] += n * (phi[0] - mark[0])
            done[1] += n * (phi[1] - mark[1])
            done[2] += n * (phi[2] - mark[2])
            done[3] += n * (phi[3] - mark[3])
        piece.mark = phi
        piece.idle += delta
        self._idle_by_flavor[flavor] = self._idle_by_flavor.get(flavor, 0) + delta
        share.stale_at = now

    def _add_demand(self, entry: tuple[str, DemandCause, int], sign: int, now: float) -> None:
        flavor, cause, gpus = entry
        self._reshare(flavor, now)  # before the demand moves: what came earlier is folded in
        per = self._demand_by_flavor.setdefault(flavor, {})
        per[cause] = per.get(cause, 0) + sign * gpus

    def _add_absorbed(self, key: tuple[str, str], delta: int, now: float) -> None:
        total = self._absorbed_sum.get(key, 0) + delta
        self._absorbed_sum[key] = total
        self._absorbed.set(key, total, now)

    def _reshare(self, flavor: str, now: float) -> None:
        """The flavor's idle GPUs or demand are about to change at `now`: what changed at an
        earlier moment is folded in first. Nothing to do for a flavor that never had a
        schedulable idle GPU (its shares start with its first)."""
        share = self._shares.get(flavor)
        if share is not None:
            self._phi(share, flavor, now)
            share.stale_at = now

    def _fold(self, share: _Share, flavor: str, stale_at: float) -> None:
        """Fold in the change of the flavor's idle GPUs or demand made at `stale_at`,
        when asked at a later moment: the shares that held from then on are those of the idle
        and demand as they are now, since nothing changed in between (it would have come
        through `_move` or `_reshare`, which fold first)."""
        share.stale_at = None
        idle = self._idle_by_flavor.get(flavor, 0)
        demand = self._demand_by_flavor.get(flavor)
        if idle > 0 and demand:
            parts = split(idle, demand)
            fractions = (parts[0] / idle, parts[1] / idle, parts[2] / idle, parts[3] / idle)
        else:  # no idle GPU, or no demand for them: all of them (if any) have none
            fractions = _NO_DEMAND
        if fractions != share.fractions:
            share.cumulative = share.at(stale_at)
            share.since = stale_at
            share.fractions = fractions

    def _phi(self, share: _Share, flavor: str, now: float) -> tuple[float, float, float, float]:
        """The flavor's phi at `now` (no earlier than any change told), what changed at an
        earlier moment folded in first."""
        stale_at = share.stale_at
        if stale_at is not None and now > stale_at:
            self._fold(share, flavor, stale_at)
        return share.at(now)
