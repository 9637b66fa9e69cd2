"""Where each GPU sits relative to the NICs and CPUs, and whether its processes agree. Pure.

Nearest EFA devices are those whose PCI path (the chain of sysfs device directories from the
host bridge down) shares the longest common prefix with the GPU's: a device behind the GPU's own
PCIe switch shares the host bridge, root port and switch upstream port, and wins over one that
only shares the host bridge (the root complex), which in turn counts only when nothing closer
exists. Without PCI path information (the GPU's location is unknown, or no EFA device shares
even the host bridge) the fallback is every EFA device on the GPU's NUMA node.

The EFA devices' paths come from `locations` too, so callers pass the EFA PCI addresses to
`read_pci_locations` along with the GPUs'.

A process is off its GPU's NUMA node when the CPUs it may run on include any CPU outside that
node. Processes whose CPU mask could not be read are counted in neither number, and when the
GPU's NUMA node (or that node's CPU list) is unknown no process is called off-node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from exporter.core.snapshot import EfaDeviceReading, GpuAffinity, NumaNodeReading
from exporter.sources.sysfs import PciLocation


def compute_affinity(
    gpus: Sequence[tuple[int, str]],
    gpu_processes: Mapping[int, Sequence[int]],
    locations: Mapping[str, PciLocation],
    efa: Sequence[EfaDeviceReading],
    numa: Sequence[NumaNodeReading],
    process_cpus: Mapping[int, frozenset[int]],
) -> tuple[GpuAffinity, ...]:
    """One `GpuAffinity` per `(gpu index, sysfs PCI address)` in `gpus`, in that order."""
    node_cpus = {n.node: n.cpus for n in numa}
    nics = [_nic(d, locations) for d in efa]
    out: list[GpuAffinity] = []
    for index, address in gpus:
        loc = locations.get(address)
        gpu_node = _gpu_numa_node(loc, numa)
        nearest = _nearest(loc.path if loc is not None else (), gpu_node, nics)

        pids = list(dict.fromkeys(gpu_processes.get(index, ())))
        known = [process_cpus[p] for p in pids if p in process_cpus]
        local = node_cpus.get(gpu_node) if gpu_node is not None else None
        off = sum(1 for cpus in known if not cpus <= local) if local else 0
        out.append(
            GpuAffinity(
                gpu_index=index,
                numa_node=gpu_node,
                nearest_efa=nearest,
                processes=len(known),
                processes_off_numa=off,
            )
        )
    return tuple(out)


_Nic = tuple[str, tuple[str, ...], int | None]  # device name, PCI path, NUMA node


def _nic(device: EfaDeviceReading, locations: Mapping[str, PciLocation]) -> _Nic:
    loc = locations.get(device.pci_address) if device.pci_address else None
    path = loc.path if loc is not None else ()
    node = device.numa_node
    if node is None and loc is not None:
        node = loc.numa_node
    return device.device, path, node


def _gpu_numa_node(loc: PciLocation | None, numa: Sequence[NumaNodeReading]) -> int | None:
    """The GPU's `numa_node`; failing that, the node whose CPUs hold its `local_cpulist`."""
    if loc is None:
        return None
    if loc.numa_node is not None:
        return loc.numa_node
    if loc.local_cpus:
        matches = [n.node for n in numa if n.cpus and loc.local_cpus <= n.cpus]
        if len(matches) == 1:
            return matches[0]
    return None


def _nearest(
    gpu_path: tuple[str, ...], gpu_node: int | None, nics: Sequence[_Nic]
) -> tuple[str, ...]:
    if gpu_path:
        best = 0
        names: list[str] = []
        for name, path, _ in nics:
            shared = _common_prefix(gpu_path, path)
            if shared > best:
                best, names = shared, [name]
            elif shared == best and shared > 0:
                names.append(name)
        if best > 0:
            return tuple(names)
    if gpu_node is None:
        return ()
    return tuple(name for name, _, node in nics if node == gpu_node)


def _common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
