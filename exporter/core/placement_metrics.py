"""The workload placement families, one meaning whichever scheduler placed the workload: the
cluster service renders them for Kueue's workloads, the Slurm controller for Slurm's jobs. The
definitions live here, below both, so neither service reaches into the other for them."""

from __future__ import annotations

from exporter.core.exposition import GAUGE, Family


def workload_placement_families() -> tuple[Family, Family, Family, Family]:
    """Domains spanned, worst-pair hops, topology request met, GPUs held: one meaning whichever
    scheduler placed the workload (Kueue here, Slurm in exporter.slurm.metrics)."""
    spanned = Family(
        "topowatch_workload_domains",
        GAUGE,
        "Distinct topology domains a live workload's pods span, per level.",
    )
    hops = Family(
        "topowatch_workload_worst_pair_hops",
        GAUGE,
        "Largest network hop distance between two of a live workload's nodes.",
    )
    met = Family(
        "topowatch_workload_topology_satisfied",
        GAUGE,
        "1 when a live workload's pods sit in one domain of the level it asked for.",
    )
    gpus = Family("topowatch_workload_gpus", GAUGE, "GPUs held by a live workload's pods.")
    return spanned, hops, met, gpus
