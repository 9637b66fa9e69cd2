"""What the agent remembers of XID events between polls: deduplicated incidents, and which jobs
were on a GPU when it raised an application XID.

An XID is an event, delivered once; its finding must outlive the poll that carried it, and a
driver that repeats one fault in a burst must not make it look like many. Application XIDs
(13, 31, ...) are usually the job's own bug, so one alone proves nothing about the GPU; the same
GPU raising them under different jobs does. Pure: the monitor keeps the value between polls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from exporter.core.snapshot import PodRef, XidEvent
from exporter.core.xid import XID_RECOVERY_ACTION_CHANGED
from healthcheck.detection.config import XidConfig

MAX_APP_HITS = 1024  # bounds the memory whatever a broken job does


@dataclass(frozen=True, slots=True)
class XidRecord:
    """One XID code on one GPU: its deduplicated incidents while the finding is held."""

    gpu_index: int
    uuid: str
    xid: int
    first_seen: float  # agent time of the first incident
    last_seen: float  # agent time of the latest incident
    last_event: float  # event timestamp of the latest event: the deduplication clock
    incidents: int  # distinct incidents after deduplication
    events: int  # raw events, repeats included
    # XID 154 only: the recovery action its latest log line changed to (the line's "to 0xN"),
    # and that line's time; None when no line named one (NVML's event carries only the code).
    named_action: int | None = None
    named_at: float = 0.0


@dataclass(frozen=True, slots=True)
class AppXidHit:
    """An application XID incident and the job (namespace/pod) holding the GPU then."""

    uuid: str
    gpu_index: int
    xid: int
    job: str  # "" when no pod was known to hold the GPU
    at: float


@dataclass(frozen=True, slots=True)
class XidMemory:
    records: tuple[XidRecord, ...] = ()
    app_hits: tuple[AppXidHit, ...] = ()


def job_of(pods: Mapping[str, PodRef], uuid: str) -> str:
    ref = pods.get(uuid)
    return f"{ref.namespace}/{ref.pod}" if ref is not None and ref.pod else ""


@dataclass(frozen=True, slots=True)
class NamedAction:
    """What an XID 154 line on one GPU says the recovery action changed to."""

    gpu_index: int
    action: int  # nvmlDeviceGpuRecoveryAction_t
    timestamp: float  # the line's time


def remember(
    memory: XidMemory,
    events: Iterable[XidEvent],
    pods: Mapping[str, PodRef],
    config: XidConfig,
    now: float,
    named: Iterable[NamedAction] = (),
) -> XidMemory:
    """Fold this poll's events in, then the recovery actions XID 154 lines named (onto the XID
    154 record of their GPU: the XID and its line are one event), then forget what aged out."""
    records = {(r.uuid, r.xid): r for r in memory.records}
    hits = list(memory.app_hits)
    for event in events:
        key = (event.uuid, event.xid)
        record = records.get(key)
        repeat = (
            record is not None and abs(event.timestamp - record.last_event) <= config.dedup_seconds
        )
        if record is None:
            records[key] = XidRecord(
                event.gpu_index, event.uuid, event.xid, now, now, event.timestamp, 1, 1
            )
        else:
            records[key] = replace(
                record,
                last_seen=now,
                last_event=max(record.last_event, event.timestamp),
                incidents=record.incidents + (0 if repeat else 1),
                events=record.events + 1,
            )
        if not repeat and event.xid in config.app_xids:
            hits.append(
                AppXidHit(event.uuid, event.gpu_index, event.xid, job_of(pods, event.uuid), now)
            )
    for n in named:
        key154 = next(
            (
                k
                for k, r in records.items()
                if r.gpu_index == n.gpu_index and r.xid == XID_RECOVERY_ACTION_CHANGED
            ),
            None,
        )
        if key154 is not None and n.timestamp >= records[key154].named_at:
            records[key154] = replace(records[key154], named_action=n.action, named_at=n.timestamp)
    kept = tuple(r for r in records.values() if now - r.last_seen <= config.hold_seconds)
    horizon = now - config.app_repeat_window_seconds
    recent = tuple(h for h in hits if h.at >= horizon)[-MAX_APP_HITS:]
    return XidMemory(
        records=tuple(sorted(kept, key=lambda r: (r.gpu_index, r.xid))), app_hits=recent
    )
