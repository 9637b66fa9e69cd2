"""Is all the hardware there: NVML answering, every GPU readable, the instance type's count of
GPUs and EFA devices present.

Counts are judged only against a known instance type and only when the collector ran: a node
of an unknown type, or a poll whose sysfs read failed, is no evidence of missing hardware.
A GPU that stopped answering is the same fault as XID 79 (off the bus): replace.
"""

from __future__ import annotations

from exporter.snapshot import NodeSnapshot
from healthcheck.checks.base import History, collector_ok, finding
from healthcheck.config import HealthConfig
from healthcheck.findings import Finding


def check(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    instance_type = snapshot.topology.instance_type
    shape = config.expected_shape(instance_type) if instance_type else None
    out: list[Finding] = []
    gpu = snapshot.gpu
    if not gpu.available:
        if shape is not None or history.known_gpus:  # a GPU node whose NVML does not answer
            why = gpu.error or _collector_error(snapshot, "gpu") or "no answer"
            out.append(
                finding(history, now, "nvml_down", "node", "critical", "reboot", f"NVML: {why}")
            )
    else:
        for reading in gpu.gpus:
            if not reading.up:
                out.append(
                    finding(
                        history,
                        now,
                        "gpu_missing",
                        f"gpu{reading.index}",
                        "critical",
                        "replace",
                        f"GPU {reading.index} ({reading.pci_bus_id or 'unknown bus id'}) does not"
                        f" answer: {reading.error or 'lost'}",
                    )
                )
        seen = {g.index for g in gpu.gpus}
        for index in sorted(history.known_gpus - seen):
            out.append(
                finding(
                    history,
                    now,
                    "gpu_missing",
                    f"gpu{index}",
                    "critical",
                    "replace",
                    f"GPU {index} was enumerated earlier and is gone",
                )
            )
        if shape is not None and len(gpu.gpus) < shape.gpus and not history.known_gpus - seen:
            out.append(
                finding(
                    history,
                    now,
                    "gpu_missing",
                    "node",
                    "critical",
                    "replace",
                    f"NVML enumerates {len(gpu.gpus)} GPUs, {instance_type} has {shape.gpus}",
                )
            )
    if collector_ok(snapshot, "efa"):
        out.extend(_efa(snapshot, history, config, now, instance_type))
    return out


def _efa(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float, instance_type: str
) -> list[Finding]:
    shape = config.expected_shape(instance_type) if instance_type else None
    present = {d.device for d in snapshot.efa}
    gone = sorted(history.known_efa - present)
    out = [
        finding(
            history,
            now,
            "efa_missing",
            name,
            "critical",
            "reboot",
            f"EFA device {name} was present earlier and is gone",
        )
        for name in gone
    ]
    if shape is not None and len(present) < shape.efa and not gone:
        out.append(
            finding(
                history,
                now,
                "efa_missing",
                "node",
                "critical",
                "reboot",
                f"{len(present)} EFA devices present, {instance_type} has {shape.efa}",
            )
        )
    return out


def _collector_error(snapshot: NodeSnapshot, name: str) -> str | None:
    for c in snapshot.collectors:
        if c.name == name and not c.ok:
            return c.error
    return None
