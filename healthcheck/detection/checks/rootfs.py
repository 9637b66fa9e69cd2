"""The root filesystem remounted read-only (the kernel does this on I/O errors): nothing can
write logs, checkpoints or container layers until a reboot."""

from __future__ import annotations

from exporter.core.findings import Finding
from exporter.core.snapshot import NodeSnapshot
from healthcheck.detection.checks.base import History, finding
from healthcheck.detection.config import HealthConfig


def check(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    if snapshot.rootfs_read_only is not True:
        return []
    return [
        finding(
            history, now, "rootfs_read_only", "node", "critical", "reboot", "/ is mounted read-only"
        )
    ]
