"""Sustained hardware thermal or power slowdown, from NVML's clock-event reasons.

A hardware slowdown for a few seconds is the GPU protecting itself and normal; one that lasts
(`thermal.sustain_seconds`) throttles the whole synchronous job to this GPU's pace. Until then
the finding is informational. The action defaults to none (a reboot does not fix cooling).
"""

from __future__ import annotations

from exporter.core.findings import Finding
from exporter.core.snapshot import NodeSnapshot
from healthcheck.detection.checks.base import History, finding
from healthcheck.detection.config import HealthConfig

CHECK = "thermal_slowdown"


def check(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    wanted = config.thermal.reasons
    out: list[Finding] = []
    for gpu in snapshot.gpu.gpus:
        reasons = sorted((gpu.clock_event_reasons or frozenset()) & wanted)
        if not gpu.up or not reasons:
            continue
        component = f"gpu{gpu.index}"
        lasted = now - history.first_seen(CHECK, component, now)
        sustained = lasted >= config.thermal.sustain_seconds
        temperature = gpu.temperature_gpu_celsius
        hot = f", {temperature:.0f} C" if temperature is not None else ""
        out.append(
            finding(
                history,
                now,
                CHECK,
                component,
                "warning" if sustained else "info",
                config.thermal.action if sustained else "none",
                f"{' + '.join(reasons)} for {lasted:.0f}s{hot}",
            )
        )
    return out
