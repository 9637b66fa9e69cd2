"""Issue 28: an XID seen but not yet acted on is not forgotten when the agent restarts.

An XID arrives once (NVML's event set does not deliver it again; the kernel log reader resumes
after the last line it read), and the XID check holds its finding for `xid.hold_seconds`. A
rollout of the DaemonSet while remediation defers the node (budget, cooldown) restarts the agent
inside that hour: the restarted agent must still report the finding, or the controller withdraws
the action it decided on. The XIDs held are kept in `xids.state.json` beside the kernel log's
cursor (`--kernel-log-state`), for the boot they were seen in only: after a reboot nothing is
carried over (the reboot was the remedy).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.core.snapshot import NodeSnapshot, XidEvent
from exporter.node.poller import Poller
from exporter.sim.faults import parse_faults
from exporter.sim.hardware.node import SimulatedNode
from exporter.sim.hardware.profiles import get_profile
from healthcheck.detection.checks.xid_memory import AppXidHit, XidMemory, XidRecord
from healthcheck.detection.config import config_from_mapping
from healthcheck.detection.monitor import HealthMonitor, HealthReport
from healthcheck.detection.xid_state import XID_STATE_FILE, XidStateFile, decode, encode
from tests.cli.test_cli import topowatch
from tests.conftest import healthy_snapshot

START = 1_750_000_000.0
BOOT = "5d3c1a52-3b8e-4c51-9d0e-0f2a6b1c7e44"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> NodeSnapshot:
    return healthy_snapshot("p5.48xlarge", tmp_path_factory.mktemp("base"))


def at(snapshot: NodeSnapshot, t: float, *xids: tuple[int, int]) -> NodeSnapshot:
    by_index = {g.index: g for g in snapshot.gpu.gpus}
    events = tuple(XidEvent(g, by_index[g].uuid, x, t - 1.0) for g, x in xids)
    return dataclasses.replace(
        snapshot, taken_at=t, gpu=dataclasses.replace(snapshot.gpu, xid_events=events)
    )


def xid_finding(report: HealthReport, gpu: int) -> tuple[str, str, bool, float] | None:
    for f in report.findings:
        if f.key == ("xid", f"gpu{gpu}"):
            return (f.severity, f.action, f.actionable, f.first_seen)
    return None


# --- the file ----------------------------------------------------------------------------


def test_the_memory_round_trips_through_the_file_in_the_same_boot() -> None:
    memory = XidMemory(
        records=(
            XidRecord(3, "GPU-3", 79, START, START + 5, START - 1, 1, 2),
            XidRecord(1, "GPU-1", 154, START, START, START, 1, 1, named_action=2, named_at=START),
        ),
        app_hits=(AppXidHit("GPU-1", 1, 13, "team-a/pod-0", START),),
    )
    data = json.loads(json.dumps(encode(memory, BOOT)))
    assert decode(data, BOOT) == (memory, "")


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({"version": 1, "boot_id": "another-boot", "records": []}, "another boot"),
        ({"version": 99, "boot_id": BOOT}, "version"),
        ([], "version"),
        ({"version": 1, "boot_id": BOOT, "records": [{"xid": "79"}]}, "corrupt"),
        (
            {
                "version": 1,
                "boot_id": BOOT,
                "records": [
                    {
                        "gpu_index": 3,
                        "uuid": "GPU-3",
                        "xid": 79,
                        "first_seen": "NaN",
                        "last_seen": 1.0,
                        "last_event": 1.0,
                        "incidents": 1,
                        "events": 1,
                        "named_action": None,
                        "named_at": 0.0,
                    }
                ],
            },
            "corrupt",
        ),
    ],
)
def test_another_boot_or_a_bad_file_restores_nothing(data: object, why: str) -> None:
    memory, said = decode(data, BOOT)
    assert memory == XidMemory() and why in said


def test_an_unwritable_file_is_logged_once_and_polling_goes_on(
    base: NodeSnapshot, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "missing-dir" / XID_STATE_FILE  # its directory does not exist
    monitor = HealthMonitor()
    monitor.keep_xids(XidStateFile(path, BOOT))
    with caplog.at_level(logging.WARNING):
        monitor.observe(at(base, START, (3, 79)))
        report = monitor.observe(at(base, START + 5, (3, 48)))
    assert xid_finding(report, 3) is not None
    assert sum("cannot write XID state" in r.message for r in caplog.records) == 1


# --- the monitor: a restart in the same boot -----------------------------------------------


def test_a_restarted_agent_still_reports_the_xid_it_held(
    base: NodeSnapshot, tmp_path: Path
) -> None:
    """XID 79 (a reboot) seen, the agent restarted 10 minutes later: the new agent reports the
    same finding, actionable, with its first time, and without a second event."""
    path = tmp_path / XID_STATE_FILE
    before = HealthMonitor()
    before.keep_xids(XidStateFile(path, BOOT))
    seen = xid_finding(before.observe(at(base, START, (3, 79))), 3)
    assert seen is not None and seen[:3] == ("fatal", "reboot", True)
    assert path.exists()

    after = HealthMonitor()  # the new agent: nothing in memory
    after.keep_xids(XidStateFile(path, BOOT))
    report = after.observe(at(base, START + 600))
    assert xid_finding(report, 3) == ("fatal", "reboot", True, START)
    assert ("xid", "gpu3") in {f.key for f in report.actionable}

    forgetful = HealthMonitor()  # what happened before issue 28
    assert xid_finding(forgetful.observe(at(base, START + 600)), 3) is None


def test_after_a_reboot_nothing_is_restored(base: NodeSnapshot, tmp_path: Path) -> None:
    path = tmp_path / XID_STATE_FILE
    before = HealthMonitor()
    before.keep_xids(XidStateFile(path, BOOT))
    before.observe(at(base, START, (3, 79)))
    rebooted = HealthMonitor()
    rebooted.keep_xids(XidStateFile(path, "the-next-boot"))
    report = rebooted.observe(at(base, START + 600))
    assert xid_finding(report, 3) is None and report.actionable == ()


def test_a_restored_xid_still_ages_out_after_its_hold(base: NodeSnapshot, tmp_path: Path) -> None:
    path = tmp_path / XID_STATE_FILE
    config = config_from_mapping({"xid": {"hold_seconds": 900}})
    before = HealthMonitor(config)
    before.keep_xids(XidStateFile(path, BOOT))
    before.observe(at(base, START, (3, 79)))
    after = HealthMonitor(config)
    after.keep_xids(XidStateFile(path, BOOT))
    assert xid_finding(after.observe(at(base, START + 600)), 3) is not None
    assert xid_finding(after.observe(at(base, START + 901)), 3) is None
    assert json.loads(path.read_text())["records"] == []  # the aged-out XID left the file too


# --- the simulated node: kernel log cursor and XIDs, one state ------------------------------


class Agent:
    """The production poller over a simulated node, kernel log and state dir as the CLI wires
    them (`--kernel-log-state DIR`)."""

    def __init__(self, node: SimulatedNode, state: Path, now: float, keep: bool = True) -> None:
        self.now = now
        self.sources = node.sources()
        self.sources.kernel_log = node.kernel_log_source(state)
        self.monitor = HealthMonitor()
        if keep:
            self.monitor.keep_xids(XidStateFile(state / XID_STATE_FILE, node.kernel_log.boot_id))
        self.poller = Poller(
            "sim-node-1", self.sources, clock=lambda: self.now, health=self.monitor
        )

    def run(self, polls: int) -> tuple[NodeSnapshot, HealthReport]:
        for _ in range(polls):
            self.now += 5.0
            snapshot, _ = self.poller.poll()
            time.sleep(0.02)
        assert self.monitor.last is not None
        return snapshot, self.monitor.last

    def stop(self) -> None:
        self.sources.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimulatedNode]:
    sim = SimulatedNode(get_profile("p5.48xlarge"), root=tmp_path / "sim", start=START)
    yield sim
    sim.close()


def test_a_rollout_during_a_deferral_keeps_the_xid(node: SimulatedNode, tmp_path: Path) -> None:
    """XID 48 (a reset) reaches the agent through the log and NVML; the agent is restarted (a
    rollout) while remediation waits. The new agent reads no line twice (the cursor) and still
    reports the XID (this file), actionable; an agent without the file would report nothing."""
    state = tmp_path / "state"
    state.mkdir()
    first = Agent(node, state, START)
    first.run(1)
    node.inject(parse_faults(["xid=48@gpu3"])[0])
    snapshot, report = first.run(3)
    assert [(c.xid, c.count) for c in snapshot.xid.counts if c.gpu_index == 3] == [(48, 1)]
    assert ("xid", "gpu3") in {f.key for f in report.actionable}
    first.stop()

    second = Agent(node, state, first.now + 120.0)
    snapshot, report = second.run(3)
    assert snapshot.xid.counts == ()  # nothing read twice: the log resumed after the XID's line
    assert ("xid", "gpu3") in {f.key for f in report.actionable}
    second.stop()

    without = Agent(node, tmp_path / "elsewhere", second.now, keep=False)
    (tmp_path / "elsewhere").mkdir()
    _, report = without.run(2)
    assert ("xid", "gpu3") not in {f.key for f in report.findings}
    without.stop()


def test_a_reboot_of_the_simulated_node_restores_nothing(
    node: SimulatedNode, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    first = Agent(node, state, START)
    first.run(1)
    node.inject(parse_faults(["xid=79@gpu3"])[0])
    first.run(2)
    first.stop()
    node.kernel_log.reboot()
    second = Agent(node, state, first.now + 300.0)
    _, report = second.run(2)
    assert ("xid", "gpu3") not in {f.key for f in report.findings}
    second.stop()


def test_the_cli_writes_the_state_beside_the_kernel_log_cursor(tmp_path: Path) -> None:
    proc = topowatch(
        "node",
        "--simulate",
        "p5.48xlarge",
        "--once",
        "--fault",
        "xid=79@gpu3",
        "--kernel-log-state",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr.decode()
    data = json.loads((tmp_path / XID_STATE_FILE).read_text())
    assert [(r["gpu_index"], r["xid"]) for r in data["records"]] == [(3, 79)]
    assert (tmp_path / "kmsg.state.json").exists()


# --- findings judged from the kernel log alone: kept the same way -------------------------


def kernel_findings(report: HealthReport) -> dict[tuple[str, str], tuple[str, bool, float]]:
    return {
        f.key: (f.action, f.actionable, f.first_seen)
        for f in report.findings
        if f.check.startswith("kernel_")
    }


def test_a_rollout_keeps_what_the_kernel_log_alone_showed(
    node: SimulatedNode, tmp_path: Path
) -> None:
    """An EFA device whose reset failed (efa_com_dev_reset: "Reset indication didn't turn on")
    and a GPU the driver could not initialise ("RmInitAdapter failed!") show only in the kernel
    log: no NVML reading or counter confirms them on the next poll, and the cursor hands their
    lines out once. Issue 28: they were forgotten by a restarted agent, as held XIDs were. The
    restarted agent reports both, actionable at once (fatal lines are undamped), first seen when
    the first agent saw them; one without the state file reports neither."""
    state = tmp_path / "state"
    state.mkdir()
    first = Agent(node, state, START)
    first.run(1)
    for spec in ("efa-reset-failed@rdmap16s27", "gpu-init-failed@gpu4"):
        node.inject(parse_faults([spec])[0])
    _, report = first.run(1)
    seen = kernel_findings(report)
    assert seen == {
        ("kernel_efa_driver", "rdmap16s27"): ("reboot", True, first.now),
        ("kernel_gpu_init_failed", "gpu4"): ("reboot", True, first.now),
    }
    first.run(2)
    first.stop()
    saved = json.loads((state / XID_STATE_FILE).read_text())["kernel_log"]
    assert {(e["kind"], e["gpu"] or e["device"]) for e in saved} == {
        ("efa_driver", "rdmap16s27"),
        ("gpu_init_failed", "4"),
    }

    second = Agent(node, state, first.now + 120.0)
    snapshot, report = second.run(1)
    assert snapshot.kernel_log is not None and snapshot.kernel_log.counts == ()  # not re-read
    assert kernel_findings(report) == seen
    second.stop()

    without = Agent(node, tmp_path / "elsewhere", second.now, keep=False)
    (tmp_path / "elsewhere").mkdir()
    _, report = without.run(1)
    assert kernel_findings(report) == {}
    without.stop()


def test_held_kernel_log_lines_age_out_and_a_reboot_restores_none(
    node: SimulatedNode, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    first = Agent(node, state, START)
    first.run(1)
    node.inject(parse_faults(["efa-reset-failed@rdmap16s27"])[0])
    first.run(1)
    first.stop()
    # past kernel_log.hold_seconds (3600 s) after the line: gone, and gone from the file
    later = Agent(node, state, first.now + 3700.0)
    _, report = later.run(1)
    assert kernel_findings(report) == {}
    assert "kernel_log" not in json.loads((state / XID_STATE_FILE).read_text())
    later.stop()

    again = Agent(node, state, later.now)
    again.run(1)
    node.inject(parse_faults(["efa-reset-failed@rdmap16s27"])[0])
    again.run(1)
    again.stop()
    node.kernel_log.reboot()
    rebooted = Agent(node, state, again.now + 300.0)
    _, report = rebooted.run(1)
    assert kernel_findings(report) == {}
    rebooted.stop()


def test_held_lines_add_up_with_new_ones_of_the_same_kind(base: NodeSnapshot) -> None:
    """The restarted agent's own lines of the same kind and device add to the restored ones
    (each line is read by one agent only: the cursor), and the finding keeps the older onset."""
    from exporter.core.snapshot import KernelLogCount, KernelLogReading
    from healthcheck.detection.checks import History, run_checks
    from healthcheck.detection.checks.base import HeldLine
    from healthcheck.detection.config import HealthConfig

    key = ("efa_driver", "efa_device_reset_failed", "fatal", "", "rdmap16s27")
    old = HeldLine(KernelLogCount(*key, 2, START, "old line"), START - 30)
    new = KernelLogCount(*key, 1, START + 60, "new line")
    snapshot = dataclasses.replace(
        base, taken_at=START + 61, kernel_log=KernelLogReading(source="kmsg", counts=(new,))
    )
    found = run_checks(snapshot, History(kernel_log=(old,)), HealthConfig(), START + 61)
    [f] = [f for f in found if f.check == "kernel_efa_driver"]
    assert (f.severity, f.action, f.first_seen) == ("fatal", "reboot", START - 30)
    assert f.evidence.startswith("3 kernel log line(s), latest 1s ago: new line")
