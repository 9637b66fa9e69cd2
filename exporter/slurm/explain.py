"""`topowatch explain --slurm JOBID`: one Slurm job in words or JSON, from a judged placement.

Switches are named, as the Kueue side names its domains (`topowatch explain NS/NAME`'s
"network-node-layer-3: nn-a (2 pods), nn-b (1 pod)"): each level the job's nodes span lists its
switches (the SwitchName of topology.conf, or the network node id of a `topology from-ec2` file)
with the nodes on each, and the leaf switches are named with them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exporter.slurm.placement import DOCS, JobPlacement
from exporter.topology.hostlist import compress
from exporter.topology.labels import LEVELS, NETWORK_LEVELS, ULTRASERVER

__all__ = ["as_dict", "find", "text"]

_ORDER = (*LEVELS, ULTRASERVER)


def find(judged: Sequence[JobPlacement], job_id: str) -> JobPlacement | None:
    """The job with this id ("123", or "123_4" for an array task)."""
    for item in judged:
        if item.job.job_id == job_id:
            return item
    return None


def as_dict(item: JobPlacement) -> dict[str, Any]:
    job = item.job
    out: dict[str, Any] = {
        "scheduler": "slurm",
        "job_id": job.job_id,
        "name": job.name,
        "user": job.user,
        "partition": job.partition,
        "state": job.state,
        "state_flags": sorted(job.state_flags),
        "nodes": list(job.nodes),
        "node_count": job.node_count,
        "gpus": job.gpus,
        "switches": job.switches,
        "contiguous": job.contiguous,
        "problems": list(item.problems),
    }
    if job.allocated:
        out["placement"] = {
            "domains": {level: item.domains[level] for level in _ORDER if level in item.domains},
            "worst_pair_hops": item.worst_pair_hops,
            "leaf_switches": item.leaves,
            "leaf_level": item.leaf_level,
            "where": {
                level: [{"domain": name, "nodes": n} for name, n in item.where[level]]
                for level in _ORDER
                if level in item.where
            },
            "one_ultraserver": item.one_ultraserver,
            "ultraserver": item.ultraserver,
            "switches_met": item.switches_met,
            "unplaced_nodes": list(item.unplaced),
        }
    if item.pending is not None:
        context = item.pending
        capacity = context.capacity
        out["pending"] = {
            "reason": context.reason,
            "detail": job.reason_detail,
            "meaning": context.meaning,
            "class": context.reason_class,
            "source": DOCS,
            "dependency": job.dependency,
            "needs_nodes": context.needs_nodes,
            "topology": list(context.lines),
            "free": None
            if capacity is None
            else {
                "partitions": list(capacity.partitions),
                "nodes": capacity.free_nodes,
                "not_in_topology": capacity.free_unplaced,
                "per_leaf_switch": dict(capacity.per_leaf),
                "per_ultraserver": dict(capacity.per_ultraserver),
            },
        }
    return out


def text(item: JobPlacement) -> str:
    job = item.job
    state = job.state or "UNKNOWN"
    if job.state_flags:
        state += " (" + ", ".join(sorted(job.state_flags)) + ")"
    who = ", ".join(
        part
        for part in (
            f"user {job.user}" if job.user else "",
            f"partition {job.partition}" if job.partition else "",
        )
        if part
    )
    lines = [f'Slurm job {job.job_id} "{job.name}"' + (f" ({who})" if who else "") + f": {state}"]
    asks = [f"{job.node_count} node{'s' if job.node_count != 1 else ''}"] if job.node_count else []
    if job.gpus:
        asks.append(f"{job.gpus} GPUs")
    if job.switches:
        asks.append(f"--switches={job.switches}")
    if job.contiguous:
        asks.append("--contiguous")
    if job.allocated:
        lines.append(f"  nodes ({len(job.nodes)}): {compress(job.nodes)}")
        if asks:
            lines.append("  holds: " + ", ".join(asks))
        lines.extend(_placement_lines(item))
    elif asks:
        lines.append("  asks: " + ", ".join(asks))
    if item.pending is not None:
        context = item.pending
        said = context.reason or "(none given)"
        lines.append(f"  reason: {said} [{context.reason_class}]: {context.meaning}")
        if job.reason_detail and job.reason_detail != job.reason:
            lines.append(f"  slurmctld says: {job.reason_detail}")
        if job.dependency:
            lines.append(f"  dependency: {job.dependency}")
        lines.append(f"  (reason codes: {DOCS})")
        for line in context.lines:
            lines.append(f"  topology: {line}")
    for problem in item.problems:
        lines.append(f"  problem: {problem}")
    return "\n".join(lines) + "\n"


_LEVEL_NAMES = {ULTRASERVER: "UltraServer"}


def _domains(domains: Sequence[tuple[str, int]]) -> str:
    """ "sw-a" alone, else "sw-a (2 nodes), sw-b (1 node)"."""
    if len(domains) == 1:
        return domains[0][0]
    return ", ".join(f"{name} ({n} node{'s' if n != 1 else ''})" for name, n in domains)


def _placement_lines(item: JobPlacement) -> list[str]:
    lines: list[str] = []
    spans = [
        f"{item.domains[level]} {level}"
        for level in (*NETWORK_LEVELS, ULTRASERVER)
        if level in item.domains
    ]
    if spans:
        lines.append("  spans: " + ", ".join(spans))
    for level in (*NETWORK_LEVELS, ULTRASERVER):
        domains = item.where.get(level, ())
        if domains:
            lines.append(f"    {_LEVEL_NAMES.get(level, level)}: {_domains(domains)}")
    if item.leaves:
        where = f" ({item.leaf_level})" if item.leaf_level else ""
        leaves = item.where.get(item.leaf_level, ()) if item.leaf_level else ()
        names = f" ({', '.join(name for name, _ in leaves)})" if leaves else ""
        lines.append(f"  leaf switches{where}: {item.leaves}{names}")
    if item.worst_pair_hops is not None:
        lines.append(
            f"  worst-pair hops: {item.worst_pair_hops} (links between the two farthest nodes, "
            "as the Kueue side counts them)"
        )
    else:
        lines.append("  worst-pair hops: unknown (some node has no network placement)")
    one = item.one_ultraserver
    if one is None:
        lines.append("  UltraServer: unknown (no UltraServer membership for these nodes)")
    elif one:
        lines.append(f"  UltraServer: all nodes in {item.ultraserver} (one NVLink domain)")
    else:
        lines.append(
            f"  UltraServer: not one; {item.ultraservers} UltraServers (or nodes outside any)"
        )
    if item.switches_met is not None:
        verdict = (
            "met"
            if item.switches_met
            else "NOT met (its wait for switches ran out, so slurmctld started it across more)"
        )
        lines.append(f"  --switches={item.job.switches}: {verdict}")
    if item.unplaced:
        lines.append(f"  not in the topology: {compress(item.unplaced)}")
    return lines
