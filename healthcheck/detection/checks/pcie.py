"""PCIe: a GPU's link trained below its maximum width, or (while busy) its maximum generation.

GPUs drop to a lower PCIe generation when idle to save power, so a low generation counts only
while the GPU is busy; a narrow link is never a power state. Re-training takes a reboot.
"""

from __future__ import annotations

from exporter.core.findings import Finding
from exporter.core.snapshot import GpuReading, NodeSnapshot
from healthcheck.detection.checks.base import History, finding
from healthcheck.detection.config import HealthConfig


def check(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    out: list[Finding] = []
    for gpu in snapshot.gpu.gpus:
        if not gpu.up:
            continue
        problems = _problems(gpu, config.pcie.min_utilization_for_generation)
        if problems:
            out.append(
                finding(
                    history,
                    now,
                    "pcie_degraded",
                    f"gpu{gpu.index}",
                    "warning",
                    "reboot",
                    "PCIe link " + ", ".join(problems),
                )
            )
    return out


def _problems(gpu: GpuReading, min_utilization: float) -> list[str]:
    out = []
    width, width_max = gpu.pcie_link_width_current, gpu.pcie_link_width_max
    if width is not None and width_max is not None and 0 < width < width_max:
        out.append(f"width x{width} of x{width_max}")
    gen, gen_max = gpu.pcie_link_gen_current, gpu.pcie_link_gen_max
    busy = gpu.utilization_gpu_ratio is not None and gpu.utilization_gpu_ratio >= min_utilization
    if gen is not None and gen_max is not None and 0 < gen < gen_max and busy:
        out.append(f"gen {gen} of {gen_max} while {gpu.utilization_gpu_ratio:.0%} busy")
    return out
