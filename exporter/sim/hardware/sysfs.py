"""A simulated /sys and /proc, written as real files in the kernel's layout from a profile.

The production readers (exporter/sources/sysfs.py) read this tree exactly as they read the real
one: there is no simulated reader. `SimulatedSysfs(root, profile)` writes `root/sys/...` and
`root/proc/...`; `advance(now)` moves the counters on with simulated time.

What is written (all paths below `root/sys`):

    devices/pci<dom>:<rb>/<dom>:<rb>:01.0/<upstream port>/<downstream port>/<function>/
        vendor device class numa_node local_cpulist local_cpus driver->bus/pci/drivers/<drv>
        (one host bridge and PCIe switch per profile switch; the GPU and that switch's EFA
        functions sit behind its downstream ports; bridges are bound to pcieport)
    <efa function>/infiniband/<dev>/
        device -> ../../../<function>      node_type "7: unspecified"    fw_ver (empty)
        node_guid sys_image_guid node_desc
        hw_counters/{12 device counters, lifespan}
        ports/1/{state "4: ACTIVE", phys_state "5: LinkUp", link_layer "Unspecified",
                 rate, lid, sm_lid, sm_sl, lid_mask_count, cap_mask, gids/0, pkeys/0,
                 hw_counters/{22 port counters, lifespan}}
    <ena function>/net/<if>/{address, operstate, carrier, carrier_changes, type, mtu, addr_len,
        device -> the ENA function}   (only for "EFA with ENA" interfaces: see below)
    class/net/<if> -> ../../devices/.../<ena function>/net/<if>
    bus/pci/devices/<addr> -> ../../../devices/...     (relative links, as the kernel makes)
    bus/pci/drivers/{efa,nvidia,pcieport}/<addr> -> the function
    class/infiniband/<dev> -> ../../devices/.../infiniband/<dev>
    devices/system/node/{online,possible,has_cpu,has_memory,has_normal_memory}
    devices/system/node/node<N>/{cpulist,cpumap,meminfo,numastat}

and below `root/proc`: `<pid>/status` for each `simulated_processes(profile)` entry (Name, Pid,
Cpus_allowed, Cpus_allowed_list, Mems_allowed_list, ...: pinned to its GPU's NUMA node, all
CPUs under the numa-unpinned fault) and `mounts` ("/" rw, or ro under the rootfs-ro fault).

EFA and ENA, as on the hardware: every port reads `4: ACTIVE` / `5: LinkUp` whatever happens,
because the efa driver hard-codes both (efa_query_port); no fault changes them. Every eighth EFA
device from the first (p5: 4 of 32; p4d, gb200: one) belongs to an "EFA with ENA" interface and
has an ENA netdev `ens<32+index>`; the others are EFA-only and have none. The ENA is its own PCI
function with its own netdev (the efa driver ties no netdev to its IB device, so the EFA
function has no `net/`); what pairs the two is the ENI's MAC, which the EFA GID (`gids/0`)
carries as modified EUI-64. `efa-link-down` changes what a dead link changes: the netdev's
operstate (down), carrier (0) and carrier_changes (+1), and the device's traffic counters stop
while retransmit timeouts and unresponsive-remote events rise.

Where the sim departs from a real kernel, on purpose:

* The ENA function is written next to its EFA function as function 1 of the EFA's slot, and is
  not listed under `bus/pci` (on real instances it has its own slot; nothing here looks it up
  by address).
* The port rate follows the EFA driver's efa_link_gbps_to_speed_and_width() mapping
  (100 -> "100 Gb/sec (4X EDR)", 200 -> "200 Gb/sec (4X HDR)", 400 -> "400 Gb/sec (8X HDR)").
* `ports/1/counters/` does not exist on a real EFA port (RDMA core only creates the PMA counter
  group for devices with process_mad, which EFA lacks), nor does `board_id` (a driver-specific
  attribute EFA does not define). Debian bookworm's prometheus-node-exporter 1.5.0 (its procfs
  InfiniBandClass) reads both unconditionally and drops its whole infiniband collector ("no
  data") when either is missing, so with `node_exporter_compat=True` (the default) an empty
  `counters/` directory and an empty `board_id` are written. The production readers ignore them.
* The p6e-gb200 profile puts a GPU in PCI domain 0008 behind the same switch as EFA functions
  of domain 0000. A real kernel never nests one domain under another; the sim follows the
  profile's switch assignment and names the switch's host bridge after the GPU's domain.
* Bus numbers of bridges are allocated from those the profile's functions leave free; they are
  illustrative, like the profile's.

Once the tree is built every file is replaced atomically, so a concurrent reader sees either the
old or the new value, never a partial number: `advance()` writes a spare file kept outside the
tree (`root/.simsysfs.spare`) and swaps it with the live one (renameat2 RENAME_EXCHANGE, falling
back to rename-over where that is missing), other changes write `root/.simsysfs.tmp` and rename
it over the target. `advance()` only rewrites the files whose value changed (about 17 per EFA
device and the numastat files), and creates no inode after its second call. Putting `root` on
tmpfs makes `write()` much cheaper (creating ~2,800 files costs far more on a disk filesystem).
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import math
import os
import random
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from exporter.sim.faults import Fault
from exporter.sim.hardware.profiles import EfaSpec, HardwareProfile, simulated_processes
from exporter.sources.sysfs import EFA_DEVICE_COUNTERS, EFA_PORT_COUNTERS

HANDLED_FAULTS = frozenset(
    {
        "efa-missing",
        "efa-unresponsive",
        "efa-link-down",
        "efa-admin-timeout",
        "rootfs-ro",
        "numa-unpinned",
    }
)
_EFA_DEVICE_FAULTS = frozenset(
    {"efa-missing", "efa-unresponsive", "efa-link-down", "efa-admin-timeout"}
)
# Every this-many-th EFA device (from the first) has an ENA netdev: "EFA with ENA" on that
# network card, EFA-only on the others (p5: 4 of 32, as the AWS P5 launch examples; p4d,
# gb200: the first).
_ENA_EVERY = 8

_EFA_VENDOR = "0x1d0f"
_EFA_DEVICE = "0xefa1"
_ENA_DEVICE = "0xec20"  # ENA VF
_NVIDIA_VENDOR = "0x10de"
_GPU_DEVICE_IDS = {"p5.48xlarge": "0x2330", "p6e-gb200.36xlarge": "0x2941"}
_BRIDGE_VENDOR = "0x1000"  # a Broadcom/PLX-style switch; illustrative
_BRIDGE_DEVICE = "0xc030"

_MTU_PAYLOAD = 8192  # average payload per packet on the wire
_HEADER_BYTES = 40
_SEND_WR_BYTES = 65536
_WRITE_WR_BYTES = 1 << 20
_READ_WR_BYTES = 256 << 10
_RETRANS_PKT_BYTES = _MTU_PAYLOAD + _HEADER_BYTES
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# Share of the payload in each direction carried by RDMA write / two-sided send / RDMA read.
_WRITE_SHARE, _SEND_SHARE, _READ_SHARE = 0.85, 0.10, 0.05


# efa_link_gbps_to_speed_and_width(): the first row whose floor the rate reaches wins.
_LINK_SPEEDS = (
    (1600, "XDR", 8),
    (800, "NDR", 8),
    (400, "HDR", 8),
    (200, "HDR", 4),
    (120, "FDR10", 12),
    (100, "EDR", 4),
    (60, "DDR", 12),
    (50, "HDR", 1),
    (40, "FDR10", 4),
    (30, "SDR", 12),
)


def _link_speed_width(gbps: int) -> tuple[str, int]:
    """The EFA driver's (IB speed name, lane count) for a link rate."""
    for floor, speed, width in _LINK_SPEEDS:
        if gbps >= floor:
            return speed, width
    return "EDR", 1


def efa_rate_text(gbps: int) -> str:
    """The `rate` file of an EFA port at that link speed, as RDMA core prints it."""
    speed, width = _link_speed_width(gbps)
    return f"{gbps} Gb/sec ({width}X {speed})\n"


def format_cpulist(cpus: Iterable[int]) -> str:
    """CPU numbers in the kernel's list form ("0-47,96-143")."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def format_cpumask(cpus: Iterable[int], nr_cpus: int) -> str:
    """CPU numbers as the kernel's comma-separated 32-bit hex mask ("ffffffff,0000ffff")."""
    mask = 0
    for c in cpus:
        mask |= 1 << c
    groups = max(1, math.ceil(nr_cpus / 32))
    return ",".join(f"{(mask >> (32 * g)) & 0xFFFFFFFF:08x}" for g in reversed(range(groups)))


@dataclass(slots=True)
class _PciFunction:
    address: str
    rel_dir: str  # below sys/devices
    numa_node: int
    vendor: str
    device: str
    pci_class: str
    driver: str


@dataclass(slots=True)
class _EfaState:
    spec: EfaSpec
    ib_dir: str = ""  # absolute, real path of <function>/infiniband/<dev>
    utilization: float = 0.5
    # cumulative payload bytes by category, and event counters
    tx_write: float = 0.0
    tx_send: float = 0.0
    tx_read_resp: float = 0.0
    rx_write: float = 0.0
    rx_recv: float = 0.0
    rx_read: float = 0.0
    alive_seconds: float = 0.0
    admin_cmds: float = 0.0
    retrans_pkts: int = 0
    retrans_timeouts: int = 0
    rx_drops: int = 0
    unresponsive: int = 0
    impaired: int = 0
    base: dict[str, int] = field(default_factory=dict)  # constant error counters
    written: dict[str, int] = field(default_factory=dict)  # path -> value on disk
    netdev: _Netdev | None = None  # the ENA interface of the same ENI; None: EFA-only


@dataclass(slots=True)
class _Netdev:
    """The ENA half of an "EFA with ENA" interface: its own PCI function, its own netdev."""

    name: str  # "ens32"
    mac: str  # "0a:..": the ENI's MAC, which the EFA GID carries as modified EUI-64
    pci_address: str  # the ENA function (function 1 of the EFA's slot here; see the docstring)
    carrier_changes: int = 2  # down->up at boot


class SimulatedSysfs:
    """A sysfs + procfs tree for one simulated node (see the module docstring for the layout)."""

    def __init__(
        self,
        root: Path,
        profile: HardwareProfile,
        faults: Sequence[Fault] = (),
        seed: int = 0,
        *,
        node_exporter_compat: bool = True,
    ) -> None:
        self._root = Path(root)
        self._profile = profile
        self._rng = random.Random(seed)
        self._compat = node_exporter_compat
        self._faults: list[Fault] = []
        self._nr_cpus = max((c for n in profile.numa for c in n.cpus), default=-1) + 1
        self._node_cpus = {n.node: n.cpus for n in profile.numa}
        # A GPU gone from the bus at the start (gpu-gone): the node booted without it, so the
        # kernel enumerated no PCI function there. Injected later it stays listed, as the
        # kernel keeps a device that fell off until it is removed or the node reboots.
        gone = {f.gpu for f in faults if f.kind == "gpu-gone"}
        self._functions = _pci_layout(profile, gone)
        self._by_address = {f.address: f for f in self._functions}
        self._efa: dict[str, _EfaState] = {}
        for index, spec in enumerate(profile.efa):
            self._efa[spec.name] = self._initial_state(spec)
            if index % _ENA_EVERY == 0:
                self._efa[spec.name].netdev = _ena_for(spec, index)
        self._numastat: dict[int, dict[str, float]] = {
            n.node: {
                "numa_hit": self._rng.uniform(2e9, 6e9),
                "numa_miss": 0.0,
                "numa_foreign": 0.0,
                "interleave_hit": float(self._rng.randint(20000, 90000)),
                "local_node": 0.0,
                "other_node": self._rng.uniform(1e6, 5e6),
            }
            for n in profile.numa
        }
        for stat in self._numastat.values():
            stat["local_node"] = stat["numa_hit"] - stat["other_node"]
        self._numastat_written: dict[int, str] = {}
        self._pinned: set[str] = set()  # real paths corrupt() wrote: advance() leaves them alone
        self._last: float | None = None
        self._real_root = ""
        self._tmp = ""
        self._spare_dir = ""
        self._spare_ids: dict[str, int] = {}
        self._generation = 0
        self._exchange = _Exchanger()
        self._building = False
        self._written = False
        for f in faults:
            if not self._add_fault(f) or f.device is None:
                continue
            if f.kind == "efa-link-down":
                self._link_change(self._efa[f.device])  # down since before the tree was read
            elif f.kind == "efa-admin-timeout":
                self._admin_timeout(self._efa[f.device])

    # ------------------------------------------------------------------------------ public

    @property
    def root(self) -> Path:
        return self._root

    @property
    def sysfs_root(self) -> Path:
        return self._root / "sys"

    @property
    def proc_root(self) -> Path:
        return self._root / "proc"

    @property
    def profile(self) -> HardwareProfile:
        return self._profile

    @property
    def faults(self) -> tuple[Fault, ...]:
        return tuple(self._faults)

    def pci_dir(self, address: str) -> Path:
        """The function's directory in the tree (below `sys/devices`)."""
        return self.sysfs_root / "devices" / self._by_address[address].rel_dir

    def efa_dir(self, device: str) -> Path:
        """The device's `infiniband/<dev>` directory (what `class/infiniband/<dev>` links to)."""
        spec = self._efa[device].spec
        return self.pci_dir(spec.pci_address) / "infiniband" / device

    def netdev_of(self, device: str) -> str | None:
        """The ENA interface paired with an EFA device; None for an EFA-only interface."""
        netdev = self._efa[device].netdev
        return None if netdev is None else netdev.name

    def write(self, now: float | None = None) -> None:
        """Create the whole tree (replacing `root/sys` and `root/proc` if they exist).

        `now`, when given, is the simulated time the counters are at; otherwise the first
        `advance()` call sets it.
        """
        self._root.mkdir(parents=True, exist_ok=True)
        self._real_root = os.path.realpath(self._root)
        self._tmp = os.path.join(self._real_root, ".simsysfs.tmp")
        self._spare_dir = os.path.join(self._real_root, ".simsysfs.spare")
        for sub in ("sys", "proc", ".simsysfs.spare"):
            target = os.path.join(self._real_root, sub)
            if os.path.lexists(target):
                shutil.rmtree(target)
        os.makedirs(self._spare_dir)
        self._spare_ids.clear()
        self._building = True
        try:
            self._build()
        finally:
            self._building = False
        self._written = True
        if now is not None:
            self._last = now

    def _build(self) -> None:
        sys_root = os.path.join(self._real_root, "sys")
        self._write_pci(sys_root)
        for state in self._efa.values():
            state.ib_dir = os.path.join(
                sys_root,
                "devices",
                self._by_address[state.spec.pci_address].rel_dir,
                "infiniband",
                state.spec.name,
            )
            state.written.clear()
        os.makedirs(os.path.join(sys_root, "class", "infiniband"), exist_ok=True)
        os.makedirs(os.path.join(sys_root, "class", "net"), exist_ok=True)
        for name, state in self._efa.items():
            if not self._has_fault("efa-missing", name):
                self._write_efa_device(state)
            if state.netdev is not None:
                self._write_netdev(state)
        self._numastat_written.clear()
        self._write_numa(sys_root)
        self._write_proc()

    def advance(self, now: float) -> None:
        """Move every counter on by the simulated time since the previous call (or `write(now)`).

        The first call without a previous time only fixes the starting point. Time going
        backwards counts as no time.
        """
        if not self._written:
            self.write(now)
            return
        if self._last is None:
            self._last = now
            return
        dt = max(0.0, now - self._last)
        self._last = now
        if dt == 0.0:
            return
        self._generation += 1
        rng = self._rng
        for name, state in self._efa.items():
            self._grow(
                state,
                dt,
                self._has_fault("efa-unresponsive", name),
                rng,
                link_down=self._has_fault("efa-link-down", name),
            )
            if not self._has_fault("efa-missing", name):
                self._write_counters(state)
        for node, stat in self._numastat.items():
            pages = dt * rng.uniform(1.5e5, 2.5e5)
            remote = pages * 0.002
            stat["numa_hit"] += pages
            stat["local_node"] += pages - remote
            stat["other_node"] += remote
            self._write_numastat(node)

    def inject(self, fault: Fault) -> None:
        """Start a fault now (efa-missing, efa-unresponsive, efa-link-down, efa-admin-timeout,
        rootfs-ro, numa-unpinned; others are ignored)."""
        if not self._add_fault(fault):
            return
        if fault.kind == "efa-link-down" and fault.device is not None:
            self._link_change(self._efa[fault.device])
        if fault.kind == "efa-admin-timeout" and fault.device is not None:
            self._admin_timeout(self._efa[fault.device])
        if not self._written:
            return
        if fault.kind == "efa-missing" and fault.device is not None:
            self._remove_efa_device(self._efa[fault.device])
        elif fault.kind == "rootfs-ro":
            self._write_mounts()
        elif fault.kind == "numa-unpinned":
            self._write_proc()

    def clear(self, fault: Fault) -> None:
        """End a fault: a missing device comes back (counters carry on), a dead link comes back
        up (one more carrier change), rootfs turns rw."""
        before = len(self._faults)
        self._faults = [f for f in self._faults if not _same_fault(f, fault)]
        if len(self._faults) == before:
            return
        device = fault.device
        if fault.kind == "efa-link-down" and device and not self._has_fault(fault.kind, device):
            self._link_change(self._efa[device])
        if fault.kind == "efa-admin-timeout" and device:
            # Clearing it is the device reset: the driver's counters restart at zero.
            self._efa[device].base["no_completion_cmds"] = 0
        if not self._written:
            return
        if fault.kind == "efa-missing" and fault.device is not None:
            if not self._has_fault("efa-missing", fault.device):
                state = self._efa[fault.device]
                state.written.clear()
                self._write_efa_device(state)
        elif fault.kind == "rootfs-ro":
            self._write_mounts()
        elif fault.kind == "numa-unpinned":
            self._write_proc()

    def corrupt(self, relative_path: str, text: str) -> None:
        """Replace one file (path relative to `root`, e.g. "sys/class/infiniband/rdmap16s27/
        hw_counters/cmds_err") with `text`. advance() leaves that file alone from then on,
        until `clear_corruption()`."""
        target = os.path.realpath(os.path.join(self._root, relative_path))
        self._atomic(target, text.encode())
        self._pinned.add(target)

    def clear_corruption(self) -> None:
        """Let advance() rewrite the corrupted files again (at the next value change)."""
        self._pinned.clear()
        for state in self._efa.values():
            state.written.clear()

    # ------------------------------------------------------------------------------ faults

    def _add_fault(self, fault: Fault) -> bool:
        if fault.kind not in HANDLED_FAULTS:
            return False
        if fault.kind in _EFA_DEVICE_FAULTS and fault.device not in self._efa:
            known = ", ".join(self._efa)
            raise ValueError(f"fault {fault}: no EFA device {fault.device!r} (known: {known})")
        if any(_same_fault(f, fault) for f in self._faults):
            return False
        self._faults.append(fault)
        return True

    def _has_fault(self, kind: str, device: str | None = None) -> bool:
        return any(f.kind == kind and f.device == device for f in self._faults)

    @staticmethod
    def _admin_timeout(st: _EfaState) -> None:
        """An admin command the device never completes: the driver counts it in
        no_completion_cmds and closes the admin queue until the device is reset (efa_com.c)."""
        st.base["no_completion_cmds"] += 1

    # ------------------------------------------------------------------------------ counters

    def _initial_state(self, spec: EfaSpec) -> _EfaState:
        rng = self._rng
        uptime = rng.uniform(2, 9) * 86400.0
        st = _EfaState(spec=spec, utilization=rng.uniform(0.35, 0.7))
        # A node that has been training for part of its uptime.
        bw = self._profile.efa_rate_gbps * 1e9 / 8 * st.utilization * rng.uniform(0.3, 0.6)
        total = bw * uptime
        st.tx_write, st.tx_send, st.tx_read_resp = (
            total * _WRITE_SHARE,
            total * _SEND_SHARE,
            total * _READ_SHARE,
        )
        rx_total = total * rng.uniform(0.98, 1.02)
        st.rx_write, st.rx_recv, st.rx_read = (
            rx_total * _WRITE_SHARE,
            rx_total * _SEND_SHARE,
            rx_total * _READ_SHARE,
        )
        st.alive_seconds = uptime
        st.admin_cmds = 600 + uptime * 0.05
        st.retrans_pkts = int(uptime * 0.05)
        st.retrans_timeouts = int(uptime * 0.0002)
        st.rx_drops = 0
        st.base = {
            "cmds_err": 0,
            "no_completion_cmds": 0,
            "alloc_pd_err": 0,
            "create_qp_err": 0,
            "create_cq_err": 0,
            "reg_mr_err": rng.choice((0, 0, 0, 2)),
            "alloc_ucontext_err": 0,
            "create_ah_err": 0,
            "mmap_err": 0,
            "rdma_read_wr_err": 0,
            "rdma_write_wr_err": 0,
        }
        return st

    def _grow(
        self,
        st: _EfaState,
        dt: float,
        unresponsive: bool,
        rng: random.Random,
        *,
        link_down: bool = False,
    ) -> None:
        util = min(1.0, st.utilization * rng.uniform(0.9, 1.1))
        line_rate = self._profile.efa_rate_gbps * 1e9 / 8
        if unresponsive:
            util *= 0.3  # collectives stall behind the unreachable peer
        st.alive_seconds += dt  # keep-alives come from the device, not over the link
        st.admin_cmds += dt * 0.05 * rng.uniform(0.5, 1.5)
        if link_down:
            # Nothing goes out or comes in; every queued send retransmits until it times out,
            # and every peer this device talks to stops answering.
            st.retrans_pkts += _events(rng, 200.0 * dt)
            st.retrans_timeouts += _events(rng, 20.0 * dt)
            st.unresponsive += _events(rng, 10.0 * dt)
            return
        tx = line_rate * util * dt
        rx = tx * rng.uniform(0.97, 1.03)
        st.tx_write += tx * _WRITE_SHARE
        st.tx_send += tx * _SEND_SHARE
        st.tx_read_resp += tx * _READ_SHARE
        st.rx_write += rx * _WRITE_SHARE
        st.rx_recv += rx * _SEND_SHARE
        st.rx_read += rx * _READ_SHARE
        st.retrans_pkts += _events(rng, (40.0 if unresponsive else 0.05) * dt)
        st.retrans_timeouts += _events(rng, (2.0 if unresponsive else 0.0002) * dt)
        st.rx_drops += _events(rng, 0.0005 * dt)
        if unresponsive:
            st.unresponsive += _events(rng, 5.0 * dt)
            st.impaired += _events(rng, 0.5 * dt)

    def _values(self, st: _EfaState) -> tuple[dict[str, int], dict[str, int]]:
        tx_payload = int(st.tx_write + st.tx_send + st.tx_read_resp)
        rx_payload = int(st.rx_write + st.rx_recv + st.rx_read)
        tx_pkts = -(-tx_payload // _MTU_PAYLOAD)
        rx_pkts = -(-rx_payload // _MTU_PAYLOAD)
        admin = int(st.admin_cmds)
        b = st.base
        device = {
            "submitted_cmds": admin,
            "completed_cmds": admin,
            "cmds_err": b["cmds_err"],
            "no_completion_cmds": b["no_completion_cmds"],
            "keep_alive_rcvd": int(st.alive_seconds),
            "alloc_pd_err": b["alloc_pd_err"],
            "create_qp_err": b["create_qp_err"],
            "create_cq_err": b["create_cq_err"],
            "reg_mr_err": b["reg_mr_err"],
            "alloc_ucontext_err": b["alloc_ucontext_err"],
            "create_ah_err": b["create_ah_err"],
            "mmap_err": b["mmap_err"],
        }
        port = {
            "tx_bytes": tx_payload + tx_pkts * _HEADER_BYTES,
            "tx_pkts": tx_pkts,
            "rx_bytes": rx_payload + rx_pkts * _HEADER_BYTES,
            "rx_pkts": rx_pkts,
            "rx_drops": st.rx_drops,
            "send_bytes": int(st.tx_send),
            "send_wrs": int(st.tx_send) // _SEND_WR_BYTES,
            "recv_bytes": int(st.rx_recv),
            "recv_wrs": int(st.rx_recv) // _SEND_WR_BYTES,
            "rdma_read_wrs": int(st.rx_read) // _READ_WR_BYTES,
            "rdma_read_bytes": int(st.rx_read),
            "rdma_read_wr_err": b["rdma_read_wr_err"],
            "rdma_read_resp_bytes": int(st.tx_read_resp),
            "rdma_write_wrs": int(st.tx_write) // _WRITE_WR_BYTES,
            "rdma_write_bytes": int(st.tx_write),
            "rdma_write_wr_err": b["rdma_write_wr_err"],
            "rdma_write_recv_bytes": int(st.rx_write),
            "retrans_bytes": st.retrans_pkts * _RETRANS_PKT_BYTES,
            "retrans_pkts": st.retrans_pkts,
            "retrans_timeout_events": st.retrans_timeouts,
            "unresponsive_remote_events": st.unresponsive,
            "impaired_remote_conn_events": st.impaired,
        }
        return device, port

    def _write_counters(self, st: _EfaState) -> None:
        device, port = self._values(st)
        written = st.written
        pinned = self._pinned
        write = self._write_new if self._building else self._update
        dev_dir = st.ib_dir + "/hw_counters/"
        port_dir = st.ib_dir + "/ports/1/hw_counters/"
        for prefix, names, values in (
            (dev_dir, EFA_DEVICE_COUNTERS, device),
            (port_dir, EFA_PORT_COUNTERS, port),
        ):
            for name in names:
                value = values[name]
                path = prefix + name
                if written.get(path) == value or path in pinned:
                    continue
                write(path, b"%d\n" % value)
                written[path] = value

    # ------------------------------------------------------------------------------ layout

    def _write_pci(self, sys_root: str) -> None:
        devices = os.path.join(sys_root, "devices")
        bus_devices = os.path.join(sys_root, "bus", "pci", "devices")
        drivers = os.path.join(sys_root, "bus", "pci", "drivers")
        os.makedirs(bus_devices, exist_ok=True)
        for fn in self._functions:
            d = os.path.join(devices, fn.rel_dir)
            os.makedirs(d, exist_ok=True)
            cpus = self._node_cpus.get(fn.numa_node, ())
            self._put(d + "/vendor", fn.vendor + "\n")
            self._put(d + "/device", fn.device + "\n")
            self._put(d + "/class", fn.pci_class + "\n")
            self._put(d + "/numa_node", f"{fn.numa_node}\n")
            self._put(d + "/local_cpulist", format_cpulist(cpus) + "\n")
            self._put(d + "/local_cpus", format_cpumask(cpus, self._nr_cpus) + "\n")
            drv_dir = os.path.join(drivers, fn.driver)
            os.makedirs(drv_dir, exist_ok=True)
            _symlink_rel(d, os.path.join(drv_dir, fn.address))
            _symlink_rel(drv_dir, os.path.join(d, "driver"))
            _symlink_rel(d, os.path.join(bus_devices, fn.address))

    def _write_efa_device(self, st: _EfaState) -> None:
        d = st.ib_dir
        port = d + "/ports/1"
        for sub in ("hw_counters", "ports/1/hw_counters", "ports/1/gids", "ports/1/pkeys"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        if self._compat:
            os.makedirs(port + "/counters", exist_ok=True)
            self._put(d + "/board_id", "\n")
        pci = os.path.dirname(os.path.dirname(d))
        _symlink_rel(pci, d + "/device", via_parent=True)
        guid = int.from_bytes(st.spec.name.encode()[-8:].rjust(8, b"\0"), "big") ^ 0x0E0A_0000
        guid_text = ":".join(f"{(guid >> s) & 0xFFFF:04x}" for s in (48, 32, 16, 0))
        self._put(d + "/node_type", "7: unspecified\n")
        self._put(d + "/fw_ver", "\n")
        self._put(d + "/node_guid", guid_text + "\n")
        self._put(d + "/sys_image_guid", guid_text + "\n")
        self._put(d + "/node_desc", f"{st.spec.name}\n")
        self._put(d + "/hw_counters/lifespan", "10\n")
        self._put(port + "/hw_counters/lifespan", "10\n")
        self._put(port + "/state", "4: ACTIVE\n")
        self._put(port + "/phys_state", "5: LinkUp\n")
        self._put(port + "/link_layer", "Unspecified\n")
        self._put(port + "/rate", efa_rate_text(self._profile.efa_rate_gbps))
        self._put(port + "/lid", "0x0\n")
        self._put(port + "/sm_lid", "0x0\n")
        self._put(port + "/sm_sl", "0\n")
        self._put(port + "/lid_mask_count", "1\n")
        self._put(port + "/cap_mask", "0x00000000\n")
        gid = guid_text if st.netdev is None else _eui64(st.netdev.mac)
        self._put(port + "/gids/0", "fe80:0000:0000:0000:" + gid + "\n")
        self._put(port + "/pkeys/0", "0xffff\n")
        self._write_counters(st)
        link = os.path.join(self._real_root, "sys", "class", "infiniband", st.spec.name)
        _symlink_rel(d, link)

    def _write_netdev(self, st: _EfaState) -> None:
        """The ENA function's netdev, `<ena function>/net/<if>`, linked from class/net."""
        netdev = st.netdev
        assert netdev is not None
        efa_fn = os.path.dirname(os.path.dirname(st.ib_dir))
        ena_fn = os.path.join(os.path.dirname(efa_fn), netdev.pci_address)
        d = os.path.join(ena_fn, "net", netdev.name)
        os.makedirs(d, exist_ok=True)
        for name, text in (
            ("vendor", _EFA_VENDOR),
            ("device", _ENA_DEVICE),
            ("class", "0x020000"),
            ("numa_node", str(st.spec.numa_node)),
        ):
            self._put(os.path.join(ena_fn, name), text + "\n")
        _symlink_rel(ena_fn, d + "/device")
        self._put(d + "/address", netdev.mac + "\n")
        self._put(d + "/type", "1\n")
        self._put(d + "/mtu", "9001\n")
        self._put(d + "/addr_len", "6\n")
        self._write_link(st)
        link = os.path.join(self._real_root, "sys", "class", "net", netdev.name)
        _symlink_rel(d, link)

    def _write_link(self, st: _EfaState) -> None:
        """operstate / carrier / carrier_changes as the link is now."""
        netdev = st.netdev
        assert netdev is not None
        efa_fn = os.path.dirname(os.path.dirname(st.ib_dir))
        d = os.path.join(os.path.dirname(efa_fn), netdev.pci_address, "net", netdev.name)
        down = self._has_fault("efa-link-down", st.spec.name)
        self._put(d + "/operstate", "down\n" if down else "up\n")
        self._put(d + "/carrier", "0\n" if down else "1\n")
        self._put(d + "/carrier_changes", f"{netdev.carrier_changes}\n")

    def _link_change(self, st: _EfaState) -> None:
        """The link went down or came back: one more carrier change, on the netdev if any."""
        if st.netdev is None:
            return  # an EFA-only interface: only the counters show it
        st.netdev.carrier_changes += 1
        if self._written:
            self._write_link(st)

    def _remove_efa_device(self, st: _EfaState) -> None:
        link = os.path.join(self._real_root, "sys", "class", "infiniband", st.spec.name)
        if os.path.lexists(link):
            os.unlink(link)
        if os.path.isdir(st.ib_dir):
            shutil.rmtree(st.ib_dir)
        st.written.clear()

    def _write_numa(self, sys_root: str) -> None:
        base = os.path.join(sys_root, "devices", "system", "node")
        os.makedirs(base, exist_ok=True)
        nodes = [n.node for n in self._profile.numa]
        node_list = format_cpulist(nodes) + "\n"
        for f in ("online", "possible", "has_cpu", "has_memory", "has_normal_memory"):
            self._put(f"{base}/{f}", node_list)
        rng = self._rng
        for spec in self._profile.numa:
            d = f"{base}/node{spec.node}"
            os.makedirs(d, exist_ok=True)
            self._put(d + "/cpulist", format_cpulist(spec.cpus) + "\n")
            self._put(d + "/cpumap", format_cpumask(spec.cpus, self._nr_cpus) + "\n")
            total_kb = spec.mem_total_bytes // 1024
            free_kb = int(total_kb * rng.uniform(0.55, 0.75))
            used_kb = total_kb - free_kb
            file_kb = int(used_kb * 0.6)
            anon_kb = int(used_kb * 0.3)
            slab_kb = int(used_kb * 0.04)
            rows: list[tuple[str, int, bool]] = [
                ("MemTotal", total_kb, True),
                ("MemFree", free_kb, True),
                ("MemUsed", used_kb, True),
                ("SwapCached", 0, True),
                ("Active", int((file_kb + anon_kb) * 0.6), True),
                ("Inactive", int((file_kb + anon_kb) * 0.4), True),
                ("Active(anon)", int(anon_kb * 0.9), True),
                ("Inactive(anon)", int(anon_kb * 0.1), True),
                ("Active(file)", int(file_kb * 0.4), True),
                ("Inactive(file)", int(file_kb * 0.6), True),
                ("Unevictable", 0, True),
                ("Mlocked", 0, True),
                ("Dirty", rng.randint(0, 4096), True),
                ("Writeback", 0, True),
                ("FilePages", file_kb, True),
                ("Mapped", int(file_kb * 0.05), True),
                ("AnonPages", anon_kb, True),
                ("Shmem", int(used_kb * 0.01), True),
                ("KernelStack", 40000, True),
                ("PageTables", int(anon_kb * 0.002), True),
                ("SecPageTables", 0, True),
                ("NFS_Unstable", 0, True),
                ("Bounce", 0, True),
                ("WritebackTmp", 0, True),
                ("KReclaimable", int(slab_kb * 0.7), True),
                ("Slab", slab_kb, True),
                ("SReclaimable", int(slab_kb * 0.7), True),
                ("SUnreclaim", slab_kb - int(slab_kb * 0.7), True),
                ("AnonHugePages", int(anon_kb * 0.5) // 2048 * 2048, True),
                ("ShmemHugePages", 0, True),
                ("ShmemPmdMapped", 0, True),
                ("FileHugePages", 0, True),
                ("FilePmdMapped", 0, True),
                ("HugePages_Total", 0, False),
                ("HugePages_Free", 0, False),
                ("HugePages_Surp", 0, False),
            ]
            lines = []
            for key, value, kb in rows:
                label = f"Node {spec.node} {key}:"
                lines.append(f"{label:<25}{value:>10} kB" if kb else f"{label:<25}{value:>6}")
            self._put(d + "/meminfo", "\n".join(lines) + "\n")
            self._write_numastat(spec.node)

    def _write_numastat(self, node: int) -> None:
        stat = self._numastat[node]
        text = "".join(
            f"{k} {int(stat[k])}\n"
            for k in (
                "numa_hit",
                "numa_miss",
                "numa_foreign",
                "interleave_hit",
                "local_node",
                "other_node",
            )
        )
        if self._numastat_written.get(node) == text:
            return
        path = os.path.join(
            self._real_root, "sys", "devices", "system", "node", f"node{node}", "numastat"
        )
        if path in self._pinned:
            return
        (self._write_new if self._building else self._update)(path, text.encode())
        self._numastat_written[node] = text

    def _write_proc(self) -> None:
        proc = os.path.join(self._real_root, "proc")
        os.makedirs(proc, exist_ok=True)
        unpinned = {f.gpu for f in self._faults if f.kind == "numa-unpinned" and f.gpu is not None}
        for p in simulated_processes(self._profile, unpinned):
            d = os.path.join(proc, str(p.pid))
            os.makedirs(d, exist_ok=True)
            mems = sorted(
                {n for n, cpus in self._node_cpus.items() if set(p.cpus_allowed) & set(cpus)}
            )
            status = (
                "Name:\tpt_main_thread\n"
                "Umask:\t0022\n"
                "State:\tS (sleeping)\n"
                f"Tgid:\t{p.pid}\n"
                "Ngid:\t0\n"
                f"Pid:\t{p.pid}\n"
                "PPid:\t39990\n"
                "TracerPid:\t0\n"
                "Uid:\t0\t0\t0\t0\n"
                "Gid:\t0\t0\t0\t0\n"
                "Threads:\t96\n"
                f"Cpus_allowed:\t{format_cpumask(p.cpus_allowed, self._nr_cpus)}\n"
                f"Cpus_allowed_list:\t{format_cpulist(p.cpus_allowed)}\n"
                f"Mems_allowed_list:\t{format_cpulist(mems)}\n"
                "voluntary_ctxt_switches:\t184467\n"
                "nonvoluntary_ctxt_switches:\t5120\n"
            )
            self._put(os.path.join(d, "status"), status)
            self._put(os.path.join(d, "comm"), "pt_main_thread\n")
        self._write_mounts()

    def _write_mounts(self) -> None:
        mode = "ro" if self._has_fault("rootfs-ro") else "rw"
        text = (
            f"/dev/nvme0n1p1 / ext4 {mode},relatime,discard 0 0\n"
            "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"
            "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n"
            "devtmpfs /dev devtmpfs rw,nosuid,size=1056761428k,mode=755 0 0\n"
            "tmpfs /run tmpfs rw,nosuid,nodev,size=211352288k,mode=755 0 0\n"
            "/dev/nvme1n1 /opt/dlami/nvme xfs rw,relatime,attr2,inode64,noquota 0 0\n"
        )
        self._put(os.path.join(self._real_root, "proc", "mounts"), text)

    # ------------------------------------------------------------------------------ files

    def _put(self, path: str, text: str) -> None:
        """A static file: written in place while write() builds a fresh tree (no reader can
        be looking yet), atomically otherwise."""
        if self._building:
            self._write_new(path, text.encode())
        else:
            self._atomic(path, text.encode())

    @staticmethod
    def _write_new(path: str, data: bytes) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def _atomic(self, path: str, data: bytes) -> None:
        """Write a temporary file, rename it over `path`."""
        tmp = self._tmp
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def _update(self, path: str, data: bytes) -> None:
        """Atomically replace a file advance() rewrites, without creating an inode each time.

        Creating a file is what an atomic replace costs on most disk filesystems (about 0.1 ms
        on ext4; far more than the write), so each such file has two spare files outside the
        tree: the new value goes into this generation's spare, which is then swapped with the
        live file by renameat2(RENAME_EXCHANGE). The old inode becomes the spare again and is
        only rewritten two advance() calls later, long after any reader that opened it has
        read it. Where RENAME_EXCHANGE is unavailable this falls back to a plain replace.
        """
        index = self._spare_ids.get(path)
        if index is None:
            index = self._spare_ids[path] = len(self._spare_ids)
        spare = f"{self._spare_dir}/{index}.{self._generation & 1}"
        # No O_TRUNC: ext4 flushes a file truncated to zero and rewritten when it is closed.
        fd = os.open(spare, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
        if not self._exchange(spare, path):
            os.replace(spare, path)


class _Exchanger:
    """renameat2(RENAME_EXCHANGE) through libc, when the platform has it."""

    def __init__(self) -> None:
        self._fn: Callable[[int, bytes, int, bytes, int], int] | None = None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.renameat2
        except (OSError, AttributeError):
            return
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        fn.restype = ctypes.c_int
        self._fn = fn

    def __call__(self, a: str, b: str) -> bool:
        """Swap two existing paths atomically; False when that could not be done."""
        fn = self._fn
        if fn is None:
            return False
        if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
            return True
        if ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            self._fn = None  # this kernel or filesystem cannot exchange: stop trying
        return False


def _ena_for(spec: EfaSpec, index: int) -> _Netdev:
    """The ENA of an "EFA with ENA" interface: a MAC of AWS's locally administered kind."""
    digest = hashlib.blake2b(spec.name.encode(), digest_size=5).digest()
    mac = ":".join(f"{b:02x}" for b in (0x0A, *digest))
    address = spec.pci_address[:-1] + "1"  # function 1 of the EFA's slot (see the docstring)
    return _Netdev(name=f"ens{32 + index}", mac=mac, pci_address=address)


def _eui64(mac: str) -> str:
    """A MAC as the last four GID words, modified EUI-64 ("0a:1b:2c:3d:4e:5f" ->
    "081b:2cff:fe3d:4e5f")."""
    b = bytes(int(x, 16) for x in mac.split(":"))
    raw = bytes([b[0] ^ 0x02, b[1], b[2], 0xFF, 0xFE, b[3], b[4], b[5]])
    return ":".join(raw[i : i + 2].hex() for i in range(0, 8, 2))


def _events(rng: random.Random, expected: float) -> int:
    """An integer count with the given mean (floor plus a Bernoulli on the fraction)."""
    whole = math.floor(expected)
    return whole + (1 if rng.random() < expected - whole else 0)


def _same_fault(a: Fault, b: Fault) -> bool:
    return a.kind == b.kind and a.device == b.device and a.gpu == b.gpu


def _symlink_rel(target: str, link: str, *, via_parent: bool = False) -> None:
    """A relative symlink at `link` to `target`, as the kernel's sysfs links are.

    `via_parent` spells a link to a directory's own ancestor the way sysfs does for an
    infiniband device's `device` link: up past the target, then back down by name
    ("../../../0000:10:1b.0").
    """
    base = os.path.dirname(link)
    if via_parent:
        parent = os.path.dirname(target)
        rel = os.path.join(os.path.relpath(parent, base), os.path.basename(target))
    else:
        rel = os.path.relpath(target, base)
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(rel, link)


def _pci_layout(profile: HardwareProfile, gone: Iterable[int | None] = ()) -> list[_PciFunction]:
    """One host bridge + root port + switch (upstream, downstream ports) per profile switch;
    no function for a GPU in `gone` (its slot), which the bus did not enumerate."""
    gpu_device = _GPU_DEVICE_IDS.get(profile.instance_type, "0x2330")
    members: dict[int, list[tuple[str, int, str]]] = {}  # switch -> (address, numa, kind)
    absent = set(gone)
    for g in profile.gpus:
        if g.index not in absent:
            members.setdefault(g.switch, []).append((g.sysfs_address, g.numa_node, "gpu"))
    for e in profile.efa:
        members.setdefault(e.switch, []).append((e.pci_address, e.numa_node, "efa"))

    used: dict[int, set[int]] = {}
    for group in members.values():
        for address, _, _ in group:
            dom, bus = _domain_bus(address)
            used.setdefault(dom, set()).add(bus)
    next_free: dict[int, int] = {}

    def alloc(dom: int) -> int:
        bus = next_free.get(dom, 0)
        taken = used.setdefault(dom, set())
        while bus in taken:
            bus += 1
        if bus > 0xFF:
            raise ValueError(f"profile {profile.instance_type}: out of bus numbers")
        taken.add(bus)
        next_free[dom] = bus + 1
        return bus

    out: list[_PciFunction] = []
    for switch in sorted(members):
        group = members[switch]
        dom, _ = _domain_bus(group[0][0])
        numa = group[0][1]
        root_bus, up_bus, down_bus = alloc(dom), alloc(dom), alloc(dom)
        host = f"pci{dom:04x}:{root_bus:02x}"
        root_port = f"{dom:04x}:{root_bus:02x}:01.0"
        upstream = f"{dom:04x}:{up_bus:02x}:00.0"
        chain = f"{host}/{root_port}/{upstream}"
        for addr, rel in ((root_port, f"{host}/{root_port}"), (upstream, chain)):
            out.append(
                _PciFunction(
                    addr, rel, numa, _BRIDGE_VENDOR, _BRIDGE_DEVICE, "0x060400", "pcieport"
                )
            )
        downstream: dict[str, str] = {}  # member bus ("0000:53") -> downstream port address
        for address, node, kind in group:
            bus_key = address.rsplit(":", 1)[0]
            if bus_key not in downstream:
                port = f"{dom:04x}:{down_bus:02x}:{len(downstream):02x}.0"
                downstream[bus_key] = port
                out.append(
                    _PciFunction(
                        port,
                        f"{chain}/{port}",
                        numa,
                        _BRIDGE_VENDOR,
                        _BRIDGE_DEVICE,
                        "0x060400",
                        "pcieport",
                    )
                )
            rel = f"{chain}/{downstream[bus_key]}/{address}"
            if kind == "gpu":
                out.append(
                    _PciFunction(
                        address, rel, node, _NVIDIA_VENDOR, gpu_device, "0x030200", "nvidia"
                    )
                )
            else:
                out.append(
                    _PciFunction(address, rel, node, _EFA_VENDOR, _EFA_DEVICE, "0x020000", "efa")
                )
    return out


def _domain_bus(address: str) -> tuple[int, int]:
    dom, bus, _ = address.split(":")
    return int(dom, 16), int(bus, 16)
