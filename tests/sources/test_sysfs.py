"""The sysfs/proc readers against the simulated tree (both profiles) and against this machine."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from exporter.core.snapshot import EfaDeviceReading, EfaPortReading
from exporter.sim.faults import Fault
from exporter.sim.hardware.profiles import HardwareProfile, get_profile
from exporter.sim.hardware.sysfs import (
    SimulatedSysfs,
    efa_rate_text,
    format_cpulist,
    format_cpumask,
)
from exporter.sources.sysfs import (
    EFA_DEVICE_COUNTERS,
    EFA_PORT_COUNTERS,
    parse_cpulist,
    parse_rate,
    read_efa,
    read_numa,
    read_pci_locations,
    read_process_cpus,
    read_rootfs_read_only,
)
from tests.conftest import reference

PROFILES = ("p5.48xlarge", "p6e-gb200.36xlarge")


@pytest.fixture(params=PROFILES)
def profile(request: pytest.FixtureRequest) -> HardwareProfile:
    return get_profile(request.param)


@pytest.fixture
def sim(tmp_path: Path, profile: HardwareProfile) -> SimulatedSysfs:
    s = SimulatedSysfs(tmp_path / "node", profile, seed=7)
    s.write(now=1000.0)
    return s


def _by_name(sim: SimulatedSysfs) -> dict[str, EfaDeviceReading]:
    return {d.device: d for d in read_efa(sim.sysfs_root)}


# ------------------------------------------------------------------------------ EFA: happy path


def test_counter_names_are_the_kernels_in_kernel_order() -> None:
    text = reference("efa/efa-hw-counters.txt").read_text()
    device = re.search(r"^# EFA_DEFINE_DEVICE_STATS:\s*(.+)$", text, re.M)
    port = re.search(r"^# EFA_DEFINE_PORT_STATS:\s*(.+)$", text, re.M)
    assert device and port
    assert tuple(device.group(1).split()) == EFA_DEVICE_COUNTERS
    assert tuple(port.group(1).split()) == EFA_PORT_COUNTERS
    assert len(EFA_DEVICE_COUNTERS) == 12 and len(EFA_PORT_COUNTERS) == 22


def test_every_efa_device_reads_with_all_counters(
    sim: SimulatedSysfs, profile: HardwareProfile
) -> None:
    devices = read_efa(sim.sysfs_root)
    assert (
        len(devices)
        == profile.expected_efa
        == (32 if profile.instance_type == "p5.48xlarge" else 8)
    )
    specs = {e.name: e for e in profile.efa}
    assert {d.device for d in devices} == set(specs)
    for d in devices:
        spec = specs[d.device]
        assert d.error is None
        assert d.pci_address == spec.pci_address
        assert d.numa_node == spec.numa_node
        assert tuple(d.counters) == EFA_DEVICE_COUNTERS  # all 12, kernel order, no lifespan
        assert len(d.ports) == 1
        port = d.ports[0]
        assert port.port == 1
        assert (port.state, port.state_code) == ("ACTIVE", 4)
        assert port.phys_state == "LinkUp"
        assert port.link_layer == "Unspecified"
        assert port.rate_bits_per_second == profile.efa_rate_gbps * 1e9
        assert tuple(port.counters) == EFA_PORT_COUNTERS  # all 22
        assert all(isinstance(v, int) and v >= 0 for v in port.counters.values())
        assert port.counters["unresponsive_remote_events"] == 0
        assert port.counters["impaired_remote_conn_events"] == 0


def test_devices_come_in_natural_name_order(sim: SimulatedSysfs) -> None:
    names = [d.device for d in read_efa(sim.sysfs_root)]
    key = [
        (int(m.group(1)), int(m.group(2)))
        for m in (re.fullmatch(r"rdmap(\d+)s(\d+)", n) for n in names)
        if m
    ]
    assert len(key) == len(names) and key == sorted(key)


def test_counters_grow_like_training_traffic(sim: SimulatedSysfs, profile: HardwareProfile) -> None:
    before = _by_name(sim)
    sim.advance(1010.0)  # ten simulated seconds
    after = _by_name(sim)
    line_rate = profile.efa_rate_gbps * 1e9 / 8
    for name, d1 in after.items():
        d0 = before[name]
        p0, p1 = d0.ports[0].counters, d1.ports[0].counters
        for key in EFA_PORT_COUNTERS:
            assert p1[key] >= p0[key], key
        for key in EFA_DEVICE_COUNTERS:
            assert d1.counters[key] >= d0.counters[key], key
        tx = p1["tx_bytes"] - p0["tx_bytes"]
        rx = p1["rx_bytes"] - p0["rx_bytes"]
        assert (
            0.1 * line_rate * 10 < tx < line_rate * 10
        )  # GB/s of training traffic, below line rate
        assert 0.1 * line_rate * 10 < rx < line_rate * 10
        pkts = p1["tx_pkts"] - p0["tx_pkts"]
        assert 4096 < tx / pkts < 9000  # bytes and packets agree (jumbo-ish SRD packets)
        for key in ("send_bytes", "recv_bytes", "rdma_write_bytes", "rdma_read_bytes", "send_wrs"):
            assert p1[key] > p0[key], key
        assert p1["unresponsive_remote_events"] == p0["unresponsive_remote_events"] == 0
        assert p1["impaired_remote_conn_events"] == 0
        keep_alive = d1.counters["keep_alive_rcvd"] - d0.counters["keep_alive_rcvd"]
        assert 9 <= keep_alive <= 11  # about one per second


def test_first_advance_without_start_time_only_fixes_the_epoch(tmp_path: Path) -> None:
    s = SimulatedSysfs(tmp_path, get_profile("p5.48xlarge"))
    s.write()
    first = read_efa(s.sysfs_root)[0].ports[0].counters["tx_bytes"]
    s.advance(1_750_000_000.0)
    assert read_efa(s.sysfs_root)[0].ports[0].counters["tx_bytes"] == first
    s.advance(1_750_000_005.0)
    assert read_efa(s.sysfs_root)[0].ports[0].counters["tx_bytes"] > first


def test_same_seed_same_tree(tmp_path: Path) -> None:
    values = []
    for n in range(2):
        s = SimulatedSysfs(tmp_path / str(n), get_profile("p5.48xlarge"), seed=3)
        s.write(now=0.0)
        s.advance(5.0)
        values.append([dict(d.ports[0].counters) for d in read_efa(s.sysfs_root)])
    assert values[0] == values[1]


# ------------------------------------------------------------------------------ EFA: bad trees


def test_missing_counter_file_is_skipped_silently(sim: SimulatedSysfs) -> None:
    dev = sim.profile.efa[0].name
    os.unlink(sim.sysfs_root / f"class/infiniband/{dev}/ports/1/hw_counters/retrans_bytes")
    os.unlink(sim.sysfs_root / f"class/infiniband/{dev}/hw_counters/mmap_err")
    d = _by_name(sim)[dev]
    assert d.error is None
    assert "retrans_bytes" not in d.ports[0].counters
    assert "mmap_err" not in d.counters
    assert len(d.ports[0].counters) == 21 and len(d.counters) == 11


def test_older_kernel_without_network_group(sim: SimulatedSysfs) -> None:
    dev = sim.profile.efa[0].name
    hw = sim.sysfs_root / f"class/infiniband/{dev}/ports/1/hw_counters"
    network = EFA_PORT_COUNTERS[-5:]
    for name in network:
        (hw / name).unlink()
    d = _by_name(sim)[dev]
    assert d.error is None
    assert tuple(d.ports[0].counters) == EFA_PORT_COUNTERS[:-5]


def test_garbage_counter_is_named_in_error_and_the_rest_still_read(sim: SimulatedSysfs) -> None:
    dev = sim.profile.efa[0].name
    sim.corrupt(f"sys/class/infiniband/{dev}/ports/1/hw_counters/tx_bytes", "not-a-number\n")
    sim.corrupt(f"sys/class/infiniband/{dev}/hw_counters/cmds_err", "-1\n")
    sim.advance(1005.0)  # a corrupted file stays corrupted across advance()
    devices = _by_name(sim)
    d = devices[dev]
    assert d.error is not None
    assert "ports/1/hw_counters/tx_bytes" in d.error
    assert "hw_counters/cmds_err" in d.error
    port = d.ports[0]
    assert "tx_bytes" not in port.counters
    assert set(port.counters) == set(EFA_PORT_COUNTERS) - {"tx_bytes"}
    assert set(d.counters) == set(EFA_DEVICE_COUNTERS) - {"cmds_err"}
    assert port.state == "ACTIVE"
    assert all(o.error is None for n, o in devices.items() if n != dev)
    sim.clear_corruption()
    sim.advance(1010.0)
    assert _by_name(sim)[dev].error is None


def test_malformed_port_attributes_are_reported_not_raised(sim: SimulatedSysfs) -> None:
    dev = sim.profile.efa[0].name
    sim.corrupt(f"sys/class/infiniband/{dev}/ports/1/state", "ACTIVE\n")
    sim.corrupt(f"sys/class/infiniband/{dev}/ports/1/rate", "fast\n")
    d = _by_name(sim)[dev]
    port = d.ports[0]
    assert port.state is None and port.state_code is None and port.rate_bits_per_second is None
    assert port.phys_state == "LinkUp"
    assert d.error is not None
    assert "ports/1/state" in d.error and "ports/1/rate" in d.error
    assert len(port.counters) == 22


def test_efa_missing_fault_removes_the_device_and_clear_brings_it_back(
    sim: SimulatedSysfs, profile: HardwareProfile
) -> None:
    dev = profile.efa[1].name
    fault = Fault(kind="efa-missing", device=dev)
    sim.inject(fault)
    names = {d.device for d in read_efa(sim.sysfs_root)}
    assert dev not in names and len(names) == profile.expected_efa - 1
    sim.advance(1005.0)  # advancing does not resurrect it
    assert dev not in {d.device for d in read_efa(sim.sysfs_root)}
    sim.clear(fault)
    back = _by_name(sim)
    assert dev in back and back[dev].error is None
    assert len(back) == profile.expected_efa


def test_efa_missing_from_the_constructor(tmp_path: Path) -> None:
    profile = get_profile("p5.48xlarge")
    s = SimulatedSysfs(tmp_path, profile, faults=[Fault(kind="efa-missing", device="rdmap16s27")])
    s.write()
    assert len(read_efa(s.sysfs_root)) == 31


def test_unknown_efa_device_in_a_fault_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rdmap999s1"):
        SimulatedSysfs(
            tmp_path,
            get_profile("p5.48xlarge"),
            faults=[Fault(kind="efa-unresponsive", device="rdmap999s1")],
        )


def test_efa_unresponsive_fault_raises_unresponsive_events(
    sim: SimulatedSysfs, profile: HardwareProfile
) -> None:
    dev = profile.efa[0].name
    sim.inject(Fault(kind="efa-unresponsive", device=dev))
    before = _by_name(sim)
    sim.advance(1010.0)
    after = _by_name(sim)
    p0 = before[dev].ports[0].counters
    p1 = after[dev].ports[0].counters
    assert (
        p1["unresponsive_remote_events"] - p0["unresponsive_remote_events"] >= 20
    )  # several per second
    assert p1["impaired_remote_conn_events"] >= p0["impaired_remote_conn_events"]
    assert p1["retrans_pkts"] > p0["retrans_pkts"]
    other = profile.efa[-1].name
    assert after[other].ports[0].counters["unresponsive_remote_events"] == 0


def test_device_vanishing_between_listing_and_reading_is_skipped(sim: SimulatedSysfs) -> None:
    cls = sim.sysfs_root / "class" / "infiniband"
    os.symlink("../../devices/pci0000:ff/0000:ff:00.0/infiniband/rdmap999s0", cls / "rdmap999s0")
    gone = sim.profile.efa[2]
    shutil.rmtree(sim.efa_dir(gone.name) / "ports")
    shutil.rmtree(sim.efa_dir(gone.name) / "hw_counters")
    names = {d.device for d in read_efa(sim.sysfs_root)}
    assert "rdmap999s0" not in names and gone.name not in names
    assert len(names) == sim.profile.expected_efa - 1


def test_device_removed_in_the_middle_of_its_read_is_skipped(
    sim: SimulatedSysfs, monkeypatch: pytest.MonkeyPatch
) -> None:
    import exporter.sources.sysfs as readers

    victim = read_efa(sim.sysfs_root)[0].device
    real_read_ports = readers._read_ports
    calls: list[int] = []

    def hot_unplug_after_device_counters(
        dev_fd: int, errors: list[str]
    ) -> tuple[EfaPortReading, ...] | None:
        if not calls:
            sim.inject(Fault(kind="efa-missing", device=victim))  # its directory goes away now
        calls.append(dev_fd)
        return real_read_ports(dev_fd, errors)

    monkeypatch.setattr(readers, "_read_ports", hot_unplug_after_device_counters)
    names = [d.device for d in read_efa(sim.sysfs_root)]
    assert victim not in names and len(names) == sim.profile.expected_efa - 1


def test_non_efa_rdma_devices_are_left_out(sim: SimulatedSysfs) -> None:
    cls = sim.sysfs_root / "class" / "infiniband"
    mlx = sim.root / "fake" / "mlx5_0"
    (mlx / "ports" / "1" / "hw_counters").mkdir(parents=True)
    (mlx / "hw_counters").mkdir()
    (mlx / "dev" / "driver").mkdir(parents=True)
    drv = sim.root / "fake" / "drivers" / "mlx5_core"
    drv.mkdir(parents=True)
    os.rmdir(mlx / "dev" / "driver")
    os.symlink(drv, mlx / "dev" / "driver")
    os.symlink(mlx / "dev", mlx / "device")
    os.symlink(mlx, cls / "mlx5_0")
    # No driver link: accepted only under the rdmap name the udev rules give PCI RDMA devices.
    for name in ("rdmap7s0", "ibp7s0"):
        d = sim.root / "fake" / name
        (d / "ports" / "1" / "hw_counters").mkdir(parents=True)
        (d / "ports" / "1" / "hw_counters" / "tx_bytes").write_text("5\n")
        os.symlink(d, cls / name)
    names = {d.device for d in read_efa(sim.sysfs_root)}
    assert "mlx5_0" not in names and "ibp7s0" not in names
    assert "rdmap7s0" in names
    odd = _by_name(sim)["rdmap7s0"]
    assert odd.pci_address is None and odd.numa_node is None
    assert odd.ports[0].counters == {"tx_bytes": 5}


def test_missing_root_reads_as_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert read_efa(missing) == ()
    assert read_numa(missing) == ()
    assert read_pci_locations(missing, ["0000:53:00.0"]) == {}
    assert read_process_cpus(missing, [1]) == {}
    assert read_rootfs_read_only(missing) is None


def test_concurrent_reader_never_sees_a_partial_number(tmp_path: Path) -> None:
    s = SimulatedSysfs(tmp_path, get_profile("p6e-gb200.36xlarge"), seed=1)
    s.write(now=0.0)
    stop = threading.Event()
    failures: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            for d in read_efa(s.sysfs_root):
                if d.error or len(d.ports[0].counters) != 22:
                    failures.append(f"{d.device}: {d.error}")

    t = threading.Thread(target=reader)
    t.start()
    try:
        now = 0.0
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            now += 1.0
            s.advance(now)
    finally:
        stop.set()
        t.join()
    assert failures == []


# ------------------------------------------------------------------------------ layout


def test_tree_uses_the_kernels_relative_links(
    sim: SimulatedSysfs, profile: HardwareProfile
) -> None:
    sysfs = sim.sysfs_root
    efa = profile.efa[0]
    link = sysfs / "class" / "infiniband" / efa.name
    target = os.readlink(link)
    assert target.startswith("../../devices/pci") and target.endswith(
        f"/{efa.pci_address}/infiniband/{efa.name}"
    )
    assert os.readlink(link / "device") == f"../../../{efa.pci_address}"
    assert os.path.basename(os.readlink(link / "device" / "driver")) == "efa"
    bus = os.readlink(sysfs / "bus" / "pci" / "devices" / efa.pci_address)
    assert bus.startswith("../../../devices/pci")
    gpu = profile.gpus[0].sysfs_address
    assert (
        os.path.basename(os.readlink(sysfs / "bus" / "pci" / "devices" / gpu / "driver"))
        == "nvidia"
    )
    assert (link / "hw_counters" / "lifespan").read_text() == "10\n"
    assert (link / "ports" / "1" / "hw_counters" / "lifespan").read_text() == "10\n"
    assert (link / "node_type").read_text() == "7: unspecified\n"
    assert (sysfs / "devices" / "system" / "node" / "online").read_text() == "0-1\n"


def test_rate_text_follows_the_efa_driver() -> None:
    assert efa_rate_text(100) == "100 Gb/sec (4X EDR)\n"
    assert efa_rate_text(200) == "200 Gb/sec (4X HDR)\n"
    assert efa_rate_text(400) == "400 Gb/sec (8X HDR)\n"
    assert parse_rate("100 Gb/sec (4X EDR)\n") == 100e9
    assert parse_rate("2.5 Gb/sec (1X SDR)") == 2.5e9
    assert parse_rate("garbage") is None
    assert parse_rate("") is None


def test_cpu_formatting_round_trips() -> None:
    cpus = list(range(0, 48)) + list(range(96, 144))
    assert format_cpulist(cpus) == "0-47,96-143"
    assert parse_cpulist(format_cpulist(cpus)) == frozenset(cpus)
    assert format_cpumask(range(0, 4), 64) == "00000000,0000000f"
    assert format_cpumask([32], 40) == "00000001,00000000"


# ------------------------------------------------------------------------------ cpulist


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", set()),
        ("\n", set()),
        ("0", {0}),
        ("0-3", {0, 1, 2, 3}),
        ("0-47,96-143\n", set(range(48)) | set(range(96, 144))),
        (" 1,3-4 \n", {1, 3, 4}),
        ("5,5,4-5", {4, 5}),
        ("0-7:2/4", {0, 1, 4, 5}),
        ("2-2", {2}),
    ],
)
def test_parse_cpulist(text: str, expected: set[int]) -> None:
    assert parse_cpulist(text) == frozenset(expected)


@pytest.mark.parametrize(
    "text", ["a", "3-1", "1,,2", "-1", "1-", "0-3:5/4", "0-3:1", "1 2", "0x3", "0-99999999"]
)
def test_parse_cpulist_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(text)


# ------------------------------------------------------------------------------ NUMA


def test_numa_nodes(sim: SimulatedSysfs, profile: HardwareProfile) -> None:
    nodes = read_numa(sim.sysfs_root)
    assert [n.node for n in nodes] == [n.node for n in profile.numa]
    for reading, spec in zip(nodes, profile.numa, strict=True):
        assert reading.cpus == frozenset(spec.cpus)
        assert parse_cpulist(reading.cpulist) == reading.cpus
        mem = reading.meminfo_bytes
        assert mem["MemTotal"] == spec.mem_total_bytes  # kB in the file, bytes here
        assert 0 < mem["MemFree"] < mem["MemTotal"]
        assert mem["HugePages_Total"] == 0  # a count, not scaled
        assert "Active(anon)" in mem
        assert set(reading.numastat) == {
            "numa_hit",
            "numa_miss",
            "numa_foreign",
            "interleave_hit",
            "local_node",
            "other_node",
        }
        assert reading.numastat["numa_hit"] > 0


def test_numastat_grows_with_time(sim: SimulatedSysfs) -> None:
    before = read_numa(sim.sysfs_root)[0].numastat["numa_hit"]
    sim.advance(1010.0)
    assert read_numa(sim.sysfs_root)[0].numastat["numa_hit"] > before


def test_numa_garbage_lines_are_skipped(sim: SimulatedSysfs) -> None:
    node = sim.sysfs_root / "devices" / "system" / "node" / "node0"
    good = (node / "meminfo").read_text()
    sim.corrupt(
        "sys/devices/system/node/node0/meminfo",
        good + "Node 0 Bogus:  twelve kB\nrandom junk\nNode 0 Odd: 5 MB\n\n",
    )
    sim.corrupt(
        "sys/devices/system/node/node0/numastat", "numa_hit 10\nnuma_miss x\njunk\nother_node 3\n"
    )
    (node / "extra").mkdir()
    reading = read_numa(sim.sysfs_root)[0]
    assert "Bogus" not in reading.meminfo_bytes and "Odd" not in reading.meminfo_bytes
    assert reading.meminfo_bytes["MemTotal"] == sim.profile.numa[0].mem_total_bytes
    assert dict(reading.numastat) == {"numa_hit": 10, "other_node": 3}


def test_numa_node_with_bad_cpulist_reads_with_no_cpus(sim: SimulatedSysfs) -> None:
    sim.corrupt("sys/devices/system/node/node1/cpulist", "banana\n")
    reading = read_numa(sim.sysfs_root)[1]
    assert reading.cpus == frozenset() and reading.cpulist == "banana"


# ------------------------------------------------------------------------------ PCI / proc


def test_pci_locations(sim: SimulatedSysfs, profile: HardwareProfile) -> None:
    gpu = profile.gpus[0]
    efa = next(e for e in profile.efa if e.switch == gpu.switch)
    locs = read_pci_locations(sim.sysfs_root, [gpu.sysfs_address, efa.pci_address, "0000:ee:00.0"])
    assert "0000:ee:00.0" not in locs
    g, e = locs[gpu.sysfs_address], locs[efa.pci_address]
    assert g.address == gpu.sysfs_address and g.path[-1] == gpu.sysfs_address
    assert (
        g.path[0].startswith("pci") and len(g.path) == 5
    )  # host bridge, root port, switch up, down, GPU
    assert g.path[:3] == e.path[:3]  # same switch
    assert g.numa_node == gpu.numa_node
    node_cpus = next(n.cpus for n in profile.numa if n.node == gpu.numa_node)
    assert g.local_cpus == frozenset(node_cpus)
    # NVML's bus id form is accepted and keyed as given.
    assert read_pci_locations(sim.sysfs_root, [gpu.pci_bus_id])[gpu.pci_bus_id].path == g.path


def test_pci_location_numa_minus_one_is_none(sim: SimulatedSysfs, profile: HardwareProfile) -> None:
    addr = profile.gpus[0].sysfs_address
    sim.corrupt(f"sys/bus/pci/devices/{addr}/numa_node", "-1\n")
    assert read_pci_locations(sim.sysfs_root, [addr])[addr].numa_node is None


def test_process_cpus(sim: SimulatedSysfs, profile: HardwareProfile) -> None:
    pids = [40000 + g.index for g in profile.gpus]
    cpus = read_process_cpus(sim.proc_root, [*pids, 99999])
    assert set(cpus) == set(pids)  # the pid that does not exist is skipped
    last = pids[-1]
    last_numa = next(n for n in profile.numa if n.node == profile.gpus[-1].numa_node)
    assert cpus[last] == frozenset(last_numa.cpus)  # pinned, as every process
    assert cpus[pids[0]] == frozenset(profile.numa[0].cpus)
    sim.inject(Fault(kind="numa-unpinned", gpu=len(pids) - 1))
    unpinned = read_process_cpus(sim.proc_root, pids)[last]
    assert unpinned == frozenset(c for n in profile.numa for c in n.cpus)
    sim.corrupt(f"proc/{pids[0]}/status", "Name:\tx\nCpus_allowed_list:\tnot-a-list\n")
    assert pids[0] not in read_process_cpus(sim.proc_root, pids)


def test_rootfs_read_only(sim: SimulatedSysfs) -> None:
    assert read_rootfs_read_only(sim.proc_root) is False
    fault = Fault(kind="rootfs-ro")
    sim.inject(fault)
    assert read_rootfs_read_only(sim.proc_root) is True
    sim.clear(fault)
    assert read_rootfs_read_only(sim.proc_root) is False


def test_rootfs_parsing(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "mounts").write_text("/dev/sda1 / ext4 ro,relatime 0 0\n")
    assert read_rootfs_read_only(tmp_path) is True  # falls back to self/mounts
    (tmp_path / "mounts").write_text(
        "/dev/sda1 / ext4 ro,relatime 0 0\noverlay / overlay rw,lowerdir=/a 0 0\ngarbage\n"
    )
    assert read_rootfs_read_only(tmp_path) is False  # the last mount over / wins
    (tmp_path / "mounts").write_text("tmpfs /run tmpfs rw 0 0\n")
    assert read_rootfs_read_only(tmp_path) is None


# ------------------------------------------------------------------------------ this machine


def test_real_readers_on_this_machine_do_not_raise() -> None:
    efa = read_efa(Path("/sys"))
    assert all(d.device for d in efa)
    numa = read_numa(Path("/sys"))
    if Path("/sys/devices/system/node/node0").exists():
        assert numa and numa[0].node == 0 and numa[0].meminfo_bytes.get("MemTotal", 0) > 0
    pci = (
        sorted(os.listdir("/sys/bus/pci/devices")) if Path("/sys/bus/pci/devices").exists() else []
    )
    locs = read_pci_locations(Path("/sys"), pci[:8])
    assert set(locs) == set(pci[:8])
    mine = read_process_cpus(Path("/proc"), [os.getpid()])
    assert mine.get(os.getpid()) == frozenset(os.sched_getaffinity(0))
    assert read_rootfs_read_only(Path("/proc")) in (True, False, None)


# ------------------------------------------------------------------------------ node_exporter


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.real_component
def test_debian_node_exporter_reads_the_tree(tmp_path: Path) -> None:
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        pytest.skip("prometheus-node-exporter not installed")
    s = SimulatedSysfs(tmp_path, get_profile("p5.48xlarge"))
    s.write(now=0.0)
    port = _free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--path.sysfs={s.sysfs_root}",
            f"--path.procfs={s.proc_root}",
            "--collector.disable-defaults",
            "--collector.infiniband",
            "--collector.meminfo_numa",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        body = ""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    body = r.read().decode()
                break
            except OSError:
                time.sleep(0.1)
        assert 'node_scrape_collector_success{collector="infiniband"} 1' in body
        assert 'node_scrape_collector_success{collector="meminfo_numa"} 1' in body
        states = re.findall(
            r'^node_infiniband_state_id\{device="(rdmap\d+s\d+)",port="1"\} 4$', body, re.M
        )
        assert len(states) == 32
        assert (
            'node_infiniband_rate_bytes_per_second{device="rdmap16s27",port="1"} 1.25e+10' in body
        )
        assert re.search(r'^node_memory_numa_MemTotal\{node="1"\} 1\.073741824e\+12$', body, re.M)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
