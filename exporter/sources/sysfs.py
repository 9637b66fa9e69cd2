"""Production readers of a sysfs root and a proc root: EFA devices, NUMA nodes, PCI locality,
process CPU masks and the root filesystem's mount options.

Every function takes the root as a parameter (the callers pass `/sys` and `/proc` in production,
`/host/sys` in a container, or a simulated tree in tests), so the simulation is just another root.
Nothing here raises for what a file contains: garbage is skipped (and, for EFA, named in the
reading's `error`), a missing file is simply absent, and a device that disappears while it is
being read (hot-unplug, driver reset) is left out of the result. A root that does not exist
reads as "nothing there" (`()`, `{}`, `None`): the caller sees the empty result, which the EFA
and NUMA collectors report as zero devices, a condition the health checks already flag.

EFA reading is on the agent's hot path (the whole poll cycle has a 25 ms CPU budget and a p5 node
has 32 devices x 34 counter files), so `read_efa` uses raw `os.open`/`os.read` relative to
directory file descriptors (no pathlib, no path re-resolution through the class symlinks for
each file) and lists each hw_counters directory exactly once per call.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from types import MappingProxyType

from exporter.core.snapshot import (
    EfaDeviceReading,
    EfaNetdevReading,
    EfaPortReading,
    NumaNodeReading,
)
from exporter.sources.pci import nvml_to_sysfs_address

StrPath = str | os.PathLike[str]

# Kernel order, drivers/infiniband/hw/efa/efa_verbs.c EFA_DEFINE_DEVICE_STATS.
EFA_DEVICE_COUNTERS: tuple[str, ...] = (
    "submitted_cmds",
    "completed_cmds",
    "cmds_err",
    "no_completion_cmds",
    "keep_alive_rcvd",
    "alloc_pd_err",
    "create_qp_err",
    "create_cq_err",
    "reg_mr_err",
    "alloc_ucontext_err",
    "create_ah_err",
    "mmap_err",
)

# Kernel order, EFA_DEFINE_PORT_STATS.
EFA_PORT_COUNTERS: tuple[str, ...] = (
    "tx_bytes",
    "tx_pkts",
    "rx_bytes",
    "rx_pkts",
    "rx_drops",
    "send_bytes",
    "send_wrs",
    "recv_bytes",
    "recv_wrs",
    "rdma_read_wrs",
    "rdma_read_bytes",
    "rdma_read_wr_err",
    "rdma_read_resp_bytes",
    "rdma_write_wrs",
    "rdma_write_bytes",
    "rdma_write_wr_err",
    "rdma_write_recv_bytes",
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
)

# Files in a hw_counters directory that are not counters (RDMA core's cache period, in ms).
_NOT_COUNTERS = frozenset({"lifespan"})

# The rdma-core udev rules name PCI RDMA devices "rdmap<bus>s<slot>[f<fn>]" (NAME_PCI scheme);
# on the instance types this agent targets the only such devices are EFA.
_EFA_NAME_PREFIX = "rdmap"

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC
_O_FILE = os.O_RDONLY | _CLOEXEC
_READ_SIZE = 128  # a u64 counter is at most 20 digits; sysfs attributes here are one short line

_DIGITS = re.compile(r"(\d+)")


@dataclass(frozen=True, slots=True)
class PciLocation:
    """Where one PCI function sits: its chain of sysfs device directories and its NUMA side."""

    address: str  # sysfs form, "0000:53:00.0"
    path: tuple[str, ...]  # realpath components below /sys/devices, host bridge first
    numa_node: int | None
    local_cpus: frozenset[int] | None


# --------------------------------------------------------------------------------------- EFA


def read_efa(sysfs_root: StrPath) -> tuple[EfaDeviceReading, ...]:
    """Read every EFA device under `<sysfs_root>/class/infiniband`, ordered by name.

    A device counts as EFA when its `device/driver` link points at the `efa` driver. When that
    link is absent (a container runtime that masks part of /sys, or a device caught while its
    driver unbinds) a device named `rdmap...` is still accepted: that is the name the rdma-core
    udev rules give PCI RDMA devices, and EFA is the only RDMA device on these instances. A
    device whose driver link names another driver (mlx5_core, irdma, ...) is left out.

    Each device's `netdev` is the ENA interface of the same ENI, where there is one (see
    `_pair_netdevs`); EFA-only interfaces have none.
    """
    class_dir = os.path.join(os.fspath(sysfs_root), "class", "infiniband")
    try:
        class_fd = os.open(class_dir, _O_DIR)
    except OSError:
        return ()
    try:
        try:
            names = os.listdir(class_fd)
        except OSError:
            return ()
        names.sort(key=_natural_key)
        out: list[EfaDeviceReading] = []
        macs: dict[str, str] = {}  # device -> ENI MAC its GID carries
        for name in names:
            reading = _read_efa_device(class_fd, name, macs)
            if reading is not None:
                out.append(reading)
        if macs:
            return _pair_netdevs(sysfs_root, out, macs)
        return tuple(out)
    finally:
        os.close(class_fd)


# ----------------------------------------------------------------------------- EFA netdev


def _pair_netdevs(
    sysfs_root: StrPath, devices: list[EfaDeviceReading], macs: dict[str, str]
) -> tuple[EfaDeviceReading, ...]:
    """Attach to each EFA device the ENA interface of the same ENI, matched by MAC address.

    The efa driver ties no netdev to its IB device (amzn-drivers kernel/linux/efa: no get_netdev,
    no ib_device_set_netdev), and the ENA and EFA halves of an "EFA with ENA" interface are two
    PCI functions (device ids 0xec20.. for ena, 0xefa0..0xefa3 for efa; lspci on trn1 in the
    Neuron docs lists ENA at a0:00.0 and EFA at a0:19.0), so the netdev hangs under the ENA
    function, not under `/sys/class/infiniband/<dev>/device/net/` where NVSentinel's
    EFAStateCheck looks (its doc asks for validation on p4d/p5). What ties them is the ENI:
    the device's GID (`ports/1/gids/0`, the address the device reports, efa_query_gid) is
    fe80::/64 with the ENI MAC as modified EUI-64 (ff:fe in the middle, the U/L bit flipped),
    e.g. port GUID 0x100bf5fffe02e2b0 for MAC 12:0b:f5:02:e2:b0 (amzn/amzn-drivers#114). So
    the interface under `/sys/class/net` with that `address` and a `device` link (a bridge or
    VLAN on top of the ENA shares its MAC but has none) is the device's ENA. An EFA-only
    interface (p5's usual layout: no ENA on most network cards) matches nothing and keeps
    `netdev=None`. An interface that vanishes between listing and reading is left out.
    """
    net_dir = os.path.join(os.fspath(sysfs_root), "class", "net")
    try:
        net_fd = os.open(net_dir, _O_DIR)
    except OSError:
        return tuple(devices)
    try:
        try:
            interfaces = os.listdir(net_fd)
        except OSError:
            return tuple(devices)
        wanted = {mac: dev for dev, mac in macs.items()}
        found: dict[str, EfaNetdevReading] = {}
        for iface in sorted(interfaces):
            try:
                if_fd = os.open(iface, _O_DIR, dir_fd=net_fd)
            except OSError:
                continue  # gone since the listing
            try:
                try:
                    os.readlink("device", dir_fd=if_fd)
                except OSError:
                    continue  # virtual (bridge, VLAN, bond, veth): it may share the ENA's MAC
                address = _read_attr(if_fd, "address")
                if address is None:
                    continue
                dev = wanted.get(address.strip().lower())
                if dev is None or dev in found:
                    continue
                found[dev] = _read_netdev(if_fd, iface)
            finally:
                os.close(if_fd)
    finally:
        os.close(net_fd)
    if not found:
        return tuple(devices)
    return tuple(
        dataclasses.replace(d, netdev=found[d.device]) if d.device in found else d for d in devices
    )


def _read_netdev(if_fd: int, iface: str) -> EfaNetdevReading:
    """operstate, carrier and carrier_changes of one interface.

    `carrier` fails with EINVAL while the interface is administratively down (the kernel only
    answers it for a running device); that reads as unknown (None), not as an error:
    operstate already says "down" then.
    """
    operstate = _read_attr(if_fd, "operstate")
    carrier_text = _read_attr(if_fd, "carrier")
    changes_text = _read_attr(if_fd, "carrier_changes")
    carrier = None
    if carrier_text is not None and carrier_text.strip() in ("0", "1"):
        carrier = carrier_text.strip() == "1"
    changes = None
    if changes_text is not None and changes_text.strip().isdigit():
        changes = int(changes_text)
    return EfaNetdevReading(
        interface=iface,
        operstate=(operstate.strip().lower() or None) if operstate is not None else None,
        carrier=carrier,
        carrier_changes=changes,
    )


def _read_attr(dir_fd: int | None, name: str) -> str | None:
    """A short attribute as text; None when it is absent or cannot be read (EINVAL, ENOENT)."""
    try:
        fd = os.open(name, _O_FILE, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        data = os.read(fd, _READ_SIZE)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data.decode("ascii", "replace")


def gid_mac(gid: str) -> str | None:
    """The MAC an EFA GID carries as modified EUI-64 ("fe80:0000:0000:0000:100b:f5ff:fe02:e2b0"
    -> "12:0b:f5:02:e2:b0"); None when the interface id is not EUI-64 from a MAC."""
    parts = gid.strip().split(":")
    if len(parts) != 8:
        return None
    try:
        words = [int(p, 16) for p in parts[4:]]
    except ValueError:
        return None
    raw = b"".join(w.to_bytes(2, "big") for w in words if 0 <= w <= 0xFFFF)
    if len(raw) != 8 or raw[3:5] != b"\xff\xfe":
        return None
    mac = bytes([raw[0] ^ 0x02, raw[1], raw[2], raw[5], raw[6], raw[7]])
    return ":".join(f"{b:02x}" for b in mac)


def _read_efa_device(class_fd: int, name: str, macs: dict[str, str]) -> EfaDeviceReading | None:
    try:
        dev_fd = os.open(name, _O_DIR, dir_fd=class_fd)
    except OSError:
        return None  # vanished between the listing and now, or not a directory
    try:
        try:
            driver = os.readlink("device/driver", dir_fd=dev_fd)
        except OSError:
            if not name.startswith(_EFA_NAME_PREFIX):
                return None
        else:
            if driver.rstrip("/").rpartition("/")[2] != "efa":
                return None

        errors: list[str] = []
        counters = _read_counters(dev_fd, EFA_DEVICE_COUNTERS, "hw_counters", errors)
        ports = _read_ports(dev_fd, errors)
        if (counters is None or ports is None) and (
            (counters is None and ports is None) or not _exists(class_fd, name)
        ):
            return None  # the device went away while we read it
        pci_address = _pci_address(dev_fd)
        numa_node = _read_numa_node(dev_fd, "device/numa_node")
        gid = _read_attr(dev_fd, "ports/1/gids/0")
        mac = gid_mac(gid) if gid is not None else None
        if mac is not None:
            macs[name] = mac
        return EfaDeviceReading(
            device=name,
            pci_address=pci_address,
            numa_node=numa_node,
            counters=MappingProxyType(counters or {}),
            ports=ports or (),
            error="; ".join(errors) if errors else None,
        )
    finally:
        os.close(dev_fd)


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd)
    except OSError:
        return False
    return True


def _read_counters(
    parent_fd: int, known: tuple[str, ...], where: str, errors: list[str]
) -> dict[str, int] | None:
    """Read one hw_counters directory (listed once). None when the directory is not there."""
    try:
        hw_fd = os.open("hw_counters", _O_DIR, dir_fd=parent_fd)
    except OSError:
        return None
    o_open, o_read, o_close = os.open, os.read, os.close
    counters: dict[str, int] = {}
    try:
        try:
            present = set(os.listdir(hw_fd))
        except OSError:
            return None
        names = [n for n in known if n in present]
        if len(names) != len(present):  # counters a newer kernel added: keep them, after
            extra = present.difference(known, _NOT_COUNTERS)
            names.extend(sorted(n for n in extra if not n.startswith(".")))
        for cname in names:
            try:
                fd = o_open(cname, _O_FILE, dir_fd=hw_fd)
            except FileNotFoundError:
                continue  # gone since the listing: treated like a kernel without it
            except OSError as exc:
                errors.append(f"{where}/{cname}: {_errno_name(exc)}")
                continue
            try:
                data = o_read(fd, _READ_SIZE)
            except OSError as exc:  # a failed stats query surfaces as EIO/ETIMEDOUT on read
                errors.append(f"{where}/{cname}: {_errno_name(exc)}")
                continue
            finally:
                o_close(fd)
            value = data.strip()
            if value.isdigit():
                counters[cname] = int(value)
            else:
                errors.append(f"{where}/{cname}: not an integer")
    finally:
        os.close(hw_fd)
    return counters


def _read_ports(dev_fd: int, errors: list[str]) -> tuple[EfaPortReading, ...] | None:
    try:
        ports_fd = os.open("ports", _O_DIR, dir_fd=dev_fd)
    except OSError:
        return None
    try:
        try:
            entries = os.listdir(ports_fd)
        except OSError:
            return None
        numbers = sorted(int(e) for e in entries if e.isdigit())
        out: list[EfaPortReading] = []
        for number in numbers:
            port = _read_port(ports_fd, number, errors)
            if port is not None:
                out.append(port)
        return tuple(out)
    finally:
        os.close(ports_fd)


def _read_port(ports_fd: int, number: int, errors: list[str]) -> EfaPortReading | None:
    try:
        port_fd = os.open(str(number), _O_DIR, dir_fd=ports_fd)
    except OSError:
        return None
    where = f"ports/{number}"
    try:
        state_code, state = _read_numbered(port_fd, "state", where, errors)
        _, phys_state = _read_numbered(port_fd, "phys_state", where, errors)
        link_layer: str | None = None
        raw = _read_small(port_fd, "link_layer", where, errors)
        if raw is not None:
            link_layer = raw.strip() or None
        rate: float | None = None
        raw = _read_small(port_fd, "rate", where, errors)
        if raw is not None:
            rate = parse_rate(raw)
            if rate is None:
                errors.append(f"{where}/rate: malformed")
        counters = _read_counters(port_fd, EFA_PORT_COUNTERS, f"{where}/hw_counters", errors)
        return EfaPortReading(
            port=number,
            state=state,
            state_code=state_code,
            phys_state=phys_state,
            link_layer=link_layer,
            rate_bits_per_second=rate,
            counters=MappingProxyType(counters or {}),
        )
    finally:
        os.close(port_fd)


def _read_small(dir_fd: int, name: str, where: str, errors: list[str]) -> str | None:
    """One short attribute file as text; None when absent (silently) or unreadable (noted)."""
    try:
        fd = os.open(name, _O_FILE, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        errors.append(f"{where}/{name}: {_errno_name(exc)}")
        return None
    try:
        data = os.read(fd, _READ_SIZE)
    except OSError as exc:
        errors.append(f"{where}/{name}: {_errno_name(exc)}")
        return None
    finally:
        os.close(fd)
    return data.decode("ascii", "replace")


def _read_numbered(
    dir_fd: int, name: str, where: str, errors: list[str]
) -> tuple[int | None, str | None]:
    """A "4: ACTIVE"-style port attribute: (code, text), (None, None) if absent or malformed."""
    raw = _read_small(dir_fd, name, where, errors)
    if raw is None:
        return None, None
    parsed = _parse_numbered(raw)
    if parsed is None:
        errors.append(f"{where}/{name}: malformed")
        return None, None
    return parsed


def _parse_numbered(text: str) -> tuple[int, str] | None:
    """ "4: ACTIVE" -> (4, "ACTIVE"), the form of a port's state and phys_state."""
    code, sep, label = text.partition(":")
    code = code.strip()
    label = label.strip()
    if not sep or not code.isdigit() or not label:
        return None
    return int(code), label


def parse_rate(text: str) -> float | None:
    """A port's `rate` ("100 Gb/sec (4X EDR)", "2.5 Gb/sec (1X SDR)") in bits per second."""
    parts = text.split()
    if len(parts) < 2 or not parts[1].startswith("Gb/sec"):
        return None
    try:
        gbps = float(parts[0])
    except ValueError:
        return None
    if gbps < 0 or gbps != gbps or gbps == float("inf"):
        return None
    return gbps * 1e9


def _pci_address(dev_fd: int) -> str | None:
    """Basename of the `device` link (the kernel's is "../../../0000:10:1b.0")."""
    try:
        target = os.readlink("device", dir_fd=dev_fd)
    except OSError:
        return None
    base = target.rstrip("/").rpartition("/")[2]
    return None if base in ("", ".", "..") else base


def _read_numa_node(dir_fd: int | None, path: str) -> int | None:
    """A `numa_node` attribute; -1 (no affinity reported) and garbage read as None."""
    text = _read_attr(dir_fd, path)
    try:
        value = int(text) if text is not None else -1
    except ValueError:
        return None
    return value if value >= 0 else None


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno, "error") if exc.errno else type(exc).__name__


def _natural_key(name: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(name))


# -------------------------------------------------------------------------------------- NUMA

_NUMASTAT_KEYS = frozenset(
    {"numa_hit", "numa_miss", "numa_foreign", "interleave_hit", "local_node", "other_node"}
)


def read_numa(sysfs_root: StrPath) -> tuple[NumaNodeReading, ...]:
    """Every `<sysfs_root>/devices/system/node/node<N>`, by node number.

    meminfo values given in kB are returned in bytes under the kernel's key ("MemTotal",
    "Active(anon)", ...); unitless values (HugePages_Total, HugePages_Free, HugePages_Surp)
    stay counts. numastat keeps the six kernel counters (pages). Malformed lines are skipped; a
    node whose cpulist cannot be parsed reads with an empty cpu set (as a CPU-less node does).
    """
    base = os.path.join(os.fspath(sysfs_root), "devices", "system", "node")
    try:
        entries = os.listdir(base)
    except OSError:
        return ()
    nodes = sorted(int(e[4:]) for e in entries if e.startswith("node") and e[4:].isdigit())
    out: list[NumaNodeReading] = []
    for node in nodes:
        node_dir = f"{base}/node{node}"
        if not os.path.isdir(node_dir):
            continue  # offlined between listing and now
        cpulist = (_read_text(f"{node_dir}/cpulist") or "").strip()
        cpus = _cpulist_or_none(cpulist) or frozenset()
        out.append(
            NumaNodeReading(
                node=node,
                cpus=cpus,
                cpulist=cpulist,
                meminfo_bytes=MappingProxyType(
                    _parse_node_meminfo(_read_text(f"{node_dir}/meminfo"))
                ),
                numastat=MappingProxyType(_parse_numastat(_read_text(f"{node_dir}/numastat"))),
            )
        )
    return tuple(out)


def _parse_node_meminfo(text: str | None) -> dict[str, int]:
    """ "Node 0 MemTotal:       1048576 kB" -> {"MemTotal": 1073741824}."""
    out: dict[str, int] = {}
    if not text:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) not in (4, 5) or parts[0] != "Node" or not parts[2].endswith(":"):
            continue
        key = parts[2][:-1]
        if not key or not parts[3].isdigit():
            continue
        value = int(parts[3])
        if len(parts) == 5:
            if parts[4] != "kB":
                continue
            value *= 1024
        out[key] = value
    return out


def _parse_numastat(text: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    if not text:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in _NUMASTAT_KEYS and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse the kernel's list format ("0-47,96-143", "3", "", "0-15:2/4") into CPU numbers.

    Accepts what bitmap_parselist() accepts: comma-separated single CPUs and ranges, a range
    optionally strided as "a-b:used/group". Surrounding whitespace and a trailing newline are
    fine; an empty list is the empty set. Anything else raises ValueError, so a caller never
    acts on half a mask.
    """
    text = text.strip()
    if not text:
        return frozenset()
    cpus: set[int] = set()
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise ValueError(f"empty item in cpu list {text!r}")
        rng, colon, stride = item.partition(":")
        lo_s, dash, hi_s = rng.partition("-")
        if not lo_s.isdigit() or (dash and not hi_s.isdigit()):
            raise ValueError(f"bad cpu list item {item!r}")
        lo = int(lo_s)
        hi = int(hi_s) if dash else lo
        if hi < lo:
            raise ValueError(f"descending range {item!r}")
        if hi - lo > 1 << 20:
            raise ValueError(f"implausibly large range {item!r}")
        if colon:
            used_s, slash, group_s = stride.partition("/")
            if not dash or not slash or not used_s.isdigit() or not group_s.isdigit():
                raise ValueError(f"bad strided range {item!r}")
            used, group = int(used_s), int(group_s)
            if used == 0 or group == 0 or used > group:
                raise ValueError(f"bad stride in {item!r}")
            cpus.update(c for c in range(lo, hi + 1) if (c - lo) % group < used)
        else:
            cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def _cpulist_or_none(text: str) -> frozenset[int] | None:
    try:
        return parse_cpulist(text)
    except ValueError:
        return None


# --------------------------------------------------------------------------------------- PCI


def read_pci_locations(sysfs_root: StrPath, addresses: Iterable[str]) -> dict[str, PciLocation]:
    """Where each PCI function sits, keyed by the address as given.

    Addresses may be in sysfs form ("0000:53:00.0") or NVML's ("00000000:53:00.0"). The path is
    where `<sysfs_root>/bus/pci/devices/<addr>` leads, split below `<sysfs_root>/devices`,
    so two functions behind the same PCIe switch share every component down to the switch's
    downstream ports. A function that is not there is absent from the result.
    """
    root = os.fspath(sysfs_root)
    devices_dir = os.path.normpath(os.path.join(root, "devices"))
    bus_dir = os.path.join(root, "bus", "pci", "devices")
    out: dict[str, PciLocation] = {}
    for given in addresses:
        addr = _sysfs_form(given)
        if addr is None or "/" in addr:
            continue
        real = _resolve_pci_link(bus_dir, addr)
        if real is None:
            continue
        rel = os.path.relpath(real, devices_dir)
        if rel.startswith(".."):
            parts = tuple(p for p in real.split("/") if p)
        else:
            parts = tuple(p for p in rel.split("/") if p and p != ".")
        cpulist = _read_text(f"{real}/local_cpulist")
        local_cpus = _cpulist_or_none(cpulist) if cpulist is not None else None
        out[given] = PciLocation(
            address=addr,
            path=parts,
            numa_node=_read_numa_node(None, f"{real}/numa_node"),
            local_cpus=local_cpus,
        )
    return out


def _resolve_pci_link(bus_dir: str, addr: str) -> str | None:
    """Where `bus/pci/devices/<addr>` points, without realpath's lstat of every component.

    The kernel's links are relative ("../../../devices/pci0000:00/.../0000:53:00.0") into the
    devices tree, which holds no further links, so resolving them lexically is exact. Anything
    else (an absolute or unusual link, as a hand-made tree may have) goes through realpath.
    """
    link = f"{bus_dir}/{addr}"
    try:
        target = os.readlink(link)
    except OSError:
        target = ""
    if target.startswith("../") and "/devices/" in target:
        real = os.path.normpath(os.path.join(bus_dir, target))
        return real if os.path.isdir(real) else None
    try:
        return os.path.realpath(link, strict=True)
    except OSError:
        return None


def _sysfs_form(address: str) -> str | None:
    address = address.strip().lower()
    domain, sep, _ = address.partition(":")
    if not sep:
        return None
    if len(domain) > 4:
        try:
            return nvml_to_sysfs_address(address)
        except ValueError:
            return None
    return address


# -------------------------------------------------------------------------------------- proc


def read_process_cpus(proc_root: StrPath, pids: Iterable[int]) -> dict[int, frozenset[int]]:
    """Each pid's `Cpus_allowed_list` from `<proc_root>/<pid>/status`.

    A pid that has exited, a status file that cannot be read, or one without a parseable
    Cpus_allowed_list is left out.
    """
    root = os.fspath(proc_root)
    out: dict[int, frozenset[int]] = {}
    for pid in pids:
        if pid in out:
            continue
        text = _read_text(f"{root}/{int(pid)}/status", 16384)
        if text is None:
            continue
        for line in text.splitlines():
            if line.startswith("Cpus_allowed_list:"):
                cpus = _cpulist_or_none(line[len("Cpus_allowed_list:") :])
                if cpus is not None:
                    out[pid] = cpus
                break
    return out


def read_rootfs_read_only(proc_root: StrPath) -> bool | None:
    """Whether "/" is mounted read-only, from `<proc_root>/mounts` (or `self/mounts`).

    The last "/" entry wins (a later mount over / hides the earlier ones). None when no mount
    table can be read or it has no "/" entry. Note that the table is the one of the mount
    namespace `<proc_root>` belongs to: pass the host's proc (e.g. /host/proc/1) to judge the
    host's root rather than the container's.
    """
    root = os.fspath(proc_root)
    text = _read_text(f"{root}/mounts", 1 << 20)
    if text is None:
        text = _read_text(f"{root}/self/mounts", 1 << 20)
    if text is None:
        return None
    result: bool | None = None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == "/":
            options = fields[3].split(",")
            if "ro" in options:
                result = True
            elif "rw" in options:
                result = False
    return result


# ------------------------------------------------------------------------------------ helpers


def _read_text(path: str, limit: int = 65536) -> str | None:
    try:
        fd = os.open(path, _O_FILE)
    except OSError:
        return None
    try:
        chunks: list[bytes] = []
        size = 0
        while size < limit:
            chunk = os.read(fd, min(65536, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")
