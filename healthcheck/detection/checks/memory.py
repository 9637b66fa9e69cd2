"""GPU memory health: uncorrectable ECC, row remapping and page retirement.

What an uncorrectable error asks for depends on whether the driver contained it, and the driver
says so itself: on A100 and later (H100, GB200) an uncorrectable error is contained where it can
be, XID 94 ("Contained ECC error": only the application that used the memory is affected, it is
ended; NVIDIA's XID catalog bucket RESTART_APP), or it is not, XID 95 ("Uncontained ECC
error": every application on the GPU is affected; bucket RESET_GPU). The row holding it is marked
for remapping, which "will be remapped at the next GPU reset" while "unaffected applications can
continue running ... and new workloads can be launched" (NVIDIA's GPU Memory Error Management,
"Row Remapping"; nvml.h `nvmlDeviceGetRemappedRows`: `isPending` "Remapping is pending", applied
on the next reset). The driver's own verdict on what must be done is NVML's recovery action
(field 230, checks/recovery.py).

So the counters here are reported, never acted on by themselves: a volatile uncorrectable error
count and a pending remap are warnings with no action. The reset they wait for comes from the
finding that says it is needed: XID 95 (or 48 on GPUs without containment) through the XID
check, or the driver's recovery action (GPU reset, drain and reset) through the recovery check.
Rebooting a p5 for a contained error would end the jobs on the other seven GPUs for nothing.

What is hardware worn out is acted on: a failed remap (no spare rows left) or a full retirement
table means the GPU must be replaced. Page retirement (before A100) still asks for a reset when a
page is pending retirement: those GPUs contain nothing.
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
                "warning",
                "none",
                f"{dbe} volatile uncorrectable ECC errors (max {limits.uncorrected_volatile_max});"
                " contained unless the driver says otherwise (XID 95, its recovery action)",
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
                "warning",
                "none",
                f"row remap pending the next GPU reset ({rows.uncorrected} uncorrectable,"
                f" {rows.corrected} correctable); running work continues",
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
