"""Kernel log records -> events on our hardware, counters, and XIDs merged with NVML's.

The kernel log reader (exporter/sources/kmsg.py) hands over raw records; the pattern table
(exporter/node/kernel/patterns.py) says which of them are faults. This ledger, owned by the poller,
turns matches into `KernelLogEvent`s with the GPU index mapped from the line's PCI address (as
NVML last named it; an address NVML has not named while it does not answer, a hang from the
agent's start, as the PCI bus orders NVIDIA's GPUs in sysfs: `learn_pci_gpus`,
exporter/sources/pci_gpus.py),
keeps per-(kind, pattern, severity, GPU, device) counts for `topowatch_kernel_log_events_total`,
and reconciles XIDs: the driver logs every XID it raises, and NVML's event set delivers the same
XID, so one fault arrives twice. `merge_xids` pairs them one-to-one (same GPU, same XID, within
`match_seconds` of each other, whichever came first) and passes on each fault once. An XID that
only the log shows (NVML hung, or the GPU fell off the bus before the event set could deliver)
becomes an XID event of its own, so the XID check and counters see it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from exporter.core.snapshot import (
    GpuInventory,
    KernelLogBatch,
    KernelLogCount,
    KernelLogEvent,
    KernelLogReading,
    XidEvent,
)
from exporter.node.kernel.patterns import LogMatch, match_line
from exporter.sources.pci import nvml_to_sysfs_address

MESSAGE_CAP = 240  # characters of a line kept on an event (a label-free field, but bounded)
MAX_SERIES = 512  # distinct count keys; beyond it, the device is folded into "other"
# Kinds whose `device` is a piece of hardware (bounded by the machine); a hung task's name and
# pid are not, so they stay in the message, never in a label.
_HARDWARE_DEVICE_KINDS = frozenset(
    {"sxid", "efa_driver", "pcie_aer", "nvlink", "xid", "gpu_fallen_off_bus", "gpu_init_failed"}
)
# "<function>: N callbacks suppressed" (lib/ratelimit.c): N messages the kernel dropped.
SUPPRESSED_KIND = "printk_suppressed"


@dataclass(slots=True)
class _Count:
    count: int
    last_at: float
    last_message: str


@dataclass(frozen=True, slots=True)
class _Gpu:
    index: int
    uuid: str


class KernelLogLedger:
    """Mutable, owned by the poller alone; each poll takes an immutable `reading()`."""

    def __init__(
        self,
        source: str,
        match: Callable[[str], LogMatch | None] = match_line,
        match_seconds: float = 30.0,
    ) -> None:
        self.source = source
        self._match = match
        self._match_seconds = match_seconds
        self._gpus: dict[str, _Gpu] = {}  # sysfs PCI address -> our GPU (the last one known)
        # sysfs PCI address -> index in PCI order (None: not read yet), for addresses NVML has
        # not named while NVML does not answer in full (`_nvml_whole` false).
        self._pci_order: dict[str, int] | None = None
        self._nvml_whole = False  # the last inventory was NVML's whole answer (not hung)
        self._counts: dict[tuple[str, str, str, str, str], _Count] = {}
        self.lines = 0
        self.dropped = 0
        self.malformed = 0
        self.suppressed = 0  # messages the kernel's ratelimit dropped, as its lines report
        # XIDs seen from one side and not yet from the other: (gpu, xid) -> timestamps
        self._unpaired: dict[str, dict[tuple[int, int], deque[float]]] = {"nvml": {}, "log": {}}

    # -- events ------------------------------------------------------------------------------

    def learn_gpus(self, gpu: GpuInventory) -> None:
        """Remember which PCI address is which GPU. Kept across polls: a GPU that fell off the
        bus is no longer readable, and its address is exactly what the log then names."""
        for g in gpu.gpus:
            if g.pci_bus_id:
                self._gpus[nvml_to_sysfs_address(g.pci_bus_id)] = _Gpu(g.index, g.uuid)
        self._nvml_whole = gpu.available and gpu.hung is None

    @property
    def wants_pci_gpus(self) -> bool:
        """NVML does not answer in full and sysfs was not read yet: the poller should read the
        PCI bus (`learn_pci_gpus`) before the next lines are recorded."""
        return not self._nvml_whole and self._pci_order is None

    def learn_pci_gpus(self, addresses: Sequence[str]) -> None:
        """The NVIDIA GPUs on the PCI bus in address order (sysfs form). Their index is their
        place in that order, NVML's order in practice (exporter/sources/pci_gpus.py says how
        far that holds); the address goes with every event, so what is judged from it still
        names the physical GPU."""
        self._pci_order = {address: i for i, address in enumerate(addresses)}

    def _gpu_at(self, address: str) -> _Gpu | None:
        """Our GPU at a sysfs PCI address: as NVML named it; else, while NVML does not answer
        in full, by the PCI order, if that order agrees with every GPU NVML did name and
        gives an index NVML has not given another GPU. None: not a GPU we can name (a GPU
        NVML's whole answer left out, as one that failed to initialise: its address is kept)."""
        gpu = self._gpus.get(address)
        if gpu is not None or self._nvml_whole or not self._pci_order:
            return gpu
        index = self._pci_order.get(address)
        if index is None:
            return None
        for known, named in self._gpus.items():
            if named.index == index or self._pci_order.get(known) != named.index:
                return None  # NVML numbers them otherwise: the order is no guide here
        return _Gpu(index, "")

    def record(self, batch: KernelLogBatch) -> tuple[KernelLogEvent, ...]:
        """Match every record of the batch; count the matches; return the events."""
        self.lines += len(batch.records) + batch.skipped
        self.dropped += batch.dropped
        self.malformed += batch.malformed
        events: list[KernelLogEvent] = []
        for record in batch.records:
            hit = self._match(record.message)
            if hit is None:
                continue
            gpu = self._gpu_at(hit.pci_address) if hit.pci_address else None
            event = KernelLogEvent(
                kind=hit.kind,
                pattern=hit.pattern,
                severity=hit.severity,
                timestamp=record.timestamp,
                message=record.message[:MESSAGE_CAP],
                code=hit.code,
                pci_address=hit.pci_address,
                gpu_index=gpu.index if gpu is not None else None,
                device=hit.device,
            )
            events.append(event)
            self._count(event)
            if hit.kind == SUPPRESSED_KIND and hit.code is not None:
                self.suppressed += hit.code
        return tuple(events)

    def _count(self, e: KernelLogEvent) -> None:
        gpu = "" if e.gpu_index is None else str(e.gpu_index)
        device = ""
        if e.kind in _HARDWARE_DEVICE_KINDS and gpu == "":
            # The PCI address names the faulty device (an AER line's `device` is the port
            # that received the message); an EFA device is best known by its ib name.
            named = e.device if e.kind == "efa_driver" else None
            device = named or e.pci_address or e.device or ""
        key = (e.kind, e.pattern, e.severity, gpu, device)
        if key not in self._counts and len(self._counts) >= MAX_SERIES:
            key = (e.kind, e.pattern, e.severity, gpu, "other")
        entry = self._counts.get(key)
        if entry is None:
            self._counts[key] = _Count(1, e.timestamp, e.message)
        else:
            entry.count += 1
            if e.timestamp >= entry.last_at:
                entry.last_at, entry.last_message = e.timestamp, e.message

    # -- XIDs from both sides ------------------------------------------------------------------

    def log_xids(self, events: Iterable[KernelLogEvent]) -> list[XidEvent]:
        """The XID events among `events` that name one of our GPUs."""
        out = []
        for e in events:
            if e.kind != "xid" or e.code is None or e.gpu_index is None or not e.pci_address:
                continue
            gpu = self._gpu_at(e.pci_address)
            uuid = gpu.uuid if gpu is not None and gpu.index == e.gpu_index else ""
            out.append(XidEvent(e.gpu_index, uuid, e.code, e.timestamp))
        return out

    def merge_xids(
        self, nvml: Sequence[XidEvent], log: Sequence[XidEvent], now: float
    ) -> tuple[XidEvent, ...]:
        """Each fault once: an event is dropped when the other side already reported the same
        XID on the same GPU within `match_seconds` (and that report is then used up)."""
        self._expire(now)
        out: list[XidEvent] = []
        for side, other, events in (("nvml", "log", nvml), ("log", "nvml", log)):
            for e in sorted(events, key=lambda e: e.timestamp):
                key = (e.gpu_index, e.xid)
                waiting = self._unpaired[other].get(key)
                if waiting and abs(waiting[0] - e.timestamp) <= self._match_seconds:
                    waiting.popleft()
                    continue
                self._unpaired[side].setdefault(key, deque()).append(e.timestamp)
                out.append(e)
        out.sort(key=lambda e: e.timestamp)
        return tuple(out)

    def _expire(self, now: float) -> None:
        horizon = now - 2 * self._match_seconds  # generous: the two clocks are not one clock
        for table in self._unpaired.values():
            for key in list(table):
                stamps = table[key]
                while stamps and stamps[0] < horizon:
                    stamps.popleft()
                if not stamps:
                    del table[key]

    # -- the snapshot's view --------------------------------------------------------------------

    def reading(self, events: tuple[KernelLogEvent, ...]) -> KernelLogReading:
        counts = tuple(
            KernelLogCount(kind, pattern, severity, gpu, device, c.count, c.last_at, c.last_message)
            for (kind, pattern, severity, gpu, device), c in sorted(self._counts.items())
        )
        return KernelLogReading(
            source=self.source,
            events=events,
            counts=counts,
            lines=self.lines,
            dropped=self.dropped,
            malformed=self.malformed,
            suppressed=self.suppressed,
        )
