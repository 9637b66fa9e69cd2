"""GPU processes allowed to run on CPUs outside their GPU's NUMA node: slower host-device
copies and a noisier job, never a broken node. A warning only, with no action."""

from __future__ import annotations

from exporter.core.findings import Finding
from exporter.core.snapshot import NodeSnapshot
from healthcheck.detection.checks.base import History, finding
from healthcheck.detection.config import HealthConfig


def check(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    return [
        finding(
            history,
            now,
            "numa_misplaced",
            f"gpu{a.gpu_index}",
            "warning",
            "none",
            f"{a.processes_off_numa} of {a.processes} processes may run off NUMA node"
            f" {a.numa_node}",
        )
        for a in snapshot.affinity
        if a.processes_off_numa > 0
    ]
