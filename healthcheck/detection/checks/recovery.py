"""The driver's own verdict on a GPU: NVML's GPU recovery action, and XID 154 that announces it.

Since R570 the driver keeps, per GPU, what must be done before the GPU is fully usable again
(nvml.h `nvmlDeviceGpuRecoveryAction_t`, read as field 230 `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`;
`nvidia-smi -q` shows it as "GPU Recovery Action"). It is set by the driver after a fault and
persists until the action is done (a reset clears it), and every change is logged as XID 154,
"GPU recovery action changed from 0x%x (%s) to 0x%x (%s)" (open-gpu-kernel-modules 595.45.04,
src/nvidia/src/kernel/gpu/gpu.c `gpuRefreshRecoveryAction`). NVIDIA's XID catalog says of 154:
use the action it names; it overrides the action of the XID that came with it.

What each value asks for (nvml.h; NVIDIA's XID catalog and GPU memory error management docs):

* GPU_RESET (1), BUS_RESET (6): the GPU must be reset before it is used again. Finding
  `gpu_recovery_reset`, critical; the remediation ladder starts it at a reset (providers that
  cannot reset one GPU reboot).
* DRAIN_AND_RESET (4): the GPU runs at reduced capacity (memory offlined after an uncorrectable
  error); running work is unaffected, new work should go elsewhere and the GPU be reset once
  drained: `gpu_recovery_reset` too (every remediation action drains first).
* NODE_REBOOT (2), SYSTEM_REBOOT (7): a GPU reset is not enough, the node must reboot (the driver
  sets it after a fatal UVM error: nvGpuOpsReportFatalError "requiring os reboot to recover"):
  `gpu_recovery_reboot`, critical, a reboot first.
* DRAIN_P2P (3): peer-to-peer traffic to the GPU must be stopped (the processes using it ended);
  the driver then names the real action. RECOVER_IMEX_DOMAIN (5): the IMEX domain, not this node,
  needs recovering. Neither is a node action: `gpu_recovery_action`, warning, none.
* NONE (0): nothing, whatever the other checks saw (a contained ECC error leaves it at none).

Where NVML's field can be read it is the verdict: it is current (a GPU reset clears it), so an
XID 154 older than the reset does not outlive it. Where it cannot (a driver without the field, a
GPU that no longer answers, NVML down or hung) the latest XID 154 line of that GPU names the
action, held as XIDs are held (`xid.hold_seconds`). An XID 154 delivered by NVML's event set
carries no text, so it names nothing: the field decides.
"""

from __future__ import annotations

from exporter.core.findings import Finding
from exporter.core.snapshot import NodeSnapshot
from exporter.core.xid import (
    RECOVERY_BUS_RESET,
    RECOVERY_DRAIN_AND_RESET,
    RECOVERY_DRAIN_P2P,
    RECOVERY_GPU_RESET,
    RECOVERY_NODE_REBOOT,
    RECOVERY_NONE,
    RECOVERY_RECOVER_IMEX_DOMAIN,
    RECOVERY_SYSTEM_REBOOT,
    XID_RECOVERY_ACTION_CHANGED,
    recovery_name,
)
from healthcheck.detection.checks.base import History, finding
from healthcheck.detection.config import HealthConfig

RESET = "gpu_recovery_reset"
REBOOT = "gpu_recovery_reboot"
OTHER = "gpu_recovery_action"

# value -> (check, severity, action, what it means)
VERDICTS: dict[int, tuple[str, str, str, str]] = {
    RECOVERY_GPU_RESET: (RESET, "critical", "reboot", "the GPU must be reset before it is used"),
    RECOVERY_BUS_RESET: (RESET, "critical", "reboot", "the GPU needs a bus reset"),
    RECOVERY_DRAIN_AND_RESET: (
        RESET,
        "critical",
        "reboot",
        "the GPU runs at reduced capacity: drain it, then reset it",
    ),
    RECOVERY_NODE_REBOOT: (
        REBOOT,
        "critical",
        "reboot",
        "the node must reboot (a GPU reset is not enough)",
    ),
    RECOVERY_SYSTEM_REBOOT: (REBOOT, "critical", "reboot", "the system must reboot"),
    RECOVERY_DRAIN_P2P: (
        OTHER,
        "warning",
        "none",
        "peer-to-peer traffic to the GPU must be drained; the driver then names the action",
    ),
    RECOVERY_RECOVER_IMEX_DOMAIN: (
        OTHER,
        "warning",
        "none",
        "the IMEX domain must be recovered (not a node action)",
    ),
}


def verdict(action: int) -> tuple[str, str, str, str]:
    """(check, severity, action, meaning) for a recovery action other than none."""
    return VERDICTS.get(
        action, (OTHER, "warning", "none", "a recovery action this agent does not know")
    )


def check(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    field: dict[int, int] = {
        g.index: g.recovery_action
        for g in snapshot.gpu.gpus
        if g.up and g.recovery_action is not None
    }
    named = {
        r.gpu_index: r
        for r in history.xids.records
        if r.xid == XID_RECOVERY_ACTION_CHANGED and r.named_action is not None
    }
    out: list[Finding] = []
    for index in sorted(set(field) | set(named)):
        record = named.get(index)
        if index in field:
            value = field[index]
            source = f"NVML recovery action 0x{value:x} ({recovery_name(value)})"
            if record is not None and record.named_action == value:
                source += ", announced by XID 154"
        else:
            assert record is not None and record.named_action is not None
            value = record.named_action
            age = max(0, int(now - record.named_at))
            source = (
                f"XID 154: recovery action changed to 0x{value:x} ({recovery_name(value)})"
                f" {age}s ago (NVML's field unread)"
            )
        if value == RECOVERY_NONE:
            continue
        check_id, severity, action, meaning = verdict(value)
        evidence = f"GPU {index}: {source}: {meaning}"
        out.append(finding(history, now, check_id, f"gpu{index}", severity, action, evidence))
    return out
