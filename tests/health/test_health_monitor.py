"""The health monitor across polls: damping, its metrics in the node agent's /metrics, and
containment of failing checks."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest

from exporter.core.findings import Finding
from exporter.core.snapshot import NodeSnapshot
from exporter.node.poller import Poller
from healthcheck.detection.checks import FAMILIES, History
from healthcheck.detection.config import HealthConfig, config_from_mapping
from healthcheck.detection.damping import Damper
from healthcheck.detection.monitor import HealthMonitor, HealthReport
from tests.conftest import SimHarness, promtool_lint
from tests.node.test_node_agent import series

Sim = Callable[..., SimHarness]
T0 = 1_750_000_000.0


def finding(
    check: str = "pcie_degraded", severity: str = "warning", action: str = "reboot"
) -> Finding:
    return Finding(check, "gpu1", severity, action, "x", T0, T0)


def run(damper: Damper, pattern: str, f: Finding | None = None) -> list[bool]:
    """Feed a present/absent pattern ('x' present, '.' absent); actionable per present poll."""
    f = f or finding()
    out = []
    for c in pattern:
        result = damper.update([f] if c == "x" else [])
        if c == "x":
            out.append(result[0].actionable)
    return out


def test_damping_needs_k_of_the_last_n_polls() -> None:
    damper = Damper(HealthConfig())  # k=3, n=5
    assert run(damper, "xxx") == [False, False, True]
    damper = Damper(HealthConfig())
    assert run(damper, "x.x.x") == [False, False, True]  # 3 of the last 5


def test_a_flapping_finding_below_k_never_becomes_actionable() -> None:
    damper = Damper(HealthConfig())
    assert not any(run(damper, "x..x..x..x..x..x"))


def test_fatal_bypasses_damping_and_no_action_is_never_actionable() -> None:
    damper = Damper(HealthConfig())
    assert run(damper, "x", finding("xid", "fatal", "replace")) == [True]
    damper = Damper(HealthConfig())
    assert run(damper, "xxxxx", finding("numa_misplaced", "warning", "none")) == [False] * 5


def test_per_check_damping_override() -> None:
    cfg = config_from_mapping({"damping_overrides": {"pcie_degraded": {"k": 1, "n": 1}}})
    assert run(Damper(cfg), "x") == [True]


def test_damper_forgets_quiet_keys() -> None:
    damper = Damper(HealthConfig())
    run(damper, "xx.....")
    assert damper.held("pcie_degraded", "gpu1") == 0 and not damper._windows


def health_poller(h: SimHarness, monitor: HealthMonitor) -> Poller:
    return Poller("sim-node-1", h.sources, clock=lambda: h.now, health=monitor)


def test_findings_show_in_the_same_polls_exposition_and_lint_clean(sim: Sim) -> None:
    h = sim("p5.48xlarge", "rootfs-ro", "nvlink-down@gpu0:link3", "xid=79@gpu3")
    monitor = HealthMonitor()
    poller = health_poller(h, monitor)
    for _ in range(4):
        h.now += 5
        snapshot, exposition = poller.poll()
        time.sleep(0.02)
    assert monitor.last is not None and monitor.last.taken_at == snapshot.taken_at
    assert promtool_lint(exposition.text) == ""
    found = series(exposition.text)
    active = {
        (lab["check"], lab["component"], lab["severity"], lab["action"])
        for lab, v in found["topowatch_health_finding"]
        if v == 1 and lab["node"] == "sim-node-1"
    }
    assert {
        ("rootfs_read_only", "node", "critical", "reboot"),
        ("nvlink_down", "gpu0:link3", "critical", "reboot"),
        ("xid", "gpu3", "fatal", "reboot"),
    } <= active
    actionable = {lab["check"] for lab, v in found["topowatch_health_finding_actionable"] if v}
    assert {"rootfs_read_only", "nvlink_down", "xid"} <= actionable
    assert found["topowatch_health_node_healthy"] == [({"node": "sim-node-1"}, 0.0)]
    runs = {lab["check"]: v for lab, v in found["topowatch_health_checks_total"]}
    assert runs == {name: 4.0 for name, _ in FAMILIES}


def test_healthy_node_exposition_has_no_active_finding_but_numa_warning(sim: Sim) -> None:
    h = sim("p5.48xlarge", "numa-unpinned@gpu7")
    poller = health_poller(h, HealthMonitor())
    h.now += 5
    poller.poll()
    h.now += 5
    _, exposition = poller.poll()
    found = series(exposition.text)
    assert [lab["check"] for lab, _ in found["topowatch_health_finding"]] == ["numa_misplaced"]
    assert found["topowatch_health_node_healthy"][0][1] == 1
    assert promtool_lint(exposition.text) == ""


def test_a_failing_check_is_counted_logged_once_and_harmless(
    sim: Sim, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(
        snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
    ) -> list[Finding]:
        raise ValueError("malformed reading")

    h = sim("p5.48xlarge", "rootfs-ro")
    monitor = HealthMonitor(families=[*FAMILIES, ("broken", broken)])
    poller = health_poller(h, monitor)
    with caplog.at_level(logging.WARNING, logger="healthcheck.detection.monitor"):
        for _ in range(3):
            h.now += 5
            _, exposition = poller.poll()
    logged = [r for r in caplog.records if "broken" in r.getMessage()]
    assert len(logged) == 1
    found = series(exposition.text)
    errors = {lab["check"]: v for lab, v in found["topowatch_health_check_errors_total"]}
    assert errors["broken"] == 3 and errors["rootfs"] == 0
    assert monitor.last is not None
    assert [f.check for f in monitor.last.actionable] == ["rootfs_read_only"]  # others still work


def test_a_crashing_monitor_never_costs_the_hardware_metrics(sim: Sim) -> None:
    class Exploding(HealthMonitor):
        def observe(self, snapshot: NodeSnapshot) -> HealthReport:
            raise RuntimeError("bug")

    h = sim("p5.48xlarge")
    poller = health_poller(h, Exploding())
    h.now += 5
    _, exposition = poller.poll()
    assert b"topowatch_gpu_up" in exposition.text


def test_findings_clear_when_the_fault_goes(sim: Sim) -> None:
    from exporter.sim.faults import parse_fault

    h = sim("p5.48xlarge", "rootfs-ro")
    monitor = HealthMonitor()
    for _ in range(3):
        snapshot, _ = h.poll()
        report = monitor.observe(snapshot)
    assert not report.healthy
    h.node.clear(parse_fault("rootfs-ro"))
    snapshot, _ = h.poll()
    report = monitor.observe(snapshot)
    assert report.healthy and "rootfs_read_only" not in {f.check for f in report.findings}
