"""A whole simulated GPU node: NVML, sysfs and /proc trees, pods and Node labels, one clock.

`SimulatedNode.sources()` returns the same `NodeSources` shape the real agent builds, so the
production poller, readers and renderers run unchanged against it. Faults are injected here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from exporter.core.snapshot import PodRef
from exporter.core.xid import recovery_name
from exporter.node.kernel.patterns import record_may_match
from exporter.node.poller import NodeSources
from exporter.sim.faults import EFA_FAULTS, Fault, FaultSpecError
from exporter.sim.hardware.kmsg import SimKernelLog
from exporter.sim.hardware.nvml import SimulatedNvml
from exporter.sim.hardware.profiles import HardwareProfile
from exporter.sim.hardware.sysfs import SimulatedSysfs
from exporter.sources.kmsg import KmsgSource
from exporter.sources.kube import StaticNodeLabels
from exporter.sources.nvml import NvmlGpuSource
from exporter.sources.podresources import StaticPodResources

# Lines any GPU node logs at boot: the pattern table must let them pass.
_BOOT_LINES = (
    "Linux version 6.1.115-126.197.amzn2023.x86_64 (mockbuild@ip-10-0-50-1) #1 SMP",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:22:07 UTC 2024",
    "pcieport 0000:00:01.0: AER: enabled with IRQ 122",
    "efa 0000:10:1b.0 rdmap16s27: IB device registered",
)


def _recovery_changed(nvrm: str, action: int) -> str:
    """XID 154 as the driver logs it (gpu.c `gpuRefreshRecoveryAction`), from none."""
    return (
        f"NVRM: Xid (PCI:{nvrm}): 154, GPU recovery action changed from 0x0 (None) to"
        f" 0x{action:x} ({recovery_name(action)})"
    )


class SimClock:
    """Simulated time, set by the poller before each poll (so a test controls it fully)."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def validate_faults(profile: HardwareProfile, faults: Sequence[Fault]) -> None:
    """Reject a fault that names hardware the profile does not have, before anything runs."""
    efa_names = {e.name for e in profile.efa}
    for f in faults:
        if f.gpu is not None and not 0 <= f.gpu < len(profile.gpus):
            raise FaultSpecError(
                f"{f}: {profile.instance_type} has GPUs 0..{len(profile.gpus) - 1}"
            )
        if f.link is not None and not 0 <= f.link < profile.nvlinks_per_gpu:
            raise FaultSpecError(
                f"{f}: {profile.instance_type} has NVLinks 0..{profile.nvlinks_per_gpu - 1}"
            )
        if f.kind in EFA_FAULTS and f.device not in efa_names:
            sample = ", ".join(sorted(efa_names)[:4])
            raise FaultSpecError(f"{f}: no EFA device {f.device!r} (e.g. {sample}, ...)")


def simulated_pods(profile: HardwareProfile, uuids: Sequence[str]) -> dict[str, PodRef]:
    """A HyperPod-style training job holding every GPU but the last (left idle)."""
    return {
        uuid: PodRef("hyperpod-ns-research", f"llama-pretrain-worker-{i // 4}", "pytorch")
        for i, uuid in enumerate(uuids)
        if i < len(uuids) - 1
    }


class SimulatedNode:
    def __init__(
        self,
        profile: HardwareProfile,
        faults: Sequence[Fault] = (),
        root: Path | None = None,
        seed: int = 0,
        start: float | None = None,
    ) -> None:
        validate_faults(profile, faults)
        self.profile = profile
        self.clock = SimClock(time.time() if start is None else start)
        self._owns_root = root is None
        # tmpfs when there is one: writing ~2,800 small files costs 10 ms there, ~350 ms on ext4
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.root = (
            Path(tempfile.mkdtemp(prefix="topowatch-sim-", dir=shm)) if root is None else root
        )
        self.nvml = SimulatedNvml(profile, faults, seed=seed, clock=self.clock)
        self.sysfs = SimulatedSysfs(self.root, profile, faults, seed=seed)
        self.sysfs.write()
        self.labels = StaticNodeLabels(dict(profile.topology_labels))
        # The GPUs the node booted with (the device plugin advertises no GPU gone from the bus)
        uuids = [
            self.nvml.uuid_of(i)
            for i in range(len(profile.gpus))
            if self.nvml.nvml_index_of(i) is not None
        ]
        self.pods = StaticPodResources(simulated_pods(profile, uuids))
        # Booted a while ago; what the boot logged is old news to an agent starting now.
        self.kernel_log = SimKernelLog(clock=self.clock, boot_time=self.clock.now - 600.0)
        for line in _BOOT_LINES:
            self.kernel_log.write(line)
        # Faults reach the log once the agent reads it, as NVML's XIDs reach its event set
        # once it registered: a fault "happens" while the agent watches. A GPU gone at the
        # start is not a fault of this boot: the bus never had it, nothing is logged.
        self._unlogged: list[Fault] = [f for f in faults if f.kind != "gpu-gone"]
        self._log_open = False

    def inject(self, fault: Fault) -> None:
        validate_faults(self.profile, [fault])
        self.nvml.inject(fault)
        self.sysfs.inject(fault)
        self._unlogged.append(fault)

    def clear(self, fault: Fault) -> None:
        self.nvml.clear(fault)
        self.sysfs.clear(fault)

    def advance(self, now: float) -> None:
        self.clock.now = now
        self.sysfs.advance(now)
        if self._log_open:
            for fault in self._unlogged:
                for line in self._log_lines(fault):
                    self.kernel_log.write(line, priority=3)
            self._unlogged.clear()

    def kernel_log_source(self, state_dir: Path | None = None) -> KmsgSource:
        """The production /dev/kmsg reader over this node's simulated kernel log."""
        self._log_open = True
        return self.kernel_log.source(state_dir, keep=record_may_match)

    def _log_lines(self, fault: Fault) -> list[str]:
        """The lines the real drivers print for `fault` (formats cited in
        exporter/core/data/kernel-log-patterns.csv); none for faults only NVML or sysfs show."""
        if fault.gpu is not None:
            address = self.profile.gpus[fault.gpu].sysfs_address
            nvrm = address.rsplit(".", 1)[0]  # NVRM prints the address without its function
            if fault.kind == "xid" and fault.xid is not None and fault.bare:
                return [f"NVRM: Xid (PCI:{nvrm}): {fault.xid}"]
            if fault.kind == "xid" and fault.xid is not None:
                text = "GPU has fallen off the bus." if fault.xid == 79 else "Ch 00000008"
                lines = [f"NVRM: Xid (PCI:{nvrm}): {fault.xid}, pid=4242, name=python3, {text}"]
                if fault.xid == 95:  # the driver marks the GPU for reset: XID 154 follows
                    lines.append(_recovery_changed(nvrm, 1))
                return lines
            if fault.kind == "recovery" and fault.recovery is not None:
                return [_recovery_changed(nvrm, fault.recovery)]
            if fault.kind == "gpu-init-failed":
                return [
                    f"NVRM: GPU {address}: RmInitAdapter failed! (0x22:0x56:667)",
                    f"NVRM: GPU {address}: rm_init_adapter failed, device minor number {fault.gpu}",
                ]
            if fault.kind in ("gpu-lost", "gpu-gone"):  # gone: injected while it was there
                return [
                    f"NVRM: Xid (PCI:{nvrm}): 79, pid=4242, name=python3, "
                    "GPU has fallen off the bus.",
                    f"NVRM: GPU {address}: GPU has fallen off the bus.",
                ]
            if fault.kind == "aer":
                return [
                    "pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error message "
                    f"received from {address}",
                    f"nvidia {address}: PCIe Bus Error: severity=Uncorrected (Non-Fatal), "
                    "type=Transaction Layer, (Requester ID)",
                ]
        if fault.kind == "efa-reset-failed" and fault.device is not None:
            efa = next(e for e in self.profile.efa if e.name == fault.device)
            return [f"efa {efa.pci_address} {efa.name}: Reset indication didn't turn on"]
        if fault.kind == "efa-admin-timeout" and fault.device is not None:
            efa = next(e for e in self.profile.efa if e.name == fault.device)
            prefix = f"efa {efa.pci_address} {efa.name}"
            return [
                f"{prefix}: The device didn't send any completion for admin cmd GET_STATS(13)"
                " status 2 (ctx 0x000000009a3c41f0, sq producer: 1861, sq consumer: 1860,"
                " cq consumer: 1860)",
                f"{prefix}: Admin queue is closed",
            ]
        if fault.kind == "hung-task":
            return ["INFO: task python3:4242 blocked for more than 122 seconds."]
        if fault.kind == "uvm-fatal":
            return [
                "NVRM: nvGpuOpsReportFatalError: uvm encountered global fatal error 0x60,"
                " requiring os reboot to recover.",
                *(
                    _recovery_changed(gpu.sysfs_address.rsplit(".", 1)[0], 2)
                    for gpu in self.profile.gpus
                ),
            ]
        if fault.kind == "callbacks-suppressed":
            return ["net_ratelimit: 37 callbacks suppressed"]
        return []

    def sources(self) -> NodeSources:
        # events stamped, and the costly readings' cadence kept, in simulated time
        gpu = NvmlGpuSource(self.nvml, clock=self.clock, wall_clock=self.clock)
        gpu.start()
        return NodeSources(
            gpu=gpu,
            labels=self.labels,
            pods=self.pods,
            sysfs_root=self.sysfs.sysfs_root,
            proc_root=self.sysfs.proc_root,
            before_poll=self.advance,
        )

    def close(self) -> None:
        if self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)
