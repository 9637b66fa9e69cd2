"""Fleet reliability: how often nodes fail, where, and which nodes fail again and again.

- Node time is integrated per node (integer milliseconds while the Node exists), so every
  rate has an exact denominator: node-days, by node, instance type, layer-3 (deepest) network
  domain and UltraServer.
- A hardware incident is a burst of hardware findings on one node (`NodeFinding.hardware`:
  a GPU, HBM/ECC, NVLink, EFA or host component, serious enough to act on). One fault raises
  several findings within seconds (XID 79 and then "GPU missing"), so findings less than
  `INCIDENT_MERGE_S` after the previous one on the node belong to the same incident.
- Mean time between hardware incidents = node time / incidents, per scope.
- Interruptions per 1,000 node-days by component: job interruptions the ledger attributed to a
  node (node fault or remediation), by the component of their finding; "unknown" for those
  whose cause is unknown. This is Meta's measure (419 unexpected interruptions in 54 days on
  16,384 GPUs: about 3.8 per 1,000 node-days).
- A repeat offender has `repeat_findings` incidents within `repeat_window_s` (default 2 in 7
  days): the remediation ladder should replace it rather than reboot it again. The rule is the
  pure function `repeat_offender`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from exporter.cluster.goodput.evidence import NodeFinding
from exporter.cluster.goodput.gpu_seconds import ExactIntegrator, to_ms
from exporter.core.goodput.causes import COMPONENTS
from exporter.core.goodput.interruptions import Interruption

DAY_MS: Final = 86_400_000
INCIDENT_MERGE_S: Final = 600.0
DEFAULT_REPEAT_FINDINGS: Final = 2
DEFAULT_REPEAT_WINDOW_S: Final = 7 * 86_400.0
MAX_FINDINGS_PER_NODE: Final = 256
SCOPES: Final = ("node", "instance_type", "domain", "ultraserver")


def repeat_offender(
    incident_times: Sequence[float],
    now: float,
    findings: int = DEFAULT_REPEAT_FINDINGS,
    window_s: float = DEFAULT_REPEAT_WINDOW_S,
) -> bool:
    """Whether `findings` or more incidents fall within the last `window_s` before `now`."""
    recent = [t for t in incident_times if now - window_s <= t <= now]
    return len(recent) >= max(1, findings)


@dataclass(frozen=True, slots=True)
class Incident:
    node: str
    time: float  # its first finding's first_seen
    components: tuple[str, ...]
    checks: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Mtbf:
    scope: str
    name: str
    node_days: float
    incidents: int
    mtbf_hours: float | None  # None: no incident yet


@dataclass(frozen=True, slots=True)
class RepeatOffender:
    node: str
    incidents: int  # within the window
    first: float
    last: float
    components: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReliabilitySummary:
    node_days: float
    interruptions_by_component: dict[str, int]
    interruptions_per_1000_node_days: dict[str, float]
    incidents_by_component: dict[str, int]
    mtbf: dict[str, list[Mtbf]] = field(default_factory=dict)
    repeat_offenders: list[RepeatOffender] = field(default_factory=list)


@dataclass(slots=True)
class _NodeInfo:
    instance_type: str = ""
    domain: str = ""
    ultraserver: str = ""


_NO_INFO: Final = _NodeInfo()


class ReliabilityBook:
    def __init__(
        self,
        repeat_findings: int = DEFAULT_REPEAT_FINDINGS,
        repeat_window_s: float = DEFAULT_REPEAT_WINDOW_S,
    ) -> None:
        self.repeat_findings = repeat_findings
        self.repeat_window_s = repeat_window_s
        self._time: ExactIntegrator[str] = ExactIntegrator()
        self._present: set[str] = set()
        self._info: dict[str, _NodeInfo] = {}
        self._findings: dict[str, dict[tuple[str, str, str, float], NodeFinding]] = {}
        self._latest = 0

    # --- what happened --------------------------------------------------------------------

    def node_seen(
        self, name: str, instance_type: str, domain: str, ultraserver: str, now: float
    ) -> None:
        ms = round(now * 1000)  # to_ms
        if ms > self._latest:
            self._latest = ms
        info = self._info.get(name)
        if (
            info is None
            or info.instance_type != instance_type
            or info.domain != domain
            or info.ultraserver != ultraserver
        ):
            self._info[name] = _NodeInfo(instance_type, domain, ultraserver)
        if name not in self._present:
            self._present.add(name)
            self._time.add(name, 1, self._latest)

    def node_gone(self, name: str, now: float) -> None:
        self._latest = max(self._latest, to_ms(now))
        if name in self._present:
            self._present.discard(name)
            self._time.add(name, -1, self._latest)

    def finding(self, finding: NodeFinding) -> bool:
        """Record a hardware finding; False when it is not hardware or already known."""
        if not finding.hardware:
            return False
        known = self._findings.setdefault(finding.node, {})
        if finding.key in known:
            return False
        known[finding.key] = finding
        if len(known) > MAX_FINDINGS_PER_NODE:
            del known[min(known, key=lambda k: k[3])]
        return True

    def seed(self, node_ms: dict[str, int], findings: Iterable[NodeFinding]) -> None:
        """Go on from what a previous process recorded."""
        self._time.seed(node_ms)
        for f in findings:
            self._findings.setdefault(f.node, {})[f.key] = f

    def node_ms(self, now: float) -> dict[str, int]:
        return self._time.totals(max(to_ms(now), self._latest))

    def findings(self) -> list[NodeFinding]:
        return [f for per in self._findings.values() for f in per.values()]

    # --- answers --------------------------------------------------------------------------

    def incidents(self, node: str) -> list[Incident]:
        found = sorted(self._findings.get(node, {}).values(), key=lambda f: f.first_seen)
        out: list[Incident] = []
        group: list[NodeFinding] = []
        for f in found:
            if group and f.first_seen - group[-1].first_seen > INCIDENT_MERGE_S:
                out.append(_incident(group))
                group = []
            group.append(f)
        if group:
            out.append(_incident(group))
        return out

    def hardware_incidents(self, now: float) -> dict[str, int]:
        """Incidents per node within the repeat window before `now` (nodes with one)."""
        since = now - self.repeat_window_s
        out: dict[str, int] = {}
        for node in sorted(self._findings):
            recent = sum(1 for i in self.incidents(node) if since <= i.time <= now)
            if recent:
                out[node] = recent
        return out

    def is_repeat_offender(self, node: str, now: float) -> bool:
        times = [i.time for i in self.incidents(node)]
        return repeat_offender(times, now, self.repeat_findings, self.repeat_window_s)

    def repeat_offender_reason(self, node: str, now: float) -> str:
        """ "repeat offender: 2 hardware incidents in 7 days (gpu, hbm)", "" when it is not."""
        recent = [i for i in self.incidents(node) if now - self.repeat_window_s <= i.time <= now]
        if len(recent) < max(1, self.repeat_findings):
            return ""
        parts = ", ".join(sorted({c for i in recent for c in i.components}))
        days = self.repeat_window_s / 86_400
        return f"repeat offender: {len(recent)} hardware incidents in {days:g} days ({parts})"

    def repeat_offenders(self, now: float) -> list[RepeatOffender]:
        out = []
        for node in sorted(self._findings):
            recent = [
                i for i in self.incidents(node) if now - self.repeat_window_s <= i.time <= now
            ]
            if len(recent) >= max(1, self.repeat_findings):
                parts = sorted({c for i in recent for c in i.components})
                out.append(
                    RepeatOffender(node, len(recent), recent[0].time, recent[-1].time, tuple(parts))
                )
        return out

    def summary(self, now: float, interruptions: Iterable[Interruption]) -> ReliabilitySummary:
        node_ms = self.node_ms(now)
        total_days = sum(node_ms.values()) / DAY_MS
        by_component: dict[str, int] = dict.fromkeys(COMPONENTS, 0)
        for entry in interruptions:
            if entry.cause in ("node_fault", "remediation"):
                part = entry.component if entry.component in by_component else "unknown"
                by_component[part] += 1
            elif entry.cause == "unknown":
                by_component["unknown"] += 1
        rates = {
            c: (1000.0 * n / total_days if total_days > 0 else 0.0) for c, n in by_component.items()
        }
        incidents = {n: self.incidents(n) for n in self._findings}
        by_part: dict[str, int] = dict.fromkeys(COMPONENTS, 0)
        for found in incidents.values():
            for incident in found:
                by_part[incident.components[0] if incident.components else "unknown"] += 1
        # node-days and incidents per name in each scope, each node's names looked up once
        days_in: list[dict[str, float]] = [{} for _ in SCOPES]
        count_in: list[dict[str, int]] = [{} for _ in SCOPES]
        for node, ms in node_ms.items():
            for days, name in zip(days_in, self._scope_names(node), strict=True):
                days[name] = days.get(name, 0.0) + ms / DAY_MS
        for node, found in incidents.items():
            for days, count, name in zip(days_in, count_in, self._scope_names(node), strict=True):
                count[name] = count.get(name, 0) + len(found)
                days.setdefault(name, 0.0)
        mtbf: dict[str, list[Mtbf]] = {}
        for scope, days, count in zip(SCOPES, days_in, count_in, strict=True):
            mtbf[scope] = [
                Mtbf(
                    scope,
                    name,
                    days[name],
                    count.get(name, 0),
                    (days[name] * 24 / count[name]) if count.get(name) else None,
                )
                for name in sorted(days)
            ]
        return ReliabilitySummary(
            total_days, by_component, rates, by_part, mtbf, self.repeat_offenders(now)
        )

    def _scope_names(self, node: str) -> tuple[str, str, str, str]:
        """The node's name in each of SCOPES, in that order."""
        info = self._info.get(node) or _NO_INFO
        return node, info.instance_type, info.domain, info.ultraserver


def _incident(group: list[NodeFinding]) -> Incident:
    parts: list[str] = []
    for f in group:
        if f.part not in parts:
            parts.append(f.part)
    return Incident(
        group[0].node,
        group[0].first_seen,
        tuple(parts),
        tuple(dict.fromkeys(f.check for f in group)),
    )
