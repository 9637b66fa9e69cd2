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
import re
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


# The driver's own verdict on what a GPU needs, nvml.h nvmlDeviceGpuRecoveryAction_t
# (NVML_GPU_RECOVERY_ACTION_*, read as NVML field 230 NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), with
# the words the driver prints for each in XID 154 (NVIDIA/open-gpu-kernel-modules 595.45.04,
# src/nvidia/src/kernel/gpu/gpu.c `_gpuRecoveryActionName`; 6 and 7 are nvml.h's newer values).
RECOVERY_NONE = 0
RECOVERY_GPU_RESET = 1
RECOVERY_NODE_REBOOT = 2
RECOVERY_DRAIN_P2P = 3
RECOVERY_DRAIN_AND_RESET = 4
RECOVERY_RECOVER_IMEX_DOMAIN = 5
RECOVERY_BUS_RESET = 6
RECOVERY_SYSTEM_REBOOT = 7
RECOVERY_NAMES = {
    RECOVERY_NONE: "None",
    RECOVERY_GPU_RESET: "GPU Reset Required",
    RECOVERY_NODE_REBOOT: "Node Reboot Required",
    RECOVERY_DRAIN_P2P: "Drain P2P",
    RECOVERY_DRAIN_AND_RESET: "Drain and Reset",
    RECOVERY_RECOVER_IMEX_DOMAIN: "Recover IMEX Domain",
    RECOVERY_BUS_RESET: "Bus Reset",
    RECOVERY_SYSTEM_REBOOT: "System Reboot",
}
XID_RECOVERY_ACTION_CHANGED = 154

# XID 154's text: nvErrorLog_va(pGpu, GPU_RECOVERY_ACTION_CHANGED, "GPU recovery action changed
# from 0x%x (%s) to 0x%x (%s)", old, name(old), new, name(new)) (gpu.c `gpuRefreshRecoveryAction`).
_RECOVERY_CHANGED = re.compile(
    r"recovery action changed (?:from 0x[0-9a-fA-F]+ \([^)]*\) )?to 0x(?P<new>[0-9a-fA-F]{1,8})\b"
)


def recovery_action_named(message: str) -> int | None:
    """The recovery action an XID 154 line changed to ("... to 0x1 (GPU Reset Required)" -> 1);
    None when the text names none (NVML's event set carries no text, only the code)."""
    m = _RECOVERY_CHANGED.search(message)
    return int(m["new"], 16) if m else None


def recovery_name(action: int) -> str:
    return RECOVERY_NAMES.get(action, f"0x{action:x}")


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
