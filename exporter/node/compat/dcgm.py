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

Not emitted: DCGM_FI_DEV_ENC_UTIL/DEC_UTIL (video engines are not read), DCGM_FI_DEV_VGPU_
LICENSE_STATUS (no vGPU on training nodes), DCGM_FI_PROF_GR_ENGINE_ACTIVE (GPM's SM-active is
exported as DCGM_FI_PROF_SM_ACTIVE instead of being passed off as it), the DCGM_EXP_* fields
(dcgm-exporter's own bookkeeping of DCGM's health and P2P APIs, which NVML has no equal of), and
the NVLink DL error totals on Blackwell, where NVML 565+ no longer reports them.
"""

from __future__ import annotations

from collections.abc import Callable

from exporter.exposition import GAUGE, UNTYPED, Family, escape_label_value
from exporter.node.render import NO_POD, profiling_ratio
from exporter.snapshot import GpuReading, NodeSnapshot

MIB = 1024 * 1024

Getter = Callable[[GpuReading], float | int | None]


def _mib(v: int | None) -> float | None:
    return None if v is None else v / MIB


def _pct(v: float | None) -> float | None:
    return None if v is None else round(v * 100, 3)


def _mhz(v: float | None) -> float | None:
    return None if v is None else v / 1e6


def _fb_reserved(g: GpuReading) -> float | None:
    if g.memory_total_bytes is None or g.memory_used_bytes is None or g.memory_free_bytes is None:
        return None
    return max(g.memory_total_bytes - g.memory_used_bytes - g.memory_free_bytes, 0) / MIB


def _nvlink_total(g: GpuReading) -> int | None:
    values = [v for lk in g.nvlinks for v in (lk.tx_bytes, lk.rx_bytes) if v is not None]
    return sum(values) if values else None


def _links_total(attr: str) -> Getter:
    """One NVLink counter summed over the GPU's links, as DCGM's *_COUNT_TOTAL fields are;
    None when no link reports it (Blackwell's DL counters), never a made-up 0."""

    def total(g: GpuReading) -> int | None:
        values = [v for lk in g.nvlinks if (v := getattr(lk, attr)) is not None]
        return sum(values) if values else None

    return total


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
        lambda g: g.temperature_memory_celsius,
    ),
    ("DCGM_FI_DEV_GPU_TEMP", GAUGE, "GPU temperature (in C).", lambda g: g.temperature_gpu_celsius),
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
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        UNTYPED,
        "Total number of NVLink flow-control CRC errors.",
        _links_total("crc_flit_errors"),
    ),
    (
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        UNTYPED,
        "Total number of NVLink data CRC errors.",
        _links_total("crc_data_errors"),
    ),
    (
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        UNTYPED,
        "Total number of NVLink retries.",
        _links_total("replay_errors"),
    ),
    (
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        UNTYPED,
        "Total number of NVLink recovery errors.",
        _links_total("recovery_errors"),
    ),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        UNTYPED,
        "Total number of NVLink bandwidth counters for all lanes.",
        _nvlink_total,
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
    pairs = [
        ("gpu", str(g.index)),
        ("UUID", g.uuid),
        ("pci_bus_id", g.pci_bus_id),
        ("device", f"nvidia{g.index}"),
        ("modelName", g.model),
        ("Hostname", snapshot.node),
        ("DCGM_FI_DRIVER_VERSION", snapshot.gpu.driver_version or ""),
    ]
    if pod.pod:
        pairs += [("container", pod.container), ("namespace", pod.namespace), ("pod", pod.pod)]
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs) + "}"


def render(snapshot: NodeSnapshot, previous: NodeSnapshot | None) -> list[Family]:
    """`previous` turns PCIe byte counters into the rates dcgm-exporter reports."""
    fams = [Family(name, kind, help_text) for name, kind, help_text, _ in FIELDS]
    xid = Family("DCGM_FI_DEV_XID_ERRORS", GAUGE, "Value of the last XID error encountered.")
    rates = [Family(name, GAUGE, help_text) for name, help_text, _ in PCIE_RATE_FIELDS]
    last_xid = {lx.uuid: lx.xid for lx in snapshot.xid.last}
    before = {g.uuid: g for g in previous.gpu.gpus} if previous else {}
    elapsed = snapshot.taken_at - previous.taken_at if previous else 0.0
    for g in snapshot.gpu.gpus:
        if not g.up:
            continue
        labels = dcgm_labels(snapshot, g)
        for fam, (_, _, _, get) in zip(fams, FIELDS, strict=True):
            v = get(g)
            if v is not None:
                fam.add_rendered(labels, v)
        xid.add_rendered(labels, last_xid.get(g.uuid, 0))
        prev = before.get(g.uuid)
        if prev is None or elapsed <= 0:
            continue
        for fam, (_, _, attr) in zip(rates, PCIE_RATE_FIELDS, strict=True):
            now_v, then_v = getattr(g, attr), getattr(prev, attr)
            if now_v is not None and then_v is not None and now_v >= then_v:
                fam.add_rendered(labels, round((now_v - then_v) / elapsed, 3))
    return [*fams, xid, *rates]
