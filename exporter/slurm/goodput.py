"""The Slurm interruption ledger (issue 29, part 6): what stopped each job, what it cost, and
each job's effective training time ratio, from successive `squeue --json` reads and what the
controller itself saw and did on the nodes. Pure: no I/O, no clock (pass `now`).

The same words as the Kueue ledger (exporter.core.goodput: causes, components, `Interruption`),
so a HyperPod Slurm admin gets the same answers, the same metric label values and the same
alerts. On Slurm a job is its job id; its "namespace" is its partition and its team the Slurm
account it runs under, or its partition when it has no account (a cluster without accounting).

What is read from squeue (squeue(1) JOB STATE CODES; slurm.h `enum job_states` and
`job_info_t`):
- the base state: RUNNING (CONFIGURING flag: its nodes are booting, "restarting"), SUSPENDED,
  PENDING, and the ends COMPLETED, CANCELLED, FAILED, TIMEOUT, NODE_FAIL, PREEMPTED, BOOT_FAIL,
  DEADLINE, OUT_OF_MEMORY; the COMPLETING flag (epilogs running: ended, the end not final);
- `restart_cnt`: how many times slurmctld requeued the job (`scontrol requeue`, a node failure
  of a requeueable job, a preemption with PreemptMode=REQUEUE: each requeue counts one, and the
  job goes back to PENDING with a new `start_time` when it runs again);
- `preempt_time` (slurmctld chose it for preemption), `suspend_time`, `end_time`, `start_time`.

A job stops running when a read after one that saw it RUNNING shows it suspended, pending
again, completing or ended, or RUNNING with a larger restart count or a later start time
(requeued and started again between two reads), or no longer lists it. Each stop is an entry,
its cause decided by these rules, first match wins (the Kueue ledger's, with Slurm's evidence;
see exporter/cluster/goodput/attribution.py):
1. preempted: the state PREEMPTED, or slurmctld chose the job for preemption (`preempt_time`)
   during the run that stopped (PreemptMode=REQUEUE or SUSPEND). squeue names no preemptor.
2. user: CANCELLED (scancel), SUSPENDED without a preemption (scontrol suspend), TIMEOUT and
   DEADLINE (the job's own limits), a requeue held (`scontrol requeuehold`: REQUEUE_HOLD).
3. completed: COMPLETED (an entry, not an interruption).
4. the job's nodes, by time, from what the controller saw: a critical or fatal finding first
   seen within `FATAL_KILL_S` before the stop, no action before it, and no read that saw the
   job still running after it (then it did not kill the job): node fault; else an
   action begun within `ACTION_WINDOW_S` before the stop (this controller's reboot, replace or
   drain, or HyperPod's `Action:Reboot|Replace` Reason): remediation, the finding before it
   its reason; else the node went DOWN, FAIL or NOT_RESPONDING in slurmctld: node fault of the
   host (uncertain: no finding names a part); else any finding within `FINDING_LOOKBACK_S`
   before: node fault; else a finding first seen after the stop, within `SETTLE_S`: node
   fault, uncertain.
5. NODE_FAIL or BOOT_FAIL with no evidence above: node fault of the host, uncertain.
6. unknown, with what was looked for and not found (a requeue by `scontrol requeue` leaves no
   other trace in squeue; FAILED and OUT_OF_MEMORY say the job's own exit).
Evidence from before the run that stopped began is left out (the job ran through it).

Times: stopped (`end_time` or `preempt_time` when it falls between the two reads, else the
read that saw it) -> detected (the first finding) -> action -> node back in service -> running
again (the new `start_time`, else the read that saw it). GPU-hours lost: the job's GPUs
(`tres_alloc_str`) x time until it ran again. ETTR = running / (wall - suspended - unobserved),
wall counted from the job's first start; a job's phases (running, restarting, waiting,
preempted, suspended, unobserved) add up to its wall time.

Restart-safe: `document()` is written by the controller beside its state file, `restore()`
reads it back. Time while no controller watched is "unobserved" unless squeue proves the job
ran through it (RUNNING, the same restart count and start time, no suspension since); restarts
in that time become entries whose times are bounded and said to be uncertain. Entries rebuilt
from the file are never counted again in `live_counts` (a restart starts that counter at zero,
as on the Kueue side).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final, Literal

from exporter.core.findings import SEVERITIES, Finding
from exporter.core.goodput.causes import CAUSES, Cause, component_of
from exporter.core.goodput.interruptions import Interruption
from exporter.sources.slurm.jobs import SlurmJob
from exporter.sources.slurm.nodes import SlurmNode

__all__ = [
    "FORMAT_VERSION",
    "JOB_KIND",
    "REPORTED",
    "NodeEvent",
    "SlurmGoodput",
    "SlurmJobGoodput",
    "StopFacts",
    "Verdict",
    "attribute",
    "interruption_view",
    "team_of",
]

SETTLE_S: Final = 120.0
FINAL_WAIT_S: Final = 600.0  # settled even if the end state was never seen by then
FATAL_KILL_S: Final = 120.0
ACTION_WINDOW_S: Final = 300.0
FINDING_LOOKBACK_S: Final = 600.0
DOWN_WINDOW_S: Final = 120.0
CONCURRENT_S: Final = 10.0
SKEW_S: Final = 2.0
EVIDENCE_KEEP_S: Final = 3600.0  # node evidence older than this decides nothing
MAX_EVENTS_PER_NODE: Final = 64
RETAIN_S: Final = 86_400.0  # an ended job stays in the ledger this long
MAX_JOBS: Final = 20_000
FORMAT_VERSION: Final = 1
JOB_KIND: Final = "SlurmJob"

REPORTED: Final = ("running", "restarting", "waiting", "preempted", "suspended", "unobserved")
EXCLUDED: Final = ("suspended", "unobserved")  # left out of ETTR's denominator
_LIVE: Final = frozenset({"running", "restarting", "waiting", "suspended", "unobserved"})
_ACTIVE: Final = frozenset({"running", "restarting"})
# Reasons topowatch (or HyperPod) writes on a node it acted on (providers/slurm.py).
_HYPERPOD_REASONS: Final = {"Action:Reboot": "reboot", "Action:Replace": "replace"}
_OUR_PREFIX: Final = "topowatch:"
_DOWN_FLAGS: Final = frozenset({"FAIL", "NOT_RESPONDING"})
_OUT_FLAGS: Final = frozenset({"DRAIN", "FAIL", "NOT_RESPONDING", "MAINTENANCE"})
_ACTION_WORDS: Final = {"deep-check": "deep_health_check"}
_FINAL_STATES: Final = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)

NodeEventKind = Literal["finding", "action", "down", "back"]
Status = Literal["running", "restarting", "suspended", "pending", "stopping", "ended", ""]


def team_of(job: SlurmJob) -> str:
    """The team label of a Slurm job: its account, else its partition (no accounting)."""
    return job.account or job.partition


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError):
        return None


def _when(candidates: Iterable[float | None], low: float, high: float) -> float:
    """The first candidate time that falls within [low, high] (give or take SKEW_S), clamped
    into it; `high` (the read that saw the change) when none does."""
    for t in candidates:
        if t is not None and low - SKEW_S <= t <= high + SKEW_S:
            return min(max(t, low), high)
    return high


# --- evidence on nodes -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """Something the controller saw on a node: a finding of its agent appeared, an action began
    (this controller's, or HyperPod's Reason), slurmctld took it down, it came back."""

    time: float
    node: str
    kind: NodeEventKind
    check: str = ""
    component: str = ""  # the finding's own ("gpu3", "rdmap16s27:1")
    part: str = ""  # its class, exporter.core.goodput.causes.COMPONENTS
    severity: str = ""
    evidence: str = ""
    action: str = ""  # reboot | replace | reset | deep_health_check
    by: str = ""  # topowatch | hyperpod | whoever set the node's Reason
    detail: str = ""

    @property
    def key(self) -> tuple[str, str, str, str, str, float]:
        return (self.node, self.kind, self.check, self.component, self.action, round(self.time))

    @property
    def fatal(self) -> bool:
        return self.kind == "finding" and self.severity in ("critical", "fatal")

    def words(self) -> str:
        if self.kind == "finding":
            return (
                f"{self.check} on {self.component or 'node'} of {self.node} "
                f"({self.severity}, {self.evidence})"
            )
        return self.detail or f"{self.kind} on {self.node}"

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    @classmethod
    def from_dict(cls, data: Any) -> NodeEvent | None:
        if not isinstance(data, Mapping):
            return None
        try:
            kind = data.get("kind")
            time = data.get("time")
            node = data.get("node")
            if kind not in ("finding", "action", "down", "back") or not isinstance(node, str):
                return None
            if isinstance(time, bool) or not isinstance(time, int | float):
                return None
            text = {k: str(data.get(k) or "") for k in cls.__slots__ if k not in ("time",)}
            text.pop("kind")
            text.pop("node")
            return cls(float(time), node, kind, **text)
        except (TypeError, ValueError):
            return None


def finding_event(node: str, finding: Finding) -> NodeEvent:
    return NodeEvent(
        time=finding.first_seen,
        node=node,
        kind="finding",
        check=finding.check,
        component=finding.component,
        part=component_of(finding.check, finding.evidence),
        severity=finding.severity,
        evidence=finding.evidence[:200],
        action=finding.action if finding.action != "none" else "",
    )


# --- the rules ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StopFacts:
    """One stop of a job, as squeue showed it after the stop."""

    time: float
    nodes: tuple[str, ...]
    since: float | None  # when the run that stopped began
    state: str  # the base state after the stop; "" when not seen (left squeue, or COMPLETING)
    flags: tuple[str, ...] = ()
    requeued: int = 0  # how much the restart count grew
    preempt_time: float | None = None
    reason: str = ""  # state_reason after the stop
    final: bool = True  # the state after the stop is known for good
    note: str = ""  # how the stop was seen, when not at one read ("between two reads", ...)
    seen_running: float | None = None  # the last read that saw it running before the stop

    def as_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__slots__}
        out["nodes"] = list(self.nodes)
        out["flags"] = list(self.flags)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> StopFacts | None:
        if not isinstance(data, Mapping):
            return None
        try:
            since = data.get("since")
            preempt = data.get("preempt_time")
            return cls(
                time=float(data["time"]),
                nodes=tuple(str(n) for n in data.get("nodes") or ()),
                since=float(since) if since is not None else None,
                state=str(data.get("state") or ""),
                flags=tuple(str(f) for f in data.get("flags") or ()),
                requeued=int(data.get("requeued") or 0),
                preempt_time=float(preempt) if preempt is not None else None,
                reason=str(data.get("reason") or ""),
                final=bool(data.get("final", True)),
                note=str(data.get("note") or ""),
                seen_running=_float_or_none(data.get("seen_running")),
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class Verdict:
    cause: Cause
    component: str = ""
    detail: str = ""
    uncertain: str = ""
    missing: str = ""
    node: str = ""
    check: str = ""
    finding_component: str = ""
    verdict: str = ""
    action: str = ""
    detected_at: float | None = None
    action_at: float | None = None


def attribute(stop: StopFacts, events: Iterable[NodeEvent]) -> Verdict:
    """The cause of `stop` (the module's docstring lists the rules)."""
    t = stop.time
    start = stop.since if stop.since is not None else -math.inf
    nodes = set(stop.nodes)
    mine = [e for e in events if e.node in nodes]
    note = stop.note
    flags = set(stop.flags)

    # 1. preempted
    chosen = stop.preempt_time is not None and start - SKEW_S <= stop.preempt_time <= t + SKEW_S
    if stop.state == "PREEMPTED" or chosen:
        if stop.state == "PREEMPTED":
            detail = "slurmctld preempted it (PREEMPTED: PreemptMode=CANCEL)"
        elif stop.state == "SUSPENDED":
            detail = f"suspended by a preemption at {_iso(stop.preempt_time)} (PreemptMode=SUSPEND)"
        elif stop.requeued:
            detail = (
                f"requeued after slurmctld chose it for preemption at {_iso(stop.preempt_time)}"
                " (PreemptMode=REQUEUE)"
            )
        else:
            detail = f"slurmctld chose it for preemption at {_iso(stop.preempt_time)}"
        uncertain = _joined("squeue names no preemptor", note)
        same = [
            e for e in mine if abs(e.time - t) <= CONCURRENT_S and (e.kind == "down" or e.fatal)
        ]
        if same:
            first = min(same, key=lambda e: (e.time, e.node))
            uncertain = _joined(
                uncertain, f"{first.words()} at the same moment: the node may have stopped it"
            )
        return Verdict(
            "preempted",
            detail=detail,
            uncertain=uncertain,
            verdict="unknown",
            detected_at=stop.preempt_time,
        )

    # 2. user
    said = {
        "CANCELLED": "cancelled (scancel, by its owner or an admin)",
        "SUSPENDED": "suspended (scontrol suspend)",
        "TIMEOUT": "reached its time limit (--time)",
        "DEADLINE": "reached its deadline (--deadline)",
    }.get(stop.state)
    if said is None and "REQUEUE_HOLD" in flags:
        said = "requeued and held (scontrol requeuehold)"
    if said is not None:
        uncertain = note
        same = [
            e for e in mine if abs(e.time - t) <= CONCURRENT_S and (e.kind == "down" or e.fatal)
        ]
        if same:
            first = min(same, key=lambda e: (e.time, e.node))
            uncertain = _joined(uncertain, f"{first.words()} at the same moment")
        return Verdict("user", detail=said, uncertain=uncertain)

    # 3. completed
    if stop.state == "COMPLETED" and stop.final:
        return Verdict("completed", detail="completed (exit code 0)", uncertain=note)

    # 4. the nodes
    found = _by_node(t, mine, stop.since, stop.seen_running)
    if found is not None:
        return replace(found, uncertain=_joined(found.uncertain, note))

    # 5. slurmctld saw a node fail
    where = ", ".join(sorted(nodes)) or "its nodes"
    if stop.state in ("NODE_FAIL", "BOOT_FAIL"):
        what = "a node failed" if stop.state == "NODE_FAIL" else "a node failed to boot"
        return Verdict(
            "node_fault",
            component="host",
            detail=f"slurmctld ended it {stop.state} ({what} among {where})",
            uncertain=_joined("no health finding names a part: the host is assumed", note),
        )

    # 6. unknown
    missing = (
        f"no preemption time, no finding, action, DOWN or NOT_RESPONDING on {where} from"
        f" {FINDING_LOOKBACK_S:.0f} s before to {SETTLE_S:.0f} s after it stopped"
    )
    if stop.requeued:
        detail = (
            f"requeued (restart count +{stop.requeued}): `scontrol requeue`, or a failed launch,"
            " leaves no other trace in squeue"
        )
    elif stop.state in ("FAILED", "OUT_OF_MEMORY"):
        detail = f"ended {stop.state}: the job's own exit"
    elif stop.state == "PENDING":
        detail = f"pending again ({stop.reason or 'no reason given'})"
    elif not stop.state:
        detail = "its end state was not seen"
    else:
        detail = f"stopped ({stop.state})"
    if not stop.final and stop.state:
        missing = f"{missing}; its end state (seen {stop.state} while COMPLETING only)"
    elif not stop.state:
        missing = (
            f"{missing}; its end state (it left squeue between two reads: MinJobAge, or squeue"
            " listing only pending, running and completing jobs)"
        )
    return Verdict("unknown", detail=detail, missing=missing, uncertain=note)


def _by_node(
    t: float, events: Sequence[NodeEvent], since: float | None, seen: float | None = None
) -> Verdict | None:
    """Rule 4. A fatal finding the job was seen running after did not kill it (on Slurm the
    controller reads the job after its agents: a finding and an action on a job still RUNNING,
    then a requeue, is the action's doing)."""
    start = since if since is not None else -math.inf
    survived = seen if seen is not None else -math.inf
    findings = [e for e in events if e.kind == "finding"]
    actions = [
        e
        for e in events
        if e.kind == "action" and max(t - ACTION_WINDOW_S, start) <= e.time <= t + SKEW_S
    ]
    downs = [
        e
        for e in events
        if e.kind == "down" and max(t - DOWN_WINDOW_S, start) <= e.time <= t + SKEW_S
    ]
    before = [
        e for e in findings if max(t - FINDING_LOOKBACK_S, start - SKEW_S) <= e.time <= t + SKEW_S
    ]
    fatal = [
        e for e in before if e.time >= t - FATAL_KILL_S and e.fatal and e.time > survived - SKEW_S
    ]
    first_action = min(actions, key=lambda e: (e.time, e.node)) if actions else None
    first_down = min(downs, key=lambda e: (e.time, e.node)) if downs else None
    if fatal:
        root = min(fatal, key=lambda e: (e.time, e.node))
        if first_action is None or first_action.time >= root.time - SKEW_S:
            return _fault(root, first_action)
    if first_action is not None and (
        first_down is None or first_action.time <= first_down.time + SKEW_S
    ):
        reason = max(
            (
                e
                for e in findings
                if e.node == first_action.node and e.time <= first_action.time + SKEW_S
            ),
            key=lambda e: e.time,
            default=None,
        )
        because = f" after {reason.words()}" if reason is not None else ""
        who = f" ({first_action.detail})" if first_action.detail else ""
        return Verdict(
            "remediation",
            component=reason.part if reason is not None else "unknown",
            detail=f"{first_action.action} of {first_action.node} began at"
            f" {_iso(first_action.time)}{who}{because}",
            uncertain="" if reason is not None else "no finding before the action names a part",
            node=first_action.node,
            check=reason.check if reason is not None else "",
            finding_component=reason.component if reason is not None else "",
            action=first_action.action,
            detected_at=reason.time if reason is not None else first_action.time,
            action_at=first_action.time,
        )
    if first_down is not None:
        return Verdict(
            "node_fault",
            component="host",
            detail=f"{first_down.detail or first_down.node + ' went down'} at"
            f" {_iso(first_down.time)}",
            uncertain="no health finding names a part: the host is assumed",
            node=first_down.node,
            detected_at=first_down.time,
        )
    if before:
        return _fault(min(before, key=lambda e: (e.time, e.node)), first_action)
    late = [e for e in findings if t + SKEW_S < e.time <= t + SETTLE_S]
    if late:
        root = min(late, key=lambda e: (e.time, e.node))
        return replace(
            _fault(root, first_action),
            uncertain=f"the finding was first seen {root.time - t:.0f} s after the job stopped"
            " (the agent's clock, or a finding that came after the stop)",
        )
    return None


def _fault(root: NodeEvent, action: NodeEvent | None) -> Verdict:
    return Verdict(
        "node_fault",
        component=root.part or "unknown",
        detail=f"{root.words()} at {_iso(root.time)}",
        node=root.node,
        check=root.check,
        finding_component=root.component,
        action=action.action if action is not None else "",
        detected_at=root.time,
        action_at=action.time if action is not None else None,
    )


def _joined(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


# --- one job -----------------------------------------------------------------------------------


def status_of(job: SlurmJob) -> Status:
    """Where a squeue record puts the job: running, restarting (CONFIGURING: its nodes boot),
    suspended, pending, stopping (COMPLETING: ended, the end not final), ended; "" unreadable."""
    if not job.state:
        return ""
    if "COMPLETING" in job.state_flags:
        return "stopping"
    if job.state == "RUNNING":
        return "restarting" if "CONFIGURING" in job.state_flags else "running"
    if job.state == "SUSPENDED":
        return "suspended"
    if job.state == "PENDING":
        return "pending"
    if job.state in _FINAL_STATES:
        return "ended"
    return ""


@dataclass(slots=True)
class _Job:
    job_id: str
    name: str
    user: str
    account: str
    partition: str
    team: str
    gpus: int
    nodes: tuple[str, ...]
    restarts: int | None
    run_start: float | None
    first_started: float
    phase: str  # running | restarting | waiting | suspended | unobserved | finished
    phase_since: float
    last_seen: float
    seconds: dict[str, float] = field(default_factory=dict)
    finished_at: float | None = None
    state: str = ""  # as squeue last showed it: "RUNNING", "PENDING (REQUEUED)", ...
    entries: list[Interruption] = field(default_factory=list)
    stops: dict[str, StopFacts] = field(default_factory=dict)  # of entries not settled yet
    gap_from: float | None = None  # restored: no controller watched from then to the next read

    @property
    def open_entry(self) -> Interruption | None:
        """The last entry, while the job has not run again since (completion excluded)."""
        if self.entries:
            last = self.entries[-1]
            if last.counted and last.resumed_at is None:
                return last
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "name": self.name,
            "user": self.user,
            "account": self.account,
            "partition": self.partition,
            "team": self.team,
            "gpus": self.gpus,
            "nodes": list(self.nodes),
            "restarts": self.restarts,
            "run_start": self.run_start,
            "first_started": self.first_started,
            "phase": self.phase,
            "phase_since": self.phase_since,
            "last_seen": self.last_seen,
            "seconds": dict(self.seconds),
            "finished_at": self.finished_at,
            "state": self.state,
            "entries": [e.as_dict() for e in self.entries],
            "stops": {k: v.as_dict() for k, v in self.stops.items()},
        }

    @classmethod
    def from_dict(cls, data: Any) -> _Job | None:
        if not isinstance(data, Mapping):
            return None
        try:
            entries = [Interruption.from_dict(e) for e in data.get("entries") or ()]
            stops = {str(k): StopFacts.from_dict(v) for k, v in (data.get("stops") or {}).items()}
            phase = str(data["phase"])
            if phase not in (*_LIVE, "finished"):
                return None
            restarts = data.get("restarts")
            run_start = data.get("run_start")
            finished = data.get("finished_at")
            return cls(
                job_id=str(data["job_id"]),
                name=str(data.get("name") or ""),
                user=str(data.get("user") or ""),
                account=str(data.get("account") or ""),
                partition=str(data.get("partition") or ""),
                team=str(data.get("team") or ""),
                gpus=int(data.get("gpus") or 0),
                nodes=tuple(str(n) for n in data.get("nodes") or ()),
                restarts=int(restarts) if restarts is not None else None,
                run_start=float(run_start) if run_start is not None else None,
                first_started=float(data["first_started"]),
                phase=phase,
                phase_since=float(data["phase_since"]),
                last_seen=float(data["last_seen"]),
                seconds={
                    str(k): float(v)
                    for k, v in (data.get("seconds") or {}).items()
                    if k in REPORTED
                },
                finished_at=float(finished) if finished is not None else None,
                state=str(data.get("state") or ""),
                entries=[e for e in entries if e is not None],
                stops={k: v for k, v in stops.items() if v is not None},
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


@dataclass(frozen=True, slots=True)
class SlurmJobGoodput:
    """One job's goodput at a moment: its phases add up to `wall`."""

    job_id: str
    name: str
    user: str
    account: str
    partition: str
    team: str
    gpus: int
    nodes: tuple[str, ...]
    phase: str
    state: str
    restarts: int | None
    first_started: float
    finished_at: float | None
    seconds: dict[str, float]
    wall: float
    ettr: float | None
    interruptions: int
    lost_gpu_seconds_by_cause: dict[str, float]
    entries: tuple[Interruption, ...]
    end: float  # the moment the figures are for (the job's end, once it ended)

    @property
    def live(self) -> bool:
        return self.finished_at is None

    @property
    def effective_wall(self) -> float:
        return self.wall - sum(self.seconds.get(p, 0.0) for p in EXCLUDED)

    @property
    def lost_gpu_seconds(self) -> float:
        return sum(self.lost_gpu_seconds_by_cause.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "scheduler": "slurm",
            "job_id": self.job_id,
            "name": self.name,
            "user": self.user,
            "account": self.account,
            "partition": self.partition,
            "namespace": self.partition,
            "team": self.team,
            "gpus": self.gpus,
            "nodes": list(self.nodes),
            "phase": self.phase,
            "state": self.state,
            "restart_count": self.restarts,
            "first_started": _iso(self.first_started),
            "finished_at": _iso(self.finished_at),
            "seconds": {p: round(s, 3) for p, s in self.seconds.items()},
            "wall_s": round(self.wall, 3),
            "effective_wall_s": round(self.effective_wall, 3),
            "ettr": self.ettr,
            "interruption_count": self.interruptions,
            "lost_gpu_hours": round(self.lost_gpu_seconds / 3600, 6),
            "lost_gpu_hours_by_cause": {
                c: round(s / 3600, 6) for c, s in sorted(self.lost_gpu_seconds_by_cause.items())
            },
            "interruptions": [interruption_view(e, self.end) for e in self.entries],
        }


def interruption_view(entry: Interruption, end: float) -> dict[str, Any]:
    """One entry as the API gives it (the Kueue side's shape, exporter/cluster/views)."""
    lost = entry.lost_gpu_seconds(end)
    return {
        "id": entry.id,
        "scheduler": "slurm",
        "namespace": entry.namespace,
        "job_kind": entry.job_kind,
        "job": entry.job,
        "name": entry.workload,
        "team": entry.team,
        "gpus": entry.gpus,
        "nodes": list(entry.nodes),
        "cause": entry.cause,
        "component": entry.component,
        "detail": entry.detail,
        "uncertain": entry.uncertain,
        "missing": entry.missing,
        "settled": entry.settled,
        "evidence": {
            "node": entry.node,
            "check": entry.check,
            "finding_component": entry.finding_component,
            "verdict": entry.verdict,
            "preemptor": entry.preemptor,
            "action": entry.action,
        },
        "stopped_at": _iso(entry.stopped_at),
        "detected_at": _iso(entry.detected_at),
        "action_at": _iso(entry.action_at),
        "node_back_at": _iso(entry.node_back_at),
        "resumed_at": _iso(entry.resumed_at),
        "open": entry.counted and entry.resumed_at is None,
        "stopped_at_s": entry.stopped_at,
        "resumed_at_s": entry.resumed_at,
        "waiting_s": round(entry.waiting_s, 3),
        "restarting_s": round(entry.restarting_s, 3),
        "lost_gpu_hours": round(lost / 3600, 6),
    }


# --- the ledger --------------------------------------------------------------------------------


class SlurmGoodput:
    """Every job seen running, its interruptions and phases; the nodes' recent evidence."""

    def __init__(self, retain_s: float = RETAIN_S, max_jobs: int = MAX_JOBS) -> None:
        self.retain_s = retain_s
        self.max_jobs = max_jobs
        self.jobs: dict[str, _Job] = {}
        self.events: dict[str, dict[tuple[str, str, str, str, str, float], NodeEvent]] = {}
        self.node_status: dict[str, str] = {}  # in | out | down, as last read
        self.live: Counter[tuple[str, str, str]] = Counter()  # settled here, by cause/part/team
        self.teams: set[str] = set()
        self.changed = False  # something to write since the last `document()`
        self.saved_at: float | None = None
        self._restored: set[str] = set()  # entries read back: never counted in `live`

    # -- evidence --

    def _add(self, event: NodeEvent) -> None:
        per = self.events.setdefault(event.node, {})
        if event.key in per:
            return
        per[event.key] = event
        if len(per) > MAX_EVENTS_PER_NODE:
            for key in sorted(per, key=lambda k: per[k].time)[: len(per) - MAX_EVENTS_PER_NODE]:
                del per[key]
        self.changed = True

    def observe_findings(self, node: str, findings: Iterable[Finding]) -> None:
        """An agent's findings (every severity but info): each is remembered by its first
        sighting, so one that clears before the job's stop is read is still evidence."""
        for finding in findings:
            if finding.severity != SEVERITIES[0] or finding.action != "none":
                self._add(finding_event(node, finding))

    def observe_action(self, node: str, action: str, started_at: float, detail: str = "") -> None:
        """An action this controller decided (its state file's record of it)."""
        self._add(
            NodeEvent(
                started_at,
                node,
                "action",
                action=_ACTION_WORDS.get(action, action),
                by="topowatch",
                detail=detail or f"topowatch asked for a {action}",
            )
        )

    def observe_nodes(self, nodes: Iterable[SlurmNode], now: float) -> None:
        """slurmctld's node list: a node taken DOWN, FAIL or NOT_RESPONDING; a Reason asking
        HyperPod (or this controller's drain) to act; a node back in service."""
        for node in nodes:
            reason = node.reason.strip()
            asked = next((a for r, a in _HYPERPOD_REASONS.items() if reason.startswith(r)), "")
            ours = reason.startswith(_OUR_PREFIX)
            down = node.state == "down" or bool(node.flags & _DOWN_FLAGS)
            out = node.state == "down" or bool(node.flags & _OUT_FLAGS)
            status = "down" if down and not (asked or ours) else ("out" if out else "in")
            before = self.node_status.get(node.name)
            if before != status:
                self.node_status[node.name] = status
                self.changed = True
            if before is None and status == "in":
                continue  # first read: nothing changed that we saw
            at = _when([node.reason_changed_at], now - EVIDENCE_KEEP_S, now)
            if (asked or ours) and before != status:
                self._reason_action(node, asked or _our_action(reason), at, reason)
            if status == "down" and before != "down":
                who = f" by {node.reason_set_by}" if node.reason_set_by else ""
                self._add(
                    NodeEvent(
                        at,
                        node.name,
                        "down",
                        by=node.reason_set_by,
                        detail=f"slurmctld: {node.name} {node.describe()}{who}",
                    )
                )
            if status == "in" and before in ("out", "down"):
                self._add(NodeEvent(now, node.name, "back", detail=f"{node.name} back in service"))

    def _reason_action(self, node: SlurmNode, action: str, at: float, reason: str) -> None:
        """The node's Reason asks for an action: ours when this controller recorded one just
        before, else HyperPod's (or an admin's) own."""
        known = [
            e
            for e in self.events.get(node.name, {}).values()
            if e.kind == "action"
            and e.by == "topowatch"
            and at - ACTION_WINDOW_S <= e.time <= at + SKEW_S
        ]
        if known:
            return
        who = node.reason_set_by or "someone"
        self._add(
            NodeEvent(
                at,
                node.name,
                "action",
                action=action or "reboot",
                by=node.reason_set_by or "hyperpod",
                detail=f"Reason {reason[:80]!r} set by {who}",
            )
        )

    def _node_events(self, nodes: Iterable[str]) -> list[NodeEvent]:
        out: list[NodeEvent] = []
        for node in set(nodes):
            out.extend(self.events.get(node, {}).values())
        return out

    # -- jobs --

    def observe_jobs(self, jobs: Sequence[SlurmJob], now: float, complete: bool = True) -> None:
        """One squeue read. `complete`: the read listed every job it could (a job that is
        gone from it has left slurmctld); False for a document with unreadable parts."""
        seen: set[str] = set()
        for job in jobs:
            if not job.job_id or job.job_id.startswith("?"):
                continue
            status = status_of(job)
            if not status:
                seen.add(job.job_id)  # unreadable this time: keep what we know
                continue
            seen.add(job.job_id)
            track = self.jobs.get(job.job_id)
            if track is None:
                self._first_sight(job, status, now)
            else:
                self._step(track, job, status, now)
        if complete:
            for track in list(self.jobs.values()):
                if track.job_id not in seen and track.phase in _LIVE:
                    self._vanished(track, now)
        self.tick(now)

    def _first_sight(self, job: SlurmJob, status: Status, now: float) -> None:
        if status not in ("running", "restarting", "suspended"):
            return  # never seen running: no ledger yet
        started = _when([job.start_time], now - 365 * 86_400.0, now)
        if status == "suspended":
            started = now  # how long it ran before is not known
        track = _Job(
            job_id=job.job_id,
            name=job.name,
            user=job.user,
            account=job.account,
            partition=job.partition,
            team=team_of(job),
            gpus=job.gpus or 0,
            nodes=job.nodes,
            restarts=job.restart_count,
            run_start=started,
            first_started=started,
            phase=status,
            phase_since=started,
            last_seen=now,
            state=_state_words(job),
        )
        self.jobs[job.job_id] = track
        self.teams.add(track.team)
        self.changed = True

    def _step(self, track: _Job, job: SlurmJob, status: Status, now: float) -> None:
        before_state = track.state
        track.state = _state_words(job)
        if job.gpus and job.allocated:
            track.gpus = job.gpus
        grew = 0
        if job.restart_count is not None and track.restarts is not None:
            grew = max(0, job.restart_count - track.restarts)
        if job.restart_count is not None:
            track.restarts = job.restart_count
        low, note = track.last_seen, ""
        if track.gap_from is not None:
            low = track.gap_from
            note = (
                f"happened while no controller watched (between {_iso(track.gap_from)} and"
                f" {_iso(now)}): its times are bounded by those"
            )
            if not self._ran_through(track, job, status, grew):
                self._move(track, "unobserved", track.gap_from)
            track.gap_from = None
        phase = track.phase
        was_running = phase in _ACTIVE or (phase == "unobserved" and track.open_entry is None)
        if phase == "finished":
            self._requeued_after_end(track, job, status, grew, low, now)
        elif was_running:
            self._from_running(track, job, status, grew, low, now, note)
        elif phase == "suspended" and track.open_entry is None:
            # seen suspended first: resumed or ended, with nothing of ours to close
            self._from_stopped(track, job, status, low, now)
        else:  # waiting, suspended, unobserved after a stop: the entry is open
            self._update_stop(track, job, status, grew)
            self._from_stopped(track, job, status, low, now)
        if track.state != before_state:
            self.changed = True
        track.last_seen = now

    def _from_running(
        self,
        track: _Job,
        job: SlurmJob,
        status: Status,
        grew: int,
        low: float,
        now: float,
        note: str,
    ) -> None:
        new_run = (
            job.start_time is not None
            and track.run_start is not None
            and job.start_time > track.run_start + SKEW_S
        )
        if status in ("running", "restarting"):
            if grew or new_run:
                # requeued and running again between two reads (or while none watched)
                stopped = _when([job.start_time], low, now) if note else low
                resumed = _when([job.start_time], stopped, now)
                how = _joined(note, "" if note else "requeued and running again between two reads")
                self._stop(track, job, stopped, "PENDING", grew or 1, how)
                self._move(track, "waiting", stopped)
                self._resume(track, job, status, resumed)
            elif status != track.phase:
                at = now if track.phase != "unobserved" else _when([job.suspend_time], low, now)
                self._move(track, status, at)
        elif status == "suspended":
            at = _when([job.suspend_time], low, now)
            self._stop(track, job, at, "SUSPENDED", grew, note)
            self._move(track, "suspended", at)
        else:  # pending, stopping (COMPLETING), ended
            at = _when([job.end_time, job.preempt_time], low, now)
            known = status != "stopping" or not job.state_from_flag
            self._stop(track, job, at, job.state if known else "", grew, note, status != "stopping")
            self._after_stop(track, status, at)

    def _from_stopped(
        self, track: _Job, job: SlurmJob, status: Status, low: float, now: float
    ) -> None:
        if status in ("running", "restarting"):
            candidates = [job.suspend_time] if track.phase == "suspended" else [job.start_time]
            self._resume(track, job, status, _when(candidates, low, now))
        elif status == "suspended" and track.phase != "suspended":
            self._move(track, "suspended", _when([job.suspend_time], low, now))
        elif status == "ended":
            self._after_stop(track, status, _when([job.end_time], low, now))
        elif status in ("pending", "stopping") and track.phase != "waiting":
            self._move(track, "waiting", _when([job.end_time], low, now))

    def _requeued_after_end(
        self, track: _Job, job: SlurmJob, status: Status, grew: int, low: float, now: float
    ) -> None:
        """Listed again after its end: a batch job can be requeued when it ended
        (`scontrol requeue`); the end it was judged by was not its end."""
        if status not in ("running", "restarting", "pending", "suspended"):
            return
        at = track.finished_at if track.finished_at is not None else low
        track.finished_at = None
        last = track.entries[-1] if track.entries else None
        if last is not None and last.resumed_at is None and last.id in track.stops:
            facts = track.stops[last.id]
            requeue = replace(facts, state="PENDING", requeued=max(1, grew), final=True)
            track.stops[last.id] = requeue
            track.entries[-1] = self._judged(last, requeue)
        elif last is None or not (last.counted and last.resumed_at is None):
            self._stop(track, job, at, "PENDING", max(1, grew), "requeued after it ended")
        self._move(track, "waiting", at)
        if status != "pending":
            self._from_stopped(track, job, status, low, now)

    def _ran_through(self, track: _Job, job: SlurmJob, status: Status, grew: int) -> bool:
        """squeue proves the job stayed as it was while no controller watched."""
        if grew:
            return False
        if track.phase in _ACTIVE:
            same_run = job.start_time is None or (
                track.run_start is not None and abs(job.start_time - track.run_start) <= SKEW_S
            )
            quiet = job.suspend_time is None or (
                track.gap_from is not None and job.suspend_time <= track.gap_from
            )
            return status == track.phase and same_run and quiet
        if track.phase == "waiting":
            return status == "pending"
        if track.phase == "suspended":
            return status == "suspended"
        return False

    def _move(self, track: _Job, phase: str, at: float) -> None:
        """Close the current phase at `at` (never before it began) and begin `phase`."""
        at = max(at, track.phase_since)
        spent = at - track.phase_since
        old = track.phase
        if spent > 0 and old in _LIVE:
            track.seconds[old] = track.seconds.get(old, 0.0) + spent
            entry = track.open_entry
            if entry is not None and old in ("waiting", "restarting"):
                field_name = "waiting_s" if old == "waiting" else "restarting_s"
                grown = replace(entry, **{field_name: getattr(entry, field_name) + spent})
                track.entries[-1] = grown
        track.phase = phase
        track.phase_since = at
        self.changed = True

    def _after_stop(self, track: _Job, status: Status, at: float) -> None:
        if status == "ended":
            self._move(track, "finished", at)
            track.finished_at = at
        elif track.phase != "waiting":
            self._move(track, "waiting", at)

    def _resume(self, track: _Job, job: SlurmJob, status: Status, at: float) -> None:
        """The job holds nodes again: restarting (CONFIGURING) or running; the open entry ends
        when it runs."""
        self._move(track, status, at)
        track.run_start = at if job.start_time is None else _when([job.start_time], 0.0, at)
        if job.nodes:
            track.nodes = job.nodes
        entry = track.open_entry
        if entry is not None and status == "running":
            track.entries[-1] = replace(entry, resumed_at=max(at, entry.stopped_at))

    def _stop(
        self,
        track: _Job,
        job: SlurmJob,
        at: float,
        state: str,
        grew: int,
        note: str,
        final: bool = True,
    ) -> None:
        """Open an entry (or, for a restart count that grew by more than one between two reads,
        one per requeue: the earlier ones lasted no time we could see)."""
        facts = StopFacts(
            time=at,
            nodes=track.nodes,
            since=track.run_start,
            state=state,
            flags=tuple(sorted(job.state_flags)),
            requeued=grew,
            preempt_time=job.preempt_time,
            reason=job.reason,
            final=final,
            note=note,
            seen_running=track.last_seen,
        )
        for _ in range(max(0, grew - 1)):
            self._open(track, replace(facts, note=_joined(note, "one of several requeues")), at)
            track.entries[-1] = replace(track.entries[-1], resumed_at=at)
        self._open(track, facts, at)

    def _open(self, track: _Job, facts: StopFacts, at: float) -> None:
        n = len(track.entries) + 1
        entry = Interruption(
            id=f"{track.partition}/{JOB_KIND}/{track.job_id}#{n}",
            namespace=track.partition,
            job_kind=JOB_KIND,
            job=track.job_id,
            workload=track.name,
            cluster_queue=track.partition,
            team=track.team,
            flavor="",
            gpus=track.gpus,
            nodes=track.nodes,
            stopped_at=at,
            run_started=track.run_start,
        )
        track.entries.append(self._judged(entry, facts))
        track.stops[entry.id] = facts
        self.changed = True

    def _update_stop(self, track: _Job, job: SlurmJob, status: Status, grew: int) -> None:
        """What squeue says after the stop, while the entry is not settled: the end state once
        COMPLETING is over, a requeue (the restart count grew), a preemption time."""
        entry = track.open_entry
        if entry is None or entry.id not in track.stops:
            return
        facts = track.stops[entry.id]
        state, final = facts.state, facts.final
        if status == "ended":
            state, final = job.state, True
        elif status == "pending":
            state, final = "PENDING", True
        elif status == "stopping" and not job.state_from_flag:
            state = job.state
        elif status in ("running", "restarting", "suspended") and not final:
            # Holding nodes again after a stop: only a requeue restarts the same job id, so
            # it was requeued and started again since (its PENDING fell between two reads).
            state, final = "PENDING", True
        new = replace(
            facts,
            state=state,
            final=final,
            flags=tuple(sorted(set(facts.flags) | job.state_flags)),
            requeued=facts.requeued + grew,
            preempt_time=facts.preempt_time or job.preempt_time,
            reason=job.reason or facts.reason,
        )
        if new != facts:
            track.stops[entry.id] = new
            track.entries[-1] = self._judged(entry, new)
            self.changed = True

    def _judged(self, entry: Interruption, facts: StopFacts) -> Interruption:
        v = attribute(facts, self._node_events(facts.nodes))
        return replace(
            entry,
            cause=v.cause,
            component=v.component,
            detail=v.detail,
            uncertain=v.uncertain,
            missing=v.missing,
            node=v.node,
            check=v.check,
            finding_component=v.finding_component,
            verdict=v.verdict,
            action=v.action,
            detected_at=v.detected_at,
            action_at=v.action_at,
        )

    def _vanished(self, track: _Job, now: float) -> None:
        """Gone from squeue: it ended between two reads (or while no controller watched)."""
        at = track.gap_from if track.gap_from is not None else track.last_seen
        note = "it left squeue between two reads"
        if track.gap_from is not None:
            note = f"it ended while no controller watched (after {_iso(track.gap_from)})"
            self._move(track, "unobserved", track.gap_from)
            track.gap_from = None
        entry = track.open_entry
        if entry is not None and entry.id in track.stops:
            facts = track.stops[entry.id]
            done = replace(facts, final=True, note=_joined(facts.note, note))
            track.stops[entry.id] = done
            track.entries[-1] = self._judged(entry, done)
        if track.phase in _ACTIVE or (track.phase == "unobserved" and entry is None):
            facts = StopFacts(
                time=at,
                nodes=track.nodes,
                since=track.run_start,
                state="",
                note=note,  # final: its end will not be seen now
            )
            self._open(track, facts, at)
        self._move(track, "finished", at)
        track.finished_at = at
        track.state = track.state + " (left squeue)" if track.state else "left squeue"

    def tick(self, now: float) -> None:
        """Settle what is due, fill in nodes coming back, let old jobs go."""
        for track in self.jobs.values():
            if track.stops:
                self._settle(track, now)
            self._node_back(track)
        self._prune(now)

    def _settle(self, track: _Job, now: float) -> None:
        for index, entry in enumerate(track.entries):
            facts = track.stops.get(entry.id)
            if facts is None:
                continue
            judged = self._judged(entry, facts)
            due = now >= entry.stopped_at + SETTLE_S and (
                facts.final or now >= entry.stopped_at + FINAL_WAIT_S
            )
            if due:
                judged = replace(judged, settled=True)
                del track.stops[entry.id]
                if judged.counted and judged.id not in self._restored:
                    self.live[(judged.cause, judged.component, judged.team)] += 1
            if judged != entry:
                track.entries[index] = judged
                self.changed = True

    def _node_back(self, track: _Job) -> None:
        for index, entry in enumerate(track.entries):
            if not entry.node or entry.node_back_at is not None:
                continue
            after = max(t for t in (entry.stopped_at, entry.action_at, entry.detected_at) if t)
            back = [
                e.time
                for e in self.events.get(entry.node, {}).values()
                if e.kind == "back" and e.time >= after - SKEW_S
            ]
            if back:
                track.entries[index] = replace(entry, node_back_at=min(back))
                self.changed = True

    def _prune(self, now: float) -> None:
        old = [
            k
            for k, t in self.jobs.items()
            if t.finished_at is not None and now - t.finished_at > self.retain_s
        ]
        if len(self.jobs) - len(old) > self.max_jobs:
            ended = sorted(
                (
                    t
                    for t in self.jobs.values()
                    if t.finished_at is not None and t.job_id not in old
                ),
                key=lambda t: t.finished_at or 0.0,
            )
            old.extend(t.job_id for t in ended[: len(self.jobs) - len(old) - self.max_jobs])
        for key in old:
            del self.jobs[key]
        if old:
            self.changed = True
        for per in self.events.values():
            stale = [k for k, e in per.items() if now - e.time > EVIDENCE_KEEP_S]
            for event_key in stale:
                del per[event_key]
            if stale:
                self.changed = True
        for node in [n for n, per in self.events.items() if not per]:
            del self.events[node]

    # -- reads --

    def interruptions_of(self, job_id: str) -> list[Interruption]:
        track = self.jobs.get(job_id)
        return list(track.entries) if track is not None else []

    def interruptions(
        self,
        since: float | None = None,
        until: float | None = None,
        namespace: str | None = None,
        cause: str | None = None,
        job: str | None = None,
    ) -> list[Interruption]:
        out: list[Interruption] = []
        for track in self.jobs.values():
            if job is not None and track.job_id != job:
                continue
            if namespace is not None and track.partition != namespace:
                continue
            out.extend(
                e
                for e in track.entries
                if (since is None or e.stopped_at >= since)
                and (until is None or e.stopped_at < until)
                and (cause is None or e.cause == cause)
            )
        return out

    def job_goodput(self, job_id: str, now: float) -> SlurmJobGoodput | None:
        track = self.jobs.get(job_id)
        return _goodput(track, now) if track is not None else None

    def jobs_goodput(self, now: float) -> list[SlurmJobGoodput]:
        return [_goodput(t, now) for t in self.jobs.values()]

    def live_counts(self) -> Counter[tuple[str, str, str]]:
        """Interruptions settled while this process watched, by (cause, component, team)."""
        return self.live

    # -- durability --

    def document(self, now: float) -> dict[str, Any]:
        """Everything the ledger needs after a restart, as JSON; clears `changed`."""
        self.changed = False
        return {
            "version": FORMAT_VERSION,
            "saved_at": now,
            "jobs": [t.as_dict() for t in self.jobs.values()],
            "node_status": dict(self.node_status),
            "events": [e.as_dict() for per in self.events.values() for e in per.values()],
        }

    def restore(self, document: Any) -> list[str]:
        """Take back what `document()` wrote (call before the first read); the problems, one
        per part that could not be read (never raises). Time since `saved_at` is judged at
        the first read of each job."""
        if not isinstance(document, Mapping):
            return ["not a JSON object"]
        if document.get("version") != FORMAT_VERSION:
            return [f"version {document.get('version')!r}; this topowatch reads {FORMAT_VERSION}"]
        saved = document.get("saved_at")
        if isinstance(saved, bool) or not isinstance(saved, int | float):
            return ["no saved_at"]
        problems: list[str] = []
        for index, raw in enumerate(document.get("jobs") or ()):
            track = _Job.from_dict(raw)
            if track is None:
                problems.append(f"jobs[{index}] unreadable")
                continue
            if track.phase in _LIVE:
                track.gap_from = float(saved)
            self._restored.update(e.id for e in track.entries)
            self.jobs[track.job_id] = track
            self.teams.add(track.team)
        status = document.get("node_status")
        if isinstance(status, Mapping):
            self.node_status.update(
                {str(k): str(v) for k, v in status.items() if v in ("in", "out", "down")}
            )
        for index, raw in enumerate(document.get("events") or ()):
            event = NodeEvent.from_dict(raw)
            if event is None:
                problems.append(f"events[{index}] unreadable")
                continue
            self.events.setdefault(event.node, {})[event.key] = event
        self.saved_at = float(saved)
        return problems


def _goodput(track: _Job, now: float) -> SlurmJobGoodput:
    end = track.finished_at if track.finished_at is not None else now
    seconds = {p: track.seconds.get(p, 0.0) for p in REPORTED}
    current = max(0.0, end - track.phase_since) if track.phase in _LIVE else 0.0
    if track.phase in _LIVE:
        seconds[track.phase] += current
    preempted = 0.0
    open_entry = track.open_entry
    for entry in track.entries:
        if entry.cause == "preempted":
            preempted += entry.waiting_s
            if entry is open_entry and track.phase == "waiting":
                preempted += current
    preempted = min(preempted, seconds["waiting"])
    seconds["waiting"] -= preempted
    seconds["preempted"] = preempted
    wall = sum(seconds.values())
    counted = wall - sum(seconds[p] for p in EXCLUDED)
    lost: dict[str, float] = {}
    count = 0
    for entry in track.entries:
        if entry.counted:
            count += 1
            lost[entry.cause] = lost.get(entry.cause, 0.0) + entry.lost_gpu_seconds(end)
    return SlurmJobGoodput(
        job_id=track.job_id,
        name=track.name,
        user=track.user,
        account=track.account,
        partition=track.partition,
        team=track.team,
        gpus=track.gpus,
        nodes=track.nodes,
        phase=track.phase,
        state=track.state,
        restarts=track.restarts,
        first_started=track.first_started,
        finished_at=track.finished_at,
        seconds=seconds,
        wall=wall,
        ettr=seconds["running"] / counted if counted > 0 else None,
        interruptions=count,
        lost_gpu_seconds_by_cause=lost,
        entries=tuple(track.entries),
        end=end,
    )


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _state_words(job: SlurmJob) -> str:
    flags = sorted(job.state_flags)
    return job.state + (f" ({', '.join(flags)})" if flags else "")


def _our_action(reason: str) -> str:
    """The action of this controller's own Reason ("topowatch: replace: ...")."""
    words = reason[len(_OUR_PREFIX) :].strip().split(":", 1)[0].strip()
    return _ACTION_WORDS.get(words, words) or "reboot"


def check_cause(cause: str | None) -> None:
    if cause is not None and cause not in CAUSES:
        raise ValueError(f"cause={cause!r}: expected one of {', '.join(CAUSES)}")
