"""The XIDs the agent holds, and the kernel log lines it judged, kept in a small file so a
restarted agent still has them.

An XID is an event, delivered once: NVML's event set does not deliver it again, and the kernel
log reader resumes after the last line it read (`--kernel-log-state`), so a line read before a
restart is never read again. The XID check holds each XID's finding for `xid.hold_seconds`
(XidMemory); without this file a restart in that hour (a DaemonSet rollout while remediation
defers the node for its budget or cooldown) forgets the XID, the finding disappears from the
Node, and the controller withdraws the action it had decided on.

The same holds for the other findings judged from the kernel log alone (a GPU fallen off the
bus while NVML hangs, UVM's global fatal error, a failed EFA reset, a GPU the driver could not
initialise: healthcheck/detection/checks/kernel_log.py), held for `kernel_log.hold_seconds` after
their latest line: no NVML reading confirms them again after a restart, and their lines are
behind the cursor. They are kept beside the XIDs (`kernel_log`: each line's counts and when the
agent first held it) and handed back to the check through `History.kernel_log`.

Where: `xids.state.json` in the `--kernel-log-state` directory, beside the kernel log's own
cursor. The two are one state: the cursor says "lines up to here are read", and the XIDs read
from those lines are what that reading found; keeping one without the other loses the XIDs.
The directory is already on a host path or an emptyDir in the chart and the systemd unit's
StateDirectory on Slurm hosts, writable by the agent and nowhere else. (The Node's findings
annotation was the other candidate; it carries only findings, not the XID records the checks
are built on, and exists only under Kubernetes.)

After a reboot nothing is restored: the file records the boot id, and XIDs of an earlier boot
are what the reboot remedied (a finding from before a reboot must never count as the fault
coming back). A file that is missing, unreadable or corrupt is an empty memory, logged once.

Writes happen only when the memory changed (an XID arrived, one aged out), through a temporary
file renamed over the old one (exporter/core/atomicfile.py, without fsync: the state has to
survive a restart of the agent, not a power loss, after which the boot id is new anyway), so a
crash leaves the old state or the new, never half of one.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from exporter.core.atomicfile import atomic_write
from exporter.core.snapshot import KernelLogCount
from healthcheck.detection.checks.base import HeldLine
from healthcheck.detection.checks.xid_memory import AppXidHit, XidMemory, XidRecord

log = logging.getLogger(__name__)

XID_STATE_FILE = "xids.state.json"
VERSION = 1


def encode(
    memory: XidMemory, boot_id: str, kernel_log: tuple[HeldLine, ...] = ()
) -> dict[str, Any]:
    """The file's content for `memory` (and the kernel log lines held) in the boot `boot_id`.
    `kernel_log` is a key of its own, left out when empty: a file without it is what an agent
    before it wrote, and one with it still reads as version 1 (an older agent ignores it)."""
    data: dict[str, Any] = {
        "version": VERSION,
        "boot_id": boot_id,
        "records": [_plain(r) for r in memory.records],
        "app_hits": [_plain(h) for h in memory.app_hits],
    }
    if kernel_log:
        data["kernel_log"] = [{**_plain(h.count), "first_seen": h.first_seen} for h in kernel_log]
    return data


def decode_kernel_log(data: object, boot_id: str) -> tuple[tuple[HeldLine, ...], str]:
    """(kernel log lines held, why there are none) from a file's content, as `decode`."""
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return (), "not a state file of this version"
    if not boot_id or data.get("boot_id") != boot_id:
        return (), "written in another boot: the reboot remedied those faults"
    try:
        lines = []
        for raw in data.get("kernel_log") or []:
            count = _record(KernelLogCount, raw)
            first = _record(_FirstSeen, raw)
            lines.append(HeldLine(count, first.first_seen))
    except (TypeError, ValueError) as e:
        return (), f"corrupt ({e})"
    return tuple(lines), ""


@dataclass(frozen=True, slots=True)
class _FirstSeen:  # the one field a held line adds to its KernelLogCount
    first_seen: float


def decode(data: object, boot_id: str) -> tuple[XidMemory, str]:
    """(memory, why it is empty) from a file's content: empty for another boot or bad data."""
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return XidMemory(), "not a state file of this version"
    if not boot_id or data.get("boot_id") != boot_id:
        return XidMemory(), "written in another boot: the reboot remedied those XIDs"
    try:
        records = tuple(_record(XidRecord, r) for r in data.get("records") or [])
        hits = tuple(_record(AppXidHit, h) for h in data.get("app_hits") or [])
    except (TypeError, ValueError) as e:
        return XidMemory(), f"corrupt ({e})"
    return XidMemory(records=records, app_hits=hits), ""


def _plain(value: XidRecord | AppXidHit | KernelLogCount) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in fields(value)}


def _record(cls: type[Any], raw: object) -> Any:
    """One record back from its dict, every field of its declared type (no more, no less)."""
    if not isinstance(raw, dict):
        raise ValueError(f"{cls.__name__} entry is not an object")
    values: dict[str, Any] = {}
    for f in fields(cls):
        value = raw.get(f.name)
        declared = str(f.type)  # the annotation's text (postponed evaluation)
        if declared == "str":
            ok = isinstance(value, str)
        elif declared == "float":
            ok = False
            if isinstance(value, int | float) and not isinstance(value, bool):
                ok = math.isfinite(value)
                value = float(value)
        else:  # int, or int | None
            optional = declared == "int | None" and value is None
            ok = optional or (isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            raise ValueError(f"{cls.__name__}.{f.name} is {value!r}")
        values[f.name] = value
    return cls(**values)


class XidStateFile:
    """The XID memory's file for one boot of the node. Not thread-safe: the poll thread only."""

    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = path
        self.boot_id = boot_id
        self.kernel_log: tuple[HeldLine, ...] = ()  # what `load` restored of the kernel log's
        self._written: dict[str, Any] | None = None
        self._write_failed = False

    def load(self) -> XidMemory:
        """What the agent before this one held in this boot; empty otherwise (logged). The
        kernel log lines it held are left in `kernel_log`."""
        self.kernel_log = ()
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return XidMemory()
        except (OSError, ValueError) as e:
            log.warning("XID state %s unreadable (%s): starting with no XIDs held", self.path, e)
            return XidMemory()
        memory, why = decode(data, self.boot_id)
        lines, why_lines = decode_kernel_log(data, self.boot_id) if not why else ((), why)
        if why:
            log.info("XID state %s not restored: %s", self.path, why)
        elif memory.records:
            log.info(
                "restored %d held XID(s) from %s: %s",
                len(memory.records),
                self.path,
                ", ".join(f"XID {r.xid} on GPU {r.gpu_index}" for r in memory.records),
            )
        if why_lines and not why:
            log.info("kernel log findings in %s not restored: %s", self.path, why_lines)
        elif lines:
            log.info(
                "restored %d held kernel log line kind(s) from %s: %s",
                len(lines),
                self.path,
                ", ".join(sorted({f"{h.count.kind}@{_where(h)}" for h in lines})),
            )
        self.kernel_log = lines
        self._written = encode(memory, self.boot_id, lines) if not why else None
        return memory

    def save(self, memory: XidMemory, kernel_log: tuple[HeldLine, ...] = ()) -> None:
        """Write `memory` and the kernel log lines held when they changed since the last write;
        a failure is logged once and the agent goes on (a restart would then forget, as
        before)."""
        data = encode(memory, self.boot_id, kernel_log)
        if data == self._written:
            return
        try:
            atomic_write(self.path, json.dumps(data, sort_keys=True), durable=False)
        except OSError as e:
            if not self._write_failed:
                log.warning(
                    "cannot write XID state %s (%s): a restarted agent will forget the XIDs"
                    " it holds",
                    self.path,
                    e,
                )
                self._write_failed = True
            return
        if self._write_failed:
            log.info("XID state %s written again", self.path)
            self._write_failed = False
        self._written = data


def _where(line: HeldLine) -> str:
    c = line.count
    return f"gpu{c.gpu}" if c.gpu else (c.device or "node")
