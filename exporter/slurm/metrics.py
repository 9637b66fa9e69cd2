"""Metric families of Slurm jobs' placement and pending reasons, one squeue cycle at a time.

Where a family means what the Kueue side's means, it has the same name (exporter/cluster/
metrics.py: `topowatch_workload_domains`, `topowatch_workload_worst_pair_hops`,
`topowatch_workload_topology_satisfied`, `topowatch_workload_gpus`, `topowatch_pending_workloads`,
`topowatch_cluster_workload_series_dropped`), with `scheduler="slurm"` and Slurm's job labels
(`job_id`, `name`, `user`, `partition`) in place of Kueue's namespace/workload/cluster_queue.
Slurm-only facts have `topowatch_slurm_` names.

The goodput ledger's families (`goodput_families`, issue 29) have the Kueue side's names and
label sets exactly (exporter/cluster/metrics/goodput.py), so its alert rules and the "Goodput and
reliability" dashboard read a Slurm cluster unchanged: `topowatch_interruptions_total{cause,
component,team}`, `topowatch_job_interruptions{namespace,job_name,team}` and the ETTR and lost
GPU-seconds families. On Slurm `team` is the job's account (its partition when it has none),
`namespace` its partition and `job_name` its job id (what `topowatch explain --slurm` takes;
names repeat on Slurm).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from exporter.core.exposition import COUNTER, GAUGE, Family
from exporter.core.goodput.causes import CAUSES, COMPONENTS
from exporter.core.placement_metrics import workload_placement_families
from exporter.slurm.goodput import SlurmGoodput, SlurmJobGoodput
from exporter.slurm.placement import JobPlacement, NodeState, judge_all
from exporter.sources.slurm.jobs import SlurmJob
from exporter.topology.labels import Placement

__all__ = [
    "DEFAULT_GOODPUT_JOB_CAP",
    "DEFAULT_JOB_CAP",
    "goodput_families",
    "render",
    "slurm_families",
]

DEFAULT_JOB_CAP = 2000  # per-job series, as the Kueue side caps workloads
DEFAULT_GOODPUT_JOB_CAP = 500  # per-job goodput series, as the Kueue side's ledger caps them
RECENT_S = 3600.0  # an ended job keeps its per-job goodput series this long
LOST_CAUSES = tuple(c for c in CAUSES if c != "completed")
# (cause, component) of topowatch_interruptions_total: a component only for causes of a node.
SERIES = tuple(
    (cause, component)
    for cause in LOST_CAUSES
    for component in (COMPONENTS if cause in ("node_fault", "remediation") else ("",))
)


def slurm_families(
    jobs: Sequence[SlurmJob],
    nodes: Sequence[NodeState],
    placements: Mapping[str, Placement],
    cluster: str,
    problems: Sequence[str] = (),
    job_cap: int = DEFAULT_JOB_CAP,
) -> list[Family]:
    """Families for one squeue/sinfo cycle: `problems` are parse_jobs' document problems."""
    judged = judge_all(jobs, placements, nodes)
    # A job that is neither running nor pending (or unreadable) still counts its problems.
    seen = {id(item.job) for item in judged}
    unjudged = [p for job in jobs if id(job) not in seen for p in dict.fromkeys(job.problems)]
    return render(judged, cluster, [*problems, *unjudged], job_cap)


def render(
    judged: Sequence[JobPlacement],
    cluster: str,
    problems: Sequence[str] = (),
    job_cap: int = DEFAULT_JOB_CAP,
) -> list[Family]:
    head = [("scheduler", "slurm"), ("cluster", cluster)]
    spanned, hops, met, gpus = workload_placement_families()
    ultra = Family(
        "topowatch_slurm_job_one_ultraserver",
        GAUGE,
        "1 when every node of a running Slurm job sits in one UltraServer (NVLink domain), 0 "
        "when they span several; absent when the nodes' UltraServers are unknown.",
    )
    unplaced = Family(
        "topowatch_slurm_job_unplaced_nodes",
        GAUGE,
        "Nodes of a running Slurm job that the loaded topology does not know.",
    )
    pending = Family(
        "topowatch_pending_workloads",
        GAUGE,
        "Workloads waiting, by partition and Slurm reason (state_reason) and its class.",
    )
    waiting = Family(
        "topowatch_slurm_pending_job_nodes",
        GAUGE,
        "For a pending job whose wait depends on topology (--switches, --contiguous, or reason "
        "Resources): nodes it needs, nodes free in its partitions, and free nodes in the "
        "largest free leaf switch.",
    )
    problem_family = Family(
        "topowatch_slurm_job_problems",
        GAUGE,
        "Jobs (or squeue documents) of the last cycle topowatch could not fully read, by problem.",
    )
    capped = Family(
        "topowatch_cluster_workload_series_dropped",
        GAUGE,
        "Live workloads left without per-workload series by the cardinality cap.",
    )
    running = [j for j in judged if j.job.allocated]
    waiting_jobs = [j for j in judged if j.pending is not None]
    running.sort(key=lambda j: (-(j.job.gpus or 0), -len(j.job.nodes), _id_key(j.job.job_id)))
    for judged_job in running[:job_cap]:
        job = judged_job.job
        base = [*head, *_job_labels(job)]
        for level, count in judged_job.domains.items():
            spanned.add([*base, ("level", level)], count)
        if judged_job.worst_pair_hops is not None:
            hops.add(base, judged_job.worst_pair_hops)
        if judged_job.switches_met is not None:
            met.add(
                [*base, ("mode", "switches"), ("level", judged_job.leaf_level or "leaf")],
                judged_job.switches_met,
            )
        if job.gpus is not None:
            gpus.add(base, job.gpus)
        one = judged_job.one_ultraserver
        if one is not None:
            ultra.add(base, one)
        if judged_job.unplaced:
            unplaced.add(base, len(judged_job.unplaced))

    counts: Counter[tuple[str, str, str]] = Counter()
    for judged_job in waiting_jobs:
        context = judged_job.pending
        if context is not None:
            counts[(judged_job.job.partition, context.reason, context.reason_class)] += 1
    for (partition, reason, kind), count in sorted(counts.items()):
        pending.add([*head, ("partition", partition), ("cause", reason), ("class", kind)], count)
    with_context = [j for j in waiting_jobs if j.pending and j.pending.capacity]
    with_context.sort(key=lambda j: _id_key(j.job.job_id))
    for judged_job in with_context[:job_cap]:
        found = judged_job.pending
        if found is None or found.capacity is None:
            continue
        base = [*head, *_job_labels(judged_job.job), ("reason", found.reason)]
        if found.needs_nodes is not None:
            waiting.add([*base, ("nodes", "needed")], found.needs_nodes)
        waiting.add([*base, ("nodes", "free")], found.capacity.free_nodes)
        waiting.add([*base, ("nodes", "largest_free_leaf")], found.capacity.largest_leaf()[1])

    problem_counts: Counter[str] = Counter(_kind(p) for p in problems)  # per job, per kind
    for judged_job in judged:
        problem_counts.update({_kind(p) for p in judged_job.problems})
    for problem, count in sorted(problem_counts.items()):
        problem_family.add([*head, ("problem", problem)], count)
    dropped = max(0, len(running) - job_cap) + max(0, len(with_context) - job_cap)
    capped.add(head, dropped)
    return [spanned, hops, met, gpus, ultra, unplaced, pending, waiting, problem_family, capped]


def _job_labels(job: SlurmJob) -> list[tuple[str, str]]:
    return [
        ("job_id", job.job_id),
        ("name", job.name),
        ("user", job.user),
        ("partition", job.partition),
    ]


def _kind(problem: str) -> str:
    """A bounded label for a problem: "unknown: job_state" from "unknown: job_state [1, 2]"."""
    head, sep, rest = problem.partition(": ")
    if not sep:
        return problem[:60]
    if head != "unknown":
        return head[:60]
    if rest.startswith("squeue output"):
        return "unknown: squeue output"
    words = rest.split(" ")
    if words[0] in ("no", "empty") and len(words) > 1:
        return f"{head}: {words[0]} {words[1]}"
    if rest.startswith("nodes missing"):
        return f"{head}: nodes missing from the topology"
    return f"{head}: {words[0]}"[:60]


def _id_key(job_id: str) -> tuple[int, str]:
    digits = job_id.split("_", 1)[0]
    return (int(digits), job_id) if digits.isdigit() else (0, job_id)


# --- goodput (issue 29) ---------------------------------------------------------------------------


def goodput_families(
    ledger: SlurmGoodput, now: float, cap: int = DEFAULT_GOODPUT_JOB_CAP
) -> list[Family]:
    """The ledger's families at `now` (exporter/slurm/goodput.py)."""
    jobs = ledger.jobs_goodput(now)
    return [
        _interruptions(ledger, {j.team for j in jobs} | ledger.teams),
        *_teams(jobs),
        *_per_job(jobs, now, cap),
    ]


def _interruptions(ledger: SlurmGoodput, teams: set[str]) -> Family:
    family = Family(
        "topowatch_interruptions",
        COUNTER,
        "Running jobs that stopped running, seen happening by this process once their cause "
        "was settled, by cause (preempted, node_fault, remediation, elastic_scale_down, user, "
        "unknown), the failing component for node faults and remediation (gpu, hbm, nvlink, "
        'network, host, software, unknown; "" otherwise) and team (Slurm: the account, else '
        "the partition). Interruptions read back from the ledger file at start-up are not "
        "counted again, so a restart starts this at zero.",
    )
    counts: Counter[tuple[str, str, str]] = Counter(
        {(c, p, t): 0 for t in teams for c, p in SERIES}
    )
    counts.update(ledger.live_counts())
    for (cause, component, team), count in sorted(counts.items()):
        family.add([("cause", cause), ("component", component), ("team", team)], count)
    return family


def _teams(jobs: Sequence[SlurmJobGoodput]) -> list[Family]:
    lost = Family(
        "topowatch_goodput_lost_gpu_seconds",
        GAUGE,
        "GPU-seconds lost to interruptions over the retained ledger (GPUs held idle or torn down "
        "x time until the job ran again; open interruptions up to now), by cause and team.",
    )
    ettr = Family(
        "topowatch_goodput_ettr_ratio",
        GAUGE,
        "Effective training time ratio of a team's live and recent jobs: running time over "
        "wall time since first start, less the time suspended and the time no process watched "
        "(absent before any such time).",
    )
    running = Family(
        "topowatch_goodput_running_seconds",
        GAUGE,
        "Seconds a team's live and recent jobs ran (the numerator of ETTR).",
    )
    wall = Family(
        "topowatch_goodput_effective_wall_seconds",
        GAUGE,
        "Wall seconds of a team's live and recent jobs since their first start, less "
        "suspended and unobserved time (the denominator of ETTR).",
    )
    sums: dict[str, list[float]] = {}
    lost_by: dict[str, dict[str, float]] = {}
    for job in jobs:
        row = sums.setdefault(job.team, [0.0, 0.0])
        row[0] += job.seconds.get("running", 0.0)
        row[1] += job.effective_wall
        into = lost_by.setdefault(job.team, {})
        for cause, value in job.lost_gpu_seconds_by_cause.items():
            into[cause] = into.get(cause, 0.0) + value
    for name in sorted(sums):
        run_s, effective = sums[name]
        team = [("team", name)]
        per = lost_by.get(name, {})
        for cause in LOST_CAUSES:
            lost.add([("cause", cause), *team], per.get(cause, 0.0))
        if effective > 0:
            ettr.add(team, run_s / effective)
        running.add(team, run_s)
        wall.add(team, max(0.0, effective))
    return [lost, ettr, running, wall]


def _per_job(jobs: Sequence[SlurmJobGoodput], now: float, cap: int) -> list[Family]:
    ettr = Family(
        "topowatch_job_ettr_ratio",
        GAUGE,
        "A live or recently finished job's effective training time ratio (its largest jobs, "
        "up to the series cap; absent before any running or waiting time).",
    )
    count = Family(
        "topowatch_job_interruptions",
        GAUGE,
        "Times a live or recently finished job stopped running (completion excluded).",
    )
    dropped = Family(
        "topowatch_goodput_job_series_dropped",
        GAUGE,
        "Live and recent jobs left without per-job series by the series cap.",
    )
    shown = [
        j for j in jobs if j.live or (j.finished_at is not None and now - j.finished_at <= RECENT_S)
    ]
    shown.sort(key=lambda j: (-j.gpus, _id_key(j.job_id)))
    for job in shown[:cap]:
        labels = [("namespace", job.partition), ("job_name", job.job_id), ("team", job.team)]
        if job.ettr is not None:
            ettr.add(labels, job.ettr)
        count.add(labels, job.interruptions)
    dropped.add([], max(0, len(shown) - cap))
    return [ettr, count, dropped]
