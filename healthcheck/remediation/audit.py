"""The audit trail: every decision — acted, or skipped and why — as a log line, a metric, an Event.

Log lines and counters are written at once (cheap, in the caller's thread); Kubernetes Events go
through an `EventSink` that the controller calls from its worker thread, after the actions of a
round, so a slow API never delays a remediation. A bounded in-memory trail backs the status view.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from exporter.core.exposition import COUNTER, Family
from healthcheck.remediation.policy import Decision
from healthcheck.remediation.rack import RackDecision

log = logging.getLogger("topowatch.audit")

EVENT_COMPONENT = "topowatch-remediation"
EVENT_NAMESPACE = "default"  # where kubectl looks for Node events
_WARN_LIFECYCLE = frozenset({"deep_check_failed", "deep_check_timeout", "agent_silent_after_boot"})
# Alert notifications that change nothing: no such node, nothing firing to cancel (no Event); a
# late notification from an Alertmanager peer, ignored (an Event says so).
_ALERT_NOOP = frozenset({"unknown_node", "not_firing"})
_ALERT_IGNORED = frozenset({"replayed", "stale_resolve"})


@dataclass(frozen=True, slots=True)
class AuditRecord:
    kind: str  # "decision" | "outcome" | "breaker" | "problem" | "alert" | "lifecycle"
    node: str
    verdict: str
    reason: str
    detail: str
    at: float
    action: str | None = None
    mode: str = ""
    ladder: tuple[str, ...] = ()  # each finding's ladder step behind a decision

    def as_dict(self) -> dict[str, Any]:
        return {
            "audit": self.kind,
            "node": self.node,
            "verdict": self.verdict,
            "reason": self.reason,
            "detail": self.detail,
            "action": self.action,
            "mode": self.mode,
            "at": self.at,
            "ladder": list(self.ladder),
        }


EventSink = Callable[[AuditRecord], None]


class Auditor:
    """Thread-safe; `trail` keeps the last `keep` records, `counts` every one ever."""

    def __init__(self, keep: int = 20_000) -> None:
        self._lock = threading.Lock()
        self.trail: collections.deque[AuditRecord] = collections.deque(maxlen=keep)
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.problems: collections.Counter[str] = collections.Counter()
        self.alerts: collections.Counter[str] = collections.Counter()
        self.lifecycle_counts: collections.Counter[str] = collections.Counter()
        self.event_failures: collections.Counter[str] = collections.Counter()
        self.total = 0
        # Told of every record, in the caller's thread (the history feed queues it; it must
        # not block).
        self.on_record: Callable[[AuditRecord], None] | None = None

    def decision(self, decision: Decision) -> AuditRecord:
        record = AuditRecord(
            "decision",
            decision.node,
            decision.verdict,
            decision.reason,
            decision.detail,
            decision.at,
            decision.action,
            decision.mode,
            tuple(r.describe() for r in decision.rungs),
        )
        self._write(record, logging.INFO)
        with self._lock:
            self.counts[(decision.verdict, decision.reason, decision.action or "none")] += 1
        return record

    def rack(self, decision: RackDecision) -> AuditRecord:
        """One record for a rack-level decision (rack.py), about the rack's first bad node (so
        its Event lands on a Node) and naming the UltraServer and all its members."""
        anchor = decision.bad[0] if decision.bad else decision.members[0]
        detail = (
            f"UltraServer {decision.rack}: {decision.detail}; rack nodes:"
            f" {', '.join(decision.members)}; bad: {', '.join(decision.bad)}"
        )
        record = AuditRecord(
            "decision",
            anchor,
            decision.verdict,
            decision.reason,
            detail,
            decision.at,
            decision.action,
            decision.mode,
        )
        self._write(record, logging.INFO)
        with self._lock:
            self.counts[(decision.verdict, decision.reason, decision.action)] += 1
        return record

    def outcome(self, node: str, action: str, ok: bool, detail: str, at: float) -> AuditRecord:
        verdict = "succeeded" if ok else "failed"
        record = AuditRecord("outcome", node, verdict, "provider", detail, at, action)
        self._write(record, logging.INFO if ok else logging.WARNING)
        with self._lock:
            self.counts[(verdict, "provider", action)] += 1
        return record

    def deferred(
        self, node: str, action: str, detail: str, at: float, first: bool
    ) -> AuditRecord | None:
        """An action the API will take later (a deep check while another runs on the cluster):
        counted every time (`topowatch_remediation_decisions_total{verdict="deferred"}`), logged
        and audited only the first time for the node until one starts (it recurs every few
        minutes while the other check runs)."""
        with self._lock:
            self.counts[("deferred", "provider", action)] += 1
        if not first:
            return None
        record = AuditRecord("outcome", node, "deferred", "provider", detail, at, action)
        self._write(record, logging.WARNING)
        return record

    def breaker(self, verdict: str, detail: str, at: float) -> AuditRecord:
        record = AuditRecord("breaker", "", verdict, "breaker", detail, at)
        self._write(record, logging.ERROR if verdict == "tripped" else logging.WARNING)
        return record

    def problem(self, node: str, reason: str, detail: str, at: float) -> AuditRecord:
        record = AuditRecord("problem", node, "skip", reason, detail, at)
        self._write(record, logging.WARNING)
        with self._lock:
            self.problems[reason] += 1
        return record

    def alert(
        self, node: str, result: str, detail: str, at: float, action: str | None = None
    ) -> AuditRecord:
        """An alert that ended. Results `resolved` (by Alertmanager) and `expired` (its endsAt or
        time to live passed) withdraw what it asked for: verdict `cancelled`. Results
        `not_firing` (never seen firing here) and `unknown_node` (no such Node) change nothing:
        verdict `noop`, no Event. Late notifications from an Alertmanager peer change nothing
        either, verdict `ignored`: `replayed` (a firing not newer than the resolve already seen)
        and `stale_resolve` (a resolve of an older episode than the firing held)."""
        verdict = (
            "noop"
            if result in _ALERT_NOOP
            else "ignored"
            if result in _ALERT_IGNORED
            else "cancelled"
        )
        record = AuditRecord("alert", node, verdict, f"alert_{result}", detail, at, action)
        self._write(record, logging.INFO)
        with self._lock:
            self.alerts[result] += 1
        return record

    def lifecycle(
        self, node: str, reason: str, detail: str, at: float, action: str | None = None
    ) -> AuditRecord:
        """A change to a node's state that no decision made: recovered, attempts reset, ladder
        marks expired, the node deleted and its state dropped, a deep check's progress and
        verdict (deep_check_running|passed|failed|timeout; a timeout is a warning: an alert),
        an agent silent since the node booted after its action (agent_silent_after_boot, a
        warning: its findings are stale, and someone should look at the agent)."""
        record = AuditRecord("lifecycle", node, reason, reason, detail, at, action)
        self._write(record, logging.WARNING if reason in _WARN_LIFECYCLE else logging.INFO)
        with self._lock:
            self.lifecycle_counts[reason] += 1
        return record

    def event_failed(self, record: AuditRecord, error: BaseException) -> None:
        """An Event that could not be written: counted and logged (the log line has the rest)."""
        status = getattr(error, "status", None)
        why = str(status) if isinstance(status, int) else type(error).__name__
        with self._lock:
            self.event_failures[why] += 1
        log.warning(
            "could not write the Event for %s on node %s (%s): %s",
            record.reason,
            record.node,
            why,
            str(error).splitlines()[0][:300] if str(error) else why,
        )

    def _write(self, record: AuditRecord, level: int) -> None:
        with self._lock:
            self.trail.append(record)
            self.total += 1
        if self.on_record is not None:
            self.on_record(record)
        if log.isEnabledFor(level):
            log.log(level, "%s", json.dumps(record.as_dict(), sort_keys=True))

    def numbered(self) -> list[tuple[int, AuditRecord]]:
        """The trail with each record's sequence number (0 for the first record ever)."""
        with self._lock:
            first = self.total - len(self.trail)
            return list(enumerate(self.trail, start=first))

    def recent(self, limit: int = 200) -> list[dict[str, Any]]:
        with self._lock:
            return [r.as_dict() for r in list(self.trail)[-limit:]]

    def families(self) -> list[Family]:
        decisions = Family(
            "topowatch_remediation_decisions",
            COUNTER,
            "Remediation decisions and provider outcomes, by verdict, reason and action.",
        )
        problems = Family(
            "topowatch_remediation_problems", COUNTER, "Bad inputs the controller refused, by why."
        )
        entries = Family("topowatch_remediation_audit_records", COUNTER, "Records audited.")
        alerts = Family(
            "topowatch_remediation_alerts_resolved",
            COUNTER,
            "Alerts that ended, by result: cancelled (its request withdrawn), expired (endsAt or"
            " time to live passed), unknown_node and not_firing (nothing to cancel; no action);"
            " and late notifications ignored: replayed (a firing not newer than its resolve),"
            " stale_resolve (a resolve of an older episode than the firing held).",
        )
        lifecycle = Family(
            "topowatch_remediation_lifecycle",
            COUNTER,
            "Node state changes no decision made: recovered, attempts_reset, ladder_expired,"
            " node_deleted (its state dropped), deep_check_running|passed|failed|timeout (a"
            " deep health check's progress and verdict; alert on timeout),"
            " agent_silent_after_boot (the node booted after its action and its agent has not"
            " reported since: its findings are stale, not a recurrence).",
        )
        event_failures = Family(
            "topowatch_remediation_event_write_failures",
            COUNTER,
            "Events about remediation the API refused or never got, by HTTP status or error.",
        )
        with self._lock:
            for (verdict, reason, action), count in sorted(self.counts.items()):
                decisions.add([("verdict", verdict), ("reason", reason), ("action", action)], count)
            for reason, count in sorted(self.problems.items()):
                problems.add([("reason", reason)], count)
            entries.add([], self.total)
            for result, count in sorted(self.alerts.items()):
                alerts.add([("result", result)], count)
            for reason, count in sorted(self.lifecycle_counts.items()):
                lifecycle.add([("reason", reason)], count)
            for why, count in sorted(self.event_failures.items()):
                event_failures.add([("error", why)], count)
        return [decisions, problems, entries, alerts, lifecycle, event_failures]


def node_event(record: AuditRecord) -> dict[str, Any]:
    """A core/v1 Event about the node, as kubectl describe node shows it."""
    stamp = datetime.fromtimestamp(record.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    reason = {
        ("decision", "act"): "RemediationStarted",
        ("outcome", "succeeded"): "RemediationAccepted",
        ("outcome", "failed"): "RemediationFailed",
        ("alert", "cancelled"): "RemediationCancelled",
        ("lifecycle", "recovered"): "RemediationRecovered",
        ("lifecycle", "attempts_reset"): "RemediationAttemptsReset",
        ("lifecycle", "ladder_expired"): "RemediationLadderExpired",
        ("lifecycle", "deep_check_running"): "DeepHealthCheckRunning",
        ("lifecycle", "deep_check_passed"): "DeepHealthCheckPassed",
        ("lifecycle", "deep_check_failed"): "DeepHealthCheckFailed",
        ("lifecycle", "deep_check_timeout"): "DeepHealthCheckTimedOut",
        ("lifecycle", "agent_silent_after_boot"): "RemediationAgentSilent",
        ("alert", "ignored"): "RemediationAlertIgnored",
        ("outcome", "deferred"): "RemediationDeferred",
    }.get((record.kind, record.verdict), "RemediationSkipped")
    warning = record.verdict in ("act", "failed", *_WARN_LIFECYCLE) or record.kind == "problem"
    ladder = f" [{'; '.join(record.ladder)}]" if record.ladder else ""
    message = f"{record.action or 'no action'}: {record.reason}: {record.detail}{ladder}"
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{record.node}.", "namespace": EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": record.node},
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": EVENT_COMPONENT},
        "reportingComponent": EVENT_COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
