"""One poll of every node source -> NodeSnapshot -> rendered exposition.

The poller is the only place that touches hardware. Each collector runs isolated: an exception
or a `SourceError` marks that collector failed for this poll, counts the reason, logs once per
change of reason, and the snapshot carries whatever the other collectors read.

The kernel log is read first, before NVML is asked for anything: when a GPU falls off the bus
NVML may hang, and the log is where that fault is written. The GPU source's read is bounded
(exporter/sources/nvml.py: NVML on its own thread, a deadline); an NVML call that has not
returned fails the `gpu` collector with reason `nvml_hung` every poll it lasts, while the log,
its XIDs and the checks go on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

from exporter.core.exposition import Exposition, Family
from exporter.core.snapshot import (
    CollectorStatus,
    CustomCheckReading,
    EfaDeviceReading,
    GpuAffinity,
    GpuInventory,
    KernelLogBatch,
    KernelLogReading,
    NodeSnapshot,
    NodeTopology,
    NumaNodeReading,
    PodRef,
)
from exporter.core.xid import XidLedger
from exporter.node.affinity import compute_affinity
from exporter.node.compat import dcgm, efa
from exporter.node.kernel.events import KernelLogLedger
from exporter.node.render import render
from exporter.sources import sysfs
from exporter.sources.interfaces import (
    CustomCheckSource,
    GpuSource,
    KernelLogSource,
    NodeLabelsSource,
    PodResourcesSource,
    SourceError,
)
from exporter.sources.pci import nvml_to_sysfs_address
from exporter.sources.pci_gpus import read_nvidia_gpus

if TYPE_CHECKING:
    from healthcheck.detection.monitor import HealthMonitor

log = logging.getLogger(__name__)
T = TypeVar("T")

COMPAT_MODES = frozenset({"dcgm", "efa"})
# Fault lines held between polls (kernel_log pumps): a storm beyond this many is counted as
# dropped rather than held in memory.
KERNEL_LOG_PENDING_MAX = 50_000


@dataclass
class NodeSources:
    """Everything the agent reads. The simulation supplies the same shape."""

    gpu: GpuSource
    labels: NodeLabelsSource
    pods: PodResourcesSource | None = None
    sysfs_root: Path = Path("/sys")
    proc_root: Path = Path("/proc")
    before_poll: Callable[[float], None] | None = None  # the simulation advances its clock here
    custom_checks: CustomCheckSource | None = None  # admins' scripts, run in the background
    kernel_log: KernelLogSource | None = None  # /dev/kmsg or the journal; None: monitor off

    def close(self) -> None:
        self.gpu.close()
        self.labels.close()
        if self.pods is not None:
            self.pods.close()
        if self.custom_checks is not None:
            self.custom_checks.close()
        if self.kernel_log is not None:
            self.kernel_log.close()


class _Degraded(SourceError):
    """A read that failed as a collector yet returned something worth keeping (an NVML
    inventory that says why it is unavailable)."""

    def __init__(self, reason: str, message: str, value: object) -> None:
        super().__init__(reason, message)
        self.value = value


class Poller:
    """Builds one snapshot per `poll()`; keeps what must persist across polls (XID counts,
    error counters, last good labels).

    With a `health` monitor, the health checks run on each snapshot before it is rendered and
    their series join the same exposition: one NVML poll feeds both.
    """

    def __init__(
        self,
        node: str,
        sources: NodeSources,
        compat: frozenset[str] = frozenset(),
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
        health: HealthMonitor | None = None,
    ) -> None:
        unknown = compat - COMPAT_MODES
        if unknown:
            raise ValueError(f"unknown compat mode(s): {', '.join(sorted(unknown))}")
        self.node = node
        self.sources = sources
        self.compat = compat
        self._clock = clock
        self._timer = timer
        self._xids = XidLedger()
        self._errors: dict[tuple[str, str], int] = {}
        self._last_reason: dict[str, str | None] = {}
        self._last_success: float | None = None
        self._previous: NodeSnapshot | None = None
        self.health = health
        self._health_failed = False
        self._kernel: KernelLogLedger | None = None
        if sources.kernel_log is not None:
            self._kernel = KernelLogLedger(sources.kernel_log.name)
        self._kernel_pending: list[KernelLogBatch] = []  # pumped since the last poll

    @property
    def reads_kernel_log(self) -> bool:
        return self.sources.kernel_log is not None

    def pump_kernel_log(self) -> None:
        """Read the kernel log between polls and hold what came for the next poll. The kernel's
        ring overwrites the oldest lines when full (about 8,000 on a p5's 1 MiB ring, 1,300 on a
        128 KiB one), so a storm between two 5 s polls could outrun it; drained every 250 ms
        (NodeAgent), a ring that size holds bursts of tens of thousands of lines a second.
        Called from the poll thread only. A failure here is left for the poll to meet, count and
        log: nothing read is lost, the reader re-reads it from the ring."""
        source = self.sources.kernel_log
        if source is None:
            return
        try:
            batch = source.read()
        except Exception:
            return
        if not (batch.records or batch.dropped or batch.malformed or batch.skipped):
            return
        held = sum(len(b.records) for b in self._kernel_pending)
        if held + len(batch.records) > KERNEL_LOG_PENDING_MAX:
            batch = KernelLogBatch(
                dropped=batch.dropped + len(batch.records),
                malformed=batch.malformed,
                skipped=batch.skipped,
            )
        self._kernel_pending.append(batch)

    # -- one poll ---------------------------------------------------------------------------

    def poll(self) -> tuple[NodeSnapshot, Exposition]:
        now = self._clock()
        if self.sources.before_poll is not None:
            self.sources.before_poll(now)
        run: list[CollectorStatus] = []
        log_batch = self._read_kernel_log_batch(run)  # before NVML, which may hang
        gpu = self._collect(run, "gpu", self._read_gpu, GpuInventory(available=False))
        gpu, kernel = self._judge_kernel_log(gpu, log_batch, now)
        no_efa: tuple[EfaDeviceReading, ...] = ()
        no_numa: tuple[NumaNodeReading, ...] = ()
        no_affinity: tuple[GpuAffinity, ...] = ()
        no_labels: Mapping[str, str] = {}
        efa_devices = self._collect(
            run, "efa", lambda: sysfs.read_efa(self.sources.sysfs_root), no_efa
        )
        self._count_efa_problems(efa_devices)
        numa = self._collect(run, "numa", lambda: sysfs.read_numa(self.sources.sysfs_root), no_numa)
        affinity = self._collect(
            run, "affinity", lambda: self._affinity(gpu, efa_devices, numa), no_affinity
        )
        pods: Mapping[str, PodRef] = {}
        if self.sources.pods is not None:
            pods = self._collect(run, "podresources", self.sources.pods.gpu_assignments, {})
        # After the pods are read: the ledger remembers who held each GPU at its XIDs.
        self._xids.record(gpu.xid_events, pods)
        labels = self._collect(run, "topology", self.sources.labels.labels, no_labels)
        for reason in self.sources.labels.drain_errors():  # refreshes that failed in between
            self._count("topology", reason)
        rootfs_ro = self._collect(
            run, "rootfs", lambda: sysfs.read_rootfs_read_only(self.sources.proc_root), None
        )
        custom: tuple[CustomCheckReading, ...] = ()
        if self.sources.custom_checks is not None:  # the latest results: never waits on a script
            custom = self._collect(run, "custom_checks", self.sources.custom_checks.read, ())
        if all(s.ok for s in run):
            self._last_success = now
        snapshot = NodeSnapshot(
            node=self.node,
            taken_at=now,
            gpu=gpu,
            xid=self._xids.totals(),
            efa=efa_devices,
            numa=numa,
            affinity=affinity,
            pods=pods,
            topology=NodeTopology(dict(labels)),
            collectors=tuple(run),
            collector_errors=dict(self._errors),
            last_success=self._last_success,
            rootfs_read_only=rootfs_ro,
            custom_checks=custom,
            kernel_log=kernel,
        )
        self._observe_health(snapshot)
        exposition = Exposition.build(self.families(snapshot))
        self._previous = snapshot
        return snapshot, exposition

    def families(self, snapshot: NodeSnapshot) -> list[Family]:
        fams = render(snapshot)
        if "dcgm" in self.compat:
            fams.extend(dcgm.render(snapshot, self._previous))
        if "efa" in self.compat:
            fams.extend(efa.render(snapshot))
        if self.health is not None:
            fams.extend(self.health.families(self.node))
        return fams

    def _observe_health(self, snapshot: NodeSnapshot) -> None:
        """Run the health checks; their failure must never cost the hardware metrics."""
        if self.health is None:
            return
        try:
            self.health.observe(snapshot)
        except Exception:
            if not self._health_failed:
                log.exception("health monitor failed; serving hardware metrics without it")
            self._health_failed = True
        else:
            self._health_failed = False

    # -- collectors ---------------------------------------------------------------------------

    def _collect(
        self, run: list[CollectorStatus], name: str, read: Callable[[], T], fallback: T
    ) -> T:
        start = self._timer()
        try:
            value = read()
        except _Degraded as e:
            self._failed(run, name, start, e.reason, str(e))
            return cast(T, e.value)
        except SourceError as e:
            self._failed(run, name, start, e.reason, str(e))
            return fallback
        except Exception as e:  # a bug or an unexpected OS error: keep serving, say so
            self._failed(run, name, start, "exception", f"{type(e).__name__}: {e}", exc_info=True)
            return fallback
        run.append(CollectorStatus(name, True, self._timer() - start))
        self._note(name, None, None)
        return value

    def _failed(
        self,
        run: list[CollectorStatus],
        name: str,
        start: float,
        reason: str,
        message: str,
        exc_info: bool = False,
    ) -> None:
        run.append(CollectorStatus(name, False, self._timer() - start, message))
        self._count(name, reason)
        self._note(name, reason, message, exc_info)

    def _count(self, collector: str, reason: str, n: int = 1) -> None:
        key = (collector, reason)
        self._errors[key] = self._errors.get(key, 0) + n

    def _note(
        self, name: str, reason: str | None, message: str | None, exc_info: bool = False
    ) -> None:
        """Log when a collector's condition changes, not on every poll it persists."""
        if self._last_reason.get(name) == reason:
            return
        previous = self._last_reason.get(name)
        self._last_reason[name] = reason
        if reason is None:
            if previous is not None:
                log.info("collector %s recovered", name)
        else:
            log.warning("collector %s failing (%s): %s", name, reason, message, exc_info=exc_info)

    def _read_gpu(self) -> GpuInventory:
        """NVML missing fails the collector, and so does an NVML call that hangs (the GPUs'
        values then the last good ones, marked stale); one GPU failing only counts."""
        gpu = self.sources.gpu.read()
        if gpu.hung is not None:
            raise _Degraded("nvml_hung", gpu.error or f"NVML hung: {gpu.hung}", gpu)
        if not gpu.available:
            raise _Degraded("nvml_unavailable", gpu.error or "NVML unavailable", gpu)
        lost = sum(1 for g in gpu.gpus if not g.up)
        if lost:
            self._count("gpu", "gpu_unreadable", lost)
        return gpu

    def _read_kernel_log_batch(self, run: list[CollectorStatus]) -> KernelLogBatch | None:
        """The kernel log's new records, what the pumps read since the last poll first; None
        when the monitor is off. Read before NVML, judged after it (`_judge_kernel_log`)."""
        source = self.sources.kernel_log
        if source is None or self._kernel is None:
            return None
        batch = self._collect(run, "kernel_log", source.read, KernelLogBatch())
        if self._kernel_pending:  # what the pumps read since the last poll comes first
            batches, self._kernel_pending = [*self._kernel_pending, batch], []
            batch = KernelLogBatch(
                records=tuple(r for b in batches for r in b.records),
                dropped=sum(b.dropped for b in batches),
                malformed=sum(b.malformed for b in batches),
                skipped=sum(b.skipped for b in batches),
            )
        return batch

    def _judge_kernel_log(
        self, gpu: GpuInventory, batch: KernelLogBatch | None, now: float
    ) -> tuple[GpuInventory, KernelLogReading | None]:
        """The kernel log's new lines as events, GPUs named by what NVML last told of their
        PCI addresses (an address it has not named while it hangs, by the PCI bus's order in
        sysfs); its XIDs merged with NVML's, each fault once (exporter/node/kernel/events.py),
        so the XID ledger and checks see one stream."""
        ledger = self._kernel
        if batch is None or ledger is None:
            return gpu, None
        ledger.learn_gpus(gpu)
        if batch.records and ledger.wants_pci_gpus:
            # NVML does not answer in full (hung, or failing since the start): the PCI bus in
            # sysfs says which address is which GPU, without the driver (sources/pci_gpus.py).
            try:
                ledger.learn_pci_gpus(read_nvidia_gpus(self.sources.sysfs_root))
            except OSError as e:
                self._count("kernel_log", "pci_unreadable")
                log.debug("cannot list PCI devices to map kernel log lines to GPUs: %s", e)
        events = ledger.record(batch)
        merged = ledger.merge_xids(gpu.xid_events, ledger.log_xids(events), now)
        if merged != gpu.xid_events:
            gpu = replace(gpu, xid_events=merged)
        return gpu, ledger.reading(events)

    def _count_efa_problems(self, devices: Sequence[EfaDeviceReading]) -> None:
        bad = sum(1 for d in devices if d.error)
        if bad:
            self._count("efa", "malformed_file", bad)

    def _affinity(
        self,
        gpu: GpuInventory,
        efa_devices: Sequence[EfaDeviceReading],
        numa: Sequence[NumaNodeReading],
    ) -> tuple[GpuAffinity, ...]:
        readable = [g for g in gpu.gpus if g.up]
        gpus = [(g.index, nvml_to_sysfs_address(g.pci_bus_id)) for g in readable]
        processes = {g.index: [p.pid for p in g.processes or ()] for g in readable}
        efa_addresses = [d.pci_address for d in efa_devices if d.pci_address]
        locations = sysfs.read_pci_locations(
            self.sources.sysfs_root, [a for _, a in gpus] + efa_addresses
        )
        pids = [pid for pids in processes.values() for pid in pids]
        process_cpus = sysfs.read_process_cpus(self.sources.proc_root, pids)
        return compute_affinity(gpus, processes, locations, efa_devices, numa, process_cpus)
