"""Is all the hardware there: NVML answering, every GPU readable, the instance type's count of
GPUs and EFA devices present.

Counts are judged only against a known instance type and only when the collector ran: a node
of an unknown type, or a poll whose sysfs read failed, is no evidence of missing hardware.

NVML's failures are judged by what their return code means (the GPU source classifies each,
see `_MEANING` in exporter/sources/nvml.py), never by "NVML does not answer" alone:

* deployment (LIBRARY_NOT_FOUND, NO_PERMISSION, OPERATING_SYSTEM, FUNCTION_NOT_FOUND,
  DRIVER_NOT_LOADED and LIB_RM_VERSION_MISMATCH whenever they come, and any failure while NVML
  has never worked since the agent started): finding `deployment`, warning, no action, on the
  node or the one GPU. The agent's pod is wrong, not the node; a reboot would not fix it and a
  bad rollout must not reboot the fleet. A driver unloaded under a running agent ("NVIDIA driver
  is not loaded") or replaced by another version ("RM detects a driver/library version
  mismatch": the library the agent loaded is the old one) is someone's upgrade or the GPU
  operator's driver container, not a failing GPU: a GPU that fails says GPU_IS_LOST, an XID.
* hardware, NVML as a whole (it worked, then failed with another code): `nvml_down`, reboot.
* hardware, one GPU (GPU_IS_LOST "fallen off the bus", IRQ_ISSUE, INSUFFICIENT_POWER, or a GPU
  that was enumerated and is gone): `gpu_missing`, replace, the same fault as XID 79.
* reset (RESET_REQUIRED): `gpu_reset_required`, critical, `nvml.reset_action` (reboot: a GPU
  reset on a managed node).
* timeout (TIMEOUT): `gpu_timeout`. The source retries every poll. The finding recommends
  `nvml.timeout_action` only when other evidence agrees: the kernel driver reported an XID on
  that GPU that is not an application or ignorable one (held in the XID memory), or the GPU's
  reading of the previous poll carried other errors (fields it could not read while it still
  answered, or a lost / reset-required failure). Damping then makes it actionable only once
  the timeouts held for K of the last N polls (`damping`, or `damping_overrides.gpu_timeout`).
  Without evidence it is a warning with no action, however long it lasts: a busy driver times
  out too. `nvml.timeout_needs_evidence: false` acts on persistence alone.
* unknown (no NVML code: an exception in the agent after NVML had worked): `nvml_down`, warning,
  no action.
"""

from __future__ import annotations

from exporter.core.findings import Finding
from exporter.core.snapshot import (
    NVML_DEPLOYMENT,
    NVML_HARDWARE,
    NVML_RESET,
    NVML_TIMEOUT,
    NVML_UNKNOWN,
    GpuReading,
    NodeSnapshot,
)
from healthcheck.detection.checks.base import History, collector_ok, finding
from healthcheck.detection.checks.recovery import verdict as recovery_verdict
from healthcheck.detection.checks.xid import verdict
from healthcheck.detection.config import HealthConfig


def check(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    instance_type = snapshot.topology.instance_type
    shape = config.expected_shape(instance_type) if instance_type else None
    out: list[Finding] = []
    gpu = snapshot.gpu
    if not gpu.available:
        failure = gpu.failure
        why = gpu.error or _collector_error(snapshot, "gpu") or "no answer"
        if failure is not None:
            why = f"{why} [{failure.name}]"
        if failure is not None and failure.kind == NVML_DEPLOYMENT:
            out.append(
                finding(
                    history,
                    now,
                    "deployment",
                    "node",
                    "warning",
                    "none",
                    f"NVML unusable as the agent is deployed (not a hardware fault): {why}",
                )
            )
        elif shape is not None or history.known_gpus:  # a GPU node whose NVML does not answer
            if failure is None or failure.kind == NVML_UNKNOWN:
                out.append(
                    finding(
                        history,
                        now,
                        "nvml_down",
                        "node",
                        "warning",
                        "none",
                        f"NVML: {why} (no NVML return code: no evidence about the hardware)",
                    )
                )
            else:
                out.append(
                    finding(
                        history,
                        now,
                        "nvml_down",
                        "node",
                        "critical",
                        "reboot",
                        f"NVML stopped after working: {why}",
                    )
                )
    else:
        for reading in gpu.gpus:
            if not reading.up:
                out.append(_gpu_down(reading, history, config, now))
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


def _gpu_down(reading: GpuReading, history: History, config: HealthConfig, now: float) -> Finding:
    """One GPU that did not answer this poll, judged by the code it failed with."""
    component = f"gpu{reading.index}"
    failure = reading.failure
    what = f"GPU {reading.index} ({reading.pci_bus_id or 'unknown bus id'})"
    error = reading.error or "lost"
    if failure is not None:
        error = f"{error} [{failure.name}]"
    kind = failure.kind if failure is not None else None
    if kind == NVML_DEPLOYMENT:
        return finding(
            history,
            now,
            "deployment",
            component,
            "warning",
            "none",
            f"{what} cannot be opened as the agent is deployed (not a hardware fault): {error}",
        )
    if kind == NVML_RESET:
        return finding(
            history,
            now,
            "gpu_reset_required",
            component,
            "critical",
            config.nvml.reset_action,
            f"{what} needs a reset before it can be used again: {error}",
        )
    if kind == NVML_TIMEOUT:
        evidence = _timeout_evidence(reading.index, history, config)
        if evidence or not config.nvml.timeout_needs_evidence:
            also = f"; {'; '.join(evidence)}" if evidence else ""
            return finding(
                history,
                now,
                "gpu_timeout",
                component,
                "critical",
                config.nvml.timeout_action,
                f"{what} NVML calls time out: {error}{also}",
            )
        return finding(
            history,
            now,
            "gpu_timeout",
            component,
            "warning",
            "none",
            f"{what} NVML calls time out: {error}; retried every poll, no other evidence of a"
            " hardware fault",
        )
    return finding(
        history,
        now,
        "gpu_missing",
        component,
        "critical",
        "replace",
        f"{what} does not answer: {error}",
    )


def _timeout_evidence(index: int, history: History, config: HealthConfig) -> list[str]:
    """What besides the timeouts says GPU `index` is at fault (empty: nothing)."""
    out: list[str] = []
    xids = sorted(
        {
            r.xid
            for r in history.xids.records
            if r.gpu_index == index
            and (
                verdict(r.xid, config.xid.app_xids)[0] != "info"
                or (r.named_action is not None and recovery_verdict(r.named_action)[2] != "none")
            )
        }
    )
    if xids:
        out.append(f"the kernel driver reported XID {', '.join(map(str, xids))} on it")
    previous = history.previous
    if previous is not None:
        for g in previous.gpu.gpus:
            if g.index != index:
                continue
            if g.up and g.error:
                out.append(f"errors while it last answered: {g.error}")
            elif (
                not g.up and g.failure is not None and g.failure.kind in (NVML_HARDWARE, NVML_RESET)
            ):
                out.append(f"it failed {g.failure.name} the poll before")
    return out


def _collector_error(snapshot: NodeSnapshot, name: str) -> str | None:
    for c in snapshot.collectors:
        if c.name == name and not c.ok:
            return c.error
    return None
