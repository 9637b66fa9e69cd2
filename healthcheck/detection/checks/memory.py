"""GPU memory health: uncorrectable ECC, row remapping and page retirement.

A volatile uncorrectable error or a pending remap is cleared or applied by a GPU reset (a
reboot here); a failed remap or a full retirement table means the memory itself is worn out
and the GPU must be replaced.
"""

from __future__ import annotations

from exporter.core.findings import Finding
from exporter.core.snapshot import GpuReading, NodeSnapshot
from healthcheck.detection.checks.base import History, Problem, finding
from healthcheck.detection.config import HealthConfig, MemoryConfig


def check(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    return [
        finding(history, now, p.check, f"gpu{gpu.index}", p.severity, p.action, p.evidence)
        for gpu in snapshot.gpu.gpus
        if gpu.up
        for p in problems(gpu, config.memory)
    ]


def problems(gpu: GpuReading, limits: MemoryConfig) -> list[Problem]:
    out: list[Problem] = []
    dbe = gpu.ecc.uncorrected_volatile
    if dbe is not None and dbe > limits.uncorrected_volatile_max:
        out.append(
            Problem(
                "ecc_uncorrectable",
                "critical",
                "reboot",
                f"{dbe} volatile uncorrectable ECC errors (max {limits.uncorrected_volatile_max})",
            )
        )
    rows = gpu.remapped_rows
    if rows is not None and rows.failure:
        out.append(
            Problem(
                "row_remap_failure",
                "critical",
                "replace",
                f"row remapping failed ({rows.uncorrected} rows remapped for uncorrectable errors)",
            )
        )
    elif rows is not None and rows.pending:
        out.append(
            Problem(
                "row_remap_pending",
                "critical",
                "reboot",
                f"row remap pending a GPU reset ({rows.uncorrected} uncorrectable,"
                f" {rows.corrected} correctable)",
            )
        )
    pages = gpu.retired_pages
    if pages is not None:
        retired = pages.single_bit_ecc + pages.double_bit_ecc
        if retired >= limits.retired_pages_max:
            out.append(
                Problem(
                    "retired_pages",
                    "critical",
                    "replace",
                    f"{retired} pages retired ({pages.double_bit_ecc} for DBE),"
                    f" limit {limits.retired_pages_max}",
                )
            )
        elif pages.pending:
            out.append(
                Problem(
                    "retired_pages_pending",
                    "critical",
                    "reboot",
                    f"page retirement pending a GPU reset ({retired} retired)",
                )
            )
    return out
