"""Immutable readings of one poll of a node: the contract between sources, checks and rendering.

Sources fill these records; the renderer turns a `NodeSnapshot` into exposition bytes and the health
checks (healthcheck/detection/checks) turn it into findings. Nothing here does I/O. A value that a
source could not read is `None` and its series is simply absent, so one unsupported field never
hides the rest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Profiling (GPM) activity keys, each a ratio in [0, 1]; the dcgm-exporter DCGM_FI_PROF_* peers.
PROFILING_KEYS = (
    "gr_engine_active",
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_active",
    "fp64_active",
    "fp32_active",
    "fp16_active",
)

# Clock-event (throttle) reasons, named after NVML's nvmlClocksEventReason* bits.
CLOCK_EVENT_REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
)

# Clock-limiting policies NVML counts throttled time for (nvmlPerfPolicyType_t, read with
# nvmlDeviceGetViolationStatus as DCGM reads its *_VIOLATION fields), keyed by our names.
VIOLATION_POLICIES = (
    "power",
    "thermal",
    "sync_boost",
    "board_limit",
    "low_utilization",
    "reliability",
)


# What an NVML failure means for the node, decided by the GPU source from NVML's return code
# (exporter/sources/nvml.py holds the table, with nvml.h's meaning of each code). Checks, the
# renderer and the agent's readiness act on the kind, never on an error message.
NVML_DEPLOYMENT = "deployment"  # how the agent is deployed: library, permissions, no driver yet
NVML_HARDWARE = "hardware"  # the GPU or its driver failed after working: off the bus, unloaded
NVML_RESET = "reset"  # the GPU says it needs a reset before it can be used again
NVML_TIMEOUT = "timeout"  # a call timed out: retried; hardware only if it persists, corroborated
NVML_UNKNOWN = "unknown"  # no NVML code (an exception in the agent): no evidence either way
NVML_FAILURE_KINDS = (NVML_DEPLOYMENT, NVML_HARDWARE, NVML_RESET, NVML_TIMEOUT, NVML_UNKNOWN)


@dataclass(frozen=True, slots=True)
class NvmlFailure:
    """Why NVML, or one GPU through it, could not be read: the code and what it means."""

    code: int | None  # nvmlReturn_t; None when the failure carried no NVML code
    name: str  # "NVML_ERROR_NO_PERMISSION"; the exception's type name when there is no code
    kind: str  # one of NVML_FAILURE_KINDS

    def __post_init__(self) -> None:
        if self.kind not in NVML_FAILURE_KINDS:
            raise ValueError(f"NVML failure kind {self.kind!r} not in {NVML_FAILURE_KINDS}")

    @property
    def reason(self) -> str:
        """A short, bounded label value: "no_permission", "library_not_found", ..."""
        if self.code is None:  # an exception in the agent or a broken library, not NVML's word
            return "agent_error"
        return self.name.removeprefix("NVML_ERROR_").lower()


@dataclass(frozen=True, slots=True)
class NvLinkReading:
    """One NVLink of one GPU. Counters are cumulative since driver load."""

    link: int
    up: bool | None
    tx_bytes: int | None = None
    rx_bytes: int | None = None
    crc_flit_errors: int | None = None
    crc_data_errors: int | None = None
    replay_errors: int | None = None
    recovery_errors: int | None = None
    # NVLink5 (Blackwell) counters, NVML_FI_DEV_NVLINK_COUNT_* field values; None elsewhere.
    tx_packets: int | None = None
    rx_packets: int | None = None
    malformed_packet_errors: int | None = None
    buffer_overrun_errors: int | None = None
    rx_errors: int | None = None
    rx_remote_errors: int | None = None
    rx_general_errors: int | None = None
    local_link_integrity_errors: int | None = None
    tx_discards: int | None = None
    link_recovery_successful_events: int | None = None
    link_recovery_failed_events: int | None = None
    link_recovery_events: int | None = None
    remote_pci_bus_id: str | None = None
    remote_device_type: str | None = None  # "gpu" | "switch" | "ibmnpu" | "unknown"


@dataclass(frozen=True, slots=True)
class EccCounts:
    corrected_volatile: int | None = None
    uncorrected_volatile: int | None = None
    corrected_aggregate: int | None = None
    uncorrected_aggregate: int | None = None


@dataclass(frozen=True, slots=True)
class RemappedRows:
    corrected: int
    uncorrected: int
    pending: bool
    failure: bool


@dataclass(frozen=True, slots=True)
class RetiredPages:
    single_bit_ecc: int
    double_bit_ecc: int
    pending: bool


@dataclass(frozen=True, slots=True)
class FabricInfo:
    """GPU fabric (NVSwitch / multi-node NVLink: HGX Hopper, GB200) registration as NVML
    reports it."""

    state: str  # "not_supported" | "not_started" | "in_progress" | "completed"
    healthy: bool | None  # None while the state carries no status
    clique_id: int | None = None
    cluster_uuid: str | None = None
    status: str | None = None  # the probe's nvmlReturn_t name when completed: "NVML_SUCCESS", ...
    health_mask: int | None = None  # nvmlGpuFabricInfo_v2+ healthMask; None where not offered


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """Everything read from one GPU in one poll.

    `up` is False when the GPU could not be read at all (lost, timed out); the identity fields
    are then whatever was known from an earlier poll or enumeration, and `failure` says why.
    """

    index: int
    uuid: str
    pci_bus_id: str  # NVML form, "00000000:53:00.0"
    model: str
    up: bool
    error: str | None = None  # why the GPU, or some of its fields, could not be read
    failure: NvmlFailure | None = None  # set when `up` is False: the code that failed the GPU
    utilization_gpu_ratio: float | None = None
    utilization_memory_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    energy_joules: float | None = None
    temperature_gpu_celsius: float | None = None
    temperature_memory_celsius: float | None = None
    clock_sm_hz: float | None = None
    clock_memory_hz: float | None = None
    clock_event_reasons: frozenset[str] | None = None  # names from CLOCK_EVENT_REASONS
    # Nanoseconds clocks were held down, per VIOLATION_POLICIES name, since driver load; a policy
    # NVML does not support on this GPU is absent (never 0).
    violation_ns: Mapping[str, int] | None = None
    pcie_link_gen_current: int | None = None
    pcie_link_gen_max: int | None = None
    pcie_link_width_current: int | None = None
    pcie_link_width_max: int | None = None
    pcie_replays: int | None = None
    pcie_tx_bytes: int | None = None
    pcie_rx_bytes: int | None = None
    ecc: EccCounts = field(default_factory=EccCounts)
    remapped_rows: RemappedRows | None = None
    retired_pages: RetiredPages | None = None
    profiling: Mapping[str, float] | None = None  # keys from PROFILING_KEYS, ratios
    fabric: FabricInfo | None = None
    nvlinks: tuple[NvLinkReading, ...] = ()
    processes: tuple[GpuProcess, ...] | None = None
    # The driver's own verdict, NVML field 230 (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), an
    # nvmlDeviceGpuRecoveryAction_t: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain
    # and reset (NVML_GPU_RECOVERY_ACTION_*); None where the driver does not report it.
    recovery_action: int | None = None
    # Set when these values are not from this poll: NVML has not answered since (a call hung),
    # and this is the unix time of the last good read they come from.
    stale_since: float | None = None


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID as delivered by NVML's event set (or the simulation's)."""

    gpu_index: int
    uuid: str
    xid: int
    timestamp: float  # unix seconds


@dataclass(frozen=True, slots=True)
class GpuInventory:
    """What the GPU source returned for one poll.

    `available` is False when NVML itself is missing or failed to initialise; `gpus` is then
    empty, `error` says why in words and `failure` in code. `xid_events` are the events
    delivered since the previous read.
    """

    available: bool
    error: str | None = None
    driver_version: str | None = None
    gpus: tuple[GpuReading, ...] = ()
    xid_events: tuple[XidEvent, ...] = ()
    failure: NvmlFailure | None = None  # set when `available` is False
    # An NVML call that has not returned by the agent's deadline ("nvmlDeviceGetPowerUsage on
    # GPU 3"), and since when (unix seconds); None while NVML answers.
    hung: str | None = None
    hung_since: float | None = None

    def deployment_errors(self) -> tuple[tuple[str, str], ...]:
        """(reason, sentence) for each failure that lies in how the agent is deployed: NVML as
        a whole, or single GPUs the agent may not open. Empty on a well-deployed agent."""
        out: list[tuple[str, str]] = []
        if self.failure is not None and self.failure.kind == NVML_DEPLOYMENT:
            out.append((self.failure.reason, f"NVML: {self.error or self.failure.name}"))
        for g in self.gpus:
            if g.failure is not None and g.failure.kind == NVML_DEPLOYMENT:
                out.append((g.failure.reason, f"GPU {g.index}: {g.error or g.failure.name}"))
        return tuple(out)


@dataclass(frozen=True, slots=True)
class XidCount:
    """Events of one XID on one GPU since the agent started, with the time of the last one and
    the pod that held the GPU then (empty namespace/pod/container: none, or none known)."""

    gpu_index: int
    uuid: str
    xid: int
    count: int
    last_timestamp: float = 0.0
    last_holder: PodRef | None = None


@dataclass(frozen=True, slots=True)
class LastXid:
    gpu_index: int
    uuid: str
    xid: int
    timestamp: float


@dataclass(frozen=True, slots=True)
class XidTotals:
    """XID counters accumulated by the agent since it started: every event counts once."""

    counts: tuple[XidCount, ...] = ()
    last: tuple[LastXid, ...] = ()


@dataclass(frozen=True, slots=True)
class EfaPortReading:
    port: int
    state: str | None = None  # "ACTIVE", "DOWN", ... (the text after "N: " in sysfs)
    state_code: int | None = None  # the N in "N: ACTIVE"
    phys_state: str | None = None
    link_layer: str | None = None
    rate_bits_per_second: float | None = None
    counters: Mapping[str, int] = field(
        default_factory=dict
    )  # port-level hw_counters, by kernel name


@dataclass(frozen=True, slots=True)
class EfaNetdevReading:
    """The ENA network interface paired with an EFA device (same ENI MAC), as sysfs shows it.

    The efa driver hard-codes its port state to ACTIVE/LinkUp; this is where link loss shows.
    """

    interface: str  # "ens32"
    operstate: str | None = None  # RFC 2863 text: "up", "down", "lowerlayerdown", "unknown", ...
    carrier: bool | None = None  # None: unreadable (EINVAL while administratively down)
    carrier_changes: int | None = None

    @property
    def link_up(self) -> bool:
        """operstate "up" (or "unknown": drivers that report no carrier state read so while
        forwarding) and the carrier not lost."""
        return self.operstate in (None, "up", "unknown") and self.carrier is not False


@dataclass(frozen=True, slots=True)
class EfaDeviceReading:
    device: str  # "rdmap16s27"
    pci_address: str | None = None  # sysfs form, "0000:10:1b.0"
    numa_node: int | None = None
    counters: Mapping[str, int] = field(
        default_factory=dict
    )  # device-level hw_counters, by kernel name
    ports: tuple[EfaPortReading, ...] = ()
    error: str | None = None  # files that held garbage, if any
    netdev: EfaNetdevReading | None = None  # None: an EFA-only interface (no ENA netdev)


@dataclass(frozen=True, slots=True)
class NumaNodeReading:
    node: int
    cpus: frozenset[int]
    cpulist: str
    meminfo_bytes: Mapping[str, int] = field(
        default_factory=dict
    )  # "MemTotal" -> bytes; page counts kept as-is
    numastat: Mapping[str, int] = field(default_factory=dict)  # "numa_hit" -> pages


@dataclass(frozen=True, slots=True)
class GpuAffinity:
    """Where one GPU sits relative to CPUs and NICs, and whether its processes agree."""

    gpu_index: int
    numa_node: int | None
    nearest_efa: tuple[str, ...]  # EFA devices closest in the PCIe tree
    processes: int  # compute processes on the GPU whose CPU mask could be read
    processes_off_numa: int  # of those, allowed to run on CPUs outside the GPU's NUMA node


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    pod: str
    container: str


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """The node's place in the cluster, from its own Node object's labels."""

    labels: Mapping[str, str] = field(default_factory=dict)

    LAYER_KEY = "topology.k8s.aws/network-node-layer-{}"
    ULTRASERVER_KEY = "topology.k8s.aws/ultraserver-id"
    ZONE_KEY = "topology.kubernetes.io/zone"
    REGION_KEY = "topology.kubernetes.io/region"
    INSTANCE_TYPE_KEY = "node.kubernetes.io/instance-type"

    def layer(self, n: int) -> str:
        return self.labels.get(self.LAYER_KEY.format(n), "")

    @property
    def ultraserver(self) -> str:
        return self.labels.get(self.ULTRASERVER_KEY, "")

    @property
    def zone(self) -> str:
        return self.labels.get(self.ZONE_KEY, "")

    @property
    def region(self) -> str:
        return self.labels.get(self.REGION_KEY, "")

    @property
    def instance_type(self) -> str:
        return self.labels.get(self.INSTANCE_TYPE_KEY, "")


@dataclass(frozen=True, slots=True)
class CollectorStatus:
    """How one collector fared in the poll that produced the snapshot."""

    name: str  # "gpu", "efa", "numa", "affinity", "podresources", "topology", "rootfs"
    ok: bool
    duration_seconds: float
    error: str | None = None


# Custom check scripts (exporter/sources/custom_checks.py) follow node-problem-detector's custom
# plugin protocol: exit 0 OK, 1 NonOK (a problem), anything else Unknown.
CUSTOM_OK = 0
CUSTOM_PROBLEM = 1
CUSTOM_UNKNOWN = 2
# How a run ended (the `result` label); "skipped": a turn missed while the last run still ran.
CUSTOM_RESULTS = ("ok", "problem", "unknown", "timeout", "error", "skipped")


@dataclass(frozen=True, slots=True)
class CustomCheckReading:
    """One configured custom check: its latest finished run and its counters since start."""

    check: str  # the configured name
    status: int | None = None  # CUSTOM_OK/PROBLEM/UNKNOWN of the latest run; None before one
    result: str | None = None  # the latest run's entry in CUSTOM_RESULTS (never "skipped")
    message: str = ""  # the latest run's message (stdout, capped as NPD does)
    finished_at: float | None = None  # unix seconds
    recent: tuple[int, ...] = ()  # statuses of the latest runs, oldest first
    runs: Mapping[str, int] = field(default_factory=dict)  # result -> runs (and skipped turns)
    duration_buckets: tuple[tuple[float, int], ...] = ()  # cumulative (upper bound, runs)
    duration_sum: float = 0.0
    duration_count: int = 0


@dataclass(frozen=True, slots=True)
class KernelLogRecord:
    """One kernel log record as /dev/kmsg (`prio,seq,usec,flags;message`) or the systemd
    journal (a `_TRANSPORT=kernel` entry) gives it. Continuation lines (` KEY=value`) dropped."""

    seq: int  # the kernel's sequence number; the journal keeps none for kernel lines: -1
    monotonic_usec: int  # microseconds since boot (CLOCK_MONOTONIC), as the kernel stamped it
    timestamp: float  # unix seconds: boot time + monotonic_usec
    priority: int  # syslog level, 0 (emerg) .. 7 (debug)
    message: str


@dataclass(frozen=True, slots=True)
class KernelLogBatch:
    """What one non-blocking read of the kernel log returned: every record new since the last
    read (none replayed after a restart of the agent), and what could not be had."""

    records: tuple[KernelLogRecord, ...] = ()
    dropped: int = 0  # records the kernel overwrote before they were read (EPIPE: a seq gap)
    malformed: int = 0  # records that could not be parsed (garbage, truncated)
    skipped: int = 0  # records read but not handed out: no fault pattern can match them


@dataclass(frozen=True, slots=True)
class KernelLogEvent:
    """A kernel log line that matched the pattern table
    (exporter/core/data/kernel-log-patterns.csv), with its device mapped to ours where it names
    one."""

    kind: str  # xid | sxid | gpu_fallen_off_bus | efa_driver | pcie_aer | nvlink | hung_task ...
    # (exporter/node/kernel/patterns.py KINDS)
    pattern: str  # the table row that matched
    severity: str  # the row's severity (fatal | error | warning | corrected)
    timestamp: float
    message: str  # the line, capped
    code: int | None = None  # the XID or SXID number
    pci_address: str | None = None  # sysfs form, "0000:53:00.0"
    gpu_index: int | None = None  # our GPU at that address, if it is one
    device: str | None = None  # an EFA device, an NVSwitch, a task: what the line names


@dataclass(frozen=True, slots=True)
class KernelLogCount:
    """Matched lines since the agent started, per (kind, pattern, severity, GPU, device)."""

    kind: str
    pattern: str
    severity: str
    gpu: str  # GPU index, "" when the line names none of ours
    device: str  # the line's device (PCI address, EFA device), "" when none
    count: int
    last_at: float  # when the latest of them was logged (unix seconds)
    last_message: str  # the latest of them, capped


@dataclass(frozen=True, slots=True)
class KernelLogReading:
    """The kernel log monitor's state in one snapshot: its source, what it read since start,
    and the events that arrived since the previous poll (the checks hold them as they hold
    XIDs)."""

    source: str  # "kmsg" | "journal" | "" (off or unavailable)
    events: tuple[KernelLogEvent, ...] = ()  # new in this poll
    counts: tuple[KernelLogCount, ...] = ()  # every matched line since the agent started
    lines: int = 0  # records read since start
    dropped: int = 0  # records the kernel overwrote before the agent read them, since start
    malformed: int = 0  # records that could not be parsed, since start
    # messages the kernel's printk ratelimit dropped, as its "N callbacks suppressed" lines say
    suppressed: int = 0


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """One complete poll of a node. Built by the poller, read by render and checks."""

    node: str
    taken_at: float
    gpu: GpuInventory
    xid: XidTotals
    efa: tuple[EfaDeviceReading, ...]
    numa: tuple[NumaNodeReading, ...]
    affinity: tuple[GpuAffinity, ...]
    pods: Mapping[str, PodRef]  # GPU UUID -> the pod holding it
    topology: NodeTopology
    collectors: tuple[CollectorStatus, ...]
    collector_errors: Mapping[tuple[str, str], int]  # (collector, reason) -> total since start
    last_success: float | None  # when every collector last succeeded together
    rootfs_read_only: bool | None = None
    custom_checks: tuple[CustomCheckReading, ...] = ()  # one per configured check
    kernel_log: KernelLogReading | None = None  # None: the kernel log monitor is off
