"""`--compat dcgm`: NVIDIA dcgm-exporter's counters, with its names, units and labels.

Labels follow dcgm-exporter: gpu ("0".."7"), UUID, pci_bus_id, device (nvidiaN), modelName,
Hostname (capital H: the node name, which HyperPod's dashboards filter on), DCGM_FI_DRIVER_VERSION,
and pod/namespace/container for GPUs a pod holds. Units follow DCGM (MHz, W, mJ, MiB, percent,
ns). Counters are typed untyped because the peer's names lack `_total` (PromQL treats both
alike). `modelName` is camelCase, which promtool warns about; it is kept because dashboards
filter on it.

Emitted: the uncommented fields of dcgm-exporter's default-counters.csv that NVML gives us, and
the commented-out rows that HyperPod's observability add-on turns on and queries (the violation
times, the ECC totals by scope, retired pages, the NVLink error totals). A field NVML does not
support on a GPU is left out for that GPU, never served as 0.

DCGM_FI_PROF_GR_ENGINE_ACTIVE is GPM's graphics utilization (NVML_GPM_METRIC_GRAPHICS_UTIL:
time a graphics or compute context was busy), the quantity DCGM's field measures.

Not emitted: DCGM_FI_DEV_ENC_UTIL/DEC_UTIL (video engines are not read), DCGM_FI_DEV_VGPU_
LICENSE_STATUS (no vGPU on training nodes), the DCGM_EXP_* fields
(dcgm-exporter's own bookkeeping of DCGM's health and P2P APIs, which NVML has no equal of), and
the NVLink DL error totals on Blackwell, where NVML 565+ no longer reports them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from operator import attrgetter

from exporter.core.exposition import (
    GAUGE,
    UNTYPED,
    Family,
    escape_label_value,
)
from exporter.core.snapshot import GpuReading, NodeSnapshot, PodRef
from exporter.node.compat import lines
from exporter.node.render import NO_POD, profiling_ratio

MIB = 1024 * 1024

Getter = Callable[[GpuReading], float | int | None]


# DCGM reports clocks, temperatures, utilizations and framebuffer sizes as integers (int64
# fields); so does this mode, which also keeps their formatting to a C-level str().


def _mib(v: int | None) -> int | None:
    return None if v is None else v // MIB


def _pct(v: float | None) -> int | None:
    return None if v is None else round(v * 100)


def _mhz(v: float | None) -> int | None:
    return None if v is None else round(v / 1e6)


def _int(v: float | None) -> int | None:
    return None if v is None else round(v)


def _fb_reserved(g: GpuReading) -> int | None:
    if g.memory_total_bytes is None or g.memory_used_bytes is None or g.memory_free_bytes is None:
        return None
    return max(g.memory_total_bytes - g.memory_used_bytes - g.memory_free_bytes, 0) // MIB


# NVLink counters DCGM reports summed over a GPU's links: (name, help, link attributes summed).
LINK_TOTALS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "Total number of NVLink flow-control CRC errors.",
        ("crc_flit_errors",),
    ),
    (
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "Total number of NVLink data CRC errors.",
        ("crc_data_errors",),
    ),
    (
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "Total number of NVLink retries.",
        ("replay_errors",),
    ),
    (
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "Total number of NVLink recovery errors.",
        ("recovery_errors",),
    ),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "Total number of NVLink bandwidth counters for all lanes.",
        ("tx_bytes", "rx_bytes"),
    ),
)
_LINK_ATTRS = tuple(dict.fromkeys(a for *_, attrs in LINK_TOTALS for a in attrs))
_link_row = attrgetter(*_LINK_ATTRS)


def link_totals(g: GpuReading) -> list[int | None]:
    """Each LINK_TOTALS entry summed over the GPU's links in one pass; None where no link
    reports it (Blackwell's DL counters), never a made-up 0."""
    sums: dict[str, int] = {}
    rows = list(map(_link_row, g.nvlinks))
    for attr, column in zip(_LINK_ATTRS, zip(*rows, strict=True), strict=False):
        if None not in column:
            sums[attr] = sum(column)
        elif present := [v for v in column if v is not None]:
            sums[attr] = sum(present)
    return [
        sum(sums[a] for a in attrs if a in sums) if any(a in sums for a in attrs) else None
        for *_, attrs in LINK_TOTALS
    ]


def _violation(policy: str) -> Getter:
    return lambda g: None if g.violation_ns is None else g.violation_ns.get(policy)


def _prof(key: str) -> Getter:
    return lambda g: profiling_ratio(g, key)


FIELDS: tuple[tuple[str, str, str, Getter], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", GAUGE, "SM clock frequency (in MHz).", lambda g: _mhz(g.clock_sm_hz)),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        GAUGE,
        "Memory clock frequency (in MHz).",
        lambda g: _mhz(g.clock_memory_hz),
    ),
    (
        "DCGM_FI_DEV_MEMORY_TEMP",
        GAUGE,
        "Memory temperature (in C).",
        lambda g: _int(g.temperature_memory_celsius),
    ),
    (
        "DCGM_FI_DEV_GPU_TEMP",
        GAUGE,
        "GPU temperature (in C).",
        lambda g: _int(g.temperature_gpu_celsius),
    ),
    ("DCGM_FI_DEV_POWER_USAGE", GAUGE, "Power draw (in W).", lambda g: g.power_watts),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        UNTYPED,
        "Total energy consumption since boot (in mJ).",
        lambda g: None if g.energy_joules is None else round(g.energy_joules * 1000),
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        UNTYPED,
        "Total number of PCIe retries.",
        lambda g: g.pcie_replays,
    ),
    (
        "DCGM_FI_DEV_GPU_UTIL",
        GAUGE,
        "GPU utilization (in %).",
        lambda g: _pct(g.utilization_gpu_ratio),
    ),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        GAUGE,
        "Memory utilization (in %).",
        lambda g: _pct(g.utilization_memory_ratio),
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        GAUGE,
        "Framebuffer memory free (in MiB).",
        lambda g: _mib(g.memory_free_bytes),
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        GAUGE,
        "Framebuffer memory used (in MiB).",
        lambda g: _mib(g.memory_used_bytes),
    ),
    ("DCGM_FI_DEV_FB_RESERVED", GAUGE, "Framebuffer memory reserved (in MiB).", _fb_reserved),
    (
        "DCGM_FI_DEV_POWER_VIOLATION",
        UNTYPED,
        "Throttling duration due to power constraints (in ns).",
        _violation("power"),
    ),
    (
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        UNTYPED,
        "Throttling duration due to thermal constraints (in ns).",
        _violation("thermal"),
    ),
    (
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
        UNTYPED,
        "Throttling duration due to sync-boost constraints (in ns).",
        _violation("sync_boost"),
    ),
    (
        "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        UNTYPED,
        "Throttling duration due to board limit constraints (in ns).",
        _violation("board_limit"),
    ),
    (
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
        UNTYPED,
        "Throttling duration due to low utilization (in ns).",
        _violation("low_utilization"),
    ),
    (
        "DCGM_FI_DEV_RELIABILITY_VIOLATION",
        UNTYPED,
        "Throttling duration due to reliability constraints (in ns).",
        _violation("reliability"),
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        UNTYPED,
        "Total number of single-bit volatile ECC errors.",
        lambda g: g.ecc.corrected_volatile,
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        UNTYPED,
        "Total number of double-bit volatile ECC errors.",
        lambda g: g.ecc.uncorrected_volatile,
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        UNTYPED,
        "Total number of single-bit persistent ECC errors.",
        lambda g: g.ecc.corrected_aggregate,
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        UNTYPED,
        "Total number of double-bit persistent ECC errors.",
        lambda g: g.ecc.uncorrected_aggregate,
    ),
    (
        "DCGM_FI_DEV_RETIRED_SBE",
        UNTYPED,
        "Total number of retired pages due to single-bit errors.",
        lambda g: g.retired_pages.single_bit_ecc if g.retired_pages else None,
    ),
    (
        "DCGM_FI_DEV_RETIRED_DBE",
        UNTYPED,
        "Total number of retired pages due to double-bit errors.",
        lambda g: g.retired_pages.double_bit_ecc if g.retired_pages else None,
    ),
    (
        "DCGM_FI_DEV_RETIRED_PENDING",
        UNTYPED,
        "Total number of pages pending retirement.",
        lambda g: int(g.retired_pages.pending) if g.retired_pages else None,
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        UNTYPED,
        "Number of remapped rows for uncorrectable errors",
        lambda g: g.remapped_rows.uncorrected if g.remapped_rows else None,
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        UNTYPED,
        "Number of remapped rows for correctable errors",
        lambda g: g.remapped_rows.corrected if g.remapped_rows else None,
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        GAUGE,
        "Whether remapping of rows has failed",
        lambda g: int(g.remapped_rows.failure) if g.remapped_rows else None,
    ),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        GAUGE,
        "Ratio of time the graphics engine is active.",
        _prof("gr_engine_active"),
    ),
    (
        "DCGM_FI_PROF_SM_ACTIVE",
        GAUGE,
        "The ratio of cycles an SM has at least 1 warp assigned.",
        _prof("sm_active"),
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        GAUGE,
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        _prof("tensor_active"),
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        GAUGE,
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        _prof("dram_active"),
    ),
)

PCIE_RATE_FIELDS = (
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and"
        " data payloads - in bytes per second.",
        "pcie_tx_bytes",
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus - including both protocol headers and"
        " data payloads - in bytes per second.",
        "pcie_rx_bytes",
    ),
)


def dcgm_labels(snapshot: NodeSnapshot, g: GpuReading) -> str:
    pod = snapshot.pods.get(g.uuid, NO_POD)
    driver = snapshot.gpu.driver_version or ""
    return _labels(g.index, g.uuid, g.pci_bus_id, g.model, snapshot.node, driver, pod)


@lru_cache(maxsize=64)  # a node's GPUs x the pods they serve over time: the same few strings
def _labels(
    index: int, uuid: str, pci_bus_id: str, model: str, node: str, driver: str, pod: PodRef
) -> str:
    pairs = [
        ("gpu", str(index)),
        ("UUID", uuid),
        ("pci_bus_id", pci_bus_id),
        ("device", f"nvidia{index}"),
        ("modelName", model),
        ("Hostname", node),
        ("DCGM_FI_DRIVER_VERSION", driver),
    ]
    if pod.pod:
        pairs += [("container", pod.container), ("namespace", pod.namespace), ("pod", pod.pod)]
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs) + "}"


def render(snapshot: NodeSnapshot, previous: NodeSnapshot | None) -> list[Family]:
    """`previous` turns PCIe byte counters into the rates dcgm-exporter reports. The values are
    gathered as a table of fields x GPUs and written a field at a time (compat/lines.py)."""
    gpus = [g for g in snapshot.gpu.gpus if g.up]
    if not gpus:
        return []
    labels = tuple(dcgm_labels(snapshot, g) for g in gpus)
    rows = [[get(g) for get in _GETTERS] for g in gpus]
    totals = [link_totals(g) for g in gpus]
    last_xid = {lx.uuid: lx.xid for lx in snapshot.xid.last}
    before = {g.uuid: g for g in previous.gpu.gpus} if previous else {}
    elapsed = snapshot.taken_at - previous.taken_at if previous else 0.0
    columns: list[list[float | int | None]] = [
        *map(list, zip(*rows, strict=True)),
        *map(list, zip(*totals, strict=True)),
        [last_xid.get(g.uuid, 0) for g in gpus],
        *(
            [_rate(g, before.get(g.uuid), attr, elapsed) for g in gpus]
            for _, _, attr in PCIE_RATE_FIELDS
        ),
    ]
    return lines.families(_SPECS, labels, columns)


_GETTERS = tuple(get for *_, get in FIELDS)
_SPECS = (
    *((name, kind, help_text) for name, kind, help_text, _ in FIELDS),
    *((name, UNTYPED, help_text) for name, help_text, _ in LINK_TOTALS),
    ("DCGM_FI_DEV_XID_ERRORS", GAUGE, "Value of the last XID error encountered."),
    *((name, GAUGE, help_text) for name, help_text, _ in PCIE_RATE_FIELDS),
)


def _rate(g: GpuReading, prev: GpuReading | None, attr: str, elapsed: float) -> float | None:
    if prev is None or elapsed <= 0:
        return None
    now_v: int | None = getattr(g, attr)
    then_v: int | None = getattr(prev, attr)
    if now_v is None or then_v is None or now_v < then_v:
        return None
    return round((now_v - then_v) / elapsed, 3)
