"""A workload's timeline, built from the differences between successive versions of it.

Kueue keeps only the latest of each condition, so the history of a workload that was admitted,
preempted and admitted again exists nowhere but in a watcher that saw each change. The first
version seen (after a restart, say) still yields what its conditions remember.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.cluster.objects import Condition, Workload

# Condition type -> timeline step, for conditions that mark a step when they turn True.
_STEPS = {
    "QuotaReserved": "quota_reserved",
    "Admitted": "admitted",
    "Evicted": "evicted",
    "Preempted": "preempted",
    "Requeued": "requeued",
    "Finished": "finished",
}
_DEACTIVATED_PREFIX = "DeactivatedDueTo"


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    time: float | None
    # created | quota_reserved | admitted | evicted | preempted | requeued | finished | pending
    step: str
    reason: str
    detail: str


def underlying_cause(workload: Workload) -> str:
    """Why an eviction happened beneath its reason, the way Kueue's metrics label it."""
    evicted = workload.condition("Evicted")
    if evicted is None or evicted.status != "True":
        return ""
    if evicted.reason == "Preempted":
        preempted = workload.condition("Preempted")
        return preempted.reason if preempted is not None else ""
    if evicted.reason.startswith(_DEACTIVATED_PREFIX):
        return evicted.reason[len(_DEACTIVATED_PREFIX) :]
    return ""


def timeline_changes(old: Workload | None, new: Workload) -> list[TimelineEntry]:
    """The steps `new` shows that `old` did not, oldest first."""
    entries: list[TimelineEntry] = []
    if old is None:
        entries.append(TimelineEntry(new.created, "created", "", ""))
    before = {c.type: c for c in old.conditions} if old is not None else {}
    for cond in new.conditions:
        previous = before.get(cond.type)
        if previous is not None and _same(previous, cond):
            continue
        entry = _entry_for(cond, new)
        if entry is not None:
            entries.append(entry)
    entries.sort(key=lambda e: (e.time is None, e.time or 0.0))
    return entries


def _same(a: Condition, b: Condition) -> bool:
    return a.status == b.status and a.reason == b.reason and a.last_transition == b.last_transition


def _entry_for(cond: Condition, workload: Workload) -> TimelineEntry | None:
    if cond.type == "QuotaReserved" and cond.status == "False" and cond.reason:
        return TimelineEntry(cond.last_transition, "pending", cond.reason, cond.message)
    step = _STEPS.get(cond.type)
    if step is None or cond.status != "True":
        return None
    detail = cond.message
    if step == "evicted":
        cause = underlying_cause(workload)
        if cause:
            detail = f"{detail} (underlying cause: {cause})" if detail else cause
    return TimelineEntry(cond.last_transition, step, cond.reason, detail)
