"""The `--fault SPEC` grammar shared by every simulation.

    xid=79@gpu3            an XID event on GPU 3 (delivered once, through the event set); an
                           XID the driver marks the GPU for reset with (95, uncontained ECC)
                           also sets its recovery action to GPU reset, announced by XID 154
    xid-bare=46@gpu3       the same, its log line cut after the code ("NVRM: Xid (PCI:...): 46")
    recovery=reset@gpu2    the driver's recovery action on GPU 2 (NVML field 230) changes from
                           none, announced by XID 154 (event set and log line): reset (GPU
                           reset), reboot (node reboot), drain-p2p, drain-and-reset, imex
                           (recover the IMEX domain); cleared, it is none again (the reset done)
    gpu-lost@gpu2          GPU 2 falls off the bus: every NVML call on it fails GPU_IS_LOST
    gpu-gone@gpu2          GPU 2 fell off the bus and did not come back. Given at the start, the
                           node booted without it: no PCI device at its address in sysfs, NVML
                           counts one GPU fewer and enumerates the others with consecutive
                           indices (GPU 3 is NVML's GPU 2 now, with GPU 3's UUID and PCI address).
                           Injected later, it is gpu-lost until the driver probes the bus again
                           (driver-unloaded or driver-upgraded cleared), then gone the same way
    gpu-reset-required@gpu2  GPU 2 needs a reset: every NVML call on it fails RESET_REQUIRED
    nvml-timeout@gpu5      every NVML call on GPU 5 fails TIMEOUT (a hung GPU, or a busy driver)
    nvml-hang@gpu3         every NVML call on GPU 3 blocks and does not return (a wedged driver)
                           until the fault is cleared; the event set keeps delivering
    nvlink-down@gpu0:link3 link 3 of GPU 0 goes inactive
    nvlink-crc@gpu1:link0  CRC flit/data error counters of that link grow fast (a storm); on
                           Blackwell the NVLink5 rx error, local link integrity and link
                           recovery counters instead
    ecc-dbe@gpu1           volatile uncorrectable ECC errors appear on GPU 1
    remap-failure@gpu4     row remapping fails on GPU 4
    thermal@gpu5           hardware thermal slowdown on GPU 5 (temperature up, clocks down)
    pcie-degraded@gpu6     PCIe link trained below its max generation and width
    fabric-degraded@gpu2   GPU 2's fabric probe COMPLETED with a failed status
                           (INSUFFICIENT_RESOURCES) and an unhealthy route in its health mask
                           (profiles with a fabric: p6e-gb200)
    efa-missing@rdmap16s27 the EFA device disappears from sysfs
    efa-unresponsive@rdmap16s27  unresponsive_remote_events keeps rising on that device
    efa-link-down@rdmap16s27     the device's link dies: its ENA netdev, where it has one, goes
                           operstate down / carrier 0 (carrier_changes +1); its traffic
                           counters stop and retransmit timeouts and unresponsive-remote
                           events rise. The sysfs port state stays ACTIVE, as the efa
                           driver hard-codes it
    aer@gpu4               an uncorrected (non-fatal) PCIe error on GPU 4, in the kernel log only
    gpu-init-failed@gpu4   the driver fails to initialise GPU 4 ("RmInitAdapter failed!"), in the
                           kernel log only
    numa-unpinned@gpu7     the workload's process on GPU 7 is left unpinned (every CPU allowed,
                           not only its GPU's NUMA node): the launcher mistake the affinity
                           collector catches. Without it every simulated process is pinned
    efa-reset-failed@rdmap16s27  the efa driver fails to reset that device (kernel log only)
    efa-admin-timeout@rdmap16s27 an admin command the device never completes: no_completion_cmds
                           +1 and the admin queue closed until the device is reset (clearing the
                           fault is that reset: the counters restart at zero); the driver logs it
    hung-task              a task blocked for more than 122 s (kernel log only)
    uvm-fatal              NVIDIA UVM's global fatal error: the driver logs "requiring os reboot
                           to recover" and sets every GPU's recovery action to node reboot
    callbacks-suppressed   the kernel's printk ratelimit drops 37 messages and says so
    driver-unloaded        the NVIDIA driver is unloaded under the agent: every NVML call, and a
                           new nvmlInit, fails DRIVER_NOT_LOADED
    driver-upgraded        the driver is replaced by another version under the agent: every call
                           and a new nvmlInit fail LIB_RM_VERSION_MISMATCH (the library the agent
                           loaded is the old one)
    rootfs-ro              the root filesystem is read-only
    nvml-library-missing   nvmlInit fails LIBRARY_NOT_FOUND, as pynvml does when it cannot load
                           libnvidia-ml.so.1 (the pod runs without the NVIDIA runtime class)
    nvml-no-permission     nvmlInit fails NO_PERMISSION (the device files are not the agent's to
                           open: 0660 root:video, no supplemental group)

`gpuN` always names the physical GPU, the profile's slot N (its UUID, its PCI address), not the
index NVML gives it once another GPU is gone.

Faults the kernel log shows are written to the simulated /dev/kmsg in the real driver's format
(exporter/sim/hardware/kmsg.py) once the agent reads it: every XID (as the driver logs each one
it raises), and for gpu-lost (and gpu-gone injected at run time) the XID 79 and
fallen-off-the-bus lines that NVML never delivers.

The two nvml-* node faults are deployment faults: they say how the agent was deployed, nothing
about the hardware. Injected at start, NVML never works; injected later, NVML keeps working
until it is initialised again (the library is loaded once), as with the real library.

On the cluster simulation a spec is prefixed by its node: `node=NAME:xid=79@gpu3`.
Parsing is pure and strict: a malformed spec raises `FaultSpecError` naming what is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

GPU_FAULTS = frozenset(
    {
        "gpu-lost",
        "gpu-gone",
        "gpu-reset-required",
        "nvml-timeout",
        "nvml-hang",
        "ecc-dbe",
        "remap-failure",
        "thermal",
        "pcie-degraded",
        "fabric-degraded",
        "aer",
        "gpu-init-failed",
        "numa-unpinned",
    }
)
LINK_FAULTS = frozenset({"nvlink-down", "nvlink-crc"})
EFA_FAULTS = frozenset(
    {"efa-missing", "efa-unresponsive", "efa-link-down", "efa-reset-failed", "efa-admin-timeout"}
)
NVML_INIT_FAULTS = frozenset({"nvml-library-missing", "nvml-no-permission"})
DRIVER_FAULTS = frozenset({"driver-unloaded", "driver-upgraded"})
NODE_FAULTS = (
    frozenset({"rootfs-ro", "hung-task", "uvm-fatal", "callbacks-suppressed"})
    | NVML_INIT_FAULTS
    | DRIVER_FAULTS
)
KINDS = GPU_FAULTS | LINK_FAULTS | EFA_FAULTS | NODE_FAULTS | {"xid", "recovery"}
# nvml.h NVML_GPU_RECOVERY_ACTION_*, by the name a `recovery=` spec gives it.
RECOVERY_ACTIONS = {
    "reset": 1,
    "reboot": 2,
    "drain-p2p": 3,
    "drain-and-reset": 4,
    "imex": 5,
}

_GPU = re.compile(r"gpu(\d+)")
_GPU_LINK = re.compile(r"gpu(\d+):link(\d+)")
_EFA = re.compile(r"[A-Za-z0-9_.-]+")


class FaultSpecError(ValueError):
    """A --fault value that does not follow the grammar."""


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    gpu: int | None = None
    link: int | None = None
    device: str | None = None  # EFA device name
    xid: int | None = None
    node: str | None = None  # only on the cluster simulation
    bare: bool = False  # xid only: the log line ends at the code
    recovery: int | None = None  # recovery only: the NVML_GPU_RECOVERY_ACTION_* it sets

    def __str__(self) -> str:
        prefix = f"node={self.node}:" if self.node else ""
        if self.kind == "xid":
            return f"{prefix}xid{'-bare' if self.bare else ''}={self.xid}@gpu{self.gpu}"
        if self.kind == "recovery":
            name = next((n for n, v in RECOVERY_ACTIONS.items() if v == self.recovery), "?")
            return f"{prefix}recovery={name}@gpu{self.gpu}"
        if self.kind in LINK_FAULTS:
            return f"{prefix}{self.kind}@gpu{self.gpu}:link{self.link}"
        if self.kind in GPU_FAULTS:
            return f"{prefix}{self.kind}@gpu{self.gpu}"
        if self.kind in EFA_FAULTS:
            return f"{prefix}{self.kind}@{self.device}"
        return f"{prefix}{self.kind}"


def parse_fault(spec: str) -> Fault:
    text = spec.strip()
    node: str | None = None
    if text.startswith("node="):
        node_part, sep, text = text[len("node=") :].partition(":")
        if not sep or not node_part:
            raise FaultSpecError(f"{spec!r}: expected node=NAME:FAULT")
        node = node_part
    head, at, target = text.partition("@")
    if head in NODE_FAULTS:
        if at:
            raise FaultSpecError(f"{spec!r}: {head} takes no target")
        return Fault(kind=head, node=node)
    if not at or not target:
        raise FaultSpecError(f"{spec!r}: expected KIND@TARGET (kinds: {', '.join(sorted(KINDS))})")
    if head.startswith(("xid=", "xid-bare=")):
        bare, code = head.startswith("xid-bare="), head.partition("=")[2]
        if not code.isdigit() or int(code) <= 0:
            raise FaultSpecError(f"{spec!r}: XID must be a positive integer")
        gpu = _gpu_index(spec, target)
        return Fault(kind="xid", xid=int(code), gpu=gpu, node=node, bare=bare)
    if head.startswith("recovery="):
        name = head.partition("=")[2]
        if name not in RECOVERY_ACTIONS:
            raise FaultSpecError(
                f"{spec!r}: recovery action must be one of {', '.join(RECOVERY_ACTIONS)}"
            )
        gpu = _gpu_index(spec, target)
        return Fault(kind="recovery", gpu=gpu, node=node, recovery=RECOVERY_ACTIONS[name])
    if head in GPU_FAULTS:
        return Fault(kind=head, gpu=_gpu_index(spec, target), node=node)
    if head in LINK_FAULTS:
        m = _GPU_LINK.fullmatch(target)
        if not m:
            raise FaultSpecError(f"{spec!r}: expected {head}@gpuN:linkM")
        return Fault(kind=head, gpu=int(m.group(1)), link=int(m.group(2)), node=node)
    if head in EFA_FAULTS:
        if not _EFA.fullmatch(target):
            raise FaultSpecError(f"{spec!r}: expected {head}@DEVICE (e.g. rdmap16s27)")
        return Fault(kind=head, device=target, node=node)
    raise FaultSpecError(
        f"{spec!r}: unknown fault kind {head!r} (kinds: {', '.join(sorted(KINDS))})"
    )


def parse_faults(specs: Iterable[str]) -> tuple[Fault, ...]:
    return tuple(parse_fault(s) for s in specs)


def _gpu_index(spec: str, target: str) -> int:
    m = _GPU.fullmatch(target)
    if not m:
        raise FaultSpecError(f"{spec!r}: expected target gpuN")
    return int(m.group(1))
