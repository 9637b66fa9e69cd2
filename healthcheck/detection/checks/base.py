"""What every check shares: the history a monitor keeps for it, and how a finding is made.

Checks are pure: a snapshot, the history, the configuration and the time in; findings out.
Whatever must persist across polls (the previous snapshot for rates, when a condition began,
the XID memory) is handed in through `History`, which the monitor owns and rebuilds each poll.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from exporter.core.findings import Finding
from exporter.core.snapshot import KernelLogCount, NodeSnapshot
from healthcheck.detection.checks.xid_memory import XidMemory


@dataclass(frozen=True, slots=True)
class HeldLine:
    """Kernel log lines of one (kind, pattern, severity, GPU, device), as an agent held them for
    the kernel log check: their count and latest line, and when the monitor first held them.
    An earlier agent of this boot wrote them to the state file; the lines themselves are behind
    the kernel log's cursor and are never read again (healthcheck/detection/xid_state.py)."""

    count: KernelLogCount
    first_seen: float

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        c = self.count
        return (c.kind, c.pattern, c.severity, c.gpu, c.device)


@dataclass(frozen=True, slots=True)
class History:
    previous: NodeSnapshot | None = None  # the last poll, for counter rates
    onset: Mapping[tuple[str, str], float] = field(default_factory=dict)  # key -> first seen
    known_gpus: frozenset[int] = frozenset()  # GPU indexes seen since the agent started
    known_efa: frozenset[str] = frozenset()  # EFA devices seen since the agent started
    # GPU UUID -> when the agent first read that GPU (up), for start-up grace periods
    gpu_first_seen: Mapping[str, float] = field(default_factory=dict)
    xids: XidMemory = field(default_factory=XidMemory)
    # Kernel log lines an earlier agent of this boot held (restored; this agent's own counts are
    # in the snapshot's kernel log reading): the kernel log check adds them to the reading's.
    kernel_log: tuple[HeldLine, ...] = ()

    def first_seen(self, check: str, component: str, now: float) -> float:
        return self.onset.get((check, component), now)


@dataclass(frozen=True, slots=True)
class Problem:
    """A finding before it is placed in time and on a component."""

    check: str
    severity: str
    action: str
    evidence: str


def finding(
    history: History,
    now: float,
    check: str,
    component: str,
    severity: str,
    action: str,
    evidence: str,
) -> Finding:
    """A finding seen now, whose onset is carried over from earlier polls."""
    return Finding(
        check=check,
        component=component,
        severity=severity,
        action=action,
        evidence=evidence,
        first_seen=history.first_seen(check, component, now),
        last_seen=now,
    )


def collector_ok(snapshot: NodeSnapshot, name: str) -> bool:
    """Whether a collector succeeded this poll; absent counts as not ok (nothing to judge)."""
    return any(c.name == name and c.ok for c in snapshot.collectors)


def rate(current: int | None, previous: int | None, seconds: float) -> float | None:
    """Per-second increase of a cumulative counter; None across a reset or a gap."""
    if current is None or previous is None or seconds <= 0 or current < previous:
        return None
    return (current - previous) / seconds
