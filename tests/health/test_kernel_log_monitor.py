"""The kernel log monitor in the node agent (issue 14, item 1): kernel log lines become events on
our GPUs and devices, counters and findings; an XID the driver logs and NVML delivers is one
event; an XID only the log shows (NVML lost the GPU) still reaches the XID check.

The lines come from the simulated /dev/kmsg (exporter/sim/hardware/kmsg.py, the kernel's read
semantics) in the real drivers' formats (exporter/core/data/kernel-log-patterns.csv cites them) and
are read by the production reader and poller.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.snapshot import (
    GpuInventory,
    KernelLogBatch,
    KernelLogCount,
    KernelLogReading,
    KernelLogRecord,
    NodeSnapshot,
    XidEvent,
)
from exporter.node.kernel.events import KernelLogLedger
from exporter.node.poller import Poller
from exporter.sim.faults import parse_faults
from exporter.sim.hardware.node import SimulatedNode
from exporter.sim.hardware.profiles import get_profile
from healthcheck.detection.checks import History, run_checks
from healthcheck.detection.config import config_from_mapping
from healthcheck.detection.monitor import HealthMonitor

START = 1_750_000_000.0


class Agent:
    """A simulated node read by the production poller, with the kernel log monitor on."""

    def __init__(self, root: Path, *faults: str, state: Path | None = None) -> None:
        self.node = SimulatedNode(
            get_profile("p5.48xlarge"), parse_faults(faults), root=root, start=START
        )
        self.now = START
        self.sources = self.node.sources()
        self.sources.kernel_log = self.node.kernel_log_source(state)
        self.monitor = HealthMonitor(config_from_mapping({"damping": {"k": 1, "n": 1}}))
        self.poller = Poller(
            "sim-node-1", self.sources, clock=lambda: self.now, health=self.monitor
        )

    def poll(self, step: float = 5.0) -> NodeSnapshot:
        self.now += step
        snapshot, self.exposition = self.poller.poll()
        return snapshot

    def xid_count(self, snapshot: NodeSnapshot, gpu: int, xid: int) -> int:
        return sum(c.count for c in snapshot.xid.counts if (c.gpu_index, c.xid) == (gpu, xid))

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        text = self.exposition.text.decode()
        return [
            (s.labels, s.value)
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == name
        ]

    def close(self) -> None:
        self.sources.close()
        self.node.close()


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[list[Agent]]:
    made: list[Agent] = []
    yield made
    for a in made:
        a.close()


def make(agents: list[Agent], tmp: Path, *faults: str, state: Path | None = None) -> Agent:
    agent = Agent(tmp / f"sim{len(agents)}", *faults, state=state)
    agents.append(agent)
    return agent


# -- one fault, one event ---------------------------------------------------------------------


def test_an_xid_the_driver_logs_and_nvml_delivers_counts_once(
    agents: list[Agent], tmp_path: Path
) -> None:
    """The driver prints every XID it raises (`NVRM: Xid (PCI:...): N`) and NVML's event set
    delivers the same one: the log line arrives a poll before NVML's event here, and the
    counter, the XID check and the kernel log counter each see one event."""
    agent = make(agents, tmp_path, "xid=79@gpu3")
    snapshots = [agent.poll() for _ in range(3)]
    last = snapshots[-1]
    assert agent.xid_count(last, 3, 79) == 1
    assert last.kernel_log is not None
    logged = [c for c in last.kernel_log.counts if c.kind == "xid"]
    assert [(c.gpu, c.count) for c in logged] == [("3", 1)]
    [(labels, value)] = [
        s for s in agent.samples("topowatch_xid_errors_total") if s[0]["gpu"] == "3"
    ]
    assert (labels["xid"], value) == ("79", 1.0)


def test_an_xid_only_the_log_shows_reaches_the_xid_check(
    agents: list[Agent], tmp_path: Path
) -> None:
    """A GPU that falls off the bus fails every NVML call (GPU_IS_LOST) and its XID 79 never
    comes through the event set; the kernel logs it. The log's XID, mapped from its PCI address
    to the GPU the agent read before, is the XID event: catalog RESTART_BM, a reboot."""
    agent = make(agents, tmp_path)
    agent.poll()  # the agent has read GPU 2 while it was up: its PCI address is known
    (fault,) = parse_faults(["gpu-lost@gpu2"])
    agent.node.inject(fault)
    snapshot = agent.poll()
    assert agent.xid_count(snapshot, 2, 79) == 1
    report = agent.monitor.last
    assert report is not None
    [xid] = [f for f in report.findings if f.check == "xid" and f.component == "gpu2"]
    assert (xid.action, xid.actionable) == ("reboot", True)
    [bus] = [f for f in report.findings if f.check == "kernel_gpu_fallen_off_bus"]
    assert (bus.component, bus.severity, bus.action) == ("gpu2", "fatal", "reboot")


LEDGER_GPUS = 8


def ledger_with_gpus() -> KernelLogLedger:
    from exporter.core.snapshot import GpuInventory, GpuReading

    ledger = KernelLogLedger("kmsg")
    gpus = tuple(
        GpuReading(
            index=i,
            uuid=f"GPU-{i}",
            pci_bus_id=f"00000000:{0x53 + i:02X}:00.0",
            model="H100",
            up=True,
        )
        for i in range(LEDGER_GPUS)
    )
    ledger.learn_gpus(GpuInventory(available=True, gpus=gpus))
    return ledger


def xid_line(gpu: int, xid: int, at: float) -> KernelLogRecord:
    return KernelLogRecord(
        seq=int(at),
        monotonic_usec=int(at * 1e6),
        timestamp=at,
        priority=3,
        message=f"NVRM: Xid (PCI:0000:{0x53 + gpu:02x}:00): {xid}, pid=1, name=python3, Ch 08",
    )


# (rule, NVML's events per poll, the log's lines per poll, XID events passed on)
MERGE_ROWS = [
    (
        "the same XID on the same GPU from both sides within the window is one fault",
        [[(3, 79, 100.0)]],
        [[(3, 79, 99.0)]],
        1,
    ),
    (
        "the log first, NVML a poll later: still one",
        [[], [(3, 48, 105.0)]],
        [[(3, 48, 100.0)], []],
        1,
    ),
    (
        "NVML first, the log a poll later: still one",
        [[(3, 48, 100.0)], []],
        [[], [(3, 48, 101.0)]],
        1,
    ),
    (
        "a burst: two XIDs from each side pair one to one",
        [[(1, 13, 100.0), (1, 13, 100.5)]],
        [[(1, 13, 100.1), (1, 13, 100.6)]],
        2,
    ),
    (
        "the same XID on two GPUs is two faults",
        [[(1, 79, 100.0)]],
        [[(2, 79, 100.0)]],
        2,
    ),
    (
        "two XIDs further apart than the window are two faults",
        [[(1, 94, 100.0)], []],
        [[], [(1, 94, 200.0)]],
        2,
    ),
    (
        "different XIDs on one GPU are two faults",
        [[(1, 94, 100.0)]],
        [[(1, 95, 100.0)]],
        2,
    ),
]


@pytest.mark.parametrize("rule,nvml,log,expected", MERGE_ROWS, ids=[r[0] for r in MERGE_ROWS])
def test_xids_from_nvml_and_the_log_merge_one_fault_one_event(
    rule: str,
    nvml: list[list[tuple[int, int, float]]],
    log: list[list[tuple[int, int, float]]],
    expected: int,
) -> None:
    ledger = ledger_with_gpus()
    passed: list[XidEvent] = []
    for poll, (from_nvml, from_log) in enumerate(zip(nvml, log, strict=True)):
        events = ledger.record(
            KernelLogBatch(records=tuple(xid_line(g, x, t) for g, x, t in from_log))
        )
        nvml_events = [XidEvent(g, f"GPU-{g}", x, t) for g, x, t in from_nvml]
        passed += ledger.merge_xids(nvml_events, ledger.log_xids(events), 100.0 + 5 * poll)
    assert len(passed) == expected, rule


def test_a_log_xid_on_a_gpu_that_is_not_ours_is_counted_but_is_no_xid_event() -> None:
    ledger = ledger_with_gpus()
    record = dataclasses.replace(
        xid_line(0, 79, 100.0), message="NVRM: Xid (PCI:0000:ee:00): 79, pid=1, name=x, y"
    )
    events = ledger.record(KernelLogBatch(records=(record,)))
    assert ledger.log_xids(events) == []
    [count] = ledger.reading(events).counts
    assert (count.kind, count.gpu, count.device) == ("xid", "", "0000:ee:00.0")


# -- what each kind asks for ----------------------------------------------------------------


def count(
    kind: str, severity: str, *, gpu: str = "", device: str = "d", n: int = 1, age: float = 0.0
) -> KernelLogCount:
    return KernelLogCount(kind, kind, severity, gpu, device, n, 10_000.0 - age, f"a {kind} line")


# (rule it rests on, the count, config, expected (check, component, severity, action) or None)
VERDICTS = [
    (
        "a GPU fallen off the bus needs a reboot first (NVIDIA: RESTART_BM for XID 79); a"
        " fatal line is a fact, undamped (severity fatal)",
        count("gpu_fallen_off_bus", "fatal", gpu="2"),
        {},
        ("kernel_gpu_fallen_off_bus", "gpu2", "fatal", "reboot"),
    ),
    (
        "an EFA device reset that failed leaves the device unusable: reboot",
        count("efa_driver", "fatal", device="rdmap16s27"),
        {},
        ("kernel_efa_driver", "rdmap16s27", "fatal", "reboot"),
    ),
    (
        "an EFA admin command timeout is reported; the driver retries (action configurable)",
        count("efa_driver", "error", device="rdmap16s27"),
        {},
        ("kernel_efa_driver", "rdmap16s27", "warning", "none"),
    ),
    (
        "errors ask for what kernel_log.error_action says",
        count("pcie_aer", "error", gpu="4"),
        {"kernel_log": {"error_action": "reboot"}},
        ("kernel_pcie_aer", "gpu4", "warning", "reboot"),
    ),
    (
        "a hung task is a warning: the task, not the node, is stuck",
        count("hung_task", "warning", device=""),
        {},
        ("kernel_hung_task", "node", "warning", "none"),
    ),
    (
        "corrected PCIe errors are corrected: counted, not a finding",
        count("pcie_aer", "corrected", gpu="4", n=500),
        {},
        None,
    ),
    (
        "corrected PCIe errors become a warning past the configured count",
        count("pcie_aer", "corrected", gpu="4", n=500),
        {"kernel_log": {"corrected_report_count": 100}},
        ("kernel_pcie_aer", "gpu4", "warning", "none"),
    ),
    (
        "a line older than the hold window is no longer a finding",
        count("gpu_fallen_off_bus", "fatal", gpu="2", age=3601.0),
        {},
        None,
    ),
    (
        "XID lines are the XID check's: the catalog judges them, once",
        count("xid", "error", gpu="3"),
        {},
        None,
    ),
]


@pytest.mark.parametrize("rule,counted,config,expected", VERDICTS, ids=[r[0] for r in VERDICTS])
def test_what_each_kernel_log_line_asks_for(
    rule: str,
    counted: KernelLogCount,
    config: dict[str, object],
    expected: tuple[str, str, str, str] | None,
    base_snapshot: NodeSnapshot,
) -> None:
    snapshot = dataclasses.replace(
        base_snapshot, kernel_log=KernelLogReading(source="kmsg", counts=(counted,))
    )
    findings = [
        (f.check, f.component, f.severity, f.action)
        for f in run_checks(snapshot, History(), config_from_mapping(config), 10_000.0)
        if f.check.startswith("kernel_")
    ]
    assert findings == ([] if expected is None else [expected]), rule


@pytest.fixture(scope="module")
def base_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeSnapshot]:
    agent = Agent(tmp_path_factory.mktemp("base"))
    try:
        yield agent.poll()
    finally:
        agent.close()


# -- the log as a source: outages, restarts, exports ------------------------------------------


def test_the_events_are_exported_with_their_gpu_and_the_reader_counts(
    agents: list[Agent], tmp_path: Path
) -> None:
    agent = make(agents, tmp_path, "aer@gpu4", "efa-reset-failed@rdmap16s27", "hung-task")
    agent.poll()
    events = {
        (s["kind"], s["pattern"], s["gpu"], s["device"]): v
        for s, v in agent.samples("topowatch_kernel_log_events_total")
    }
    assert events == {
        ("pcie_aer", "aer_error_message_received", "4", ""): 1.0,
        ("pcie_aer", "aer_pcie_bus_error", "4", ""): 1.0,
        ("efa_driver", "efa_device_reset_failed", "", "rdmap16s27"): 1.0,
        ("hung_task", "hung_task", "", ""): 1.0,
    }
    [(labels, lines)] = agent.samples("topowatch_kernel_log_lines_total")
    assert (labels["source"], lines) == ("kmsg", 4.0)
    stamps = {v for _, v in agent.samples("topowatch_kernel_log_last_event_timestamp_seconds")}
    assert stamps == {agent.now}


def test_boot_lines_already_in_the_log_are_not_replayed_as_events(
    agents: list[Agent], tmp_path: Path
) -> None:
    """The simulated node booted with lines in its log before the agent started; a first start
    (no state) begins at the end: none of them is read, none is an event."""
    agent = make(agents, tmp_path)
    snapshot = agent.poll()
    assert snapshot.kernel_log is not None
    assert (snapshot.kernel_log.lines, snapshot.kernel_log.counts) == (0, ())


def test_a_kmsg_that_vanishes_fails_its_collector_only_and_loses_nothing_the_ring_holds(
    agents: list[Agent], tmp_path: Path
) -> None:
    agent = make(agents, tmp_path)
    agent.poll()
    agent.node.kernel_log.remove()
    agent.node.kernel_log.write("INFO: task python3:77 blocked for more than 122 seconds.")
    snapshot = agent.poll()
    status = {c.name: c.ok for c in snapshot.collectors}
    assert status["kernel_log"] is False and status["gpu"] is True
    assert snapshot.collector_errors[("kernel_log", "kmsg_unreadable")] == 1
    assert agent.samples("topowatch_gpu_up"), "the GPU metrics keep serving"
    agent.node.kernel_log.restore()
    snapshot = agent.poll()
    assert snapshot.kernel_log is not None
    assert [c.kind for c in snapshot.kernel_log.counts] == ["hung_task"]


def test_a_restarted_agent_reads_what_was_logged_while_it_was_down_and_nothing_twice(
    agents: list[Agent], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    first = make(agents, tmp_path, state=state)
    first.poll()
    first.node.kernel_log.write("INFO: task a:1 blocked for more than 122 seconds.")
    first.poll()
    first.sources.kernel_log.close()  # type: ignore[union-attr]
    first.node.kernel_log.write("INFO: task b:2 blocked for more than 122 seconds.")
    # The agent restarts on the same node: a new poller, the same log and state directory.
    first.sources.kernel_log = first.node.kernel_log_source(state)
    restarted = Poller("sim-node-1", first.sources, clock=lambda: first.now)
    first.now += 5
    snapshot, _ = restarted.poll()
    assert snapshot.kernel_log is not None
    [hung] = snapshot.kernel_log.counts
    assert (hung.count, hung.last_message) == (
        1,
        "INFO: task b:2 blocked for more than 122 seconds.",
    )


def test_kernel_log_off_means_no_series_and_no_checks_on_it(
    agents: list[Agent], tmp_path: Path
) -> None:
    node = SimulatedNode(get_profile("p5.48xlarge"), (), root=tmp_path / "off", start=START)
    sources = node.sources()
    try:
        snapshot, exposition = Poller("n", sources, clock=lambda: START + 5).poll()
    finally:
        sources.close()
        node.close()
    assert snapshot.kernel_log is None
    assert b"topowatch_kernel_log" not in exposition.text


def test_lines_the_gate_skips_are_still_counted_and_their_loss_is_exact() -> None:
    """Records no pattern can match are not parsed, but they are read: they count as lines, and
    an overrun among them is counted from their sequence numbers like any other."""
    from exporter.node.kernel.patterns import record_may_match
    from exporter.sim.hardware.kmsg import SimKernelLog

    ring = SimKernelLog(capacity_bytes=1 << 15)
    ring.write("Linux version 6.1 (booted)")
    source = ring.source(None, keep=record_may_match)
    ledger = KernelLogLedger("kmsg")
    written = 3_000
    for i in range(written):
        ring.write(
            "INFO: task python3:1 blocked for more than 122 seconds."
            if i == written - 1
            else f"EXT4-fs (nvme0n1p1): ordinary line {i}"
        )
    while True:
        batch = source.read()
        ledger.record(batch)
        if not (batch.records or batch.skipped or batch.dropped):
            break
    assert ledger.dropped > 0, "the ring is too small to hold them all"
    assert ledger.lines + ledger.dropped == written
    assert [c.kind for c in ledger.reading(()).counts] == ["hung_task"]


def pumped_poller(tmp: Path, capacity: int) -> tuple[SimulatedNode, Poller]:
    from exporter.sim.hardware.kmsg import SimKernelLog

    node = SimulatedNode(get_profile("p5.48xlarge"), (), root=tmp, start=START)
    node.kernel_log = SimKernelLog(capacity_bytes=capacity, clock=node.clock)
    node.kernel_log.write("Linux version 6.1 (booted)")
    sources = node.sources()
    sources.kernel_log = node.kernel_log_source()
    return node, Poller("n", sources, clock=lambda: START + 5)


def storms_then_poll(tmp: Path, capacity: int, storms: int, pumped: bool) -> KernelLogReading:
    """`storms` times 100 ordinary lines and a hung task, with a pump after each if `pumped`,
    then one poll: what it read."""
    node, poller = pumped_poller(tmp, capacity)
    try:
        for r in range(storms):
            for i in range(100):
                node.kernel_log.write(f"EXT4-fs (nvme0n1p1): ordinary line {r}.{i}")
            node.kernel_log.write(f"INFO: task python3:{r} blocked for more than 122 seconds.")
            if pumped:
                poller.pump_kernel_log()
        snapshot, _ = poller.poll()
    finally:
        poller.sources.close()
        node.close()
    assert snapshot.kernel_log is not None
    return snapshot.kernel_log


@pytest.mark.parametrize("pumped", [True, False])
def test_a_storm_between_polls_is_drained_by_the_pumps_not_lost_to_the_ring(
    tmp_path: Path, pumped: bool
) -> None:
    """A ring of 16 KiB holds about 340 of these lines; 404 arrive between two polls. Drained
    between polls (as NodeAgent does every 250 ms) every line is read; left to the next poll,
    the ring overwrites the oldest and the agent counts exactly how many."""
    reading = storms_then_poll(tmp_path, 1 << 14, 4, pumped)
    assert reading.lines + reading.dropped == 404
    hung = sum(c.count for c in reading.counts if c.kind == "hung_task")
    if pumped:
        assert (reading.dropped, hung) == (0, 4)
    else:
        assert reading.dropped > 0


def test_fault_lines_held_between_polls_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exporter.node import poller as poller_module

    monkeypatch.setattr(poller_module, "KERNEL_LOG_PENDING_MAX", 2)
    reading = storms_then_poll(tmp_path, 1 << 16, 5, pumped=True)
    assert [c.count for c in reading.counts if c.kind == "hung_task"] == [2]
    assert reading.dropped == 3  # held no more: counted, not kept
    assert reading.lines + reading.dropped == 505


def test_the_agent_drains_the_kernel_log_between_polls(tmp_path: Path) -> None:
    """NodeAgent's loop pumps the kernel log while it waits for the next poll (one poll an hour
    here, so every pump counted comes from the wait)."""
    import threading

    from exporter.node.agent import NodeAgent

    sample = Agent(tmp_path / "sample")
    try:
        snapshot = sample.poll()
        exposition = sample.exposition
    finally:
        sample.close()

    class CountingPoller:
        reads_kernel_log = True

        def __init__(self) -> None:
            self.polls = 0
            self.pumps = 0
            self.pumped = threading.Event()

        def poll(self) -> tuple[NodeSnapshot, object]:
            self.polls += 1
            return snapshot, exposition

        def pump_kernel_log(self) -> None:
            self.pumps += 1
            if self.pumps >= 3:
                self.pumped.set()

    counting = CountingPoller()
    node_agent = NodeAgent(counting, interval=3600.0)  # type: ignore[arg-type]
    node_agent.start()
    try:
        assert counting.pumped.wait(10), "no kernel log pump between polls"
    finally:
        node_agent.stop()
    assert counting.polls == 1


def test_lines_of_one_kind_on_one_component_make_one_finding_with_the_strongest_verdict(
    base_snapshot: NodeSnapshot,
) -> None:
    """A non-fatal and a fatal AER line on the same GPU are one `kernel_pcie_aer` finding: the
    fatal one's reboot (the strongest verdict wins, as for XIDs), its evidence counting both."""
    counts = (
        count("pcie_aer", "error", gpu="4", n=3, age=10.0),
        count("pcie_aer", "fatal", gpu="4", n=1, age=60.0),
    )
    snapshot = dataclasses.replace(
        base_snapshot, kernel_log=KernelLogReading(source="kmsg", counts=counts)
    )
    [found] = [
        f
        for f in run_checks(snapshot, History(), config_from_mapping({}), 10_000.0)
        if f.check == "kernel_pcie_aer"
    ]
    assert (found.component, found.severity, found.action) == ("gpu4", "fatal", "reboot")
    assert found.evidence.startswith("4 kernel log line(s), latest 10s ago")


# -- issue 28: the lines the table missed, from the simulated node's /dev/kmsg -----------------


def test_a_bare_xid_line_is_an_xid(agents: list[Agent], tmp_path: Path) -> None:
    """`NVRM: Xid (PCI:...): 46` with nothing after the code (the record cut there) was missed:
    it is XID 46 (RESET_GPU) on the GPU the address names, once with NVML's event."""
    agent = make(agents, tmp_path, "xid-bare=46@gpu4")
    snapshot = [agent.poll() for _ in range(3)][-1]
    assert snapshot.kernel_log is not None
    assert [(c.kind, c.gpu, c.count) for c in snapshot.kernel_log.counts] == [("xid", "4", 1)]
    assert agent.xid_count(snapshot, 4, 46) == 1
    report = agent.monitor.last
    assert report is not None
    xid = {f.key: f for f in report.findings}[("xid", "gpu4")]
    assert (xid.action, xid.actionable) == ("reboot", True)


def test_rm_init_adapter_failed_names_the_gpu(agents: list[Agent], tmp_path: Path) -> None:
    """`NVRM: GPU 0000:..: RmInitAdapter failed!`: the driver could not initialise that GPU.
    Its PCI address is mapped to the GPU the agent read there (a fatal line: a reboot first);
    the `rm_init_adapter failed, device minor number` line after it is the same failure."""
    agent = make(agents, tmp_path)
    agent.poll()  # the agent has read GPU 5: its PCI address is known
    agent.node.inject(parse_faults(["gpu-init-failed@gpu5"])[0])
    snapshot = agent.poll()
    assert snapshot.kernel_log is not None
    [count] = [c for c in snapshot.kernel_log.counts if c.kind == "gpu_init_failed"]
    assert (count.gpu, count.pattern, count.count) == ("5", "rm_init_adapter_failed", 1)
    report = agent.monitor.last
    assert report is not None
    f = {f.key: f for f in report.findings}[("kernel_gpu_init_failed", "gpu5")]
    assert (f.severity, f.action, f.actionable) == ("fatal", "reboot", True)
    assert "RmInitAdapter failed!" in f.evidence


def test_an_init_failure_of_a_gpu_never_read_names_its_address(
    base_snapshot: NodeSnapshot,
) -> None:
    """A GPU that failed to initialise never answers NVML: the agent may never have read it.
    The finding is then on its PCI address, not on an index it cannot know."""
    ledger = ledger_with_gpus()
    message = "NVRM: GPU 0000:c1:00.0: RmInitAdapter failed! (0x22:0x56:667)"
    events = ledger.record(KernelLogBatch(records=(KernelLogRecord(1, 1, START, 3, message),)))
    assert [(e.kind, e.gpu_index, e.pci_address) for e in events] == [
        ("gpu_init_failed", None, "0000:c1:00.0")
    ]
    snapshot = dataclasses.replace(base_snapshot, kernel_log=ledger.reading(events))
    found = run_checks(snapshot, History(), config_from_mapping({}), START + 1)
    assert [(f.check, f.component, f.action) for f in found if f.check.startswith("kernel_")] == [
        ("kernel_gpu_init_failed", "0000:c1:00.0", "reboot")
    ]


# -- NVML hung since the start: the PCI bus names the GPU (issue 28) --------------------------

PCI_ORDER = tuple(f"0000:{0x53 + i:02x}:00.0" for i in range(LEDGER_GPUS))


def hung_inventory(*named: tuple[int, int]) -> GpuInventory:
    """NVML hung: GPUs it named before it hung as (index, bus), the others unnamed."""
    from exporter.core.snapshot import GpuReading

    known = dict(named)
    gpus = tuple(
        GpuReading(
            index=i,
            uuid=f"GPU-{i}" if i in known else "",
            pci_bus_id=f"00000000:{known[i]:02X}:00.0" if i in known else "",
            model="",
            up=False,
        )
        for i in range(LEDGER_GPUS)
    )
    return GpuInventory(available=True, gpus=gpus, hung="nvmlDeviceGetHandleByIndex")


# (rule, what NVML named before it hung, the PCI bus read, the line's GPU, XID events' GPU)
PCI_FALLBACK_ROWS = [
    (
        "NVML named nothing: the address's place in PCI order (nvidia-smi's order)",
        (),
        PCI_ORDER,
        4,
        [(4, "")],
    ),
    (
        "NVML named GPUs 0-2 in PCI order before hanging: the order agrees, GPU 4 by it",
        ((0, 0x53), (1, 0x54), (2, 0x55)),
        PCI_ORDER,
        4,
        [(4, "")],
    ),
    (
        "NVML numbers the GPUs otherwise than the PCI order: the order is no guide, no GPU",
        ((0, 0x54), (1, 0x53)),
        PCI_ORDER,
        None,
        [],
    ),
    (
        "an address NVML already named keeps NVML's index and UUID",
        ((4, 0x57),),
        PCI_ORDER,
        4,
        [(4, "GPU-4")],
    ),
    (
        "an address not on the PCI bus as read names no GPU",
        (),
        PCI_ORDER[:4],
        None,
        [],
    ),
]


@pytest.mark.parametrize(
    "rule,named,bus,gpu,xids", PCI_FALLBACK_ROWS, ids=[r[0] for r in PCI_FALLBACK_ROWS]
)
def test_an_xid_line_while_nvml_hangs_is_mapped_by_the_pci_bus(
    rule: str,
    named: tuple[tuple[int, int], ...],
    bus: tuple[str, ...],
    gpu: int | None,
    xids: list[tuple[int, str]],
) -> None:
    ledger = KernelLogLedger("kmsg")
    ledger.learn_gpus(hung_inventory(*named))
    assert ledger.wants_pci_gpus, rule
    ledger.learn_pci_gpus(bus)
    assert not ledger.wants_pci_gpus  # read once
    events = ledger.record(KernelLogBatch(records=(xid_line(4, 79, 100.0),)))
    assert [(e.gpu_index, e.pci_address) for e in events] == [(gpu, "0000:57:00.0")], rule
    assert [(x.gpu_index, x.uuid) for x in ledger.log_xids(events)] == xids, rule


def test_nvml_answering_in_full_is_never_second_guessed_by_the_pci_bus() -> None:
    """NVML's whole answer leaves a GPU out (one that failed to initialise): its lines keep
    their address, whatever place the PCI bus gives it."""
    ledger = ledger_with_gpus()
    assert not ledger.wants_pci_gpus
    ledger.learn_pci_gpus((*PCI_ORDER, "0000:c1:00.0"))
    message = "NVRM: GPU 0000:c1:00.0: RmInitAdapter failed! (0x22:0x56:667)"
    events = ledger.record(KernelLogBatch(records=(KernelLogRecord(1, 1, START, 3, message),)))
    assert [(e.gpu_index, e.pci_address) for e in events] == [(None, "0000:c1:00.0")]


def test_a_uvm_fatal_error_is_a_node_finding(agents: list[Agent], tmp_path: Path) -> None:
    """`nvGpuOpsReportFatalError: uvm encountered global fatal error 0x60, requiring os reboot
    to recover`: UVM is global, no GPU is named; the node reboots."""
    agent = make(agents, tmp_path, "uvm-fatal")
    [agent.poll() for _ in range(2)]
    report = agent.monitor.last
    assert report is not None
    f = {f.key: f for f in report.findings}[("kernel_uvm_fatal", "node")]
    assert (f.severity, f.action, f.actionable) == ("fatal", "reboot", True)


def test_suppressed_callbacks_are_counted_not_judged(agents: list[Agent], tmp_path: Path) -> None:
    """`net_ratelimit: 37 callbacks suppressed` (lib/ratelimit.c): the kernel dropped 37
    messages. What they said is unknown, so no finding; the number is exported, as the printk
    ratelimit reports it, so a dashboard can tell a quiet log from a throttled one."""
    agent = make(agents, tmp_path, "callbacks-suppressed")
    snapshot = [agent.poll() for _ in range(2)][-1]
    assert snapshot.kernel_log is not None and snapshot.kernel_log.suppressed == 37
    report = agent.monitor.last
    assert report is not None
    assert not any(f.check.startswith("kernel_printk") for f in report.findings)
    [(labels, value)] = agent.samples("topowatch_kernel_log_suppressed_total")
    assert (labels["source"], value) == ("kmsg", 37.0)


def test_an_efa_admin_command_that_never_completes_is_logged_and_acted_on(
    agents: list[Agent], tmp_path: Path
) -> None:
    """The simulated `efa-admin-timeout`: the driver's line (a warning, as efa_admin_cmd_timeout
    lines always were) and, from the counter, the fatal `efa_admin_queue`."""
    agent = make(agents, tmp_path)
    agent.poll()
    agent.node.inject(parse_faults(["efa-admin-timeout@rdmap16s27"])[0])
    [agent.poll() for _ in range(2)]
    report = agent.monitor.last
    assert report is not None
    found = {f.key: f for f in report.findings}
    assert found[("efa_admin_queue", "rdmap16s27")].actionable
    line = found[("kernel_efa_driver", "rdmap16s27")]
    assert (line.severity, line.action) == ("warning", "none")
    assert "Admin queue is closed" in line.evidence or "completion" in line.evidence
