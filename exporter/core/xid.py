"""The XID catalog and the ledger that turns XID events into counters.

dcgm-exporter's DCGM_FI_DEV_XID_ERRORS is a gauge holding the last XID, so the same XID twice in
a row is invisible. The ledger counts every event per (GPU, XID), so a repeat is a counter
increase, and keeps the last XID and its time per GPU beside it.

It also remembers, per (GPU, XID), when the last event came and which pod held the GPU then. The
counter carries no pod labels (a pod taking the GPU over must not make a new counter series); the
alerts name the pod through that remembered holder, which changes only with a new event.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

from exporter.core.snapshot import (
    LastXid,
    PodRef,
    XidCount,
    XidEvent,
    XidTotals,
)

NO_HOLDER = PodRef("", "", "")


@dataclass(frozen=True, slots=True)
class XidInfo:
    xid: int
    name: str
    severity: str  # FATAL | NONFATAL
    action: str  # NVIDIA's immediate-action bucket: RESTART_APP, RESET_GPU, RESTART_BM, ...


UNKNOWN_ACTION = "UNKNOWN"


@cache
def catalog() -> dict[int, XidInfo]:
    text = resources.files("exporter.core.data").joinpath("xid-catalog.csv").read_text()
    rows = csv.DictReader(text.splitlines())
    return {
        int(r["xid"]): XidInfo(int(r["xid"]), r["name"], r["severity"], r["action"]) for r in rows
    }


def describe(xid: int) -> XidInfo:
    """Catalog entry for an XID; codes newer than the catalog are reported, not dropped."""
    return catalog().get(xid) or XidInfo(xid, f"XID_{xid}", "UNKNOWN", UNKNOWN_ACTION)


class XidLedger:
    """Accumulates XID events across polls. Mutable, but owned by the poller alone; each poll
    takes an immutable `totals()` for its snapshot."""

    def __init__(self) -> None:
        self._counts: dict[tuple[int, str, int], int] = {}
        self._seen: dict[tuple[int, str, int], tuple[float, PodRef]] = {}
        self._last: dict[tuple[int, str], LastXid] = {}

    def record(
        self, events: Iterable[XidEvent], holders: Mapping[str, PodRef] | None = None
    ) -> None:
        """Count `events`; `holders` (GPU UUID -> pod, as read in the same poll) names the pod
        that held each GPU when its events arrived (no entry: no pod)."""
        for e in events:
            key = (e.gpu_index, e.uuid, e.xid)
            self._counts[key] = self._counts.get(key, 0) + 1
            seen = self._seen.get(key)
            if seen is None or e.timestamp >= seen[0]:
                holder = holders.get(e.uuid, NO_HOLDER) if holders is not None else NO_HOLDER
                self._seen[key] = (e.timestamp, holder)
            prev = self._last.get((e.gpu_index, e.uuid))
            if prev is None or e.timestamp >= prev.timestamp:
                self._last[(e.gpu_index, e.uuid)] = LastXid(e.gpu_index, e.uuid, e.xid, e.timestamp)

    def totals(self) -> XidTotals:
        counts = tuple(
            XidCount(g, u, x, n, *self._seen[(g, u, x)])
            for (g, u, x), n in sorted(self._counts.items())
        )
        last = tuple(self._last[k] for k in sorted(self._last))
        return XidTotals(counts=counts, last=last)
