"""Hardware profiles of the instance types the simulation can pretend to be.

A profile is plain data: how many GPUs and which PCI addresses, NVLinks per GPU, EFA devices and
which PCIe switch each sits behind, NUMA layout, and the node's topology labels. The simulated
NVML library and the simulated sysfs tree are both generated from one profile, so the GPU the
NVML side reports at 00000000:53:00.0 is the same device the sysfs side places on NUMA node 0.

Layouts follow the public shape of the instances (p5: 8 H100 behind 4+4 PCIe switches per
socket, 4 EFA per GPU switch, 2 NUMA nodes; p6e-gb200: 4 GB200 GPUs on 2 Grace sockets, in an
18-node UltraServer). Exact bus numbers are illustrative, not a claim about AWS's firmware.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from exporter.sources.pci import nvml_to_sysfs_address

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class GpuSpec:
    index: int
    pci_bus_id: str  # NVML form, "00000000:53:00.0"
    switch: int  # PCIe switch the GPU sits behind (shared with its nearest EFA devices)
    numa_node: int

    @property
    def sysfs_address(self) -> str:
        """The PCI address as sysfs spells it ("0000:53:00.0")."""
        return nvml_to_sysfs_address(self.pci_bus_id)


@dataclass(frozen=True, slots=True)
class EfaSpec:
    name: str  # rdmap<bus>s<slot>, decimal, as the kernel names it
    pci_address: str  # sysfs form
    switch: int
    numa_node: int


@dataclass(frozen=True, slots=True)
class NumaSpec:
    node: int
    cpus: tuple[int, ...]
    mem_total_bytes: int


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    instance_type: str
    gpu_model: str
    gpu_memory_bytes: int
    gpu_power_limit_watts: float
    gpu_max_sm_clock_mhz: int
    gpu_max_mem_clock_mhz: int
    pcie_gen_max: int
    pcie_width_max: int
    nvlinks_per_gpu: int
    nvlink_remote: str  # "switch" (NVSwitch) for both profiles
    supports_gpm: bool
    supports_fabric: bool
    efa_rate_gbps: int
    gpus: tuple[GpuSpec, ...]
    efa: tuple[EfaSpec, ...]
    numa: tuple[NumaSpec, ...]
    topology_labels: tuple[tuple[str, str], ...]
    driver_version: str = "570.133.20"

    @property
    def expected_gpus(self) -> int:
        return len(self.gpus)

    @property
    def expected_efa(self) -> int:
        return len(self.efa)

    def nearest_efa(self, gpu_index: int) -> tuple[str, ...]:
        switch = self.gpus[gpu_index].switch
        return tuple(e.name for e in self.efa if e.switch == switch)


def efa_name(bus: int, slot: int) -> str:
    return f"rdmap{bus}s{slot}"


def _p5() -> HardwareProfile:
    gpu_buses = (0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA)
    gpus = tuple(
        GpuSpec(index=i, pci_bus_id=f"00000000:{bus:02X}:00.0", switch=i, numa_node=i // 4)
        for i, bus in enumerate(gpu_buses)
    )
    efa: list[EfaSpec] = []
    for switch in range(8):
        bus = 0x10 + 0x10 * switch
        for port in range(4):
            slot = 0x1B + port
            efa.append(
                EfaSpec(
                    name=efa_name(bus, slot),
                    pci_address=f"0000:{bus:02x}:{slot:02x}.0",
                    switch=switch,
                    numa_node=switch // 4,
                )
            )
    numa = (
        NumaSpec(
            node=0, cpus=tuple(range(0, 48)) + tuple(range(96, 144)), mem_total_bytes=1000 * GIB
        ),
        NumaSpec(
            node=1, cpus=tuple(range(48, 96)) + tuple(range(144, 192)), mem_total_bytes=1000 * GIB
        ),
    )
    return HardwareProfile(
        instance_type="p5.48xlarge",
        gpu_model="NVIDIA H100 80GB HBM3",
        gpu_memory_bytes=80 * GIB,
        gpu_power_limit_watts=700.0,
        gpu_max_sm_clock_mhz=1980,
        gpu_max_mem_clock_mhz=2619,
        pcie_gen_max=5,
        pcie_width_max=16,
        nvlinks_per_gpu=18,
        nvlink_remote="switch",
        supports_gpm=True,
        supports_fabric=False,
        efa_rate_gbps=100,
        gpus=gpus,
        efa=tuple(efa),
        numa=numa,
        topology_labels=(
            ("topology.k8s.aws/network-node-layer-1", "nn-4c1a0b7e5d2f9a31"),
            ("topology.k8s.aws/network-node-layer-2", "nn-9e3b27c1d08f4a65"),
            ("topology.k8s.aws/network-node-layer-3", "nn-1f6d84a2c3e5b790"),
            ("topology.kubernetes.io/zone", "us-east-2b"),
            ("topology.kubernetes.io/region", "us-east-2"),
            ("node.kubernetes.io/instance-type", "ml.p5.48xlarge"),
        ),
    )


def _p6e_gb200() -> HardwareProfile:
    gpu_buses = (0x08, 0x09, 0x18, 0x19)
    gpus = tuple(
        GpuSpec(index=i, pci_bus_id=f"00000008:{bus:02X}:00.0", switch=i, numa_node=i // 2)
        for i, bus in enumerate(gpu_buses)
    )
    efa: list[EfaSpec] = []
    for switch in range(4):
        bus = 0x20 + 0x10 * switch
        for port in range(2):
            slot = port
            efa.append(
                EfaSpec(
                    name=efa_name(bus, slot),
                    pci_address=f"0000:{bus:02x}:{slot:02x}.0",
                    switch=switch,
                    numa_node=switch // 2,
                )
            )
    numa = (
        NumaSpec(node=0, cpus=tuple(range(0, 72)), mem_total_bytes=480 * GIB),
        NumaSpec(node=1, cpus=tuple(range(72, 144)), mem_total_bytes=480 * GIB),
    )
    return HardwareProfile(
        instance_type="p6e-gb200.36xlarge",
        gpu_model="NVIDIA GB200",
        gpu_memory_bytes=186 * GIB,
        gpu_power_limit_watts=1200.0,
        gpu_max_sm_clock_mhz=2062,
        gpu_max_mem_clock_mhz=3996,
        pcie_gen_max=6,
        pcie_width_max=16,
        nvlinks_per_gpu=18,
        nvlink_remote="switch",
        supports_gpm=True,
        supports_fabric=True,
        efa_rate_gbps=200,
        gpus=gpus,
        efa=tuple(efa),
        numa=numa,
        topology_labels=(
            ("topology.k8s.aws/network-node-layer-1", "nn-7d2e91f04b6c3a58"),
            ("topology.k8s.aws/network-node-layer-2", "nn-2a5c8e17f9d04b63"),
            ("topology.k8s.aws/network-node-layer-3", "nn-b04f6e29a1c7d835"),
            ("topology.k8s.aws/network-node-layer-4", "nn-e81c3a5f70b29d46"),
            ("topology.k8s.aws/ultraserver-id", "us-0f3a9c2e71b4d5860"),
            ("topology.kubernetes.io/zone", "us-east-1d"),
            ("topology.kubernetes.io/region", "us-east-1"),
            ("node.kubernetes.io/instance-type", "ml.p6e-gb200.36xlarge"),
        ),
        driver_version="575.57.08",
    )


PROFILES: dict[str, HardwareProfile] = {p.instance_type: p for p in (_p5(), _p6e_gb200())}


def get_profile(name: str) -> HardwareProfile:
    """Look a profile up by instance type, with or without HyperPod's `ml.` prefix."""
    key = name.removeprefix("ml.")
    try:
        return PROFILES[key]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown hardware profile {name!r}; known profiles: {known}") from None


@dataclass(frozen=True, slots=True)
class SimProcess:
    """A compute process the simulation runs on a GPU, with the CPUs it may run on."""

    pid: int
    gpu_index: int
    cpus_allowed: tuple[int, ...]
    used_memory_bytes: int


def simulated_processes(
    profile: HardwareProfile, unpinned: Collection[int] = ()
) -> tuple[SimProcess, ...]:
    """One training process per GPU, pinned to its GPU's NUMA node, as a launcher that binds
    each rank to its GPU's socket does. The processes of the GPUs in `unpinned` (the
    `numa-unpinned@gpuN` fault) are left unpinned, all CPUs allowed: the common launcher
    mistake the affinity collector exists to catch."""
    all_cpus = tuple(sorted(c for n in profile.numa for c in n.cpus))
    procs = []
    for gpu in profile.gpus:
        local = next(n.cpus for n in profile.numa if n.node == gpu.numa_node)
        procs.append(
            SimProcess(
                pid=40000 + gpu.index,
                gpu_index=gpu.index,
                cpus_allowed=all_cpus if gpu.index in unpinned else local,
                used_memory_bytes=int(profile.gpu_memory_bytes * 0.72),
            )
        )
    return tuple(procs)
