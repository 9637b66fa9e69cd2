"""Where Slurm jobs landed on the topology, and why pending ones wait: pure, data in and out.

A running job's nodes are judged exactly as the Kueue side judges a workload's
(`exporter.topology.locality`): distinct domains per level, the worst pair's hops by
`exporter.topology.labels.hops` (links on the path, climbing from each node to the lowest network
node both share: same leaf -> 2 with three layers, same layer-2 -> 4, same layer-1 -> 6), and the
one UltraServer holding every node, if any.

A pending job carries slurmctld's reason (`state_reason`); `REASONS` says what each means, quoted
from https://slurm.schedmd.com/job_reason_codes.html and squeue(1) "JOB REASON CODES". Topology
context is added only where it is true and relevant: when the job asked for `--switches` (at most
N leaf switches) or contiguous nodes, or when the reason is Resources (by the reason codes: "the
resources requested by the job are not available"). It counts free nodes per leaf switch in the
job's partitions, against the number of nodes the job needs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from exporter.sources.slurm.jobs import SlurmJob
from exporter.topology.labels import NETWORK_LEVELS, ULTRASERVER, Placement
from exporter.topology.locality import locality

__all__ = [
    "BLOCKING_FLAGS",
    "REASONS",
    "FreeCapacity",
    "JobPlacement",
    "NodeState",
    "PendingContext",
    "free_capacity",
    "judge",
    "judge_all",
    "leaf_of",
    "named",
    "node_is_free",
    "reason_meaning",
]

DOCS = "https://slurm.schedmd.com/job_reason_codes.html"

# Reason -> (what it means, quoted from job_reason_codes.html / squeue(1), and its class: what
# kind of wait it is, a metric label). Classes: capacity (nodes or resources busy), queue (others
# go first), user (the job's own request or hold), admin (held or blocked by configuration,
# limits or an operator), time (waits for a time), failure.
REASONS: dict[str, tuple[str, str]] = {
    "Resources": (
        "The resources requested by the job are not available (e.g., already used by other jobs).",
        "capacity",
    ),
    "Priority": (
        "One or more higher priority jobs exist for the partition associated with the job or "
        "for the advanced reservation.",
        "queue",
    ),
    "ReqNodeNotAvail": (
        "Some node specifically required by the job is not currently available. The node may "
        "currently be in use, reserved for another job, in an advanced reservation, DOWN, "
        "DRAINED, or not responding; DOWN, DRAINED or not responding nodes are named as "
        "UnavailableNodes.",
        "capacity",
    ),
    "Dependency": (
        "This job has a dependency on another job that has not been satisfied.",
        "user",
    ),
    "DependencyNeverSatisfied": (
        "This job has a dependency on another job that will never be satisfied.",
        "user",
    ),
    "JobHeldUser": ("The job is held by the user or an account coordinator.", "user"),
    "JobHeldAdmin": ("The job is held by a privileged user.", "admin"),
    "BeginTime": ("The job's earliest start time has not yet been reached.", "time"),
    "BadConstraints": ("The job's requirements cannot be satisfied.", "user"),
    "NodeDown": ("A node required by the job is down.", "failure"),
    "PartitionDown": ("The partition required by this job is in a DOWN state.", "admin"),
    "PartitionInactive": (
        "The partition required by this job is in an Inactive state and not able to start jobs.",
        "admin",
    ),
    "PartitionNodeLimit": (
        "The number of nodes required by this job is outside of its partition's current "
        "limits. Can also indicate that required nodes are DOWN or DRAINED.",
        "admin",
    ),
    "PartitionTimeLimit": (
        "The job's time limit exceeds its partition's current time limit.",
        "user",
    ),
    "PartitionConfig": (
        "Fallback reason when the job violates some limit on the partition.",
        "admin",
    ),
    "Reservation": (
        "The job is waiting its advanced reservation to become available.",
        "time",
    ),
    "ReservationDeleted": (
        "The job requested a reservation that is no longer on the system.",
        "user",
    ),
    "Licenses": ("The job is waiting for a license.", "capacity"),
    "QOSJobLimit": ("The job's QOS has reached its maximum job count.", "admin"),
    "AssocGrpGRES": (
        "The job's association has reached its aggregate GRES limit.",
        "admin",
    ),
    "AssocGrpNodeLimit": (
        "The job's association has reached its aggregate Node limit.",
        "admin",
    ),
    "QOSGrpGRES": ("The job's QOS has reached its aggregate GRES limit.", "admin"),
    "QOSGrpNodeLimit": ("The job's QOS has reached its aggregate Node limit.", "admin"),
    "AccountingPolicy": ("Fallback reason when others not matched.", "admin"),
    "InvalidAccount": ("The job's account is invalid.", "user"),
    "InvalidQOS": ("The job's QOS is invalid.", "user"),
    "Prolog": ("The job's Prolog program is still running.", "time"),
    "Cleaning": (
        "The job is being requeued and still cleaning up from its previous execution.",
        "time",
    ),
    "BurstBufferResources": (
        "There are insufficient resources in a Burst Buffer resource pool.",
        "capacity",
    ),
    "BurstBufferStageIn": (
        "The Burst Buffer plugin is in the process of staging the environment for the job.",
        "time",
    ),
    "DeadLine": ("This job cannot meet the configured Deadline.", "user"),
    "SchedDefer": (
        "The job requests an immediate allocation but SchedulerParameters=defer is configured.",
        "admin",
    ),
    "SystemFailure": (
        "Failure of the Slurm system, a file system, the network, etc.",
        "failure",
    ),
    "JobLaunchFailure": ("The job could not be launched.", "failure"),
    "None": (
        "The job has not been considered yet in the current scheduling or backfill cycle.",
        "queue",
    ),
    "WaitingForScheduling": (
        "No reason has been set for this job yet; waiting for the scheduler to determine the "
        "appropriate reason.",
        "queue",
    ),
}
# Families of reasons documented by prefix (job_reason_codes.html "AssocGrp*", "QOSMax*", ...).
_PREFIXES: tuple[tuple[str, str, str], ...] = (
    ("AssocGrp", "The job's association has reached an aggregate limit.", "admin"),
    (
        "AssocMax",
        "A portion of the job request exceeds a maximum limit (e.g., PerJob, PerNode) for the "
        "requested association.",
        "admin",
    ),
    ("QOSGrp", "The job's QOS has reached an aggregate limit.", "admin"),
    (
        "QOSMax",
        "A portion of the job request exceeds a maximum limit (e.g., PerJob, PerNode) for the "
        "requested QOS.",
        "admin",
    ),
    ("Max", "A portion of the job request exceeds a per-Account or per-User limit.", "admin"),
)

# Node state flags after which slurmctld allocates the node to no new job (sinfo(1) NODE STATE
# CODES, https://slurm.schedmd.com/sinfo.html#SECTION_NODE-STATE-CODES): DRAIN/DRAINING/DRAINED
# ("unavailable for use per system administrator request"), FAIL/FAILING, MAINTENANCE and
# RESERVED (in an advanced reservation, "not generally available"), NOT_RESPONDING, COMPLETING
# (still releasing a job), PLANNED (held by the backfill scheduler for a higher priority job),
# POWERING_DOWN / POWER_DOWN ("not capable of running any jobs"), REBOOT_REQUESTED /
# REBOOT_ISSUED (rebooting when idle), INVALID_REG. A powered-down (CLOUD, POWERED_DOWN) idle node
# stays free: slurmctld allocates it and resumes it (power_save.html).
BLOCKING_FLAGS = frozenset(
    {
        "DRAIN",
        "DRAINING",
        "DRAINED",
        "FAIL",
        "FAILING",
        "MAINTENANCE",
        "RESERVED",
        "NOT_RESPONDING",
        "COMPLETING",
        "PLANNED",
        "POWERING_DOWN",
        "POWER_DOWN",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "INVALID_REG",
    }
)


class NodeState(Protocol):
    """What this module reads of a node (exporter.sources.slurm.nodes.SlurmNode has it)."""

    @property
    def name(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def flags(self) -> frozenset[str]: ...
    @property
    def partitions(self) -> tuple[str, ...]: ...


def node_is_free(node: NodeState) -> bool:
    """A node a new whole-node job could get now: base state `idle` ("not allocated to any jobs
    and is available for use", sinfo(1)) with no flag in BLOCKING_FLAGS. A `mixed` node runs a
    job on part of it and is not counted: HyperPod GPU jobs take whole nodes."""
    return node.state.lower() == "idle" and not (node.flags & BLOCKING_FLAGS)


def reason_meaning(reason: str) -> tuple[str, str]:
    """(meaning, class) of a Slurm reason; unknown reasons say so rather than guess."""
    if reason in REASONS:
        return REASONS[reason]
    for prefix, meaning, kind in _PREFIXES:
        if reason.startswith(prefix):
            return meaning, kind
    return f"not a reason topowatch knows; see {DOCS}", "other"


def leaf_of(placement: Placement) -> tuple[str, str] | None:
    """(level, switch id) of the leaf switch a node hangs from: its deepest network layer."""
    if not placement.layers or not placement.layers[-1]:
        return None
    return NETWORK_LEVELS[len(placement.layers) - 1], placement.layers[-1]


@dataclass(frozen=True, slots=True)
class FreeCapacity:
    """Free nodes of some partitions, per leaf switch and per UltraServer."""

    partitions: tuple[str, ...]  # () means every partition
    free_nodes: int
    free_unplaced: int  # free nodes with no leaf switch in the topology
    per_leaf: tuple[tuple[str, int], ...]  # (switch id, free nodes), most free first
    per_ultraserver: tuple[tuple[str, int], ...]
    leaf_levels: tuple[str, ...]  # the level names the leaves sit at

    def largest_leaf(self) -> tuple[str, int]:
        return self.per_leaf[0] if self.per_leaf else ("", 0)

    def best_leaves(self, count: int) -> int:
        """Free nodes in the `count` leaf switches with most free nodes."""
        return sum(free for _, free in self.per_leaf[: max(0, count)])


def free_capacity(
    nodes: Iterable[NodeState], placements: Mapping[str, Placement], partitions: Sequence[str]
) -> FreeCapacity:
    """Count free nodes (node_is_free) in `partitions` (all when empty) per leaf switch."""
    wanted = {p for p in partitions if p}
    per_leaf: Counter[str] = Counter()
    per_ultra: Counter[str] = Counter()
    levels: set[str] = set()
    free = unplaced = 0
    for node in nodes:
        if wanted and not wanted.intersection(node.partitions):
            continue
        if not node_is_free(node):
            continue
        free += 1
        place = placements.get(node.name)
        leaf = leaf_of(place) if place is not None else None
        if leaf is None:
            unplaced += 1
        else:
            levels.add(leaf[0])
            per_leaf[leaf[1]] += 1
        if place is not None and place.ultraserver:
            per_ultra[place.ultraserver] += 1
    return FreeCapacity(
        partitions=tuple(sorted(wanted)),
        free_nodes=free,
        free_unplaced=unplaced,
        per_leaf=_ranked(per_leaf),
        per_ultraserver=_ranked(per_ultra),
        leaf_levels=tuple(level for level in NETWORK_LEVELS if level in levels),
    )


def _ranked(counts: Counter[str]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


@dataclass(frozen=True, slots=True)
class PendingContext:
    """Why a pending job waits, with the topology facts that bear on it."""

    reason: str
    meaning: str
    reason_class: str
    needs_nodes: int | None
    asks_switches: int | None
    asks_contiguous: bool
    capacity: FreeCapacity | None  # None when no topology context applies
    lines: tuple[str, ...]  # the topology context in words (empty when none applies)


@dataclass(frozen=True, slots=True)
class JobPlacement:
    """One job judged: where a running one sits, why a pending one waits."""

    job: SlurmJob
    unplaced: tuple[str, ...]  # allocated nodes the topology does not know
    domains: Mapping[str, int]  # level -> distinct domains spanned (levels with data)
    worst_pair_hops: int | None  # None unless every node has a network placement
    ultraserver: str  # the one UltraServer holding every node, "" otherwise
    ultraservers: int  # distinct UltraServers among the nodes (0: none known)
    leaves: int  # distinct leaf switches spanned
    leaf_level: str  # the level of those leaves, "" when unknown or mixed
    switches_met: bool | None  # the --switches request held (None: not asked / not running)
    pending: PendingContext | None
    problems: tuple[str, ...]
    # Per level with data (network layers top-down, then the UltraServer): each domain the
    # nodes sit in, by its id (the switch name in topology.conf, the network node id from EC2)
    # and how many of the job's nodes are there, most first; as the Kueue side names domains.
    where: Mapping[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)

    @property
    def one_ultraserver(self) -> bool | None:
        """True/False when the nodes' UltraServers are known, None otherwise."""
        if not self.job.allocated or self.ultraservers == 0:
            return None
        return bool(self.ultraserver)


def judge(
    job: SlurmJob,
    placements: Mapping[str, Placement],
    nodes: Sequence[NodeState] = (),
) -> JobPlacement:
    """Judge one job against the topology (`placements`: node name -> Placement)."""
    problems = list(job.problems)
    if not job.allocated:
        pending = _pending(job, placements, nodes) if job.pending else None
        return JobPlacement(job, (), {}, None, "", 0, 0, "", None, pending, tuple(problems))
    known = {name: placements[name] for name in job.nodes if name in placements}
    unplaced = tuple(name for name in job.nodes if name not in placements)
    if unplaced:
        problems.append("unknown: nodes missing from the topology")
    loc = locality(known, None, len(job.nodes))
    domains = dict(loc.domains)
    domains["node"] = len(job.nodes)
    hops = loc.worst_pair_hops if not unplaced else None
    if hops is not None and len(known) > 1 and any(not p.layers for p in known.values()):
        hops = None
    ultras = {p.ultraserver for p in known.values()}
    leaves = {leaf_of(p) for p in known.values()}
    leaf_ids = {leaf for leaf in leaves if leaf is not None}
    leaf_levels = {level for level, _ in leaf_ids}
    where: dict[str, tuple[tuple[str, int], ...]] = {}
    for level in (*NETWORK_LEVELS, ULTRASERVER):
        counts = Counter(p.domain_at(level) for p in known.values())
        counts.pop(None, None)
        if counts:
            where[level] = _ranked(Counter({str(k): n for k, n in counts.items()}))
    switches_met: bool | None = None
    if job.switches and not unplaced and None not in leaves:
        switches_met = len(leaf_ids) <= job.switches
    return JobPlacement(
        job=job,
        unplaced=unplaced,
        domains=domains,
        worst_pair_hops=hops,
        ultraserver=loc.ultraserver if "" not in ultras and not unplaced else "",
        ultraservers=len(ultras - {""}),
        leaves=len(leaf_ids),
        leaf_level=leaf_levels.pop() if len(leaf_levels) == 1 else "",
        switches_met=switches_met,
        pending=None,
        problems=tuple(problems),
        where=where,
    )


def judge_all(
    jobs: Iterable[SlurmJob], placements: Mapping[str, Placement], nodes: Sequence[NodeState]
) -> list[JobPlacement]:
    """Every running or pending job judged; finished ones are left out."""
    return [judge(job, placements, nodes) for job in jobs if job.allocated or job.pending]


def _pending(
    job: SlurmJob, placements: Mapping[str, Placement], nodes: Sequence[NodeState]
) -> PendingContext:
    meaning, kind = reason_meaning(job.reason)
    needs = job.node_count
    relevant = bool(job.switches) or job.contiguous or job.reason == "Resources"
    if not relevant or not nodes:
        lines: tuple[str, ...] = ()
        if relevant and not nodes:
            lines = ("no node states were read, so free capacity is unknown",)
        return PendingContext(
            job.reason, meaning, kind, needs, job.switches, job.contiguous, None, lines
        )
    partitions = tuple(p for p in job.partition.split(",") if p)
    capacity = free_capacity(nodes, placements, partitions)
    return PendingContext(
        job.reason,
        meaning,
        kind,
        needs,
        job.switches,
        job.contiguous,
        capacity,
        tuple(_context_lines(job, needs, capacity)),
    )


def _context_lines(job: SlurmJob, needs: int | None, cap: FreeCapacity) -> list[str]:
    where = f"partition {','.join(cap.partitions)}" if cap.partitions else "the cluster"
    lines: list[str] = []
    leaf_word = "leaf switch" if not cap.leaf_levels else f"leaf switch ({cap.leaf_levels[0]})"
    largest_id, largest = cap.largest_leaf()
    leaves_free = len(cap.per_leaf)
    count = f"{needs} node{'s' if needs != 1 else ''}" if needs is not None else "its nodes"
    summary = f"{cap.free_nodes} node{'s' if cap.free_nodes != 1 else ''} free in {where}"
    if leaves_free:
        summary += f" across {leaves_free} leaf switch{'es' if leaves_free != 1 else ''}"
        summary += f" ({named(cap.per_leaf)})"
    if cap.free_unplaced:
        summary += f" ({cap.free_unplaced} not in the topology)"
    if job.switches:
        if job.switches == 1:
            best = (
                f"the largest free {leaf_word} is {largest_id} with {largest}"
                if largest_id
                else f"no {leaf_word} has a free node"
            )
            lines.append(f"needs {count} in one leaf switch (--switches=1); {best}")
        else:
            top = cap.best_leaves(job.switches)
            freest = named(cap.per_leaf[: job.switches])
            lines.append(
                f"needs {count} in at most {job.switches} leaf switches (--switches="
                f"{job.switches}); the {job.switches} freest leaf switches have {top} together"
                + (f" ({freest})" if freest else "")
            )
        if needs is not None and _fits(job, needs, cap):
            lines.append(
                "that is enough by node count now; slurmctld may not have re-evaluated yet, or "
                "the free nodes lack what the job asks (CPUs, memory, GRES, features)"
            )
    if job.contiguous:
        lines.append(
            "asks for contiguous nodes (--contiguous): consecutive in slurm.conf order, which "
            "topowatch does not judge"
        )
    lines.append(summary)
    if not job.switches and needs is not None and job.reason == "Resources":
        if cap.free_nodes < needs:
            lines.append(f"needs {count}: {needs - cap.free_nodes} more than are free")
        else:
            lines.append(
                f"needs {count}: enough nodes are free by count, so what is missing is not the "
                f"node count (CPUs, memory, GRES or features on them, or nodes held for a "
                f"higher priority job)"
            )
            if largest_id and largest < needs:
                lines.append(
                    f"no one leaf switch holds {needs} free nodes (the largest, {largest_id}, "
                    f"has {largest}): the job would span switches"
                )
    return list(dict.fromkeys(lines))


NAMED_AT_MOST = 8  # switches named in one line; the rest are counted


def named(counts: Sequence[tuple[str, int]]) -> str:
    """ "leaf-c 3, leaf-a 2, ... and 4 more": switches by name with their counts."""
    shown = [f"{name} {n}" for name, n in counts[:NAMED_AT_MOST]]
    if len(counts) > NAMED_AT_MOST:
        shown.append(f"and {len(counts) - NAMED_AT_MOST} more")
    return ", ".join(shown)


def _fits(job: SlurmJob, needs: int, cap: FreeCapacity) -> bool:
    if not job.switches:
        return cap.free_nodes >= needs
    return cap.best_leaves(job.switches) >= needs
