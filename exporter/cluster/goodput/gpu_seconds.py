"""The cluster's GPU-second ledger: every GPU-second of every node in exactly one category.

Categories (`CATEGORIES`): `running` (a pod of a running job holds it), `restarting` (held by a
job whose pods are not all Ready: starting, or restarting after an interruption), `absorbed`
(held by an elastic job above its minimum: capacity it took that would be idle), `idle`
(schedulable and free), and `unavailable:<why>` for a free GPU the cluster cannot use: a
remediation under way, a deep health check, an actionable health finding, EC2 maintenance due,
a cordon (or a node NotReady). The idle GPUs of a flavor are split further by what waits for
them, with `exporter.cluster.elastic.idle`'s reasons and its `split` (claimable, topology,
quota, no_demand).

Exactness: time is counted in integer milliseconds (each `now` rounded once, so consecutive
pieces telescope) and GPUs are integers, so every total is an integer and the parts add up to
capacity x time exactly; `GpuSecondTotals.residual_ms` is the check. A node's capacity is its
allocatable GPUs, or the GPUs its pods hold when that is more (a node that went NotReady and
reports no allocatable still has its pods' GPUs). Idle reasons are exact per flavor; per
domain only `idle` is given, since Kueue's demand waits for a flavor, not a domain (splitting it
by domain would invent precision the cluster does not have).

Each change costs O(the keys it touches): a node's contribution is diffed against what it gave
before, a flavor's idle split is redone when its idle count or its demand changes.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

from exporter.cluster.elastic.idle import DemandCause, split

CATEGORIES: Final = (
    "running",
    "restarting",
    "absorbed",
    "idle",
    "unavailable:remediation",
    "unavailable:deep_health_check",
    "unavailable:finding",
    "unavailable:maintenance",
    "unavailable:cordoned",
)
IDLE_REASONS: Final = ("claimable", "topology", "quota", "no_demand")
HELD: Final = ("running", "restarting", "absorbed")
K = TypeVar("K", bound=Hashable)
PartKey = tuple[str, str, str, str]  # (flavor, domain, team, category)


def to_ms(now: float) -> int:
    return round(now * 1000)


class ExactIntegrator(Generic[K]):
    """Integer count x integer milliseconds, per key; a piece is closed when its count moves.
    Each key holds [count, since, done] in one list (one lookup an update)."""

    def __init__(self) -> None:
        self._state: dict[K, list[int]] = {}

    def add(self, key: K, delta: int, now_ms: int) -> None:
        if not delta:
            return
        state = self._state.get(key)
        if state is None:
            self._state[key] = [delta, now_ms, 0]
            return
        count, since = state[0], state[1]
        if now_ms > since:
            if count:
                state[2] += count * (now_ms - since)
            state[1] = now_ms
        state[0] = count + delta

    def totals(self, now_ms: int) -> dict[K, int]:
        out: dict[K, int] = {}
        for key, (count, since, done) in self._state.items():
            value = done + (count * (now_ms - since) if count and now_ms > since else 0)
            if value:
                out[key] = value
        return out

    def counts(self) -> dict[K, int]:
        return {k: v[0] for k, v in self._state.items() if v[0]}

    def seed(self, done: Mapping[K, int]) -> None:
        """Start from totals a previous process wrote (a restart keeps the ledger)."""
        for key, value in done.items():
            state = self._state.get(key)
            if state is None:
                self._state[key] = [0, 0, int(value)]
            else:
                state[2] += int(value)


@dataclass(slots=True)
class _Node:
    """One node: where it counts, its allocatable GPUs, why its free GPUs are unavailable,
    and what its pods hold by (team, category)."""

    flavor: str = ""
    domain: str = ""
    allocatable: int = 0
    unavailable: str = ""
    held: dict[tuple[str, str], int] = field(default_factory=dict)
    used: int = 0

    @property
    def capacity(self) -> int:
        return max(self.allocatable, self.used)

    @property
    def free(self) -> int:
        return self.capacity - self.used

    @property
    def free_category(self) -> str:
        return f"unavailable:{self.unavailable}" if self.unavailable else "idle"


@dataclass(frozen=True, slots=True)
class GpuSecondTotals:
    """GPU-milliseconds by (flavor, domain, team, category), the capacity they add up to, and
    each flavor's idle GPU-milliseconds by reason."""

    capacity: dict[tuple[str, str], int]  # (flavor, domain) -> GPU-ms
    parts: dict[PartKey, int]
    idle_reasons: dict[tuple[str, str], int] = field(default_factory=dict)  # (flavor, reason)

    @property
    def capacity_ms(self) -> int:
        return sum(self.capacity.values())

    def residual_ms(self) -> int:
        """Capacity minus every part, plus the flavors' idle minus its reasons: always 0."""
        idle = sum(v for k, v in self.parts.items() if k[3] == "idle")
        return self.capacity_ms - sum(self.parts.values()) + idle - sum(self.idle_reasons.values())

    def seconds(self, category: str) -> float:
        return sum(v for k, v in self.parts.items() if k[3] == category) / 1000

    def by(self, dim: str) -> dict[str, dict[str, float]]:
        """Seconds by category, grouped by "flavor", "domain" or "team"."""
        index = {"flavor": 0, "domain": 1, "team": 2}[dim]
        out: dict[str, dict[str, float]] = {}
        for key, value in self.parts.items():
            group = out.setdefault(key[index], {})
            group[key[3]] = group.get(key[3], 0.0) + value / 1000
        return out

    def as_dict(self) -> dict[str, object]:
        return {
            "capacity": [[f, d, v] for (f, d), v in sorted(self.capacity.items())],
            "parts": [[*k, v] for k, v in sorted(self.parts.items())],
            "idle_reasons": [[f, r, v] for (f, r), v in sorted(self.idle_reasons.items())],
        }


class GpuSecondLedger:
    """Told each node's state (`set_node`), each move of a pod's GPUs between categories on a
    node (`move`), and each pending demand; integrates, exactly."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}
        self._parts: ExactIntegrator[PartKey] = ExactIntegrator()
        self._capacity: ExactIntegrator[tuple[str, str]] = ExactIntegrator()
        self._reasons: ExactIntegrator[tuple[str, str]] = ExactIntegrator()
        self._idle: dict[str, int] = {}  # schedulable free GPUs by flavor
        self._demand: dict[Hashable, tuple[str, DemandCause, int]] = {}
        self._demand_by_flavor: dict[str, dict[str, int]] = {}
        self._split: dict[str, tuple[int, int, int, int]] = {}
        self._unsplit: set[str] = set()  # flavors whose idle count moved, not yet re-split
        self._split_idle: dict[str, int] = {}  # the idle count each flavor was last split at
        self._latest = 0

    def _clock(self, now: float) -> int:
        ms = round(now * 1000)
        if ms > self._latest:
            self.flush()  # a split pending from the moment before belongs to that moment
            self._latest = ms
        return self._latest

    def set_node(
        self,
        name: str,
        flavor: str,
        domain: str,
        allocatable: int,
        unavailable: str,
        now: float,
    ) -> None:
        """Node `name` now: where it counts, its allocatable GPUs, and why its free GPUs are
        unavailable ("" when they are not)."""
        node = self._nodes.get(name)
        if node is None:
            node = self._nodes[name] = _Node()
        state = (flavor, domain, max(0, allocatable), unavailable)
        if (node.flavor, node.domain, node.allocatable, node.unavailable) == state:
            return
        ms = self._clock(now)
        self._contribute(node, -1, ms)
        node.flavor, node.domain, node.allocatable, node.unavailable = state
        self._contribute(node, 1, ms)

    def remove_node(self, name: str, now: float) -> None:
        """The Node is gone (its pods, should any be left, keep their GPUs counted)."""
        node = self._nodes.get(name)
        if node is None:
            return
        ms = self._clock(now)
        self._contribute(node, -1, ms)
        node.allocatable, node.unavailable = 0, ""
        if node.used:
            self._contribute(node, 1, ms)
        else:
            del self._nodes[name]

    def move(
        self,
        name: str,
        old: tuple[str, str] | None,
        new: tuple[str, str] | None,
        gpus: int,
        now: float,
    ) -> None:
        """`gpus` of a pod on node `name` go from (team, category) `old` to `new` (None: not
        held: the pod came or went). O(1): on the hot path of every pod event."""
        if old == new or gpus <= 0:
            return
        ms = self._clock(now)
        node = self._nodes.get(name)
        if node is None:
            node = self._nodes[name] = _Node()
        flavor, domain, allocatable = node.flavor, node.domain, node.allocatable
        used = before = node.used
        held = node.held
        parts = self._parts
        if old is not None:
            used -= gpus
            left = held.get(old, 0) - gpus
            if left > 0:
                held[old] = left
            else:
                held.pop(old, None)
            parts.add((flavor, domain, old[0], old[1]), -gpus, ms)
        if new is not None:
            used += gpus
            held[new] = held.get(new, 0) + gpus
            parts.add((flavor, domain, new[0], new[1]), gpus, ms)
        node.used = used
        capacity_before = allocatable if allocatable > before else before
        capacity = allocatable if allocatable > used else used
        if capacity != capacity_before:
            self._capacity.add((flavor, domain), capacity - capacity_before, ms)
        delta = (capacity - used) - (capacity_before - before)
        if delta:
            parts.add((flavor, domain, "", node.free_category), delta, ms)
            if not node.unavailable:
                self._idle[flavor] = self._idle.get(flavor, 0) + delta
                self._unsplit.add(flavor)  # split at `flush`: a pod's two moves often cancel

    def flush(self) -> None:
        """Share out the idle GPUs of the flavors whose count moved since the last call, at the
        time of that move (call before time moves on: `GoodputBook.observe` does, per event)."""
        if self._unsplit:
            for flavor in sorted(self._unsplit):
                if self._idle.get(flavor, 0) != self._split_idle.get(flavor):
                    self._resplit(flavor, self._latest)
            self._unsplit.clear()

    def set_demand(
        self, key: Hashable, flavor: str, cause: DemandCause, gpus: int, now: float
    ) -> None:
        entry = (flavor, cause, max(0, gpus))
        old = self._demand.get(key)
        if old == entry:
            return
        ms = self._clock(now)
        if old is not None:
            self._add_demand(old, -1)
        self._demand[key] = entry
        self._add_demand(entry, 1)
        self._resplit(flavor, ms)
        if old is not None and old[0] != flavor:
            self._resplit(old[0], ms)

    def remove_demand(self, key: Hashable, now: float) -> None:
        old = self._demand.pop(key, None)
        if old is not None:
            self._add_demand(old, -1)
            self._resplit(old[0], self._clock(now))

    def totals(self, now: float) -> GpuSecondTotals:
        self.flush()
        ms = max(to_ms(now), self._latest)
        return GpuSecondTotals(
            self._capacity.totals(ms), self._parts.totals(ms), self._reasons.totals(ms)
        )

    def seed(self, totals: GpuSecondTotals) -> None:
        """Go on from a previous process's totals (its time until it stopped)."""
        self._capacity.seed(totals.capacity)
        self._parts.seed(totals.parts)
        self._reasons.seed(totals.idle_reasons)

    def now_counts(self) -> dict[str, int]:
        """GPUs in each category at this moment."""
        out: dict[str, int] = {}
        for key, n in self._parts.counts().items():
            out[key[3]] = out.get(key[3], 0) + n
        return out

    # --- bookkeeping ----------------------------------------------------------------------

    def _contribute(self, node: _Node, sign: int, ms: int) -> None:
        """Add (1) or take away (-1) everything the node counts for."""
        place = (node.flavor, node.domain)
        if node.capacity:
            self._capacity.add(place, sign * node.capacity, ms)
        for slot, n in node.held.items():
            self._parts.add((*place, *slot), sign * n, ms)
        free = node.free
        if free:
            self._parts.add((*place, "", node.free_category), sign * free, ms)
            if not node.unavailable:
                self._idle[node.flavor] = self._idle.get(node.flavor, 0) + sign * free
                self._resplit(node.flavor, ms)

    def _add_demand(self, entry: tuple[str, DemandCause, int], sign: int) -> None:
        flavor, cause, gpus = entry
        per = self._demand_by_flavor.setdefault(flavor, {})
        per[cause] = per.get(cause, 0) + sign * gpus

    def _resplit(self, flavor: str, ms: int) -> None:
        idle = self._idle.get(flavor, 0)
        self._split_idle[flavor] = idle
        demand = self._demand_by_flavor.get(flavor)
        shares = split(idle, demand) if demand else (0, 0, 0, max(0, idle))
        old = self._split.get(flavor, (0, 0, 0, 0))
        if shares == old:
            return
        for reason, before, after in zip(IDLE_REASONS, old, shares, strict=True):
            if after != before:
                self._reasons.add((flavor, reason), after - before, ms)
        self._split[flavor] = shares
