"""Admins' own check scripts (node-problem-detector's custom plugin protocol): their latest
results, read by the agent in the background (exporter/sources/custom_checks.py), as findings.

A script that exits 1 reports a problem: a finding `custom:NAME` on the node, whose action is
the configured one once the problem held in K of the script's last N runs (its `damping`,
default the top-level K of N). Runs, not polls: one run's result stands for every poll until
the next run, so counting polls would let a single bad run act. Until then the finding shows
with no action. Unknown (exit 2 or anything else, a timeout, a script that cannot be run) is
a warning without action: the script could not judge. OK is no finding.
"""

from __future__ import annotations

from exporter.core.findings import Finding
from exporter.core.snapshot import CUSTOM_OK, CUSTOM_PROBLEM, NodeSnapshot
from healthcheck.detection.checks.base import History, finding
from healthcheck.detection.config import HealthConfig


def check(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    latest = {r.check: r for r in snapshot.custom_checks}
    out: list[Finding] = []
    for spec in config.custom_checks:
        reading = latest.get(spec.name)
        if reading is None or reading.status is None or reading.status == CUSTOM_OK:
            continue
        message = reading.message or "no message"
        if reading.status == CUSTOM_PROBLEM:
            k, n = spec.damping.k, spec.damping.n
            window = reading.recent[-n:]
            held = sum(1 for s in window if s == CUSTOM_PROBLEM)
            acts = held >= k
            severity = "warning" if spec.action == "none" else "critical"
            evidence = f"{message} (problem in {held} of the last {len(window)} runs"
            evidence += ")" if acts or spec.action == "none" else f"; acts at {k} of {n})"
            out.append(
                finding(
                    history,
                    now,
                    spec.check_id,
                    "node",
                    severity,
                    spec.action if acts else "none",
                    evidence,
                )
            )
        else:
            result = reading.result or "unknown"
            out.append(
                finding(
                    history,
                    now,
                    spec.check_id,
                    "node",
                    "warning",
                    "none",
                    f"unknown ({result}): {message}",
                )
            )
    return out
