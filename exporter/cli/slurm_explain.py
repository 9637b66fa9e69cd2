"""`topowatch explain --slurm JOBID`: ask slurmctld (squeue, sinfo/scontrol), read the topology,
judge the job, print it.

The topology comes from `--topology-file` (a `topology from-ec2 --format json` file or a
topology.conf), else the topology.conf beside slurm.conf ($SLURM_CONF's directory, then
/etc/slurm), which is where slurmctld itself reads it (topology.conf(5)).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from exporter.slurm.explain import as_dict, find, text
from exporter.slurm.placement import judge
from exporter.sources.slurm.commands import SlurmCli, SlurmCommandError
from exporter.sources.slurm.jobs import parse_jobs
from exporter.sources.slurm.nodes import SlurmNode, parse_nodes
from exporter.topology.files import TopologyFileError, load_placements
from exporter.topology.labels import Placement

__all__ = ["ExplainSlurmError", "default_topology_file", "explain_slurm", "run"]

PROG = "topowatch explain"


class ExplainSlurmError(RuntimeError):
    """The job cannot be explained: Slurm did not answer, or no such job is queued."""


def default_topology_file(env: Mapping[str, str] | None = None) -> Path | None:
    """topology.conf beside slurm.conf, where slurmctld reads it; None when there is none."""
    env = os.environ if env is None else env
    candidates = []
    conf = env.get("SLURM_CONF")
    if conf:
        candidates.append(Path(conf).parent / "topology.conf")
    candidates.append(Path("/etc/slurm/topology.conf"))
    return next((path for path in candidates if path.is_file()), None)


def explain_slurm(
    job_id: str,
    topology_file: Path | None,
    as_json: bool,
    cli: SlurmCli | None = None,
) -> str:
    """The explanation of one job, as text or JSON. Raises ExplainSlurmError."""
    cli = cli or SlurmCli()
    notes: list[str] = []
    placements: dict[str, Placement] = {}
    path = topology_file or default_topology_file(cli.env)
    if path is None:
        notes.append("no topology file (--topology-file, or topology.conf beside slurm.conf)")
    else:
        try:
            placements = load_placements(path)
        except TopologyFileError as exc:
            raise ExplainSlurmError(str(exc)) from None
    try:
        jobs, problems = parse_jobs(cli.squeue_json())
    except SlurmCommandError as exc:
        raise ExplainSlurmError(str(exc)) from None
    nodes: list[SlurmNode] = []
    try:
        nodes, node_problems = parse_nodes(cli.nodes_json())
        notes.extend(node_problems)
    except SlurmCommandError as exc:
        notes.append(f"node states unavailable: {exc}")
    wanted = job_id.strip()
    judged = [judge(job, placements, nodes) for job in jobs if job.job_id == wanted]
    found = find(judged, wanted)
    if found is None:
        said = f"; squeue problems: {'; '.join(problems)}" if problems else ""
        raise ExplainSlurmError(f"no job {wanted} in squeue (finished, or never existed){said}")
    if as_json:
        body = as_dict(found)
        body["topology_file"] = str(path) if path is not None else None
        body["notes"] = notes
        return json.dumps(body, indent=2, sort_keys=True) + "\n"
    out = text(found)
    if path is not None:
        out += f"  topology file: {path} ({len(placements)} nodes)\n"
    for note in notes:
        out += f"  note: {note}\n"
    return out


def run(job_id: str, topology_file: Path | None, as_json: bool) -> int:
    """The CLI entry: print, or say why not on stderr with exit 1."""
    try:
        sys.stdout.write(explain_slurm(job_id, topology_file, as_json))
    except ExplainSlurmError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    return 0
