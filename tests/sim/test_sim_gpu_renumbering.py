"""A GPU that fell off the bus and did not come back: the simulator renumbers the others, as NVML
does, and the remediation ladder follows the physical GPU through it (issue 28).

Rules the rows rest on:
- NVML's index is the enumeration order of the GPUs the driver probed, not an identity:
  "The order in which NVML enumerates devices has no guarantees of consistency between
  reboots. For that reason it is recommended that devices be looked up by their PCI ids or
  UUID" (nvml.h, nvmlDeviceGetHandleByIndex); valid indices run from 0 to the count less one
  (nvmlDeviceGetCount), so a node that boots without one GPU numbers the GPUs after it one
  lower.
- XID 79, "GPU has fallen off the bus", is FATAL / RESTART_BM in NVIDIA's XID catalog: a
  reboot first; the remediation ladder replaces the node when the same GPU fails so again, and
  a GPU missing after the reboot for it is that GPU not coming back
  (healthcheck/remediation/policy.py `climb`).
- A GPU gone from the bus at boot is absent from /sys/bus/pci/devices: the kernel enumerated no
  function at its address.

The node agent and the remediation controller are the production ones; the hardware is the
simulated p5 (exporter/sim/hardware), its `gpu-gone` fault a node booted without that GPU.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from exporter.node.poller import Poller
from exporter.sim.faults import parse_fault, parse_faults
from exporter.sim.hardware.node import SimulatedNode
from exporter.sim.hardware.nvml import SimulatedNvml
from exporter.sim.hardware.profiles import get_profile
from exporter.sources.pci_gpus import read_nvidia_gpus
from healthcheck.detection.monitor import HealthMonitor
from tests.remediation.test_late_signals import booted, run, setup
from tests.remediation.test_remediation_controller import T0, node

P5 = get_profile("p5.48xlarge")


def test_a_gpu_gone_at_boot_shifts_the_gpus_after_it(tmp_path: Path) -> None:
    """gpu-gone@gpu2: NVML counts 7; its index 2 is the GPU of slot 3, with that GPU's UUID and
    PCI address; the last index is 6. sysfs lists no device at GPU 2's address, and the
    kubelet's device plugin offers the 7 GPUs there are."""
    sim = SimulatedNode(P5, parse_faults(["gpu-gone@gpu2"]), root=tmp_path / "sim", start=T0)
    try:
        nvml = sim.nvml
        nvml.nvmlInit()
        assert nvml.nvmlDeviceGetCount() == 7
        found = []
        for index in range(7):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            found.append((nvml.nvmlDeviceGetUUID(handle), nvml.nvmlDeviceGetPciInfo(handle)))
        slots = [0, 1, 3, 4, 5, 6, 7]
        assert [uuid for uuid, _ in found] == [nvml.uuid_of(s) for s in slots]
        assert [str(pci.busId) for _, pci in found] == [P5.gpus[s].pci_bus_id for s in slots]
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            nvml.nvmlDeviceGetHandleByIndex(7)
        assert [nvml.nvml_index_of(s) for s in (1, 2, 3, 7)] == [1, None, 2, 6]
        nvml.nvmlShutdown()

        present = read_nvidia_gpus(sim.sysfs.sysfs_root)
        assert P5.gpus[2].sysfs_address not in present and len(present) == 7
        assert present == tuple(P5.gpus[s].sysfs_address for s in slots)  # NVML's order
        assert nvml.uuid_of(2) not in sim.pods.gpu_assignments()
        assert not (sim.sysfs.sysfs_root / "bus/pci/devices" / P5.gpus[2].sysfs_address).exists()
    finally:
        sim.close()


def test_a_gpu_lost_while_the_driver_runs_keeps_its_index_until_the_driver_probes_again() -> None:
    """Injected at run time the GPU is lost (GPU_IS_LOST on every call) but still counted: the
    driver enumerated it at load. Once the driver is loaded again (driver-unloaded cleared) it
    probes the bus afresh, and the GPU is gone from the enumeration."""
    nvml = SimulatedNvml(P5)
    nvml.nvmlInit()
    gone, unloaded = parse_fault("gpu-gone@gpu2"), parse_fault("driver-unloaded")
    nvml.inject(gone)
    assert nvml.nvmlDeviceGetCount() == 8
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(2))
    nvml.inject(unloaded)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        nvml.nvmlDeviceGetCount()
    nvml.clear(unloaded)
    assert nvml.nvmlDeviceGetCount() == 7
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(2)) == nvml.uuid_of(3)


# --- the remediation ladder across the renumbering ------------------------------------------


def agent_findings(
    tmp: Path, start: float, boot_faults: list[str], fault: str
) -> tuple[list[dict[str, Any]], SimulatedNvml]:
    """What the production agent annotates on its Node (its actionable findings, as JSON) a
    few polls after `fault` struck a node that booted with `boot_faults`."""
    sim = SimulatedNode(P5, parse_faults(boot_faults), root=tmp, start=start)
    sources = sim.sources()
    sources.kernel_log = sim.kernel_log_source()
    monitor = HealthMonitor()
    now = start
    poller = Poller("n1", sources, clock=lambda: now, health=monitor)
    try:
        poller.poll()
        sim.inject(parse_fault(fault))
        for _ in range(3):
            time.sleep(0.05)  # the event set delivers in real time
            now += 5.0
            poller.poll()
        assert monitor.last is not None
        written = json.loads(json.dumps([f.to_dict() for f in monitor.last.actionable]))
        return written, sim.nvml
    finally:
        sources.close()
        sim.close()


def rungs(controller: Any) -> dict[tuple[str, str], dict[str, Any]]:
    [status] = controller.status()["nodes"]
    return {(r["check"], r["component"]): r for r in status["ladder"]}


def test_another_gpu_at_the_lost_gpus_index_starts_its_own_ladder(tmp_path: Path) -> None:
    """Boot a: GPU 2 falls off the bus (XID 79) -> reboot. Boot b: it did not come back; NVML
    counts 7, and the GPU of slot 3 is NVML's GPU 2. That GPU then falls off too: `xid@gpu2`
    again, but of another physical GPU, so its rung is a first step (reboot), not the
    replacement a repeat at that index would be. The node is replaced all the same, for the
    GPU that did not come back (gpu_missing after the reboot for XID 79: the same fault)."""
    controller, provider, writer, clock = setup()
    first, nvml = agent_findings(tmp_path / "a", clock.now, [], "xid=79@gpu2")
    assert ("xid", "gpu2") in {(f["check"], f["component"]) for f in first}
    assert run(controller, booted(node("n1", first), "boot-a"), at=clock.now) == ["n1:act:reboot"]
    [mark] = writer.states["n1"].ladder
    assert (mark.component, mark.device) == ("gpu2", nvml.uuid_of(2))

    clock.now += 1800
    second, nvml = agent_findings(tmp_path / "b", clock.now, ["gpu-gone@gpu2"], "xid=79@gpu3")
    by_key = {(f["check"], f["component"]): f for f in second}
    assert by_key[("xid", "gpu2")]["uuid"] == nvml.uuid_of(3)  # slot 3 at index 2
    assert "NVML enumerates 7 GPUs" in by_key[("gpu_missing", "node")]["evidence"]
    assert run(controller, booted(node("n1", second), "boot-b"), at=clock.now) == ["n1:act:replace"]
    assert provider.calls == [("n1", "reboot"), ("n1", "replace")]
    ladder = rungs(controller)
    other = ladder[("xid", "gpu2")]
    assert (other["action"], other["step"], other["device"]) == ("reboot", 1, nvml.uuid_of(3))
    assert other["why"] == "first step"
    missing = ladder[("gpu_missing", "node")]
    assert missing["action"] == "replace" and "did not come back" in missing["why"]


def test_the_same_gpu_under_a_new_index_climbs_its_own_ladder(tmp_path: Path) -> None:
    """Boot a: the GPU of slot 5 falls off the bus (XID 79 on GPU 5) -> reboot. Boot b: GPU 2
    did not come back, so that GPU is NVML's GPU 4 now, and falls off again: the same physical
    GPU again within the step's window, so its rung is the next step, replace, though no GPU 4
    was ever treated. By index (an agent that sends no ids) it would be a first reboot."""
    controller, _, writer, clock = setup()
    first, nvml = agent_findings(tmp_path / "a", clock.now, [], "xid=79@gpu5")
    assert run(controller, booted(node("n1", first), "boot-a"), at=clock.now) == ["n1:act:reboot"]
    [mark] = writer.states["n1"].ladder
    assert (mark.component, mark.device) == ("gpu5", nvml.uuid_of(5))

    clock.now += 1800
    second, nvml = agent_findings(tmp_path / "b", clock.now, ["gpu-gone@gpu2"], "xid=79@gpu5")
    assert nvml.nvml_index_of(5) == 4
    by_key = {(f["check"], f["component"]): f for f in second}
    assert by_key[("xid", "gpu4")]["uuid"] == nvml.uuid_of(5)
    assert run(controller, booted(node("n1", second), "boot-b"), at=clock.now) == ["n1:act:replace"]
    same = rungs(controller)[("xid", "gpu4")]
    assert (same["action"], same["step"], same["device"]) == ("replace", 2, nvml.uuid_of(5))
    assert same["why"].startswith("again")

    # the same findings without ids, as an agent older than issue 28 wrote them
    controller, _, _, clock = setup()
    bare = [{k: v for k, v in f.items() if k not in ("uuid", "pciBusId")} for f in first]
    run(controller, booted(node("n1", bare), "boot-a"), at=clock.now)
    clock.now += 1800
    bare = [{k: v for k, v in f.items() if k not in ("uuid", "pciBusId")} for f in second]
    run(controller, booted(node("n1", bare), "boot-b"), at=clock.now)
    by_index = rungs(controller)[("xid", "gpu4")]
    assert (by_index["action"], by_index["why"]) == ("reboot", "first step")
