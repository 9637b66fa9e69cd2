"""XIDs by NVIDIA's catalog: what the driver's immediate-action bucket asks for, per GPU.

RESET_GPU, RESTART_BM and the XID 48 / NVLink workflows need at least a GPU reset, which on a
managed node means a reboot. 79 (fallen off the bus) is RESTART_BM in NVIDIA's catalog: a reboot
first, as NVIDIA's own ladder climbs (drain, reset, restart, service); the remediation policy's
ladder replaces the node when it falls off again (healthcheck/remediation/policy.py). Application
XIDs recommend nothing alone and escalate only when they repeat on one GPU under different jobs (see
xid_memory). Buckets that ask for a human (report the issue, check mechanicals, update software) are
reported as warnings: rebooting would not fix them.

XID 154 (GPU_RECOVERY_ACTION_CHANGED) says what the driver now requires of the GPU; its catalog
bucket says to do what it names, overriding the XID that came with it. That verdict is the
recovery check's (checks/recovery.py: NVML's recovery action field, else the action this XID's
log line names), so it is listed here for the record (info, no action of its own) and the
`gpu_recovery_*` finding carries the reset or reboot, on the ladder that fits it."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from exporter.core.findings import ACTIONS, SEVERITIES, Finding
from exporter.core.snapshot import NodeSnapshot
from exporter.core.xid import XID_RECOVERY_ACTION_CHANGED, describe, recovery_name
from healthcheck.detection.checks.base import History, finding
from healthcheck.detection.checks.xid_memory import XidRecord
from healthcheck.detection.config import HealthConfig

REBOOT_BUCKETS = frozenset(
    {
        "RESET_GPU",
        "RESTART_BM",
        "RESTART_VM",
        "WORKFLOW_XID_48",
        "WORKFLOW_NVLINK_ERR",
        "WORKFLOW_NVLINK5_ERR",
    }
)
QUIET_BUCKETS = frozenset({"IGNORE", "RESTART_APP", "WORKFLOW_XID_45"})


def verdict(xid: int, app_xids: frozenset[int]) -> tuple[str, str]:
    """(severity, action) for one XID on its own. XID 154's action is the recovery action it
    names, which the recovery check acts on: none here."""
    info = describe(xid)
    if xid in app_xids or info.action in QUIET_BUCKETS or xid == XID_RECOVERY_ACTION_CHANGED:
        return "info", "none"
    if info.action in REBOOT_BUCKETS:
        return ("fatal" if info.severity == "FATAL" else "critical"), "reboot"
    return "warning", "none"


def check(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    by_gpu: dict[int, list[XidRecord]] = defaultdict(list)
    for record in history.xids.records:
        by_gpu[record.gpu_index].append(record)
    out: list[Finding] = []
    for gpu, records in sorted(by_gpu.items()):
        judged = [(verdict(r.xid, config.xid.app_xids), r) for r in records]
        severity, action = max(
            (v for v, _ in judged), key=lambda v: (ACTIONS.index(v[1]), SEVERITIES.index(v[0]))
        )
        evidence = "; ".join(_describe(r) for _, r in judged)
        made = finding(history, now, "xid", f"gpu{gpu}", severity, action, evidence)
        out.append(replace(made, first_seen=min(r.first_seen for r in records)))
    out.extend(_app_repeats(history, config, now))
    return out


def _describe(record: XidRecord) -> str:
    info = describe(record.xid)
    repeats = f" ({record.events} events)" if record.events != record.incidents else ""
    named = ""
    if record.named_action is not None:
        action = record.named_action
        named = f" to 0x{action:x} {recovery_name(action)} (see gpu_recovery_*)"
    return f"XID {record.xid} {info.name} ({info.action}){named} x{record.incidents}{repeats}"


def _app_repeats(history: History, config: HealthConfig, now: float) -> list[Finding]:
    """Application XIDs on one GPU under at least `app_repeat_jobs` different known jobs."""
    jobs: dict[int, set[str]] = defaultdict(set)
    codes: dict[int, set[int]] = defaultdict(set)
    for hit in history.xids.app_hits:
        if hit.job:  # without a pod we cannot tell jobs apart: never escalate on a guess
            jobs[hit.gpu_index].add(hit.job)
            codes[hit.gpu_index].add(hit.xid)
    out = []
    for gpu, seen in sorted(jobs.items()):
        if len(seen) < config.xid.app_repeat_jobs:
            continue
        listed = ", ".join(sorted(seen)[:4]) + (", ..." if len(seen) > 4 else "")
        xids = ",".join(str(x) for x in sorted(codes[gpu]))
        window = int(config.xid.app_repeat_window_seconds)
        evidence = (
            f"application XID {xids} under {len(seen)} different jobs within {window}s: {listed}"
        )
        out.append(
            finding(history, now, "xid_app_repeat", f"gpu{gpu}", "critical", "reboot", evidence)
        )
    return out
