"""Goodput: effective training time over wall time, per job and per team or flavor.

ETTR = running / (wall - time the owner chose to wait), wall counted from the job's first
admission (Meta's and ByteDance's definition, with the job's own suspensions left out: a job
its owner paused did not lose that time to the cluster). Time no process watched (a restart's
gap) is left out too: it is neither running nor lost as far as anyone knows.

The waiting that followed a preemption is reported as "preempted"; the rest of the waiting
(quota or topology after a node fault, a node being replaced) stays "waiting". GPU-hours lost
are the interruptions' (GPUs held or torn down x time to running again), by cause; work lost
since the last checkpoint where the job publishes one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from exporter.cluster.goodput.gpu_seconds import to_ms
from exporter.cluster.goodput.jobs import JobTrack
from exporter.core.goodput.causes import CAUSES
from exporter.core.goodput.interruptions import JobKey

REPORTED: Final = ("running", "restarting", "waiting", "preempted", "suspended", "unobserved")
GROUPS: Final = ("team", "cluster_queue", "namespace", "flavor")


@dataclass(frozen=True, slots=True)
class JobGoodput:
    key: JobKey
    team: str
    cluster_queue: str
    flavor: str
    gpus: int
    first_admitted: float | None
    finished_at: float | None
    phase: str
    seconds: dict[str, float]  # REPORTED phases; they add up to `wall`
    wall: float
    interruptions: int
    lost_gpu_seconds_by_cause: dict[str, float]
    work_lost_gpu_seconds: float | None

    @property
    def namespace(self) -> str:
        return self.key[0]

    @property
    def name(self) -> str:
        return self.key[2]

    @property
    def chosen_wait(self) -> float:
        return self.seconds.get("suspended", 0.0)

    @property
    def ettr(self) -> float | None:
        """running / (wall - suspended - unobserved); None before any such time."""
        denominator = self.wall - self.chosen_wait - self.seconds.get("unobserved", 0.0)
        return self.seconds["running"] / denominator if denominator > 0 else None

    def as_dict(self) -> dict[str, object]:
        return {
            "namespace": self.key[0],
            "kind": self.key[1],
            "name": self.key[2],
            "team": self.team,
            "cluster_queue": self.cluster_queue,
            "flavor": self.flavor,
            "gpus": self.gpus,
            "first_admitted": self.first_admitted,
            "finished_at": self.finished_at,
            "phase": self.phase,
            "seconds": dict(self.seconds),
            "wall": self.wall,
            "ettr": self.ettr,
            "interruptions": self.interruptions,
            "lost_gpu_seconds_by_cause": dict(self.lost_gpu_seconds_by_cause),
            "work_lost_gpu_seconds": self.work_lost_gpu_seconds,
        }


@dataclass(frozen=True, slots=True)
class GroupGoodput:
    group: str  # team | cluster_queue | namespace | flavor
    name: str
    jobs: int
    running_s: float
    wall_s: float
    excluded_s: float  # suspended and unobserved
    interruptions: int
    lost_gpu_seconds_by_cause: dict[str, float] = field(default_factory=dict)

    @property
    def ettr(self) -> float | None:
        denominator = self.wall_s - self.excluded_s
        return self.running_s / denominator if denominator > 0 else None


def job_goodput(job: JobTrack, now: float) -> JobGoodput:
    end = job.finished_at if job.finished_at is not None else now
    ms = job.phases_at(to_ms(end))
    preempted = 0.0
    lost = dict.fromkeys(CAUSES, 0.0)
    work: float | None = None
    counted = 0
    for index, entry in enumerate(job.interruptions):
        waiting = entry.waiting_s
        if index == job.open and job.phase == "waiting":
            waiting += max(0, to_ms(end) - job.phase_since_ms) / 1000
        if entry.cause == "preempted":
            preempted += waiting
        lost[entry.cause] += entry.lost_gpu_seconds(end)
        if entry.work_lost_gpu_seconds is not None:
            work = (work or 0.0) + entry.work_lost_gpu_seconds
        counted += entry.counted
    seconds = {p: ms.get(p, 0) / 1000 for p in REPORTED if p != "preempted"}
    preempted = min(preempted, seconds["waiting"])
    seconds["waiting"] -= preempted
    seconds["preempted"] = preempted
    return JobGoodput(
        key=job.key,
        team=job.team,
        cluster_queue=job.cluster_queue,
        flavor=job.flavor,
        gpus=job.gpus,
        first_admitted=job.first_admitted,
        finished_at=job.finished_at,
        phase=job.phase,
        seconds={p: seconds[p] for p in REPORTED},
        wall=sum(ms.get(p, 0) for p in ms) / 1000,
        interruptions=counted,
        lost_gpu_seconds_by_cause={c: v for c, v in lost.items() if v},
        work_lost_gpu_seconds=work,
    )


def group_goodput(jobs: Iterable[JobGoodput], group: str) -> list[GroupGoodput]:
    if group not in GROUPS:
        raise ValueError(f"group must be one of {', '.join(GROUPS)}, not {group!r}")
    totals: dict[str, list[float]] = {}
    lost: dict[str, dict[str, float]] = {}
    for job in jobs:
        if job.first_admitted is None:
            continue
        name = {
            "team": job.team,
            "cluster_queue": job.cluster_queue,
            "namespace": job.namespace,
            "flavor": job.flavor,
        }[group]
        row = totals.setdefault(name, [0, 0.0, 0.0, 0.0, 0])
        row[0] += 1
        row[1] += job.seconds["running"]
        row[2] += job.wall
        row[3] += job.chosen_wait + job.seconds["unobserved"]
        row[4] += job.interruptions
        into = lost.setdefault(name, {})
        for cause, value in job.lost_gpu_seconds_by_cause.items():
            into[cause] = into.get(cause, 0.0) + value
    return [
        GroupGoodput(group, name, int(r[0]), r[1], r[2], r[3], int(r[4]), lost[name])
        for name, r in sorted(totals.items())
    ]
