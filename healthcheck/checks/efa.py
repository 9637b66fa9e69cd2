"""EFA: a port not ACTIVE, or a port's remote-error counters rising.

A port down cuts the node off one rail: reboot. Rising unresponsive-remote or impaired-remote
counters usually mean a *peer* is sick, and they rise on every healthy node talking to it, so
they are a warning without action (configurable threshold per second).
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.snapshot import EfaPortReading, NodeSnapshot
from healthcheck.checks.base import History, finding, rate
from healthcheck.config import HealthConfig
from healthcheck.findings import Finding


def check(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    previous: dict[tuple[str, int], EfaPortReading] = {}
    seconds = 0.0
    if history.previous is not None:
        seconds = snapshot.taken_at - history.previous.taken_at
        for d in history.previous.efa:
            for p in d.ports:
                previous[(d.device, p.port)] = p
    out: list[Finding] = []
    for device in snapshot.efa:
        for port in device.ports:
            component = f"{device.device}:{port.port}"
            if port.state is not None and port.state.upper() != "ACTIVE":
                out.append(
                    finding(
                        history,
                        now,
                        "efa_port_down",
                        component,
                        "critical",
                        "reboot",
                        f"port state {port.state} (phys {port.phys_state or 'unknown'})",
                    )
                )
                continue
            before = previous.get((device.device, port.port))
            if before is None:
                continue
            rising = _rising(port.counters, before.counters, seconds, config)
            if rising:
                out.append(
                    finding(
                        history,
                        now,
                        "efa_remote_errors",
                        component,
                        "warning",
                        "none",
                        ", ".join(rising),
                    )
                )
    return out


def _rising(
    now_counters: Mapping[str, int],
    before: Mapping[str, int],
    seconds: float,
    config: HealthConfig,
) -> list[str]:
    limit = config.efa.remote_errors_per_second
    out = []
    for name in sorted(config.efa.remote_counters):
        per_second = rate(now_counters.get(name), before.get(name), seconds)
        if per_second is not None and per_second > limit:
            out.append(f"{name} +{per_second:.1f}/s (max {limit:g})")
    return out
