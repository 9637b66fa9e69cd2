"""PCI addresses as NVML and the kernel spell them.

NVML reports a GPU's bus id with an 8-hex-digit upper-case domain (`00000000:53:00.0`,
`nvmlPciInfo_t.busId`); sysfs names the same device with a 4-digit lower-case domain
(`/sys/bus/pci/devices/0000:53:00.0`). Both the NVML and the sysfs readers need the one
conversion, and so does the simulation that lays out a tree for them.
"""

from __future__ import annotations


def nvml_to_sysfs_address(pci_bus_id: str) -> str:
    """NVML's 8-hex-digit domain form to the kernel's 4-digit lower-case form."""
    domain, rest = pci_bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"
