"""Prometheus families for elastic jobs, their scale events, and idle GPU-seconds.

The job's name is the label `elastic_job`, not `job`: Prometheus owns `job` (the scrape job)
and would rename ours to `exported_job` unless the scrape honours labels.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from exporter.cluster.elastic.scaling import (
    CAUSES,
    FAILURE_PHASES,
    PHASE_BUCKETS,
    PHASES,
    ElasticBook,
)
from exporter.cluster.model import ClusterModel
from exporter.cluster.objects import team_of
from exporter.core.exposition import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    Family,
)


def render(model: ClusterModel, now: float | None, cap: int) -> Iterable[Family]:
    """`cap` bounds the per-job series, like the per-workload ones; the rest are counted."""
    book = model.elastic
    yield from _jobs(book, cap)
    yield from _events(book)
    at = now if now is not None else 0.0
    idle = Family(
        "topowatch_idle_gpu_seconds",
        COUNTER,
        "Idle GPU-seconds by flavor, leaf network domain and reason: claimable (a pending or "
        "elastic job could use them now), topology or quota (Kueue kept the waiting work out "
        "for that reason), no_demand, or not offered (health, deep_health_check, maintenance).",
    )
    for (flavor, domain, reason), seconds in sorted(model.idle.totals(at).items()):
        idle.add([("flavor", flavor), ("domain", domain), ("reason", reason)], seconds)
    absorbed = Family(
        "topowatch_elastic_absorbed_gpu_seconds",
        COUNTER,
        "GPU-seconds elastic jobs ran above their minimum replicas: idle capacity they used.",
    )
    seconds_by = {
        (j.flavor, team_of(j.cluster_queue)): 0.0
        for j in book.jobs.values()
        if j.elastic is not False
    }
    seconds_by.update(model.idle.absorbed(at))  # every elastic job's team from 0, as above
    for (flavor, team), seconds in sorted(seconds_by.items()):
        absorbed.add([("flavor", flavor), ("team", team)], seconds)
    yield idle
    yield absorbed


def _jobs(book: ElasticBook, cap: int) -> Iterable[Family]:
    replicas = Family(
        "topowatch_elastic_job_replicas",
        GAUGE,
        "An elastic job's size: running (Ready pods), admitted (by Kueue), the operator's "
        "target, and its min and max bounds (absent when unknown).",
    )
    failures = Family(
        "topowatch_elastic_consecutive_scaling_failures",
        GAUGE,
        "The HyperPod operator's consecutiveScalingFailures for the job.",
    )
    jobs = Family(
        "topowatch_elastic_jobs",
        GAUGE,
        "Elastic jobs known, by whether their size can be judged (unknown: contradictory "
        "bounds, a missing owner or one not seen yet, a slice replacing itself).",
    )
    dropped = Family(
        "topowatch_elastic_job_series_dropped",
        GAUGE,
        "Elastic jobs left out of the per-job series by the series cap.",
    )
    counts = {"known": 0, "unknown": 0}
    shown = 0
    for key in sorted(book.jobs):
        job = book.jobs[key]
        if job.elastic is False:  # a HyperPodPyTorchJob without elasticPolicy: not elastic
            continue
        counts["unknown" if job.unknown else "known"] += 1
        if shown >= cap:
            continue
        shown += 1
        head = [("namespace", job.namespace), ("elastic_job", job.name), ("kind", job.kind)]
        labels = [*head, ("cluster_queue", job.cluster_queue), ("team", team_of(job.cluster_queue))]
        values: list[tuple[str, int | None]] = [("running", job.ready), ("admitted", job.admitted)]
        if not job.unknown:
            values += [("target", job.target), ("min", job.min_replicas), ("max", job.max_replicas)]
        for state, value in values:
            if value is not None:
                replicas.add([*labels, ("state", state)], value)
        if job.spec is not None:
            failures.add(head[:2], job.spec.consecutive_failures)
    for state, n in counts.items():
        jobs.add([("state", state)], n)
    dropped.add([], sum(counts.values()) - shown)
    return [replicas, failures, jobs, dropped]


def _events(book: ElasticBook) -> Iterable[Family]:
    events = Family(
        "topowatch_elastic_scale_events",
        COUNTER,
        "Scale events seen happening, by direction and cause (capacity_freed, preemption, "
        "faulty_pod, user_change, unknown); history rebuilt after a restart is not counted.",
    )
    # Every queue with elastic jobs gets each series from 0: `increase` sees no first increment
    # of a counter that appears at 1.
    queues = {
        job.cluster_queue
        for job in book.jobs.values()
        if job.cluster_queue and job.elastic is not False
    }
    counts = Counter({(d, c, q): 0 for q in queues for d in ("up", "down") for c in CAUSES})
    counts.update(book.events_total)
    for (direction, cause, queue), n in sorted(counts.items()):
        events.add(
            [
                ("direction", direction),
                ("cause", cause),
                ("cluster_queue", queue),
                ("team", team_of(queue)),
            ],
            n,
        )
    failures = Family(
        "topowatch_elastic_scale_failures",
        COUNTER,
        "Scale-ups that failed, by the phase they never reached.",
    )
    failed = Counter({(q, p): 0 for q in queues for p in FAILURE_PHASES})
    failed.update(book.failures_total)
    for (queue, phase), n in sorted(failed.items()):
        failures.add([("cluster_queue", queue), ("team", team_of(queue)), ("phase", phase)], n)
    phases = Family(
        "topowatch_elastic_scale_up_phase_seconds",
        HISTOGRAM,
        "Seconds from a scale-up's request (its Workload created) to each phase: admitted, "
        "scheduled (pods bound), ready (pods Ready), restarted (the job at its new size).",
    )
    for phase in PHASES[1:]:
        buckets = book.phase_buckets[phase]
        phases.add_histogram(
            [("phase", phase)],
            list(zip(PHASE_BUCKETS, buckets, strict=True)),
            book.phase_sum[phase],
            book.phase_count[phase],
        )
    return [events, failures, phases]
