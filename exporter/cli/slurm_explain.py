"""`topowatch explain --slurm JOBID`: ask slurmctld (squeue, sinfo/scontrol), read the topology,
judge the job, print it.

The topology comes from `--topology-file` (a `topology from-ec2 --format json` file or a
topology.conf), else the topology.conf beside slurm.conf ($SLURM_CONF's directory, then
/etc/slurm), which is where slurmctld itself reads it (topology.conf(5)).

The job's goodput (ETTR, "Interrupted N times: ...") comes from the slurm-controller's ledger,
`GET /api/v1/goodput/JOBID` on `$TOPOWATCH_SLURM_CONTROLLER` (default http://127.0.0.1:9404, the
head node's controller); a job squeue no longer lists is explained from the ledger alone. When
the controller does not answer, the placement is printed with a note saying so.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exporter.slurm.explain import as_dict, find, goodput_lines, ledger_text, text
from exporter.slurm.placement import judge
from exporter.sources.slurm.commands import SlurmCli, SlurmCommandError
from exporter.sources.slurm.jobs import parse_jobs
from exporter.sources.slurm.nodes import SlurmNode, parse_nodes
from exporter.topology.files import TopologyFileError, load_placements
from exporter.topology.labels import Placement

__all__ = [
    "ExplainSlurmError",
    "controller_url",
    "default_topology_file",
    "explain_slurm",
    "ledger_of",
    "run",
]

PROG = "topowatch explain"
CONTROLLER_ENV = "TOPOWATCH_SLURM_CONTROLLER"
DEFAULT_CONTROLLER = "http://127.0.0.1:9404"
LEDGER_TIMEOUT_S = 3.0


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


def controller_url(env: Mapping[str, str] | None = None) -> str:
    """The slurm-controller to ask for the goodput ledger ("" asks none)."""
    env = os.environ if env is None else env
    return env.get(CONTROLLER_ENV, DEFAULT_CONTROLLER).strip()


def ledger_of(job_id: str, controller: str) -> tuple[dict[str, Any] | None, str]:
    """(the ledger's view of the job, a note when there is none)."""
    if not controller:
        return None, ""
    url = f"{controller.rstrip('/')}/api/v1/goodput/{urllib.parse.quote(job_id, safe='')}"
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=LEDGER_TIMEOUT_S) as answer:
            body = json.load(answer)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return (
                None,
                "goodput: the slurm-controller's ledger has no record of it (never seen running)",
            )
        return None, f"goodput: the slurm-controller at {controller} answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = getattr(exc, "reason", exc)
        return None, (
            f"goodput unavailable: no answer from the slurm-controller at {controller} ({why});"
            f" set {CONTROLLER_ENV} to its URL"
        )
    if not isinstance(body, dict):
        return None, f"goodput: the slurm-controller at {controller} answered no JSON object"
    return body, ""


def explain_slurm(
    job_id: str,
    topology_file: Path | None,
    as_json: bool,
    cli: SlurmCli | None = None,
    controller: str | None = None,
) -> str:
    """The explanation of one job, as text or JSON. Raises ExplainSlurmError.
    `controller`: the slurm-controller's URL for the goodput ledger ("" asks none; None: from
    $TOPOWATCH_SLURM_CONTROLLER)."""
    cli = cli or SlurmCli()
    controller = controller_url(cli.env) if controller is None else controller
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
    ledger, ledger_note = ledger_of(wanted, controller)
    if found is None:
        if ledger is not None:
            if as_json:
                body: dict[str, Any] = {"scheduler": "slurm", "job_id": wanted, "in_squeue": False}
                body["goodput"] = ledger
                return json.dumps(body, indent=2, sort_keys=True) + "\n"
            return ledger_text(ledger)
        said = f"; squeue problems: {'; '.join(problems)}" if problems else ""
        told = f"; {ledger_note}" if ledger_note else ""
        raise ExplainSlurmError(
            f"no job {wanted} in squeue (finished, or never existed){said}{told}"
        )
    if ledger_note:
        notes.append(ledger_note)
    if as_json:
        body = as_dict(found)
        body["topology_file"] = str(path) if path is not None else None
        body["notes"] = notes
        body["goodput"] = ledger
        return json.dumps(body, indent=2, sort_keys=True) + "\n"
    out = text(found)
    if ledger is not None:
        out += "".join(f"{line}\n" for line in goodput_lines(ledger))
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
