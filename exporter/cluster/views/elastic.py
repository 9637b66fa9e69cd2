"""JSON views of elastic jobs and idle GPU-hours, shared by the API, explain and the UI."""

from __future__ import annotations

from typing import Any

from exporter.cluster.elastic.idle import REASONS
from exporter.cluster.elastic.scaling import PHASES, JobState, ScaleEvent
from exporter.cluster.model import ClusterModel, WorkloadState
from exporter.cluster.objects import team_of
from exporter.cluster.views.workloads import (
    iso,
    preemption_view,
    status_of,
    workload_view,
)


def event_view(event: ScaleEvent) -> dict[str, Any]:
    return {
        "id": event.id,
        "direction": event.direction,
        "from_replicas": event.from_replicas,
        "to_replicas": event.to_replicas,
        "cause": event.cause or "unsettled",
        "workload": event.workload,
        "time": iso(event.time),
        "phases": {p: iso(event.phases[p]) for p in PHASES if p in event.phases},
        "seconds_to": {
            p: event.seconds_to(p) for p in PHASES[1:] if event.seconds_to(p) is not None
        },
        "done": event.done,
        "failed": event.failed or None,
        "failed_phase": event.failed_phase or None,
        "ended": event.ended or None,
        "observed": "live" if event.live else "history",
    }


def job_view(model: ClusterModel, job: JobState) -> dict[str, Any]:
    """The job: size against its bounds, its Workloads, scale events, preemptions, history."""
    spec = job.spec
    workloads = sorted(job.workloads.values(), key=lambda w: (w.created or 0.0, w.name))
    preemptions = [
        preemption_view(r) for w in workloads for r in model.ledger.suffered_by(w.namespace, w.name)
    ]
    preemptions.sort(key=lambda r: r["time"] or "")
    return {
        "namespace": job.namespace,
        "name": job.name,
        "kind": job.kind,
        "uid": job.uid,
        "summary": job.summary(),
        "elastic": job.elastic,
        "unknown": job.unknown or None,
        "cluster_queue": job.cluster_queue,
        "team": team_of(job.cluster_queue),
        "flavor": job.flavor,
        "replicas": {
            "running": None if job.pods_unseen else job.ready,
            "bound": None if job.pods_unseen else job.bound,
            "admitted": job.admitted,
            "target": None if job.unknown else job.target,
            "min": None if job.unknown else job.min_replicas,
            "max": None if job.unknown else job.max_replicas,
        },
        "gpus_per_replica": job.gpus_per_replica,
        "policy": None
        if spec is None
        else {
            "increment_step": spec.increment_step,
            "discrete_values": list(spec.discrete_values),
            "scaling_timeout_s": spec.scaling_timeout_s,
            "scale_up_snooze_s": spec.snooze_s,
            "consecutive_scaling_failures": spec.consecutive_failures,
            "faulty_pod_scale_down": spec.faulty_scale_down,
            "last_scaling_time": iso(spec.last_scaling),
            "last_restart_time": iso(spec.last_restart),
        },
        "workloads": [
            {
                "name": w.name,
                "status": status_of(w),
                "replicas": sum(p.count for p in w.pod_sets),
                "slice": w.slice_name or None,
                "replaces": w.replacement_for or None,
                "preempted": bool(model.ledger.suffered_by(w.namespace, w.name)),
            }
            for w in workloads
        ],
        "scale_events": [event_view(e) for e in job.events],
        "sizes": [{"time": iso(t), "running": n} for t, n in job.sizes],
        "preemptions": preemptions,
    }


def jobs_view(model: ClusterModel, namespace: str | None = None) -> list[dict[str, Any]]:
    out = []
    for key in sorted(model.elastic.jobs):
        job = model.elastic.jobs[key]
        if (namespace and job.namespace != namespace) or job.elastic is False:
            continue  # a HyperPodPyTorchJob without elasticPolicy is no elastic job
        out.append(
            {
                "namespace": job.namespace,
                "name": job.name,
                "kind": job.kind,
                "summary": job.summary(),
                "elastic": job.elastic,
                "unknown": job.unknown or None,
                "running": None if job.pods_unseen else job.ready,
                "admitted": job.admitted,
                "target": None if job.unknown else job.target,
                "min": None if job.unknown else job.min_replicas,
                "max": None if job.unknown else job.max_replicas,
                "scale_events": len(job.events),
            }
        )
    return out


def idle_view(model: ClusterModel, now: float) -> dict[str, Any]:
    """Idle GPU-hours since the service started, by reason, flavor and domain; GPU-hours
    elastic jobs absorbed by team; and the idle GPUs at this moment by reason."""
    totals = model.idle.totals(now)
    by_reason = dict.fromkeys(REASONS, 0.0)
    by_flavor: dict[str, dict[str, float]] = {}
    for (flavor, _, reason), seconds in totals.items():
        by_reason[reason] += seconds / 3600
        per = by_flavor.setdefault(flavor, dict.fromkeys(REASONS, 0.0))
        per[reason] += seconds / 3600
    absorbed: dict[str, float] = {}
    for (_, team), seconds in model.idle.absorbed(now).items():
        absorbed[team] = absorbed.get(team, 0.0) + seconds / 3600
    return {
        "since": iso(model.watch_start),
        "as_of": iso(now),
        "idle_gpu_hours": {r: round(v, 6) for r, v in by_reason.items()},
        "idle_gpu_hours_by_flavor": {
            f: {r: round(v, 6) for r, v in per.items() if v} for f, per in sorted(by_flavor.items())
        },
        "idle_gpu_hours_by_domain": [
            {"flavor": f, "domain": d, "reason": r, "gpu_hours": round(s / 3600, 6)}
            for (f, d, r), s in sorted(totals.items())
        ],
        "absorbed_gpu_hours_by_team": {t: round(v, 6) for t, v in sorted(absorbed.items())},
        "idle_gpus_now": model.idle.idle_now(),
    }


def explained_workload(
    model: ClusterModel, state: WorkloadState, now: float | None = None
) -> dict[str, Any]:
    """The workload view, with its elastic job's view under "elastic" when it has one."""
    view = workload_view(model, state, now=now)
    job = model.elastic.for_workload(state.workload)
    view["elastic"] = job_view(model, job) if job is not None else None
    return view


def find_job(model: ClusterModel, namespace: str, name: str) -> JobState | None:
    """An elastic job by name (a HyperPodPyTorchJob before a Kueue Job of the same name)."""
    found = sorted(
        model.elastic.named(namespace, name), key=lambda j: j.kind != "HyperPodPyTorchJob"
    )
    return found[0] if found else None
