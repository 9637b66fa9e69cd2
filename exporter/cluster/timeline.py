"""A workload's timeline, built from the differences between successive versions of it.

Kueue keeps only the latest of each condition, so the history of a workload that was admitted,
preempted and admitted again exists nowhere but in a watcher that saw each change. The first
version seen (after a restart, say) still yields what its conditions remember.

The model keeps every step it saw; `fold_preemptions` is how the timeline is shown: one
preemption reaches a workload as up to five records (Evicted with reason Preempted, Preempted
with the policy reason, the Preempted Event, then, once the pods are gone, QuotaReserved=False
with reason Pending and Requeued with reason Preempted, both carrying the eviction message),
and a reader wants one step that says it once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from exporter.cluster.ledger import SAME_PREEMPTION_WINDOW_S
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
class FoldedStep:
    """A record that `fold_preemptions` merged into a preemption step."""

    step: str
    time: float | None
    reason: str


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    time: float | None
    # created | quota_reserved | admitted | evicted | preempted | requeued | finished | pending
    step: str
    reason: str
    detail: str
    # On a folded preemption step: every record it stands for, in the order they came.
    folded: tuple[FoldedStep, ...] = field(default=())


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


# --- one step per preemption ---------------------------------------------------------------

# A step that starts a new admission cycle: whatever precedes it cannot be the requeue of a
# preemption after it, and what follows cannot belong to a preemption before it.
_CYCLE_BOUNDARY = frozenset({"quota_reserved", "admitted", "finished"})
_CAUSE_SUFFIX = re.compile(r" \(underlying cause: [^()]*\)$")


class _Preemption:
    __slots__ = ("members", "time")

    def __init__(self, first: TimelineEntry) -> None:
        self.time = first.time
        self.members = [first]

    def close_to(self, entry: TimelineEntry) -> bool:
        if self.time is None or entry.time is None:
            return self.time == entry.time
        return abs(entry.time - self.time) <= SAME_PREEMPTION_WINDOW_S

    def messages(self) -> list[str]:
        return [_message_of(m) for m in self.members if m.step in ("evicted", "preempted")]

    def carries_message(self, detail: str) -> bool:
        """Kueue copies the eviction message into QuotaReserved=False and Requeued; the Event
        adds priorities after it, so a prefix match is the same message."""
        return bool(detail) and any(
            m.startswith(detail) or detail.startswith(m) for m in self.messages() if m
        )

    def entry(self) -> TimelineEntry:
        preempted = [m for m in self.members if m.step == "preempted"]
        evicted = [m for m in self.members if m.step == "evicted"]
        if preempted:
            # The Event's message is the condition's with the priorities appended: say the most.
            told = max(preempted, key=lambda m: len(m.detail))
            reason, detail = told.reason, told.detail
        else:
            told = evicted[0]
            cause = _CAUSE_SUFFIX.search(told.detail)
            reason = cause.group(0)[len(" (underlying cause: ") : -1] if cause else told.reason
            detail = _message_of(told)
        times = [m.time for m in self.members if m.step in ("evicted", "preempted")]
        known = [t for t in times if t is not None]
        return TimelineEntry(
            min(known) if known else None,
            "preempted",
            reason,
            detail,
            tuple(FoldedStep(m.step, m.time, m.reason) for m in _in_time_order(self.members)),
        )


def _in_time_order(entries: list[TimelineEntry]) -> list[TimelineEntry]:
    return sorted(entries, key=lambda e: (e.time is None, e.time or 0.0))


def _message_of(entry: TimelineEntry) -> str:
    return _CAUSE_SUFFIX.sub("", entry.detail) if entry.step == "evicted" else entry.detail


def _starts_preemption(entry: TimelineEntry) -> bool:
    return entry.step == "preempted" or (entry.step == "evicted" and entry.reason == "Preempted")


def fold_preemptions(entries: Sequence[TimelineEntry]) -> list[TimelineEntry]:
    """The timeline with each preemption as one `preempted` step, its message said once.

    Kueue's records of one preemption: the scheduler sets Evicted (reason Preempted) and
    Preempted (reason InClusterQueue, InCohortReclamation, InCohortReclaimWhileBorrowing ...)
    with one message and records a Preempted Event whose message adds the priorities; once the
    pods are gone the job reconciler clears the admission, setting QuotaReserved=False (reason
    Pending) and Requeued (reason Preempted), both with the eviction message. Those fold into
    one step, whatever order they arrived in; the step lists them in `folded`. A Pending with
    another message (the scheduler's next attempt) is a step of its own. Records belong to the
    same preemption when no readmission separates them and their evictions are within the
    window the ledger uses to pair a condition with its Event; a second preemption always
    follows a readmission, or failing a record of one, lies further apart in time.
    """
    out: list[TimelineEntry] = []
    cycle: list[TimelineEntry] = []
    for entry in entries:
        if entry.step in _CYCLE_BOUNDARY:
            out.extend(_fold_cycle(cycle))
            cycle = []
            out.append(entry)
        else:
            cycle.append(entry)
    out.extend(_fold_cycle(cycle))
    return out


def _fold_cycle(entries: list[TimelineEntry]) -> list[TimelineEntry]:
    """Fold the preemptions of one admission cycle (no readmission among `entries`)."""
    groups: list[_Preemption] = []
    for entry in entries:
        if _starts_preemption(entry):
            if groups and groups[-1].close_to(entry):
                groups[-1].members.append(entry)
            else:
                groups.append(_Preemption(entry))
    if not groups:
        return list(entries)
    # (entry, 0) keeps its place; (entry, 1) sorts after a preemption at the same time.
    kept: list[tuple[TimelineEntry, int]] = []
    for entry in entries:
        if _starts_preemption(entry):
            continue
        group = _group_before(groups, entry)
        if _follows_from(entry, group):
            group.members.append(entry)
        else:
            later = entry.step in ("pending", "requeued") and _at_or_after(entry, group)
            kept.append((entry, 1 if later else 0))
    kept.extend((g.entry(), 0) for g in groups)
    kept.sort(key=lambda pair: (pair[0].time is None, pair[0].time or 0.0, pair[1]))
    return [entry for entry, _ in kept]


def _follows_from(entry: TimelineEntry, group: _Preemption) -> bool:
    """Whether `entry` is the requeue that ends `group`: Requeued carries the eviction's reason
    (Preempted), QuotaReserved=False/Pending its message."""
    if entry.step == "requeued":
        return entry.reason == "Preempted" or group.carries_message(entry.detail)
    return entry.step == "pending" and group.carries_message(entry.detail)


def _group_before(groups: list[_Preemption], entry: TimelineEntry) -> _Preemption:
    """The latest preemption that began no later than `entry`, else the first."""
    chosen = groups[0]
    for group in groups:
        if _at_or_after(entry, group):
            chosen = group
    return chosen


def _at_or_after(entry: TimelineEntry, group: _Preemption) -> bool:
    if entry.time is None:
        return True
    return group.time is not None and entry.time >= group.time
