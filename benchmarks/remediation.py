"""Remediation figures: detection-to-decision latency at scale, and a failure storm.

1. Latency: 2,000 simulated GPU nodes; 10 % of them start failing (a fatal finding appears in
   their Node report) spread over `--spread` seconds. Measured from the Node event handed to
   the controller (what the informer thread does) to (a) the audited decision and (b) the
   provider call. The budget and breaker are opened wide here so every failure reaches a
   provider; the peer run uses the default safety settings (decisions only, mostly skips).
2. Storm: 1,000 nodes fail within one second under the default safety settings (mode act):
   prints how many actions ran against the budget, whether the breaker tripped, and whether
   every failing node has a decision in the audit trail.

Uses a recording provider (no I/O), so the figures are the controller's own. Prints figures;
never passes or fails.

    .venv/bin/python benchmarks/remediation.py [--nodes 2000] [--spread 60] [--storm 1000]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporter.core.findings import FINDINGS_ANNOTATION
from exporter.core.provenance import agent_entry
from healthcheck.remediation.audit import Auditor, AuditRecord
from healthcheck.remediation.controller import RemediationController
from healthcheck.remediation.policy import Decision, PolicyConfig
from healthcheck.remediation.providers.base import ActionRequest, ActionResult


class RecordingProvider:
    name = "recorder"

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.called: dict[str, float] = {}

    def execute(self, requests: Sequence[ActionRequest]) -> list[ActionResult]:
        stamp = time.perf_counter()
        with self.lock:
            for r in requests:
                self.called.setdefault(r.node, stamp)
        return [ActionResult(r.node, True, "recorded") for r in requests]


class TimedAuditor(Auditor):
    def __init__(self) -> None:
        super().__init__(keep=100_000)
        self.decided: dict[str, float] = {}

    def decision(self, decision: Decision) -> AuditRecord:
        self.decided.setdefault(decision.node, time.perf_counter())
        return super().decision(decision)


def node(name: str, failing_since: float | None) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if failing_since is not None:
        stamp = datetime.fromtimestamp(failing_since, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        annotations[FINDINGS_ANNOTATION] = json.dumps(
            [
                {
                    "check": "xid",
                    "component": "gpu3",
                    "severity": "fatal",
                    "action": "replace",
                    "evidence": "XID 79",
                    "firstSeen": stamp,
                    "lastSeen": stamp,
                    "actionable": True,
                }
            ]
        )
    return {
        "metadata": {
            "name": name,
            "labels": {"sagemaker.amazonaws.com/node-health-status": "Schedulable"},
            "annotations": annotations,
            "managedFields": [agent_entry()],  # written by the node's own agent
        },
        "status": {"capacity": {"nvidia.com/gpu": "8"}},
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fmt_ms(values: list[float]) -> str:
    if not values:
        return "n/a (none)"
    ms = [v * 1000 for v in values]
    return (
        f"n={len(ms)} p50 {percentile(ms, 0.5):.2f} ms  p90 {percentile(ms, 0.9):.2f} ms"
        f"  p99 {percentile(ms, 0.99):.2f} ms  max {max(ms):.2f} ms"
    )


def run_latency(
    nodes: int, share: float, spread: float, config: PolicyConfig, seed: int
) -> tuple[list[float], list[float]]:
    names = [f"hyperpod-i-{i:017x}" for i in range(nodes)]
    provider = RecordingProvider()
    auditor = TimedAuditor()
    controller = RemediationController(config, [provider], None, auditor=auditor)
    for name in names:
        controller.observe_node(node(name, None), time.time())
    controller.run_once()  # initial list, as after the informers' sync
    controller.start()
    failing = random.Random(seed).sample(names, int(nodes * share))
    gaps = spread / max(1, len(failing))
    observed: dict[str, float] = {}
    start = time.perf_counter()
    for i, name in enumerate(failing):
        target = start + i * gaps
        delay = target - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        observed[name] = time.perf_counter()
        controller.observe_node(node(name, time.time()), time.time())
    deadline = time.perf_counter() + 10
    while time.perf_counter() < deadline and len(auditor.decided) < len(failing):
        time.sleep(0.01)
    time.sleep(0.2)
    controller.stop()
    decide = [auditor.decided[n] - observed[n] for n in failing if n in auditor.decided]
    act = [provider.called[n] - observed[n] for n in failing if n in provider.called]
    return decide, act


def run_storm(nodes: int, storm: int, config: PolicyConfig) -> None:
    names = [f"hyperpod-i-{i:017x}" for i in range(nodes)]
    provider = RecordingProvider()
    auditor = TimedAuditor()
    controller = RemediationController(config, [provider], None, auditor=auditor)
    for name in names:
        controller.observe_node(node(name, None), time.time())
    controller.run_once()
    controller.start()
    failing = names[:storm]
    start = time.perf_counter()
    for i, name in enumerate(failing):
        delay = start + i / storm - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        controller.observe_node(node(name, time.time()), time.time())
    deadline = time.perf_counter() + 10
    while time.perf_counter() < deadline and len(auditor.decided) < storm:
        time.sleep(0.01)
    elapsed = time.perf_counter() - start
    controller.stop()
    status = controller.status()
    decided = {r["node"] for r in auditor.recent(100_000) if r["audit"] == "decision"}
    reasons: dict[str, int] = {}
    for (verdict, reason, _), count in auditor.counts.items():
        reasons[f"{verdict}/{reason}"] = reasons.get(f"{verdict}/{reason}", 0) + count
    print(f"storm: {storm} of {nodes} nodes failing within 1 s (settled in {elapsed:.2f} s)")
    print(
        f"  actions taken {len(provider.called)}; budget {status['budget']['limit']}"
        f" (max({config.budget_nodes}, {config.budget_percent:g} % of {nodes}));"
        f" breaker threshold {config.breaker_threshold} in {config.breaker_window_s:g} s"
    )
    print(f"  breaker tripped: {status['breaker']['tripped']} ({status['breaker']['reason']})")
    print(f"  failing nodes with a decision in the audit trail: {len(decided & set(failing))}")
    print(f"  decisions by verdict/reason: {dict(sorted(reasons.items()))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--share", type=float, default=0.10)
    parser.add_argument("--spread", type=float, default=60.0, metavar="S")
    parser.add_argument("--storm", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    # Audit lines are formatted and written as in production, to a sink nobody reads.
    logging.basicConfig(level=logging.INFO, handlers=[logging.FileHandler(os.devnull)])
    wide = PolicyConfig(
        mode="act", budget_percent=100.0, breaker_threshold=args.nodes, cooldown_s=3600
    )
    print(
        f"latency: {int(args.nodes * args.share)} of {args.nodes} nodes failing over"
        f" {args.spread:g} s (budget and breaker open)"
    )
    wide_decide, act = run_latency(args.nodes, args.share, args.spread, wide, args.seed)
    print(f"  event -> decision      {fmt_ms(wide_decide)}")
    print(f"  event -> provider call {fmt_ms(act)}")
    safe = PolicyConfig(mode="act")
    decide, act = run_latency(args.nodes, args.share, args.spread, safe, args.seed)
    print("peer, default safety settings (budget max(2, 2 %), breaker 5 in 300 s):")
    print(f"  event -> decision      {fmt_ms(decide)}")
    print(f"  event -> provider call {fmt_ms(act)} (the rest: budget/breaker skips)")
    if decide and wide_decide:
        ratio = statistics.median(decide) / statistics.median(wide_decide)
        print(f"  median decision latency, default/wide: {ratio:.2f}x")
    run_storm(args.nodes, args.storm, PolicyConfig(mode="act"))
    print("peer storm, breaker disabled (threshold above the storm): the budget alone holds")
    run_storm(args.nodes, args.storm, PolicyConfig(mode="act", breaker_threshold=args.nodes))


if __name__ == "__main__":
    main()
