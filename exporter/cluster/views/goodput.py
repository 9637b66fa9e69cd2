"""JSON views of the goodput ledger (issue 29), shared by /api/v1, `topowatch explain` and the UI.

Read off a `GoodputBook` under the service lock; every time is given twice where people and
programs both read it: ISO 8601 for people, and the API's own fields in seconds. GPU-seconds
become GPU-hours here, the unit people count lost capacity in.

A job's timeline (`timeline`) is drawn from what the ledger keeps: the job's current phase since
it began, and for each interruption the stop, the waiting and restarting that followed (in that
order: pods are bound, then Ready) and the resume. Running is the time between a resume and the
next stop; the time before the first run is its first wait and start. Time the ledger cannot
place (a suspension before the current phase, a gap a restart left) is "other".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from itertools import pairwise
from typing import Any, Final

from exporter.cluster.goodput import (
    CATEGORIES,
    CAUSES,
    GoodputBook,
    GroupGoodput,
    Interruption,
    JobGoodput,
    durable,
)
from exporter.cluster.goodput.ettr import GROUPS, group_goodput, job_goodput
from exporter.cluster.goodput.reliability import SCOPES
from exporter.core.goodput.causes import COMPONENT_NAMES

BAND_PHASES: Final = (
    "running",
    "restarting",
    "waiting",
    "preempted",
    "suspended",
    "unobserved",
    "other",
)
DAY_S: Final = 86_400
MAX_LIMIT: Final = 10_000
DEFAULT_LIMIT: Final = 1_000


def iso(t: float | None) -> str | None:
    """`views.workloads.iso` (UTC, whole seconds), three times faster: a job's page formats
    hundreds of times (50 interruptions, their bands), and strftime is most of its cost."""
    if t is None:
        return None
    whole = math.floor(t)
    day, rest = divmod(whole, DAY_S)
    hour, rest = divmod(rest, 3600)
    minute, second = divmod(rest, 60)
    return f"{_date(day)}{hour:02d}:{minute:02d}:{second:02d}Z"


@lru_cache(maxsize=1024)
def _date(day: int) -> str:
    return time.strftime("%Y-%m-%dT", time.gmtime(day * DAY_S))


def hours(gpu_seconds: float | None) -> float | None:
    return None if gpu_seconds is None else round(gpu_seconds / 3600, 6)


def interruption_view(entry: Interruption, now: float) -> dict[str, Any]:
    """One ledger entry: cause and evidence, its times (detection -> action -> node back ->
    running again), the GPU-hours it cost."""
    lost = entry.lost_gpu_seconds(now)
    return {
        "id": entry.id,
        "namespace": entry.namespace,
        "job_kind": entry.job_kind,
        "job": entry.job,
        "workload": entry.workload,
        "cluster_queue": entry.cluster_queue,
        "team": entry.team,
        "flavor": entry.flavor,
        "gpus": entry.gpus,
        "nodes": list(entry.nodes),
        "cause": entry.cause,
        "component": entry.component,
        "detail": entry.detail,
        "uncertain": entry.uncertain,
        "missing": entry.missing,
        "settled": entry.settled,
        "evidence": {
            "node": entry.node,
            "check": entry.check,
            "finding_component": entry.finding_component,
            "verdict": entry.verdict,
            "preemptor": entry.preemptor,
            "action": entry.action,
        },
        "stopped_at": iso(entry.stopped_at),
        "detected_at": iso(entry.detected_at),
        "action_at": iso(entry.action_at),
        "node_back_at": iso(entry.node_back_at),
        "resumed_at": iso(entry.resumed_at),
        "open": entry.counted and entry.resumed_at is None,
        "stopped_at_s": entry.stopped_at,
        "resumed_at_s": entry.resumed_at,
        "waiting_s": entry.waiting_s,
        "restarting_s": entry.restarting_s,
        "lost_gpu_hours": hours(lost),
        "checkpoint_at": iso(entry.checkpoint_at),
        "checkpoint_note": entry.checkpoint_note,
        "work_lost_gpu_hours": hours(entry.work_lost_gpu_seconds),
    }


def interruptions_view(
    book: GoodputBook,
    now: float,
    namespace: str | None = None,
    job: str | None = None,
    cause: str | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int = DEFAULT_LIMIT,
) -> list[dict[str, Any]]:
    """The ledger's entries, newest first, at most `limit` (ValueError for a bad cause or
    limit: the API answers 400)."""
    check_cause(cause)
    check_limit(limit)
    if namespace is not None and job is not None:
        found = [
            e
            for e in book.interruptions_of(namespace, job)
            if (since is None or e.stopped_at >= since)
            and (until is None or e.stopped_at < until)
            and (cause is None or e.cause == cause)
        ]
    else:
        found = book.interruptions(since=since, until=until, namespace=namespace, cause=cause)
        if job is not None:
            found = [e for e in found if e.job == job]
    found.sort(key=lambda e: (e.stopped_at, e.id), reverse=True)
    return [interruption_view(e, now) for e in found[:limit]]


def check_cause(cause: str | None) -> None:
    if cause is not None and cause not in CAUSES:
        raise ValueError(f"cause={cause!r}: expected one of {', '.join(CAUSES)}")


def check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit={limit}: expected 1 to {MAX_LIMIT}")


def check_group(group: str) -> None:
    if group not in GROUPS:
        raise ValueError(f"group={group!r}: expected one of {', '.join(GROUPS)}")


def job_summary(good: JobGoodput) -> dict[str, Any]:
    """A job's goodput figures (no ledger, no timeline)."""
    lost = good.lost_gpu_seconds_by_cause
    return {
        "namespace": good.namespace,
        "kind": good.key[1],
        "name": good.name,
        "team": good.team,
        "cluster_queue": good.cluster_queue,
        "flavor": good.flavor,
        "gpus": good.gpus,
        "phase": good.phase,
        "first_admitted": iso(good.first_admitted),
        "finished_at": iso(good.finished_at),
        "wall_s": good.wall,
        "effective_wall_s": _effective_wall(good),
        "seconds": dict(good.seconds),
        "ettr": good.ettr,
        "interruption_count": good.interruptions,
        "lost_gpu_hours": hours(sum(lost.values())),
        "lost_gpu_hours_by_cause": {c: hours(v) for c, v in sorted(lost.items())},
        "work_lost_gpu_hours": hours(good.work_lost_gpu_seconds),
    }


def _effective_wall(good: JobGoodput) -> float:
    return max(0.0, good.wall - good.chosen_wait - good.seconds.get("unobserved", 0.0))


def job_view(
    book: GoodputBook, namespace: str, job: str, now: float, drawn: bool = True
) -> dict[str, Any] | None:
    """A job's goodput, its interruptions (oldest first) and, when `drawn`, its timeline;
    None when the ledger does not know the job."""
    good = book.job_goodput(namespace, job, now)
    if good is None:
        return None
    entries = [e for e in book.interruptions_of(namespace, job) if e.key == good.key]
    view = job_summary(good)
    view["as_of"] = iso(now)
    view["interruptions"] = [interruption_view(e, now) for e in entries]
    if drawn:
        view["timeline"] = timeline(book, good, entries, now)
    return view


def stored_job_view(
    job: Mapping[str, Any], entries: Iterable[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """A job as the history store keeps it (its totals row and its interruption rows), as of
    its last write; None when the row cannot be read."""
    track = durable.job_from(job)
    if track is None:
        return None
    found = [durable.interruption_from(dict(e)) for e in entries]
    track.interruptions = sorted(
        (e for e in found if e is not None and e.key == track.key), key=lambda e: e.stopped_at
    )
    if track.open is not None and track.open >= len(track.interruptions):
        track.open = None
    as_of = job.get("as_of")
    end = track.finished_at
    if end is None:
        end = float(as_of) if isinstance(as_of, int | float) else track.phase_since_ms / 1000
    good = job_goodput(track, end)
    view = job_summary(good)
    view["as_of"] = iso(end)
    view["interruptions"] = [interruption_view(e, end) for e in track.interruptions]
    view["timeline"] = [
        _band_view(start, stop, phase)
        for start, stop, phase in rebuild_bands(
            good, track.interruptions, end, track.phase_since_ms / 1000
        )
        if stop > start
    ]
    return view


def workload_job_view(
    book: GoodputBook, namespace: str, workload: str, now: float
) -> dict[str, Any] | None:
    """The goodput of the job a Workload belongs to (its owner; the Workload itself when it
    has none), without the drawn timeline; None when the ledger does not know it."""
    key = book.job_for_workload(namespace, workload)
    if key is None:
        return None
    return job_view(book, key[0], key[2], now, drawn=False)


def group_row(group: GroupGoodput) -> dict[str, Any]:
    lost = group.lost_gpu_seconds_by_cause
    return {
        "name": group.name,
        "jobs": group.jobs,
        "running_s": group.running_s,
        "wall_s": group.wall_s,
        "effective_wall_s": max(0.0, group.wall_s - group.excluded_s),
        "ettr": group.ettr,
        "interruptions": group.interruptions,
        "lost_gpu_hours": hours(sum(lost.values())),
        "lost_gpu_hours_by_cause": {c: hours(v) for c, v in sorted(lost.items())},
    }


def goodput_view(
    book: GoodputBook, group: str, now: float, jobs: Sequence[JobGoodput] | None = None
) -> dict[str, Any]:
    """Goodput of the live and recent jobs by `group` (team, cluster_queue, namespace, flavor),
    and over the whole cluster (ValueError for another group). `jobs`: the book's
    `jobs_goodput(now)`, when the caller has it already."""
    check_group(group)
    groups = group_goodput(jobs if jobs is not None else book.jobs_goodput(now), group)
    whole = GroupGoodput(
        "cluster",
        "",
        sum(g.jobs for g in groups),
        sum(g.running_s for g in groups),
        sum(g.wall_s for g in groups),
        sum(g.excluded_s for g in groups),
        sum(g.interruptions for g in groups),
        _summed(g.lost_gpu_seconds_by_cause for g in groups),
    )
    return {
        "group": group,
        "as_of": iso(now),
        "groups": [group_row(g) for g in groups],
        "cluster": group_row(whole),
    }


def _summed(parts: Iterable[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = out.get(key, 0.0) + value
    return out


def gpu_seconds_view(book: GoodputBook, now: float) -> dict[str, Any]:
    """The GPU-second ledger in GPU-hours, by flavor and category, idle split by reason."""
    totals = book.gpu_seconds(now)
    by_flavor = totals.by("flavor")
    reasons: dict[str, dict[str, float | None]] = {}
    for (flavor, reason), ms in sorted(totals.idle_reasons.items()):
        reasons.setdefault(flavor, {})[reason] = hours(ms / 1000)
    return {
        "capacity_gpu_hours": hours(totals.capacity_ms / 1000),
        "residual_ms": totals.residual_ms(),
        "by_flavor": {
            f: {c: hours(per.get(c, 0.0)) for c in CATEGORIES}
            for f, per in sorted(by_flavor.items())
        },
        "idle_by_reason": reasons,
    }


def reliability_view(book: GoodputBook, now: float) -> dict[str, Any]:
    """Interruptions per 1,000 node-days by component, MTBF by scope (nodes apart), repeat
    offenders and the nodes with hardware incidents in the window."""
    summary = book.reliability(now)
    window = book.reliability_book.repeat_window_s
    return {
        "as_of": iso(now),
        "node_days": summary.node_days,
        "interruptions_by_component": {
            c: {
                "name": COMPONENT_NAMES.get(c, c),
                "interruptions": summary.interruptions_by_component.get(c, 0),
                "per_1000_node_days": summary.interruptions_per_1000_node_days.get(c, 0.0),
                "hardware_incidents": summary.incidents_by_component.get(c, 0),
            }
            for c in summary.interruptions_by_component
        },
        "mtbf": {
            scope: [
                {
                    "name": m.name,
                    "node_days": m.node_days,
                    "incidents": m.incidents,
                    "mtbf_hours": m.mtbf_hours,
                }
                for m in summary.mtbf.get(scope, [])
                if (scope != "node" or m.incidents) and (scope != "ultraserver" or m.name)
            ]
            for scope in SCOPES
        },
        "repeat_offender_rule": {
            "incidents": book.reliability_book.repeat_findings,
            "window_s": window,
        },
        "repeat_offenders": [
            {
                "node": o.node,
                "incidents": o.incidents,
                "first": iso(o.first),
                "last": iso(o.last),
                "components": list(o.components),
            }
            for o in summary.repeat_offenders
        ],
    }


def fleet_view(book: GoodputBook, now: float, top_jobs: int = 50) -> dict[str, Any]:
    """What the fleet page shows: goodput by team, lost GPU-hours by cause, reliability, and
    the jobs that lost the most."""
    every = book.jobs_goodput(now)
    by_team = goodput_view(book, "team", now, every)
    jobs = sorted(
        every, key=lambda j: (-sum(j.lost_gpu_seconds_by_cause.values()), j.namespace, j.name)
    )
    return {
        "as_of": iso(now),
        "teams": by_team["groups"],
        "cluster": by_team["cluster"],
        "gpu_seconds": gpu_seconds_view(book, now),
        "reliability": reliability_view(book, now),
        "jobs": [job_summary(j) for j in jobs[:top_jobs]],
        "jobs_total": len(jobs),
    }


# --- the timeline ---------------------------------------------------------------------------

Band = tuple[float, float, str]


def timeline(
    book: GoodputBook, good: JobGoodput, entries: Sequence[Interruption], now: float
) -> list[dict[str, Any]]:
    """The job's life as bands (start, end, phase), oldest first, from its first admission to
    its end (now while it lives); see the module's docstring for how they are drawn."""
    if good.first_admitted is None:
        return []
    end = good.finished_at if good.finished_at is not None else now
    asked: Callable[..., Any] | None = getattr(book, "job_timeline", None)
    bands: list[Band] = []
    if callable(asked):
        bands = [(float(s), float(e), str(p)) for s, e, p in asked(good.namespace, good.name, now)]
    else:
        track = book.jobs.get(good.key)
        since = track.phase_since_ms / 1000 if track is not None else end
        bands = rebuild_bands(good, entries, end, since)
    return [_band_view(start, stop, phase) for start, stop, phase in bands if stop > start]


def _band_view(start: float, stop: float, phase: str) -> dict[str, Any]:
    return {
        "phase": phase,
        "start": start,
        "end": stop,
        "seconds": stop - start,
        "from": iso(start),
        "to": iso(stop),
    }


def rebuild_bands(
    good: JobGoodput, entries: Sequence[Interruption], end: float, phase_since: float
) -> list[Band]:
    """Bands from the ledger's entries and the job's current phase (since `phase_since`)."""
    start = good.first_admitted
    if start is None:
        return []
    current = good.phase
    if current in ("waiting", "restarting") and entries and entries[-1].cause == "preempted":
        current = "preempted" if current == "waiting" else current
    tail_start = min(max(start, phase_since), end)
    tail: list[Band] = []
    if current not in ("finished", "queued"):
        tail = [(tail_start, end, current)]
    else:
        tail_start = end
    stops = [e for e in entries if e.stopped_at <= tail_start]
    # restarting time the ledger places elsewhere: after each stop, and the current phase
    elsewhere = sum(e.restarting_s for e in stops)
    if current == "restarting":
        elsewhere += end - tail_start
    bands: list[Band] = []
    # The first run: its length is the running time not placed between later resumes and stops.
    running = good.seconds.get("running", 0.0)
    placed = 0.0
    for before, after in pairwise(stops):
        if before.resumed_at is not None:
            placed += max(0.0, after.stopped_at - before.resumed_at)
    if current == "running" and stops and stops[-1].resumed_at is not None:
        placed += max(0.0, end - stops[-1].resumed_at)
    if stops:
        first_stop = stops[0].stopped_at
        first_run = min(max(0.0, running - placed), first_stop - start)
        _gap(bands, start, first_stop - first_run, good, elsewhere)
        bands.append((first_stop - first_run, first_stop, "running"))
    elif current == "running":
        first_run = min(running, end - start)
        _gap(bands, start, end - first_run, good, elsewhere)
        return [*bands, (end - first_run, end, "running")]
    else:
        _gap(bands, start, tail_start, good, elsewhere)
        return bands + tail
    for index, entry in enumerate(stops):
        if not entry.counted:
            break  # completed: the job ended here
        wait_label = "preempted" if entry.cause == "preempted" else "waiting"
        at = entry.stopped_at
        limit = entry.resumed_at if entry.resumed_at is not None else tail_start
        limit = min(limit, tail_start)
        for label, seconds in ((wait_label, entry.waiting_s), ("restarting", entry.restarting_s)):
            stop = min(at + seconds, limit)
            if stop > at:
                bands.append((at, stop, label))
                at = stop
        if at < limit:
            bands.append((at, limit, "other"))
        if entry.resumed_at is None or entry.resumed_at >= tail_start:
            break
        following = stops[index + 1].stopped_at if index + 1 < len(stops) else tail_start
        if following > entry.resumed_at:
            bands.append((entry.resumed_at, following, "running"))
    return bands + tail


def _gap(bands: list[Band], start: float, stop: float, good: JobGoodput, elsewhere: float) -> None:
    """The time before the first run: waiting, then restarting (the job's restarting time
    the ledger does not place `elsewhere`)."""
    if stop <= start:
        return
    restarting = max(0.0, good.seconds.get("restarting", 0.0) - elsewhere)
    restarting = min(restarting, stop - start)
    if stop - restarting > start:
        bands.append((start, stop - restarting, "waiting"))
    if restarting > 0:
        bands.append((stop - restarting, stop, "restarting"))
