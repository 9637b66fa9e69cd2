"""What the history store takes and gives back: plain frozen rows, queries and pages.

Each written row carries the columns the store filters and orders on, plus `document`: the
whole record as JSON, returned verbatim by reads, so the API can answer with the same shape as
the live views without the store knowing that shape. Rows are upserted by a natural key (`key`,
`uid`, or for audit records a digest of the row), so a batch written twice changes nothing.

Reads page newest first by KEYSET: a cursor is the (time, id) of the last row seen, and the
next page is what sorts strictly after it. Unlike OFFSET this costs the same on page 1000 as on
page 1, and a row inserted while someone pages neither repeats nor hides a row they have not
seen yet. The cursor is opaque to callers (base64 of JSON) so its contents may change.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, fields, replace
from typing import Any

MAX_LIMIT = 1000
DEFAULT_LIMIT = 100


# One preemption reaches a watcher as a condition and as an Event, a second or two apart, and
# again after a restart: copies of one victim's preemption within this window (and naming no
# two different preemptors) are one preemption. The ledger (exporter.cluster.ledger) and the
# store merge by this one rule.
SAME_PREEMPTION_WINDOW_S = 10.0
_BLANK: tuple[object, ...] = ("", None, 0, "Unknown", "unknown")


@dataclass(frozen=True)
class PreemptionRow:
    """One preemption from a ledger. `key` names the ledger entry that wrote it (a process and
    the entry's id there): a row written again under the same key replaces it, a row under
    another key (another replica, the same process after a restart) is merged into the row of
    the same preemption by `merge_preemption`."""

    key: str
    time: float
    victim_namespace: str
    victim_name: str
    victim_uid: str
    victim_cluster_queue: str
    preemptor_namespace: str
    preemptor_name: str
    preemptor_uid: str
    preemptor_cluster_queue: str
    reason: str
    verdict: str
    gpus_freed: int
    observed: str
    document: dict[str, Any]


@dataclass(frozen=True)
class WorkloadRow:
    """A finished (or deleted) workload: `document` is its explain view, timeline included."""

    uid: str
    namespace: str
    name: str
    cluster_queue: str
    finished_at: float
    deleted: bool
    document: dict[str, Any]


ADMISSION = "admission"  # the audit kind of the admission check's decisions


@dataclass(frozen=True)
class AuditRow:
    """One audit record: a remediation record (`AuditRecord.as_dict()` as the document), or,
    of kind ADMISSION, a decision of the topowatch.io/node-health admission check (its
    `/api/v1/admission` entry as the document; `verdict` the state answered, `node` the node
    that held it, `subject` the workload "namespace/name"). One table for both: they are the
    same thing, a judgment with its reason kept for later, read newest first by time."""

    time: float
    node: str
    kind: str
    verdict: str
    reason: str
    action: str
    document: dict[str, Any]
    subject: str = ""  # what beyond the node the record is about (an admission's workload)


@dataclass(frozen=True)
class ScaleEventRow:
    """One elastic scale event of a job."""

    key: str
    time: float
    namespace: str
    job: str
    kind: str
    cause: str
    document: dict[str, Any]


@dataclass(frozen=True)
class GoodputRow:
    """One record of the goodput ledger (exporter.cluster.goodput): an interruption, a job's
    phase totals, a hardware finding, or the GPU-second ledger's totals (`kind`), upserted by
    `key` (which starts with the kind, so kinds never collide). `namespace` and `job` are ""
    for records of no job."""

    key: str
    kind: str  # interruption | job | finding | ledger
    time: float
    namespace: str
    job: str
    document: dict[str, Any]


Row = PreemptionRow | WorkloadRow | AuditRow | ScaleEventRow | GoodputRow


def same_preemption(a: PreemptionRow, b: PreemptionRow) -> bool:
    """The ledger's rule: one victim, no two different preemptors, within the window."""
    if (a.victim_namespace, a.victim_name) != (b.victim_namespace, b.victim_name):
        return False
    if a.preemptor_uid and b.preemptor_uid and a.preemptor_uid != b.preemptor_uid:
        return False
    return abs(a.time - b.time) <= SAME_PREEMPTION_WINDOW_S


def merge_preemption(known: PreemptionRow, new: PreemptionRow) -> PreemptionRow:
    """One row for two copies of one preemption.

    Under the same key `new` is the writer's newer view of its own entry and replaces `known`.
    Under different keys the ledger's merge applies: the earliest time, the first verdict
    unless it is "unknown", whatever the kept copy lacks filled from the other, and "live"
    when either copy is. The key and row id of `known` stay, so readers see one row."""
    observed = "live" if "live" in (known.observed, new.observed) else new.observed
    earlier = known if known.time <= new.time else new
    if new.key == known.key:
        document = {**new.document, "observed": observed}
        if "time" in earlier.document:
            document["time"] = earlier.document["time"]
        return replace(new, time=earlier.time, observed=observed, document=document)
    first, other = (known, new) if known.verdict != "unknown" else (new, known)
    values = {f.name: getattr(first, f.name) for f in fields(first) if f.name != "document"}
    for name, value in values.items():
        if value in _BLANK and getattr(other, name) not in _BLANK:
            values[name] = getattr(other, name)
    document = dict(first.document)
    for name, value in other.document.items():
        if document.get(name) in _BLANK and value not in _BLANK:
            document[name] = value
    if "time" in earlier.document:
        document["time"] = earlier.document["time"]
    document["observed"] = observed
    values.update(key=known.key, time=earlier.time, observed=observed)
    return PreemptionRow(document=document, **values)


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}, not {limit}")


@dataclass(frozen=True)
class PreemptionQuery:
    """Preemptions at `since` <= time < `until`, newest first. `namespace` is the victim's
    ("who preempted my job"); `queue` matches the victim's OR the preemptor's cluster queue."""

    since: float
    until: float | None = None
    namespace: str | None = None
    queue: str | None = None
    verdict: str | None = None
    limit: int = DEFAULT_LIMIT
    cursor: str | None = None

    def __post_init__(self) -> None:
        _check_limit(self.limit)


@dataclass(frozen=True)
class AuditQuery:
    """Audit records at time >= `since`, newest first, optionally of one node. Remediation
    records unless `admission`: then the admission check's decisions only, optionally of one
    `workload` ("namespace/name")."""

    since: float
    node: str | None = None
    limit: int = DEFAULT_LIMIT
    cursor: str | None = None
    admission: bool = False
    workload: str | None = None

    def __post_init__(self) -> None:
        _check_limit(self.limit)


@dataclass(frozen=True)
class GoodputQuery:
    """Goodput records of one kind at `since` <= time, newest first, optionally of one
    namespace (and job)."""

    kind: str
    since: float = 0.0
    namespace: str | None = None
    job: str | None = None
    limit: int = DEFAULT_LIMIT
    cursor: str | None = None

    def __post_init__(self) -> None:
        _check_limit(self.limit)


@dataclass(frozen=True)
class Page:
    """The documents of one page, and the cursor of the next (None on the last page)."""

    items: tuple[dict[str, Any], ...]
    next_cursor: str | None


def encode_cursor(time: float, row_id: int) -> str:
    raw = json.dumps([time, row_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode()


def decode_cursor(cursor: str) -> tuple[float, int]:
    """The (time, id) in a cursor; ValueError when it is not one this module made."""
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (binascii.Error, ValueError, UnicodeError):
        raise ValueError("malformed cursor") from None
    match value:
        case [int() | float() as time, int() as row_id] if not isinstance(time, bool):
            return float(time), row_id
    raise ValueError("malformed cursor")
