"""A simulated NVML library with pynvml's interface, generated from one `HardwareProfile`.

`SimulatedNvml(profile)` stands in for the `pynvml` module for the functions the production GPU
source (`exporter.sources.nvml`) calls: same names, same arguments, same return types, built
from pynvml's own ctypes structs, and errors raised as `pynvml.NVMLError(code)` so that
`except pynvml.NVMLError_GPUIsLost` works. Every other `NVML_*` name falls through to pynvml.

Values follow simulated time (the injected clock): each GPU runs a seeded, training-like
square wave of activity (compute steps at ~97 %, communication gaps at ~30 %), so power,
energy, temperatures, NVLink and PCIe byte counters all move consistently and deterministically.
Counters are "since driver load", which the simulation places three days before its start.

Where the real driver differs by architecture, the simulation follows it: page retirement is
NOT_SUPPORTED (A100 and later remap rows instead), and on Blackwell the per-link NVLink DL error
fields (161-163) are NOT_SUPPORTED, as NVML 565+ removed them there.

Faults (exporter.sim.faults) act as the hardware would show them through NVML; `inject` and
`clear` change them at run time. They fail the way the real library does, with the same
`NVMLError` codes: `nvml-library-missing` and `nvml-no-permission` make `nvmlInit` raise
LIBRARY_NOT_FOUND (what pynvml raises when libnvidia-ml.so.1 cannot be loaded) and NO_PERMISSION
(nvml.h: "if NVML does not have permission to talk to the driver"); a library already loaded and
device files already open stay usable, so injected at run time they bite at the next init.
`gpu-lost`, `gpu-reset-required` and `nvml-timeout` fail every call on their GPU with
GPU_IS_LOST, RESET_REQUIRED and TIMEOUT (field-value batches per slot, as the driver does).
`driver-unloaded` and `driver-upgraded` fail every call at once, and `nvmlInit` after it, with
DRIVER_NOT_LOADED and LIB_RM_VERSION_MISMATCH: the driver went away under the loaded library.
The GPU recovery action (field 230) follows `recovery=`, `xid=95` and `uvm-fatal`, each
announced by an XID 154 through the event set, as the driver does (`recovery_action`).
`nvml-hang` makes every call on its GPU (from `nvmlDeviceGetHandleByIndex` on) block until the
fault is cleared, as a call into a wedged driver never returns; the event set keeps delivering.

GPUs are enumerated as the driver probed them (`nvmlDeviceGetCount`, `nvmlDeviceGetHandleByIndex`):
`gpu-gone` (a GPU fallen off the bus that did not come back) present at the start is a node that
booted without that GPU, so NVML counts one GPU fewer and gives the GPUs after it consecutive
indices, one lower than their slot, each keeping its UUID and PCI bus id ("The order in which
NVML enumerates devices has no guarantees of consistency between reboots. For that reason it is
recommended that devices be looked up by their PCI ids or UUID", nvml.h,
nvmlDeviceGetHandleByIndex). Injected at run time it fails every call GPU_IS_LOST, as
`gpu-lost` does, and the enumeration stays as it was until the driver probes again: when
`driver-unloaded` or `driver-upgraded` clears (the driver loaded anew). A fault's `gpuN` names
the physical GPU, the profile's slot N, whatever index NVML gives it; so do `uuid_of`,
`gpu_calls` and `cost_ms`.

`calls` counts every simulated function by name, `field_requests` every requested field id, and
`gpu_calls` every call made on one GPU, by (GPU index, function), so tests and benchmarks can
assert and print what the source asked for. `cost_ms` adds up, per GPU, what those calls would
have cost in CPU on a real H100 (`H100_CALL_COST_MS`, measured with driver 580.159.04): the
simulation's own cost says nothing about the real library's, where four functions are 95 % of it.
"""

from __future__ import annotations

import ctypes
import hashlib
import inspect
import math
import random
import threading
import time
import uuid as uuidlib
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pynvml

from exporter.sim.faults import Fault
from exporter.sim.hardware.profiles import HardwareProfile, simulated_processes

MIB = 1024**2
UPTIME_AT_START_S = 3 * 86400.0  # counters run from a driver load three days before sim start
NO_INSTANCE = 0xFFFFFFFF

# Field ids served, and the value type each is returned as.
_ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_UINT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
# NVLink5's per-link counters (NVML_FI_DEV_NVLINK_COUNT_*), served on Blackwell only, with the
# rate each rises at under `nvlink-crc` (a bad link: received packets in error, the local error
# threshold crossed now and then, and the recoveries that follow, all succeeding).
_NVLINK5_ERROR_RATES = {
    pynvml.NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS: 0.0,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS: 0.0,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS: 3000.0,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_REMOTE_ERRORS: 0.0,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_GENERAL_ERRORS: 0.0,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS: 0.2,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_DISCARDS: 0.0,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS: 0.2,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS: 0.0,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS: 0.2,
}
_NVLINK5_PACKET_FIELDS = {  # field -> direction share, as the throughput fields
    pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_PACKETS: 1.0,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_PACKETS: 0.97,
}
_NVLINK5_FIELDS = frozenset(_NVLINK5_ERROR_RATES) | frozenset(_NVLINK5_PACKET_FIELDS)
_NVLINK5_PACKET_BYTES = 256  # average NVLink5 packet payload the simulation assumes
_LINK_FIELDS = (
    frozenset(
        {
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
        }
    )
    | _NVLINK5_FIELDS
    | {pynvml.NVML_FI_DEV_NVLINK_GET_STATE}
)
_DL_ERROR_FIELDS = frozenset(
    {
        pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
        pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
        pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
    }
)

# CPU per call on a real H100 (driver 580.159.04, the node agent at 5 s; issue 28): the four
# functions that made 12.4 of the 13 ms a GPU cost per poll. A field-values batch costs about the
# same whatever it holds (six violation fields together 0.68 ms, against 0.9 ms for each as its own
# call), except total energy, which costs ~4.2 ms however it is read (field 83 or its own call).
H100_CALL_COST_MS = {
    "nvmlDeviceGetViolationStatus": 0.9,
    "nvmlDeviceGetTotalEnergyConsumption": 4.4,
    "nvmlGpmMetricsGet": 1.9,
    "nvmlDeviceGetFieldValues": 0.7,
}
H100_FIELD_COST_MS = {pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: 4.2}
# Everything else was < 0.1 ms in all (power 0.003 ms): 0.6 ms left over ~55 calls a poll.
H100_OTHER_CALL_MS = 0.01

XID_RECOVERY_ACTION_CHANGED = 154  # the driver logs it whenever a GPU's recovery action changes
# XIDs after which the driver marks the GPU for a reset, and so the recovery action it sets:
# 95, an uncontained ECC error ("Uncontained: ... RST: Yes", kern_gpu_error_cont_ga100.c).
_XID_RECOVERY = {95: int(pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET)}
_RECOVERY_PRECEDENCE = tuple(
    int(getattr(pynvml, f"NVML_GPU_RECOVERY_ACTION_{name}"))
    for name in ("NODE_REBOOT", "GPU_RESET", "DRAIN_AND_RESET", "DRAIN_P2P", "RECOVER_IMEX_DOMAIN")
)

# The throttled-time counters as field values (nvml.h NVML_FI_DEV_PERF_POLICY_*, nanoseconds,
# what nvmlDeviceGetViolationStatus returns as violationTime), by nvmlPerfPolicyType_t.
_PERF_POLICY_FIELDS = {
    pynvml.NVML_FI_DEV_PERF_POLICY_POWER: pynvml.NVML_PERF_POLICY_POWER,
    pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: pynvml.NVML_PERF_POLICY_THERMAL,
    pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: pynvml.NVML_PERF_POLICY_SYNC_BOOST,
    pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT: pynvml.NVML_PERF_POLICY_BOARD_LIMIT,
    pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION: pynvml.NVML_PERF_POLICY_LOW_UTILIZATION,
    pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY: pynvml.NVML_PERF_POLICY_RELIABILITY,
}
# ECC totals as field values (nvml.h: SBE = corrected, DBE = uncorrected), what
# nvmlDeviceGetTotalEccErrors returns: (error type, counter type) by field id.
_ECC_FIELDS = {
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (
        pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
        pynvml.NVML_VOLATILE_ECC,
    ),
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        pynvml.NVML_VOLATILE_ECC,
    ),
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (
        pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
        pynvml.NVML_AGGREGATE_ECC,
    ),
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        pynvml.NVML_AGGREGATE_ECC,
    ),
}
# nvmlDeviceGetRemappedRows' four values as field values, in its order.
_REMAP_FIELDS = (
    pynvml.NVML_FI_DEV_REMAPPED_COR,
    pynvml.NVML_FI_DEV_REMAPPED_UNC,
    pynvml.NVML_FI_DEV_REMAPPED_PENDING,
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
)
# Page retirement as field values: NOT_SUPPORTED from A100 on, as the calls are.
_RETIRED_FIELDS = frozenset(
    {
        pynvml.NVML_FI_DEV_RETIRED_SBE,
        pynvml.NVML_FI_DEV_RETIRED_DBE,
        pynvml.NVML_FI_DEV_RETIRED_PENDING,
    }
)

# pynvml's c_nvmlFieldValue_t with the same layout minus its Python-level attribute hooks:
# filling ~100 values per GPU through those hooks costs more than everything else together.
_PlainFieldValue: Any = type(
    "_PlainFieldValue", (ctypes.Structure,), {"_fields_": pynvml.c_nvmlFieldValue_t._fields_}
)

# GPM metric id -> share of the GPU's activity it reports (percent of its maximum).
_GPM_SHARES = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 1.0,
    pynvml.NVML_GPM_METRIC_SM_UTIL: 0.97,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 0.42,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.68,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 0.55,
    pynvml.NVML_GPM_METRIC_FP64_UTIL: 0.01,
    pynvml.NVML_GPM_METRIC_FP32_UTIL: 0.14,
    pynvml.NVML_GPM_METRIC_FP16_UTIL: 0.06,
}

# Functions the real driver answers NOT_SUPPORTED on every simulated GPU (Ampere and later).
_ALWAYS_UNSUPPORTED = frozenset(
    {"nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus"}
)


def simulated_gpu_uuid(profile: HardwareProfile, index: int, seed: int = 0) -> str:
    """A stable, NVML-shaped UUID for a simulated GPU (the pod-resources sim must agree)."""
    digest = hashlib.sha256(f"{profile.instance_type}:{seed}:{index}".encode()).digest()
    return f"GPU-{uuidlib.UUID(bytes=digest[:16])}"


def _error(code: int) -> Exception:
    return pynvml.NVMLError(code)  # type: ignore[no-any-return]


def _fake_pointer(ptr_type: Any, address: int) -> Any:
    """An opaque ctypes handle of pynvml's own type: never dereferenced, only compared."""
    return ctypes.cast(ctypes.c_void_p(address), ptr_type)


def _address(pointer: Any) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


def _target(arg: Any) -> Any:
    """The struct behind a `ctypes.byref(...)` argument (pynvml passes both forms)."""
    return getattr(arg, "_obj", arg)


@dataclass(frozen=True, slots=True)
class _Wave:
    """Activity in [0, 1]: a square wave of training steps, with a closed-form integral."""

    period: float
    duty: float
    high: float
    low: float
    phase: float

    def _cumulative(self, u: float) -> float:
        n = math.floor(u / self.period)
        r = u - n * self.period
        on = self.duty * self.period
        per_period = self.period * (self.duty * self.high + (1.0 - self.duty) * self.low)
        return n * per_period + self.high * min(r, on) + self.low * max(0.0, r - on)

    def integral(self, t: float) -> float:
        return self._cumulative(t + self.phase) - self._cumulative(self.phase)

    def mean(self, t0: float, t1: float) -> float:
        if t1 - t0 < 1e-9:
            t0 = t1 - 1e-3
        return (self.integral(t1) - self.integral(t0)) / (t1 - t0)


@dataclass(slots=True)
class _SimGpu:
    index: int
    pci_bus_id: str
    uuid: str
    handle: Any
    wave: _Wave
    link_share: tuple[float, ...]
    temp_offset: float
    ecc_interval: float
    ecc_offset: float
    ecc_aggregate_base: int
    remap_corrected: int
    pcie_replay_base: int


class SimulatedNvml:
    """A drop-in for the `pynvml` module, simulating one node of `profile`."""

    def __init__(
        self,
        profile: HardwareProfile,
        faults: Sequence[Fault] = (),
        seed: int = 0,
        clock: Callable[[], float] | None = None,
        *,
        init_error: int | None = None,
        event_set_error: int | None = None,
        unsupported: Iterable[str] = (),
        unsupported_fields: Iterable[int] = (),
        timeouts: Iterable[int] = (),
    ) -> None:
        self.profile = profile
        self.seed = seed
        self.init_error = init_error  # NVML error code nvmlInit raises while set
        self.event_set_error = event_set_error  # NVML error code nvmlEventSetCreate raises
        self.timeout_gpus: set[int] = set(timeouts)  # GPUs whose every call times out
        self.calls: Counter[str] = Counter()
        self.field_requests: Counter[int] = Counter()
        self.gpu_calls: Counter[tuple[int, str]] = Counter()  # (GPU index, function) -> calls
        self.cost_ms: dict[int, float] = {}  # GPU index -> modelled H100 CPU ms
        self.hung_calls = 0  # calls that blocked on an `nvml-hang` GPU (some may still be)
        self._clock = clock or time.monotonic
        self._t0 = self._clock()
        self._lock = threading.Lock()
        self._events = threading.Condition(self._lock)
        self._initialized = 0
        self._blackwell = "GB200" in profile.gpu_model or "B200" in profile.gpu_model
        self._unsupported = _ALWAYS_UNSUPPORTED | frozenset(unsupported)
        default_fields = _DL_ERROR_FIELDS if self._blackwell else _NVLINK5_FIELDS
        self._unsupported_fields = default_fields | frozenset(unsupported_fields)
        self._gpus = self._build_gpus(profile, seed)  # every physical GPU, by its slot
        self._by_id = {id(g.handle): g for g in self._gpus}
        self._by_address = {_address(g.handle): g for g in self._gpus}
        gone = {f.gpu for f in faults if f.kind == "gpu-gone"}
        self._enumerated = tuple(g for g in self._gpus if g.index not in gone)  # NVML's order
        self._processes = simulated_processes(profile)
        self._next_address = 0x7A000000
        self._samples: dict[int, tuple[int, float]] = {}  # GPM sample -> (gpu, time)
        self._event_sets: dict[int, set[int]] = {}  # event set -> registered GPUs
        self._pending_xids: deque[tuple[int, int]] = deque()  # (gpu, xid)
        self._faults: dict[Fault, float] = {}  # active fault -> simulated time it began
        self._xid_recovery: dict[int, int] = {}  # GPU -> recovery action an XID marked it with
        self._thermal_banked: dict[int, float] = {}  # GPU -> throttled seconds of cleared faults
        for fault in faults:
            self.inject(fault)

    # ----- simulation control ------------------------------------------------------------------

    def uuid_of(self, index: int) -> str:
        """The UUID of the physical GPU in the profile's slot `index` (not NVML's index)."""
        return self._gpus[index].uuid

    def nvml_index_of(self, index: int) -> int | None:
        """The index NVML enumerates the physical GPU `index` at; None while it is not
        enumerated (gone from the bus since the driver last probed it)."""
        for position, gpu in enumerate(self._enumerated):
            if gpu.index == index:
                return position
        return None

    def probe(self) -> None:
        """The driver probes the PCI bus again (it was loaded anew): GPUs gone from the bus
        are no longer enumerated, the others take consecutive indices."""
        with self._lock:
            self._enumerated = tuple(g for g in self._gpus if not self._has("gpu-gone", g.index))

    def inject(self, fault: Fault) -> None:
        """Start a fault now. An XID is queued for one delivery; others last until cleared."""
        with self._events:
            if fault.kind == "xid":
                if fault.gpu is not None and fault.xid is not None:
                    self._pending_xids.append((fault.gpu, fault.xid))
                    reset = _XID_RECOVERY.get(fault.xid)
                    if reset is not None and self._xid_recovery.get(fault.gpu) != reset:
                        self._xid_recovery[fault.gpu] = reset  # the driver marks it, logs 154
                        self._pending_xids.append((fault.gpu, XID_RECOVERY_ACTION_CHANGED))
                    self._events.notify_all()
                return
            if fault not in self._faults:  # copy on write: readers iterate without the lock
                self._faults = {**self._faults, fault: self._now()}
                if fault.kind in ("recovery", "uvm-fatal"):  # a new action: XID 154 says so
                    gpus = [g.index for g in self._enumerated] if fault.gpu is None else [fault.gpu]
                    self._pending_xids.extend((g, XID_RECOVERY_ACTION_CHANGED) for g in gpus)
                    self._events.notify_all()

    def clear(self, fault: Fault) -> None:
        with self._events:
            if fault.kind == "xid":
                kept = [(g, x) for g, x in self._pending_xids if (g, x) != (fault.gpu, fault.xid)]
                self._pending_xids = deque(kept)
                return
            began = self._faults.get(fault)
            if fault.kind == "thermal" and fault.gpu is not None and began is not None:
                banked = self._thermal_banked.get(fault.gpu, 0.0)
                self._thermal_banked[fault.gpu] = banked + self._now() - began
            self._faults = {f: t for f, t in self._faults.items() if f != fault}
            self._events.notify_all()  # a call hung on this fault returns
        if fault.kind in ("driver-unloaded", "driver-upgraded"):
            self.probe()  # the driver is loaded again: it probes the bus afresh

    def __getattr__(self, name: str) -> Any:
        """NVML_* constants, structs and error classes come from pynvml itself."""
        value = getattr(pynvml, name)
        if inspect.isfunction(value):
            raise AttributeError(f"SimulatedNvml does not simulate {name}()")
        return value

    # ----- internals -----------------------------------------------------------------------------

    def _build_gpus(self, profile: HardwareProfile, seed: int) -> tuple[_SimGpu, ...]:
        rng = random.Random(f"{profile.instance_type}:{seed}")
        period = rng.uniform(1.4, 2.2)  # one data-parallel job: every GPU steps together
        phase = rng.uniform(0.0, period)
        gpus = []
        for spec in profile.gpus:
            wave = _Wave(period, 0.78, 0.97, 0.30, phase + rng.uniform(0.0, 0.05))
            gpus.append(
                _SimGpu(
                    index=spec.index,
                    pci_bus_id=spec.pci_bus_id,
                    uuid=simulated_gpu_uuid(profile, spec.index, seed),
                    handle=_fake_pointer(pynvml.c_nvmlDevice_t, 0x51000000 + 0x1000 * spec.index),
                    wave=wave,
                    link_share=tuple(rng.uniform(0.9, 1.0) for _ in range(profile.nvlinks_per_gpu)),
                    temp_offset=rng.uniform(0.0, 4.0),
                    ecc_interval=rng.choice((1800.0, 3600.0, 7200.0, 86400.0)),
                    ecc_offset=rng.uniform(0.0, 1800.0),
                    ecc_aggregate_base=rng.randint(0, 40),
                    remap_corrected=rng.choice((0, 0, 0, 1, 2)),
                    pcie_replay_base=rng.randint(0, 3),
                )
            )
        return tuple(gpus)

    def _now(self) -> float:
        """Seconds since the simulated driver load."""
        return UPTIME_AT_START_S + (self._clock() - self._t0)

    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] += 1
        if not self._initialized:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        if self._faults and name != "nvmlShutdown":
            gone = self._driver_code()
            if gone is not None:  # the driver went away under the library: every call fails
                raise _error(gone)

    def _charge(self, gpu: int, name: str) -> None:
        """A call made on one GPU: counted per GPU, with what it would cost on an H100."""
        with self._lock:
            self.gpu_calls[(gpu, name)] += 1
            cost = H100_CALL_COST_MS.get(name, H100_OTHER_CALL_MS)
            self.cost_ms[gpu] = self.cost_ms.get(gpu, 0.0) + cost

    def _hang(self, gpu: int) -> None:
        """Block, as a call into a wedged driver does, while `nvml-hang` holds this GPU."""
        if not self._has("nvml-hang", gpu):
            return
        with self._events:
            self.hung_calls += 1
            self._events.notify_all()
            while self._has("nvml-hang", gpu):
                self._events.wait()

    def _resolve(self, handle: Any) -> _SimGpu:
        gpu = self._by_id.get(id(handle))
        if gpu is None:
            try:
                gpu = self._by_address.get(_address(handle))
            except (TypeError, ctypes.ArgumentError):
                gpu = None
        if gpu is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    def _device(self, name: str, handle: Any) -> _SimGpu:
        """Count the call and find its GPU, failing it as a fault or the profile says."""
        self._count(name)
        gpu = self._resolve(handle)
        self._charge(gpu.index, name)
        if self._faults:
            self._hang(gpu.index)
        down = self._down_code(gpu.index)
        if down is not None:
            raise _error(down)
        if self._timing_out(gpu.index):
            raise _error(pynvml.NVML_ERROR_TIMEOUT)
        if name in self._unsupported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _since(self, kind: str, gpu: int, link: int | None = None) -> float | None:
        """When a fault of `kind` on that GPU (and link) began, or None if it is not active."""
        for fault, began in self._faults.items():
            if fault.kind == kind and fault.gpu == gpu and (link is None or fault.link == link):
                return began
        return None

    def _has(self, kind: str, gpu: int) -> bool:
        return bool(self._faults) and self._since(kind, gpu) is not None

    def _down_code(self, gpu: int) -> int | None:
        """The code every call on a lost GPU, or one needing a reset, fails with."""
        if self._has("gpu-lost", gpu) or self._has("gpu-gone", gpu):
            return int(pynvml.NVML_ERROR_GPU_IS_LOST)
        if self._has("gpu-reset-required", gpu):
            return int(pynvml.NVML_ERROR_RESET_REQUIRED)
        return None

    def _timing_out(self, gpu: int) -> bool:
        return gpu in self.timeout_gpus or self._has("nvml-timeout", gpu)

    def _init_fault_code(self) -> int | None:
        """The code nvmlInit fails with while a deployment fault is active."""
        for fault in self._faults:
            if fault.kind == "nvml-library-missing":
                return int(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
            if fault.kind == "nvml-no-permission":
                return int(pynvml.NVML_ERROR_NO_PERMISSION)
        return self._driver_code()

    def _driver_code(self) -> int | None:
        """What NVML answers while the driver is unloaded ("NVIDIA driver is not loaded") or
        replaced by another version ("RM detects a driver/library version mismatch")."""
        for fault in self._faults:
            if fault.kind == "driver-unloaded":
                return int(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
            if fault.kind == "driver-upgraded":
                return int(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
        return None

    def _activity(self, gpu: _SimGpu, now: float) -> float:
        """Mean activity over the last second, as NVML's sampled readings average it."""
        return gpu.wave.mean(now - 1.0, now)

    def _power_watts(self, gpu: _SimGpu, activity: float) -> float:
        idle = 0.1 * self.profile.gpu_power_limit_watts
        peak = 0.92 * self.profile.gpu_power_limit_watts
        return idle + (peak - idle) * activity

    def _temperature(self, gpu: _SimGpu, now: float) -> float:
        if self._has("thermal", gpu.index):
            return 92.0 + gpu.temp_offset / 4.0
        return 38.0 + 34.0 * self._activity(gpu, now) + gpu.temp_offset

    def _link_rate(self) -> float:
        """Bytes per second per link and direction at full activity."""
        return 45e9 if self._blackwell else 22e9

    def _switch_of(self, link: int) -> int:
        """NVSwitch chip a link lands on: 4 on the HGX baseboard, 18 in a GB200 NVL72 rack."""
        if self._blackwell:
            return link
        per_switch = (5, 4, 4, 5)
        total = 0
        for switch, count in enumerate(per_switch):
            total += count
            if link < total:
                return switch
        return len(per_switch) - 1

    # ----- init, system, enumeration -----------------------------------------------------------

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        with self._lock:
            self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise _error(self.init_error)
        code = self._init_fault_code() if self._faults else None
        if code is not None:
            raise _error(code)
        with self._lock:
            self._initialized += 1

    def nvmlShutdown(self) -> None:
        self._count("nvmlShutdown")
        with self._events:
            self._initialized -= 1
            self._events.notify_all()

    def nvmlSystemGetDriverVersion(self) -> str:
        self._count("nvmlSystemGetDriverVersion")
        return self.profile.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._count("nvmlDeviceGetCount")
        return len(self._enumerated)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._count("nvmlDeviceGetHandleByIndex")
        enumerated = self._enumerated
        if not 0 <= index < len(enumerated):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = enumerated[index]
        self._charge(gpu.index, "nvmlDeviceGetHandleByIndex")
        if self._faults:
            self._hang(gpu.index)
        return gpu.handle

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._device("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._device("nvmlDeviceGetName", handle)
        return self.profile.gpu_model

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._device("nvmlDeviceGetPciInfo", handle)
        return self._pci_info(gpu.pci_bus_id)

    @staticmethod
    def _pci_info(bus_id: str) -> Any:
        domain, bus, rest = bus_id.split(":")
        device = rest.split(".")[0]
        return pynvml.nvmlPciInfo_t(
            busIdLegacy=bus_id[-12:].encode(),
            domain=int(domain, 16),
            bus=int(bus, 16),
            device=int(device, 16),
            pciDeviceId=0x233010DE,
            busId=bus_id.encode(),
        )

    # ----- per-GPU readings ----------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._device("nvmlDeviceGetUtilizationRates", handle)
        now = self._now()
        activity = self._activity(gpu, now)
        jitter = math.sin(now * 12.9898 + gpu.index * 78.233)  # deterministic, in [-1, 1]
        util = min(100, max(0, round(100 * activity + 1.5 * jitter)))
        return pynvml.c_nvmlUtilization_t(gpu=util, memory=round(util * 0.6))

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu = self._device("nvmlDeviceGetMemoryInfo", handle)
        total = self.profile.gpu_memory_bytes
        used = 600 * MIB + sum(
            p.used_memory_bytes for p in self._processes if p.gpu_index == gpu.index
        )
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetPowerUsage", handle)
        return round(1000 * self._power_watts(gpu, self._activity(gpu, self._now())))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetTotalEnergyConsumption", handle)
        return self._energy_mj(gpu, self._now())

    def _energy_mj(self, gpu: _SimGpu, now: float) -> int:
        idle = self._power_watts(gpu, 0.0)
        span = self._power_watts(gpu, 1.0) - idle
        return int(1000 * (idle * now + span * gpu.wave.integral(now)))

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._device("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return round(self._temperature(gpu, self._now()))

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._device("nvmlDeviceGetClockInfo", handle)
        if type == pynvml.NVML_CLOCK_MEM:
            return self.profile.gpu_max_mem_clock_mhz
        sm = self.profile.gpu_max_sm_clock_mhz
        return round(sm * 0.55) if self._has("thermal", gpu.index) else sm

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if self._has("thermal", gpu.index):
            return int(
                pynvml.nvmlClocksEventReasonHwThermalSlowdown
                | pynvml.nvmlClocksEventReasonSwThermalSlowdown
            )
        return int(pynvml.nvmlClocksEventReasonNone)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self.nvmlDeviceGetCurrentClocksEventReasons(handle)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetCurrPcieLinkGeneration", handle)
        return 3 if self._has("pcie-degraded", gpu.index) else self.profile.pcie_gen_max

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        self._device("nvmlDeviceGetMaxPcieLinkGeneration", handle)
        return self.profile.pcie_gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetCurrPcieLinkWidth", handle)
        return 8 if self._has("pcie-degraded", gpu.index) else self.profile.pcie_width_max

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        self._device("nvmlDeviceGetMaxPcieLinkWidth", handle)
        return self.profile.pcie_width_max

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        """Present (and counted) so tests can show the source never samples it."""
        gpu = self._device("nvmlDeviceGetPcieThroughput", handle)
        rate = 3e9 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 5e9
        return round(rate * self._activity(gpu, self._now()) / 1024)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu = self._device("nvmlDeviceGetTotalEccErrors", handle)
        return self._ecc(gpu, errorType, counterType, self._now())

    def _ecc(self, gpu: _SimGpu, errorType: int, counterType: int, now: float) -> int:
        if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            volatile = int((now + gpu.ecc_offset) // gpu.ecc_interval)
            aggregate = volatile + gpu.ecc_aggregate_base
        elif errorType == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            began = self._since("ecc-dbe", gpu.index)
            volatile = 0 if began is None else 1 + int((now - began) // 15)
            aggregate = volatile
        else:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if counterType == pynvml.NVML_VOLATILE_ECC:
            return volatile
        if counterType == pynvml.NVML_AGGREGATE_ECC:
            return aggregate
        raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetViolationStatus(self, device: Any, perfPolicyType: int) -> Any:
        """Time clocks were held down by a policy, in ns since driver load (nvml.h's
        nvmlViolationTime_t). Under `thermal` the GPU is throttled all the time, so the thermal
        counter runs at 1 s/s; a fault cleared leaves what it added, as a counter does. The other
        policies stay 0 on these busy, uncapped GPUs."""
        gpu = self._device("nvmlDeviceGetViolationStatus", device)
        if not 0 <= perfPolicyType < pynvml.NVML_PERF_POLICY_COUNT:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.c_nvmlViolationTime_t(
            referenceTime=int(time.time() * 1e6),
            violationTime=self._violation_ns(gpu, perfPolicyType, self._now()),
        )

    def _violation_ns(self, gpu: _SimGpu, policy: int, now: float) -> int:
        throttled = 0.0
        if policy == pynvml.NVML_PERF_POLICY_THERMAL:
            throttled = self._thermal_banked.get(gpu.index, 0.0)
            began = self._since("thermal", gpu.index)
            if began is not None:
                throttled += now - began
        return int(throttled * 1e9)

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        return self._remapped(self._device("nvmlDeviceGetRemappedRows", device))

    def recovery_action(self, gpu: int) -> int:
        """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION of a GPU: an nvmlDeviceGpuRecoveryAction_t,
        NVML_GPU_RECOVERY_ACTION_NONE unless a fault says otherwise: `recovery=` sets it, an
        uncontained error (xid=95) marks the GPU for reset, `uvm-fatal` asks every GPU for a
        node reboot; where several apply the driver's order decides (gpu.c
        `gpuRefreshRecoveryAction`: reboot, reset, drain and reset, drain P2P, IMEX). A contained
        error (ecc-dbe, XID 94) leaves it at none."""
        wanted = set()
        if gpu in self._xid_recovery:
            wanted.add(self._xid_recovery[gpu])
        for fault in self._faults:
            if fault.kind == "uvm-fatal":
                wanted.add(int(pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT))
            elif fault.kind == "recovery" and fault.gpu == gpu and fault.recovery is not None:
                wanted.add(fault.recovery)
        return next((a for a in _RECOVERY_PRECEDENCE if a in wanted), min(wanted, default=0))

    def _remapped(self, gpu: _SimGpu) -> tuple[int, int, int, int]:
        dbe = self._has("ecc-dbe", gpu.index)
        failure = self._has("remap-failure", gpu.index)
        return (gpu.remap_corrected, 1 if dbe else 0, 1 if dbe else 0, 1 if failure else 0)

    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        self._device("nvmlDeviceGetRetiredPages", device)
        return []

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int:
        self._device("nvmlDeviceGetRetiredPagesPendingStatus", device)
        return int(pynvml.NVML_FEATURE_DISABLED)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._device("nvmlDeviceGetComputeRunningProcesses", handle)
        return [
            pynvml.nvmlStructToFriendlyObject(
                pynvml.c_nvmlProcessInfo_v3_t(
                    pid=p.pid,
                    usedGpuMemory=p.used_memory_bytes,
                    gpuInstanceId=NO_INSTANCE,
                    computeInstanceId=NO_INSTANCE,
                )
            )
            for p in self._processes
            if p.gpu_index == gpu.index
        ]

    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int:
        self._fabric("nvmlDeviceGetGpuFabricInfoV", device, gpuFabricInfo)
        return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetGpuFabricInfo(self, device: Any, gpuFabricInfo: Any) -> int:
        self._fabric("nvmlDeviceGetGpuFabricInfo", device, gpuFabricInfo)
        return int(pynvml.NVML_SUCCESS)

    def _fabric(self, name: str, device: Any, out: Any) -> None:
        gpu = self._device(name, device)
        if not self.profile.supports_fabric:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = _target(out)
        labels = dict(self.profile.topology_labels)
        domain = labels.get("topology.k8s.aws/ultraserver-id", self.profile.instance_type)
        cluster = uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{domain}.fabric").bytes
        info.clusterUuid[:] = list(cluster)
        degraded = self._has("fabric-degraded", gpu.index)
        # A failed probe as NVML reports it: COMPLETED with the failure in `status` (nvml.h:
        # "Error status, if any. Must be checked only if state returns 'complete'"), the
        # status seen on real nodes whose fabric failed (INSUFFICIENT_RESOURCES), and the route
        # to the fabric marked unhealthy in the v2 health mask.
        info.status = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES if degraded else pynvml.NVML_SUCCESS
        info.cliqueId = 32766
        info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        names = {f[0] for f in info._fields_}
        if "healthMask" in names:
            info.healthMask = (
                pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE
                << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY
                if degraded
                else 0
            )
        if "healthSummary" in names:
            info.healthSummary = (
                pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY
                if degraded
                else pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
            )

    # ----- NVLink --------------------------------------------------------------------------------

    def _link(self, name: str, device: Any, link: int) -> _SimGpu:
        gpu = self._device(name, device)
        if not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if link >= self.profile.nvlinks_per_gpu:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        gpu = self._link("nvmlDeviceGetNvLinkState", device, link)
        down = self._since("nvlink-down", gpu.index, link) is not None
        return int(pynvml.NVML_FEATURE_DISABLED if down else pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkErrorCounter(self, device: Any, link: int, counter: int) -> int:
        """Per-link DL error counters; the only NVML source of data-CRC errors past link 11.
        Blackwell drops the DL counters (NVML 565+), as it does their field ids."""
        gpu = self._link("nvmlDeviceGetNvLinkErrorCounter", device, link)
        if self._blackwell:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        field = {
            pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
            pynvml.NVML_NVLINK_ERROR_DL_REPLAY: pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
            pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
        }.get(counter)
        if field is not None:
            return self._link_errors(gpu, field, link, self._now())
        if counter == pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA:
            began = self._since("nvlink-crc", gpu.index, link) if self._faults else None
            return 0 if began is None else int(400.0 * (self._now() - began))
        raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        self._link("nvmlDeviceGetNvLinkRemotePciInfo", device, link)
        switch = self._switch_of(link)
        bus_id = (
            f"{0x18 + switch // 2:08X}:{0x01 + switch % 2:02X}:00.0"  # one domain per switch tray
            if self._blackwell
            else f"00000000:{0x05 + switch:02X}:00.0"
        )
        return self._pci_info(bus_id)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        self._link("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        if self.profile.nvlink_remote == "switch":
            return int(pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
        return int(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)

    # ----- field values --------------------------------------------------------------------------

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: Sequence[Any]) -> Any:
        """Like pynvml: ids or (id, scopeId) pairs in, a c_nvmlFieldValue_t array out, each
        value with its own nvmlReturn. A lost GPU answers GPU_IS_LOST in every slot (one that
        needs a reset, RESET_REQUIRED)."""
        self._count("nvmlDeviceGetFieldValues")
        gpu = self._resolve(handle)
        self._charge(gpu.index, "nvmlDeviceGetFieldValues")
        if self._faults:
            self._hang(gpu.index)
        if "nvmlDeviceGetFieldValues" in self._unsupported:  # a library that predates it
            raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if self._timing_out(gpu.index):
            raise _error(pynvml.NVML_ERROR_TIMEOUT)
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        plain = (_PlainFieldValue * len(fieldIds)).from_buffer(values)
        lost = self._down_code(gpu.index)
        now = self._now()
        done = gpu.wave.integral(now)
        stamp = int(time.time() * 1e6)
        extra_ms = 0.0
        for slot, field_id in zip(plain, fieldIds, strict=True):
            try:
                (slot.fieldId, slot.scopeId) = field_id
            except TypeError:
                slot.fieldId = field_id
            self.field_requests[slot.fieldId] += 1
            extra_ms += H100_FIELD_COST_MS.get(slot.fieldId, 0.0)
            slot.timestamp = stamp
            if lost is not None:
                slot.nvmlReturn = lost
                continue
            self._fill_field(gpu, slot, now, done)
        if extra_ms:
            with self._lock:
                self.cost_ms[gpu.index] = self.cost_ms.get(gpu.index, 0.0) + extra_ms
        return values

    def _fill_field(self, gpu: _SimGpu, slot: Any, now: float, done: float) -> None:
        fid, scope = slot.fieldId, slot.scopeId
        if fid in self._unsupported_fields:
            slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            return
        if fid in _LINK_FIELDS and not 0 <= scope < self.profile.nvlinks_per_gpu:
            slot.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
            return
        value = self._field_value(gpu, fid, scope, now, done)
        if value is None:
            slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            return
        value_type, number = value
        slot.valueType = value_type
        if value_type == _UINT:
            slot.value.uiVal = number
        else:
            slot.value.ullVal = number
        slot.nvmlReturn = pynvml.NVML_SUCCESS

    def _field_value(
        self, gpu: _SimGpu, fid: int, scope: int, now: float, done: float
    ) -> tuple[int, int] | None:
        """One field's (value type, value); `done` is the GPU's integrated activity so far."""
        if fid == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
            return _ULL, self._link_kib(gpu, scope, 1.0, now, done)
        if fid == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
            return _ULL, self._link_kib(gpu, scope, 0.97, now, done)
        if fid in _DL_ERROR_FIELDS:
            return _ULL, self._link_errors(gpu, fid, scope, now)
        if fid in _NVLINK5_PACKET_FIELDS:
            kib = self._link_kib(gpu, scope, _NVLINK5_PACKET_FIELDS[fid], now, done)
            return _ULL, kib * 1024 // _NVLINK5_PACKET_BYTES
        if fid in _NVLINK5_ERROR_RATES:
            began = self._since("nvlink-crc", gpu.index, scope) if self._faults else None
            return _ULL, 0 if began is None else int(_NVLINK5_ERROR_RATES[fid] * (now - began))
        if fid == pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
            return _ULL, int(3e9 * done)
        if fid == pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
            return _ULL, int(5e9 * done)
        if fid == pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER:
            began = self._since("pcie-degraded", gpu.index)
            extra = 0 if began is None else int(5 * (now - began))
            return _ULL, gpu.pcie_replay_base + extra
        if fid == pynvml.NVML_FI_DEV_MEMORY_TEMP:
            return _UINT, round(self._temperature(gpu, now) + 4.0)
        if fid in _PERF_POLICY_FIELDS:
            return _ULL, self._violation_ns(gpu, _PERF_POLICY_FIELDS[fid], now)
        if fid in _ECC_FIELDS:
            return _ULL, self._ecc(gpu, *_ECC_FIELDS[fid], now)
        if fid in _REMAP_FIELDS:
            return _UINT, self._remapped(gpu)[_REMAP_FIELDS.index(fid)]
        if fid == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
            return _UINT, self.recovery_action(gpu.index)
        if fid == pynvml.NVML_FI_DEV_NVLINK_GET_STATE:
            down = self._since("nvlink-down", gpu.index, scope) is not None
            return _UINT, int(pynvml.NVML_FEATURE_DISABLED if down else pynvml.NVML_FEATURE_ENABLED)
        if fid == pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
            return _ULL, self._energy_mj(gpu, now)
        if fid in _RETIRED_FIELDS:
            return None  # NOT_SUPPORTED, as the page retirement calls are (rows remap instead)
        return None

    def _link_kib(self, gpu: _SimGpu, link: int, direction: float, now: float, done: float) -> int:
        """Data through one link, in KiB as NVML counts it; frozen while the link is down."""
        down_since = self._since("nvlink-down", gpu.index, link) if self._faults else None
        if down_since is not None and down_since < now:
            done = gpu.wave.integral(down_since)
        share = gpu.link_share[link] * direction
        return int(self._link_rate() * share * done / 1024)

    def _link_errors(self, gpu: _SimGpu, fid: int, link: int, now: float) -> int:
        began = self._since("nvlink-crc", gpu.index, link) if self._faults else None
        if began is None:
            return 0
        per_second = {
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: 3000.0,
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: 800.0,
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: 0.2,
        }[fid]
        return int(per_second * (now - began))

    # ----- GPM -----------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        self._device("nvmlGpmQueryDeviceSupport", device)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1 if self.profile.supports_gpm else 0
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._count("nvmlGpmSampleAlloc")
        with self._lock:
            self._next_address += 0x40
            address = self._next_address
        return _fake_pointer(pynvml.c_nvmlGpmSample_t, address)

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._count("nvmlGpmSampleFree")
        self._samples.pop(_address(gpmSample), None)

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        gpu = self._device("nvmlGpmSampleGet", device)
        if not self.profile.supports_gpm:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._samples[_address(gpmSample)] = (gpu.index, self._now())
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._count("nvmlGpmMetricsGet")
        if metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise _error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first = self._samples.get(_address(metricsGet.sample1))
        second = self._samples.get(_address(metricsGet.sample2))
        if first is None or second is None or first[0] != second[0]:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpus[first[0]]
        self._charge(gpu.index, "nvmlGpmMetricsGet")
        if self._faults:
            self._hang(gpu.index)
        down = self._down_code(gpu.index)
        if down is not None:
            raise _error(down)
        if self._timing_out(gpu.index):
            raise _error(pynvml.NVML_ERROR_TIMEOUT)
        activity = gpu.wave.mean(first[1], second[1])
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            share = _GPM_SHARES.get(metric.metricId)
            if share is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            metric.value = 100.0 * activity * share
            metric.nvmlReturn = pynvml.NVML_SUCCESS
        return metricsGet

    # ----- events --------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        self._count("nvmlEventSetCreate")
        if self.event_set_error is not None:
            raise _error(self.event_set_error)
        with self._lock:
            self._next_address += 0x40
            address = self._next_address
            self._event_sets[address] = set()
        return _fake_pointer(pynvml.c_nvmlEventSet_t, address)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._count("nvmlEventSetFree")
        with self._events:
            self._event_sets.pop(_address(eventSet), None)
            self._events.notify_all()

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._device("nvmlDeviceRegisterEvents", handle)
        with self._events:
            registered = self._event_sets.get(_address(eventSet))
            if registered is None:
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if eventTypes & pynvml.nvmlEventTypeXidCriticalError:
                registered.add(gpu.index)

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        """Block (in real time) until a queued XID for a registered GPU, else raise TIMEOUT."""
        self._count("nvmlEventSetWait_v2")
        key = _address(eventSet)
        deadline = time.monotonic() + timeoutms / 1000.0
        with self._events:
            while True:
                registered = self._event_sets.get(key)
                if registered is None or not self._initialized:
                    raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
                event = self._pop_event(registered)
                if event is not None:
                    return event
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _error(pynvml.NVML_ERROR_TIMEOUT)
                self._events.wait(remaining)

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    def _pop_event(self, registered: set[int]) -> Any:
        for i, (gpu_index, xid) in enumerate(self._pending_xids):
            if gpu_index in registered:
                del self._pending_xids[i]
                data = pynvml.c_nvmlEventData_t()
                data.device = self._gpus[gpu_index].handle
                data.eventType = pynvml.nvmlEventTypeXidCriticalError
                data.eventData = xid
                data.gpuInstanceId = NO_INSTANCE
                data.computeInstanceId = NO_INSTANCE
                return data
        return None
