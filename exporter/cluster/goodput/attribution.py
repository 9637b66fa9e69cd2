"""Why a running job stopped: one cause from the evidence around the moment it stopped.

Pure: the stop (when, on which nodes, which Workloads) and the evidence the book gathered in
and around that moment go in, a `Verdict` comes out. The book asks again whenever new evidence
arrives, until `SETTLE_S` after the stop (informers deliver kinds in any order: a Workload's
Evicted condition, the Preempted Event, the pods' deletion and the node's findings can come in
any order within a few seconds), then the verdict is final.

The rules, first match wins:
1. preempted: Kueue preempted one of its Workloads within `PREEMPTION_WINDOW_S` (a preemption
   ledger entry, with its quota/topology verdict and preemptor, else the Workload's Evicted
   condition with reason Preempted). If the job is elastic and goes on with another admitted
   Workload, it is an elastic scale-down (the preempted part was above its minimum).
2. user: a Workload of the job was deleted or deactivated (spec.active false) while running,
   or Kueue evicted it for being inactive.
3. elastic scale-down: the elastic operator removed a Workload of the job (a scale event down
   whose cause is not a preemption: a faulty pod, a user's resize, ...).
4. completed: a Workload of the job Finished successfully.
5. the job's nodes (those its pods ran on), by time:
   - a critical or fatal finding first seen within `FATAL_KILL_S` before the stop, and no
     remediation begun before it: node fault (that finding killed the job);
   - else a remediation (HyperPod's reboot/replace label, a deep health check, a cordon) begun
     within `ACTION_WINDOW_S` before the stop and not after the node went down: remediation
     (the job ran through whatever finding prompted it; the finding is its reason);
   - else the node went NotReady (or was deleted) just before: node fault of the host, said to
     be uncertain (no finding names a part; an older, milder finding did not stop the job);
   - else any finding within `FINDING_LOOKBACK_S` before the stop: node fault;
   - else a finding first seen after the stop, within `SETTLE_S`: node fault, uncertain (the
     finding is later than the pods' end: clock skew between the agent and the API server, or
     an agent that wrote late).
6. a Workload that Finished as failed, with none of the above: unknown, and what was looked for.
7. unknown: nothing above; `missing` lists the evidence that was looked for and not found.

Evidence from before the job last began to run is left out (it ran through it). A preemption
with a fatal finding on one of the job's nodes at the same moment stays a preemption (Kueue
said so) and says that the node may have stopped the job first.

Times of objects carry whole seconds: `SKEW_S` is the slack either way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Final, Literal

from exporter.cluster.goodput.evidence import NodeFinding
from exporter.core.goodput.causes import Cause
from exporter.core.record import record

SETTLE_S: Final = 120.0
PREEMPTION_WINDOW_S: Final = 120.0
FATAL_KILL_S: Final = 120.0
ACTION_WINDOW_S: Final = 300.0
FINDING_LOOKBACK_S: Final = 600.0
DOWN_WINDOW_S: Final = 120.0
SKEW_S: Final = 2.0
CONCURRENT_S: Final = 10.0  # a fatal finding this close to a preemption: say which may be first

NodeEventKind = Literal["finding", "action", "not_ready", "ready", "back", "deleted"]
WorkloadEventKind = Literal[
    "evicted", "finished", "failed", "deleted", "deactivated", "requeued", "admitted"
]


@record
class NodeEvent:
    """Something that happened to a node: a finding appeared, a remediation began (action:
    reboot | replace | deep_health_check | cordon), it went NotReady, came back, was deleted."""

    time: float
    node: str
    kind: NodeEventKind
    action: str = ""
    finding: NodeFinding | None = None


@record
class WorkloadEvent:
    """A change of one of the job's Workloads (reason and message as Kueue wrote them)."""

    time: float
    workload: str
    kind: WorkloadEventKind
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class PreemptionEvidence:
    """A preemption ledger entry of one of the job's Workloads."""

    time: float
    workload: str
    verdict: str  # quota | topology | unknown
    detail: str
    preemptor: str


@dataclass(frozen=True, slots=True)
class ScaleDownEvidence:
    """An elastic scale-down of the job (exporter.cluster.elastic.scaling)."""

    time: float
    workload: str
    cause: str  # preemption | faulty_pod | user_change | unknown | ""


@dataclass(frozen=True, slots=True)
class Stop:
    """When the job stopped running, where it ran, and what it is made of."""

    time: float
    nodes: tuple[str, ...]
    workloads: tuple[str, ...]
    elastic: bool = False
    continues: bool = False  # another Workload of the job lives on (not evicted nor deleted)
    # When the job last began to run: its Workloads' evidence from before belongs to earlier
    # stops (a job preempted, re-admitted and finished within a minute had two).
    since: float | None = None


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
    verdict: str = ""  # a preemption's quota | topology | unknown
    preemptor: str = ""
    action: str = ""
    detected_at: float | None = None
    action_at: float | None = None


def attribute(
    stop: Stop,
    node_events: Iterable[NodeEvent],
    workload_events: Iterable[WorkloadEvent],
    preemptions: Iterable[PreemptionEvidence] = (),
    scale_downs: Iterable[ScaleDownEvidence] = (),
    findings_problems: Mapping[str, str] | None = None,
) -> Verdict:
    """The cause of `stop` (see the module's docstring for the rules)."""
    t = stop.time
    node_events = list(node_events)  # read twice: rule 1 and rule 5
    mine = set(stop.workloads)
    since = stop.since if stop.since is not None else -math.inf
    wl_events = [e for e in workload_events if (e.workload in mine or not mine) and e.time >= since]
    preemptions = [p for p in preemptions if p.time >= since]
    scale_downs = [s for s in scale_downs if s.time >= since]
    problems = [f"{node}: {why}" for node, why in sorted((findings_problems or {}).items()) if why]
    caveat = "; ".join(problems)

    # 1. preempted
    near = [p for p in preemptions if abs(p.time - t) <= PREEMPTION_WINDOW_S]
    evicted = [
        e
        for e in wl_events
        if e.kind == "evicted"
        and e.reason == "Preempted"
        and abs(e.time - t) <= PREEMPTION_WINDOW_S
    ]
    if near or evicted:
        if near:
            p = min(near, key=lambda p: (abs(p.time - t), p.time))
            detail = f"{p.workload} preempted by {p.preemptor} ({p.verdict}: {p.detail})"
            found = Verdict(
                "preempted",
                detail=detail,
                verdict=p.verdict,
                preemptor=p.preemptor,
                detected_at=p.time,
            )
        else:
            e = min(evicted, key=lambda e: abs(e.time - t))
            found = Verdict(
                "preempted",
                detail=f"{e.workload} evicted: {e.message[:160]}",
                uncertain="no preemption ledger entry (verdict and preemptor unknown)",
                verdict="unknown",
                detected_at=e.time,
            )
        nodes_now = set(stop.nodes)
        same_moment = [
            n
            for n in node_events
            if n.node in nodes_now
            and abs(n.time - t) <= CONCURRENT_S
            and (n.kind == "not_ready" or (n.finding is not None and n.finding.fatal))
        ]
        if same_moment:
            first = min(same_moment, key=lambda n: (n.time, n.node))
            what = first.finding.words() if first.finding is not None else f"{first.node} NotReady"
            note = f"{what} at the same moment: the node may have stopped it first"
            found = _with(found, f"{found.uncertain}; {note}" if found.uncertain else note)
        if stop.elastic and stop.continues:
            return Verdict(
                "elastic_scale_down",
                detail=f"scaled down by a preemption: {found.detail}",
                verdict=found.verdict,
                preemptor=found.preemptor,
                detected_at=found.detected_at,
            )
        return found

    # 2. user
    for e in sorted(wl_events, key=lambda e: e.time):
        if abs(e.time - t) > PREEMPTION_WINDOW_S:
            continue
        if e.kind == "deleted" and stop.continues:
            continue  # the job went on with another Workload (an operator's restart)
        if e.kind in ("deleted", "deactivated") or (
            e.kind == "evicted" and e.reason in ("InactiveWorkload", "Deactivated")
        ):
            what = {"deleted": "deleted", "deactivated": "deactivated (suspended)"}.get(
                e.kind, f"evicted: {e.reason}"
            )
            return Verdict("user", detail=f"Workload {e.workload} {what}", detected_at=e.time)

    # 3. elastic scale-down
    downs = [
        s
        for s in scale_downs
        if abs(s.time - t) <= PREEMPTION_WINDOW_S and s.cause not in ("preemption",)
    ]
    if downs and stop.elastic:
        s = min(downs, key=lambda s: abs(s.time - t))
        why = s.cause or "cause not settled yet"
        return Verdict(
            "elastic_scale_down", detail=f"{s.workload} scaled down ({why})", detected_at=s.time
        )

    # 4. completed
    for e in wl_events:
        if e.kind == "finished" and abs(e.time - t) <= PREEMPTION_WINDOW_S:
            return Verdict("completed", detail=f"{e.workload} finished: {e.reason}")

    # 5. the nodes
    nodes = set(stop.nodes)
    events = [e for e in node_events if e.node in nodes]
    verdict = _by_node(t, events, stop.since)
    if verdict is not None:
        if caveat:
            extra = f"{verdict.uncertain}; {caveat}" if verdict.uncertain else caveat
            return _with(verdict, uncertain=extra)
        return verdict

    # 6. failed with no evidence, 7. unknown
    missing = (
        f"no preemption of {', '.join(sorted(mine)) or 'its Workload'} within"
        f" {PREEMPTION_WINDOW_S:.0f} s, no deletion or deactivation, no elastic scale-down,"
        f" no finding, remediation or NotReady on {', '.join(sorted(nodes)) or 'its nodes'}"
        f" from {FINDING_LOOKBACK_S:.0f} s before to {SETTLE_S:.0f} s after it stopped"
    )
    for e in wl_events:
        if e.kind == "failed" and abs(e.time - t) <= PREEMPTION_WINDOW_S:
            return Verdict(
                "unknown",
                detail=f"{e.workload} failed ({e.reason}: {e.message[:120]})",
                missing=missing,
                uncertain=caveat,
            )
    return Verdict("unknown", detail="stopped with no evidence", missing=missing, uncertain=caveat)


def _by_node(t: float, events: Sequence[NodeEvent], since: float | None) -> Verdict | None:
    """Rule 5. Evidence from before the job last began to run (`since`) is left out: the job
    ran through it (a remediation's reason excepted: it may be older)."""
    start = since if since is not None else -math.inf
    findings = [e for e in events if e.kind == "finding" and e.finding is not None]
    actions = [
        e
        for e in events
        if e.kind == "action" and max(t - ACTION_WINDOW_S, start) <= e.time <= t + SKEW_S
    ]
    downs = [
        e
        for e in events
        if e.kind in ("not_ready", "deleted")
        and max(t - DOWN_WINDOW_S, start) <= e.time <= t + SKEW_S
    ]
    before = [
        e for e in findings if max(t - FINDING_LOOKBACK_S, start - SKEW_S) <= e.time <= t + SKEW_S
    ]
    fatal = [
        e
        for e in before
        if e.time >= t - FATAL_KILL_S and e.finding is not None and e.finding.fatal
    ]
    first_action = min(actions, key=lambda e: e.time) if actions else None
    first_down = min(downs, key=lambda e: e.time) if downs else None
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
                if e.time <= first_action.time + SKEW_S and e.node == first_action.node
            ),
            key=lambda e: e.time,
            default=None,
        )
        because = f" after {reason.finding.words()}" if reason and reason.finding else ""
        part = reason.finding.part if reason and reason.finding else "unknown"
        return Verdict(
            "remediation",
            component=part,
            detail=f"{first_action.action} of {first_action.node} began at"
            f" {_iso(first_action.time)}{because}",
            node=first_action.node,
            check=reason.finding.check if reason and reason.finding else "",
            finding_component=reason.finding.component if reason and reason.finding else "",
            action=first_action.action,
            detected_at=reason.time if reason else first_action.time,
            action_at=first_action.time,
        )
    if first_down is not None:
        what = "went NotReady" if first_down.kind == "not_ready" else "was deleted"
        return Verdict(
            "node_fault",
            component="host",
            detail=f"node {first_down.node} {what} at {_iso(first_down.time)}",
            uncertain="no health finding names a part: the host is assumed",
            node=first_down.node,
            detected_at=first_down.time,
        )
    if before:
        root = min(before, key=lambda e: (e.time, e.node))
        return _fault(root, first_action)
    late = [e for e in findings if t + SKEW_S < e.time <= t + SETTLE_S]
    if late:
        root = min(late, key=lambda e: (e.time, e.node))
        verdict = _fault(root, first_action)
        return _with(
            verdict,
            uncertain=f"the finding was first seen {root.time - t:.0f} s after the workload"
            " stopped (clock skew between the node agent and the API server, or a late write)",
        )
    return None


def _fault(root: NodeEvent, action: NodeEvent | None) -> Verdict:
    finding = root.finding
    assert finding is not None
    return Verdict(
        "node_fault",
        component=finding.part,
        detail=f"{finding.words()} at {_iso(root.time)}",
        node=root.node,
        check=finding.check,
        finding_component=finding.component,
        action=action.action if action is not None else "",
        detected_at=root.time,
        action_at=action.time if action is not None else None,
    )


def _with(verdict: Verdict, uncertain: str) -> Verdict:
    return replace(verdict, uncertain=uncertain)


def _iso(seconds: float) -> str:
    try:
        return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError):
        return f"{seconds!r}"
