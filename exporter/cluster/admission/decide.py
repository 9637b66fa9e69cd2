"""The verdict on one Workload for our check: pure, time passed in.

Kueue's rules this rests on (pkg/workload/admissionchecks.go, pkg/controller/core
workload_controller.go, apis/kueue/v1beta2 workload_types.go):

- Kueue adds a Pending entry per applicable check once quota is reserved; only the check's
  own controller moves it. All Ready admits; Retry evicts the workload (releasing its quota)
  and requeues it with backoff, its entries reset to Pending; Rejected deactivates it.
- A Ready check of an admitted workload whose pods have not started is still the check's to
  withdraw: a Retry evicts it (kueue#12757 asks exactly this when its nodes turn bad).
- onFlavors: a check applies only to workloads assigned one of its flavors
  (workload.go admissionChecksForAdmission).

Ours: Ready when every node the workload will run on is fit (no confirmed finding of our node
agents, no HyperPod Unschedulable* label, no deep health check running or failed, not
cordoned, Ready, no EC2 event ahead, not a repeat offender); Retry naming the node, the finding
and since when otherwise; Rejected only when configured and the flavor cannot hold the
workload on healthy nodes at all. What cannot be judged waits, and past the fail-open deadline
is answered Ready with the reason: Kueue would otherwise wait forever.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from exporter.cluster.admission.parse import CheckEntry, CheckStrategy
from exporter.cluster.admission.settings import AdmissionSettings
from exporter.cluster.objects import GPU_RESOURCE, Node, Pod, PodSetRequest, Workload
from exporter.core.findings import Finding, gpu_index, worst_first
from exporter.topology.labels import HOSTNAME_KEY

# The reason label of topowatch_admission_decisions_total: a closed set.
HEALTHY = "healthy"
UNHEALTHY_NODE = "unhealthy_node"
TOO_FEW_HEALTHY = "too_few_healthy_nodes"
FAIL_OPEN = "fail_open"
UNDECIDED = "undecided"  # cannot judge yet, deadline not reached: no answer written
REASONS = (HEALTHY, UNHEALTHY_NODE, TOO_FEW_HEALTHY, FAIL_OPEN, UNDECIDED)
MAX_MESSAGE_CHARS = 1024
_XID = re.compile(r"\bXID (\d+)\b")


@dataclass(frozen=True, slots=True)
class NodeProblem:
    """Why one node is not fit: what, and since when (None: unknown)."""

    node: str
    what: str
    since: float | None

    def text(self, now: float) -> str:
        return f"node {self.node}: {self.what}" + (
            f" since {clock_time(self.since, now)}" if self.since is not None else ""
        )


@dataclass(frozen=True, slots=True)
class Decision:
    """One judgment. `state` "" means no answer yet (undecided, within the deadline)."""

    namespace: str
    name: str
    uid: str
    check: str
    state: str  # Ready | Retry | Rejected | ""
    reason: str  # one of REASONS
    message: str
    at: float
    previous: str  # the entry's state when judged (Pending, or Ready for a re-check)
    nodes: tuple[str, ...] = ()  # the unfit nodes named
    problem: NodeProblem | None = None  # the first of them, for explain

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Facts:
    """What the cluster service knows about nodes, as of one cycle."""

    nodes: Mapping[str, Node]
    findings: Mapping[str, tuple[Finding, ...]]  # node -> its agent's confirmed findings
    offenders: Mapping[str, str]  # node -> why it is a repeat offender
    synced: bool = True
    # flavor, pod set -> the nodes a pod of it may use (the model's `eligibility`)
    eligible: Callable[[str, PodSetRequest], frozenset[str]] | None = None
    # Within one cycle: each node's problem, each flavor's healthy room (judged once, read by
    # every workload: a cycle judges thousands against the same nodes).
    _problems: dict[str, NodeProblem | None] = field(default_factory=dict)
    _room: dict[tuple[object, ...], tuple[int, int, int, list[NodeProblem]]] = field(
        default_factory=dict
    )

    def problem(self, name: str) -> NodeProblem | None:
        if name not in self._problems:
            self._problems[name] = node_problem(
                name, self.nodes[name], self.findings.get(name, ()), self.offenders.get(name, "")
            )
        return self._problems[name]


def clock_time(at: float, now: float) -> str:
    """10:02:11Z within a day of now, the full RFC 3339 time otherwise."""
    moment = datetime.fromtimestamp(int(at), UTC)
    if abs(now - at) < 86_400:
        return moment.strftime("%H:%M:%SZ")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def describe(finding: Finding) -> str:
    """ "XID 79 on GPU 3", "nvlink_down on GPU 0 (gpu0:link3)", "efa_link_down on rdmap16s27:1"."""
    gpu = gpu_index(finding.component)
    where = f"GPU {gpu}" if gpu is not None else finding.component
    if gpu is not None and finding.component != f"gpu{gpu}":
        where += f" ({finding.component})"
    xid = _XID.search(finding.evidence)
    what = f"XID {xid.group(1)}" if finding.check == "xid" and xid else finding.check
    return f"{what} on {where}"


def node_problem(
    name: str,
    node: Node,
    findings: Sequence[Finding],
    offender: str,
) -> NodeProblem | None:
    """The first reason, most telling first, why `node` should not get new work."""
    if findings:
        worst = worst_first(findings)[0]
        more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
        return NodeProblem(name, describe(worst) + more, worst.first_seen)
    if node.condition_note:
        return NodeProblem(name, f"node agent reports {node.condition_note}", None)
    if node.health.startswith("Unschedulable"):
        return NodeProblem(name, f"HyperPod health {node.health}", None)
    if node.deep_health_blocks:
        return NodeProblem(name, node.unavailable_detail, None)
    if node.cordoned:
        return NodeProblem(name, "cordoned", None)
    if not node.schedulable:
        return NodeProblem(name, "not Ready", None)
    if node.scheduled_event:
        return NodeProblem(name, f"EC2 scheduled event {node.scheduled_event}", None)
    if offender:
        return NodeProblem(name, offender, None)
    return None


def applies(
    check: str, cluster_queue: str, wl: Workload, strategies: Mapping[str, CheckStrategy]
) -> bool:
    """Whether `check` applies to the workload's assigned flavors by its ClusterQueue's
    admissionChecksStrategy (onFlavors; Kueue's admissionChecksForAdmission). A ClusterQueue
    not seen yet does not rule the check out: Kueue put the entry there."""
    strategy = strategies.get(cluster_queue)
    if strategy is None:
        return True
    if check not in strategy:
        return False
    flavors = strategy[check]
    if flavors is None:
        return True
    assigned = {flavor for p in wl.placements for _, flavor in p.flavors}
    return bool(assigned & flavors)


def assigned_nodes(wl: Workload, nodes: Mapping[str, Node]) -> tuple[list[str], list[str]] | None:
    """(known nodes, unknown node names) of the workload's TAS assignment; None without one.

    Kueue's TAS assigns at the Topology's lowest level, the hostname on every HyperPod and EKS
    topology; a lowest level that is not the hostname names domains, whose nodes carry those
    label values."""
    known: list[str] = []
    unknown: list[str] = []
    any_tas = False
    for placement in wl.placements:
        if not placement.levels:
            continue
        any_tas = True
        if placement.levels[-1] == HOSTNAME_KEY:
            for domain in placement.domains:
                name = domain.values[-1] if domain.values else ""
                (known if name in nodes else unknown).append(name)
            continue
        for domain in placement.domains:
            pairs = tuple(zip(placement.levels, domain.values, strict=False))
            members = [n for n, node in nodes.items() if all(node.label(k) == v for k, v in pairs)]
            if members:
                known.extend(members)
            else:
                unknown.append("/".join(domain.values))
    if not any_tas:
        return None
    return sorted(set(known)), sorted(set(unknown))


def pods_started(wl: Workload, pods: Sequence[Pod]) -> bool:
    """Every pod of the workload is bound and running, none gated: past the point where an
    admission check can keep it off a node."""
    want = sum(p.count for p in wl.pod_sets)
    running = [p for p in pods if p.node and p.phase == "Running" and not p.gated]
    return want > 0 and len(running) >= want


def quota_reserved(wl: Workload) -> bool:
    return bool(wl.cluster_queue) and wl.is_true("QuotaReserved") and not wl.is_true("Finished")


def decide(
    wl: Workload,
    uid: str,
    entry: CheckEntry,
    facts: Facts,
    pods: Sequence[Pod],
    settings: AdmissionSettings,
    now: float,
    first_seen: float,
) -> Decision | None:
    """The verdict on `entry` (our check's) of `wl`; None when there is nothing to answer:
    no quota reserved, the workload inactive, the entry already Retry or Rejected, or Ready
    with the workload's pods already running. `first_seen`: when we first saw the entry Pending
    (the fail-open clock when the entry has no lastTransitionTime)."""
    if not quota_reserved(wl) or not wl.active:
        return None
    recheck = entry.state == "Ready"
    if entry.state != "Pending" and not recheck:
        return None
    if recheck and (not wl.is_true("Admitted") or pods_started(wl, pods)):
        return None

    def answer(state: str, reason: str, message: str, bad: Sequence[NodeProblem] = ()) -> Decision:
        return Decision(
            wl.namespace,
            wl.name,
            uid,
            entry.name,
            state,
            reason,
            message[:MAX_MESSAGE_CHARS],
            now,
            entry.state,
            tuple(p.node for p in bad),
            bad[0] if bad else None,
        )

    def cannot_judge(why: str, since_seen: bool = False) -> Decision | None:
        if recheck:
            return None  # a Ready check stays Ready when we cannot see
        since = entry.last_transition if entry.last_transition is not None else first_seen
        if since_seen:
            since = max(since, first_seen)
        waited = now - since
        if waited >= settings.fail_open_seconds:
            return answer(
                "Ready",
                FAIL_OPEN,
                f"topowatch could not judge within {settings.fail_open_seconds:g}s ({why});"
                " admitted by the fail-open deadline",
            )
        return answer("", UNDECIDED, why)

    if not facts.synced:
        # Counted from when this process first saw the entry: a restart's first lists take
        # seconds, and admitting every long-waiting workload unjudged meanwhile is no answer.
        return cannot_judge("the cluster model has not synced", since_seen=True)
    assigned = assigned_nodes(wl, facts.nodes)
    if assigned is not None:
        known, unknown = assigned
        if unknown:
            shown = ", ".join(unknown[:3]) + (
                f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
            )
            return cannot_judge(f"the topology assignment names unknown node(s) {shown}")
        bad = _problems(known, facts)
        if bad:
            return answer("Retry", UNHEALTHY_NODE, _held(bad, now), bad)
        if recheck:
            return None  # still fit: the Ready stands, nothing to write
        return answer("Ready", HEALTHY, f"topowatch: {len(known)} assigned node(s) healthy")
    if recheck:
        return None  # without TAS the nodes are the scheduler's choice, made after admission
    return _without_tas(wl, facts, settings, now, answer, cannot_judge)


def _problems(names: Sequence[str], facts: Facts) -> list[NodeProblem]:
    return [p for p in map(facts.problem, names) if p is not None]


def _held(bad: Sequence[NodeProblem], now: float) -> str:
    more = f" (and {len(bad) - 1} more unfit node(s))" if len(bad) > 1 else ""
    return bad[0].text(now) + more


def _without_tas(
    wl: Workload,
    facts: Facts,
    settings: AdmissionSettings,
    now: float,
    answer: Callable[..., Decision],
    cannot_judge: Callable[[str], Decision | None],
) -> Decision | None:
    """No TAS: the scheduler picks nodes among the flavor's after admission, so the question is
    whether the flavor's healthy nodes can hold the pods at all (their allocatable GPUs, one
    pod per slot of its GPU request)."""
    if facts.eligible is None:
        return cannot_judge("the flavors' nodes are unknown")
    by_name = {p.name: p for p in wl.pod_sets}
    total_healthy = 0
    for placement in wl.placements:
        pod_set = by_name.get(placement.name)
        flavor = dict(placement.flavors).get(GPU_RESOURCE) or next(
            (f for _, f in placement.flavors), ""
        )
        if pod_set is None or not flavor:
            return cannot_judge(f"pod set {placement.name} has no flavor or spec")
        per_pod = pod_set.gpus_per_pod
        key = (flavor, pod_set.constraints, per_pod)
        room = facts._room.get(key)
        if room is None:
            eligible = sorted(n for n in facts.eligible(flavor, pod_set) if n in facts.nodes)
            bad = _problems(eligible, facts)
            unfit = {p.node for p in bad}
            healthy = [n for n in eligible if n not in unfit]
            slots = (
                sum(facts.nodes[n].allocatable_gpus // per_pod for n in healthy)
                if per_pod > 0
                else (1 << 30 if healthy else 0)
            )
            room = facts._room[key] = (len(healthy), len(eligible), slots, bad)
        healthy_n, eligible_n, slots, bad = room
        total_healthy += healthy_n
        if slots < placement.count:
            state = "Rejected" if settings.reject else "Retry"
            first = f"; {_held(bad, now)}" if bad else ""
            return answer(
                state,
                TOO_FEW_HEALTHY,
                f"flavor {flavor}: {healthy_n} of {eligible_n} nodes healthy, room for"
                f" {slots} of {placement.count} pods of {placement.name}{first}",
                bad,
            )
    return answer("Ready", HEALTHY, f"topowatch: {total_healthy} healthy node(s) on its flavors")
