"""`topowatch explain --slurm JOBID`: one Slurm job in words or JSON, from a judged placement.

Switches are named, as the Kueue side names its domains (`topowatch explain NS/NAME`'s
"network-node-layer-3: nn-a (2 pods), nn-b (1 pod)"): each level the job's nodes span lists its
switches (the SwitchName of topology.conf, or the network node id of a `topology from-ec2` file)
with the nodes on each, and the leaf switches are named with them.

The goodput ledger's part (issue 29: the slurm-controller's `GET /api/v1/goodput/JOBID`, a
`SlurmJobGoodput.as_dict()`) reads as the Kueue side's `topowatch explain NS/JOB` does: the ETTR,
then "Interrupted N times: ..." with each interruption's cause, evidence and lost GPU-hours."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from exporter.slurm.placement import DOCS, JobPlacement
from exporter.topology.hostlist import compress
from exporter.topology.labels import LEVELS, NETWORK_LEVELS, ULTRASERVER

__all__ = ["as_dict", "find", "goodput_lines", "ledger_text", "text"]

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


# --- goodput (issue 29) ---------------------------------------------------------------------------


def ledger_text(view: Mapping[str, Any]) -> str:
    """A job squeue no longer lists, from the ledger alone."""
    who = ", ".join(
        part
        for part in (
            f"user {view['user']}" if view.get("user") else "",
            f"partition {view['partition']}" if view.get("partition") else "",
        )
        if part
    )
    state = view.get("state") or view.get("phase") or "unknown"
    head = f'Slurm job {view.get("job_id")} "{view.get("name", "")}"' + (f" ({who})" if who else "")
    lines = [f"{head}: {state}, no longer in squeue"]
    if view.get("nodes"):
        lines.append(f"  last nodes ({len(view['nodes'])}): {compress(view['nodes'])}")
    lines.extend(goodput_lines(view))
    return "\n".join(lines) + "\n"


def goodput_lines(view: Mapping[str, Any]) -> list[str]:
    """The job's ETTR and its interruptions, each with cause, evidence and lost GPU-hours."""
    seconds = view.get("seconds") or {}
    ettr = view.get("ettr")
    spent = ", ".join(
        f"{phase} {_duration(seconds[phase])}"
        for phase in ("restarting", "waiting", "preempted", "suspended", "unobserved")
        if seconds.get(phase)
    )
    shown = "unknown yet" if ettr is None else f"{ettr:.1%}"
    team = view.get("team") or "?"
    lines = [
        f"Goodput: ETTR {shown} (running {_duration(seconds.get('running', 0.0))} of "
        f"{_duration(view.get('effective_wall_s') or 0.0)} counted"
        + (f"; {spent}" if spent else "")
        + f"), {_hours(view.get('lost_gpu_hours'))} GPU-hours lost; team {team}"
        + (f", restart count {view['restart_count']}" if view.get("restart_count") else "")
    ]
    entries = [e for e in view.get("interruptions") or [] if e.get("cause") != "completed"]
    if not entries:
        lines.append("Not interrupted.")
        return lines
    causes: dict[str, int] = {}
    for entry in entries:
        causes[_cause_words(entry)] = causes.get(_cause_words(entry), 0) + 1
    summary = ", ".join(f"{n} {cause}" for cause, n in causes.items())
    times = "time" if len(entries) == 1 else "times"
    lines.append(f"Interrupted {len(entries)} {times}: {summary}")
    lines.extend(f"  {line}" for entry in entries for line in _interruption_lines(entry))
    return lines


def _interruption_lines(entry: Mapping[str, Any]) -> list[str]:
    state = "" if entry.get("settled") else " (not settled yet)"
    detail = entry.get("detail") or entry.get("missing") or "no evidence"
    lines = [
        f"{entry.get('stopped_at') or '?'} {_cause_words(entry)}{state}: {detail}; "
        f"{entry.get('gpus', 0)} GPUs, {_hours(entry.get('lost_gpu_hours'))} GPU-hours lost"
        + (" so far" if entry.get("open") else "")
    ]
    action = (entry.get("evidence") or {}).get("action") or "?"
    steps = [
        (label, entry.get(key))
        for label, key in (
            ("detected", "detected_at"),
            (f"action {action}", "action_at"),
            ("node back", "node_back_at"),
            ("running again", "resumed_at"),
        )
        if entry.get(key)
    ]
    if steps:
        lines.append("  " + " -> ".join(f"{label} {at}" for label, at in steps))
    if entry.get("uncertain"):
        lines.append(f"  Uncertain: {entry['uncertain']}")
    if entry.get("missing") and entry.get("cause") == "unknown":
        lines.append(f"  Missing: {entry['missing']}")
    return lines


def _cause_words(entry: Mapping[str, Any]) -> str:
    cause = str(entry.get("cause") or "unknown").replace("_", " ")
    component = entry.get("component")
    return f"{cause} ({component})" if component else cause


def _hours(value: Any) -> str:
    number = float(value) if isinstance(value, int | float) else 0.0
    return f"{number:.2f}" if number >= 0.01 or number == 0 else f"{number:.4f}"


def _duration(seconds: float) -> str:
    """2d03h, 5h07m, 12m05s, 40s (as the Kueue side's explain writes them)."""
    total = max(0, round(seconds))
    days, rest = divmod(total, 86_400)
    hrs, rest = divmod(rest, 3600)
    mins, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hrs:02d}h"
    if hrs:
        return f"{hrs}h{mins:02d}m"
    if mins:
        return f"{mins}m{secs:02d}s"
    return f"{secs}s"
