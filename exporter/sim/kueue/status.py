"""How Kueue changes a Workload's status at each step of its life, and the texts it writes.

Reasons and messages are Kueue's own (workload.go SetQuotaReservation, preemption.go,
evict.go, the job reconciler's requeue after eviction, the scheduler's Pending status and
events), so a condition or Event from the simulation reads like one from a real cluster.
These functions change a `SimWorkload` record only; writing it is the caller's business.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from exporter.sim.kueue import checks
from exporter.sim.kueue.objects import SimWorkload, admission_manifest, rfc3339, set_condition
from exporter.sim.kueue.scheduler import PreemptionReason

HUMAN_REASON: dict[PreemptionReason, str] = {  # preemption.go HumanReadablePreemptionReasons
    "InClusterQueue": "prioritization in the ClusterQueue",
    "InCohortReclamation": "reclamation within the cohort",
    "InCohortReclaimWhileBorrowing": "reclamation within the cohort while borrowing",
}
NO_RESERVATION = "The workload has no reservation"


def preemption_message(
    preemptor_uid: str, preemptor_job_uid: str, reason: PreemptionReason, paths: tuple[str, str]
) -> str:
    """Kueue >= v0.15's message on the victim's Evicted and Preempted conditions."""
    return (
        f"Preempted to accommodate a workload (UID: {preemptor_uid}, JobUID: {preemptor_job_uid})"
        f" due to {HUMAN_REASON[reason]}; preemptor path: {paths[0]}; preemptee path: {paths[1]}"
    )


def priority_note(preemptor: int, preemptee: int) -> str:
    """The suffix Kueue adds to the `Preempted` Event's message (not to the condition)."""
    return (
        f"; preemptor effective priority: {preemptor} (base: {preemptor}, boost: 0)"
        f"; preemptee effective priority: {preemptee} (base: {preemptee}, boost: 0)"
    )


def preempted_workload_note(victim: SimWorkload, note: str) -> str:
    """The `PreemptedWorkload` Event Kueue records on the preemptor."""
    return (
        f"Preempted workload {victim.namespace}/{victim.name} (UID: {victim.uid}) "
        f"in ClusterQueue {victim.cluster_queue}{note}"
    )


def quota_reserved_note(cluster_queue: str, waited: float) -> str:
    return (
        f"Quota reserved in ClusterQueue {cluster_queue}, wait time since queued was {waited:.0f}s"
    )


def admitted_note(cluster_queue: str, waited: float = 0.0) -> str:
    return (
        f"Admitted by ClusterQueue {cluster_queue}, wait time since reservation was {waited:.0f}s"
    )


def mark_pending(w: SimWorkload, message: str, now: float, reason: str = "Pending") -> None:
    """The scheduler could not admit `w`: QuotaReserved=False/Pending with the reason (or,
    for a queue blocker such as an inactive ClusterQueue, reason Inadmissible: the workload
    controller's resolveLegacyUnadmittedQuotaReservedCondition)."""
    w.evaluated = True
    set_condition(w.conditions, "QuotaReserved", "False", reason, message, now)


def mark_reserved(
    w: SimWorkload,
    placement: Sequence[tuple[str, int]],
    now: float,
    placements: Mapping[str, Sequence[tuple[str, int]]] | None = None,
) -> None:
    """Quota reserved with admission checks not all Ready: QuotaReserved=True and
    Admitted=False/UnsatisfiedChecks (scheduler.go prepareWorkload, SyncAdmittedCondition);
    a past eviction is kept as "Previously: ..."."""
    _reserve(w, placement, now, placements)
    set_condition(
        w.conditions,
        "Admitted",
        "False",
        checks.UNSATISFIED_CHECKS,
        checks.UNSATISFIED_MESSAGE,
        now,
    )


def mark_checks_ready(w: SimWorkload, now: float) -> None:
    """Every check Ready: SyncAdmittedCondition sets Admitted=True."""
    set_condition(w.conditions, "Admitted", "True", "Admitted", "The workload is admitted", now)


def mark_check_evicted(w: SimWorkload, reason: str, message: str, now: float) -> None:
    """Kueue evicts `w` for its checks (evict.go prepareForEviction: Evicted, checks reset to
    Pending), the Job stops and the job reconciler releases the quota (reconciler.go
    "handle eviction": Requeued=False with the eviction's reason, QuotaReserved=False,
    Admitted=False/NoReservation). `reason`: AdmissionCheck (a Retry) or
    DeactivatedDueToAdmissionCheck (a Rejected)."""
    stamp = rfc3339(now)
    set_condition(w.conditions, "Evicted", "True", reason, message, now)
    w.checks = checks.reset_on_eviction(w.checks, stamp)
    key = (
        (checks.DEACTIVATED, checks.EVICTED_BY_CHECK)
        if reason == checks.DEACTIVATED_BY_CHECK
        else (checks.EVICTED_BY_CHECK, "")
    )
    w.other_evictions[key] = w.other_evictions.get(key, 0) + 1
    set_condition(w.conditions, "Requeued", "False", reason, message, now)
    set_condition(w.conditions, "QuotaReserved", "False", "Pending", message, now)
    set_condition(w.conditions, "Admitted", "False", "NoReservation", NO_RESERVATION, now)
    w.admission = None


def mark_backoff_finished(w: SimWorkload, now: float) -> None:
    """workload_controller.go: once requeueAt has passed, Requeued=True/BackoffFinished and
    requeueAt cleared; the workload is queued again."""
    set_condition(
        w.conditions,
        "Requeued",
        "True",
        checks.BACKOFF_FINISHED,
        checks.BACKOFF_FINISHED_MESSAGE,
        now,
    )
    w.backoff_until = None


def mark_admitted(
    w: SimWorkload,
    placement: Sequence[tuple[str, int]],
    now: float,
    placements: Mapping[str, Sequence[tuple[str, int]]] | None = None,
) -> None:
    """Quota reserved and admitted; a past eviction is kept as "Previously: ..."."""
    _reserve(w, placement, now, placements)
    set_condition(w.conditions, "Admitted", "True", "Admitted", "The workload is admitted", now)


def _reserve(
    w: SimWorkload,
    placement: Sequence[tuple[str, int]],
    now: float,
    placements: Mapping[str, Sequence[tuple[str, int]]] | None,
) -> None:
    w.admission = admission_manifest(w, placement, placements)
    reserved = f"Quota reserved in ClusterQueue {w.cluster_queue}"
    set_condition(w.conditions, "QuotaReserved", "True", "QuotaReserved", reserved, now)
    for kind in ("Evicted", "Preempted"):
        old = w.conditions.get(kind)
        if old is not None and old["status"] == "True":
            previously = "Previously: " + old["message"]
            set_condition(w.conditions, kind, "False", "QuotaReserved", previously, now)


def mark_evicted(w: SimWorkload, reason: PreemptionReason, message: str, now: float) -> None:
    """The preemptor's decision lands on the victim: Evicted and Preempted."""
    set_condition(w.conditions, "Evicted", "True", "Preempted", message, now)
    set_condition(w.conditions, "Preempted", "True", reason, message, now)
    w.evictions += 1


def mark_requeued(w: SimWorkload, message: str, now: float) -> None:
    """Once the victim's pods are gone Kueue drops its admission and queues it again."""
    set_condition(w.conditions, "Requeued", "True", "Preempted", message, now)
    set_condition(w.conditions, "QuotaReserved", "False", "Pending", message, now)
    set_condition(w.conditions, "Admitted", "False", "NoReservation", NO_RESERVATION, now)
    w.admission = None
    w.requeue_count += 1
    w.requeue_at = now


def mark_finished(w: SimWorkload, now: float) -> None:
    set_condition(w.conditions, "Finished", "True", "Succeeded", "Job finished successfully", now)
