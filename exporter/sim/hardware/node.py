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

from exporter.node.poller import NodeSources
from exporter.sim.faults import EFA_FAULTS, Fault, FaultSpecError
from exporter.sim.hardware.nvml import SimulatedNvml
from exporter.sim.hardware.profiles import HardwareProfile
from exporter.sim.hardware.sysfs import SimulatedSysfs
from exporter.snapshot import PodRef
from exporter.sources.kube import StaticNodeLabels
from exporter.sources.nvml import NvmlGpuSource
from exporter.sources.podresources import StaticPodResources


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
        uuids = [self.nvml.uuid_of(i) for i in range(len(profile.gpus))]
        self.pods = StaticPodResources(simulated_pods(profile, uuids))

    def inject(self, fault: Fault) -> None:
        validate_faults(self.profile, [fault])
        self.nvml.inject(fault)
        self.sysfs.inject(fault)

    def clear(self, fault: Fault) -> None:
        self.nvml.clear(fault)
        self.sysfs.clear(fault)

    def advance(self, now: float) -> None:
        self.clock.now = now
        self.sysfs.advance(now)

    def sources(self) -> NodeSources:
        gpu = NvmlGpuSource(self.nvml)
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
