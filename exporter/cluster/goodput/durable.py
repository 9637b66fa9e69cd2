"""The goodput ledger's records as history-store rows, and back.

A restart must keep every interruption (with its attribution), each job's phase totals (so its
ETTR goes on from where it was, the time no process watched counted apart), the hardware
findings repeat offenders and MTBF are counted from, and the GPU-second totals. Each is one
`GoodputRow` upserted by a key that names it (a job's interruption #3 has the same key in
every process), so writing a row again changes nothing and a standby that takes over writes
the same rows. Reading back never raises: a document this code cannot read is skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter.cluster.goodput.evidence import NodeFinding
from exporter.cluster.goodput.gpu_seconds import GpuSecondTotals
from exporter.cluster.goodput.jobs import PHASES, JobTrack
from exporter.core.goodput.causes import component_of
from exporter.core.goodput.interruptions import Interruption, job_id
from exporter.store.records import GoodputRow

LEDGER_KEY = "ledger/cluster"


def interruption_row(entry: Interruption, now: float) -> GoodputRow:
    return GoodputRow(
        key=f"interruption/{entry.id}",
        kind="interruption",
        time=entry.stopped_at,
        namespace=entry.namespace,
        job=entry.job,
        document=entry.as_dict(now),
    )


def job_row(job: JobTrack, now: float) -> GoodputRow:
    document: dict[str, Any] = {
        "namespace": job.key[0],
        "kind": job.key[1],
        "name": job.key[2],
        "team": job.team,
        "cluster_queue": job.cluster_queue,
        "flavor": job.flavor,
        "gpus": job.gpus,
        "first_admitted": job.first_admitted,
        "finished_at": job.finished_at,
        "running": job.running,
        "phase": job.phase,
        "phase_since_ms": job.phase_since_ms,
        "phase_ms": dict(job.phase_ms),
        "open": job.open,
        "interruptions": len(job.interruptions),
        "ended": job.ended,
        "as_of": now,
    }
    return GoodputRow(
        key=f"job/{job_id(job.key)}",
        kind="job",
        time=job.first_admitted if job.first_admitted is not None else now,
        namespace=job.key[0],
        job=job.key[2],
        document=document,
    )


def job_from(data: Mapping[str, Any]) -> JobTrack | None:
    """A job's totals as a previous process wrote them, its current phase counted as
    "unobserved" from its last write (None for a document this code cannot read)."""
    try:
        key = (str(data["namespace"]), str(data["kind"]), str(data["name"]))
        phase_ms = {p: int(data.get("phase_ms", {}).get(p, 0)) for p in PHASES}
        job = JobTrack(
            key,
            team=str(data.get("team", "")),
            cluster_queue=str(data.get("cluster_queue", "")),
            flavor=str(data.get("flavor", "")),
            gpus=int(data.get("gpus", 0)),
            first_admitted=_float(data.get("first_admitted")),
            finished_at=_float(data.get("finished_at")),
            running=bool(data.get("running", False)),
            phase_ms=phase_ms,
            ended=bool(data.get("ended", False)),
        )
        as_of = float(data["as_of"])
        since = int(data.get("phase_since_ms", 0))
        phase = str(data.get("phase", "queued"))
        if phase not in ("queued", "finished") and not job.ended:
            # what it was doing until the last write, then nobody knows
            held = max(0, round(as_of * 1000) - since)
            if phase in phase_ms:
                phase_ms[phase] += held
            job.phase = "unobserved"
            job.phase_since_ms = round(as_of * 1000)
        else:
            job.phase = phase
            job.phase_since_ms = since
        opened = data.get("open")
        job.open = int(opened) if isinstance(opened, int) else None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return job


def finding_row(finding: NodeFinding) -> GoodputRow:
    node, check, component, first_seen = finding.key
    return GoodputRow(
        key=f"finding/{node}/{check}/{component}/{first_seen!r}",
        kind="finding",
        time=first_seen,
        namespace="",
        job="",
        document={
            "node": node,
            "check": check,
            "component": component,
            "severity": finding.severity,
            "action": finding.action,
            "evidence": finding.evidence,
            "first_seen": first_seen,
        },
    )


def finding_from(data: Mapping[str, Any]) -> NodeFinding | None:
    try:
        check = str(data["check"])
        evidence = str(data.get("evidence", ""))
        return NodeFinding(
            node=str(data["node"]),
            check=check,
            component=str(data["component"]),
            severity=str(data["severity"]),
            action=str(data["action"]),
            evidence=evidence,
            first_seen=float(data["first_seen"]),
            part=component_of(check, evidence),
        )
    except (KeyError, TypeError, ValueError):
        return None


def ledger_row(totals: GpuSecondTotals, node_ms: Mapping[str, int], now: float) -> GoodputRow:
    return GoodputRow(
        key=LEDGER_KEY,
        kind="ledger",
        time=now,
        namespace="",
        job="",
        document={**totals.as_dict(), "node_ms": dict(node_ms), "as_of": now},
    )


def ledger_from(data: Mapping[str, Any]) -> tuple[GpuSecondTotals, dict[str, int]] | None:
    try:
        capacity = {(str(f), str(d)): int(v) for f, d, v in data["capacity"]}
        parts = {(str(f), str(d), str(t), str(c)): int(v) for f, d, t, c, v in data["parts"]}
        reasons = {(str(f), str(r)): int(v) for f, r, v in data["idle_reasons"]}
        node_ms = {str(k): int(v) for k, v in data.get("node_ms", {}).items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return GpuSecondTotals(capacity, parts, reasons), node_ms


def interruption_from(data: dict[str, Any]) -> Interruption | None:
    return Interruption.from_dict(data)


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
