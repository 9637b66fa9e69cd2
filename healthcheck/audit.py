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

from exporter.exposition import COUNTER, Family
from healthcheck.policy import Decision

log = logging.getLogger("topowatch.audit")

EVENT_COMPONENT = "topowatch-remediation"
EVENT_NAMESPACE = "default"  # where kubectl looks for Node events


@dataclass(frozen=True, slots=True)
class AuditRecord:
    kind: str  # "decision" | "outcome" | "breaker" | "problem"
    node: str
    verdict: str
    reason: str
    detail: str
    at: float
    action: str | None = None
    mode: str = ""

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
        }


EventSink = Callable[[AuditRecord], None]


class Auditor:
    """Thread-safe; `trail` keeps the last `keep` records, `counts` every one ever."""

    def __init__(self, keep: int = 20_000) -> None:
        self._lock = threading.Lock()
        self.trail: collections.deque[AuditRecord] = collections.deque(maxlen=keep)
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.problems: collections.Counter[str] = collections.Counter()
        self.total = 0

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
        )
        self._write(record, logging.INFO)
        with self._lock:
            self.counts[(decision.verdict, decision.reason, decision.action or "none")] += 1
        return record

    def outcome(self, node: str, action: str, ok: bool, detail: str, at: float) -> AuditRecord:
        verdict = "succeeded" if ok else "failed"
        record = AuditRecord("outcome", node, verdict, "provider", detail, at, action)
        self._write(record, logging.INFO if ok else logging.WARNING)
        with self._lock:
            self.counts[(verdict, "provider", action)] += 1
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

    def _write(self, record: AuditRecord, level: int) -> None:
        with self._lock:
            self.trail.append(record)
            self.total += 1
        if log.isEnabledFor(level):
            log.log(level, "%s", json.dumps(record.as_dict(), sort_keys=True))

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
        with self._lock:
            for (verdict, reason, action), count in sorted(self.counts.items()):
                decisions.add([("verdict", verdict), ("reason", reason), ("action", action)], count)
            for reason, count in sorted(self.problems.items()):
                problems.add([("reason", reason)], count)
            entries.add([], self.total)
        return [decisions, problems, entries]


def node_event(record: AuditRecord) -> dict[str, Any]:
    """A core/v1 Event about the node, as kubectl describe node shows it."""
    stamp = datetime.fromtimestamp(record.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    reason = {
        ("decision", "act"): "RemediationStarted",
        ("outcome", "succeeded"): "RemediationAccepted",
        ("outcome", "failed"): "RemediationFailed",
    }.get((record.kind, record.verdict), "RemediationSkipped")
    warning = record.verdict in ("act", "failed") or record.kind == "problem"
    message = f"{record.action or 'no action'}: {record.reason}: {record.detail}"
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
