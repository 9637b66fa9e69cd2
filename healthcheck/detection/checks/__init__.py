"""Health checks: pure functions from one node snapshot (plus history) to findings.

Each family is a module with `check(snapshot, history, config, now) -> list[Finding]`.
`run_checks` runs them all; a family that raises is caught and reported in `CheckRun.failed`
(the monitor counts and logs it) and contributes no findings, so a bug in one check can
neither hide the others nor, by inventing a finding, cause an action.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from exporter.core.findings import Finding
from exporter.core.snapshot import NodeSnapshot
from healthcheck.detection.checks import (
    custom,
    efa,
    fabric,
    inventory,
    kernel_log,
    memory,
    numa,
    nvlink,
    pcie,
    recovery,
    rootfs,
    thermal,
    xid,
)
from healthcheck.detection.checks.base import History
from healthcheck.detection.config import HealthConfig

Check = Callable[[NodeSnapshot, History, HealthConfig, float], list[Finding]]

FAMILIES: tuple[tuple[str, Check], ...] = (
    ("xid", xid.check),
    ("memory", memory.check),
    ("recovery", recovery.check),
    ("inventory", inventory.check),
    ("nvlink", nvlink.check),
    ("fabric", fabric.check),
    ("pcie", pcie.check),
    ("thermal", thermal.check),
    ("efa", efa.check),
    ("numa", numa.check),
    ("rootfs", rootfs.check),
    ("custom", custom.check),
    ("kernel_log", kernel_log.check),
)

__all__ = ["FAMILIES", "CheckRun", "History", "run_check_families", "run_checks"]


@dataclass(frozen=True, slots=True)
class CheckRun:
    findings: tuple[Finding, ...]
    ran: tuple[str, ...]  # family names
    failed: tuple[tuple[str, str], ...]  # (family, "ExceptionType: message")


def run_check_families(
    snapshot: NodeSnapshot,
    history: History,
    config: HealthConfig,
    now: float,
    families: Sequence[tuple[str, Check]] = FAMILIES,
) -> CheckRun:
    found: list[Finding] = []
    failed: list[tuple[str, str]] = []
    for name, check in families:
        try:
            result = check(snapshot, history, config, now)
            found.extend(f for f in result if isinstance(f, Finding))
        except Exception as e:  # bad input or a bug: this family says nothing this poll
            failed.append((name, f"{type(e).__name__}: {e}"))
    return CheckRun(tuple(found), tuple(n for n, _ in families), tuple(failed))


def run_checks(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    """Every family's findings for one snapshot; failing families are left out."""
    return list(run_check_families(snapshot, history, config, now).findings)
