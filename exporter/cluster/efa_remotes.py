"""EFA remote errors, correlated across the nodes of a workload to name the node they share.

On one node, rising `unresponsive_remote_events` / `impaired_remote_conn_events` counters usually
mean a *peer* is sick: they rise on every healthy node that talks to it. So the node agent
reports them as a warning without action (finding `efa_remote_errors`, component
`<efa device>:<port>`, in its Node's `topowatch.io/findings` annotation), and this module raises
them when several nodes of one workload report them at once, and points at the node they share.

The rule, judged at a moment `now`:

1. **Current findings.** A finding in the annotation is current while `lastSeen + FRESH_S >=
   now`. A live agent rewrites its annotation at least every `REFRESH_SECONDS` (300 s,
   healthcheck/detection/reporter.py), so a current finding was active within the last FRESH_S (600
   s), and any two current findings overlap within that window; an older one is left by an agent
   that stopped writing and counts for nothing. Without a clock (a dump), `now` is the newest
   `lastSeen` of any EFA finding the cluster holds.
2. **Nodes.** A node *reports* when it has a current `efa_remote_errors` finding (since the
   earliest `firstSeen` of those); it has a *local EFA fault* when it has a current finding of
   another `efa_*` check that recommends an action (`efa_link_down`, `efa_admin_queue`,
   `efa_missing`: the agent judged its own EFA broken). An `efa_*` warning without action
   (`efa_device_errors` by default) is not one: its `retrans_timeout_events` rise on a healthy
   node whose peer stopped answering, like the remote counters. A node whose
   annotation is absent or unreadable (no agent, or garbage) is *unknown*: it is not reporting,
   but nothing says it is healthy either.
3. **Workloads.** Each live (admitted, unfinished) workload whose pods hold GPUs on two or more
   nodes: its nodes are where those pods run. The correlation *holds* for it when at least
   `min_reporters` (MIN_REPORTERS, 2) of its nodes report at once; it holds since the moment the
   `min_reporters`-th of them began to report.
4. **The suspect**, for each workload the correlation holds for, the first rule that names one:
   a. **local-efa-fault**: its nodes with a local EFA fault, reporting or not (the strongest
      evidence: that node's own EFA is broken).
   b. **only-silent-node**: the reporters all talk to every node of the workload, so the sick
      peer is among its nodes that do not report (silent or unknown); when exactly one, it.
   c. **shared-silent-node**: several do not report. Each is scored by how many workloads the
      correlation holds for list it among their non-reporting nodes; the one with the highest
      score, when it is the only one with it and the score is at least 2 (another affected
      workload shares it), is the suspect.
   d. **undetermined** otherwise: every node reports (a 2-node workload whose both nodes see
      the other), or nothing tells the non-reporting nodes apart. No guess is made.

One node alone reporting stays the node agent's warning: it is listed (`correlated` False) so
a dashboard sees it building, but names no suspect.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from exporter.cluster.objects import Node

if TYPE_CHECKING:
    from exporter.cluster.model import ClusterModel

REMOTE_CHECK = "efa_remote_errors"
LOCAL_PREFIX = "efa_"  # any other efa_* check recommending an action: the node's own EFA
# Distinct nodes of one workload that must report at once before the cluster service raises it.
MIN_REPORTERS = 2
# How long after its lastSeen a finding still counts as current: twice the node agent's refresh
# period (healthcheck.detection.reporter.REFRESH_SECONDS, 300 s).
FRESH_S = 600.0

Basis = Literal["local-efa-fault", "only-silent-node", "shared-silent-node", "undetermined"]
WorkloadKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What one node's agent says about its EFA now."""

    node: str
    known: bool  # its findings annotation is there and readable
    remote_since: float | None  # onset of its current efa_remote_errors findings; None: none
    remote_ports: tuple[str, ...] = ()  # the components reporting them
    local_faults: tuple[str, ...] = ()  # "efa_link_down on rdmap16s27:eth1"

    @property
    def reporting(self) -> bool:
        return self.remote_since is not None


@dataclass(frozen=True, slots=True)
class Suspect:
    node: str
    basis: Basis
    detail: str  # why, in words


@dataclass(frozen=True, slots=True)
class Correlation:
    """One live workload with at least one node reporting EFA remote errors."""

    namespace: str
    workload: str
    nodes: tuple[str, ...]  # where its GPU pods run
    reporters: tuple[str, ...]
    correlated: bool  # at least min_reporters of its nodes report
    since: float | None  # when it began to hold (None while it does not)
    suspects: tuple[Suspect, ...] = ()  # strongest first; () when undetermined or not held
    silent: tuple[str, ...] = ()  # its nodes not reporting (unknown ones included)
    unknown: tuple[str, ...] = ()  # its nodes whose agent publishes no readable findings
    summary: str = ""

    @property
    def key(self) -> WorkloadKey:
        return (self.namespace, self.workload)

    @property
    def basis(self) -> Basis:
        return self.suspects[0].basis if self.suspects else "undetermined"


def node_reports(nodes: Iterable[Node], now: float | None = None) -> dict[str, NodeReport]:
    """Each node's EFA state at `now` (rule 1 and 2); None: as of the newest EFA lastSeen."""
    nodes = list(nodes)
    if now is None:
        now = max((f.last_seen for n in nodes for f in n.efa_findings), default=0.0)
    out: dict[str, NodeReport] = {}
    for node in nodes:
        onsets: list[float] = []
        ports: list[str] = []
        local: list[str] = []
        for finding in node.efa_findings:
            if finding.last_seen + FRESH_S < now:
                continue  # left by an agent that stopped writing
            if finding.check == REMOTE_CHECK:
                onsets.append(finding.first_seen)
                ports.append(finding.component)
            elif finding.check.startswith(LOCAL_PREFIX) and finding.action != "none":
                local.append(f"{finding.check} on {finding.component}")
        out[node.name] = NodeReport(
            node=node.name,
            known=node.findings_read,
            remote_since=min(onsets) if onsets else None,
            remote_ports=tuple(sorted(set(ports))),
            local_faults=tuple(sorted(set(local))),
        )
    return out


def correlate(
    workloads: Mapping[WorkloadKey, Collection[str]],
    reports: Mapping[str, NodeReport],
    min_reporters: int = MIN_REPORTERS,
) -> list[Correlation]:
    """Rules 3 and 4 over every workload (key -> the nodes its GPU pods run on), for those with
    at least one reporting node; the ones the correlation holds for first, then by key."""
    if min_reporters < 1:
        raise ValueError(f"min_reporters must be at least 1, got {min_reporters}")
    if not any(r.reporting for r in reports.values()):
        return []
    # (key, nodes, reporters, silent, unknown) of every workload with a reporting node
    seen: list[
        tuple[WorkloadKey, tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]
    ] = []
    for key, node_set in workloads.items():
        nodes = tuple(sorted(set(node_set)))
        if len(nodes) < 2:
            continue  # one node: no peer of its own over EFA
        reporters = tuple(n for n in nodes if _reporting(reports, n))
        if not reporters:
            continue
        silent = tuple(n for n in nodes if n not in reporters)
        unknown = tuple(n for n in silent if not _known(reports, n))
        seen.append((key, nodes, reporters, silent, unknown))
    # Rule 4c counts, for each silent node, the affected workloads it is silent in.
    shared: Counter[str] = Counter()
    for _, _, reporters, silent, _ in seen:
        if len(reporters) >= min_reporters:
            shared.update(silent)
    out: list[Correlation] = []
    for key, nodes, reporters, silent, unknown in seen:
        since: float | None = None
        suspects: tuple[Suspect, ...] = ()
        if len(reporters) >= min_reporters:
            onsets = sorted(reports[n].remote_since or 0.0 for n in reporters)
            since = onsets[min_reporters - 1]
            suspects = _suspects(nodes, silent, unknown, reports, shared)
        out.append(
            Correlation(
                key[0],
                key[1],
                nodes,
                reporters,
                since is not None,
                since,
                suspects,
                silent,
                unknown,
                _summary(nodes, reporters, since, suspects, silent, unknown),
            )
        )
    out.sort(key=lambda c: (not c.correlated, c.namespace, c.workload))
    return out


def from_model(
    model: ClusterModel, now: float | None = None, min_reporters: int = MIN_REPORTERS
) -> list[Correlation]:
    """`correlate` over the model's live workloads and the nodes their GPU pods run on."""
    nodes = model.nodes.values()
    if not any(f.check == REMOTE_CHECK for n in nodes for f in n.efa_findings):
        return []  # the usual case, asked on every explain and /metrics: no report built
    reports = node_reports(nodes, now)
    if not any(r.reporting for r in reports.values()):
        return []  # only stale reports: no pod lookups at all
    workloads = {
        state.workload.key: {p.node for p in model.pods_of(state.workload) if p.holds_gpus}
        for state in model.live()
    }
    return correlate(workloads, reports, min_reporters)


def _reporting(reports: Mapping[str, NodeReport], node: str) -> bool:
    report = reports.get(node)
    return report is not None and report.reporting


def _known(reports: Mapping[str, NodeReport], node: str) -> bool:
    report = reports.get(node)
    return report is not None and report.known


def _suspects(
    nodes: tuple[str, ...],
    silent: tuple[str, ...],
    unknown: tuple[str, ...],
    reports: Mapping[str, NodeReport],
    shared: Counter[str],
) -> tuple[Suspect, ...]:
    faulty = [n for n in nodes if n in reports and reports[n].local_faults]
    if faulty:
        return tuple(
            Suspect(
                n, "local-efa-fault", f"its own EFA fault: {', '.join(reports[n].local_faults)}"
            )
            for n in faulty
        )
    if len(silent) == 1:
        node = silent[0]
        why = "the only one of its nodes not reporting"
        if node in unknown:
            why += " (its agent publishes no readable findings)"
        return (Suspect(node, "only-silent-node", why),)
    if not silent:
        return ()
    top = max(shared[n] for n in silent)
    leaders = [n for n in silent if shared[n] == top]
    if top < 2 or len(leaders) != 1:
        return ()
    return (
        Suspect(
            leaders[0],
            "shared-silent-node",
            f"not reporting, and in {top} affected workloads",
        ),
    )


def _summary(
    nodes: tuple[str, ...],
    reporters: tuple[str, ...],
    since: float | None,
    suspects: tuple[Suspect, ...],
    silent: tuple[str, ...],
    unknown: tuple[str, ...],
) -> str:
    count = f"{len(reporters)} of its {len(nodes)} nodes"
    named = _names(reporters)
    if since is None:
        return (
            f"{count} reports unresponsive EFA remotes ({named}): a warning on that node alone,"
            " not correlated"
            if len(reporters) == 1
            else f"{count} report unresponsive EFA remotes ({named}): fewer than the nodes"
            " needed to correlate them"
        )
    head = f"{count} report unresponsive EFA remotes since {_iso(since)} ({named})"
    if suspects:
        first = suspects[0]
        if first.basis == "local-efa-fault":
            which = ", ".join(f"{s.node} ({s.detail})" for s in suspects)
            return f"{head}; node {which}: suspect"
        return f"{head}; they share node {first.node} ({first.detail}): suspect"
    if not silent:
        return f"{head}; suspect undetermined: every one of its nodes reports"
    note = f"; no agent findings from {_names(unknown)}" if unknown else ""
    return (
        f"{head}; suspect undetermined: {_names(silent)} do not report and nothing tells them"
        f" apart{note}"
    )


def _names(nodes: tuple[str, ...], limit: int = 8) -> str:
    more = f", ... ({len(nodes) - limit} more)" if len(nodes) > limit else ""
    return ", ".join(nodes[:limit]) + more


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
