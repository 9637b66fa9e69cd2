"""Bad input at every edge of the node agent: it says why (log + metric) and keeps serving.

Each test swaps one simulated source for the real production one pointed at something broken
(no NVML library, no kubelet socket, a slow kubelet, no API server, no sysfs) and checks that
the rest of the exposition is intact and the failure is counted under its reason.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from exporter.node.agent import NodeAgent
from exporter.node.poller import NodeSources, Poller
from exporter.sim.faults import parse_fault
from exporter.sources.kube import NodeLabelsWatcher, StaticNodeLabels
from exporter.sources.kubeapi import KubeApi
from exporter.sources.nvml import NvmlGpuSource
from exporter.sources.podresources import KubeletPodResources
from exporter.sources.podresources_pb import api_pb2_grpc
from healthcheck.detection.monitor import HealthMonitor
from tests.conftest import SimHarness, promtool_lint
from tests.node.test_node_agent import one, series
from tests.podresources_server import FakeKubelet, list_response, pod

Sim = Callable[..., SimHarness]


class ExplodingLabels:
    """A labels source with a bug in it: raises something no source is meant to."""

    def labels(self) -> dict[str, str]:
        raise RuntimeError("boom")

    def drain_errors(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def _poll_with(h: SimHarness, **replace: object) -> dict[str, list[tuple[dict[str, str], float]]]:
    for key, value in replace.items():
        setattr(h.sources, key, value)
    h.poll()
    _, exposition = h.poll()
    assert promtool_lint(exposition.text) == ""
    return series(exposition.text)


def test_no_nvml_library_keeps_the_other_collectors(sim: Sim) -> None:
    h = sim("p5.48xlarge")
    real_nvml = NvmlGpuSource()  # the real pynvml: this machine has no libnvidia-ml
    try:
        found = _poll_with(h, gpu=real_nvml)
    finally:
        real_nvml.close()
    assert one(found, "topowatch_nvml_up") == 0
    assert one(found, "topowatch_gpus") == 0
    assert "topowatch_gpu_up" not in found
    assert one(found, "topowatch_exporter_collector_success", collector="gpu") == 0
    assert (
        one(
            found,
            "topowatch_exporter_collector_errors_total",
            collector="gpu",
            reason="nvml_unavailable",
        )
        == 2
    )
    assert one(found, "topowatch_efa_devices") == 32
    assert one(found, "topowatch_exporter_collector_success", collector="efa") == 1


def test_missing_kubelet_socket_is_counted_and_gpus_still_exported(
    sim: Sim, tmp_path: Path
) -> None:
    h = sim("p5.48xlarge")
    pods = KubeletPodResources(str(tmp_path / "absent.sock"))
    found = _poll_with(h, pods=pods)
    assert len(found["topowatch_gpu_up"]) == 8
    assert all(lab["pod"] == "" for lab, _ in found["topowatch_gpu_up"])
    assert (
        one(
            found,
            "topowatch_exporter_collector_errors_total",
            collector="podresources",
            reason="unavailable",
        )
        == 2
    )
    assert one(found, "topowatch_exporter_collector_success", collector="podresources") == 0


def test_slow_kubelet_times_out_within_its_bound(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    deadlines: list[float | None] = []  # of every List call, which still goes to the kubelet
    real_stub = api_pb2_grpc.PodResourcesListerStub

    class RecordingStub:
        def __init__(self, channel: Any) -> None:
            self._stub = real_stub(channel)

        def List(self, request: Any, timeout: float | None = None, **kwargs: Any) -> Any:
            deadlines.append(timeout)
            return self._stub.List(request, timeout=timeout, **kwargs)

    monkeypatch.setattr(api_pb2_grpc, "PodResourcesListerStub", RecordingStub)
    h = sim("p5.48xlarge")
    with FakeKubelet(list_response(), delay_seconds=5.0) as kubelet:
        pods = KubeletPodResources(kubelet.socket_path, timeout_seconds=0.3)
        found = _poll_with(h, pods=pods)
        pods.close()
    # Two polls, each bounded by the 0.3 s timeout, not the 5 s delay: a call that waited the
    # delay out would have got the (empty) answer, not a timeout.
    assert deadlines == [0.3, 0.3]
    assert (
        one(
            found,
            "topowatch_exporter_collector_errors_total",
            collector="podresources",
            reason="timeout",
        )
        == 2
    )
    assert len(found["topowatch_gpu_power_watts"]) == 8


def test_pods_from_a_real_kubelet_grpc_server_label_the_gpu_series(sim: Sim) -> None:
    h = sim("p5.48xlarge")
    uuids = [h.node.nvml.uuid_of(i) for i in range(8)]
    response = list_response(
        pod("hyperpod-ns-vision", "vit-train-0", {"trainer": {"nvidia.com/gpu": uuids[:2]}}),
        pod(
            "hyperpod-ns-nlp",
            "llm-sft-3",
            {
                "main": {"nvidia.com/gpu": uuids[4:8], "vpc.amazonaws.com/efa": ["rdmap16s27"]},
                "sidecar": {},
            },
        ),
    )
    with FakeKubelet(response) as kubelet:
        pods = KubeletPodResources(kubelet.socket_path)
        found = _poll_with(h, pods=pods)
        pods.close()
    held = {
        lab["gpu"]: (lab["namespace"], lab["pod"], lab["container"])
        for lab, _ in found["topowatch_gpu_up"]
    }
    assert held["0"] == held["1"] == ("hyperpod-ns-vision", "vit-train-0", "trainer")
    assert held["2"] == held["3"] == ("", "", "")
    assert {held[str(i)] for i in range(4, 8)} == {("hyperpod-ns-nlp", "llm-sft-3", "main")}
    power = {lab["gpu"]: lab["pod"] for lab, _ in found["topowatch_gpu_power_watts"]}
    assert power["5"] == "llm-sft-3"  # every per-GPU family carries the pod, not just up


def test_kubelet_refusing_permission_is_counted(sim: Sim) -> None:
    h = sim("p5.48xlarge")
    with FakeKubelet(list_response(), abort_code=grpc.StatusCode.PERMISSION_DENIED) as kubelet:
        pods = KubeletPodResources(kubelet.socket_path)
        found = _poll_with(h, pods=pods)
        pods.close()
    assert (
        one(
            found,
            "topowatch_exporter_collector_errors_total",
            collector="podresources",
            reason="permission",
        )
        == 2
    )


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed when the with block ends: nothing listens


def test_unreachable_api_server_keeps_serving_with_empty_topology(sim: Sim) -> None:
    h = sim("p5.48xlarge")
    api = KubeApi(host=f"http://127.0.0.1:{_closed_port()}")
    watcher = NodeLabelsWatcher(
        "sim-node-1", api=api, refresh_seconds=0.05, initial_backoff_seconds=0.05
    )
    watcher.start()
    try:
        deadline = time.monotonic() + 10
        while watcher.errors_total == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        found = _poll_with(h, labels=watcher)
    finally:
        watcher.close()
    topo = found["topowatch_node_topology_info"]
    assert len(topo) == 1 and topo[0][0]["layer1"] == ""  # still joinable on node, just unlabelled
    assert (
        one(
            found,
            "topowatch_exporter_collector_errors_total",
            collector="topology",
            reason="unavailable",
        )
        >= 2
    )
    assert len(found["topowatch_gpu_up"]) == 8


def test_labels_kept_when_the_api_fails_after_a_good_read(sim: Sim) -> None:
    h = sim("p5.48xlarge")
    labels = StaticNodeLabels(dict(h.node.profile.topology_labels))
    found = _poll_with(h, labels=labels)
    assert found["topowatch_node_topology_info"][0][0]["layer3"].startswith("nn-")
    labels.set(
        {
            **dict(h.node.profile.topology_labels),
            "topology.k8s.aws/network-node-layer-3": "nn-moved",
        }
    )
    _, exposition = h.poll()
    assert series(exposition.text)["topowatch_node_topology_info"][0][0]["layer3"] == "nn-moved"


def test_missing_sysfs_and_proc_roots_are_survivable(sim: Sim, tmp_path: Path) -> None:
    h = sim("p5.48xlarge")
    found = _poll_with(h, sysfs_root=tmp_path / "no-sys", proc_root=tmp_path / "no-proc")
    assert one(found, "topowatch_efa_devices") == 0
    assert len(found["topowatch_gpu_up"]) == 8
    assert "topowatch_node_rootfs_read_only" not in found


def test_a_collector_that_raises_is_isolated_and_logged(sim: Sim, caplog: object) -> None:
    h = sim("p5.48xlarge")
    found = _poll_with(h, labels=ExplodingLabels())
    assert (
        one(
            found,
            "topowatch_exporter_collector_errors_total",
            collector="topology",
            reason="exception",
        )
        == 2
    )
    assert len(found["topowatch_gpu_up"]) == 8


def test_poller_rejects_unknown_compat_modes(sim: Sim) -> None:
    h = sim("p5.48xlarge")
    sources: NodeSources = h.sources
    try:
        Poller("n", sources, compat=frozenset({"dcgmx"}))
    except ValueError as e:
        assert "dcgmx" in str(e)
    else:
        raise AssertionError("unknown compat mode accepted")


def test_persistent_failures_are_logged_once_not_every_poll(
    sim: Sim, caplog: pytest.LogCaptureFixture
) -> None:
    h = sim("p5.48xlarge")
    real_nvml = NvmlGpuSource()
    h.sources.gpu, h.sources.labels = real_nvml, ExplodingLabels()
    caplog.set_level(logging.INFO, logger="exporter.node.poller")
    try:
        for _ in range(4):
            h.poll()
    finally:
        real_nvml.close()
    lines = [r for r in caplog.records if r.name == "exporter.node.poller"]
    failing = [r.getMessage() for r in lines if "failing" in r.getMessage()]
    assert len(failing) == 2, failing  # gpu and topology, once each
    assert not [r for r in lines if "recovered" in r.getMessage()]
    tracebacks = [r for r in lines if r.exc_info]
    assert len(tracebacks) == 1  # the unexpected exception, with its traceback, once


# ----- a hung NVML call (issue 28) -----------------------------------------------------------


def _watching_the_log(h: SimHarness) -> HealthMonitor:
    """The harness's node with its kernel log read, the health checks on, and an NVML source
    whose deadline is short (the agent's is 3 s; what matters is that there is one)."""
    h.sources.gpu.close()
    h.sources.gpu = NvmlGpuSource(
        h.node.nvml, clock=h.node.clock, wall_clock=h.node.clock, deadline=0.3
    )
    h.sources.kernel_log = h.node.kernel_log_source()
    monitor = HealthMonitor()
    h.poller = Poller("sim-node-1", h.sources, clock=lambda: h.now, health=monitor)
    return monitor


def _nvrm(h: SimHarness, gpu: int) -> str:
    return h.node.profile.gpus[gpu].sysfs_address.rsplit(".", 1)[0]  # NVRM drops the function


def test_a_hung_nvml_call_does_not_blind_the_kernel_log(sim: Sim) -> None:
    """nvml-hang@gpu3 blocks every NVML call on GPU 3 (as a wedged driver does). The poll
    still ends, the XID 79 the driver logged is read and is an actionable finding within two
    polls; GPU 3 is down with a timeout, the others are served as last read (marked stale),
    and the gpu collector fails `nvml_hung` each poll the call lasts."""
    h = sim("p5.48xlarge")
    monitor = _watching_the_log(h)
    h.poll()
    hang = parse_fault("nvml-hang@gpu3")
    h.node.nvml.inject(hang)
    try:
        snapshot, _ = h.poll()
        assert snapshot.gpu.hung is not None and "on GPU 3" in snapshot.gpu.hung
        h.node.kernel_log.write(
            f"NVRM: Xid (PCI:{_nvrm(h, 3)}): 79, pid=4242, name=python3, "
            "GPU has fallen off the bus.",
            priority=3,
        )
        acted = []
        for _ in range(2):
            snapshot, exposition = h.poll()
            report = monitor.last
            assert report is not None
            acted = [f for f in report.actionable if f.check == "xid" and f.component == "gpu3"]
            if acted:
                break
        assert acted and acted[0].action != "none", monitor.last
        assert "XID 79" in acted[0].evidence
        stuck = snapshot.gpu.gpus[3]
        assert not stuck.up and stuck.failure is not None and stuck.failure.kind == "timeout"
        assert all(g.up and g.stale_since is not None for g in snapshot.gpu.gpus if g.index != 3)
        found = series(exposition.text)
        assert one(found, "topowatch_gpu_up", gpu="3") == 0
        assert one(found, "topowatch_gpu_up", gpu="0") == 1
        assert "topowatch_gpu_power_watts" in found  # the last good values, still served
        errors = one(
            found, "topowatch_exporter_collector_errors_total", collector="gpu", reason="nvml_hung"
        )
        assert errors >= 2
        assert one(found, "topowatch_exporter_collector_success", collector="kernel_log") == 1
    finally:
        h.node.nvml.clear(hang)


def test_an_agent_started_on_a_hung_nvml_reads_the_kernel_log_first(sim: Sim) -> None:
    """A restarted agent whose first NVML call hangs: the kernel log is read before NVML is
    asked and every poll ends, so the driver's fallen-off-the-bus line is a finding (reboot) the
    first poll after it, although NVML never named the GPU: its PCI address is GPU 3's in the
    PCI bus's order, read from sysfs (issue 28). A fatal line is a fact, not a reading: it is
    actionable on that poll, under the default damping (3 of 5). The hang alone condemns
    nothing: each GPU is a timeout warning without action."""
    h = sim("p5.48xlarge", "nvml-hang@gpu3")
    monitor = _watching_the_log(h)
    try:
        snapshot, _ = h.poll()
        assert [c.name for c in snapshot.collectors][:2] == ["kernel_log", "gpu"]
        assert snapshot.gpu.hung is not None
        assert all(
            not g.up and g.failure and g.failure.kind == "timeout" for g in snapshot.gpu.gpus
        )
        address = h.node.profile.gpus[3].sysfs_address
        h.node.kernel_log.write(f"NVRM: GPU {address}: GPU has fallen off the bus.", priority=3)
        h.poll()
        report = monitor.last
        assert report is not None
        fallen = [f for f in report.findings if f.check == "kernel_gpu_fallen_off_bus"]
        assert [(f.component, f.severity, f.action) for f in fallen] == [
            ("gpu3", "fatal", "reboot")
        ]
        assert fallen[0].pci_bus_id == h.node.profile.gpus[3].pci_bus_id  # the physical GPU
        assert fallen[0] in report.actionable  # the first poll that read it
        timeouts = [f for f in report.findings if f.check == "gpu_timeout"]
        assert len(timeouts) == 8 and {f.action for f in timeouts} == {"none"}
    finally:
        h.node.nvml.clear(parse_fault("nvml-hang@gpu3"))


def test_an_xid_logged_while_nvml_hangs_from_the_start_is_judged(sim: Sim) -> None:
    """Issue 28: `NVRM: Xid (PCI:0000:97:00): 79, ...` read while NVML has hung since the
    agent started, so NVML never said which GPU is at 0000:97:00. The PCI bus in sysfs does (no
    NVML, no driver call): the fifth NVIDIA GPU in address order, GPU 4, as NVML numbers them.
    XID 79 is FATAL / RESTART_BM in NVIDIA's catalog: a reboot, actionable on the first poll,
    the finding carrying the GPU's PCI bus id for the remediation ladder to follow. Before,
    the line was only counted (`kind=xid`, no GPU) and nothing was judged."""
    h = sim("p5.48xlarge", "nvml-hang@gpu0")
    monitor = _watching_the_log(h)
    try:
        h.poll()
        gpu = h.node.profile.gpus[4]
        h.node.kernel_log.write(
            f"NVRM: Xid (PCI:{_nvrm(h, 4)}): 79, pid=4242, name=python3, GPU has fallen off"
            " the bus.",
            priority=3,
        )
        snapshot, _ = h.poll()
        assert snapshot.gpu.hung is not None
        assert all(not g.up and not g.pci_bus_id for g in snapshot.gpu.gpus)  # NVML named none
        assert [(e.gpu_index, e.xid) for e in snapshot.gpu.xid_events] == [(4, 79)]
        report = monitor.last
        assert report is not None
        [xid] = [f for f in report.findings if f.check == "xid"]
        assert (xid.component, xid.severity, xid.action) == ("gpu4", "fatal", "reboot")
        assert xid.actionable and xid.pci_bus_id == gpu.pci_bus_id and xid.uuid == ""
    finally:
        h.node.nvml.clear(parse_fault("nvml-hang@gpu0"))


def test_the_poll_loop_keeps_its_pace_while_nvml_hangs(sim: Sim) -> None:
    """The agent's own loop: polls keep coming while an NVML call hangs, so /healthz stays up
    (a wedged loop would fail the liveness probe, and the restarted agent hang again)."""
    h = sim("p5.48xlarge")
    _watching_the_log(h)
    hang = parse_fault("nvml-hang@gpu3")
    h.node.nvml.inject(hang)
    agent = NodeAgent(h.poller, interval=0.2)
    snapshots: list[Any] = []
    agent.on_snapshot = snapshots.append
    agent.start()
    try:
        deadline = time.monotonic() + 30.0
        while len(snapshots) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(snapshots) >= 4 and agent.healthy
        assert all(s.gpu.hung is not None for s in snapshots)
        assert h.node.nvml.hung_calls == 1  # one read blocked; none started beside it
    finally:
        agent.stop()
        h.node.nvml.clear(hang)
