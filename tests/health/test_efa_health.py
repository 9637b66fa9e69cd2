"""EFA health from what the hardware really changes (issue 14, item 2).

The efa driver hard-codes every port's state to ACTIVE / LinkUp (efa_query_port), so link loss
shows on the ENA netdev of the same ENI (operstate, carrier, carrier_changes) where there is
one, and on the device's counters everywhere. These tests drive the production reader over the
simulated sysfs tree, and the check through the monitor (damping included).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.core.exposition import encode_text
from exporter.core.findings import Finding
from exporter.core.snapshot import (
    CollectorStatus,
    EfaDeviceReading,
    EfaNetdevReading,
    EfaPortReading,
    GpuInventory,
    NodeSnapshot,
    NodeTopology,
    XidTotals,
)
from exporter.node.render import render
from exporter.sim.faults import EFA_FAULTS, Fault
from exporter.sim.hardware.profiles import get_profile
from exporter.sim.hardware.sysfs import SimulatedSysfs
from exporter.sources.sysfs import gid_mac, read_efa
from healthcheck.detection.checks import efa
from healthcheck.detection.checks.base import History
from healthcheck.detection.config import (
    ConfigError,
    EfaConfig,
    HealthConfig,
    config_from_mapping,
)
from healthcheck.detection.monitor import HealthMonitor, HealthReport

T0 = 1_750_000_000.0
STEP = 10.0
PAIRED = "rdmap16s27"  # the first EFA device: "EFA with ENA" in the simulation
EFA_ONLY = "rdmap16s28"


@pytest.fixture
def p5(tmp_path: Path) -> Iterator[SimulatedSysfs]:
    sim = SimulatedSysfs(tmp_path, get_profile("p5.48xlarge"), seed=3)
    sim.write(T0)
    yield sim


def snapshot(efa_readings: tuple[EfaDeviceReading, ...], at: float) -> NodeSnapshot:
    return NodeSnapshot(
        node="n1",
        taken_at=at,
        gpu=GpuInventory(available=True),
        xid=XidTotals(),
        efa=efa_readings,
        numa=(),
        affinity=(),
        pods={},
        topology=NodeTopology(),
        collectors=(CollectorStatus("efa", True, 0.0),),
        collector_errors={},
        last_success=at,
    )


def observe(
    sim: SimulatedSysfs, polls: int, monitor: HealthMonitor | None = None, start: float = T0
) -> HealthReport:
    monitor = monitor or HealthMonitor(families=[("efa", efa.check)])
    report = None
    for i in range(polls):
        at = start + (i + 1) * STEP
        sim.advance(at)
        report = monitor.observe(snapshot(read_efa(sim.sysfs_root), at))
    assert report is not None
    return report


def keyed(report: HealthReport) -> dict[tuple[str, str], Finding]:
    return {f.key: f for f in report.findings}


# ----------------------------------------------------------------------- pairing (reader)


def test_gid_carries_the_eni_mac_as_modified_eui64() -> None:
    # amzn/amzn-drivers#114: port GUID 0x100bf5fffe02e2b0 on an ENI with MAC 12:0b:f5:02:e2:b0
    assert gid_mac("fe80:0000:0000:0000:100b:f5ff:fe02:e2b0\n") == "12:0b:f5:02:e2:b0"
    # an interface id without ff:fe in the middle carries no MAC: no pairing from it
    assert gid_mac("fe80:0000:0000:0000:7264:6d61:7031:3673") is None
    assert gid_mac("garbage") is None


def test_only_efa_with_ena_interfaces_have_a_netdev(p5: SimulatedSysfs) -> None:
    readings = {d.device: d for d in read_efa(p5.sysfs_root)}
    paired = {name for name, d in readings.items() if d.netdev is not None}
    # p5: most network cards are EFA-only; the ones with an ENA are paired by the ENI's MAC
    assert paired == {name for name in readings if p5.netdev_of(name) is not None}
    assert 0 < len(paired) < len(readings)
    netdev = readings[PAIRED].netdev
    assert netdev == EfaNetdevReading(
        interface=p5.netdev_of(PAIRED) or "", operstate="up", carrier=True, carrier_changes=2
    )
    assert readings[EFA_ONLY].netdev is None


def test_a_virtual_interface_sharing_the_mac_is_not_the_ena(p5: SimulatedSysfs) -> None:
    # A bridge or VLAN on top of the ENA carries its MAC but has no `device` link.
    iface = p5.netdev_of(PAIRED)
    mac = (p5.sysfs_root / "class" / "net" / str(iface) / "address").read_text()
    bridge = p5.sysfs_root / "class" / "net" / "br0"  # sorts before the ENA's name
    bridge.mkdir()
    (bridge / "address").write_text(mac)
    (bridge / "operstate").write_text("down\n")
    reading = next(d for d in read_efa(p5.sysfs_root) if d.device == PAIRED)
    assert reading.netdev is not None and reading.netdev.interface == iface


def test_unreadable_carrier_reads_as_unknown_not_an_error(p5: SimulatedSysfs) -> None:
    # `carrier` answers EINVAL while the interface is administratively down; a directory in its
    # place fails the read the same way (EISDIR), which a regular file cannot.
    iface = p5.netdev_of(PAIRED)
    net = p5.sysfs_root / "class" / "net" / str(iface)
    (net / "carrier").unlink()
    (net / "carrier").mkdir()
    (net / "operstate").write_text("down\n")
    reading = next(d for d in read_efa(p5.sysfs_root) if d.device == PAIRED)
    assert reading.netdev is not None
    assert (reading.netdev.operstate, reading.netdev.carrier) == ("down", None)
    assert reading.error is None
    # administratively down is someone's choice, not a dead link: no finding
    assert efa.check(snapshot((reading,), T0), History(), HealthConfig(), T0) == []


def test_an_interface_gone_between_listing_and_reading_is_left_out(p5: SimulatedSysfs) -> None:
    iface = p5.netdev_of(PAIRED)
    link = p5.sysfs_root / "class" / "net" / str(iface)
    target = link.resolve()
    os.rename(target, target.with_name("gone"))  # the link now dangles, as after an unplug
    readings = {d.device: d for d in read_efa(p5.sysfs_root)}
    assert readings[PAIRED].netdev is None
    assert readings[PAIRED].error is None
    assert len(readings) == len(p5.profile.efa)


# --------------------------------------------------------------------- faithful simulation


@pytest.mark.parametrize("kind", sorted(EFA_FAULTS - {"efa-missing"}))
@pytest.mark.parametrize("device", [PAIRED, EFA_ONLY])
def test_no_fault_ever_changes_the_sysfs_port_state(
    p5: SimulatedSysfs, kind: str, device: str
) -> None:
    """The efa driver hard-codes ACTIVE / LinkUp (efa_query_port): the sim must too."""
    p5.inject(Fault(kind=kind, device=device))
    p5.advance(T0 + STEP)
    for d in read_efa(p5.sysfs_root):
        for port in d.ports:
            assert (port.state_code, port.state, port.phys_state) == (4, "ACTIVE", "LinkUp")


def test_link_down_fault_changes_what_a_dead_link_changes(p5: SimulatedSysfs) -> None:
    before = {d.device: d for d in read_efa(p5.sysfs_root)}
    p5.inject(Fault(kind="efa-link-down", device=PAIRED))
    p5.advance(T0 + STEP)
    after = {d.device: d for d in read_efa(p5.sysfs_root)}
    netdev = after[PAIRED].netdev
    assert netdev is not None
    assert (netdev.operstate, netdev.carrier, netdev.carrier_changes) == ("down", False, 3)
    old, new = before[PAIRED].ports[0].counters, after[PAIRED].ports[0].counters
    for name in ("tx_pkts", "rx_pkts", "tx_bytes", "rx_bytes"):
        assert new[name] == old[name], name
    for name in ("retrans_timeout_events", "unresponsive_remote_events"):
        assert new[name] > old[name], name
    p5.clear(Fault(kind="efa-link-down", device=PAIRED))
    back = next(d for d in read_efa(p5.sysfs_root) if d.device == PAIRED).netdev
    assert back is not None and (back.operstate, back.carrier, back.carrier_changes) == (
        "up",
        True,
        4,
    )


# ------------------------------------------------------------------------------ the check


def test_link_down_on_a_paired_device_is_critical_and_actionable(p5: SimulatedSysfs) -> None:
    observe(p5, 1)
    p5.inject(Fault(kind="efa-link-down", device=PAIRED))
    report = observe(p5, 3, start=T0 + STEP)  # damping: 3 of 5 polls
    component = f"{PAIRED}:{p5.netdev_of(PAIRED)}"
    f = keyed(report)[("efa_link_down", component)]
    assert (f.severity, f.action, f.actionable) == ("critical", "reboot", True)
    assert "operstate down" in f.evidence and "carrier 0" in f.evidence


def test_dead_link_without_a_netdev_shows_in_the_counters(p5: SimulatedSysfs) -> None:
    monitor = HealthMonitor(families=[("efa", efa.check)])
    observe(p5, 1, monitor)
    p5.inject(Fault(kind="efa-link-down", device=EFA_ONLY))
    report = observe(p5, 3, monitor, start=T0 + STEP)
    found = keyed(report)
    assert not any(check == "efa_link_down" for check, _ in found)
    device = found[("efa_device_errors", EFA_ONLY)]
    assert "retrans_timeout_events" in device.evidence
    assert (device.severity, device.action) == ("warning", "none")
    remote = found[("efa_remote_errors", f"{EFA_ONLY}:1")]  # the cluster service keys on this
    assert (remote.severity, remote.action) == ("warning", "none")
    assert report.actionable == ()


def test_the_hard_coded_port_state_is_not_judged() -> None:
    port = EfaPortReading(port=1, state="DOWN", state_code=1, phys_state="Disabled")
    reading = EfaDeviceReading(device="rdmap16s27", ports=(port,))
    history = History(previous=snapshot((reading,), T0))
    assert efa.check(snapshot((reading,), T0 + STEP), history, HealthConfig(), T0 + STEP) == []


def _counters(device: dict[str, int], port: dict[str, int], at: float) -> NodeSnapshot:
    reading = EfaDeviceReading(
        device="rdmap16s27",
        counters=device,
        ports=(EfaPortReading(port=1, state="ACTIVE", counters=port),),
    )
    return snapshot((reading,), at)


def _judge(
    before: NodeSnapshot, after: NodeSnapshot, config: HealthConfig | None = None
) -> dict[tuple[str, str], Finding]:
    history = History(previous=before)
    findings = efa.check(after, history, config or HealthConfig(), after.taken_at)
    return {f.key: f for f in findings}


def test_any_uncompleted_admin_command_is_fatal() -> None:
    """NVSentinel: an increase of no_completion_cmds is fatal to the admin queue (efa_com.c:
    the timeout clears the queue's running state; "Admin queue is closed" from then on). Fatal,
    not critical as before issue 28: damping must not wait for three polls of a rise."""
    found = _judge(
        _counters({"no_completion_cmds": 0}, {}, T0),
        _counters({"no_completion_cmds": 1}, {}, T0 + 60),
    )
    f = found[("efa_admin_queue", "rdmap16s27")]
    assert (f.severity, f.action) == ("fatal", "reboot")
    assert "+1" in f.evidence


@pytest.mark.parametrize(
    ("before", "now", "fires"),
    [
        (None, 1, True),  # the first reading already above zero: the queue is still closed
        (1, 1, True),  # no new increase, no reset: still closed (it fired only while rising)
        (3, 4, True),
        (0, 0, False),
        (5, 0, False),  # the device was reset: the counters restart at zero, the queue works
    ],
)
def test_the_admin_queue_finding_lasts_until_the_device_is_reset(
    before: int | None, now: int, fires: bool
) -> None:
    previous = None if before is None else _counters({"no_completion_cmds": before}, {}, T0)
    current = _counters({"no_completion_cmds": now}, {}, T0 + STEP)
    found = efa.check(current, History(previous=previous), HealthConfig(), T0 + STEP)
    assert (("efa_admin_queue", "rdmap16s27") in {f.key for f in found}) is fires


def test_one_increase_is_acted_on_at_once_and_kept_until_reset() -> None:
    """Through the monitor (damping 3 of 5): actionable on the poll of the single increase, and
    on every poll after it while the counter stays, never damped away; gone after the reset."""
    monitor = HealthMonitor(families=[("efa", efa.check)])
    counts = [0, 1, 1, 1, 1, 1, 1, 1, 0]
    seen = []
    for i, n in enumerate(counts):
        report = monitor.observe(_counters({"no_completion_cmds": n}, {}, T0 + i * STEP))
        f = keyed(report).get(("efa_admin_queue", "rdmap16s27"))
        seen.append(None if f is None else f.actionable)
    assert seen == [None, True, True, True, True, True, True, True, None]


def test_simulated_admin_command_that_never_completes(p5: SimulatedSysfs) -> None:
    """The simulation's `efa-admin-timeout`: no_completion_cmds +1 in sysfs, read by the
    production reader; actionable on the next poll and for as long as the fault (the closed
    queue) lasts; clearing it is the device reset, after which nothing is left."""
    fault = Fault(kind="efa-admin-timeout", device=EFA_ONLY)
    monitor = HealthMonitor(families=[("efa", efa.check)])
    observe(p5, 2, monitor)
    p5.inject(fault)
    first = observe(p5, 1, monitor, start=T0 + 2 * STEP)
    f = keyed(first)[("efa_admin_queue", EFA_ONLY)]
    assert (f.severity, f.action, f.actionable) == ("fatal", "reboot", True)
    later = observe(p5, 6, monitor, start=T0 + 3 * STEP)
    assert ("efa_admin_queue", EFA_ONLY) in {f.key for f in later.actionable}
    p5.clear(fault)
    after = observe(p5, 1, monitor, start=T0 + 9 * STEP)
    assert ("efa_admin_queue", EFA_ONLY) not in keyed(after)


def test_a_counter_reset_is_a_new_series_not_a_rate() -> None:
    """A device reset zeroes every counter: no negative or huge rate, no finding."""
    before = _counters(
        {"no_completion_cmds": 5, "cmds_err": 900},
        {"rx_drops": 10**9, "retrans_timeout_events": 10**6, "unresponsive_remote_events": 10**6},
        T0,
    )
    after = _counters(
        {"no_completion_cmds": 0, "cmds_err": 0},
        {"rx_drops": 0, "retrans_timeout_events": 0, "unresponsive_remote_events": 0},
        T0 + STEP,
    )
    assert _judge(before, after) == {}


@pytest.mark.parametrize(
    ("device", "port", "fires"),
    [
        ({"cmds_err": 11}, {}, True),  # NVSentinel: cmds_err > 10/min
        ({"cmds_err": 10}, {}, False),
        ({}, {"rx_drops": 6001}, True),  # > 100/s over 60 s
        ({}, {"rx_drops": 6000}, False),
        ({}, {"retrans_timeout_events": 61}, True),  # EKS NMA: > 1/s sustained
        ({}, {"retrans_timeout_events": 60}, False),
    ],
)
def test_device_error_thresholds(device: dict[str, int], port: dict[str, int], fires: bool) -> None:
    zero_device = {k: 0 for k in device}
    zero_port = {k: 0 for k in port}
    found = _judge(_counters(zero_device, zero_port, T0), _counters(device, port, T0 + 60))
    assert (("efa_device_errors", "rdmap16s27") in found) is fires


def test_device_errors_action_is_configurable() -> None:
    config = HealthConfig(efa=EfaConfig(device_errors_action="reboot"))
    found = _judge(
        _counters({"cmds_err": 0}, {}, T0), _counters({"cmds_err": 100}, {}, T0 + 60), config
    )
    assert found[("efa_device_errors", "rdmap16s27")].action == "reboot"
    with pytest.raises(ConfigError):
        config_from_mapping({"efa": {"device_errors_action": "explode"}})
    with pytest.raises(ConfigError):
        config_from_mapping({"efa": {"rx_drops_per_second": -1.0}})


# ------------------------------------------------------------------------------- exported


def test_netdev_readings_are_exported(p5: SimulatedSysfs) -> None:
    readings = read_efa(p5.sysfs_root)
    text = encode_text(render(snapshot(readings, T0))).decode()
    iface = p5.netdev_of(PAIRED)
    up = f'topowatch_efa_netdev_up{{node="n1",device="{PAIRED}",interface="{iface}"}} 1'
    changes = (
        f'topowatch_efa_netdev_carrier_changes_total{{node="n1",device="{PAIRED}",'
        f'interface="{iface}"}} 2'
    )
    assert up in text and changes in text
    assert f'topowatch_efa_netdev_up{{node="n1",device="{EFA_ONLY}"' not in text
    down = dataclasses.replace(
        next(d for d in readings if d.device == PAIRED),
        netdev=EfaNetdevReading(str(iface), "down", False, 3),
    )
    text = encode_text(render(snapshot((down,), T0))).decode()
    assert up.replace("} 1", "} 0") in text
