"""NVIDIA GPUs as the PCI bus lists them, read from sysfs alone: no NVML, no driver call.

The node agent names a GPU by the index NVML gives it; the kernel log names it by PCI address
(`NVRM: Xid (PCI:0000:53:00): 79, ...`). When NVML hangs from the agent's start (a wedged driver:
the case the kernel log exists for), it never says which address is which index, and a logged
XID 79 would go unjudged (issue 28). sysfs still answers: `/sys/bus/pci/devices/<address>/vendor`
and `class` are the device's config-space header as the kernel cached it at enumeration
(drivers/pci/pci-sysfs.c), read without entering the NVIDIA driver. /proc/driver/nvidia/gpus/*
would also give each GPU's UUID, but reading it calls into the driver (nv-procfs.c asks RM for
the UUID), which is what may be hung.

The index is the GPU's place in PCI address order. nvml.h promises no order ("The order in which
NVML enumerates devices has no guarantees of consistency between reboots ... it is recommended
that devices be looked up by their PCI ids or UUID"); in practice nvidia-smi's indices, which are
NVML's, follow the PCI bus id, and CUDA_DEVICE_ORDER=PCI_BUS_ID exists to make CUDA agree with
them. So the index is a best guess, used only while NVML does not answer in full, only for an
address NVML has not named, and only where the order agrees with every GPU NVML did name
(exporter/node/kernel/events.py); the PCI address, the GPU's physical identity, travels with
every finding made this way.
"""

from __future__ import annotations

import os

StrPath = str | os.PathLike[str]
NVIDIA_VENDOR = 0x10DE
# PCI base class 03 (display controller), subclasses 00 (VGA compatible, a GPU with display
# out) and 02 (3D controller: every data-centre GPU). An NVSwitch is 0x0680 (bridge, other).
_GPU_CLASSES = frozenset({0x0300, 0x0302})


def read_nvidia_gpus(sysfs_root: StrPath) -> tuple[str, ...]:
    """The sysfs addresses (`0000:53:00.0`) of NVIDIA GPUs on the PCI bus, in address order.
    OSError when the bus directory cannot be listed; a device whose files cannot be read is
    left out."""
    bus = os.path.join(os.fspath(sysfs_root), "bus", "pci", "devices")
    found: list[tuple[tuple[int, ...], str]] = []
    for name in os.listdir(bus):
        vendor = _hex_file(os.path.join(bus, name, "vendor"))
        if vendor != NVIDIA_VENDOR:
            continue
        pci_class = _hex_file(os.path.join(bus, name, "class"))
        if pci_class is None or pci_class >> 8 not in _GPU_CLASSES:
            continue
        order = _address_key(name)
        if order is not None:
            found.append((order, name))
    return tuple(name for _, name in sorted(found))


def _hex_file(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read(32).strip(), 16)
    except (OSError, ValueError):
        return None


def _address_key(name: str) -> tuple[int, ...] | None:
    """domain:bus:device.function as numbers, for ordering; None for a name of another form."""
    try:
        domain, bus, rest = name.split(":")
        device, function = rest.split(".")
        return (int(domain, 16), int(bus, 16), int(device, 16), int(function, 16))
    except ValueError:
        return None
