"""The production GPU source: NVML through pynvml (or anything shaped like it).

`NvmlGpuSource(nvml)` reads every GPU once per `read()` and never raises: a missing library or
driver gives an unavailable inventory (init retried at most every 60 s), a GPU that fails as a
whole (lost, timed out) is reported `up=False` under its known identity without blanking the
others, and a field NVML does not support is None, remembered so it costs nothing next poll.

What a read costs is what NVML costs (on an H100, driver 580: `nvmlDeviceGetViolationStatus`
0.9 ms a call, `nvmlDeviceGetTotalEnergyConsumption` 4.4 ms, `nvmlGpmMetricsGet` 1.9 ms, one
`nvmlDeviceGetFieldValues` batch ~0.7 ms whatever it holds, most other getters < 0.05 ms), so:

* everything nvml.h defines a field id for is in the one batch per GPU per poll;
* total energy (~4.2 ms however it is read, field 83 or its own call) is read every
  `energy_interval` s (120) and GPM profiling every `gpm_interval` s (60), staggered across the
  GPUs; between reads the last value is served, never older than its interval
  (docs/node-agent.md, "What NVML costs"). Everything else is read every poll. At 5 s that is
  about 1.4 ms of NVML a GPU a poll on an H100 by the per-call costs above (13 ms before; energy
  every 60 s would be 1.55).

NVML runs on its own thread (`nvml-read`): `read()` waits for it at most `deadline` seconds
(3). A call that does not return by then (a wedged driver) never holds up the poll, the kernel
log or the checks: the GPU it hangs on is reported `up=False` with a TIMEOUT failure (nvml.h:
"User provided timeout passed", judged as any timeout is), the other GPUs keep their last good
values marked `stale_since` (for at most `STALE_LIMIT_SECONDS`; then `up=False` too), and the
inventory says `hung` and `hung_since`. A call hung on NVML as a whole (init, the device count)
fails the inventory as a whole-NVML TIMEOUT would. No second NVML read starts while one hangs.

The batch (each value carries its own return code, judged per value as a call's would be):
PCIe TX/RX bytes (fields 197/198; `nvmlDeviceGetPcieThroughput` is a 20 ms sample, never used),
the PCIe replay counter, memory temperature, the throttled time per clock policy
(`NVML_FI_DEV_PERF_POLICY_*`, 74-79, nanoseconds, what `nvmlDeviceGetViolationStatus` returns
as violationTime and DCGM's `*_VIOLATION` fields read), the driver's recovery action
(`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, 230), the ECC totals (`NVML_FI_DEV_ECC_{SBE,DBE}_
{VOL,AGG}_TOTAL`, 3-6, `nvmlDeviceGetTotalEccErrors`' four), remapped rows
(`NVML_FI_DEV_REMAPPED_*`, 142-145, `nvmlDeviceGetRemappedRows`' four), retired pages
(`NVML_FI_DEV_RETIRED_SBE/DBE/PENDING`, 29-31), and per NVLink, addressed by scopeId = link
index, its state (`NVML_FI_DEV_NVLINK_GET_STATE`, 165, NVML_FEATURE_ENABLED when active, what
NCCL reads from Hopper on) and:

* `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX` (138/139), data payload in KiB;
* `NVML_FI_DEV_NVLINK_ERROR_DL_CRC/_DL_REPLAY/_DL_RECOVERY` (163/161/162) for the flit CRC,
  replay and recovery counters. These scoped ids are what NVML defines for links past 11: the
  older per-lane ids (`*_COUNT_L0`..`L11`) stop at link 11 and are unsupported from Hopper on,
  and there is no scoped data-CRC id, so data CRC errors come from one
  `nvmlDeviceGetNvLinkErrorCounter(..., NVML_NVLINK_ERROR_DL_CRC_DATA)` call per active link
  (the API nvidia-smi's `nvlink -e` uses; NOT_SUPPORTED is remembered). NVML 565+ drops the DL
  ids on Blackwell too: there the three counters are None;
* NVLink5 (Blackwell) counts per link in the `NVML_FI_DEV_NVLINK_COUNT_*` family (nvml.h ids
  201/203 tx/rx packets, 206 malformed packets, 207 buffer overruns, 208 rx errors, 209 rx
  remote (stomp/EBP) errors, 210 rx general (header mismatch) errors, 211 local link integrity
  (local errors past a threshold), 212 tx discards, 213/214/215 link recoveries succeeded,
  failed, all). Before Blackwell each answers NOT_SUPPORTED once and leaves the request. The
  RAW_BER ids (216-218) are "Deprecated, do not use" in nvml.h and are not read.

Where the library has no `nvmlDeviceGetFieldValues`, or a field id is not served here
(NOT_SUPPORTED, or INVALID_ARGUMENT from a driver older than the id), the value is read with the
call that gives it (violation status, ECC totals, remapped rows, retired pages, NVLink state),
once; where that is unsupported too it is None, as before. The recovery action has no call.

Fabric registration (`nvmlDeviceGetGpuFabricInfoV`, else `nvmlDeviceGetGpuFabricInfo`): the
probe state, and when COMPLETED its `status` (nvml.h: "Error status, if any. Must be checked
only if state returns 'complete'") and, from v2 on, the `healthMask`; healthcheck/detection/checks/
fabric.py judges them.

XIDs arrive on a background thread (`start()`) waiting on an NVML event set; `read()` drains
them, each event exactly once.

Every failure keeps its NVML return code and what the code means for the node (`NvmlFailure`,
`_MEANING` below, in nvml.h's words): a library that is not there, device files the agent may
not open, a driver that is not loaded (never, or no longer: unloaded or upgraded under the
agent) are the deployment's fault, not the hardware's; a GPU that fell off the bus is
hardware; RESET_REQUIRED asks for a reset; a TIMEOUT is retried on the next poll and judged by
the health checks only if it persists.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import queue
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from exporter.core.snapshot import (
    CLOCK_EVENT_REASONS,
    NVML_DEPLOYMENT,
    NVML_HARDWARE,
    NVML_RESET,
    NVML_TIMEOUT,
    NVML_UNKNOWN,
    PROFILING_KEYS,
    VIOLATION_POLICIES,
    EccCounts,
    FabricInfo,
    GpuInventory,
    GpuProcess,
    GpuReading,
    NvLinkReading,
    NvmlFailure,
    RemappedRows,
    RetiredPages,
    XidEvent,
)

log = logging.getLogger(__name__)

INIT_RETRY_SECONDS = 60.0
EVENT_WAIT_MS = 500
DEADLINE_SECONDS = 3.0  # a read still running after this is served as hung (docs/node-agent.md)
ENERGY_INTERVAL_SECONDS = 120.0  # total energy: ~4.2 ms a GPU however it is read
GPM_INTERVAL_SECONDS = 60.0  # GPM metrics: nvmlGpmMetricsGet ~1.9 ms a GPU
STALE_LIMIT_SECONDS = 300.0  # last good values served while NVML hangs, at most this long
CLOSE_WAIT_SECONDS = 1.0  # close() waits this long for a read under way
KIB = 1024
MHZ = 1e6

_NA: Any = object()  # "no value": the call failed or is unsupported (None can be a real value)

# CLOCK_EVENT_REASONS name -> suffix of NVML's nvmlClocksEventReason* / ThrottleReason* bits.
_REASON_SUFFIXES = {
    "gpu_idle": "GpuIdle",
    "applications_clocks_setting": "ApplicationsClocksSetting",
    "sw_power_cap": "SwPowerCap",
    "hw_slowdown": "HwSlowdown",
    "sync_boost": "SyncBoost",
    "sw_thermal_slowdown": "SwThermalSlowdown",
    "hw_thermal_slowdown": "HwThermalSlowdown",
    "hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
    "display_clock_setting": "DisplayClockSetting",
}
assert tuple(_REASON_SUFFIXES) == CLOCK_EVENT_REASONS

# PROFILING_KEYS name -> the GPM metric (a percentage) it is read from.
_GPM_METRICS = {
    "gr_engine_active": "NVML_GPM_METRIC_GRAPHICS_UTIL",
    "sm_active": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_active": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_active": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "fp64_active": "NVML_GPM_METRIC_FP64_UTIL",
    "fp32_active": "NVML_GPM_METRIC_FP32_UTIL",
    "fp16_active": "NVML_GPM_METRIC_FP16_UTIL",
}
assert tuple(_GPM_METRICS) == PROFILING_KEYS

# Field ids read in the batch, with nvml.h's numbers for pynvml releases that predate them.
_FIELD_IDS = {
    "PCIE_COUNT_TX_BYTES": 197,
    "PCIE_COUNT_RX_BYTES": 198,
    "PCIE_REPLAY_COUNTER": 94,
    "MEMORY_TEMP": 82,
    "NVLINK_THROUGHPUT_DATA_TX": 138,
    "NVLINK_THROUGHPUT_DATA_RX": 139,
    "NVLINK_ERROR_DL_CRC": 163,
    "NVLINK_ERROR_DL_REPLAY": 161,
    "NVLINK_ERROR_DL_RECOVERY": 162,
    "NVLINK_COUNT_XMIT_PACKETS": 201,
    "NVLINK_COUNT_RCV_PACKETS": 203,
    "NVLINK_COUNT_MALFORMED_PACKET_ERRORS": 206,
    "NVLINK_COUNT_BUFFER_OVERRUN_ERRORS": 207,
    "NVLINK_COUNT_RCV_ERRORS": 208,
    "NVLINK_COUNT_RCV_REMOTE_ERRORS": 209,
    "NVLINK_COUNT_RCV_GENERAL_ERRORS": 210,
    "NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS": 211,
    "NVLINK_COUNT_XMIT_DISCARDS": 212,
    "NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS": 213,
    "NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS": 214,
    "NVLINK_COUNT_LINK_RECOVERY_EVENTS": 215,
    "NVLINK_GET_STATE": 165,
    "PERF_POLICY_POWER": 74,
    "PERF_POLICY_THERMAL": 75,
    "PERF_POLICY_SYNC_BOOST": 76,
    "PERF_POLICY_BOARD_LIMIT": 77,
    "PERF_POLICY_LOW_UTILIZATION": 78,
    "PERF_POLICY_RELIABILITY": 79,
    "GET_GPU_RECOVERY_ACTION": 230,
    "ECC_SBE_VOL_TOTAL": 3,
    "ECC_DBE_VOL_TOTAL": 4,
    "ECC_SBE_AGG_TOTAL": 5,
    "ECC_DBE_AGG_TOTAL": 6,
    "REMAPPED_COR": 142,
    "REMAPPED_UNC": 143,
    "REMAPPED_PENDING": 144,
    "REMAPPED_FAILURE": 145,
    "RETIRED_SBE": 29,
    "RETIRED_DBE": 30,
    "RETIRED_PENDING": 31,
}
# NvLinkReading attribute <- NVLink5 field (NVML_FI_DEV_NVLINK_COUNT_*), each a plain count.
_NVLINK5_FIELDS = {
    "tx_packets": "NVLINK_COUNT_XMIT_PACKETS",
    "rx_packets": "NVLINK_COUNT_RCV_PACKETS",
    "malformed_packet_errors": "NVLINK_COUNT_MALFORMED_PACKET_ERRORS",
    "buffer_overrun_errors": "NVLINK_COUNT_BUFFER_OVERRUN_ERRORS",
    "rx_errors": "NVLINK_COUNT_RCV_ERRORS",
    "rx_remote_errors": "NVLINK_COUNT_RCV_REMOTE_ERRORS",
    "rx_general_errors": "NVLINK_COUNT_RCV_GENERAL_ERRORS",
    "local_link_integrity_errors": "NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS",
    "tx_discards": "NVLINK_COUNT_XMIT_DISCARDS",
    "link_recovery_successful_events": "NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS",
    "link_recovery_failed_events": "NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS",
    "link_recovery_events": "NVLINK_COUNT_LINK_RECOVERY_EVENTS",
}
# VIOLATION_POLICIES name -> (its field, its nvmlPerfPolicyType_t for the call: nvml.h's numbers).
_VIOLATION_POLICIES = {
    "power": ("PERF_POLICY_POWER", 0),  # NVML_PERF_POLICY_POWER
    "thermal": ("PERF_POLICY_THERMAL", 1),  # NVML_PERF_POLICY_THERMAL
    "sync_boost": ("PERF_POLICY_SYNC_BOOST", 2),  # NVML_PERF_POLICY_SYNC_BOOST
    "board_limit": ("PERF_POLICY_BOARD_LIMIT", 3),  # NVML_PERF_POLICY_BOARD_LIMIT
    "low_utilization": ("PERF_POLICY_LOW_UTILIZATION", 4),  # NVML_PERF_POLICY_LOW_UTILIZATION
    "reliability": ("PERF_POLICY_RELIABILITY", 5),  # NVML_PERF_POLICY_RELIABILITY
}
assert tuple(_VIOLATION_POLICIES) == VIOLATION_POLICIES
# EccCounts attribute -> (its field, and the (error type, counter type) names of the call).
_ECC_FIELDS = {
    "corrected_volatile": ("ECC_SBE_VOL_TOTAL", "CORRECTED", "VOLATILE"),
    "uncorrected_volatile": ("ECC_DBE_VOL_TOTAL", "UNCORRECTED", "VOLATILE"),
    "corrected_aggregate": ("ECC_SBE_AGG_TOTAL", "CORRECTED", "AGGREGATE"),
    "uncorrected_aggregate": ("ECC_DBE_AGG_TOTAL", "UNCORRECTED", "AGGREGATE"),
}
# nvmlDeviceGetRemappedRows' four values, and page retirement's three, as fields, in that order.
_REMAP_FIELDS = ("REMAPPED_COR", "REMAPPED_UNC", "REMAPPED_PENDING", "REMAPPED_FAILURE")
_RETIRED_FIELDS = ("RETIRED_SBE", "RETIRED_DBE", "RETIRED_PENDING")
_GPU_FIELDS = (
    "PCIE_COUNT_TX_BYTES",
    "PCIE_COUNT_RX_BYTES",
    "PCIE_REPLAY_COUNTER",
    "MEMORY_TEMP",
    "GET_GPU_RECOVERY_ACTION",
    *(name for name, _ in _VIOLATION_POLICIES.values()),
    *(name for name, _, _ in _ECC_FIELDS.values()),
    *_REMAP_FIELDS,
    *_RETIRED_FIELDS,
)
_LINK_FIELDS = (
    "NVLINK_GET_STATE",
    "NVLINK_THROUGHPUT_DATA_TX",
    "NVLINK_THROUGHPUT_DATA_RX",
    "NVLINK_ERROR_DL_CRC",
    "NVLINK_ERROR_DL_REPLAY",
    "NVLINK_ERROR_DL_RECOVERY",
    *_NVLINK5_FIELDS.values(),
)
_FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
_REMOTE_TYPES = {0x00: "gpu", 0x01: "ibmnpu", 0x02: "switch", 0xFF: "unknown"}
# c_nvmlValue_t member holding a field value, by nvmlValueType_t.
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

# What a return code means for the node, with nvml.h's own description of it (nvmlReturn_t).
# A code not listed here is judged by when it comes: for NVML as a whole (init, enumeration),
# before NVML has ever worked since the agent started it says nothing about the hardware and is
# the deployment's, and after it worked, NVML broke under a running agent: hardware. For one GPU
# while NVML works, an unlisted code is that GPU's hardware.
_MEANING = {
    # "NVML Shared Library couldn't be found or loaded": not mounted (no NVIDIA runtime class).
    "LIBRARY_NOT_FOUND": NVML_DEPLOYMENT,
    # "The current user does not have permission for operation": device files, user, groups.
    "NO_PERMISSION": NVML_DEPLOYMENT,
    # "The GPU control device has been blocked by the operating system/cgroups".
    "OPERATING_SYSTEM": NVML_DEPLOYMENT,
    # "Local version of NVML doesn't implement this function": the mounted library is too old.
    "FUNCTION_NOT_FOUND": NVML_DEPLOYMENT,
    # "NVIDIA driver is not loaded", even after NVML worked: the driver unloaded under a running
    # agent is an upgrade or the GPU operator's driver container, never a GPU failing (that
    # says GPU_IS_LOST or logs an XID); a reboot would only hide it (issue 28).
    "DRIVER_NOT_LOADED": NVML_DEPLOYMENT,
    # "RM detects a driver/library version mismatch": the driver was upgraded under the library
    # the agent loaded; the agent must restart with the new one.
    "LIB_RM_VERSION_MISMATCH": NVML_DEPLOYMENT,
    # "The GPU has fallen off the bus or has otherwise become inaccessible".
    "GPU_IS_LOST": NVML_HARDWARE,
    # "NVIDIA Kernel detected an interrupt issue with a GPU".
    "IRQ_ISSUE": NVML_HARDWARE,
    # "A device's external power cables are not properly attached".
    "INSUFFICIENT_POWER": NVML_HARDWARE,
    # "The GPU requires a reset before it can be used again".
    "RESET_REQUIRED": NVML_RESET,
    # "User provided timeout passed": retried next poll; the checks decide if it persists.
    "TIMEOUT": NVML_TIMEOUT,
}

# Every nvmlReturn_t name in nvml.h, to name a code (the simulated module has no dir()).
_CODE_NAMES = (
    "UNINITIALIZED",
    "INVALID_ARGUMENT",
    "NOT_SUPPORTED",
    "NO_PERMISSION",
    "ALREADY_INITIALIZED",
    "NOT_FOUND",
    "INSUFFICIENT_SIZE",
    "INSUFFICIENT_POWER",
    "DRIVER_NOT_LOADED",
    "TIMEOUT",
    "IRQ_ISSUE",
    "LIBRARY_NOT_FOUND",
    "FUNCTION_NOT_FOUND",
    "CORRUPTED_INFOROM",
    "GPU_IS_LOST",
    "RESET_REQUIRED",
    "OPERATING_SYSTEM",
    "LIB_RM_VERSION_MISMATCH",
    "IN_USE",
    "MEMORY",
    "NO_DATA",
    "VGPU_ECC_NOT_SUPPORTED",
    "INSUFFICIENT_RESOURCES",
    "FREQ_NOT_SUPPORTED",
    "ARGUMENT_VERSION_MISMATCH",
    "DEPRECATED",
    "NOT_READY",
    "GPU_NOT_FOUND",
    "INVALID_STATE",
    "RESET_TYPE_NOT_SUPPORTED",
    "UNKNOWN",
)


class _Failed(Exception):
    """An NVML failure carried up with its return code (None when it had none)."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


class _GpuDown(_Failed):
    """The GPU as a whole cannot be read this poll (lost, timed out, needs reset)."""


class _NvmlGone(_Failed):
    """NVML itself stopped working (driver unloaded, library mismatch): re-initialise."""


def _code_of(exc: BaseException) -> int | None:
    code = getattr(exc, "value", None)
    return code if isinstance(code, int) and not isinstance(code, bool) else None


@dataclass(frozen=True, slots=True)
class _Codes:
    """NVML return codes and field ids, looked up once on the module in use."""

    success: int
    unsupported: frozenset[int]  # the field/function does not exist here: stop asking
    field_dead: frozenset[int]  # a field id or scope (link) that does not exist here
    gpu_down: frozenset[int]  # the GPU failed as a whole
    nvml_gone: frozenset[int]  # NVML failed as a whole
    timeout: int
    fields: Mapping[str, int]
    names: Mapping[int, str]  # return code -> "NVML_ERROR_..."

    @classmethod
    def of(cls, nvml: Any) -> _Codes:
        def codes(*names: str) -> frozenset[int]:
            found = (getattr(nvml, f"NVML_ERROR_{n}", None) for n in names)
            return frozenset(int(c) for c in found if c is not None)

        unsupported = codes("NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "ARGUMENT_VERSION_MISMATCH")
        return cls(
            success=int(nvml.NVML_SUCCESS),
            unsupported=unsupported,
            field_dead=unsupported | codes("INVALID_ARGUMENT"),
            gpu_down=codes("GPU_IS_LOST", "TIMEOUT", "RESET_REQUIRED", "IRQ_ISSUE"),
            nvml_gone=codes("UNINITIALIZED", "DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH"),
            timeout=int(nvml.NVML_ERROR_TIMEOUT),
            fields={n: int(getattr(nvml, f"NVML_FI_DEV_{n}", i)) for n, i in _FIELD_IDS.items()},
            names={
                int(code): f"NVML_ERROR_{n}"
                for n in _CODE_NAMES
                if (code := getattr(nvml, f"NVML_ERROR_{n}", None)) is not None
            },
        )

    def failure(
        self, code: int | None, *, whole_nvml: bool, worked: bool, exception: str = ""
    ) -> NvmlFailure:
        """What a failure means: `_MEANING`, else by whether NVML has worked since start.

        A failure without an NVML code (an exception from a broken library, or the agent's own
        bug) before NVML ever worked is the deployment's too: a bad image must never look like
        bad hardware; after, it is evidence of nothing.
        """
        if code is None:
            kind = NVML_DEPLOYMENT if whole_nvml and not worked else NVML_UNKNOWN
            return NvmlFailure(None, exception or "no NVML return code", kind)
        name = self.names.get(code, f"NVML_ERROR_CODE_{code}")
        meaning = _MEANING.get(name.removeprefix("NVML_ERROR_"))
        if meaning == NVML_DEPLOYMENT:
            kind = NVML_DEPLOYMENT
        elif whole_nvml:
            kind = NVML_HARDWARE if worked else NVML_DEPLOYMENT
        else:
            kind = meaning or NVML_HARDWARE
        return NvmlFailure(code, name, kind)


@dataclass(slots=True)
class _Gpm:
    """Two GPM samples used alternately (previous, current) and a reusable request; the ratios
    of the last window, served until the next sample is due."""

    samples: list[Any]
    request: Any
    primed: bool = False
    due: float = -math.inf  # clock time the next sample is taken at
    windows: int = 0  # windows measured so far (the first is one poll long, then staggered)
    last: Mapping[str, float] | None = None


@dataclass(slots=True, eq=False)
class _Device:
    """What is known about one GPU between polls."""

    index: int
    handle: Any
    key: int  # handle address, to map event handles back to the GPU
    uuid: str
    pci_bus_id: str
    model: str
    enum_error: str | None = None  # identity incomplete: retry enumeration next poll
    enum_code: int | None = None  # the NVML return code of that failure
    pcie_max: tuple[int | None, int | None] | None = None  # static, read once
    links: tuple[int, ...] | None = None  # existing NVLinks, discovered once
    remote: dict[int, tuple[str | None, str | None]] = field(default_factory=dict)
    unsupported: set[str] = field(default_factory=set)  # calls answered NOT_SUPPORTED
    dead_fields: set[tuple[int, int]] = field(default_factory=set)  # (field id, scope)
    request: list[tuple[int, int]] | None = None  # field-value request, rebuilt on change
    gpm: _Gpm | None = None
    energy: float | None = None  # joules, last read
    energy_due: float = -math.inf  # clock time the next energy read is due
    energy_reads: int = 0


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _handle_key(handle: Any) -> int:
    """The address behind an NVML device handle (event data carries a fresh copy of it)."""
    try:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def _iso(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def _ratio(percent: float) -> float:
    return min(1.0, max(0.0, percent / 100.0))


def _init_reason(nvml: Any, exc: BaseException) -> str:
    """A plain sentence for why NVML could not start, for the inventory and the logs."""
    code = getattr(exc, "value", None)
    reasons = {
        "LIBRARY_NOT_FOUND": "NVML library libnvidia-ml.so.1 not found (no NVIDIA driver "
        "installed, or the library is not mounted into the container)",
        "DRIVER_NOT_LOADED": "NVIDIA kernel driver is not loaded",
        "NO_PERMISSION": "no permission to open the NVIDIA device files",
        "OPERATING_SYSTEM": "the NVIDIA control device is blocked by the operating system "
        "(the container's device cgroup?)",
        "LIB_RM_VERSION_MISMATCH": "NVML library and kernel driver versions differ "
        "(driver updated without a reboot?)",
        "GPU_NOT_FOUND": "NVML found no supported GPU",
    }
    for name, reason in reasons.items():
        if code is not None and code == getattr(nvml, f"NVML_ERROR_{name}", None):
            return reason
    return f"NVML initialisation failed: {exc}"


class NvmlGpuSource:
    """GpuSource over NVML. `read()` polls (on the `nvml-read` thread, waiting at most
    `deadline` s; None reads on the caller's thread, unbounded); `start()` adds XID events;
    `close()` ends both. `energy_interval` and `gpm_interval` are how often the two costly
    readings are taken (0: every read)."""

    def __init__(
        self,
        nvml: Any = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        init_retry_seconds: float = INIT_RETRY_SECONDS,
        deadline: float | None = DEADLINE_SECONDS,
        energy_interval: float = ENERGY_INTERVAL_SECONDS,
        gpm_interval: float = GPM_INTERVAL_SECONDS,
    ) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        if deadline is not None and deadline <= 0:
            raise ValueError(f"deadline must be positive, got {deadline}")
        if energy_interval < 0 or gpm_interval < 0:
            raise ValueError("energy_interval and gpm_interval must not be negative")
        self._nvml = nvml
        self._clock = clock
        self._wall_clock = wall_clock
        self._init_retry = init_retry_seconds
        self._deadline = deadline
        self._energy_interval = energy_interval
        self._gpm_interval = gpm_interval
        self._codes = _Codes.of(nvml)
        self._error_types: tuple[type[BaseException], ...] = (nvml.NVMLError,)
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        self._mismatch: tuple[type[BaseException], ...] = (mismatch,) if mismatch else ()
        self._reason_bits = self._reason_table(nvml)
        # Read field values through a hook-free twin of pynvml's struct (same layout, built from
        # its _fields_): pynvml's Python-level __getattribute__ would triple the batch's cost.
        self._plain_field: Any = type(
            "_PlainFieldValue", (ctypes.Structure,), {"_fields_": nvml.c_nvmlFieldValue_t._fields_}
        )
        self._gpm_ids = tuple(int(getattr(nvml, m)) for m in _GPM_METRICS.values())
        self._lock = threading.Lock()  # guards _devices/_by_key against the XID thread
        self._initialized = False
        self._init_error: str | None = None
        self._init_failure: NvmlFailure | None = None
        self._worked = False  # NVML answered a whole poll since this source was made
        self._next_init = 0.0
        self._driver_version: str | None = None
        self._devices: list[_Device] = []
        self._by_key: dict[int, _Device] = {}
        self._generation = 0
        self._identity: dict[int, tuple[str, str, str]] = {}  # index -> uuid, bus id, model
        self._down: dict[int, str] = {}  # GPUs last seen down, for logging transitions
        self._errors: list[str] = []  # field-level errors of the GPU being read
        self._internal_error: str | None = None
        self._lost_error: str | None = None  # why NVML last failed after a good init
        self._wait_error: str | None = None
        self._xids: queue.SimpleQueue[XidEvent] = queue.SimpleQueue()
        self._xid_error: str | None = None
        self._ready = threading.Event()  # devices enumerated: the XID thread may register
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The read thread: `read()` asks for read number `_asked`, the thread answers it in
        # `_answer` and sets `_answered`; while they differ a read is under way.
        self._reads = threading.Condition()
        self._reader: threading.Thread | None = None
        self._reader_stop = False
        self._asked = 0
        self._answered = 0
        self._answer: GpuInventory | None = None
        self._last_good: GpuInventory | None = None  # the last read that reached the GPUs
        self._last_good_at = 0.0  # wall clock
        self._gpu_count = 0  # what nvmlDeviceGetCount last said
        # Where the read thread is: (GPU index or None for NVML as a whole, the NVML function,
        # since: monotonic and wall clock). One tuple, swapped whole: read without a lock.
        self._step: tuple[int | None, Any, float, float] = (None, None, 0.0, 0.0)
        self._hang_logged: tuple[int | None, float] | None = None

    @staticmethod
    def _reason_table(nvml: Any) -> tuple[tuple[int, str], ...]:
        table = []
        for name, suffix in _REASON_SUFFIXES.items():
            bit = getattr(nvml, f"nvmlClocksEventReason{suffix}", None)
            if bit is None:
                bit = getattr(nvml, f"nvmlClocksThrottleReason{suffix}", None)
            if bit is not None:
                table.append((int(bit), name))
        return tuple(table)

    @property
    def xid_error(self) -> str | None:
        """Why XID events are not being received, if they are not."""
        return self._xid_error

    # ----- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the XID event thread (idempotent)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._xid_loop, name="nvml-xid", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the XID and read threads, free GPM samples and shut NVML down. A read hung in
        NVML is left where it is (a daemon thread): freeing or shutting NVML down under it
        could hang the caller too, and the process is ending."""
        self._stop.set()
        self._ready.set()
        reader = self._reader
        with self._reads:
            self._reader_stop = True
            self._reads.notify_all()
        if reader is not None:
            reader.join(timeout=CLOSE_WAIT_SECONDS)
            self._reader = None
            if reader.is_alive():
                log.warning(
                    "NVML read still hung at close (%s); not shutting NVML down", self._what()
                )
                return
        if self._thread is not None:
            self._thread.join(timeout=EVENT_WAIT_MS / 1000 * 4)
            self._thread = None
        with self._lock:
            self._forget_devices()
            if self._initialized:
                self._initialized = False
                try:
                    self._nvml.nvmlShutdown()
                except self._error_types as e:
                    log.debug("nvmlShutdown failed: %s", e)

    # ----- read ------------------------------------------------------------------------------

    def read(self) -> GpuInventory:
        """One reading of every GPU, with the XIDs delivered since the last read; never blocks
        for longer than the deadline, never raises."""
        inventory = self._read_safely() if self._deadline is None else self._read_bounded()
        xids = self._drain_xids()  # the event thread's, whether or not the read got through
        return replace(inventory, xid_events=xids) if xids else inventory

    def _read_bounded(self) -> GpuInventory:
        """Ask the read thread for a read and wait up to the deadline. A read still under way
        from an earlier call is not waited for again (it already missed its deadline) and no
        second one is started beside it: its NVML call is hung."""
        with self._reads:
            if self._asked == self._answered:
                self._asked += 1
                self._start_reader()
                self._reads.notify_all()
                self._reads.wait_for(lambda: self._answered == self._asked, self._deadline)
            if self._answered == self._asked and self._answer is not None:
                answer, self._answer = self._answer, None
                self._hang_over()
                return answer
        return self._hung()

    def _start_reader(self) -> None:
        if self._reader is not None and self._reader.is_alive():
            return
        self._reader_stop = False
        self._reader = threading.Thread(target=self._read_loop, name="nvml-read", daemon=True)
        self._reader.start()

    def _read_loop(self) -> None:
        while True:
            with self._reads:
                self._reads.wait_for(lambda: self._reader_stop or self._asked != self._answered)
                if self._reader_stop:
                    return
                asked = self._asked
            answer = self._read_safely()
            with self._reads:
                if answer.available:
                    self._last_good, self._last_good_at = answer, self._wall_clock()
                self._answer, self._answered = answer, asked
                self._reads.notify_all()

    def _at(self, gpu: int | None, fn: Any) -> None:
        """The read thread moves on to `fn` (an NVML function) on `gpu` (None: NVML as a whole)."""
        self._step = (gpu, fn, time.monotonic(), self._wall_clock())

    def _what(self) -> str:
        gpu, fn, _, _ = self._step
        name = getattr(fn, "__name__", None) or str(fn or "NVML")
        return name if gpu is None else f"{name} on GPU {gpu}"

    def _hung(self) -> GpuInventory:
        """The inventory while an NVML call hangs: the GPU it hangs on down with a TIMEOUT
        (judged as any timeout: a warning, an action only with other evidence), the others'
        last good values marked stale (for STALE_LIMIT_SECONDS), the hang named. A call on
        NVML as a whole fails the inventory as a whole-NVML TIMEOUT would."""
        gpu, _, since, since_wall = self._step
        what = self._what()
        error = (
            f"NVML hung: {what} has not returned for {time.monotonic() - since:.1f} s (since "
            f"{_iso(since_wall)}; deadline {self._deadline:g} s)"
        )
        if self._hang_logged != (gpu, since):
            log.warning("%s; serving without it until it returns", error)
            self._hang_logged = (gpu, since)
        timeout = self._codes.timeout
        if gpu is None:
            failure = self._codes.failure(timeout, whole_nvml=True, worked=self._worked)
            return GpuInventory(
                available=False,
                error=error,
                driver_version=self._driver_version,
                failure=failure,
                hung=what,
                hung_since=since_wall,
            )
        down = self._codes.failure(timeout, whole_nvml=False, worked=self._worked)
        last = self._last_good
        fresh_enough = last is not None and self._wall_clock() - self._last_good_at <= (
            STALE_LIMIT_SECONDS
        )
        known = {g.index: g for g in last.gpus} if last is not None else {}
        readings = []
        for index in range(max(self._gpu_count, len(known), gpu + 1)):
            old = known.get(index)
            if old is not None and index != gpu and fresh_enough:
                readings.append(replace(old, stale_since=self._last_good_at))
                continue
            uuid, bus_id, model = self._identity.get(index, ("", "", ""))
            why = error if index == gpu else f"not read: NVML is blocked on GPU {gpu} ({error})"
            readings.append(
                GpuReading(
                    index=index,
                    uuid=old.uuid if old else uuid,
                    pci_bus_id=old.pci_bus_id if old else bus_id,
                    model=old.model if old else model,
                    up=False,
                    error=why,
                    failure=down,
                )
            )
        return GpuInventory(
            available=True,
            driver_version=self._driver_version,
            gpus=tuple(readings),
            hung=what,
            hung_since=since_wall,
        )

    def _hang_over(self) -> None:
        if self._hang_logged is not None:
            log.info("NVML answers again")
            self._hang_logged = None

    def _read_safely(self) -> GpuInventory:
        try:
            return self._read()
        except Exception as e:  # read() must never raise: a bug, logged once per distinct error
            error = f"internal error reading NVML: {e!r}"
            if error != self._internal_error:
                log.exception("unexpected error reading NVML")
            self._internal_error = error
            failure = self._codes.failure(
                None, whole_nvml=True, worked=self._worked, exception=type(e).__name__
            )
            return GpuInventory(available=False, error=error, failure=failure)

    def _read(self) -> GpuInventory:
        if not self._initialized and not self._try_init():
            return GpuInventory(available=False, error=self._init_error, failure=self._init_failure)
        try:
            self._enumerate()
            gpus = tuple(self._read_gpu(dev) for dev in list(self._devices))
            self._at(None, None)
        except _NvmlGone as e:
            return self._lost_nvml(str(e), e.code)
        except self._error_types as e:
            code = _code_of(e)
            if code in self._codes.nvml_gone:
                return self._lost_nvml(str(e), code)
            return GpuInventory(
                available=False,
                error=f"NVML device enumeration failed: {e}",
                driver_version=self._driver_version,
                failure=self._codes.failure(code, whole_nvml=True, worked=self._worked),
            )
        if self._lost_error is not None:
            log.info("NVML working again after: %s", self._lost_error)
            self._lost_error = None
        self._internal_error = None
        self._worked = True
        return GpuInventory(available=True, driver_version=self._driver_version, gpus=gpus)

    def _try_init(self) -> bool:
        now = self._clock()
        if now < self._next_init:
            return False
        self._at(None, self._nvml.nvmlInit)
        try:
            self._nvml.nvmlInit()
        except Exception as e:  # NVMLError, or anything a broken install throws
            reason = _init_reason(self._nvml, e)
            failure = self._codes.failure(
                _code_of(e), whole_nvml=True, worked=self._worked, exception=type(e).__name__
            )
            if reason != self._init_error:
                log.warning(
                    "NVML unavailable: %s [%s, a %s fault] (retrying every %.0f s)",
                    reason,
                    failure.name,
                    failure.kind,
                    self._init_retry,
                )
            self._init_error = reason
            self._init_failure = failure
            self._next_init = now + self._init_retry
            return False
        if self._init_error is not None:
            log.info("NVML initialised after earlier failure (%s)", self._init_error)
        self._initialized = True
        self._init_error = None
        self._init_failure = None
        self._driver_version = self._read_driver_version()
        return True

    def _read_driver_version(self) -> str | None:
        try:
            return _text(self._nvml.nvmlSystemGetDriverVersion())
        except self._error_types as e:
            log.warning("cannot read driver version: %s", e)
            return None

    def _lost_nvml(self, reason: str, code: int | None) -> GpuInventory:
        """NVML broke under us: drop all state and re-initialise on the normal schedule."""
        error = f"NVML stopped working: {reason}"
        if error != self._lost_error:
            log.warning("%s; re-initialising", error)
        self._lost_error = error
        with self._lock:
            self._forget_devices()
            self._initialized = False
        self._next_init = self._clock()
        failure = self._codes.failure(code, whole_nvml=True, worked=self._worked)
        return GpuInventory(available=False, error=error, failure=failure)

    def _drain_xids(self) -> tuple[XidEvent, ...]:
        events = []
        while True:
            try:
                events.append(self._xids.get_nowait())
            except queue.Empty:
                return tuple(events)

    # ----- enumeration -----------------------------------------------------------------------

    def _enumerate(self) -> None:
        """Enumerate on first use and whenever the GPU count changes; retry broken entries."""
        self._at(None, self._nvml.nvmlDeviceGetCount)
        count = int(self._nvml.nvmlDeviceGetCount())
        self._gpu_count = count
        if count != len(self._devices):
            if self._devices:
                log.warning("GPU count changed from %d to %d", len(self._devices), count)
            devices = [self._enumerate_one(i) for i in range(count)]
            with self._lock:
                self._forget_devices()
                self._install(devices)
            return
        broken = [i for i, d in enumerate(self._devices) if d.enum_error is not None]
        if broken:
            devices = list(self._devices)
            for i in broken:
                devices[i] = self._enumerate_one(i)
            with self._lock:
                self._install(devices)

    def _install(self, devices: list[_Device]) -> None:
        self._devices = devices
        self._by_key = {d.key: d for d in devices if d.handle is not None}
        self._generation += 1
        self._ready.set()

    def _enumerate_one(self, index: int) -> _Device:
        n = self._nvml
        uuid, bus_id, model = self._identity.get(index, ("", "", ""))
        handle: Any = None
        self._at(index, n.nvmlDeviceGetHandleByIndex)
        try:
            handle = n.nvmlDeviceGetHandleByIndex(index)
            self._step = (index, n.nvmlDeviceGetUUID, *self._step[2:])
            uuid = _text(n.nvmlDeviceGetUUID(handle))
            self._step = (index, n.nvmlDeviceGetPciInfo, *self._step[2:])
            bus_id = _text(n.nvmlDeviceGetPciInfo(handle).busId)
            self._step = (index, n.nvmlDeviceGetName, *self._step[2:])
            model = _text(n.nvmlDeviceGetName(handle))
        except self._error_types as e:
            self._check_nvml(e)
            key = _handle_key(handle) if handle is not None else -1 - index
            return _Device(
                index, handle, key, uuid, bus_id, model, enum_error=str(e), enum_code=_code_of(e)
            )
        self._identity[index] = (uuid, bus_id, model)
        return _Device(index, handle, _handle_key(handle), uuid, bus_id, model)

    def _forget_devices(self) -> None:
        """Free what NVML allocated for the current devices (caller holds the lock)."""
        for dev in self._devices:
            if dev.gpm is not None:
                for sample in dev.gpm.samples:
                    with contextlib.suppress(*self._error_types):
                        self._nvml.nvmlGpmSampleFree(sample)
                dev.gpm = None
        self._devices = []
        self._by_key = {}
        self._ready.clear()

    def _check_nvml(self, exc: BaseException) -> None:
        code = _code_of(exc)
        if code in self._codes.nvml_gone:
            raise _NvmlGone(str(exc), code) from exc

    # ----- one GPU ---------------------------------------------------------------------------

    def _call(self, dev: _Device, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """One NVML call for one field: its value, or `_NA` (NOT_SUPPORTED is remembered).

        Errors that fail the whole GPU raise `_GpuDown`; other errors are noted on the reading.
        """
        if name in dev.unsupported:
            return _NA
        self._step = (dev.index, fn, *self._step[2:])  # the GPU's start time stays
        try:
            return fn(*args)
        except self._error_types as e:
            code = getattr(e, "value", None)
            if code in self._codes.unsupported:
                dev.unsupported.add(name)
                log.debug("GPU %d: %s not supported (%s)", dev.index, name, e)
            elif code in self._codes.gpu_down:
                raise _GpuDown(f"{name}: {e}", _code_of(e)) from e
            else:
                self._check_nvml(e)
                self._errors.append(f"{name}: {e}")
            return _NA
        except self._mismatch as e:
            dev.unsupported.add(name)
            log.debug("GPU %d: %s unavailable (%s)", dev.index, name, e)
            return _NA

    def _read_gpu(self, dev: _Device) -> GpuReading:
        if dev.handle is None:
            error = dev.enum_error or "GPU handle unavailable"
            return self._down_reading(dev, error, dev.enum_code)
        self._at(dev.index, None)
        self._errors = []
        try:
            reading = self._read_up(dev)
        except _GpuDown as e:
            return self._down_reading(dev, str(e), e.code)
        if dev.index in self._down:
            log.info("GPU %d (%s) readable again", dev.index, dev.uuid)
            del self._down[dev.index]
        return reading

    def _down_reading(self, dev: _Device, error: str, code: int | None) -> GpuReading:
        failure = self._codes.failure(code, whole_nvml=False, worked=self._worked)
        if self._down.get(dev.index) != error:
            log.warning(
                "GPU %d (%s, %s) cannot be read: %s [%s, a %s fault]",
                dev.index,
                dev.uuid,
                dev.pci_bus_id,
                error,
                failure.name,
                failure.kind,
            )
            self._down[dev.index] = error
        return GpuReading(
            index=dev.index,
            uuid=dev.uuid,
            pci_bus_id=dev.pci_bus_id,
            model=dev.model,
            up=False,
            error=error,
            failure=failure,
        )

    def _read_up(self, dev: _Device) -> GpuReading:
        n, h = self._nvml, dev.handle
        self._discover(dev)
        fields = self._read_fields(dev)
        util = self._call(dev, "utilization", n.nvmlDeviceGetUtilizationRates, h)
        memory = self._call(dev, "memory", n.nvmlDeviceGetMemoryInfo, h)
        power = self._call(dev, "power", n.nvmlDeviceGetPowerUsage, h)
        temp = self._call(dev, "temperature", n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)
        sm = self._call(dev, "clock_sm", n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM)
        mem_clock = self._call(dev, "clock_mem", n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM)
        gen = self._call(dev, "pcie_gen", n.nvmlDeviceGetCurrPcieLinkGeneration, h)
        width = self._call(dev, "pcie_width", n.nvmlDeviceGetCurrPcieLinkWidth, h)
        gen_max, width_max = dev.pcie_max or (None, None)
        f = self._codes.fields
        return GpuReading(
            index=dev.index,
            uuid=dev.uuid,
            pci_bus_id=dev.pci_bus_id,
            model=dev.model,
            up=True,
            utilization_gpu_ratio=None if util is _NA else _ratio(util.gpu),
            utilization_memory_ratio=None if util is _NA else _ratio(util.memory),
            memory_used_bytes=None if memory is _NA else int(memory.used),
            memory_free_bytes=None if memory is _NA else int(memory.free),
            memory_total_bytes=None if memory is _NA else int(memory.total),
            power_watts=None if power is _NA else power / 1000.0,
            energy_joules=self._energy(dev),
            temperature_gpu_celsius=None if temp is _NA else float(temp),
            temperature_memory_celsius=_float(fields.get((f["MEMORY_TEMP"], 0))),
            clock_sm_hz=None if sm is _NA else sm * MHZ,
            clock_memory_hz=None if mem_clock is _NA else mem_clock * MHZ,
            clock_event_reasons=self._reasons(dev),
            violation_ns=self._violations(dev, fields),
            pcie_link_gen_current=None if gen is _NA else int(gen),
            pcie_link_gen_max=gen_max,
            pcie_link_width_current=None if width is _NA else int(width),
            pcie_link_width_max=width_max,
            pcie_replays=_int(fields.get((f["PCIE_REPLAY_COUNTER"], 0))),
            pcie_tx_bytes=_int(fields.get((f["PCIE_COUNT_TX_BYTES"], 0))),
            pcie_rx_bytes=_int(fields.get((f["PCIE_COUNT_RX_BYTES"], 0))),
            ecc=self._ecc(dev, fields),
            remapped_rows=self._remapped_rows(dev, fields),
            retired_pages=self._retired_pages(dev, fields),
            profiling=self._profiling(dev),
            fabric=self._fabric(dev),
            nvlinks=self._nvlinks(dev, fields),
            processes=self._processes(dev),
            recovery_action=_int(fields.get((f["GET_GPU_RECOVERY_ACTION"], 0))),
            error="; ".join(self._errors) or None,
        )

    def _discover(self, dev: _Device) -> None:
        """Static facts, read once per enumeration: PCIe maxima and which NVLinks exist."""
        n, h = self._nvml, dev.handle
        if dev.pcie_max is None:
            gen = self._call(dev, "pcie_gen_max", n.nvmlDeviceGetMaxPcieLinkGeneration, h)
            width = self._call(dev, "pcie_width_max", n.nvmlDeviceGetMaxPcieLinkWidth, h)
            dev.pcie_max = (None if gen is _NA else int(gen), None if width is _NA else int(width))
        if dev.links is None:
            dev.links = tuple(
                link for link in range(int(n.NVML_NVLINK_MAX_LINKS)) if self._link_exists(dev, link)
            )
            dev.request = None

    def _link_exists(self, dev: _Device, link: int) -> bool:
        self._step = (dev.index, self._nvml.nvmlDeviceGetNvLinkState, *self._step[2:])
        try:
            self._nvml.nvmlDeviceGetNvLinkState(dev.handle, link)
        except self._error_types as e:
            code = getattr(e, "value", None)
            if code in self._codes.gpu_down:
                dev.links = None
                raise _GpuDown(f"nvlink discovery: {e}", code) from e
            self._check_nvml(e)
            return False
        return True

    # ----- batched field values --------------------------------------------------------------

    def _field_request(self, dev: _Device) -> list[tuple[int, int]]:
        if dev.request is None:
            f = self._codes.fields
            wanted = [(f[name], 0) for name in _GPU_FIELDS]
            wanted += [(f[name], link) for link in dev.links or () for name in _LINK_FIELDS]
            dev.request = [w for w in wanted if w not in dev.dead_fields]
        return dev.request

    def _read_fields(self, dev: _Device) -> dict[tuple[int, int], float]:
        """All counters in one nvmlDeviceGetFieldValues call, honouring each value's return."""
        request = self._field_request(dev)
        if not request:
            return {}
        values = self._call(
            dev, "field_values", self._nvml.nvmlDeviceGetFieldValues, dev.handle, request
        )
        if values is _NA:
            return {}
        with contextlib.suppress(TypeError):  # a non-ctypes test double is read as it is
            values = (self._plain_field * len(request)).from_buffer(values)
        out: dict[tuple[int, int], float] = {}
        codes = self._codes
        for slot_id, slot in zip(request, values, strict=False):
            ret = slot.nvmlReturn
            if ret == codes.success and 0 <= slot.valueType < len(_VALUE_MEMBERS):
                out[slot_id] = getattr(slot.value, _VALUE_MEMBERS[slot.valueType])
            elif ret in codes.field_dead:
                dev.dead_fields.add(slot_id)
                dev.request = None
            elif ret in codes.gpu_down:
                raise _GpuDown(f"field values: {self._nvml.NVMLError(ret)}", int(ret))
            else:
                self._errors.append(f"field {slot_id[0]}/{slot_id[1]}: {self._nvml.NVMLError(ret)}")
        return out

    def _dead(self, dev: _Device, name: str, scope: int = 0) -> bool:
        """Whether field `name` cannot be had from the batch here: the library has no
        nvmlDeviceGetFieldValues, or NVML answered this id NOT_SUPPORTED / INVALID_ARGUMENT.
        Then the value is read with the call that gives it, if there is one."""
        return "field_values" in dev.unsupported or (
            (self._codes.fields[name], scope) in dev.dead_fields
        )

    # ----- on a longer cadence ---------------------------------------------------------------

    def _due(self, dev: _Device, interval: float, reads: int) -> float:
        """How long until the next costly read: the interval, except that after the first read
        the GPUs' turns are spread across it (GPU i at (i + 1) / n of it), so one poll does not
        pay for all of them. Never longer than the interval: that bounds the age served."""
        if reads == 1 and self._devices:
            return interval * (dev.index % len(self._devices) + 1) / len(self._devices)
        return interval

    def _energy(self, dev: _Device) -> float | None:
        """Total energy in joules, read every `energy_interval` s (it costs ~4.2 ms a GPU on an
        H100 however it is read); in between, the last value. A read that fails is retried
        the next poll, with nothing served meanwhile."""
        now = self._clock()
        if now < dev.energy_due:
            return dev.energy
        n = self._nvml
        value = self._call(dev, "energy", n.nvmlDeviceGetTotalEnergyConsumption, dev.handle)
        if value is _NA:
            dev.energy = None
            return None
        dev.energy = value / 1000.0
        dev.energy_reads += 1
        dev.energy_due = now + self._due(dev, self._energy_interval, dev.energy_reads)
        return dev.energy

    # ----- grouped readings ------------------------------------------------------------------

    def _reasons(self, dev: _Device) -> frozenset[str] | None:
        n, h = self._nvml, dev.handle
        mask = self._call(dev, "clock_events", n.nvmlDeviceGetCurrentClocksEventReasons, h)
        if mask is _NA and "clock_events" in dev.unsupported:
            mask = self._call(dev, "clock_throttle", n.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        if mask is _NA:
            return None
        return frozenset(name for bit, name in self._reason_bits if mask & bit)

    def _violations(
        self, dev: _Device, fields: Mapping[tuple[int, int], float]
    ) -> Mapping[str, int] | None:
        """Throttled time per policy, nanoseconds since driver load: the batch's
        NVML_FI_DEV_PERF_POLICY_* values, else `nvmlDeviceGetViolationStatus` (its
        violationTime, the call DCGM's *_VIOLATION fields come from: 0.9 ms each on an H100).
        A policy NVML does not support is remembered and left out; none supported gives None."""
        n, h, f = self._nvml, dev.handle, self._codes.fields
        out: dict[str, int] = {}
        for name, (field_name, policy) in _VIOLATION_POLICIES.items():
            if not self._dead(dev, field_name):
                value = fields.get((f[field_name], 0))
                if value is not None:
                    out[name] = int(value)
                continue
            status = self._call(dev, f"violation_{name}", n.nvmlDeviceGetViolationStatus, h, policy)
            if status is not _NA:
                out[name] = int(status.violationTime)
        return out or None

    def _ecc(self, dev: _Device, fields: Mapping[tuple[int, int], float]) -> EccCounts:
        """ECC totals: the batch's NVML_FI_DEV_ECC_{SBE,DBE}_{VOL,AGG}_TOTAL (nvml.h: single
        bit = corrected, double bit = uncorrected), else `nvmlDeviceGetTotalEccErrors`."""
        n, h, f = self._nvml, dev.handle, self._codes.fields
        counts: dict[str, int | None] = {}
        for attr, (field_name, err, counter) in _ECC_FIELDS.items():
            if not self._dead(dev, field_name):
                counts[attr] = _int(fields.get((f[field_name], 0)))
                continue
            value = self._call(
                dev,
                f"ecc_{attr}",
                n.nvmlDeviceGetTotalEccErrors,
                h,
                getattr(n, f"NVML_MEMORY_ERROR_TYPE_{err}"),
                getattr(n, f"NVML_{counter}_ECC"),
            )
            counts[attr] = None if value is _NA else int(value)
        return EccCounts(**counts)

    def _remapped_rows(
        self, dev: _Device, fields: Mapping[tuple[int, int], float]
    ) -> RemappedRows | None:
        """The batch's NVML_FI_DEV_REMAPPED_* (all four, or none), else
        `nvmlDeviceGetRemappedRows`."""
        if not any(self._dead(dev, name) for name in _REMAP_FIELDS):
            f = self._codes.fields
            values = [fields[key] for name in _REMAP_FIELDS if (key := (f[name], 0)) in fields]
            if len(values) != len(_REMAP_FIELDS):
                return None
            corrected, uncorrected, pending, failure = values
        else:
            rows = self._call(
                dev, "remapped_rows", self._nvml.nvmlDeviceGetRemappedRows, dev.handle
            )
            if rows is _NA:
                return None
            corrected, uncorrected, pending, failure = rows
        return RemappedRows(int(corrected), int(uncorrected), bool(pending), bool(failure))

    def _retired_pages(
        self, dev: _Device, fields: Mapping[tuple[int, int], float]
    ) -> RetiredPages | None:
        """The batch's NVML_FI_DEV_RETIRED_SBE/DBE/PENDING (counts, as the calls' lists are
        counted), else the calls. NOT_SUPPORTED from A100 on, where rows are remapped."""
        if not any(self._dead(dev, name) for name in _RETIRED_FIELDS):
            f = self._codes.fields
            values = [fields[key] for name in _RETIRED_FIELDS if (key := (f[name], 0)) in fields]
            if len(values) != len(_RETIRED_FIELDS):
                return None
            sbe_count, dbe_count, pending_flag = values
            return RetiredPages(int(sbe_count), int(dbe_count), bool(pending_flag))
        n, h = self._nvml, dev.handle
        if "retired_pages" in dev.unsupported:
            return None
        sbe = self._call(
            dev,
            "retired_pages",
            n.nvmlDeviceGetRetiredPages,
            h,
            n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        )
        if sbe is _NA:
            return None
        dbe = self._call(
            dev,
            "retired_pages",
            n.nvmlDeviceGetRetiredPages,
            h,
            n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        )
        pending = self._call(
            dev, "retired_pages_pending", n.nvmlDeviceGetRetiredPagesPendingStatus, h
        )
        if dbe is _NA or pending is _NA:
            return None
        return RetiredPages(len(sbe), len(dbe), bool(pending))

    def _processes(self, dev: _Device) -> tuple[GpuProcess, ...] | None:
        procs = self._call(
            dev, "processes", self._nvml.nvmlDeviceGetComputeRunningProcesses, dev.handle
        )
        if procs is _NA:
            return None
        return tuple(
            GpuProcess(
                pid=int(p.pid),
                used_memory_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory),
            )
            for p in procs
        )

    def _fabric(self, dev: _Device) -> FabricInfo | None:
        """Fabric registration (GB200 NVL): the versioned call where the driver has it."""
        n, h = self._nvml, dev.handle
        if "fabric" in dev.unsupported:
            return None
        if hasattr(n, "nvmlDeviceGetGpuFabricInfoV") and "fabric_v" not in dev.unsupported:
            info = n.c_nvmlGpuFabricInfoV_t()
            if (
                self._call(dev, "fabric_v", n.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(info))
                is not _NA
            ):
                return self._fabric_info(info)
            if "fabric_v" not in dev.unsupported:
                return None
        info = n.c_nvmlGpuFabricInfo_t()
        if self._call(dev, "fabric", n.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(info)) is _NA:
            return None
        return self._fabric_info(info)

    def _fabric_info(self, info: Any) -> FabricInfo:
        state = _FABRIC_STATES.get(int(info.state), "not_supported")
        if state != "completed":
            return FabricInfo(state=state, healthy=None)
        raw = bytes(info.clusterUuid)
        status = int(info.status)
        mask = getattr(info, "healthMask", None)  # nvmlGpuFabricInfo_v2 and later
        return FabricInfo(
            state=state,
            healthy=status == self._codes.success,
            clique_id=int(info.cliqueId),
            # all zero on a single-node NVSwitch fabric (HGX Hopper): no multi-node cluster
            cluster_uuid=str(uuidlib.UUID(bytes=raw)) if any(raw) else None,
            status="NVML_SUCCESS"
            if status == self._codes.success
            else self._codes.names.get(status, f"NVML_ERROR_CODE_{status}"),
            health_mask=None if mask is None else int(mask),
        )

    def _profiling(self, dev: _Device) -> Mapping[str, float] | None:
        """GPM metrics over a window between two samples (`nvmlGpmMetricsGet` costs ~1.9 ms a
        GPU on an H100): the first window is one poll long, so ratios show from the second
        poll, then one every `gpm_interval` s; in between, the last window's ratios. A sample
        that fails starts over (nothing served until a window completes)."""
        gpm = self._gpm(dev)
        if gpm is None:
            return None
        now = self._clock()
        if now < gpm.due:
            return gpm.last
        n = self._nvml
        previous, current = gpm.samples
        if self._call(dev, "gpm_sample", n.nvmlGpmSampleGet, dev.handle, current) is _NA:
            gpm.primed, gpm.last = False, None
            return None
        result: dict[str, float] | None = None
        if gpm.primed:
            gpm.request.sample1 = previous
            gpm.request.sample2 = current
            if self._call(dev, "gpm_metrics", n.nvmlGpmMetricsGet, gpm.request) is not _NA:
                result = {}
                for i, key in enumerate(PROFILING_KEYS):
                    metric = gpm.request.metrics[i]
                    if metric.nvmlReturn == self._codes.success:
                        result[key] = _ratio(metric.value)
            gpm.windows += 1
            gpm.due = now + self._due(dev, self._gpm_interval, gpm.windows)
        gpm.samples.reverse()
        gpm.primed = True
        gpm.last = result or None
        return gpm.last

    def _gpm(self, dev: _Device) -> _Gpm | None:
        if dev.gpm is not None or "gpm" in dev.unsupported:
            return dev.gpm
        n = self._nvml
        support = self._call(dev, "gpm", n.nvmlGpmQueryDeviceSupport, dev.handle)
        if support is _NA:
            return None
        if not support.isSupportedDevice:
            dev.unsupported.add("gpm")
            return None
        try:
            samples = [n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()]
        except self._error_types as e:
            dev.unsupported.add("gpm")
            log.warning("GPU %d: cannot allocate GPM samples: %s", dev.index, e)
            return None
        request = n.c_nvmlGpmMetricsGet_t()
        request.version = n.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self._gpm_ids)
        for i, metric_id in enumerate(self._gpm_ids):
            request.metrics[i].metricId = metric_id
        dev.gpm = _Gpm(samples=samples, request=request)
        return dev.gpm

    def _nvlinks(
        self, dev: _Device, fields: Mapping[tuple[int, int], float]
    ) -> tuple[NvLinkReading, ...]:
        n, h, f = self._nvml, dev.handle, self._codes.fields
        readings = []
        enabled = int(n.NVML_FEATURE_ENABLED)
        for link in dev.links or ():
            if not self._dead(dev, "NVLINK_GET_STATE", link):  # Hopper on, as NCCL reads it
                state = fields.get((f["NVLINK_GET_STATE"], link))
                up = None if state is None else int(state) == enabled
            else:
                state = self._call(dev, f"nvlink_state_{link}", n.nvmlDeviceGetNvLinkState, h, link)
                up = None if state is _NA else int(state) == enabled
            remote_bus, remote_type = self._remote(dev, link, up)
            crc_data = (
                _NA
                if not up
                else self._call(
                    dev,
                    "nvlink_crc_data",
                    n.nvmlDeviceGetNvLinkErrorCounter,
                    h,
                    link,
                    n.NVML_NVLINK_ERROR_DL_CRC_DATA,
                )
            )
            tx, rx = (
                fields.get((f["NVLINK_THROUGHPUT_DATA_TX"], link)),
                fields.get((f["NVLINK_THROUGHPUT_DATA_RX"], link)),
            )
            readings.append(
                NvLinkReading(
                    link=link,
                    up=up,
                    tx_bytes=None if tx is None else int(tx) * KIB,
                    rx_bytes=None if rx is None else int(rx) * KIB,
                    crc_flit_errors=_int(fields.get((f["NVLINK_ERROR_DL_CRC"], link))),
                    crc_data_errors=None if crc_data is _NA else int(crc_data),
                    replay_errors=_int(fields.get((f["NVLINK_ERROR_DL_REPLAY"], link))),
                    recovery_errors=_int(fields.get((f["NVLINK_ERROR_DL_RECOVERY"], link))),
                    **{
                        attr: _int(fields.get((f[name], link)))
                        for attr, name in _NVLINK5_FIELDS.items()
                    },
                    remote_pci_bus_id=remote_bus,
                    remote_device_type=remote_type,
                )
            )
        return tuple(readings)

    def _remote(self, dev: _Device, link: int, up: bool | None) -> tuple[str | None, str | None]:
        """What a link connects to: static, so asked once per enumeration (once it is up)."""
        cached = dev.remote.get(link)
        if cached is not None or not up:
            return cached or (None, None)
        n, h = self._nvml, dev.handle
        pci = self._call(dev, "nvlink_remote_pci", n.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
        kind = self._call(dev, "nvlink_remote_type", n.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
        result = (
            None if pci is _NA else _text(pci.busId),
            None if kind is _NA else _REMOTE_TYPES.get(int(kind), "unknown"),
        )
        if pci is not _NA or "nvlink_remote_pci" in dev.unsupported:
            dev.remote[link] = result
        return result

    # ----- XID events ------------------------------------------------------------------------

    def _xid_loop(self) -> None:
        """Wait on one NVML event set for XIDs; register GPUs as they are enumerated."""
        event_set: Any = None
        registered: set[int] = set()
        generation = -1
        while not self._stop.is_set():
            if not self._ready.wait(timeout=EVENT_WAIT_MS / 1000) or self._stop.is_set():
                continue
            if event_set is None:
                event_set = self._create_event_set()
                registered, generation = set(), -1
                if event_set is None:
                    self._stop.wait(INIT_RETRY_SECONDS)
                    continue
            with self._lock:
                devices, current = list(self._devices), self._generation
            if current != generation:
                self._register(event_set, devices, registered)
                generation = current
            if not self._wait_event(event_set):
                self._free_event_set(event_set)
                event_set = None
                self._stop.wait(1.0)
        self._free_event_set(event_set)

    def _create_event_set(self) -> Any:
        try:
            return self._nvml.nvmlEventSetCreate()
        except self._error_types as e:
            self._set_xid_error(f"cannot create NVML event set, XIDs will not be reported: {e}")
            return None

    def _register(self, event_set: Any, devices: list[_Device], registered: set[int]) -> None:
        """Register each GPU not yet in the set, once per enumeration."""
        n = self._nvml
        failed = []
        for dev in devices:
            if dev.handle is None or dev.key in registered:
                continue
            try:
                n.nvmlDeviceRegisterEvents(dev.handle, n.nvmlEventTypeXidCriticalError, event_set)
                registered.add(dev.key)
            except self._error_types as e:
                failed.append(f"GPU {dev.index}: {e}")
        self._set_xid_error(
            f"XID events not registered for {', '.join(failed)}" if failed else None
        )

    def _set_xid_error(self, reason: str | None) -> None:
        if reason != self._xid_error:
            if reason is not None:
                log.warning("%s", reason)
            else:
                log.info("XID events registered for all GPUs")
        self._xid_error = reason

    def _free_event_set(self, event_set: Any) -> None:
        if event_set is None:
            return
        try:
            self._nvml.nvmlEventSetFree(event_set)
        except self._error_types as e:
            log.debug("nvmlEventSetFree failed: %s", e)

    def _wait_event(self, event_set: Any) -> bool:
        """Wait once for an event and queue it. False when the event set stopped working."""
        try:
            data = self._nvml.nvmlEventSetWait_v2(event_set, EVENT_WAIT_MS)
        except self._error_types as e:
            if getattr(e, "value", None) == self._codes.timeout:
                self._wait_error = None
                return True
            if not self._stop.is_set() and str(e) != self._wait_error:
                log.warning("waiting for NVML events failed (%s); recreating the event set", e)
            self._wait_error = str(e)
            return False
        self._wait_error = None
        if int(data.eventType) & int(self._nvml.nvmlEventTypeXidCriticalError):
            with self._lock:
                dev = self._by_key.get(_handle_key(data.device))
            self._xids.put(
                XidEvent(
                    gpu_index=-1 if dev is None else dev.index,
                    uuid="" if dev is None else dev.uuid,
                    xid=int(data.eventData),
                    timestamp=self._wall_clock(),
                )
            )
        return True


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)
