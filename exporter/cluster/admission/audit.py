"""Every admission decision, kept: a bounded ring for /api/v1/admission and explain, a log line
each, and the counters and latency histogram behind the metrics.

A decision is recorded when its outcome changes (a workload waiting on an unchanged verdict
is judged again every cycle but recorded once), so the ring shows what happened, not how often
the loop ran.

Durable too (issue 30, "every decision audited"): `on_record`, when set (the history feed,
exporter.cluster.history.feed), is handed each recorded decision's entry, O(1), and the feed
writes it to the history store's audit table (kind "admission"). After a restart `restore`
refills the ring, and the last outcome of each workload, from the store, so explain's
"admission held" line survives and a verdict re-judged unchanged is not recorded (nor written)
a second time.
"""

from __future__ import annotations

import bisect
import collections
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from exporter.cluster.admission.decide import Decision, clock_time
from exporter.core.exposition import COUNTER, HISTOGRAM, Family

log = logging.getLogger("topowatch.admission")

# Decision latency, seconds: Kueue waits on the check, so milliseconds matter.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
WRITE_ERROR_REASONS = ("conflict", "forbidden", "not_found", "invalid", "unavailable", "other")


class AdmissionAudit:
    """Thread-safe: the cycle records, HTTP handlers and /metrics read."""

    def __init__(self, capacity: int = 2000) -> None:
        self._lock = threading.Lock()
        self.capacity = capacity
        self._ring: collections.deque[dict[str, Any]] = collections.deque(maxlen=capacity)
        self._last: dict[tuple[str, str, str], tuple[str, str, str, str]] = {}
        self.decisions: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.write_errors: collections.Counter[str] = collections.Counter()
        self.fail_open = 0
        self._buckets = [0] * len(LATENCY_BUCKETS)
        self._latency_sum = 0.0
        self._latency_count = 0
        # Called with each recorded decision's entry (under the audit's lock: keep it O(1)).
        self.on_record: Callable[[dict[str, Any]], None] | None = None

    def record(self, decision: Decision, mode: str, written: str, seconds: float) -> bool:
        """Record a decision (`written`: "written", "unchanged", "observe", "not_leader", an
        error reason, or "" for no answer). Counted and kept only when its outcome differs from
        the last recorded for that workload and check; returns whether it was."""
        self.observe_latency(seconds)
        key = (decision.namespace, decision.name, decision.check)
        outcome = (decision.uid, decision.state, decision.message)
        with self._lock:
            last = self._last.get(key)
            if last is not None and last[:3] == outcome and written in (last[3], "unchanged"):
                return False  # judged again, same answer, same fate: not news
            self._last[key] = (*outcome, written)
            if len(self._last) > 4 * (self._ring.maxlen or 1):
                self._last.clear()  # bounded: a workload seen again is recorded again, no harm
            self.decisions[(decision.check, decision.state or "none", decision.reason)] += 1
            if decision.reason == "fail_open":
                self.fail_open += 1
            row = as_dict(decision, mode, written)
            self._ring.append(row)
            if self.on_record is not None:
                self.on_record(row)
        log.info(
            "admission %s/%s check %s: %s (%s) %s [%s]",
            decision.namespace,
            decision.name,
            decision.check,
            decision.state or "no answer yet",
            decision.reason,
            decision.message,
            written or mode,
        )
        return True

    def restore(self, rows: Iterable[dict[str, Any]]) -> int:
        """Refill the ring from stored entries (oldest first), before the first cycle, and
        take each workload's newest as its last outcome; not counted in the metrics (another
        process made them) nor handed to `on_record` (they are stored). Returns how many were
        taken; entries that are not such entries are skipped."""
        taken = 0
        with self._lock:
            for row in rows:
                try:
                    namespace, _, name = str(row["workload"]).partition("/")
                    key = (namespace, name, str(row["check"]))
                    outcome = (row["uid"], row["state"], row["message"], row.get("written", ""))
                except (KeyError, TypeError):
                    continue
                self._ring.append(dict(row))
                self._last[key] = outcome
                taken += 1
        return taken

    def observe_latency(self, seconds: float) -> None:
        with self._lock:
            i = bisect.bisect_left(LATENCY_BUCKETS, seconds)
            if i < len(self._buckets):
                self._buckets[i] += 1
            self._latency_sum += seconds
            self._latency_count += 1

    def write_error(self, reason: str) -> None:
        with self._lock:
            self.write_errors[reason if reason in WRITE_ERROR_REASONS else "other"] += 1

    def recent(self, workload: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Newest first; `workload` "namespace/name" keeps that workload's only."""
        with self._lock:
            rows = list(self._ring)
        rows.reverse()
        if workload:
            rows = [r for r in rows if r["workload"] == workload]
        return rows[: max(0, limit)]

    def latest(self, namespace: str, name: str) -> dict[str, Any] | None:
        rows = self.recent(f"{namespace}/{name}", limit=1)
        return rows[0] if rows else None

    def families(self) -> list[Family]:
        with self._lock:
            decisions = sorted(self.decisions.items())
            errors = sorted(self.write_errors.items())
            fail_open = self.fail_open
            buckets = list(self._buckets)
            total, count = self._latency_sum, self._latency_count
        made = Family(
            "topowatch_admission_decisions",
            COUNTER,
            "Decisions of the topowatch.io/node-health admission check, by check, state "
            "answered (none: not judged yet) and reason.",
        )
        for (check, state, reason), n in decisions:
            made.add([("check", check), ("state", state), ("reason", reason)], n)
        failed = Family(
            "topowatch_admission_write_errors",
            COUNTER,
            "Workload status patches of the admission check the API refused or failed; retried "
            "next cycle.",
        )
        for reason, n in errors:
            failed.add([("reason", reason)], n)
        opened = Family(
            "topowatch_admission_fail_open",
            COUNTER,
            "Workloads answered Ready by the fail-open deadline because they could not be judged.",
        )
        opened.add([], fail_open)
        latency = Family(
            "topowatch_admission_decision_seconds",
            HISTOGRAM,
            "Time to judge one workload for the admission check (the cycle's own work, not the "
            "API write).",
        )
        cumulative, running = [], 0
        for bound, n in zip(LATENCY_BUCKETS, buckets, strict=True):
            running += n
            cumulative.append((bound, running))
        latency.add_histogram([], cumulative, total, count)
        return [made, failed, opened, latency]


def as_dict(decision: Decision, mode: str, written: str) -> dict[str, Any]:
    problem = decision.problem
    return {
        "workload": f"{decision.namespace}/{decision.name}",
        "uid": decision.uid,
        "check": decision.check,
        "state": decision.state,
        "previous": decision.previous,
        "reason": decision.reason,
        "message": decision.message,
        "nodes": list(decision.nodes),
        "node": problem.node if problem else "",
        "finding": problem.what if problem else "",
        "since": clock_time(problem.since, decision.at) if problem and problem.since else "",
        "at": decision.at,
        "mode": mode,
        "written": written,
    }


def held_line(row: dict[str, Any]) -> str:
    """What explain says while our check holds a workload: "admission held: node X, XID 79 on
    GPU 3, since 10:02:11Z"."""
    if row.get("state") not in ("Retry", "Rejected") or not row.get("node"):
        return ""
    since = f", since {row['since']}" if row.get("since") else ""
    return f"admission held: node {row['node']}, {row['finding']}{since}"
