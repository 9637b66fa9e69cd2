"""compute_affinity: on the simulated tree of both profiles, and on hand-made topologies."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.core.snapshot import EfaDeviceReading, GpuAffinity, NumaNodeReading
from exporter.node.affinity import compute_affinity
from exporter.sim.faults import Fault
from exporter.sim.hardware.profiles import HardwareProfile, get_profile, simulated_processes
from exporter.sim.hardware.sysfs import SimulatedSysfs
from exporter.sources.sysfs import (
    PciLocation,
    read_efa,
    read_numa,
    read_pci_locations,
    read_process_cpus,
)


@pytest.fixture(params=("p5.48xlarge", "p6e-gb200.36xlarge"))
def profile(request: pytest.FixtureRequest) -> HardwareProfile:
    return get_profile(request.param)


@pytest.fixture
def sim(tmp_path: Path, profile: HardwareProfile) -> SimulatedSysfs:
    s = SimulatedSysfs(tmp_path, profile, seed=1)
    s.write(now=0.0)
    return s


def _affinity_from_tree(
    sim: SimulatedSysfs, profile: HardwareProfile, with_efa_locations: bool = True
) -> tuple[GpuAffinity, ...]:
    gpus = [(g.index, g.sysfs_address) for g in profile.gpus]
    efa = read_efa(sim.sysfs_root)
    numa = read_numa(sim.sysfs_root)
    addresses = [a for _, a in gpus]
    if with_efa_locations:
        addresses += [d.pci_address for d in efa if d.pci_address]
    locations = read_pci_locations(sim.sysfs_root, addresses)
    processes = {p.gpu_index: [p.pid] for p in simulated_processes(profile)}
    cpus = read_process_cpus(sim.proc_root, [p for pids in processes.values() for p in pids])
    return compute_affinity(gpus, processes, locations, efa, numa, cpus)


def test_nearest_efa_and_numa_from_the_simulated_tree(
    sim: SimulatedSysfs, profile: HardwareProfile
) -> None:
    result = _affinity_from_tree(sim, profile)
    assert [a.gpu_index for a in result] == [g.index for g in profile.gpus]
    for a in result:
        gpu = profile.gpus[a.gpu_index]
        assert a.nearest_efa == profile.nearest_efa(gpu.index)
        assert len(a.nearest_efa) == (4 if profile.instance_type == "p5.48xlarge" else 2)
        assert a.numa_node == gpu.numa_node


def test_every_process_is_pinned_to_its_gpus_numa_node_until_a_fault_unpins_one(
    sim: SimulatedSysfs, profile: HardwareProfile
) -> None:
    result = _affinity_from_tree(sim, profile)
    assert [a.processes for a in result] == [1] * len(profile.gpus)
    assert [a.processes_off_numa for a in result] == [0] * len(profile.gpus)
    last = len(profile.gpus) - 1
    unpinned = Fault(kind="numa-unpinned", gpu=last)
    sim.inject(unpinned)
    result = _affinity_from_tree(sim, profile)
    assert [a.processes_off_numa for a in result] == [
        1 if a.gpu_index == last else 0 for a in result
    ]
    sim.clear(unpinned)
    assert [a.processes_off_numa for a in _affinity_from_tree(sim, profile)] == [0] * len(
        profile.gpus
    )


def test_without_efa_locations_nearest_falls_back_to_the_numa_node(
    sim: SimulatedSysfs, profile: HardwareProfile
) -> None:
    result = _affinity_from_tree(sim, profile, with_efa_locations=False)
    for a in result:
        node = profile.gpus[a.gpu_index].numa_node
        assert a.nearest_efa == tuple(e.name for e in profile.efa if e.numa_node == node)


def test_missing_efa_device_drops_out_of_nearest(
    sim: SimulatedSysfs, profile: HardwareProfile
) -> None:
    gone = profile.nearest_efa(0)[0]
    sim.inject(Fault(kind="efa-missing", device=gone))
    result = _affinity_from_tree(sim, profile)
    assert result[0].nearest_efa == tuple(n for n in profile.nearest_efa(0) if n != gone)


# ------------------------------------------------------------------------------ hand-made


def _loc(
    addr: str, *path: str, numa: int | None = 0, cpus: frozenset[int] | None = None
) -> PciLocation:
    return PciLocation(address=addr, path=(*path, addr), numa_node=numa, local_cpus=cpus)


NUMA = (
    NumaNodeReading(node=0, cpus=frozenset(range(0, 4)), cpulist="0-3"),
    NumaNodeReading(node=1, cpus=frozenset(range(4, 8)), cpulist="4-7"),
)


def _efa(name: str, addr: str, numa: int | None) -> EfaDeviceReading:
    return EfaDeviceReading(device=name, pci_address=addr, numa_node=numa)


def test_same_switch_beats_same_root_complex() -> None:
    rc, rp1, rp2 = "pci0000:00", "0000:00:01.0", "0000:00:02.0"
    locations = {
        "0000:10:00.0": _loc("0000:10:00.0", rc, rp1, "0000:01:00.0", "0000:02:00.0"),  # GPU
        "0000:11:00.0": _loc(
            "0000:11:00.0", rc, rp1, "0000:01:00.0", "0000:02:01.0"
        ),  # same switch
        "0000:20:00.0": _loc(
            "0000:20:00.0", rc, rp2, "0000:03:00.0", "0000:04:00.0"
        ),  # same RC only
    }
    efa = [_efa("near", "0000:11:00.0", 0), _efa("far", "0000:20:00.0", 0)]
    (a,) = compute_affinity([(0, "0000:10:00.0")], {}, locations, efa, NUMA, {})
    assert a.nearest_efa == ("near",)


def test_root_complex_ties_count_when_nothing_is_closer() -> None:
    rc = "pci0000:00"
    locations = {
        "0000:10:00.0": _loc("0000:10:00.0", rc, "0000:00:01.0"),
        "0000:20:00.0": _loc("0000:20:00.0", rc, "0000:00:02.0"),
        "0000:30:00.0": _loc("0000:30:00.0", rc, "0000:00:03.0"),
        "0000:40:00.0": _loc("0000:40:00.0", "pci0000:80", "0000:80:01.0", numa=1),
    }
    efa = [_efa("a", "0000:20:00.0", 0), _efa("b", "0000:30:00.0", 0), _efa("c", "0000:40:00.0", 1)]
    (a,) = compute_affinity([(0, "0000:10:00.0")], {}, locations, efa, NUMA, {})
    assert a.nearest_efa == ("a", "b")


def test_no_shared_pci_path_falls_back_to_numa() -> None:
    locations = {
        "0000:10:00.0": _loc("0000:10:00.0", "pci0000:10", numa=1),
        "0000:20:00.0": _loc("0000:20:00.0", "pci0000:20", numa=0),
        "0000:30:00.0": _loc("0000:30:00.0", "pci0000:30", numa=1),
    }
    efa = [_efa("a", "0000:20:00.0", 0), _efa("b", "0000:30:00.0", 1), _efa("c", "0000:40:00.0", 1)]
    (a,) = compute_affinity([(0, "0000:10:00.0")], {}, locations, efa, NUMA, {})
    assert a.numa_node == 1
    assert a.nearest_efa == ("b", "c")


def test_gpu_with_unknown_location() -> None:
    efa = [_efa("a", "0000:20:00.0", 0)]
    (a,) = compute_affinity(
        [(3, "0000:99:00.0")], {3: [10]}, {}, efa, NUMA, {10: frozenset({0, 5})}
    )
    assert a.gpu_index == 3
    assert a.numa_node is None and a.nearest_efa == ()
    assert a.processes == 1 and a.processes_off_numa == 0  # cannot judge without a node


def test_numa_node_from_local_cpus_when_numa_node_is_unknown() -> None:
    locations = {
        "0000:10:00.0": _loc("0000:10:00.0", "pci0000:10", numa=None, cpus=frozenset({4, 5, 6, 7}))
    }
    (a,) = compute_affinity([(0, "0000:10:00.0")], {}, locations, [], NUMA, {})
    assert a.numa_node == 1


def test_process_counting() -> None:
    locations = {"0000:10:00.0": _loc("0000:10:00.0", "pci0000:10", numa=0)}
    procs = {0: [1, 2, 3, 4, 4, 5]}
    cpus = {
        1: frozenset({0, 1}),  # inside node 0
        2: frozenset({0, 4}),  # one CPU on node 1: off
        3: frozenset(range(8)),  # unpinned: off
        4: frozenset({3}),  # listed twice, counted once
        # pid 5 unknown: counted nowhere
    }
    (a,) = compute_affinity(
        [(0, "0000:10:00.0")], procs | {0: [*procs[0], 5]}, locations, [], NUMA, cpus
    )
    assert a.processes == 4
    assert a.processes_off_numa == 2


def test_gpu_without_processes() -> None:
    locations = {"0000:10:00.0": _loc("0000:10:00.0", "pci0000:10", numa=0)}
    (a,) = compute_affinity([(0, "0000:10:00.0")], {}, locations, [], NUMA, {})
    assert (a.processes, a.processes_off_numa) == (0, 0)


def test_cpuless_numa_node_judges_nothing() -> None:
    numa = (*NUMA, NumaNodeReading(node=2, cpus=frozenset(), cpulist=""))
    locations = {"0000:10:00.0": _loc("0000:10:00.0", "pci0000:10", numa=2)}
    (a,) = compute_affinity(
        [(0, "0000:10:00.0")], {0: [1]}, locations, [], numa, {1: frozenset({0})}
    )
    assert a.numa_node == 2 and a.processes == 1 and a.processes_off_numa == 0
