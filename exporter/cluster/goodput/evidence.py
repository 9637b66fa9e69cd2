"""What a Node and a job's objects say that the goodput ledger needs, read leniently.

The cluster model keeps of a Node only what placement needs (its EFA findings among the
agent's); the ledger needs every finding the node agent published in `topowatch.io/findings`
(exporter.core.findings' JSON contract), whether the node is Ready, and the marks of a
remediation under way: HyperPod's health label (`UnschedulablePendingReboot`,
`UnschedulablePendingReplacement`, which topowatch's HyperPod provider also writes), its deep
health check label, a cordon. These are read here from the raw object, never raising: a
findings annotation that is garbage is reported (`findings_problem`) and its findings are
"unknown", not "none", so a garbled rewrite never looks like a node that healed.

A job may publish its last checkpoint time under an annotation or label whose key the operator
configures; `checkpoint_of` reads it as RFC 3339 or Unix seconds and says why when it cannot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final

from exporter.cluster.objects import Node
from exporter.core.findings import FINDINGS_ANNOTATION, SEVERITIES, decode_findings
from exporter.core.goodput.causes import Component, component_of, is_hardware
from exporter.core.record import record

REBOOT_LABEL: Final = "UnschedulablePendingReboot"
REPLACE_LABEL: Final = "UnschedulablePendingReplacement"
DEEP_HEALTH_RUNNING: Final = frozenset({"InProgress", "Failed"})
MAX_NOTE: Final = 200


@dataclass(frozen=True, slots=True)
class NodeFinding:
    """One finding of a node agent, with the component class it points at."""

    node: str
    check: str
    component: str  # the agent's: "gpu3", "gpu0:link3", "rdmap16s27:1", "node"
    severity: str
    action: str  # none | reboot | replace
    evidence: str
    first_seen: float
    part: Component  # exporter.core.goodput.causes

    @property
    def key(self) -> tuple[str, str, str, float]:
        return (self.node, self.check, self.component, self.first_seen)

    @property
    def hardware(self) -> bool:
        """A hardware fault: a hardware component, and serious (an action, or critical)."""
        serious = self.action != "none" or SEVERITIES.index(self.severity) >= 2
        return is_hardware(self.part) and serious

    @property
    def fatal(self) -> bool:
        """Critical or fatal: the kind of finding that kills the work on the GPU."""
        return SEVERITIES.index(self.severity) >= 2

    def words(self) -> str:
        return f"{self.check} on {self.component} of {self.node} ({self.severity}, {self.evidence})"


@record
class NodeFacts:
    """A Node as the goodput ledger reads it."""

    name: str
    findings: tuple[NodeFinding, ...] = ()
    findings_problem: str = ""  # why the annotation could not be read ("" when it could)
    ready: bool = True
    cordoned: bool = False
    health: str = ""  # HyperPod's node-health-status label
    deep_health: str = ""
    scheduled_event: str = ""
    raw_findings: object = None  # the annotation as written: an unchanged one is not re-read

    @property
    def remediation(self) -> str:
        """The remediation HyperPod's label says is under way: reboot | replace | ""."""
        if self.health == REBOOT_LABEL:
            return "reboot"
        if self.health == REPLACE_LABEL:
            return "replace"
        return ""

    @property
    def deep_check(self) -> bool:
        return self.deep_health in DEEP_HEALTH_RUNNING

    def unavailable(self) -> str:
        """Why the node's free GPUs cannot be used, "" when they can: remediation,
        deep_health_check, finding (an actionable finding), maintenance, cordoned."""
        if self.remediation:
            return "remediation"
        if self.deep_check:
            return "deep_health_check"
        if self.findings and any(f.action != "none" for f in self.findings):
            return "finding"
        if self.scheduled_event:
            return "maintenance"
        if self.cordoned or not self.ready or self.health.startswith("Unschedulable"):
            return "cordoned"
        return ""


def node_facts(obj: Mapping[str, Any], node: Node, previous: NodeFacts | None = None) -> NodeFacts:
    """A Node as the model parsed it (`node`: Ready, cordon, HyperPod's labels, EC2's event),
    with every finding of its raw object's findings annotation (the model keeps only the EFA
    ones). One that cannot be read keeps the findings of `previous` (what was last known) and
    says why in `findings_problem`."""
    # Type-tested in line, `_map` only where a test fails: this runs per Node event.
    meta = v if type(v := obj.get("metadata")) is dict else _map(v)
    annotations = v if type(v := meta.get("annotations")) is dict else _map(v)
    raw = annotations.get(FINDINGS_ANNOTATION)
    name = node.name
    if previous is not None and previous.raw_findings == raw and previous.name == name:
        findings, problem = previous.findings, previous.findings_problem
    else:
        findings, problem = _findings(name, raw)
        if problem and previous is not None:
            findings = previous.findings
    if (
        previous is not None
        and findings is previous.findings
        and node.ready is previous.ready
        and node.cordoned is previous.cordoned
        and node.health == previous.health
        and node.deep_health == previous.deep_health
        and node.scheduled_event == previous.scheduled_event
        and problem == previous.findings_problem
        and previous.name == name
        and previous.raw_findings == raw
    ):
        return previous  # as it was: nothing new to hold
    return NodeFacts(
        name=name,
        findings=findings,
        findings_problem=problem,
        ready=node.ready,
        cordoned=node.cordoned,
        health=node.health,
        deep_health=node.deep_health,
        scheduled_event=node.scheduled_event,
        raw_findings=raw,
    )


def _findings(node: str, raw: object) -> tuple[tuple[NodeFinding, ...], str]:
    if raw is None:
        return (), ""
    if not isinstance(raw, str):
        return (), f"{FINDINGS_ANNOTATION} is not a string"
    try:
        good, problems = decode_findings(raw)
    except (RecursionError, OverflowError, ValueError) as exc:  # decode_findings never should
        return (), f"{FINDINGS_ANNOTATION} unreadable: {type(exc).__name__}"[:MAX_NOTE]
    out = tuple(
        NodeFinding(
            node,
            f.check,
            f.component,
            f.severity,
            f.action,
            f.evidence,
            f.first_seen,
            component_of(f.check, f.evidence),
        )
        for f in good
        if math.isfinite(f.first_seen)
    )
    note = "; ".join(problems)[:MAX_NOTE] if problems else ""
    if problems and not good:
        return (), f"{FINDINGS_ANNOTATION} unreadable: {note}"
    return out, (f"{FINDINGS_ANNOTATION} partly unreadable: {note}" if note else "")


def checkpoint_of(obj: Mapping[str, Any] | None, key: str) -> tuple[float | None, str]:
    """The checkpoint time an object publishes under annotation or label `key`: (Unix
    seconds, "") when readable, (None, "") when absent, (None, why) when malformed."""
    if obj is None or not key:
        return None, ""
    return checkpoint_from(checkpoint_values(obj, key), key)


def checkpoint_values(obj: Mapping[str, Any], key: str) -> tuple[object, object]:
    """The object's annotation and label `key` as written (None where absent): all of it that
    `checkpoint_of` reads, so an object whose values are as they were has the same checkpoint.
    Type-tested in line, `_map` only where a test fails: this runs per Workload event."""
    meta = v if type(v := obj.get("metadata")) is dict else _map(v)
    annotations, labels = meta.get("annotations"), meta.get("labels")
    return (
        annotations.get(key) if type(annotations) is dict else _map(annotations).get(key),
        labels.get(key) if type(labels) is dict else _map(labels).get(key),
    )


def checkpoint_from(values: tuple[object, object], key: str) -> tuple[float | None, str]:
    """`checkpoint_of` of an object whose `checkpoint_values` are `values`: the annotation
    where there is one, else the label."""
    if not key:
        return None, ""
    for where, value in zip(("annotation", "label"), values, strict=True):
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            return None, f"checkpoint {where} {key} is empty or not a string"
        parsed = parse_time(value.strip())
        if parsed is None:
            return None, f"checkpoint {where} {key}={value[:64]!r} is not a time"
        return parsed, ""
    return None, ""


def parse_time(value: str) -> float | None:
    """RFC 3339 (with a zone) or Unix seconds; None for anything else."""
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds > 0 else None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    try:
        return parsed.timestamp()
    except (OverflowError, ValueError, OSError):
        return None


def _map(value: object) -> Mapping[str, Any]:
    if type(value) is dict:  # what the informers deliver: no ABC check
        return value
    return value if isinstance(value, Mapping) else _EMPTY


_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})
