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

Derived, not settled: only what pods hold and what capacity there is are integrated, as they
change (two integer operations on a cell per change). A node's free GPUs are its capacity less
what its pods hold, so the free GPU-time of a group of nodes (one flavor, domain and free
category) is its capacity's GPU-time less its held GPU-time, worked out when the totals are
read; likewise a flavor's no_demand time is its idle time less what the other three reasons
took. A pod bound anew within one group therefore moves no cell at all, and a flavor's shares
are split again only when its idle count moves where demand decides them (below the GPUs its
demand wants). `tests/cluster/goodput/test_ledger_and_reliability.py` holds the ledger to a
naive one that recounts every node at every change.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from exporter.cluster.elastic.idle import DEMAND_ORDER, DemandCause, split

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
_NO_END: Final = 1 << 62  # more idle GPUs than any flavor has
K = TypeVar("K", bound=Hashable)
PartKey = tuple[str, str, str, str]  # (flavor, domain, team, category)


def to_ms(now: float) -> int:
    return round(now * 1000)


class ExactIntegrator(Generic[K]):
    """Integer count x integer milliseconds, per key, exactly.

    Each key holds one cell, [count, anti]: a change of `delta` at `ms` adds `delta` to the
    count and takes `delta * ms` from `anti`, so the integral up to `now_ms` is
    `anti + count * now_ms` (the pieces telescope). An update is two integer operations on a
    list the caller may keep (`cell`); `GpuSecondLedger` keeps cells of this form on its own
    groups of nodes. Times must not go backwards (the callers' clocks never do: a time before
    the latest is taken as the latest)."""

    def __init__(self) -> None:
        self._state: dict[K, list[int]] = {}
        self._latest = 0

    def cell(self, key: K) -> list[int]:
        """The key's [count, anti], made when new: update it as `add` does, with times that
        never go back (`count += delta; anti -= delta * ms`)."""
        state = self._state.get(key)
        if state is None:
            state = self._state[key] = [0, 0]
        return state

    def add(self, key: K, delta: int, now_ms: int) -> None:
        if not delta:
            return
        if now_ms < self._latest:
            now_ms = self._latest
        else:
            self._latest = now_ms
        state = self._state.get(key)
        if state is None:
            self._state[key] = [delta, -delta * now_ms]
            return
        state[0] += delta
        state[1] -= delta * now_ms

    def totals(self, now_ms: int) -> dict[K, int]:
        out: dict[K, int] = {}
        now_ms = max(now_ms, self._latest)
        for key, (count, anti) in self._state.items():
            value = anti + count * now_ms
            if value:
                out[key] = value
        return out

    def seed(self, done: Mapping[K, int]) -> None:
        """Start from totals a previous process wrote (a restart keeps the ledger)."""
        for key, value in done.items():
            self.cell(key)[1] += int(value)


@dataclass(slots=True, eq=False)
class _Flavor:
    """One flavor's schedulable free GPUs (`count`) and the demand waiting for them, with the
    cells of the claimable, topology and quota shares of its idle GPU-time (each cell's count
    is that share now). The fourth reason, no_demand, is what the idle GPU-time leaves, worked
    out when read.

    `split` is linear in the idle count between the points where one reason's demand is met
    (its demand summed with the reasons before it): between two of them one reason takes every
    GPU that comes or goes. `low`..`high` is the stretch the count is in and `marginal` that
    reason's cell (None: no_demand), so a move within the stretch is one cell update and only
    a move past its ends splits anew."""

    count: int = 0
    demand: dict[str, int] = field(default_factory=dict)
    cells: tuple[list[int], list[int], list[int]] = field(
        default_factory=lambda: ([0, 0], [0, 0], [0, 0])
    )
    low: int = 0
    high: int = -1  # below low: split at the first move
    marginal: list[int] | None = None


@dataclass(slots=True, eq=False)
class _Group:
    """The nodes of one (flavor, domain) whose free GPUs count as one category: what they
    hold by (team, category) and their capacity, as cells (`ExactIntegrator`'s [count, anti]).
    Their free GPU-time is capacity less what they hold, worked out when read."""

    flavor: str
    domain: str
    unavailable: str  # why its free GPUs are unavailable, "" when they are idle
    idle: _Flavor | None  # the flavor, where free GPUs here are idle (schedulable)
    capacity: list[int] = field(default_factory=lambda: [0, 0])
    cells: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    @property
    def free_category(self) -> str:
        return f"unavailable:{self.unavailable}" if self.unavailable else "idle"


@dataclass(slots=True, eq=False)
class _Node:
    """One node: its group, its allocatable GPUs, what its pods hold by (team, category), and
    how many of those are above its allocatable (`excess`: its capacity is allocatable +
    excess, the GPUs its pods hold when a node NotReady reports none)."""

    group: _Group
    allocatable: int = 0
    used: int = 0
    excess: int = 0
    held: dict[tuple[str, str], int] = field(default_factory=dict)


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
    node (`move`, `transfer`), and each pending demand; integrates, exactly.

    Only what is held and what there is are counted as they change; what is free is derived.
    A group's free GPU-time is its capacity's less what its pods hold, and a flavor's
    no_demand idle time is its idle GPU-time less the three shares demand took. So a pod bound
    anew to a node of the same group (flavor, domain, free category) moves no cell: two
    nodes' counts change, and a cell only where a node's pods cross its allocatable. A
    flavor's shares are split again only when its idle count moves below what demand wants."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}
        self._groups: dict[tuple[str, str, str], _Group] = {}
        self._flavors: dict[str, _Flavor] = {}
        self._demand: dict[Hashable, tuple[str, DemandCause, int]] = {}
        self._seeded: GpuSecondTotals | None = None  # a previous process's totals
        self._latest = 0
        self._unplaced = self._group("", "", "")

    def _node(self, name: str) -> _Node:
        node = self._nodes.get(name)
        if node is None:
            node = self._nodes[name] = _Node(self._unplaced)
        return node

    def _group(self, flavor: str, domain: str, unavailable: str) -> _Group:
        key = (flavor, domain, unavailable)
        group = self._groups.get(key)
        if group is None:
            idle = None if unavailable else self._flavor(flavor)
            group = self._groups[key] = _Group(flavor, domain, unavailable, idle)
        return group

    def _flavor(self, flavor: str) -> _Flavor:
        state = self._flavors.get(flavor)
        if state is None:
            state = self._flavors[flavor] = _Flavor()
        return state

    def _clock(self, now: float) -> int:
        ms = round(now * 1000)
        if ms > self._latest:
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
        node = self._node(name)
        allocatable = max(0, allocatable)
        group = node.group
        if (
            node.allocatable == allocatable
            and group.unavailable == unavailable
            and group.flavor == flavor
            and group.domain == domain
        ):
            return  # as it was (a Node event that moved nothing counted here)
        ms = self._clock(now)
        self._place(node, -1, ms)
        node.group, node.allocatable = self._group(flavor, domain, unavailable), allocatable
        node.excess = max(0, node.used - allocatable)
        self._place(node, 1, ms)

    def remove_node(self, name: str, now: float) -> None:
        """The Node is gone (its pods, should any be left, keep their GPUs counted)."""
        node = self._nodes.get(name)
        if node is None:
            return
        group = node.group
        self.set_node(name, group.flavor, group.domain, 0, "", now)
        if not node.used:
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
        held: the pod came or went)."""
        if old == new or gpus <= 0:
            return
        ms = self._clock(now)
        node = self._node(name)
        if old is not None:
            self._hold(node, old, -gpus, ms)
        if new is not None:
            self._hold(node, new, gpus, ms)
        if old is None or new is None:
            delta = gpus if old is None else -gpus
            node.used += delta
            free = self._reexcess(node, ms) - delta
            if free and node.group.idle is not None:
                self._idle_moved(node.group.idle, free, ms)

    def transfer(
        self, source: str, target: str, slot: tuple[str, str], gpus: int, now_ms: int
    ) -> None:
        """`gpus` held as `slot` go from node `source` to node `target` at `now_ms` (Unix
        milliseconds): `move(source, slot, None)` and `move(target, None, slot)` in one, the
        hot path of a pod bound anew."""
        if gpus <= 0 or source == target:
            return
        if now_ms > self._latest:
            self._latest = now_ms
        ms = self._latest
        nodes = self._nodes
        a = nodes.get(source) or self._node(source)
        b = nodes.get(target) or self._node(target)
        held = a.held
        left = held.get(slot, 0) - gpus
        if left > 0:
            held[slot] = left
        else:
            held.pop(slot, None)
        held = b.held
        held[slot] = held.get(slot, 0) + gpus
        # Each node's free GPUs (capacity - used) anew: its capacity (allocatable + excess)
        # moves only where its pods are or were above its allocatable.
        a.used -= gpus
        b.used += gpus
        free_a = gpus
        if a.excess:
            free_a += self._reexcess(a, ms)
        free_b = -gpus
        if b.used > b.allocatable:  # (as it was, if it had excess before)
            free_b += self._reexcess(b, ms)
        group_a, group_b = a.group, b.group
        idle_a, idle_b = group_a.idle, group_b.idle
        if group_a is not group_b:
            self._hold_cell(group_a, slot, -gpus, ms)
            self._hold_cell(group_b, slot, gpus, ms)
        if idle_a is idle_b:  # one flavor's idle count, or neither node's free GPUs idle
            if idle_a is not None and free_a + free_b:
                self._idle_moved(idle_a, free_a + free_b, ms)
        else:
            if idle_a is not None and free_a:
                self._idle_moved(idle_a, free_a, ms)
            if idle_b is not None and free_b:
                self._idle_moved(idle_b, free_b, ms)

    def set_demand(
        self, key: Hashable, flavor: str, cause: DemandCause, gpus: int, now: float
    ) -> None:
        entry = (flavor, cause, max(0, gpus))
        old = self._demand.get(key)
        if old == entry:
            return
        ms = self._clock(now)
        if old is not None:
            self._add_demand(old, -1, ms)
        self._demand[key] = entry
        self._add_demand(entry, 1, ms)

    def remove_demand(self, key: Hashable, now: float) -> None:
        old = self._demand.pop(key, None)
        if old is not None:
            self._add_demand(old, -1, self._clock(now))

    def totals(self, now: float) -> GpuSecondTotals:
        ms = max(to_ms(now), self._latest)
        capacity: dict[tuple[str, str], int] = {}
        parts: dict[PartKey, int] = {}
        idle: dict[str, int] = {}
        for group in self._groups.values():
            place = (group.flavor, group.domain)
            count, anti = group.capacity
            free = anti + count * ms
            _add(capacity, place, free)
            for (team, category), (count, anti) in group.cells.items():
                value = anti + count * ms
                _add(parts, (*place, team, category), value)
                free -= value
            _add(parts, (*place, "", group.free_category), free)
            if group.idle is not None:
                idle[group.flavor] = idle.get(group.flavor, 0) + free
        reasons: dict[tuple[str, str], int] = {}
        for flavor, state in self._flavors.items():
            left = idle.get(flavor, 0)
            for reason, (count, anti) in zip(IDLE_REASONS[:3], state.cells, strict=True):
                value = anti + count * ms
                _add(reasons, (flavor, reason), value)
                left -= value
            _add(reasons, (flavor, "no_demand"), left)
        seeded = self._seeded
        if seeded is not None:
            for into, done in (
                (capacity, seeded.capacity),
                (parts, seeded.parts),
                (reasons, seeded.idle_reasons),
            ):
                for key, value in done.items():
                    _add(into, key, value)
        return GpuSecondTotals(
            {k: v for k, v in capacity.items() if v},
            {k: v for k, v in parts.items() if v},
            {k: v for k, v in reasons.items() if v},
        )

    def seed(self, totals: GpuSecondTotals) -> None:
        """Go on from a previous process's totals (its time until it stopped)."""
        if self._seeded is not None:
            totals = GpuSecondTotals(
                _summed(self._seeded.capacity, totals.capacity),
                _summed(self._seeded.parts, totals.parts),
                _summed(self._seeded.idle_reasons, totals.idle_reasons),
            )
        self._seeded = totals

    def now_counts(self) -> dict[str, int]:
        """GPUs in each category at this moment."""
        out: dict[str, int] = {}
        for group in self._groups.values():
            free = group.capacity[0]
            for (_, category), (count, _) in group.cells.items():
                out[category] = out.get(category, 0) + count
                free -= count
            out[group.free_category] = out.get(group.free_category, 0) + free
        return {k: v for k, v in out.items() if v}

    # --- bookkeeping ----------------------------------------------------------------------

    def _place(self, node: _Node, sign: int, ms: int) -> None:
        """The node joins (`sign` 1) or leaves (-1) its group: what it holds, its capacity,
        and its free GPUs in its flavor's idle count."""
        group = node.group
        for slot, gpus in node.held.items():
            self._hold_cell(group, slot, sign * gpus, ms)
        capacity = node.allocatable + node.excess
        cell = group.capacity
        cell[0] += sign * capacity
        cell[1] -= sign * capacity * ms
        if group.idle is not None:
            self._idle_moved(group.idle, sign * (capacity - node.used), ms)

    def _hold(self, node: _Node, slot: tuple[str, str], delta: int, ms: int) -> None:
        """The node's pods hold `delta` GPUs more as `slot`."""
        held = node.held
        left = held.get(slot, 0) + delta
        if left > 0:
            held[slot] = left
        else:
            held.pop(slot, None)
        self._hold_cell(node.group, slot, delta, ms)

    @staticmethod
    def _hold_cell(group: _Group, slot: tuple[str, str], delta: int, ms: int) -> None:
        cell = group.cells.get(slot)
        if cell is None:
            cell = group.cells[slot] = [0, 0]
        cell[0] += delta
        cell[1] -= delta * ms

    @staticmethod
    def _reexcess(node: _Node, ms: int) -> int:
        """Its pods' GPUs above its allocatable (its capacity: allocatable + excess) anew;
        returns its capacity's change."""
        excess = node.used - node.allocatable
        if excess < 0:
            excess = 0
        delta = excess - node.excess
        if delta:
            node.excess = excess
            cell = node.group.capacity
            cell[0] += delta
            cell[1] -= delta * ms
        return delta

    @staticmethod
    def _idle_moved(state: _Flavor, delta: int, ms: int) -> None:
        after = state.count + delta
        state.count = after
        if state.low <= after <= state.high:  # one reason takes the move
            cell = state.marginal
            if cell is not None:
                cell[0] += delta
                cell[1] -= delta * ms
        else:
            GpuSecondLedger._resplit(state, ms)

    def _add_demand(self, entry: tuple[str, DemandCause, int], sign: int, ms: int) -> None:
        flavor, cause, gpus = entry
        state = self._flavor(flavor)
        demand = state.demand
        demand[cause] = demand.get(cause, 0) + sign * gpus
        self._resplit(state, ms)

    @staticmethod
    def _resplit(state: _Flavor, ms: int) -> None:
        """The flavor's idle GPUs shared out anew at `ms` (its idle count moved past the stretch
        it was in, or its demand moved), and the stretch its count is in now."""
        count = state.count
        shares = split(count, state.demand)
        for cell, after in zip(state.cells, shares, strict=False):
            delta = after - cell[0]
            if delta:
                cell[0] = after
                cell[1] -= delta * ms
        low = 0
        if count < 0:  # (never: each change is netted before it is told) split at the next
            state.low, state.high, state.marginal = 0, -1, None
            return
        for cell, cause in zip(state.cells, DEMAND_ORDER, strict=True):
            wanted = state.demand.get(cause, 0)
            if wanted > 0:
                if count <= low + wanted:
                    state.low, state.high, state.marginal = low, low + wanted, cell
                    return
                low += wanted
        state.low, state.high, state.marginal = low, _NO_END, None


def _add(into: dict[Any, int], key: Any, value: int) -> None:
    if value:
        into[key] = into.get(key, 0) + value


def _summed(a: Mapping[K, int], b: Mapping[K, int]) -> dict[K, int]:
    out = dict(a)
    for key, value in b.items():
        out[key] = out.get(key, 0) + value
    return out
