"""The node agent's health state across polls: checks, damping and XID memory in one place.

The poller calls `observe(snapshot)` once per poll, before rendering, and renders `families()`
into the same exposition, so health series and hardware series always describe the same poll
and NVML is read once. Everything per-node that outlives a poll lives here: the previous
snapshot (for rates), when each finding began, the damping windows, the XID memory, and the
counters of checks run, failed and reports written. The XID memory and the kernel log lines
the checks hold also outlive the agent, within one boot (`keep_xids`,
healthcheck/detection/xid_state.py): an XID, or a line, arrives once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.core.exposition import COUNTER, GAUGE, Family
from exporter.core.findings import Finding, identify_gpus, worst_first
from exporter.core.snapshot import NodeSnapshot
from exporter.core.ultraserver import NodeFabric
from exporter.core.xid import XID_RECOVERY_ACTION_CHANGED, recovery_action_named
from healthcheck.detection.checks import (
    FAMILIES,
    Check,
    History,
    run_check_families,
)
from healthcheck.detection.checks.base import HeldLine, collector_ok
from healthcheck.detection.checks.fabric import node_fabric
from healthcheck.detection.checks.kernel_log import LineKey, held_lines
from healthcheck.detection.checks.xid_memory import NamedAction, XidMemory, remember
from healthcheck.detection.config import HealthConfig
from healthcheck.detection.damping import Damper
from healthcheck.detection.xid_state import XidStateFile

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HealthReport:
    """The verdict of one poll: every active finding, worst first, with `actionable` set."""

    node: str
    taken_at: float
    findings: tuple[Finding, ...]
    failed_checks: tuple[tuple[str, str], ...] = ()  # (family, error)
    # The GPUs' NVLink fabric summary the cluster judges the node's UltraServer with
    # (exporter/core/ultraserver.py); None where no GPU has a fabric.
    fabric: NodeFabric | None = None

    @property
    def actionable(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.actionable)

    @property
    def healthy(self) -> bool:
        return not self.actionable


class HealthMonitor:
    """Runs the checks on each snapshot and keeps what they need between polls.

    `observe` is called from the poll thread only; `count_report` and `families` may be
    called from others (the reporter's thread, a test).
    """

    def __init__(
        self,
        config: HealthConfig | None = None,
        families: Sequence[tuple[str, Check]] = FAMILIES,
    ) -> None:
        self.config = config or HealthConfig()
        self._families = tuple(families)
        self._damper = Damper(self.config)
        self._previous: NodeSnapshot | None = None
        self._onset: dict[tuple[str, str], float] = {}
        self._known_gpus: frozenset[int] = frozenset()
        # GPU index -> (UUID, PCI bus id) as last read up: what names a finding's GPU physically
        # (a lost GPU keeps the ids it had; NVML renumbers only when the driver reloads).
        self._gpu_ids: dict[int, tuple[str, str]] = {}
        self._log_pci: dict[int, str] = {}  # GPU index -> PCI bus id a kernel log line gave
        self._known_efa: frozenset[str] = frozenset()
        self._gpu_first_seen: dict[str, float] = {}  # GPU UUID -> first poll that read it up
        self._xids = XidMemory()
        self._xid_state: XidStateFile | None = None
        # Kernel log lines the agent before this one held in this boot (from the state file),
        # and when this agent first held each of its own (for the file's `first_seen`).
        self._held_lines: tuple[HeldLine, ...] = ()
        self._line_first: dict[LineKey, float] = {}
        self._failing: dict[str, str] = {}
        self._lock = threading.Lock()
        self._runs: dict[str, int] = {}
        self._errors: dict[str, int] = {}
        self._report_counts: dict[tuple[str, str], int] = {}  # (outcome, kind|reason) -> n
        self.last: HealthReport | None = None

    def observe(self, snapshot: NodeSnapshot) -> HealthReport:
        now = snapshot.taken_at
        try:
            self._xids = remember(
                self._xids,
                snapshot.gpu.xid_events,
                snapshot.pods,
                self.config.xid,
                now,
                named_actions(snapshot),
            )
        except Exception:  # malformed events: keep the memory we had, say so once
            self._note_failure("xid_memory", "could not record XID events", exc_info=True)
        if self._xid_state is not None:
            self._xid_state.save(self._xids, self._hold_kernel_log(snapshot, now))
        history = History(
            previous=self._previous,
            onset=dict(self._onset),
            known_gpus=self._known_gpus,
            known_efa=self._known_efa,
            gpu_first_seen=self._first_seen_gpus(snapshot, now),
            xids=self._xids,
            kernel_log=self._held_lines,
        )
        run = run_check_families(snapshot, history, self.config, now, self._families)
        failed = dict(run.failed)
        for name in run.ran:
            if name in failed:
                self._note_failure(name, failed[name])
            elif self._failing.pop(name, None) is not None:
                log.info("health check %s recovered", name)
        findings = worst_first(
            identify_gpus(self._damper.update(run.findings), self._identities(snapshot))
        )
        self._log_changes(findings)
        self._onset = {f.key: f.first_seen for f in findings}
        self._remember_inventory(snapshot)
        self._previous = snapshot
        with self._lock:
            for name in run.ran:
                self._runs[name] = self._runs.get(name, 0) + 1
            for name in failed:
                self._errors[name] = self._errors.get(name, 0) + 1
        try:
            fabric = node_fabric(snapshot)
        except Exception:  # a malformed reading: say nothing about the fabric, keep the report
            self._note_failure("fabric_summary", "could not summarize the fabric", exc_info=True)
            fabric = None
        report = HealthReport(snapshot.node, now, tuple(findings), run.failed, fabric)
        self.last = report
        return report

    def keep_xids(self, state: XidStateFile) -> None:
        """Keep the XIDs and kernel log lines held in `state` (healthcheck/detection/
        xid_state.py): take over what the agent before this one held in this boot, and write
        every change from now on."""
        self._xids = state.load()
        self._held_lines = state.kernel_log
        self._xid_state = state

    def _hold_kernel_log(self, snapshot: NodeSnapshot, now: float) -> tuple[HeldLine, ...]:
        """The kernel log lines to keep over a restart: this agent's counts and the restored
        ones still inside `kernel_log.hold_seconds` (restored ones past it are dropped)."""
        hold = self.config.kernel_log.hold_seconds
        self._held_lines = tuple(h for h in self._held_lines if now - h.count.last_at <= hold)
        reading = snapshot.kernel_log
        if reading is None:
            return self._held_lines
        for c in reading.counts:
            self._line_first.setdefault((c.kind, c.pattern, c.severity, c.gpu, c.device), now)
        return held_lines(reading.counts, self._held_lines, self._line_first, hold, now)

    def count_report(self, outcome: str, label: str) -> None:
        """Count a reporter outcome: ("written", "condition"), ("error", "unavailable")..."""
        with self._lock:
            key = (outcome, label)
            self._report_counts[key] = self._report_counts.get(key, 0) + 1

    def report_count(self, outcome: str, label: str) -> int:
        with self._lock:
            return self._report_counts.get((outcome, label), 0)

    def families(self, node: str | None = None) -> list[Family]:
        """Health series for /metrics: one sample per active finding (bounded by checks x
        components), per-family run and error counters, and the reporter's counters."""
        report = self.last
        name = node or (report.node if report is not None else "")
        finding = Family(
            "topowatch_health_finding",
            GAUGE,
            "1 while a health check finding is active on this component.",
        )
        actionable = Family(
            "topowatch_health_finding_actionable",
            GAUGE,
            "1 when an active finding passed damping and recommends an action, else 0.",
        )
        healthy = Family(
            "topowatch_health_node_healthy",
            GAUGE,
            "1 when no finding on this node is actionable.",
        )
        runs = Family("topowatch_health_checks", COUNTER, "Health check family runs.")
        errors = Family(
            "topowatch_health_check_errors",
            COUNTER,
            "Health check family runs that raised (the family reported nothing that poll).",
        )
        writes = Family(
            "topowatch_health_report_writes",
            COUNTER,
            "Node condition, annotation and Event writes to the Kubernetes API.",
        )
        report_errors = Family(
            "topowatch_health_report_errors",
            COUNTER,
            "Failed attempts to report node health to the Kubernetes API, by reason.",
        )
        if report is not None:
            for f in report.findings:
                base = [("node", name), ("check", f.check), ("component", f.component)]
                finding.add([*base, ("severity", f.severity), ("action", f.action)], 1)
                actionable.add(base, int(f.actionable))
            healthy.add([("node", name)], int(report.healthy))
        with self._lock:
            for family, n in sorted(self._runs.items()):
                runs.add([("node", name), ("check", family)], n)
                errors.add([("node", name), ("check", family)], self._errors.get(family, 0))
            for (outcome, label), n in sorted(self._report_counts.items()):
                if outcome == "written":
                    writes.add([("node", name), ("kind", label)], n)
                else:
                    report_errors.add([("node", name), ("reason", label)], n)
        return [finding, actionable, healthy, runs, errors, writes, report_errors]

    # --- internals ---------------------------------------------------------------------------

    def _note_failure(self, name: str, message: str, exc_info: bool = False) -> None:
        """Log a failing check once, and again only if its error changes."""
        if self._failing.get(name) == message:
            return
        self._failing[name] = message
        log.warning(
            "health check %s failed: %s (it reports nothing)", name, message, exc_info=exc_info
        )
        with self._lock:
            self._errors.setdefault(name, 0)

    def _log_changes(self, findings: list[Finding]) -> None:
        before = {f.key for f in self.last.actionable} if self.last is not None else set()
        for f in findings:
            if f.actionable and f.key not in before:
                log.warning(
                    "health: %s on %s is actionable (%s, %s): %s",
                    f.check,
                    f.component,
                    f.severity,
                    f.action,
                    f.evidence,
                )
        now = {f.key for f in findings if f.actionable}
        for check, component in sorted(before - now):
            log.info("health: %s on %s cleared", check, component)

    def _first_seen_gpus(self, snapshot: NodeSnapshot, now: float) -> dict[str, float]:
        for g in snapshot.gpu.gpus:
            if g.up:
                self._gpu_first_seen.setdefault(g.uuid, now)
        return dict(self._gpu_first_seen)

    def _identities(self, snapshot: NodeSnapshot) -> dict[int, tuple[str, str]]:
        """GPU index -> (UUID, PCI bus id) for this poll's findings: this poll's readings, else
        what an earlier poll or an XID event of this agent said about that index, else the PCI
        address a kernel log line named it by (NVML hung from the start: no UUID is known, the
        address is the GPU's physical identity, exporter/node/kernel/events.py)."""
        if snapshot.kernel_log is not None:
            for e in snapshot.kernel_log.events:
                if e.gpu_index is not None and e.pci_address:
                    self._log_pci[e.gpu_index] = _nvml_bus_id(e.pci_address)
        ids = {index: ("", pci) for index, pci in self._log_pci.items()}
        ids.update(self._gpu_ids)
        for record in self._xids.records:
            if record.uuid and (record.gpu_index not in ids or not ids[record.gpu_index][0]):
                ids[record.gpu_index] = (record.uuid, ids.get(record.gpu_index, ("", ""))[1])
        for gpu in snapshot.gpu.gpus:
            if gpu.uuid:
                ids[gpu.index] = (gpu.uuid, gpu.pci_bus_id)
        return ids

    def _remember_inventory(self, snapshot: NodeSnapshot) -> None:
        if snapshot.gpu.available and collector_ok(snapshot, "gpu"):
            self._known_gpus |= {g.index for g in snapshot.gpu.gpus}
            self._gpu_ids.update(
                (g.index, (g.uuid, g.pci_bus_id)) for g in snapshot.gpu.gpus if g.uuid
            )
        if collector_ok(snapshot, "efa"):
            self._known_efa |= {d.device for d in snapshot.efa}


def named_actions(snapshot: NodeSnapshot) -> list[NamedAction]:
    """The recovery actions this poll's XID 154 lines name, on the GPUs they name."""
    reading = snapshot.kernel_log
    if reading is None:
        return []
    out = []
    for e in reading.events:
        if e.kind != "xid" or e.code != XID_RECOVERY_ACTION_CHANGED or e.gpu_index is None:
            continue
        action = recovery_action_named(e.message)
        if action is not None:
            out.append(NamedAction(e.gpu_index, action, e.timestamp))
    return out


def _nvml_bus_id(address: str) -> str:
    """A sysfs PCI address (`0000:53:00.0`) in NVML's spelling (`00000000:53:00.0`), the form
    findings carry (nvmlPciInfo_t.busId)."""
    domain, _, rest = address.partition(":")
    try:
        return f"{int(domain, 16):08X}:{rest.upper()}"
    except ValueError:
        return address
