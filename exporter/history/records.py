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
from dataclasses import dataclass
from typing import Any

MAX_LIMIT = 1000
DEFAULT_LIMIT = 100


@dataclass(frozen=True)
class PreemptionRow:
    """One preemption from the ledger. `key` is derived by the caller, e.g. victim uid +
    preemptor uid + whole-second time, so the same preemption seen twice is one row."""

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


@dataclass(frozen=True)
class AuditRow:
    """One remediation audit record (`AuditRecord.as_dict()` as the document)."""

    time: float
    node: str
    kind: str
    verdict: str
    reason: str
    action: str
    document: dict[str, Any]


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


Row = PreemptionRow | WorkloadRow | AuditRow | ScaleEventRow


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
    """Audit records at time >= `since`, newest first, optionally of one node."""

    since: float
    node: str | None = None
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
