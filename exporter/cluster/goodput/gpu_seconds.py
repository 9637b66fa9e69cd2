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

Lazily, by the millisecond: a pod's move or a node's change only updates that node's own
counts; what the node counts for is settled (diffed against what it was counted for) when time
moves on, or when something reads the totals. Changes within one millisecond last no time, so
this is exact; a burst within a millisecond costs one settle per node it touched, and a read
settles what is pending. A flavor's idle split is redone when its idle count or its demand
changes.
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
_UNSPLIT: Final = (0, 0, 0, 0)  # a flavor's shares before its first split
K = TypeVar("K", bound=Hashable)
PartKey = tuple[str, str, str, str]  # (flavor, domain, team, category)


def to_ms(now: float) -> int:
    return round(now * 1000)


class ExactIntegrator(Generic[K]):
    """Integer count x integer milliseconds, per key, exactly.

    Each key holds one cell, [count, anti]: a change of `delta` at `ms` adds `delta` to the
    count and takes `delta * ms` from `anti`, so the integral up to `now_ms` is
    `anti + count * now_ms` (the pieces telescope). An update is two integer operations on a
    list the caller may keep (`cell`): the GPU-second ledger keeps each node's cells, so a
    pod's move builds no key. Times must not go backwards (the callers' clocks never do:
    a time before the latest is taken as the latest)."""

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

    def counts(self) -> dict[K, int]:
        return {k: v[0] for k, v in self._state.items() if v[0]}

    def seed(self, done: Mapping[K, int]) -> None:
        """Start from totals a previous process wrote (a restart keeps the ledger)."""
        for key, value in done.items():
            self.cell(key)[1] += int(value)


@dataclass(slots=True)
class _Node:
    """One node: where it counts, its allocatable GPUs, why its free GPUs are unavailable,
    what its pods hold by (team, category) now (counted as they move); and what its capacity
    and free GPUs are counted for, as of the moment it was last settled."""

    flavor: str = ""
    domain: str = ""
    allocatable: int = 0
    unavailable: str = ""
    held: dict[tuple[str, str], int] = field(default_factory=dict)
    used: int = 0
    # The cells of its place by slot (`ExactIntegrator.cell`), shared by the nodes of one
    # (flavor, domain); its capacity and free cells (None: to be looked up, its place or
    # free category changed).
    cells: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    cap_cell: list[int] | None = None
    free_cell: list[int] | None = None
    dirty: bool = False  # its capacity or free GPUs may have moved since it was settled
    # Counted for, as of its last settle:
    given_cap_cell: list[int] | None = None
    given_capacity: int = 0
    given_free_cell: list[int] | None = None
    given_free: int = 0
    given_flavor: str = ""
    given_idle: int = 0  # its free GPUs counted in its flavor's idle count

    @property
    def capacity(self) -> int:
        return max(self.allocatable, self.used)

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
    node (`move`, `transfer`), and each pending demand; integrates, exactly.

    What pods hold is counted as it moves (two integer operations on a cell the node keeps).
    A node's capacity and free GPUs, which every such move changes, are settled by the
    millisecond: a move marks the node, and a marked node's capacity, free and idle counts
    are brought up to date once, when time moves on or something reads the ledger. Changes
    within one millisecond last no time, so this is exact; a burst of pod moves within a
    millisecond (a re-list, a gang) settles each node it touched once."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}
        self._parts: ExactIntegrator[PartKey] = ExactIntegrator()
        self._capacity: ExactIntegrator[tuple[str, str]] = ExactIntegrator()
        self._reasons: ExactIntegrator[tuple[str, str]] = ExactIntegrator()
        self._idle: dict[str, int] = {}  # schedulable free GPUs by flavor
        self._demand: dict[Hashable, tuple[str, DemandCause, int]] = {}
        self._demand_by_flavor: dict[str, dict[str, int]] = {}
        self._split: dict[str, tuple[int, int, int, int]] = {}
        self._reason_cells: dict[str, tuple[list[int], ...]] = {}  # by IDLE_REASONS
        self._split_idle: dict[str, int] = {}  # the idle count each flavor was last split at
        self._unsplit: set[str] = set()  # flavors whose idle count moved since then
        self._dirty: list[_Node] = []  # nodes marked since they were last settled
        self._place_cells: dict[tuple[str, str], dict[tuple[str, str], list[int]]] = {}
        self._latest = 0

    def _node(self, name: str) -> _Node:
        node = self._nodes.get(name)
        if node is None:
            node = self._nodes[name] = _Node(cells=self._cells_of(("", "")))
        return node

    def _cells_of(self, place: tuple[str, str]) -> dict[tuple[str, str], list[int]]:
        cells = self._place_cells.get(place)
        if cells is None:
            cells = self._place_cells[place] = {}
        return cells

    def _clock(self, now: float) -> int:
        ms = round(now * 1000)
        if ms > self._latest:
            self.flush()  # what changed at the moment before is settled at that moment
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
        if (
            node.flavor == flavor
            and node.domain == domain
            and node.allocatable == allocatable
            and node.unavailable == unavailable
        ):
            return
        ms = self._clock(now)
        if node.flavor != flavor or node.domain != domain:
            # Another place: what its pods hold counts there from now on.
            cells = self._cells_of((flavor, domain))
            for slot, n in node.held.items():
                cell = node.cells.get(slot)
                if cell is None:
                    cell = node.cells[slot] = self._parts.cell((node.flavor, node.domain, *slot))
                cell[0] -= n
                cell[1] += n * ms
                cell = cells.get(slot)
                if cell is None:
                    cell = cells[slot] = self._parts.cell((flavor, domain, *slot))
                cell[0] += n
                cell[1] -= n * ms
            node.cells = cells
            node.cap_cell = None
        node.free_cell = None
        node.flavor, node.domain, node.allocatable, node.unavailable = (
            flavor,
            domain,
            allocatable,
            unavailable,
        )
        self._mark(node)

    def remove_node(self, name: str, now: float) -> None:
        """The Node is gone (its pods, should any be left, keep their GPUs counted)."""
        node = self._nodes.get(name)
        if node is None:
            return
        ms = self._clock(now)
        if node.unavailable:
            node.free_cell = None
        node.allocatable, node.unavailable = 0, ""
        self._settle(node, ms)
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
            node.used += gpus if old is None else -gpus
            self._mark(node)

    def transfer(
        self, source: str, target: str, slot: tuple[str, str], gpus: int, now_ms: int
    ) -> None:
        """`gpus` held as `slot` go from node `source` to node `target` at `now_ms` (Unix
        milliseconds): `move(source, slot, None)` and `move(target, None, slot)` in one, the
        hot path of a pod bound anew."""
        if gpus <= 0 or source == target:
            return
        if now_ms > self._latest:
            self.flush()
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
        cells = a.cells
        if cells is not b.cells:  # another (flavor, domain)
            cell = cells.get(slot)
            if cell is None:
                cell = cells[slot] = self._parts.cell((a.flavor, a.domain, *slot))
            cell[0] -= gpus
            cell[1] += gpus * ms
            cells = b.cells
            cell = cells.get(slot)
            if cell is None:
                cell = cells[slot] = self._parts.cell((b.flavor, b.domain, *slot))
            cell[0] += gpus
            cell[1] -= gpus * ms
        a.used -= gpus
        b.used += gpus
        idle_a = self._used_moved(a, ms)
        idle_b = self._used_moved(b, ms)
        if a.flavor == b.flavor:
            if idle_a + idle_b:
                self._idle_moved(a.flavor, idle_a + idle_b)
        else:
            if idle_a:
                self._idle_moved(a.flavor, idle_a)
            if idle_b:
                self._idle_moved(b.flavor, idle_b)

    def _used_moved(self, node: _Node, ms: int) -> int:
        """Only the GPUs the node's pods use moved: settled at once where its cells are current
        (the common case: `_count`, the same cells and counts `_settle` would reach at this
        moment), else marked (and 0 returned). Its change of idle GPUs."""
        if node.dirty or node.free_cell is None:
            self._mark(node)
            return 0
        return self._count(node, ms)

    def flush(self) -> None:
        """Settle what changed at the latest moment, at that moment: the marked nodes, then
        the idle split of the flavors whose idle count moved (every reader calls it)."""
        dirty = self._dirty
        if dirty:
            ms = self._latest
            for node in dirty:
                if node.dirty:
                    self._settle(node, ms)
            dirty.clear()
        unsplit = self._unsplit
        if unsplit:
            for flavor in unsplit:  # each its own keys: the order makes no difference
                if self._idle.get(flavor, 0) != self._split_idle.get(flavor):
                    self._resplit(flavor, self._latest)
            unsplit.clear()

    def set_demand(
        self, key: Hashable, flavor: str, cause: DemandCause, gpus: int, now: float
    ) -> None:
        entry = (flavor, cause, max(0, gpus))
        old = self._demand.get(key)
        if old == entry:
            return
        ms = self._clock(now)
        self.flush()  # the idle counts as they are at this moment
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
            ms = self._clock(now)
            self.flush()  # the idle counts as they are at this moment
            self._add_demand(old, -1)
            self._resplit(old[0], ms)

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
        self.flush()
        out: dict[str, int] = {}
        for key, n in self._parts.counts().items():
            out[key[3]] = out.get(key[3], 0) + n
        return out

    # --- bookkeeping ----------------------------------------------------------------------

    def _mark(self, node: _Node) -> None:
        if not node.dirty:
            node.dirty = True
            self._dirty.append(node)

    def _hold(self, node: _Node, slot: tuple[str, str], delta: int, ms: int) -> None:
        """The node's pods hold `delta` GPUs more as `slot`."""
        held = node.held
        left = held.get(slot, 0) + delta
        if left > 0:
            held[slot] = left
        else:
            held.pop(slot, None)
        cell = node.cells.get(slot)
        if cell is None:
            cell = node.cells[slot] = self._parts.cell((node.flavor, node.domain, *slot))
        cell[0] += delta
        cell[1] -= delta * ms

    def _settle(self, node: _Node, ms: int) -> None:
        """Count the node's capacity and free GPUs for what they are now, from `ms` on: first
        where they count (its place and free category may have moved: what it gave to its old
        cells goes, its cells start from nothing), then how many."""
        node.dirty = False
        cell = node.cap_cell
        if cell is None:
            cell = node.cap_cell = self._capacity.cell((node.flavor, node.domain))
        if cell is not node.given_cap_cell:
            _take(node.given_cap_cell, node.given_capacity, ms)
            node.given_cap_cell, node.given_capacity = cell, 0
        cell = node.free_cell
        if cell is None:
            key = (node.flavor, node.domain, "", node.free_category)
            cell = node.free_cell = self._parts.cell(key)
        if cell is not node.given_free_cell:
            _take(node.given_free_cell, node.given_free, ms)
            node.given_free_cell, node.given_free = cell, 0
        if node.flavor != node.given_flavor:
            if node.given_idle:
                self._idle_moved(node.given_flavor, -node.given_idle)
            node.given_flavor, node.given_idle = node.flavor, 0
        idle = self._count(node, ms)
        if idle:
            self._idle_moved(node.flavor, idle)

    @staticmethod
    def _count(node: _Node, ms: int) -> int:
        """The node's capacity (its pods may hold more than its allocatable GPUs) and free
        GPUs moved into its current cells at `ms`; returns the change of its idle GPUs (free
        and available) for its flavor's count."""
        used = node.used
        allocatable = node.allocatable
        capacity = allocatable if allocatable > used else used
        delta = capacity - node.given_capacity
        if delta:
            cell = node.cap_cell
            assert cell is not None  # set by every settle
            cell[0] += delta
            cell[1] -= delta * ms
            node.given_capacity = capacity
        free = capacity - used
        delta = free - node.given_free
        if delta:
            cell = node.free_cell
            assert cell is not None
            cell[0] += delta
            cell[1] -= delta * ms
            node.given_free = free
        idle = 0 if node.unavailable else free  # (its old idle may be elsewhere: a re-home)
        delta = idle - node.given_idle
        node.given_idle = idle
        return delta

    def _idle_moved(self, flavor: str, delta: int) -> None:
        self._idle[flavor] = self._idle.get(flavor, 0) + delta
        self._unsplit.add(flavor)

    def _add_demand(self, entry: tuple[str, DemandCause, int], sign: int) -> None:
        flavor, cause, gpus = entry
        per = self._demand_by_flavor.setdefault(flavor, {})
        per[cause] = per.get(cause, 0) + sign * gpus

    def _resplit(self, flavor: str, ms: int) -> None:
        """The flavor's idle GPUs shared out anew at `ms` (each time its idle count moved,
        once per millisecond: the cells of its four reasons are kept, not looked up)."""
        idle = self._idle.get(flavor, 0)
        self._split_idle[flavor] = idle
        demand = self._demand_by_flavor.get(flavor)
        shares = split(idle, demand) if demand else (0, 0, 0, idle if idle > 0 else 0)
        old = self._split.get(flavor, _UNSPLIT)
        if shares == old:
            return
        cells = self._reason_cells.get(flavor)
        if cells is None:
            cells = self._reason_cells[flavor] = tuple(
                self._reasons.cell((flavor, reason)) for reason in IDLE_REASONS
            )
        for cell, before, after in zip(cells, old, shares, strict=True):
            if after != before:
                delta = after - before
                cell[0] += delta
                cell[1] -= delta * ms
        self._split[flavor] = shares


def _take(cell: list[int] | None, count: int, ms: int) -> None:
    """`count` leaves `cell` at `ms` (nothing when there is no cell or no count)."""
    if cell is not None and count:
        cell[0] -= count
        cell[1] += count * ms
