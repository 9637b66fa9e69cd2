"""The quota each ClusterQueue's workloads hold, as the model saw it, at any recent moment.

Kueue charges a workload's quota from the moment it reserves quota (condition QuotaReserved
True, status.admission written) until it gives it back (QuotaReserved False on eviction or
requeue, Finished True, or the Workload's deletion): clusterqueue.go `updateWorkloadUsage`
adds every workload holding a reservation, admitted or not. A ClusterQueue's status says the
same, but later, and at whatever moment its own update reaches the informer; judging a
preemption from it makes the verdict depend on which informer spoke first. The book keeps each
reservation's interval from the Workload objects themselves, so the usage at a past moment
(`usage_at`) is the same whatever order the events arrived in.

Kueue clears status.admission on eviction, so what a workload held is remembered from when it
held it; released reservations are kept for `memory_s` seconds (a preemption is judged within
a couple of minutes of happening, see preemptions.VERDICT_FRESHNESS_S).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from exporter.cluster.objects import PODS_RESOURCE, Workload

FlavorResource = tuple[str, str]
WorkloadKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Reservation:
    """Quota one workload held in one ClusterQueue from `since` until `until` (None: still)."""

    cluster_queue: str
    usage: tuple[tuple[FlavorResource, int], ...]
    since: float | None  # None when the condition carried no time: held since before we know
    until: float | None = None
    # The Workload as last seen holding it: its topology assignment (status.admission's
    # podSetAssignments, cleared by Kueue on eviction) and pod sets, for TAS usage at a past
    # moment. Not part of the reservation's identity.
    workload: Workload | None = field(default=None, compare=False)
    # The order its release arrived in (1, 2, ...; 0 while held): the Workload watch keeps the
    # order of writes, so of two releases in the same second the lower was written first.
    seq: int = field(default=0, compare=False)

    def holds_at(self, time: float) -> bool:
        """Held at `time`: reserved at or before it and not released before it. A workload
        released in the same second as a preemption still held its quota when Kueue decided
        (Kueue's timestamps are whole seconds; the eviction is what the preemption caused)."""
        started = self.since is None or self.since <= time
        return started and (self.until is None or self.until >= time)


def reserved_usage(workload: Workload) -> tuple[tuple[FlavorResource, int], ...]:
    """What the workload's admission charges, per (flavor, resource), every resource.

    Per pod set assignment (status.admission.podSetAssignments): each resource its `flavors`
    map names is charged in that flavor, by the assignment's `resourceUsage` (Kueue writes the
    pod set's total there, workload.go `NewInfo` reads it back) or, when absent (an older
    Kueue), the spec's per-pod request times the assignment's count; `pods` is the count
    itself (flavorassigner.go adds it when the ClusterQueue covers pods)."""
    totals: dict[FlavorResource, int] = {}
    for placement in workload.placements:
        written = dict(placement.usage)
        asked: dict[str, int] | None = None
        for resource, flavor in placement.flavors:
            if resource in written:
                amount = written[resource]
            elif resource == PODS_RESOURCE:
                amount = placement.count
            else:
                if asked is None:
                    pod_set = next((p for p in workload.pod_sets if p.name == placement.name), None)
                    asked = dict(pod_set.per_pod) if pod_set is not None else {}
                amount = asked.get(resource, 0) * placement.count
            if amount <= 0:
                continue
            key = (flavor, resource)
            totals[key] = totals.get(key, 0) + amount
    return tuple(sorted(totals.items()))


def _holding(workload: Workload) -> bool:
    return (
        workload.is_true("QuotaReserved")
        and bool(workload.cluster_queue)
        and not workload.is_true("Finished")
    )


def _release_time(workload: Workload, now: float) -> float:
    """When the workload gave its quota back: the condition that says so, else `now`."""
    for type_, status in (("Finished", "True"), ("QuotaReserved", "False"), ("Evicted", "True")):
        cond = workload.condition(type_)
        if cond is not None and cond.status == status and cond.last_transition is not None:
            return cond.last_transition
    return now


class ReservationBook:
    """Reservations by workload, current and recently released."""

    def __init__(self, memory_s: float = 300.0) -> None:
        self.memory_s = memory_s
        self._held: dict[WorkloadKey, Reservation] = {}
        self._released: deque[tuple[float, WorkloadKey, Reservation]] = deque()
        self.epoch = 0  # moves whenever current usage may have changed
        self._seq = 0  # releases so far

    def observe(self, workload: Workload, now: float) -> None:
        """A Workload as it is now: start, keep, or end its reservation."""
        key = workload.key
        current = self._held.get(key)
        if _holding(workload):
            cond = workload.condition("QuotaReserved")
            since = cond.last_transition if cond is not None else None
            usage = reserved_usage(workload)
            fresh = Reservation(workload.cluster_queue, usage, since, workload=workload)
            if current != fresh:
                if current is not None and current.since != since:
                    self._release(key, current, since if since is not None else now)
                self.epoch += 1
            self._held[key] = fresh  # the latest object, its assignment with it
        elif current is not None:
            self._release(key, current, _release_time(workload, now))
        self._expire(now)

    def forget(self, key: WorkloadKey, now: float) -> None:
        """The Workload was deleted: whatever it held is released now."""
        current = self._held.get(key)
        if current is not None:
            self._release(key, current, now)
        self._expire(now)

    def _release(self, key: WorkloadKey, reservation: Reservation, until: float) -> None:
        del self._held[key]
        since = reservation.since
        if since is not None and until < since:
            until = since
        self._seq += 1
        ended = Reservation(
            reservation.cluster_queue,
            reservation.usage,
            since,
            until,
            reservation.workload,
            self._seq,
        )
        self._released.append((until, key, ended))
        self.epoch += 1

    def _expire(self, now: float) -> None:
        while self._released and now - self._released[0][0] > self.memory_s:
            self._released.popleft()

    def usage_now(self) -> dict[str, dict[FlavorResource, int]]:
        """Quota held right now, per ClusterQueue and (flavor, resource)."""
        return _sum(self._held.values())

    def usage_at(
        self, time: float, exclude: Iterable[WorkloadKey] = (), written_before: int | None = None
    ) -> dict[str, dict[FlavorResource, int]]:
        """Quota held at `time`, leaving out `exclude` (the preemptor being judged: it reserves
        in the same second its victims release, and its reservation is the consequence) and
        what `held_at` leaves out for `written_before`."""
        return _sum(self.held_at(time, exclude, written_before))

    def held_at(
        self, time: float, exclude: Iterable[WorkloadKey] = (), written_before: int | None = None
    ) -> list[Reservation]:
        """The reservations held at `time` (current and released since), `exclude` aside.

        `written_before`: the release order of a preemption's first victim (`release_seq`).
        A reservation released in the same second as the preemption but written before that
        victim's eviction (a workload that finished, or that an AdmissionCheck's Retry
        evicted, ahead of the scheduling cycle) was gone when Kueue decided: Kueue writes the
        cycle's evictions after the Workload updates that came before the cycle, and one
        Workload watch keeps that order."""
        skip = set(exclude)
        held = [r for k, r in self._held.items() if k not in skip and r.holds_at(time)]
        for _, k, r in self._released:
            if k in skip or not r.holds_at(time):
                continue
            if written_before is not None and r.until == time and r.seq < written_before:
                continue
            held.append(r)
        return held

    @property
    def next_seq(self) -> int:
        """The order the next release will have."""
        return self._seq + 1

    def release_seq(self, key: WorkloadKey, time: float) -> int | None:
        """The release order of `key`'s reservation released at `time`, if one arrived."""
        for _, k, r in reversed(self._released):
            if k == key and r.until == time:
                return r.seq
        return None


def _sum(reservations: Iterable[Reservation]) -> dict[str, dict[FlavorResource, int]]:
    out: dict[str, dict[FlavorResource, int]] = {}
    for reservation in reservations:
        queue = out.setdefault(reservation.cluster_queue, {})
        for fr, amount in reservation.usage:
            queue[fr] = queue.get(fr, 0) + amount
    return out
