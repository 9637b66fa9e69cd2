"""The interfaces the node agent's poller reads through; each has a real and a simulated side.

Sysfs-backed readings (EFA, NUMA, PCI locality, /proc) need no interface here: production code
reads a root path, and the simulation is a real directory tree in the kernel's layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from exporter.core.snapshot import (
    CustomCheckReading,
    GpuInventory,
    KernelLogBatch,
    PodRef,
)


class SourceError(Exception):
    """A source could not answer. `reason` is a short, bounded label for the error metric."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class GpuSource(Protocol):
    """NVML or its simulation. `read` never raises: failures land in the inventory."""

    def read(self) -> GpuInventory: ...

    def close(self) -> None: ...


class PodResourcesSource(Protocol):
    """Which pod holds which device. Raises `SourceError` when the kubelet cannot be asked."""

    def gpu_assignments(self) -> Mapping[str, PodRef]: ...  # GPU UUID -> pod

    def close(self) -> None: ...


class NodeLabelsSource(Protocol):
    """The labels of this node's own Node object, refreshed in the background.

    `labels` returns the last labels known; it raises `SourceError` while none were ever read
    and the last refresh failed, so the poller can count the failure yet keep old labels.
    """

    def labels(self) -> Mapping[str, str]: ...

    def drain_errors(self) -> list[str]:
        """Reasons of background refreshes that failed since the last call (for the counter)."""
        ...

    def close(self) -> None: ...


class CustomCheckSource(Protocol):
    """Admins' check scripts, run in the background on their own intervals
    (exporter/sources/custom_checks.py). `read` never blocks on a script: it returns the
    latest finished run of each configured check."""

    def read(self) -> tuple[CustomCheckReading, ...]: ...

    def close(self) -> None: ...


class KernelLogSource(Protocol):
    """The kernel log: /dev/kmsg, or the systemd journal where kmsg cannot be read
    (exporter/sources/kmsg.py). `read` never blocks: it returns the records new since the last
    call (bounded per call), remembering where it stopped across restarts of the agent. It
    raises `SourceError` when the log cannot be read now (a vanished device) and tries again on
    the next call."""

    name: str  # "kmsg" | "journal"

    def read(self) -> KernelLogBatch: ...

    def close(self) -> None: ...
