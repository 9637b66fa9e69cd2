"""The preemption ledger: every victim paired with its preemptor, bounded in memory.

One preemption reaches us up to three times: as the victim's `Preempted` (or `Evicted`)
condition, as a `Preempted` Event, and again after a restart from whichever of those is still
present. Entries are merged when the same victim names the same preemptor within a few
seconds, so each preemption is counted once however many copies arrive.

Each entry says how it was `observed`: "live" when this process saw it happen, "history" when
it was rebuilt from what was already there (a restart, a dump). Both are listed; only live
ones move `topowatch_preemptions_total` (the rule is `ClusterModel.observed_live`). A merge is
live when either copy is.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Literal, TypeVar

# One rule for the ledger and the history store (re-exported for the timeline).
from exporter.store.records import SAME_PREEMPTION_WINDOW_S as SAME_PREEMPTION_WINDOW_S

K = TypeVar("K")
Verdict = Literal["quota", "topology", "unknown"]
Observed = Literal["live", "history"]


@dataclass(frozen=True, slots=True)
class PreemptionRecord:
    time: float
    victim_namespace: str
    victim_name: str
    victim_uid: str
    victim_cluster_queue: str
    victim_priority: int | None
    preemptor_uid: str
    preemptor_job_uid: str
    preemptor_namespace: str  # "" until the preemptor is resolved
    preemptor_name: str
    preemptor_cluster_queue: str
    preemptor_priority: int | None
    reason: str  # InClusterQueue | InCohortReclamation | ... | Unknown
    gpus_freed: int
    verdict: Verdict
    verdict_detail: str  # one sentence a person can read
    message: str
    source: str  # "condition" | "event"
    observed: Observed = "live"  # "history": rebuilt from what was already there, not counted
    # For a quota verdict: the resource whose quota was short (the first, maximum capacity
    # before unused quota), and the flavor; "" otherwise.
    resource: str = ""
    flavor: str = ""

    @property
    def victim(self) -> str:
        return f"{self.victim_namespace}/{self.victim_name}"

    @property
    def preemptor(self) -> str:
        if self.preemptor_name:
            return f"{self.preemptor_namespace}/{self.preemptor_name}"
        return f"uid:{self.preemptor_uid}" if self.preemptor_uid else "unknown"


class PreemptionLedger:
    """Bounded, time-ordered-by-arrival records with per-victim and per-preemptor indexes.

    When full, the oldest entry by arrival goes; `dropped` counts them for a metric.
    """

    def __init__(self, capacity: int = 10_000) -> None:
        if capacity < 1:
            raise ValueError("ledger capacity must be at least 1")
        self.capacity = capacity
        self.dropped = 0
        self._records: OrderedDict[int, PreemptionRecord] = OrderedDict()
        self._by_victim: dict[tuple[str, str], list[int]] = {}
        self._by_preemptor_uid: dict[str, list[int]] = {}
        self._next_id = 0
        # Told of every entry added or changed, by id (the history feed marks it for writing).
        self.on_change: Callable[[int], None] | None = None

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[PreemptionRecord]:
        return iter(self._records.values())

    def record(self, entry: PreemptionRecord) -> tuple[int, bool]:
        """Add `entry`, or fold it into the same preemption already known.

        Returns the entry's id and whether it is new."""
        victim = (entry.victim_namespace, entry.victim_name)
        for rid in self._by_victim.get(victim, ()):
            known = self._records[rid]
            if _same_preemption(known, entry):
                self._records[rid] = _merge(known, entry)
                if self.on_change is not None:
                    self.on_change(rid)
                return rid, False
        rid = self._next_id
        self._next_id += 1
        self._records[rid] = entry
        self._by_victim.setdefault(victim, []).append(rid)
        if entry.preemptor_uid:
            self._by_preemptor_uid.setdefault(entry.preemptor_uid, []).append(rid)
        while len(self._records) > self.capacity:
            self._evict_oldest()
        if self.on_change is not None:
            self.on_change(rid)
        return rid, True

    def items(self) -> Iterator[tuple[int, PreemptionRecord]]:
        """(id, entry) in arrival order."""
        return iter(self._records.items())

    def get(self, rid: int) -> PreemptionRecord | None:
        return self._records.get(rid)

    def update(self, rid: int, entry: PreemptionRecord) -> None:
        """Replace a known entry (same victim and preemptor UID); ignored once evicted."""
        if rid in self._records:
            self._records[rid] = entry
            if self.on_change is not None:
                self.on_change(rid)

    def suffered_by(self, namespace: str, name: str) -> list[PreemptionRecord]:
        return [self._records[rid] for rid in self._by_victim.get((namespace, name), ())]

    def caused_by(self, uid: str) -> list[PreemptionRecord]:
        return [self._records[rid] for rid in self._by_preemptor_uid.get(uid, ())]

    def since(self, t: float) -> list[PreemptionRecord]:
        return sorted((r for r in self._records.values() if r.time >= t), key=lambda r: r.time)

    def _evict_oldest(self) -> None:
        rid, old = self._records.popitem(last=False)
        self.dropped += 1
        _remove(self._by_victim, (old.victim_namespace, old.victim_name), rid)
        if old.preemptor_uid:
            _remove(self._by_preemptor_uid, old.preemptor_uid, rid)


def _remove(index: dict[K, list[int]], key: K, rid: int) -> None:
    ids = index.get(key)
    if ids is None:
        return
    ids.remove(rid)
    if not ids:
        del index[key]


def _same_preemption(a: PreemptionRecord, b: PreemptionRecord) -> bool:
    if a.preemptor_uid and b.preemptor_uid and a.preemptor_uid != b.preemptor_uid:
        return False
    return abs(a.time - b.time) <= SAME_PREEMPTION_WINDOW_S


def _merge(known: PreemptionRecord, new: PreemptionRecord) -> PreemptionRecord:
    """Keep the earliest time and the first verdict; fill whatever the first copy lacked."""
    return replace(
        known,
        time=min(known.time, new.time),
        victim_uid=known.victim_uid or new.victim_uid,
        victim_cluster_queue=known.victim_cluster_queue or new.victim_cluster_queue,
        victim_priority=(
            known.victim_priority if known.victim_priority is not None else new.victim_priority
        ),
        preemptor_uid=known.preemptor_uid or new.preemptor_uid,
        preemptor_job_uid=known.preemptor_job_uid or new.preemptor_job_uid,
        preemptor_namespace=known.preemptor_namespace or new.preemptor_namespace,
        preemptor_name=known.preemptor_name or new.preemptor_name,
        preemptor_cluster_queue=known.preemptor_cluster_queue or new.preemptor_cluster_queue,
        preemptor_priority=(
            known.preemptor_priority
            if known.preemptor_priority is not None
            else new.preemptor_priority
        ),
        reason=known.reason if known.reason != "Unknown" else new.reason,
        gpus_freed=known.gpus_freed or new.gpus_freed,
        verdict=known.verdict if known.verdict != "unknown" else new.verdict,
        verdict_detail=known.verdict_detail if known.verdict != "unknown" else new.verdict_detail,
        resource=known.resource if known.verdict != "unknown" else new.resource,
        flavor=known.flavor if known.verdict != "unknown" else new.flavor,
        observed="live" if "live" in (known.observed, new.observed) else "history",
    )
