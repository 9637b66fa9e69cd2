"""Issue 13, item 1: deployment faults are not hardware faults.

NVML's failures are judged by what their return code means. Each row cites nvml.h's own
description of the code (`nvmlReturn_t`, NVIDIA/go-nvml gen/nvml/nvml.h; nvmlInit_v2's
documented returns for the init cases):

  LIBRARY_NOT_FOUND   "NVML Shared Library couldn't be found or loaded"          deployment
  NO_PERMISSION       "The current user does not have permission for operation"  deployment
                      (nvmlInit_v2: "if NVML does not have permission to talk to the driver")
  OPERATING_SYSTEM    "The GPU control device has been blocked by the operating
                      system/cgroups"                                            deployment
  DRIVER_NOT_LOADED   "NVIDIA driver is not loaded"     deployment, before NVML ever worked and
                                                        after: unloaded under a running agent is
                                                        an upgrade, not a GPU failing (issue 28)
  LIB_RM_VERSION_MISMATCH "RM detects a driver/library version mismatch"    deployment (the
                      driver was upgraded under the library the agent loaded: restart the agent)
  GPU_IS_LOST         "The GPU has fallen off the bus or has otherwise become
                      inaccessible"                                              hardware
  RESET_REQUIRED      "The GPU requires a reset before it can be used again"     reset
  TIMEOUT             "User provided timeout passed"    retried; hardware only when it persists
                                                        (K of N polls) and other evidence agrees

Three levels: the GPU source's classification over the simulated library failing the way the
real one does, the checks' verdict on each class, and the node agent end to end (findings,
`topowatch_node_agent_deployment_error`, /readyz), through the CLI too.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from exporter.core.snapshot import (
    GpuInventory,
    GpuReading,
    NodeSnapshot,
    NvmlFailure,
    XidEvent,
)
from exporter.node.agent import NodeAgent
from exporter.node.serving import MetricsServer
from exporter.sim.faults import parse_fault, parse_faults
from exporter.sim.hardware.nvml import SimulatedNvml
from exporter.sim.hardware.profiles import get_profile
from exporter.sources.nvml import NvmlGpuSource
from healthcheck.detection.checks import History, run_checks
from healthcheck.detection.checks.xid_memory import XidMemory, remember
from healthcheck.detection.config import (
    ConfigError,
    HealthConfig,
    XidConfig,
    config_from_mapping,
)
from healthcheck.detection.monitor import HealthMonitor, HealthReport
from tests.cli.test_cli import topowatch
from tests.conftest import SimHarness, healthy_snapshot, promtool_lint
from tests.node.test_node_agent import one, series

Sim = Callable[..., SimHarness]
E = pynvml  # the codes' numbers come from the bindings, their names from nvml.h


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def source(**sim: Any) -> tuple[SimulatedNvml, NvmlGpuSource]:
    clock = FakeClock()
    nvml = SimulatedNvml(get_profile("p5.48xlarge"), seed=7, clock=clock, **sim)
    return nvml, NvmlGpuSource(nvml, clock=clock)


# ----- the source: what each code means ------------------------------------------------------

# nvmlInit failing before NVML ever worked since the agent started: whatever the code, nothing
# is known about the hardware; the agent's pod (library, device files, driver) is wrong.
INIT_NEVER_WORKED = [
    ("LIBRARY_NOT_FOUND", "deployment", "library_not_found"),
    ("NO_PERMISSION", "deployment", "no_permission"),
    ("OPERATING_SYSTEM", "deployment", "operating_system"),
    ("DRIVER_NOT_LOADED", "deployment", "driver_not_loaded"),
    ("LIB_RM_VERSION_MISMATCH", "deployment", "lib_rm_version_mismatch"),
    ("UNKNOWN", "deployment", "unknown"),
]

# The same codes when NVML is initialised again after it had worked: a library or permission
# problem is still the pod's, and so is a driver unloaded or upgraded under the running agent
# (issue 28: it was classed hardware, which asked for a reboot of a node whose GPUs were fine);
# a code that says nothing (UNKNOWN) after NVML worked is still the node's.
INIT_AFTER_WORKING = [
    ("LIBRARY_NOT_FOUND", "deployment"),
    ("NO_PERMISSION", "deployment"),
    ("OPERATING_SYSTEM", "deployment"),
    ("DRIVER_NOT_LOADED", "deployment"),
    ("LIB_RM_VERSION_MISMATCH", "deployment"),
    ("UNKNOWN", "hardware"),
]


@pytest.mark.parametrize(("name", "kind", "reason"), INIT_NEVER_WORKED)
def test_init_failure_before_nvml_ever_worked(name: str, kind: str, reason: str) -> None:
    code = getattr(E, f"NVML_ERROR_{name}")
    _, src = source(init_error=code)
    inv = src.read()
    assert not inv.available and inv.failure is not None
    assert (inv.failure.code, inv.failure.name, inv.failure.kind) == (
        code,
        f"NVML_ERROR_{name}",
        kind,
    )
    assert inv.failure.reason == reason
    assert [r for r, _ in inv.deployment_errors()] == [reason]


@pytest.mark.parametrize(("name", "kind"), INIT_AFTER_WORKING)
def test_init_failure_after_nvml_had_worked(name: str, kind: str) -> None:
    nvml, src = source()
    assert src.read().available
    nvml.init_error = getattr(E, f"NVML_ERROR_{name}")
    nvml.nvmlShutdown()  # torn down under the source: the next call fails UNINITIALIZED
    lost = src.read()
    assert lost.failure is not None and lost.failure.kind == "hardware", lost
    again = src.read()  # re-initialised at once, and that fails with the code
    assert again.failure is not None and again.failure.name == f"NVML_ERROR_{name}"
    assert again.failure.kind == kind


def test_a_broken_library_without_an_nvml_code_is_deployment_until_nvml_worked() -> None:
    nvml, src = source()

    def broken(flags: int = 0) -> None:
        raise OSError("libnvidia-ml.so.1: invalid ELF header")

    nvml.nvmlInitWithFlags = broken  # type: ignore[method-assign]
    inv = src.read()
    assert inv.failure == NvmlFailure(None, "OSError", "deployment")
    assert inv.failure.reason == "agent_error"


@pytest.mark.parametrize(
    ("fault", "name", "kind"),
    [
        ("gpu-lost@gpu2", "NVML_ERROR_GPU_IS_LOST", "hardware"),
        ("gpu-reset-required@gpu2", "NVML_ERROR_RESET_REQUIRED", "reset"),
        ("nvml-timeout@gpu2", "NVML_ERROR_TIMEOUT", "timeout"),
    ],
)
def test_a_gpu_failing_as_a_whole_keeps_its_code(fault: str, name: str, kind: str) -> None:
    for injected_later in (False, True):
        nvml, src = source(faults=() if injected_later else parse_faults([fault]))
        if injected_later:  # readable first, then failing: the same meaning
            assert all(g.up for g in src.read().gpus)
            nvml.inject(parse_fault(fault))
        inv = src.read()
        assert inv.available and inv.failure is None
        down = [g for g in inv.gpus if not g.up]
        assert [g.index for g in down] == [2]
        failure = down[0].failure
        assert failure is not None and (failure.name, failure.kind) == (name, kind)
        assert failure.code == getattr(E, name)
        assert all(g.failure is None for g in inv.gpus if g.up)


class _DeniedGpu(SimulatedNvml):
    """The device file of one GPU is not the agent's to open (nvmlDeviceGetHandleByIndex_v2:
    "NVML_ERROR_NO_PERMISSION if the user doesn't have permission to talk to this device")."""

    denied = 3

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if index == self.denied:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        return super().nvmlDeviceGetHandleByIndex(index)


def test_one_gpu_the_agent_may_not_open_is_a_deployment_fault() -> None:
    clock = FakeClock()
    src = NvmlGpuSource(_DeniedGpu(get_profile("p5.48xlarge"), clock=clock), clock=clock)
    inv = src.read()
    assert inv.available
    gpu3 = inv.gpus[3]
    assert not gpu3.up and gpu3.failure is not None and gpu3.failure.kind == "deployment"
    assert [r for r, _ in inv.deployment_errors()] == ["no_permission"]


def test_deployment_faults_injected_at_run_time_bite_at_the_next_init() -> None:
    """The real library stays loaded and the device files open once NVML works: taking either
    away later changes nothing until NVML is initialised again."""
    nvml, src = source()
    assert src.read().available
    nvml.inject(parse_fault("nvml-library-missing"))
    assert src.read().available
    nvml.nvmlShutdown()
    src.read()  # lost; re-initialised on the next read
    inv = src.read()
    assert inv.failure is not None and inv.failure.name == "NVML_ERROR_LIBRARY_NOT_FOUND"
    assert inv.failure.kind == "deployment"  # never hardware, even after NVML had worked


# ----- the checks: what each class asks for ----------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> NodeSnapshot:
    return healthy_snapshot("p5.48xlarge", tmp_path_factory.mktemp("base"))


def failure(name: str, kind: str) -> NvmlFailure:
    return NvmlFailure(getattr(E, f"NVML_ERROR_{name}"), f"NVML_ERROR_{name}", kind)


def nvml_down(base: NodeSnapshot, f: NvmlFailure | None) -> NodeSnapshot:
    return dataclasses.replace(
        base, gpu=GpuInventory(available=False, error="NVML failed", failure=f)
    )


def gpu_down(base: NodeSnapshot, index: int, f: NvmlFailure) -> NodeSnapshot:
    gpus = tuple(
        GpuReading(g.index, g.uuid, g.pci_bus_id, g.model, up=False, error="x", failure=f)
        if g.index == index
        else g
        for g in base.gpu.gpus
    )
    return dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, gpus=gpus))


def verdicts(
    snapshot: NodeSnapshot, history: History | None = None, **config: Any
) -> set[tuple[str, str, str, str]]:
    found = run_checks(snapshot, history or History(), config_from_mapping(config), 0.0)
    return {
        (f.check, f.component, f.severity, f.action)
        for f in found
        if f.check not in ("numa_misplaced",)
    }


# snapshot builder -> the findings it must give (and nothing else from inventory)
CHECK_ROWS: list[tuple[str, Callable[[NodeSnapshot], NodeSnapshot], set[Any]]] = [
    (
        "library not found",
        lambda b: nvml_down(b, failure("LIBRARY_NOT_FOUND", "deployment")),
        {("deployment", "node", "warning", "none")},
    ),
    (
        "no permission",
        lambda b: nvml_down(b, failure("NO_PERMISSION", "deployment")),
        {("deployment", "node", "warning", "none")},
    ),
    (
        "driver never loaded since start",
        lambda b: nvml_down(b, failure("DRIVER_NOT_LOADED", "deployment")),
        {("deployment", "node", "warning", "none")},
    ),
    (
        "driver unloaded or upgraded after NVML worked (the source classes it deployment)",
        lambda b: nvml_down(b, failure("DRIVER_NOT_LOADED", "deployment")),
        {("deployment", "node", "warning", "none")},
    ),
    (
        "NVML failing with another code after it worked",
        lambda b: nvml_down(b, failure("UNKNOWN", "hardware")),
        {("nvml_down", "node", "critical", "reboot")},
    ),
    (
        "no NVML code after NVML worked",
        lambda b: nvml_down(b, NvmlFailure(None, "KeyError", "unknown")),
        {("nvml_down", "node", "warning", "none")},
    ),
    (
        "GPU fell off the bus",
        lambda b: gpu_down(b, 2, failure("GPU_IS_LOST", "hardware")),
        {("gpu_missing", "gpu2", "critical", "replace")},
    ),
    (
        "GPU needs a reset",
        lambda b: gpu_down(b, 2, failure("RESET_REQUIRED", "reset")),
        {("gpu_reset_required", "gpu2", "critical", "reboot")},
    ),
    (
        "GPU times out, nothing else says so",
        lambda b: gpu_down(b, 2, failure("TIMEOUT", "timeout")),
        {("gpu_timeout", "gpu2", "warning", "none")},
    ),
    (
        "one GPU the agent may not open",
        lambda b: gpu_down(b, 2, failure("NO_PERMISSION", "deployment")),
        {("deployment", "gpu2", "warning", "none")},
    ),
]


@pytest.mark.parametrize(("case", "build", "expected"), CHECK_ROWS, ids=[r[0] for r in CHECK_ROWS])
def test_each_class_gets_its_finding(
    base: NodeSnapshot,
    case: str,
    build: Callable[[NodeSnapshot], NodeSnapshot],
    expected: set[Any],
) -> None:
    assert verdicts(build(base)) == expected


def test_deployment_is_reported_even_where_the_instance_type_is_unknown(
    base: NodeSnapshot,
) -> None:
    """Nothing to judge about hardware there, but the agent is still deployed wrong."""
    down = nvml_down(base, failure("NO_PERMISSION", "deployment"))
    cpu = dataclasses.replace(down, topology=dataclasses.replace(down.topology, labels={}))
    assert verdicts(cpu) == {("deployment", "node", "warning", "none")}
    gone = dataclasses.replace(cpu, gpu=nvml_down(base, failure("UNKNOWN", "hardware")).gpu)
    assert verdicts(gone) == set()  # no GPU expected, none seen: no evidence of missing hardware


def test_reset_and_timeout_actions_are_configurable(base: NodeSnapshot) -> None:
    reset = gpu_down(base, 2, failure("RESET_REQUIRED", "reset"))
    assert verdicts(reset, nvml={"reset_action": "replace"}) == {
        ("gpu_reset_required", "gpu2", "critical", "replace")
    }
    timeout = gpu_down(base, 2, failure("TIMEOUT", "timeout"))
    assert verdicts(timeout, nvml={"timeout_needs_evidence": False}) == {
        ("gpu_timeout", "gpu2", "critical", "reboot")
    }
    with pytest.raises(ConfigError, match=r"nvml\.reset_action"):
        config_from_mapping({"nvml": {"reset_action": "melt"}})


def test_a_timeout_the_kernel_confirms_is_hardware(base: NodeSnapshot) -> None:
    timeout = gpu_down(base, 2, failure("TIMEOUT", "timeout"))
    events = [XidEvent(gpu_index=2, uuid=base.gpu.gpus[2].uuid, xid=119, timestamp=0.0)]
    said = remember(XidMemory(), events, {}, XidConfig(), 0.0)
    assert ("gpu_timeout", "gpu2", "critical", "reboot") in verdicts(timeout, History(xids=said))
    # an application's XID on that GPU is the job's, not evidence against the GPU
    app = [XidEvent(gpu_index=2, uuid=base.gpu.gpus[2].uuid, xid=13, timestamp=0.0)]
    quiet = remember(XidMemory(), app, {}, XidConfig(), 0.0)
    assert ("gpu_timeout", "gpu2", "warning", "none") in verdicts(timeout, History(xids=quiet))
    # nor is an XID on another GPU
    other = [XidEvent(gpu_index=5, uuid=base.gpu.gpus[5].uuid, xid=119, timestamp=0.0)]
    elsewhere = remember(XidMemory(), other, {}, XidConfig(), 0.0)
    assert ("gpu_timeout", "gpu2", "warning", "none") in verdicts(timeout, History(xids=elsewhere))


def test_a_timeout_after_other_errors_on_the_gpu_is_hardware(base: NodeSnapshot) -> None:
    timeout = gpu_down(base, 2, failure("TIMEOUT", "timeout"))
    erring = dataclasses.replace(
        base,
        gpu=dataclasses.replace(
            base.gpu,
            gpus=tuple(
                dataclasses.replace(g, error="field 94/0: Unknown Error") if g.index == 2 else g
                for g in base.gpu.gpus
            ),
        ),
    )
    assert ("gpu_timeout", "gpu2", "critical", "reboot") in verdicts(
        timeout, History(previous=erring)
    )
    assert ("gpu_timeout", "gpu2", "warning", "none") in verdicts(timeout, History(previous=base))


def monitor_run(monitor: HealthMonitor, snapshots: list[NodeSnapshot]) -> list[HealthReport]:
    return [
        monitor.observe(dataclasses.replace(s, taken_at=1_750_000_000.0 + 5 * i))
        for i, s in enumerate(snapshots)
    ]


def test_timeouts_act_only_when_they_persist_and_evidence_agrees(base: NodeSnapshot) -> None:
    timeout = gpu_down(base, 2, failure("TIMEOUT", "timeout"))
    key = ("gpu_timeout", "gpu2")

    # Alone, however long it lasts: reported, never acted on.
    reports = monitor_run(HealthMonitor(), [timeout] * 10)
    assert not any(r.actionable for r in reports)

    # The kernel agrees (XID 119, GSP RPC timeout, on that GPU): actionable once the timeouts
    # held K of N polls (3 of 5 by default), not on the first.
    xid = XidEvent(gpu_index=2, uuid=base.gpu.gpus[2].uuid, xid=119, timestamp=1_750_000_000.0)
    first = dataclasses.replace(timeout, gpu=dataclasses.replace(timeout.gpu, xid_events=(xid,)))
    reports = monitor_run(HealthMonitor(), [first, timeout, timeout, timeout])
    acted = [any(f.key == key for f in r.actionable) for r in reports]
    assert acted == [False, False, True, True]

    # A timeout that clears (retried next poll) never builds up to K.
    flapping = [first, base, timeout, base, base, timeout, base]
    reports = monitor_run(HealthMonitor(), flapping)
    assert not any(f.key == key for r in reports for f in r.actionable)


def test_a_driver_unloaded_before_or_after_nvml_worked_is_never_a_reboot(sim: Sim) -> None:
    """The same DRIVER_NOT_LOADED through the whole agent: a node that boots without it gets a
    deployment warning, and so does a driver unloaded under the running agent (an upgrade, the
    GPU operator's driver container): before issue 28 that asked for a reboot. NVML failing
    after it worked with a code that names no deployment cause still does."""
    h = sim("p5.48xlarge")
    h.sources.gpu.close()  # a source on the simulated clock, so its init retry can be passed
    h.sources.gpu = NvmlGpuSource(h.node.nvml, clock=lambda: h.now)
    h.node.nvml.init_error = E.NVML_ERROR_DRIVER_NOT_LOADED
    monitor = HealthMonitor()
    for _ in range(5):
        snapshot, _ = h.poll()
        report = monitor.observe(snapshot)
    assert [(f.check, f.component, f.action) for f in report.findings] == [
        ("deployment", "node", "none")
    ]
    h.node.nvml.init_error = None
    h.now += 120.0  # past the init retry: the driver is there now
    snapshot, _ = h.poll()
    assert snapshot.gpu.available
    monitor.observe(snapshot)
    h.node.nvml.init_error = E.NVML_ERROR_DRIVER_NOT_LOADED
    h.node.nvml.nvmlShutdown()  # the driver goes away under the running agent
    for _ in range(4):
        snapshot, _ = h.poll()
        report = monitor.observe(snapshot)
    assert snapshot.gpu.failure is not None
    assert snapshot.gpu.failure.name == "NVML_ERROR_DRIVER_NOT_LOADED"
    assert snapshot.gpu.failure.kind == "deployment"
    found = {f.key: f for f in report.findings}
    assert ("nvml_down", "node") not in found and report.actionable == ()
    assert (found[("deployment", "node")].severity, found[("deployment", "node")].action) == (
        "warning",
        "none",
    )
    h.node.nvml.init_error = E.NVML_ERROR_UNKNOWN  # now something that is not a deployment
    h.now += 120.0
    for _ in range(4):
        snapshot, _ = h.poll()
        report = monitor.observe(snapshot)
    down = {f.key: f for f in report.findings}[("nvml_down", "node")]
    assert (down.severity, down.action, down.actionable) == ("critical", "reboot", True)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("driver-unloaded", "driver_not_loaded"), ("driver-upgraded", "lib_rm_version_mismatch")],
)
def test_a_driver_unloaded_or_upgraded_under_the_agent_is_a_deployment_finding(
    sim: Sim, fault: str, reason: str
) -> None:
    """The simulated driver goes away (or is replaced by another version) under a running
    agent: every NVML call fails, NVML is initialised again and that fails too. The agent says
    how it is deployed (`deployment`, `topowatch_node_agent_deployment_error{reason}`) and asks
    for nothing: the GPUs did not fail, a reboot would only hide the upgrade."""
    h = sim("p5.48xlarge")
    h.sources.gpu.close()
    h.sources.gpu = NvmlGpuSource(h.node.nvml, clock=lambda: h.now)
    monitor = HealthMonitor()
    for _ in range(2):
        snapshot, _ = h.poll()
        monitor.observe(snapshot)
    assert snapshot.gpu.available
    h.node.inject(parse_faults([fault])[0])
    for _ in range(5):
        snapshot, exposition = h.poll(30.0)
        report = monitor.observe(snapshot)
    assert not snapshot.gpu.available and snapshot.gpu.failure is not None
    assert snapshot.gpu.failure.kind == "deployment", snapshot.gpu.failure
    assert report.actionable == ()
    assert [(f.check, f.action) for f in report.findings if f.component == "node"] == [
        ("deployment", "none")
    ]
    assert [r for r, _ in snapshot.gpu.deployment_errors()] == [reason]
    text = exposition.text.decode()
    assert f'topowatch_node_agent_deployment_error{{node="sim-node-1",reason="{reason}"}} 1' in text


def test_a_gpu_that_was_readable_and_is_now_lost_is_hardware(sim: Sim) -> None:
    h = sim("p5.48xlarge")
    monitor = HealthMonitor()
    for _ in range(2):
        snapshot, _ = h.poll()
        monitor.observe(snapshot)
    h.node.inject(parse_fault("gpu-lost@gpu4"))
    for _ in range(3):
        snapshot, _ = h.poll()
        report = monitor.observe(snapshot)
    lost = {f.key: f for f in report.findings}[("gpu_missing", "gpu4")]
    assert (lost.severity, lost.action, lost.actionable) == ("critical", "replace", True)


# ----- the node agent: finding, metric, readiness ----------------------------------------------

DEPLOYMENT_FAULTS = [
    ("nvml-library-missing", "library_not_found"),
    ("nvml-no-permission", "no_permission"),
]


def readyz(agent: NodeAgent) -> tuple[int, str]:
    server = MetricsServer(agent, "127.0.0.1", 0)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        body = response.read().decode()
        conn.close()
        return response.status, body
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def agent_for(sim: Sim) -> Iterator[Callable[..., tuple[NodeAgent, HealthMonitor]]]:
    def make(*faults: str) -> tuple[NodeAgent, HealthMonitor]:
        h = sim("p5.48xlarge", *faults)
        monitor = HealthMonitor()
        h.poller.health = monitor
        return NodeAgent(h.poller, interval=5), monitor

    yield make


@pytest.mark.parametrize(("fault", "reason"), DEPLOYMENT_FAULTS)
def test_deployment_fault_is_a_finding_a_metric_and_a_readiness_failure(
    agent_for: Callable[..., tuple[NodeAgent, HealthMonitor]], fault: str, reason: str
) -> None:
    agent, monitor = agent_for(fault)
    for _ in range(5):
        agent.poll_once()
    assert monitor.last is not None
    assert [(f.check, f.component, f.severity, f.action) for f in monitor.last.findings] == [
        ("deployment", "node", "warning", "none")
    ]
    assert monitor.last.healthy  # nothing actionable: the Node condition stays True
    found = series(agent.current.text)
    assert one(found, "topowatch_node_agent_deployment_error", node="sim-node-1") == 1
    assert [lab["reason"] for lab, _ in found["topowatch_node_agent_deployment_error"]] == [reason]
    assert promtool_lint(agent.current.text) == ""
    status, body = readyz(agent)
    assert status == 503 and f"reason={reason}" in body and "not the node" in body
    assert not agent.ready and agent.not_ready_reason is not None


@pytest.mark.parametrize(
    ("fault", "check"),
    [("gpu-reset-required@gpu2", "gpu_reset_required"), ("nvml-timeout@gpu2", "gpu_timeout")],
)
def test_gpu_faults_are_findings_not_readiness_failures(
    agent_for: Callable[..., tuple[NodeAgent, HealthMonitor]], fault: str, check: str
) -> None:
    agent, monitor = agent_for(fault)
    agent.poll_once()
    agent.poll_once()
    assert monitor.last is not None
    assert (check, "gpu2") in {f.key for f in monitor.last.findings}
    assert "topowatch_node_agent_deployment_error" not in series(agent.current.text)
    assert readyz(agent) == (200, "ready\n")


def test_readiness_waits_for_the_first_poll_and_then_follows_the_deployment(
    agent_for: Callable[..., tuple[NodeAgent, HealthMonitor]],
) -> None:
    agent, _ = agent_for()
    assert readyz(agent) == (503, "no poll yet\n")
    agent.poll_once()
    assert readyz(agent) == (200, "ready\n")


@pytest.mark.parametrize(("fault", "reason"), DEPLOYMENT_FAULTS)
def test_cli_once_shows_the_deployment_fault(fault: str, reason: str, tmp_path: Path) -> None:
    proc = topowatch("node", "--simulate", "p5.48xlarge", "--once", "--fault", fault)
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout
    assert (
        f'topowatch_node_agent_deployment_error{{node="cli-node",reason="{reason}"}} 1'.encode()
        in out
    )
    assert b'check="deployment",component="node",severity="warning",action="none"' in out
    assert b'check="nvml_down"' not in out and b'action="reboot"' not in out
    assert b'topowatch_health_node_healthy{node="cli-node"} 1' in out
    assert promtool_lint(out) == ""


def test_cli_once_shows_reset_required_and_timeout() -> None:
    proc = topowatch(
        "node",
        "--simulate",
        "p5.48xlarge",
        "--once",
        "--fault",
        "gpu-reset-required@gpu2",
        "--fault",
        "nvml-timeout@gpu5",
    )
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout
    assert b'check="gpu_reset_required",component="gpu2",severity="critical"' in out
    assert b'check="gpu_timeout",component="gpu5",severity="warning",action="none"' in out
    assert b"topowatch_node_agent_deployment_error" not in out
    assert promtool_lint(out) == ""


def test_fault_grammar_for_the_nvml_faults() -> None:
    assert str(parse_fault("nvml-library-missing")) == "nvml-library-missing"
    assert str(parse_fault("node=n1:nvml-no-permission")) == "node=n1:nvml-no-permission"
    assert parse_fault("nvml-timeout@gpu5").gpu == 5
    assert parse_fault("gpu-reset-required@gpu2").gpu == 2
    with pytest.raises(ValueError, match="takes no target"):
        parse_fault("nvml-library-missing@gpu0")
    with pytest.raises(ValueError, match="gpuN"):
        parse_fault("nvml-timeout@link3")
    assert HealthConfig().nvml.timeout_needs_evidence


# ----- end to end: agents -> API server -> informers -> controller in act mode -----------------

HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"


def test_controller_in_act_mode_never_acts_on_deployment_faults(tmp_path: Path) -> None:
    """Five simulated p5 nodes, each agent reporting to the simulated API server; the cluster
    service's informers feed the remediation controller (hyperpod provider, `mode: act`).
    The node whose GPU needs a reset is acted on (with something short of replacement: a reboot
    today, a reset once the action ladder has one); the library-missing, no-permission and
    timing-out nodes report their findings and are left alone, as is the healthy one."""
    from exporter.cluster.run import build_controller, kube_api_client
    from exporter.sim.cluster import ClusterShape
    from exporter.sim.environment import NodeAgentFleet, SimulatedEnvironment
    from tests.cluster.test_cluster_service import RunningService, eventually

    shape = ClusterShape(
        p5_nodes=5, ultraserver_nodes=0, teams=("a",), arrivals_per_minute=0.0, initial_workloads=0
    )
    env = SimulatedEnvironment(seed=0, shape=shape).start()
    names = [n.name for n in env.cluster.nodes()[:5]]
    missing, denied, reset, slow, healthy = names
    fleet = NodeAgentFleet(
        env,
        interval=0.2,
        faults=parse_faults(
            [
                f"node={missing}:nvml-library-missing",
                f"node={denied}:nvml-no-permission",
                f"node={reset}:gpu-reset-required@gpu1",
                f"node={slow}:nvml-timeout@gpu6",
            ]
        ),
        report_url=env.url,
    )
    config = tmp_path / "remediation.yaml"
    config.write_text("mode: act\nproviders: [hyperpod]\n")
    controller, _ = build_controller(config, kube_api_client(env.url))
    running: RunningService | None = None

    def node(name: str) -> dict[str, Any]:
        obj = env.store.get("nodes", "", name)
        assert obj is not None
        return obj

    def findings(name: str) -> list[dict[str, Any]]:
        text = node(name)["metadata"].get("annotations", {}).get("topowatch.io/findings")
        return list(json.loads(text)) if text else []

    try:
        fleet.start()
        running = RunningService(env.url, controller=controller)
        agents = {a.name: a for a in fleet.agents}

        def condition(name: str) -> str | None:
            for c in node(name).get("status", {}).get("conditions", []):
                if c.get("type") == "TopowatchHealthy":
                    return str(c.get("status"))
            return None

        # every agent has found its fault, and reported to its Node (the annotation carries
        # the actionable findings only: none for deployment faults or a lone timeout)
        for name, check in ((missing, "deployment"), (denied, "deployment"), (slow, "gpu_timeout")):
            monitor = agents[name].monitor
            assert monitor is not None
            eventually(
                lambda m=monitor, c=check: (
                    m.last is not None and any(f.check == c for f in m.last.findings)
                ),
                timeout=20,
                what=f"{check} found on {name}",
            )
            eventually(lambda n=name: condition(n) == "True", timeout=20, what=f"{name} reported")
            assert findings(name) == []
        for name in (missing, denied):
            monitor = agents[name].monitor
            assert monitor is not None and monitor.last is not None
            assert [(f.check, f.component, f.action) for f in monitor.last.findings] == [
                ("deployment", "node", "none")
            ]
        # the reset-required GPU is acted on, short of replacing the node
        label = eventually(
            lambda: (
                node(reset)["metadata"]["labels"].get(HEALTH_LABEL) not in (None, "Schedulable")
                and node(reset)["metadata"]["labels"][HEALTH_LABEL]
            ),
            timeout=20,
            what="an action on the reset-required node",
        )
        assert label != "UnschedulablePendingReplacement"
        state = json.loads(node(reset)["metadata"]["annotations"]["topowatch.io/remediation"])
        assert state["action"] not in ("none", "replace")
        reported = {f["check"]: f for f in findings(reset)}
        assert reported["gpu_reset_required"]["actionable"]
        # ...and, the controller having had every node in hand meanwhile, nothing else
        eventually(
            lambda: b"topowatch_remediation_decisions_total" in running.get("/metrics")[1],
            what="the controller's decisions",
        )
        time.sleep(1.0)
        for name in (missing, denied, slow, healthy):
            obj = node(name)
            assert obj["metadata"]["labels"][HEALTH_LABEL] == "Schedulable", name
            assert "topowatch.io/remediation" not in obj["metadata"].get("annotations", {}), name
            assert condition(name) in (None, "True"), name
        # the deployment-broken agents say so on /readyz; the others are ready, sick GPU or not
        for name in names:
            conn = http.client.HTTPConnection("127.0.0.1", agents[name].server.port, timeout=5)
            conn.request("GET", "/readyz")
            response = conn.getresponse()
            body = response.read().decode()
            conn.close()
            if name in (missing, denied):
                assert response.status == 503 and "deployment error" in body, (name, body)
            else:
                assert (response.status, body) == (200, "ready\n"), name
    finally:
        if running is not None:
            running.stop()
        fleet.close()
        env.stop()
