"""Every GPU-hour accounted for (issue 29): interruptions, goodput, GPU-seconds, reliability.

One object, `GoodputBook`, is fed by the cluster model through one hook and read by the
surfaces. Reads are pure (pass `now`, Unix seconds) and run under the service lock like any
other model read.

    book = GoodputBook(GoodputConfig(checkpoint_key="topowatch.io/last-checkpoint",
                                     repeat_findings=2, repeat_window_s=7 * 86400))
    book.attach(model)      # model.observer = book: book.observe(kind, type, obj, key, now)
    book.tick(now)          # settles attributions that are due (also done by events)

Part 1, the interruption ledger (`Interruption` and the causes live in `exporter.core.goodput`,
shared with the Slurm ledger):
    book.interruptions_of(namespace, job) -> list[Interruption]        oldest first
    book.interruptions(since=None, until=None, namespace=None, cause=None) -> list[Interruption]
    book.job_for_workload(namespace, workload) -> (namespace, kind, job) | None
  An entry: cause (preempted | node_fault | remediation | elastic_scale_down | user |
  completed | unknown), component (gpu | hbm | nvlink | network | host | software | unknown),
  detail, uncertain, missing, evidence (node, check, finding_component, verdict, preemptor,
  action), detected_at -> action_at -> node_back_at -> resumed_at, lost_gpu_seconds(now),
  checkpoint_at / work_lost_gpu_seconds, settled.
Part 2, goodput (ettr.py):
    book.job_goodput(namespace, job, now) -> JobGoodput | None
    book.jobs_goodput(now) -> list[JobGoodput]
    book.goodput_by("team" | "cluster_queue" | "namespace" | "flavor", now) -> list[GroupGoodput]
  JobGoodput.seconds: running, restarting, waiting, preempted, suspended, unobserved (they add
  up to .wall); .ettr = running / (wall - suspended - unobserved); lost GPU-seconds by cause;
  work lost since checkpoints.
Part 3, the GPU-second ledger (gpu_seconds.py):
    book.gpu_seconds(now) -> GpuSecondTotals    .parts[(flavor, domain, team, category)] GPU-ms,
    .idle_reasons[(flavor, reason)], .by("flavor" | "domain" | "team"), .residual_ms() == 0
Part 4, fleet reliability (reliability.py):
    book.reliability(now) -> ReliabilitySummary     rates per 1,000 node-days by component,
                                                    MTBF by node/instance type/domain/UltraServer
    book.repeat_offenders(now) -> list[RepeatOffender]
    book.is_repeat_offender(node, now) -> bool       (what the remediation ladder asks)
Durability (durable.py; the history store's `goodput` table):
    book.on_change = callback; book.dirty_rows(now) -> list[GoodputRow] for the HistoryWriter;
    book.restore(interruptions, jobs, findings, ledger) from SqlStore.goodput_all(kind).

Modules, each with one job: evidence (reading Nodes and checkpoints), attribution (the rules:
evidence in, cause out), jobs (one job's phases), ettr (goodput arithmetic), gpu_seconds (the
exact ledger), reliability (rates, MTBF, repeat offenders), durable (store rows), book (the event
intake and the reads). The vocabularies and the entry (causes, interruptions) are in
exporter.core.goodput, shared with the Slurm ledger.
"""

from __future__ import annotations

from exporter.cluster.goodput.book import (
    GoodputBook,
    GoodputConfig,
    ModelView,
    job_key_of,
)
from exporter.cluster.goodput.ettr import GroupGoodput, JobGoodput
from exporter.cluster.goodput.gpu_seconds import CATEGORIES, IDLE_REASONS, GpuSecondTotals
from exporter.cluster.goodput.reliability import (
    Mtbf,
    ReliabilitySummary,
    RepeatOffender,
    repeat_offender,
)
from exporter.core.goodput.causes import CAUSES, COMPONENTS, Cause, Component
from exporter.core.goodput.interruptions import Interruption, JobKey

__all__ = [
    "CATEGORIES",
    "CAUSES",
    "COMPONENTS",
    "IDLE_REASONS",
    "Cause",
    "Component",
    "GoodputBook",
    "GoodputConfig",
    "GpuSecondTotals",
    "GroupGoodput",
    "Interruption",
    "JobGoodput",
    "JobKey",
    "ModelView",
    "Mtbf",
    "ReliabilitySummary",
    "RepeatOffender",
    "job_key_of",
    "repeat_offender",
]
