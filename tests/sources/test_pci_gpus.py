"""NVIDIA GPUs read off the PCI bus in sysfs, for naming a kernel log line's GPU while NVML hangs
(issue 28; exporter/sources/pci_gpus.py).

Rules: a function's `vendor` and `class` files are its config-space header as the kernel cached
it (drivers/pci/pci-sysfs.c); NVIDIA is vendor 0x10de; a GPU is base class 03 (display),
subclass 00 (VGA compatible) or 02 (3D controller, the data-centre GPUs); an NVSwitch is 0x0680
(bridge, other) and an EFA device 0x0200 of vendor 0x1d0f. The order is the PCI address order,
which nvidia-smi's indices follow in practice (nvml.h itself promises no order).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.sim.hardware.profiles import get_profile
from exporter.sim.hardware.sysfs import SimulatedSysfs
from exporter.sources.pci_gpus import read_nvidia_gpus


def device(root: Path, address: str, vendor: str, pci_class: str | None) -> None:
    d = root / "bus" / "pci" / "devices" / address
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    if pci_class is not None:
        (d / "class").write_text(pci_class + "\n")


def test_gpus_only_in_address_order(tmp_path: Path) -> None:
    device(tmp_path, "0000:ca:00.0", "0x10de", "0x030200")  # H100: 3D controller
    device(tmp_path, "0000:53:00.0", "0x10de", "0x030200")
    device(tmp_path, "0008:01:00.0", "0x10de", "0x030000")  # VGA compatible, another domain
    device(tmp_path, "0000:05:00.0", "0x10de", "0x068000")  # NVSwitch: a bridge
    device(tmp_path, "0000:53:00.1", "0x10de", "0x040300")  # the GPU's audio function
    device(tmp_path, "0000:10:1b.0", "0x1d0f", "0x020000")  # EFA
    device(tmp_path, "0000:64:00.0", "0x10de", None)  # no class file: left out
    assert read_nvidia_gpus(tmp_path) == ("0000:53:00.0", "0000:ca:00.0", "0008:01:00.0")


def test_the_simulated_tree_lists_the_profiles_gpus(tmp_path: Path) -> None:
    profile = get_profile("p5.48xlarge")
    sim = SimulatedSysfs(tmp_path, profile)
    sim.write()
    assert read_nvidia_gpus(sim.sysfs_root) == tuple(g.sysfs_address for g in profile.gpus)


def test_no_pci_bus_raises(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        read_nvidia_gpus(tmp_path)
