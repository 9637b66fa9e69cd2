"""Issue 28, items 1 and 2: what a GPU memory error, and the driver's own recovery verdict, ask
the node for.

The rules, each row citing its source:

* NVIDIA's XID catalog: XID 94 "Contained ECC error" (bucket RESTART_APP: only the application
  that used the memory is affected), XID 95 "Uncontained ECC error" (RESET_GPU: every
  application on the GPU), XID 154 "GPU recovery action changed" (do what it names; it overrides
  the XID that came with it).
* NVIDIA's GPU Memory Error Management, row remapping: a row with an uncorrectable error is
  remapped at the next GPU reset; until then "unaffected applications can continue running"
  and "new workloads can be launched". nvml.h `nvmlDeviceGetRemappedRows` documents `isPending`
  the same way.
* nvml.h `nvmlDeviceGpuRecoveryAction_t` (field 230, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): 0 none,
  1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset (5 recover the IMEX domain, 6 bus
  reset, 7 system reboot in newer headers); the driver logs XID 154 "GPU recovery action changed
  from 0x%x (%s) to 0x%x (%s)" on every change (open-gpu-kernel-modules 595.45.04, gpu.c).

The ladder is the remediation policy's built-in one (healthcheck/remediation/policy.py): the
first step a finding gets on a node with no history is what the node would be asked to do.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.core.findings import Finding
from exporter.core.snapshot import (
    EccCounts,
    KernelLogEvent,
    KernelLogReading,
    NodeSnapshot,
    RemappedRows,
    XidEvent,
)
from exporter.node.poller import Poller
from exporter.sim.faults import parse_faults
from exporter.sim.hardware.node import SimulatedNode
from exporter.sim.hardware.profiles import get_profile
from healthcheck.detection.monitor import HealthMonitor, HealthReport
from healthcheck.remediation.policy import DEFAULT_LADDER, climb
from tests.conftest import healthy_snapshot

START = 1_750_000_000.0


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> NodeSnapshot:
    """A healthy p5 snapshot to bend into each case."""
    return healthy_snapshot("p5.48xlarge", tmp_path_factory.mktemp("base"))


def gpu(snapshot: NodeSnapshot, index: int, **changes: object) -> NodeSnapshot:
    gpus = tuple(
        dataclasses.replace(g, **changes) if g.index == index else g  # type: ignore[arg-type]
        for g in snapshot.gpu.gpus
    )
    return dataclasses.replace(snapshot, gpu=dataclasses.replace(snapshot.gpu, gpus=gpus))


def contained_dbe(snapshot: NodeSnapshot, index: int = 1) -> NodeSnapshot:
    """What an H100 shows after XID 94: one volatile uncorrectable error, a row remap pending,
    recovery action none (the simulator's `ecc-dbe` is this state)."""
    return gpu(
        snapshot,
        index,
        ecc=EccCounts(corrected_volatile=0, uncorrected_volatile=1, uncorrected_aggregate=1),
        remapped_rows=RemappedRows(corrected=0, uncorrected=1, pending=True, failure=False),
        recovery_action=0,
    )


def with_xids(snapshot: NodeSnapshot, *events: tuple[int, int], text: str = "") -> NodeSnapshot:
    """XID events (gpu, xid), and for each the driver's log line when `text` is given."""
    by_index = {g.index: g for g in snapshot.gpu.gpus}
    xids = tuple(XidEvent(g, by_index[g].uuid, x, snapshot.taken_at - 1.0) for g, x in events)
    lines = tuple(
        KernelLogEvent(
            kind="xid",
            pattern="xid",
            severity="error",
            timestamp=snapshot.taken_at - 1.0,
            message=f"NVRM: Xid (PCI:{by_index[g].pci_bus_id[4:-2]}): {x}, {text}",
            code=x,
            gpu_index=g,
        )
        for g, x in events
        if text
    )
    return dataclasses.replace(
        snapshot,
        gpu=dataclasses.replace(snapshot.gpu, xid_events=xids),
        kernel_log=KernelLogReading(source="kmsg", events=lines) if lines else None,
    )


def verdicts(*snapshots: NodeSnapshot) -> HealthReport:
    """The monitor's report after these polls (5 s apart), damping included."""
    monitor = HealthMonitor()
    report = None
    for i, s in enumerate(snapshots):
        report = monitor.observe(dataclasses.replace(s, taken_at=START + 5 * i))
    assert report is not None
    return report


def node_step(findings: tuple[Finding, ...]) -> set[tuple[str, str, str]]:
    """(check, component, the ladder's first step) of each actionable finding."""
    rungs = climb([f for f in findings if f.actionable], (), DEFAULT_LADDER, START)
    return {(r.check, r.component, r.action) for r in rungs}


def keyed(report: HealthReport) -> dict[tuple[str, str], Finding]:
    return {f.key: f for f in report.findings}


# --- item 1: a contained error asks nothing of the node -----------------------------------


def test_a_contained_ecc_error_asks_nothing_of_the_node(base: NodeSnapshot) -> None:
    """XID 94 (RESTART_APP) and the state it leaves: the job that met the error ends, the other
    seven GPUs' jobs go on, the remap waits for the next reset. Before issue 28
    `ecc_uncorrectable` asked for a reboot and `row_remap_pending` for a reset (done as a reboot
    by HyperPod and Slurm): every job on the node died for one contained error."""
    hit = with_xids(contained_dbe(base), (1, 94), text="pid=7062, Contained: CE User Channel")
    later = contained_dbe(base)
    report = verdicts(hit, *[later] * 5)
    found = keyed(report)
    assert report.actionable == () and node_step(report.findings) == set()
    assert (found[("xid", "gpu1")].severity, found[("xid", "gpu1")].action) == ("info", "none")
    for check in ("ecc_uncorrectable", "row_remap_pending"):
        f = found[(check, "gpu1")]
        assert (f.severity, f.action, f.actionable) == ("warning", "none", False), f
    assert ("gpu_recovery_reset", "gpu1") not in found


RESET = ("gpu_recovery_reset", "critical", "reset")
REBOOT = ("gpu_recovery_reboot", "critical", "reboot")
NO_NODE_ACTION = ("gpu_recovery_action", "warning", None)

# (what the driver says, the snapshot change on GPU 1, the finding, the ladder's first step)
ROWS = [
    ("XID 95 uncontained ECC (RESET_GPU): every application on the GPU affected; reset",
     lambda b: with_xids(contained_dbe(b), (1, 95)), ("xid", "fatal", "reset")),
    ("recovery action 4 DRAIN_AND_RESET after the contained error: reduced capacity, running"
     " work safe; drain, then reset",
     lambda b: gpu(contained_dbe(b), 1, recovery_action=4), RESET),
    ("recovery action 1 GPU_RESET: reset before use",
     lambda b: gpu(b, 1, recovery_action=1), RESET),
    ("recovery action 6 BUS_RESET (newer nvml.h)",
     lambda b: gpu(b, 1, recovery_action=6), RESET),
    ("recovery action 2 NODE_REBOOT: a GPU reset is not enough",
     lambda b: gpu(b, 1, recovery_action=2), REBOOT),
    ("recovery action 7 SYSTEM_REBOOT (newer nvml.h)",
     lambda b: gpu(b, 1, recovery_action=7), REBOOT),
    ("recovery action 3 DRAIN_P2P: stop P2P traffic, then the driver names the action",
     lambda b: gpu(b, 1, recovery_action=3), NO_NODE_ACTION),
    ("recovery action 5 RECOVER_IMEX_DOMAIN: the IMEX domain's, not the node's",
     lambda b: gpu(b, 1, recovery_action=5), NO_NODE_ACTION),
    ("recovery action 0 NONE: nothing",
     lambda b: gpu(b, 1, recovery_action=0), None),
    ("recovery action not readable (driver before R570): nothing from it",
     lambda b: gpu(b, 1, recovery_action=None), None),
]  # fmt: skip


@pytest.mark.parametrize(("meaning", "build", "expected"), ROWS, ids=[r[0][:50] for r in ROWS])
def test_the_driver_verdict_decides_the_step(
    base: NodeSnapshot, meaning: str, build: object, expected: tuple[str, str, str | None] | None
) -> None:
    changed = build(base)  # type: ignore[operator]
    plain = dataclasses.replace(changed, gpu=dataclasses.replace(changed.gpu, xid_events=()))
    report = verdicts(changed, *[plain] * 4)
    steps = node_step(report.findings)
    if expected is None:
        assert steps == set() and not any("recovery" in f.check for f in report.findings)
        return
    check, severity, step = expected
    f = keyed(report)[(check, "gpu1")]
    assert f.severity == severity, meaning
    if step is None:
        assert (f.action, f.actionable) == ("none", False), meaning
        assert steps == set(), meaning
    else:
        assert f.actionable, meaning
        assert (check, "gpu1", step) in steps, (meaning, steps)
        assert {s for _, _, s in steps} == {step}, meaning  # the contained error adds nothing


# --- item 2: XID 154 follows the action it names --------------------------------------------

CHANGED = "GPU recovery action changed from 0x0 (None) to 0x{:x} ({})"


@pytest.mark.parametrize(
    ("new", "name", "check", "step"),
    [
        (1, "GPU Reset Required", "gpu_recovery_reset", "reset"),
        (2, "Node Reboot Required", "gpu_recovery_reboot", "reboot"),
        (4, "Drain and Reset", "gpu_recovery_reset", "reset"),
    ],
)
def test_xid_154_acts_on_the_action_its_line_names(
    base: NodeSnapshot, new: int, name: str, check: str, step: str
) -> None:
    """Where NVML's field cannot be read (a driver or GPU that does not answer it), XID 154's
    log line says what the driver now requires: before issue 28 it was a warning with no
    action whatever it said."""
    unread = gpu(base, 1, recovery_action=None)
    hit = with_xids(unread, (1, 154), text=CHANGED.format(new, name))
    report = verdicts(hit, *[unread] * 4)
    f = keyed(report)[(check, "gpu1")]
    assert (f.severity, f.action, f.actionable) == ("critical", "reboot", True)
    assert f"0x{new:x} ({name})" in f.evidence and "XID 154" in f.evidence
    assert node_step(report.findings) == {(check, "gpu1", step)}
    xid = keyed(report)[("xid", "gpu1")]
    assert (xid.severity, xid.action) == ("info", "none")  # its action is the recovery finding's
    assert f"to 0x{new:x} {name}" in xid.evidence


def test_nvml_field_is_current_and_outranks_an_older_xid_154(base: NodeSnapshot) -> None:
    """The field is the driver's verdict now: a GPU reset done since the XID 154 "to GPU reset"
    cleared it to none, so nothing is asked (the line alone would still ask for a reset)."""
    hit = with_xids(gpu(base, 1, recovery_action=0), (1, 154), text=CHANGED.format(1, "GPU Reset"))
    report = verdicts(hit, *[gpu(base, 1, recovery_action=0)] * 4)
    assert not any(f.check.startswith("gpu_recovery") for f in report.findings)
    assert report.actionable == ()


def test_xid_154_from_nvml_alone_names_no_action(base: NodeSnapshot) -> None:
    """NVML's event set carries the code only: the field (here: reset) is what acts."""
    hit = with_xids(gpu(base, 1, recovery_action=1), (1, 154))
    report = verdicts(hit, *[gpu(base, 1, recovery_action=1)] * 4)
    f = keyed(report)[("gpu_recovery_reset", "gpu1")]
    assert f.actionable and "NVML recovery action 0x1 (GPU Reset Required)" in f.evidence
    assert node_step(report.findings) == {("gpu_recovery_reset", "gpu1", "reset")}


# --- the simulated node, with its kernel log, end to end ------------------------------------


class Node:
    """A simulated p5 read by the production poller, kernel log on, default damping."""

    def __init__(self, root: Path, *faults: str) -> None:
        self.node = SimulatedNode(
            get_profile("p5.48xlarge"), parse_faults(faults), root=root, start=START
        )
        self.now = START
        self.sources = self.node.sources()
        self.sources.kernel_log = self.node.kernel_log_source(None)
        self.monitor = HealthMonitor()
        self.poller = Poller(
            "sim-node-1", self.sources, clock=lambda: self.now, health=self.monitor
        )

    def run(self, polls: int, step: float = 5.0) -> tuple[NodeSnapshot, HealthReport]:
        for _ in range(polls):
            self.now += step
            snapshot, _ = self.poller.poll()
            time.sleep(0.02)  # NVML's XIDs arrive on the event thread
        assert self.monitor.last is not None
        return snapshot, self.monitor.last

    def close(self) -> None:
        self.sources.close()
        self.node.close()


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Node]]:
    made: list[Node] = []
    yield made
    for n in made:
        n.close()


def make(nodes: list[Node], tmp: Path, *faults: str) -> Node:
    node = Node(tmp / f"sim{len(nodes)}", *faults)
    nodes.append(node)
    return node


def test_simulated_contained_error_reboots_nothing(nodes: list[Node], tmp_path: Path) -> None:
    """`xid=94` and `ecc-dbe` on GPU 1 of a simulated p5: the driver's state after a contained
    error. No finding asks the node for anything."""
    node = make(nodes, tmp_path, "xid=94@gpu1", "ecc-dbe@gpu1")
    snapshot, report = node.run(6)
    g1 = snapshot.gpu.gpus[1]
    assert g1.remapped_rows is not None and g1.remapped_rows.pending
    assert g1.ecc.uncorrected_volatile and g1.recovery_action in (0, None)
    assert report.actionable == ()
    assert {("ecc_uncorrectable", "gpu1"), ("row_remap_pending", "gpu1")} <= set(keyed(report))


def test_simulated_uncontained_error_resets_the_gpu(nodes: list[Node], tmp_path: Path) -> None:
    """`xid=95`: the driver marks the GPU for reset (recovery action 1, XID 154 logged and
    delivered); the XID and the recovery action both start at a reset, never a reboot."""
    node = make(nodes, tmp_path, "xid=95@gpu1", "ecc-dbe@gpu1")
    snapshot, report = node.run(6)
    assert snapshot.gpu.gpus[1].recovery_action == 1
    assert {c.xid for c in snapshot.xid.counts if c.gpu_index == 1} == {95, 154}
    assert all(c.count == 1 for c in snapshot.xid.counts)  # log line and NVML event: one each
    assert node_step(report.findings) == {
        ("xid", "gpu1", "reset"),
        ("gpu_recovery_reset", "gpu1", "reset"),
    }


@pytest.mark.parametrize(
    ("spec", "check", "step"),
    [
        ("recovery=reset@gpu2", "gpu_recovery_reset", "reset"),
        ("recovery=reboot@gpu2", "gpu_recovery_reboot", "reboot"),
        ("recovery=drain-and-reset@gpu2", "gpu_recovery_reset", "reset"),
        ("recovery=drain-p2p@gpu2", "gpu_recovery_action", None),
    ],
)
def test_simulated_recovery_action(
    nodes: list[Node], tmp_path: Path, spec: str, check: str, step: str | None
) -> None:
    node = make(nodes, tmp_path, spec)
    snapshot, report = node.run(5)
    f = keyed(report)[(check, "gpu2")]
    assert "NVML recovery action" in f.evidence and "announced by XID 154" in f.evidence
    assert [c.count for c in snapshot.xid.counts if (c.gpu_index, c.xid) == (2, 154)] == [1]
    if step is None:
        assert (f.action, report.actionable) == ("none", ())
    else:
        assert node_step(report.findings) == {(check, "gpu2", step)}


def test_simulated_recovery_action_survives_an_unreadable_gpu(
    nodes: list[Node], tmp_path: Path
) -> None:
    """The GPU asks for a reset and then no longer answers NVML: the field cannot be read, the
    XID 154 line the driver logged still names the action."""
    node = make(nodes, tmp_path, "recovery=reset@gpu2")
    node.run(2)
    node.node.inject(parse_faults(["nvml-timeout@gpu2"])[0])
    snapshot, report = node.run(4)
    assert not snapshot.gpu.gpus[2].up
    f = keyed(report)[("gpu_recovery_reset", "gpu2")]
    assert f.actionable and "NVML's field unread" in f.evidence
    assert ("gpu_recovery_reset", "gpu2", "reset") in node_step(report.findings)


def test_simulated_uvm_fatal_error_reboots_the_node(nodes: list[Node], tmp_path: Path) -> None:
    """nvGpuOpsReportFatalError "requiring os reboot to recover": the kernel line and every
    GPU's recovery action (node reboot) agree; the node reboots first, it is not reset."""
    node = make(nodes, tmp_path, "uvm-fatal")
    _, report = node.run(5)
    found = keyed(report)
    assert found[("kernel_uvm_fatal", "node")].actionable
    assert {k for k in found if k[0] == "gpu_recovery_reboot"} == {
        ("gpu_recovery_reboot", f"gpu{i}") for i in range(8)
    }
    assert {s for _, _, s in node_step(report.findings)} == {"reboot"}
