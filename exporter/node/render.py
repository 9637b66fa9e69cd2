"""NodeSnapshot -> metric families (pure). The names here are topowatch's public interface.

Every series carries `node` so any of them joins to `topowatch_node_topology_info` on `node`.
Per-GPU series carry gpu, uuid, pci_bus_id, model and the pod holding the GPU (namespace, pod,
container; empty when none). A value the source could not read has no series at all.

XIDs are the exception, being events rather than readings: `topowatch_xid_errors_total` carries
the GPU's hardware labels only, so a pod taking the GPU over does not start a new counter series
(which alerts would take for a new XID), and `topowatch_xid_last_event_timestamp_seconds` names
the pod that held the GPU at the last event of each XID, not the pod holding it now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from exporter.core import xid as xid_catalog
from exporter.core.exposition import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    INFO,
    Family,
    escape_label_value,
)
from exporter.core.snapshot import (
    GpuReading,
    NodeSnapshot,
    NvLinkReading,
    PodRef,
)

NO_POD = PodRef("", "", "")
VERSION = "0.1.0"


def _q(value: str) -> str:
    return escape_label_value(value)


@dataclass(frozen=True, slots=True)
class Field:
    """A per-entity numeric series: family metadata plus how to read the value."""

    name: str
    kind: str
    help: str
    get: Callable[[GpuReading], float | int | bool | None]


def profiling_ratio(g: GpuReading, key: str) -> float | None:
    """A GPM activity ratio, None when the GPU has no profiling reading."""
    return g.profiling.get(key) if g.profiling is not None else None


def _flag(value: bool | None) -> int | None:
    return None if value is None else int(value)


GPU_FIELDS: tuple[Field, ...] = (
    Field(
        "topowatch_gpu_recovery_action",
        GAUGE,
        "The driver's own recovery verdict (NVML field 230, until carried out): 0 none,"
        " 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset.",
        lambda g: g.recovery_action,
    ),
    Field(
        "topowatch_gpu_stale_since_timestamp_seconds",
        GAUGE,
        "Set while this GPU's values are the last good ones, not this poll's (an NVML call on"
        " the node hung): when they stopped being fresh.",
        lambda g: g.stale_since,
    ),
    Field(
        "topowatch_gpu_utilization_ratio",
        GAUGE,
        "Fraction of the last sample period a kernel ran on the GPU.",
        lambda g: g.utilization_gpu_ratio,
    ),
    Field(
        "topowatch_gpu_memory_utilization_ratio",
        GAUGE,
        "Fraction of the last sample period device memory was read or written.",
        lambda g: g.utilization_memory_ratio,
    ),
    Field(
        "topowatch_gpu_memory_used_bytes",
        GAUGE,
        "Device memory in use.",
        lambda g: g.memory_used_bytes,
    ),
    Field(
        "topowatch_gpu_memory_free_bytes",
        GAUGE,
        "Device memory free.",
        lambda g: g.memory_free_bytes,
    ),
    Field(
        "topowatch_gpu_memory_total_bytes",
        GAUGE,
        "Device memory installed.",
        lambda g: g.memory_total_bytes,
    ),
    Field("topowatch_gpu_power_watts", GAUGE, "Power draw.", lambda g: g.power_watts),
    Field(
        "topowatch_gpu_energy_joules",
        COUNTER,
        "Energy consumed since the driver loaded.",
        lambda g: g.energy_joules,
    ),
    Field(
        "topowatch_gpu_temperature_celsius",
        GAUGE,
        "GPU die temperature.",
        lambda g: g.temperature_gpu_celsius,
    ),
    Field(
        "topowatch_gpu_memory_temperature_celsius",
        GAUGE,
        "HBM temperature.",
        lambda g: g.temperature_memory_celsius,
    ),
    Field("topowatch_gpu_sm_clock_hertz", GAUGE, "SM clock.", lambda g: g.clock_sm_hz),
    Field("topowatch_gpu_memory_clock_hertz", GAUGE, "Memory clock.", lambda g: g.clock_memory_hz),
    Field(
        "topowatch_gpu_pcie_link_generation",
        GAUGE,
        "PCIe generation the link trained at.",
        lambda g: g.pcie_link_gen_current,
    ),
    Field(
        "topowatch_gpu_pcie_link_generation_max",
        GAUGE,
        "Highest PCIe generation the GPU and its slot support.",
        lambda g: g.pcie_link_gen_max,
    ),
    Field(
        "topowatch_gpu_pcie_link_width",
        GAUGE,
        "PCIe lanes the link trained at.",
        lambda g: g.pcie_link_width_current,
    ),
    Field(
        "topowatch_gpu_pcie_link_width_max",
        GAUGE,
        "Most PCIe lanes the GPU and its slot support.",
        lambda g: g.pcie_link_width_max,
    ),
    Field(
        "topowatch_gpu_pcie_replays",
        COUNTER,
        "PCIe replays (link-level retransmissions).",
        lambda g: g.pcie_replays,
    ),
    Field(
        "topowatch_gpu_pcie_tx_bytes",
        COUNTER,
        "Bytes the GPU sent over PCIe (NVML field 197).",
        lambda g: g.pcie_tx_bytes,
    ),
    Field(
        "topowatch_gpu_pcie_rx_bytes",
        COUNTER,
        "Bytes the GPU received over PCIe (NVML field 198).",
        lambda g: g.pcie_rx_bytes,
    ),
    Field(
        "topowatch_gpu_remapped_rows_pending",
        GAUGE,
        "1 while a row remap waits for a GPU reset.",
        lambda g: _flag(g.remapped_rows.pending) if g.remapped_rows else None,
    ),
    Field(
        "topowatch_gpu_remapped_rows_failure",
        GAUGE,
        "1 when row remapping has failed: the GPU needs replacement.",
        lambda g: _flag(g.remapped_rows.failure) if g.remapped_rows else None,
    ),
    Field(
        "topowatch_gpu_retired_pages_pending",
        GAUGE,
        "1 while a page retirement waits for a reboot.",
        lambda g: _flag(g.retired_pages.pending) if g.retired_pages else None,
    ),
    Field(
        "topowatch_gpu_compute_processes",
        GAUGE,
        "Compute processes running on the GPU.",
        lambda g: len(g.processes) if g.processes is not None else None,
    ),
    Field(
        "topowatch_gpu_graphics_engine_active_ratio",
        GAUGE,
        "Fraction of time a graphics or compute context was busy on the GPU"
        " (GPM; DCGM_FI_PROF_GR_ENGINE_ACTIVE).",
        lambda g: profiling_ratio(g, "gr_engine_active"),
    ),
    Field(
        "topowatch_gpu_sm_active_ratio",
        GAUGE,
        "Fraction of cycles an SM had a warp resident (GPM; DCGM_FI_PROF_SM_ACTIVE).",
        lambda g: profiling_ratio(g, "sm_active"),
    ),
    Field(
        "topowatch_gpu_sm_occupancy_ratio",
        GAUGE,
        "Resident warps over the SM maximum (GPM; DCGM_FI_PROF_SM_OCCUPANCY).",
        lambda g: profiling_ratio(g, "sm_occupancy"),
    ),
    Field(
        "topowatch_gpu_tensor_active_ratio",
        GAUGE,
        "Fraction of cycles a tensor pipe was active (GPM; DCGM_FI_PROF_PIPE_TENSOR_ACTIVE).",
        lambda g: profiling_ratio(g, "tensor_active"),
    ),
    Field(
        "topowatch_gpu_dram_active_ratio",
        GAUGE,
        "Fraction of cycles the memory interface was busy (GPM; DCGM_FI_PROF_DRAM_ACTIVE).",
        lambda g: profiling_ratio(g, "dram_active"),
    ),
    Field(
        "topowatch_gpu_fp64_active_ratio",
        GAUGE,
        "Fraction of cycles the FP64 pipe was active (GPM).",
        lambda g: profiling_ratio(g, "fp64_active"),
    ),
    Field(
        "topowatch_gpu_fp32_active_ratio",
        GAUGE,
        "Fraction of cycles the FP32 pipe was active (GPM).",
        lambda g: profiling_ratio(g, "fp32_active"),
    ),
    Field(
        "topowatch_gpu_fp16_active_ratio",
        GAUGE,
        "Fraction of cycles the FP16 pipe was active (GPM).",
        lambda g: profiling_ratio(g, "fp16_active"),
    ),
    Field(
        "topowatch_gpu_fabric_healthy",
        GAUGE,
        "1 when the GPU's NVLink fabric registration completed with a success status"
        " (HGX Hopper, GB200).",
        lambda g: _flag(g.fabric.healthy) if g.fabric else None,
    ),
)

NVLINK_FIELDS: tuple[tuple[str, str, str, Callable[[NvLinkReading], int | None]], ...] = (
    ("topowatch_nvlink_tx_bytes", COUNTER, "Data bytes sent on the link.", lambda lk: lk.tx_bytes),
    (
        "topowatch_nvlink_rx_bytes",
        COUNTER,
        "Data bytes received on the link.",
        lambda lk: lk.rx_bytes,
    ),
    (
        "topowatch_nvlink_crc_flit_errors",
        COUNTER,
        "Flow-control CRC errors on the link.",
        lambda lk: lk.crc_flit_errors,
    ),
    (
        "topowatch_nvlink_crc_data_errors",
        COUNTER,
        "Data CRC errors on the link.",
        lambda lk: lk.crc_data_errors,
    ),
    ("topowatch_nvlink_replay_errors", COUNTER, "Link-level replays.", lambda lk: lk.replay_errors),
    (
        "topowatch_nvlink_recovery_errors",
        COUNTER,
        "Link recoveries (retraining).",
        lambda lk: lk.recovery_errors,
    ),
    # NVLink5 (Blackwell): NVML's NVML_FI_DEV_NVLINK_COUNT_* per-link field values.
    ("topowatch_nvlink_tx_packets", COUNTER, "Packets sent (NVLink5).", lambda lk: lk.tx_packets),
    (
        "topowatch_nvlink_rx_packets",
        COUNTER,
        "Packets received (NVLink5).",
        lambda lk: lk.rx_packets,
    ),
    (
        "topowatch_nvlink_rx_errors",
        COUNTER,
        "Packets received with errors (NVLink5).",
        lambda lk: lk.rx_errors,
    ),
    (
        "topowatch_nvlink_rx_malformed_packet_errors",
        COUNTER,
        "Malformed packets received (NVLink5).",
        lambda lk: lk.malformed_packet_errors,
    ),
    (
        "topowatch_nvlink_rx_buffer_overrun_errors",
        COUNTER,
        "Packets discarded on receive for a buffer overrun (NVLink5).",
        lambda lk: lk.buffer_overrun_errors,
    ),
    (
        "topowatch_nvlink_rx_remote_errors",
        COUNTER,
        "Packets received stomped (EBP marker) by the remote end (NVLink5).",
        lambda lk: lk.rx_remote_errors,
    ),
    (
        "topowatch_nvlink_rx_general_errors",
        COUNTER,
        "Packets received with a header mismatch (NVLink5).",
        lambda lk: lk.rx_general_errors,
    ),
    (
        "topowatch_nvlink_local_link_integrity_errors",
        COUNTER,
        "Times the local error count crossed its threshold (NVLink5).",
        lambda lk: lk.local_link_integrity_errors,
    ),
    (
        "topowatch_nvlink_tx_discards",
        COUNTER,
        "Error packets discarded on transmit (NVLink5).",
        lambda lk: lk.tx_discards,
    ),
    (
        "topowatch_nvlink_link_recoveries",
        COUNTER,
        "Times the link went from up to recovery, whatever the result (NVLink5).",
        lambda lk: lk.link_recovery_events,
    ),
    (
        "topowatch_nvlink_link_recovery_successes",
        COUNTER,
        "Link recoveries that brought the link back up (NVLink5).",
        lambda lk: lk.link_recovery_successful_events,
    ),
    (
        "topowatch_nvlink_link_recovery_failures",
        COUNTER,
        "Link recoveries that failed, the link declared down (NVLink5).",
        lambda lk: lk.link_recovery_failed_events,
    ),
)


class _Families:
    """Families in a fixed order, created on first use."""

    def __init__(self) -> None:
        self._by_name: dict[str, Family] = {}

    def get(self, name: str, kind: str, help_text: str) -> Family:
        fam = self._by_name.get(name)
        if fam is None:
            fam = self._by_name[name] = Family(name, kind, help_text)
        return fam

    def __iter__(self) -> Iterator[Family]:
        return iter(self._by_name.values())


def render(snapshot: NodeSnapshot) -> list[Family]:
    fams = _Families()
    node = f'node="{_q(snapshot.node)}"'
    _render_self(fams, snapshot, node)
    _render_topology(fams, snapshot, node)
    _render_gpus(fams, snapshot, node)
    _render_efa(fams, snapshot, node)
    _render_numa(fams, snapshot, node)
    _render_custom_checks(fams, snapshot, node)
    _render_kernel_log(fams, snapshot)
    return list(fams)


def gpu_hardware_labels(node: str, g: GpuReading) -> str:
    """The label pairs naming the GPU itself, whoever holds it (the XID counter's)."""
    return (
        f'{node},gpu="{g.index}",uuid="{_q(g.uuid)}",pci_bus_id="{_q(g.pci_bus_id)}",'
        f'model="{_q(g.model)}"'
    )


def pod_labels(pod: PodRef) -> str:
    """namespace, pod and container of a pod holding a GPU (empty values: none)."""
    return f'namespace="{_q(pod.namespace)}",pod="{_q(pod.pod)}",container="{_q(pod.container)}"'


def _render_self(fams: _Families, s: NodeSnapshot, node: str) -> None:
    fams.get("topowatch_exporter_build", INFO, "topowatch version.").add_rendered(
        f'{{{node},version="{VERSION}"}}', 1
    )
    dur = fams.get(
        "topowatch_exporter_collector_duration_seconds",
        GAUGE,
        "Wall time the collector took in the last poll.",
    )
    up = fams.get(
        "topowatch_exporter_collector_success",
        GAUGE,
        "1 when the collector succeeded in the last poll.",
    )
    for c in s.collectors:
        labels = f'{{{node},collector="{c.name}"}}'
        dur.add_rendered(labels, c.duration_seconds)
        up.add_rendered(labels, c.ok)
    errors = fams.get(
        "topowatch_exporter_collector_errors", COUNTER, "Collector failures since start, by reason."
    )
    for (collector, reason), n in sorted(s.collector_errors.items()):
        errors.add_rendered(f'{{{node},collector="{collector}",reason="{_q(reason)}"}}', n)
    if s.last_success is not None:
        fams.get(
            "topowatch_exporter_last_successful_poll_timestamp_seconds",
            GAUGE,
            "Unix time of the last poll in which every collector succeeded.",
        ).add_rendered(f"{{{node}}}", s.last_success)
    fams.get(
        "topowatch_exporter_poll_timestamp_seconds", GAUGE, "Unix time of the poll being served."
    ).add_rendered(f"{{{node}}}", s.taken_at)
    fams.get("topowatch_nvml_up", GAUGE, "1 when NVML initialised and answers.").add_rendered(
        f"{{{node}}}", s.gpu.available
    )
    fams.get("topowatch_gpus", GAUGE, "GPUs NVML enumerates on the node.").add_rendered(
        f"{{{node}}}", len(s.gpu.gpus)
    )
    deployment = sorted({reason for reason, _ in s.gpu.deployment_errors()})
    if deployment:
        family = fams.get(
            "topowatch_node_agent_deployment_error",
            GAUGE,
            "1 for each reason the agent cannot use NVML as it is deployed (library not mounted,"
            " no permission, no driver, a driver unloaded or upgraded under it): fix the"
            " deployment, not the node.",
        )
        for reason in deployment:
            family.add_rendered(f'{{{node},reason="{_q(reason)}"}}', 1)
    if s.gpu.driver_version:
        fams.get("topowatch_gpu_driver", INFO, "NVIDIA driver version.").add_rendered(
            f'{{{node},driver_version="{_q(s.gpu.driver_version)}"}}', 1
        )
    fams.get("topowatch_efa_devices", GAUGE, "EFA devices present in sysfs.").add_rendered(
        f"{{{node}}}", len(s.efa)
    )
    if s.rootfs_read_only is not None:
        fams.get(
            "topowatch_node_rootfs_read_only",
            GAUGE,
            "1 when the root filesystem is mounted read-only.",
        ).add_rendered(f"{{{node}}}", s.rootfs_read_only)


def _render_topology(fams: _Families, s: NodeSnapshot, node: str) -> None:
    t = s.topology
    labels = ",".join(
        [node]
        + [f'layer{n}="{_q(t.layer(n))}"' for n in (1, 2, 3, 4)]
        + [
            f'ultraserver="{_q(t.ultraserver)}"',
            f'zone="{_q(t.zone)}"',
            f'region="{_q(t.region)}"',
            f'instance_type="{_q(t.instance_type)}"',
        ]
    )
    fams.get(
        "topowatch_node_topology",
        INFO,
        "The node's place in EC2's network topology and its UltraServer, from its Node labels.",
    ).add_rendered("{" + labels + "}", 1)


def _render_gpus(fams: _Families, s: NodeSnapshot, node: str) -> None:
    up = fams.get("topowatch_gpu_up", GAUGE, "1 when the GPU answered NVML in the last poll.")
    field_fams = [(f, fams.get(f.name, f.kind, f.help)) for f in GPU_FIELDS]
    ecc = fams.get(
        "topowatch_gpu_ecc_errors",
        COUNTER,
        "ECC errors by type (corrected|uncorrected) and scope"
        " (volatile: since driver load; aggregate: lifetime).",
    )
    remapped = fams.get(
        "topowatch_gpu_remapped_rows",
        COUNTER,
        "Rows remapped, by the kind of error that caused it.",
    )
    retired = fams.get("topowatch_gpu_retired_pages", COUNTER, "Pages retired, by cause.")
    throttled = fams.get(
        "topowatch_gpu_throttled_seconds",
        COUNTER,
        "Time clocks were held down by each policy (power, thermal, sync_boost, board_limit,"
        " low_utilization, reliability) since driver load.",
    )
    reasons = fams.get(
        "topowatch_gpu_clock_event_reason",
        GAUGE,
        "1 for each clock-event (throttle) reason active on the GPU.",
    )
    fabric = fams.get(
        "topowatch_gpu_fabric",
        INFO,
        "NVLink fabric registration state, probe status, clique and cluster (HGX Hopper, GB200).",
    )
    prefixes: dict[int, str] = {}
    hardware: dict[int, str] = {}
    for g in s.gpu.gpus:
        # The labels every per-GPU series carries, rendered once per GPU per poll.
        hardware[g.index] = gpu_hardware_labels(node, g)
        p = f"{hardware[g.index]},{pod_labels(s.pods.get(g.uuid, NO_POD))}"
        prefixes[g.index] = p
        base = "{" + p + "}"
        up.add_rendered(base, g.up)
        for f, fam in field_fams:
            v = f.get(g)
            if v is not None:
                fam.add_rendered(base, v)
        for kind, scope, v in (
            ("corrected", "volatile", g.ecc.corrected_volatile),
            ("uncorrected", "volatile", g.ecc.uncorrected_volatile),
            ("corrected", "aggregate", g.ecc.corrected_aggregate),
            ("uncorrected", "aggregate", g.ecc.uncorrected_aggregate),
        ):
            if v is not None:
                ecc.add_rendered(f'{{{p},type="{kind}",scope="{scope}"}}', v)
        if g.remapped_rows is not None:
            remapped.add_rendered(f'{{{p},cause="correctable"}}', g.remapped_rows.corrected)
            remapped.add_rendered(f'{{{p},cause="uncorrectable"}}', g.remapped_rows.uncorrected)
        if g.retired_pages is not None:
            retired.add_rendered(f'{{{p},cause="single_bit_ecc"}}', g.retired_pages.single_bit_ecc)
            retired.add_rendered(f'{{{p},cause="double_bit_ecc"}}', g.retired_pages.double_bit_ecc)
        for policy, ns in (g.violation_ns or {}).items():
            throttled.add_rendered(f'{{{p},policy="{policy}"}}', ns / 1e9)
        for reason in sorted(g.clock_event_reasons or ()):
            reasons.add_rendered(f'{{{p},reason="{reason}"}}', 1)
        if g.fabric is not None:
            fabric.add_rendered(
                f'{{{p},state="{g.fabric.state}",status="{_q(g.fabric.status or "")}",'
                f'clique_id="{g.fabric.clique_id or ""}",'
                f'cluster_uuid="{_q(g.fabric.cluster_uuid or "")}"}}',
                1,
            )
    _render_nvlinks(fams, s, node)
    _render_xid(fams, s, hardware, prefixes)
    _render_affinity(fams, s, prefixes)


def _render_nvlinks(fams: _Families, s: NodeSnapshot, node: str) -> None:
    up = fams.get("topowatch_nvlink_up", GAUGE, "1 when the NVLink is active.")
    field_fams = [
        (get, fams.get(name, kind, help_text)) for name, kind, help_text, get in NVLINK_FIELDS
    ]
    remote = fams.get(
        "topowatch_nvlink_remote", INFO, "What the NVLink connects to, as NVML reports it."
    )
    for g in s.gpu.gpus:
        gl = f'{node},gpu="{g.index}",uuid="{_q(g.uuid)}"'
        for lk in g.nvlinks:
            labels = f'{{{gl},link="{lk.link}"}}'
            if lk.up is not None:
                up.add_rendered(labels, lk.up)
            for get, fam in field_fams:
                v = get(lk)
                if v is not None:
                    fam.add_rendered(labels, v)
            if lk.remote_pci_bus_id or lk.remote_device_type:
                remote.add_rendered(
                    f'{{{gl},link="{lk.link}",remote_pci_bus_id="{_q(lk.remote_pci_bus_id or "")}",'
                    f'remote_type="{_q(lk.remote_device_type or "")}"}}',
                    1,
                )


def _render_xid(
    fams: _Families, s: NodeSnapshot, hardware: dict[int, str], prefixes: dict[int, str]
) -> None:
    total = fams.get(
        "topowatch_xid_errors",
        COUNTER,
        "XID events seen since the agent started, by XID with the catalog's name and"
        " action bucket. No pod labels: see topowatch_xid_last_event_timestamp_seconds.",
    )
    seen = fams.get(
        "topowatch_xid_last_event_timestamp_seconds",
        GAUGE,
        "Unix time of the last event of this XID on the GPU; namespace, pod and container name"
        " the pod that held the GPU then, not the one holding it now.",
    )
    for c in s.xid.counts:
        hw = hardware.get(c.gpu_index)
        if hw is None:
            continue
        info = xid_catalog.describe(c.xid)
        code = f'xid="{c.xid}",name="{_q(info.name)}",action="{info.action}"'
        total.add_rendered(f"{{{hw},{code}}}", c.count)
        holder = pod_labels(c.last_holder or NO_POD)
        seen.add_rendered(f"{{{hw},{holder},{code}}}", c.last_timestamp)
    last = fams.get("topowatch_gpu_last_xid", GAUGE, "The most recent XID on the GPU.")
    last_ts = fams.get(
        "topowatch_gpu_last_xid_timestamp_seconds",
        GAUGE,
        "Unix time of the most recent XID on the GPU.",
    )
    for lx in s.xid.last:
        p = prefixes.get(lx.gpu_index)
        if p is None:
            continue
        last.add_rendered("{" + p + "}", lx.xid)
        last_ts.add_rendered("{" + p + "}", lx.timestamp)


def _render_affinity(fams: _Families, s: NodeSnapshot, prefixes: dict[int, str]) -> None:
    numa = fams.get("topowatch_gpu_numa", INFO, "The NUMA node the GPU's PCIe slot belongs to.")
    nearest = fams.get(
        "topowatch_gpu_nearest_efa",
        INFO,
        "An EFA device closest to the GPU in the PCIe tree (one series per pair).",
    )
    procs = fams.get(
        "topowatch_gpu_affinity_processes",
        GAUGE,
        "Compute processes on the GPU whose CPU mask was read.",
    )
    off = fams.get(
        "topowatch_gpu_processes_off_numa",
        GAUGE,
        "Compute processes on the GPU allowed to run on CPUs outside the GPU's NUMA node.",
    )
    for a in s.affinity:
        p = prefixes.get(a.gpu_index)
        if p is None:
            continue
        node_label = "" if a.numa_node is None else str(a.numa_node)
        numa.add_rendered(f'{{{p},numa_node="{node_label}"}}', 1)
        for dev in a.nearest_efa:
            nearest.add_rendered(f'{{{p},device="{_q(dev)}"}}', 1)
        procs.add_rendered("{" + p + "}", a.processes)
        off.add_rendered("{" + p + "}", a.processes_off_numa)


def efa_counter_name(counter: str) -> str:
    return f"topowatch_efa_{counter}"


def _render_efa(fams: _Families, s: NodeSnapshot, node: str) -> None:
    info = fams.get("topowatch_efa_device", INFO, "An EFA device, its PCI address and NUMA node.")
    port_up = fams.get(
        "topowatch_efa_port_up",
        GAUGE,
        "1 when the EFA port state is ACTIVE (the efa driver always reports ACTIVE: see"
        " topowatch_efa_netdev_up).",
    )
    port_info = fams.get(
        "topowatch_efa_port",
        INFO,
        "EFA port state, physical state and link layer as sysfs reports them.",
    )
    rate = fams.get("topowatch_efa_port_rate_bytes_per_second", GAUGE, "EFA port signalling rate.")
    netdev_up = fams.get(
        "topowatch_efa_netdev_up",
        GAUGE,
        "1 when the ENA interface paired with the EFA device is up (operstate, carrier).",
    )
    carrier_changes = fams.get(
        "topowatch_efa_netdev_carrier_changes",
        COUNTER,
        "Carrier changes of the ENA interface paired with the EFA device.",
    )
    counter_fams: dict[str, Family] = {}

    def counter_family(name: str, level: str) -> Family:
        fam = counter_fams.get(name)
        if fam is None:
            fam = counter_fams[name] = fams.get(
                efa_counter_name(name), COUNTER, f"EFA {level} hw_counter {name}."
            )
        return fam

    for d in s.efa:
        dl = f'{node},device="{_q(d.device)}"'
        numa_label = "" if d.numa_node is None else str(d.numa_node)
        info.add_rendered(
            f'{{{dl},pci_address="{_q(d.pci_address or "")}",numa_node="{numa_label}"}}', 1
        )
        for name, v in d.counters.items():
            counter_family(name, "device").add_rendered("{" + dl + "}", v)
        nd = d.netdev
        if nd is not None:
            il = f'{{{dl},interface="{_q(nd.interface)}"}}'
            netdev_up.add_rendered(il, nd.link_up)
            if nd.carrier_changes is not None:
                carrier_changes.add_rendered(il, nd.carrier_changes)
        for port in d.ports:
            pl = f'{dl},port="{port.port}"'
            if port.state is not None:
                port_up.add_rendered("{" + pl + "}", port.state == "ACTIVE")
                port_info.add_rendered(
                    f'{{{pl},state="{_q(port.state)}",phys_state="{_q(port.phys_state or "")}",'
                    f'link_layer="{_q(port.link_layer or "")}"}}',
                    1,
                )
            if port.rate_bits_per_second is not None:
                rate.add_rendered("{" + pl + "}", port.rate_bits_per_second / 8)
            for name, v in port.counters.items():
                counter_family(name, "port").add_rendered("{" + pl + "}", v)


def _render_numa(fams: _Families, s: NodeSnapshot, node: str) -> None:
    mem = fams.get(
        "topowatch_numa_memory_bytes", GAUGE, "Per-NUMA-node meminfo, by field (kernel name)."
    )
    pages = fams.get("topowatch_numa_hugepages", GAUGE, "Per-NUMA-node huge page counts, by field.")
    stat = fams.get(
        "topowatch_numa_pages",
        COUNTER,
        "Per-NUMA-node numastat page allocation counters, by event.",
    )
    cpus = fams.get("topowatch_numa_cpus", GAUGE, "CPUs in the NUMA node.")
    info = fams.get("topowatch_numa_node", INFO, "A NUMA node and its CPU list.")
    for n in s.numa:
        nl = f'{node},numa_node="{n.node}"'
        cpus.add_rendered("{" + nl + "}", len(n.cpus))
        info.add_rendered(f'{{{nl},cpulist="{_q(n.cpulist)}"}}', 1)
        for key, v in n.meminfo_bytes.items():
            fam = pages if key.startswith("HugePages_") else mem
            fam.add_rendered(f'{{{nl},field="{_q(key)}"}}', v)
        for key, v in n.numastat.items():
            stat.add_rendered(f'{{{nl},event="{_q(key)}"}}', v)


def _render_custom_checks(fams: _Families, s: NodeSnapshot, node: str) -> None:
    """Admins' check scripts: the latest status (NPD's 0 OK, 1 problem, 2 unknown), runs by how
    they ended, and how long they took. Absent when no check is configured."""
    if not s.custom_checks:
        return
    status = fams.get(
        "topowatch_custom_check_status",
        GAUGE,
        "Latest result of a custom check script: 0 ok, 1 problem, 2 unknown (NPD's exit codes).",
    )
    runs = fams.get(
        "topowatch_custom_check_runs",
        COUNTER,
        "Custom check runs by how they ended (ok, problem, unknown, timeout, error), and turns "
        "skipped because the previous run was still going.",
    )
    duration = fams.get(
        "topowatch_custom_check_duration_seconds",
        HISTOGRAM,
        "How long custom check runs took, timeouts included.",
    )
    for c in s.custom_checks:
        labels = [("node", s.node), ("check", c.check)]
        if c.status is not None:
            status.add(labels, c.status)
        for result, n in c.runs.items():
            runs.add([*labels, ("result", result)], n)
        if c.duration_buckets:
            duration.add_histogram(labels, c.duration_buckets, c.duration_sum, c.duration_count)


def _render_kernel_log(fams: _Families, s: NodeSnapshot) -> None:
    """Kernel log lines that matched the pattern table, counted since the agent started, and
    the time of the latest per series (alerts key on it: a counter's first sample is no
    `increase`). Absent when the monitor is off; the line counters say it reads."""
    k = s.kernel_log
    if k is None:
        return
    base = [("node", s.node), ("source", k.source)]
    for name, help_text, value in (
        ("topowatch_kernel_log_lines", "Kernel log records read.", k.lines),
        (
            "topowatch_kernel_log_dropped",
            "Kernel log records the kernel overwrote before the agent read them.",
            k.dropped,
        ),
        (
            "topowatch_kernel_log_malformed",
            "Kernel log records that could not be parsed (garbage, truncated).",
            k.malformed,
        ),
        (
            "topowatch_kernel_log_suppressed",
            "Kernel messages the kernel's printk ratelimit dropped, as its 'N callbacks"
            " suppressed' lines report them.",
            k.suppressed,
        ),
    ):
        fams.get(name, COUNTER, help_text).add(base, value)
    if not k.counts:
        return
    events = fams.get(
        "topowatch_kernel_log_events",
        COUNTER,
        "Kernel log lines that matched a fault pattern (XID, SXID, fallen off the bus, EFA "
        "driver, PCIe AER, NVLink, hung task), by the GPU or device they name.",
    )
    last = fams.get(
        "topowatch_kernel_log_last_event_timestamp_seconds",
        GAUGE,
        "When the latest line of each kernel log event series was logged (unix seconds).",
    )
    for c in k.counts:
        labels = [
            ("node", s.node),
            ("kind", c.kind),
            ("pattern", c.pattern),
            ("severity", c.severity),
            ("gpu", c.gpu),
            ("device", c.device),
        ]
        events.add(labels, c.count)
        last.add(labels, c.last_at)


def render_sorted_names(families: Sequence[Family]) -> list[str]:
    """Names of the families that carry samples (for docs and tests)."""
    return sorted(f.sample_name for f in families if f.samples or f.lines)
