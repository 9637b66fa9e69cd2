"""Faults only the kernel log shows: a GPU fallen off the bus, NVSwitch SXIDs, EFA driver
errors, PCIe AER, NVLink error lines, hung tasks, NVIDIA UVM's global fatal error ("requiring os
reboot to recover": `kernel_uvm_fatal` on the node) and a GPU the driver failed to initialise
(`RmInitAdapter failed!`: `kernel_gpu_init_failed` on that GPU, or on its PCI address when the
agent never read it, as a GPU that failed to initialise never answers NVML).

Lines are events, judged as XIDs are: a finding per (kind, GPU or device) while the latest
matching line is younger than `kernel_log.hold_seconds`. What a line asks for follows the
pattern table's severity (exporter/core/data/kernel-log-patterns.csv): fatal lines a reboot (the
first rung; the remediation ladder climbs from there), errors nothing unless configured,
warnings (a hung task, a non-fatal SXID) nothing, corrected PCIe errors only in numbers. XID
lines are left to the XID check: the poller merged them with NVML's XIDs, one fault one event.
"N callbacks suppressed" lines (the kernel's ratelimit dropped N messages) are counted in
`topowatch_kernel_log_suppressed_total`, not judged: what was dropped is unknown.
"""

from __future__ import annotations

from collections import defaultdict

from exporter.core.findings import ACTIONS, SEVERITIES, Finding
from exporter.core.snapshot import KernelLogCount, NodeSnapshot
from healthcheck.detection.checks.base import History, finding
from healthcheck.detection.config import HealthConfig

_NOT_JUDGED = frozenset({"xid", "printk_suppressed"})  # the XID check's; only counted


def check(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    reading = snapshot.kernel_log
    if reading is None:
        return []
    cfg = config.kernel_log
    judged: dict[tuple[str, str], list[tuple[tuple[str, str], KernelLogCount]]] = defaultdict(list)
    for c in reading.counts:
        if c.kind in _NOT_JUDGED or now - c.last_at > cfg.hold_seconds:
            continue
        verdict = _verdict(c, config)
        if verdict is not None:
            judged[(f"kernel_{c.kind}", _component(c))].append((verdict, c))
    out = []
    for (check_id, component), entries in sorted(judged.items()):
        severity, action = max((verdict for verdict, _ in entries), key=_rank)
        counts = [c for _, c in entries]
        latest = max(counts, key=lambda c: c.last_at)
        lines = sum(c.count for c in counts)
        evidence = (
            f"{lines} kernel log line(s), latest {max(0, int(now - latest.last_at))}s ago: "
            f"{latest.last_message}"
        )
        out.append(finding(history, now, check_id, component, severity, action, evidence))
    return out


def _verdict(c: KernelLogCount, config: HealthConfig) -> tuple[str, str] | None:
    cfg = config.kernel_log
    if c.severity == "fatal":
        return "critical", cfg.fatal_action
    if c.severity == "error":
        return "warning", cfg.error_action
    if c.severity == "corrected":
        if cfg.corrected_report_count and c.count >= cfg.corrected_report_count:
            return "warning", "none"
        return None
    return "warning", "none"


def _rank(verdict: tuple[str, str]) -> tuple[int, int]:
    return ACTIONS.index(verdict[1]), SEVERITIES.index(verdict[0])


def _component(c: KernelLogCount) -> str:
    if c.gpu:
        return f"gpu{c.gpu}"
    return c.device or "node"
