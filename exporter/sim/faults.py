"""The `--fault SPEC` grammar shared by every simulation.

    xid=79@gpu3            an XID event on GPU 3 (delivered once, through the event set)
    gpu-lost@gpu2          GPU 2 falls off the bus: every NVML call on it fails GPU_IS_LOST
    gpu-reset-required@gpu2  GPU 2 needs a reset: every NVML call on it fails RESET_REQUIRED
    nvml-timeout@gpu5      every NVML call on GPU 5 fails TIMEOUT (a hung GPU, or a busy driver)
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
    efa-reset-failed@rdmap16s27  the efa driver fails to reset that device (kernel log only)
    hung-task              a task blocked for more than 122 s (kernel log only)
    rootfs-ro              the root filesystem is read-only
    nvml-library-missing   nvmlInit fails LIBRARY_NOT_FOUND, as pynvml does when it cannot load
                           libnvidia-ml.so.1 (the pod runs without the NVIDIA runtime class)
    nvml-no-permission     nvmlInit fails NO_PERMISSION (the device files are not the agent's to
                           open: 0660 root:video, no supplemental group)

Faults the kernel log shows are written to the simulated /dev/kmsg in the real driver's format
(exporter/sim/hardware/kmsg.py) once the agent reads it: every XID (as the driver logs each one
it raises), and for gpu-lost the XID 79 and fallen-off-the-bus lines that NVML never delivers.

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
        "gpu-reset-required",
        "nvml-timeout",
        "ecc-dbe",
        "remap-failure",
        "thermal",
        "pcie-degraded",
        "fabric-degraded",
        "aer",
    }
)
LINK_FAULTS = frozenset({"nvlink-down", "nvlink-crc"})
EFA_FAULTS = frozenset({"efa-missing", "efa-unresponsive", "efa-link-down", "efa-reset-failed"})
NVML_INIT_FAULTS = frozenset({"nvml-library-missing", "nvml-no-permission"})
NODE_FAULTS = frozenset({"rootfs-ro", "hung-task"}) | NVML_INIT_FAULTS
KINDS = GPU_FAULTS | LINK_FAULTS | EFA_FAULTS | NODE_FAULTS | {"xid"}

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

    def __str__(self) -> str:
        prefix = f"node={self.node}:" if self.node else ""
        if self.kind == "xid":
            return f"{prefix}xid={self.xid}@gpu{self.gpu}"
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
    if head.startswith("xid="):
        code = head[len("xid=") :]
        if not code.isdigit() or int(code) <= 0:
            raise FaultSpecError(f"{spec!r}: XID must be a positive integer")
        return Fault(kind="xid", xid=int(code), gpu=_gpu_index(spec, target), node=node)
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
